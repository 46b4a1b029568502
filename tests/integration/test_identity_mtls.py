"""The tenant from a verified mTLS client certificate (``--tls-tenant-from``), on a real stack
over TLS with ``client_auth=require``; the certificates (a CA, the server's, clients') are
made here with ``cryptography``. Calls use generated stubs and raw metadata only.

- a client certificate whose subject (here a SPIFFE-style URI SAN) names a tenant calls
  with no API key and sees only that tenant's evaluations; an API key still wins when sent;
- a certificate that names no tenant is UNAUTHENTICATED, saying why;
- CN and O are read the same way (the rule checked on the real certificates);
- ``--tls-tenant-from`` without ``--tls-client-auth require`` is refused at start.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from fortis.evaluation.v1 import evaluation_pb2 as pb
from fortis.evaluation.v1 import evaluation_pb2_grpc

K_B = "mtls-test-key-tenant-b-012345"
PREFIX = "spiffe://corp.example/tenant/"


@dataclass
class Leaf:
    cert: bytes
    key: bytes


def _name(cn: str, org: str = "") -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def _pem_key(key: Any) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


class Ca:
    def __init__(self) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        self.name = _name("fortis test CA")
        self.cert = (x509.CertificateBuilder().subject_name(self.name).issuer_name(self.name)
                     .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                     .not_valid_before(now - dt.timedelta(minutes=5))
                     .not_valid_after(now + dt.timedelta(days=1))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
                     .add_extension(x509.KeyUsage(False, False, False, False, False, True, True,
                                                  False, False), True)
                     .sign(self.key, hashes.SHA256()))
        self.pem = self.cert.public_bytes(serialization.Encoding.PEM)

    def leaf(self, subject: x509.Name, sans: list[x509.GeneralName], *, server: bool) -> Leaf:
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        b = (x509.CertificateBuilder().subject_name(subject).issuer_name(self.name)
             .public_key(key.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(now - dt.timedelta(minutes=5))
             .not_valid_after(now + dt.timedelta(days=1))
             .add_extension(x509.BasicConstraints(ca=False, path_length=None), True)
             .add_extension(x509.ExtendedKeyUsage(
                 [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH,
                  ExtendedKeyUsageOID.CLIENT_AUTH]), False))
        if sans:
            b = b.add_extension(x509.SubjectAlternativeName(sans), False)
        cert = b.sign(self.key, hashes.SHA256())
        return Leaf(cert.public_bytes(serialization.Encoding.PEM), _pem_key(key))


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    d = tmp_path_factory.mktemp("mtls-pki")
    ca = Ca()
    server = ca.leaf(_name("fortis"), [x509.DNSName("localhost"),
                                       x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
                     server=True)
    (d / "ca.pem").write_bytes(ca.pem)
    (d / "server.pem").write_bytes(server.cert)
    (d / "server.key").write_bytes(server.key)
    return {
        "dir": d, "ca": ca.pem,
        "acme": ca.leaf(_name("alice", "Acme Corp"),
                        [x509.UniformResourceIdentifier(PREFIX + "acme/user/alice")],
                        server=False),
        "nobody": ca.leaf(_name("bob"), [x509.UniformResourceIdentifier(
            "spiffe://other.example/x")], server=False),
        "cn_o": ca.leaf(_name("team-cn", "team-o"), [], server=False),
    }


@pytest.fixture(scope="module")
def mtls_stack(pki: dict[str, Any], tmp_path_factory: pytest.TempPathFactory,
               fmnist_target) -> Iterator[Any]:
    from fortis.infra.serving.tls import TlsSettings
    from fortis.server.app.stack import StackSettings, TargetConfig, start_stack

    d = pki["dir"]
    s = start_stack(StackSettings(
        state_dir=tmp_path_factory.mktemp("mtls") / "state", api_keys={K_B: "tenant-b"},
        tls=TlsSettings(cert_file=d / "server.pem", key_file=d / "server.key",
                        ca_file=d / "ca.pem", client_auth="require", server_name="localhost"),
        tls_tenant_from=f"SAN-URI={PREFIX}",
        targets=[TargetConfig.parse("fmnist-cnn=builtin:fmnist-cnn")]))
    yield s
    s.stop(0)


def _stub(stack: Any, pki: dict[str, Any], who: str) -> tuple[grpc.Channel, Any]:
    leaf: Leaf = pki[who]
    creds = grpc.ssl_channel_credentials(root_certificates=pki["ca"], private_key=leaf.key,
                                         certificate_chain=leaf.cert)
    ch = grpc.secure_channel(stack.address, creds,
                             options=[("grpc.ssl_target_name_override", "localhost")])
    return ch, evaluation_pb2_grpc.EvaluationServiceStub(ch)


PLAN = """
name: mtls
seed: 1
target: {name: fmnist-cnn, task: classification}
dataset: {source: fashion-mnist, split: test, limit: 4}
correctness: {mode: top1}
corruptions: [{id: contrast, severities: [1]}]
"""


def test_certificate_subject_names_the_tenant(mtls_stack, pki) -> None:
    ch, ev = _stub(mtls_stack, pki, "acme")
    try:
        created = ev.CreateEvaluation(pb.CreateEvaluationRequest(plan=PLAN, evaluation_id="ev-m"),
                                      timeout=60).evaluation
        assert created.tenant == "acme"
        listed = ev.ListEvaluations(pb.ListEvaluationsRequest(), timeout=20).evaluations
        assert [(e.evaluation_id, e.tenant) for e in listed] == [("ev-m", "acme")]
        # An API key, when sent, is what counts (tenant-b sees none of acme's).
        as_b = ev.ListEvaluations(pb.ListEvaluationsRequest(), metadata=(("x-api-key", K_B),),
                                  timeout=20).evaluations
        assert list(as_b) == []
    finally:
        ch.close()
    ch, ev = _stub(mtls_stack, pki, "nobody")
    try:
        with pytest.raises(grpc.RpcError) as exc:
            ev.ListEvaluations(pb.ListEvaluationsRequest(), timeout=20)
        assert exc.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "SAN-URI names no tenant" in exc.value.details()
    finally:
        ch.close()


def test_cn_and_o_rules_on_real_certificates(pki) -> None:
    from fortis.infra.serving.identity import CertTenant

    ctx = {"x509_pem_cert": [pki["cn_o"].cert]}
    assert CertTenant.parse("CN").tenant_of(ctx).tenant == "team-cn"
    assert CertTenant.parse("O").tenant_of(ctx).tenant == "team-o"
    acme = {"x509_pem_cert": [pki["acme"].cert]}
    assert CertTenant.parse(f"SAN-URI={PREFIX}").tenant_of(acme).tenant == "acme"
    from fortis.services.common.errors import Unauthenticated
    with pytest.raises(Unauthenticated, match="O names more than one|O names no"):
        CertTenant.parse("O").tenant_of({"x509_pem_cert": [pki["nobody"].cert]})


def test_tenant_from_needs_required_client_certificates(tmp_path: Path, pki) -> None:
    from fortis.infra.serving.startup import StartupError
    from fortis.infra.serving.tls import TlsSettings
    from fortis.server.app.stack import StackSettings, start_stack

    d = pki["dir"]
    with pytest.raises(StartupError, match="tls_tenant_from"):
        start_stack(StackSettings(
            state_dir=tmp_path / "state", api_keys={K_B: "tenant-b"},
            tls=TlsSettings(cert_file=d / "server.pem", key_file=d / "server.key"),
            tls_tenant_from="CN", only="evaluation"))
