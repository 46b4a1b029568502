"""TLS and mTLS end to end, as an outsider meets them: a real ``fortis serve`` subprocess
(all five services, the built-in Fashion-MNIST CNN as its one target) listening with TLS
only and requiring client certificates, the tenant of each call taken from its certificate's
common name (``--tls-tenant-from CN``), no API key anywhere. Every certificate is made here
with ``cryptography``; the client is written from the protos alone: generated stubs, a gRPC
channel with its credentials, status details read from the trailers.

- a tenant submits a plan (IEEE-P3: target, image source, a corruption with its severity),
  follows it to SUCCEEDED and reads its results (IEEE-M1/M2 in the summary and report.json);
- the handshake is refused (UNAVAILABLE, nothing reaches a service) without a client
  certificate, with one from another CA, in plain text, and for a client that does not trust
  the server's CA;
- a certificate names only its own tenant: another tenant's evaluation answers every RPC
  exactly as an unknown id does (NOT_FOUND, the same message: its existence does not leak),
  ``x-fortis-tenant`` does not make a certificate act for another tenant, and a certificate
  whose CN is no tenant name (``*``, the services' own tenant; spaces) or whose subject has
  two CNs is UNAUTHENTICATED.

What ``test_identity_mtls.py`` and ``test_tls.py`` already cover (an in-process stack, the
SAN-URI rule, the SDK's TLS options, certificate reload) is not repeated.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from fortis.evaluation.v1 import evaluation_pb2 as pb
from fortis.evaluation.v1 import evaluation_pb2_grpc
from fortis.proxy.v1 import proxy_pb2, proxy_pb2_grpc

from tests.integration._outsider_support import fortis_serve, refused, wait_final

PLAN = """
name: outsider-tls
seed: 5
target: {name: fmnist-cnn, task: classification}
dataset: {source: fashion-mnist, split: test, limit: 6}
correctness: {mode: top1}
corruptions: [{id: contrast, severities: [2]}]
"""


@dataclass
class Pem:
    cert: bytes
    key: bytes


def _key_pem(key: Any) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


class Ca:
    """A certificate authority made in the test (EC P-256, one day)."""

    def __init__(self, name: str) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = dt.datetime.now(dt.UTC)
        self.cert = (x509.CertificateBuilder().subject_name(self.name).issuer_name(self.name)
                     .public_key(self.key.public_key())
                     .serial_number(x509.random_serial_number())
                     .not_valid_before(now - dt.timedelta(minutes=5))
                     .not_valid_after(now + dt.timedelta(days=1))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
                     .add_extension(x509.KeyUsage(False, False, False, False, False, True, True,
                                                  False, False), True)
                     .sign(self.key, hashes.SHA256()))
        self.pem = self.cert.public_bytes(serialization.Encoding.PEM)

    def issue(self, *cns: str, server: bool = False) -> Pem:
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
        b = (x509.CertificateBuilder()
             .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)
                                      for cn in cns]))
             .issuer_name(self.name).public_key(key.public_key())
             .serial_number(x509.random_serial_number())
             .not_valid_before(now - dt.timedelta(minutes=5))
             .not_valid_after(now + dt.timedelta(days=1))
             .add_extension(x509.BasicConstraints(ca=False, path_length=None), True))
        if server:
            # the services call each other with it too (internal mTLS): server and client use
            usages.insert(0, ExtendedKeyUsageOID.SERVER_AUTH)
            b = b.add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                False)
        b = b.add_extension(x509.ExtendedKeyUsage(usages), False)
        cert = b.sign(self.key, hashes.SHA256())
        return Pem(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


@pytest.fixture(scope="module")
def pki() -> dict[str, Any]:
    ca, other = Ca("fortis outsider CA"), Ca("someone else's CA")
    return {"ca": ca, "other": other, "server": ca.issue("fortis-server", server=True),
            "acme": ca.issue("acme"), "globex": ca.issue("globex"),
            "star": ca.issue("*"), "spaces": ca.issue("not a tenant"),
            "two_cns": ca.issue("globex", "acme"),
            "rogue_acme": other.issue("acme")}


@pytest.fixture(scope="module")
def served(pki: dict[str, Any], tmp_path_factory: pytest.TempPathFactory,
           fmnist_target) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("outsider-tls")
    for name in ("server",):
        (tmp / f"{name}.crt").write_bytes(pki[name].cert)
        (tmp / f"{name}.key").write_bytes(pki[name].key)
    (tmp / "ca.crt").write_bytes(pki["ca"].pem)
    with fortis_serve(["--no-default-targets", "--target", "fmnist-cnn=builtin:fmnist-cnn",
                       "--tls-cert", str(tmp / "server.crt"), "--tls-key", str(tmp / "server.key"),
                       "--tls-ca", str(tmp / "ca.crt"), "--tls-client-auth", "require",
                       "--tls-tenant-from", "CN", "--evaluation-workers", "2"], tmp) as address:
        yield address


def _channel(address: str, pki: dict[str, Any], who: str | None, *,
             trust: str = "ca") -> grpc.Channel:
    """A TLS channel trusting ``trust``'s CA, presenting ``who``'s certificate (None: none)."""
    leaf: Pem | None = pki[who] if who else None
    creds = grpc.ssl_channel_credentials(
        root_certificates=pki[trust].pem,
        private_key=leaf.key if leaf else None, certificate_chain=leaf.cert if leaf else None)
    return grpc.secure_channel(address, creds)


def test_a_tenant_submits_a_plan_over_mtls_and_reads_its_results(served, pki) -> None:
    """IEEE-P3 plan in, IEEE-M1/M2 results out; the tenant is the certificate's CN."""
    with _channel(served, pki, "acme") as ch:
        ev = evaluation_pb2_grpc.EvaluationServiceStub(ch)
        ev.ValidatePlan(pb.ValidatePlanRequest(plan=PLAN), timeout=60)
        created = ev.CreateEvaluation(pb.CreateEvaluationRequest(
            plan=PLAN, evaluation_id="ev-tls"), timeout=60).evaluation
        assert (created.evaluation_id, created.tenant) == ("ev-tls", "acme")
        # follow it on the stream, as a client would, until it is final
        states = []
        for msg in ev.WatchEvaluation(pb.WatchEvaluationRequest(evaluation_id="ev-tls"),
                                      timeout=300):
            states.append(msg.evaluation.state)
            if msg.evaluation.state in (pb.EVALUATION_STATE_SUCCEEDED,
                                        pb.EVALUATION_STATE_FAILED,
                                        pb.EVALUATION_STATE_CANCELLED):
                break
        final = wait_final(ev, "ev-tls")
        assert final.state == pb.EVALUATION_STATE_SUCCEEDED, final.error.message
        assert states[-1] == pb.EVALUATION_STATE_SUCCEEDED
        assert final.summary.m == 6 and final.summary.HasField("accuracy")
        assert 0.0 <= final.summary.average_robustness_corr <= 1.0
        report = json.loads(ev.GetEvaluationReport(
            pb.GetEvaluationReportRequest(evaluation_id="ev-tls"), timeout=60).report_json)
        assert "ev-tls" in json.dumps(report)
        # the queries went through the proxy, in this tenant's ledger: 6 clean + 6 corrupted
        px = proxy_pb2_grpc.TargetProxyServiceStub(ch)
        st = px.GetSessionStats(proxy_pb2.GetSessionStatsRequest(session_id="ev-tls/clean"),
                                timeout=30)
        assert (st.session.tenant, st.queries_ok) == ("acme", 6)
        assert st.tenant_queries_today == 12


@pytest.mark.parametrize("who,trust", [
    (None, "ca"),                 # no client certificate
    ("rogue_acme", "ca"),         # "acme", signed by another CA
    ("acme", "other"),            # a client that does not trust the server's CA
])
def test_the_handshake_is_refused(served, pki, who, trust) -> None:
    with _channel(served, pki, who, trust=trust) as ch:
        ev = evaluation_pb2_grpc.EvaluationServiceStub(ch)
        exc = refused(lambda: ev.ListEvaluations(pb.ListEvaluationsRequest(), timeout=15))
        assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc.details()


def test_plain_text_gets_nothing(served) -> None:
    with grpc.insecure_channel(served) as ch:
        ev = evaluation_pb2_grpc.EvaluationServiceStub(ch)
        exc = refused(lambda: ev.ListEvaluations(pb.ListEvaluationsRequest(), timeout=15))
        assert exc.code() == grpc.StatusCode.UNAVAILABLE


def test_a_certificate_reads_only_its_own_tenant(served, pki) -> None:
    """globex knows acme's evaluation id and tries every read and write of it: each answer is
    the one a made-up id gets (NOT_FOUND, same message), never PERMISSION_DENIED, so not even
    the id's existence leaks; then globex makes its own "ev-acme" (its own namespace)."""
    with _channel(served, pki, "acme") as ch:
        ev = evaluation_pb2_grpc.EvaluationServiceStub(ch)
        ev.CreateEvaluation(pb.CreateEvaluationRequest(plan=PLAN, evaluation_id="ev-acme"),
                            timeout=60)
        assert wait_final(ev, "ev-acme").state == pb.EVALUATION_STATE_SUCCEEDED
    with _channel(served, pki, "globex") as ch:
        ev = evaluation_pb2_grpc.EvaluationServiceStub(ch)

        def answers(eid: str) -> list[tuple[grpc.StatusCode, str]]:
            calls = [
                lambda: ev.GetEvaluation(pb.GetEvaluationRequest(evaluation_id=eid), timeout=30),
                lambda: ev.GetEvaluationReport(pb.GetEvaluationReportRequest(evaluation_id=eid),
                                               timeout=30),
                lambda: ev.CancelEvaluation(pb.CancelEvaluationRequest(evaluation_id=eid),
                                            timeout=30),
                lambda: next(iter(ev.WatchEvaluation(
                    pb.WatchEvaluationRequest(evaluation_id=eid), timeout=30))),
            ]
            out = []
            for call in calls:
                exc = refused(call)
                out.append((exc.code(), exc.details().replace(eid, "<id>")))
            return out

        foreign, unknown = answers("ev-acme"), answers("ev-nobody")
        assert foreign == unknown
        assert {code for code, _ in foreign} == {grpc.StatusCode.NOT_FOUND}
        assert list(ev.ListEvaluations(pb.ListEvaluationsRequest(), timeout=30).evaluations) == []
        # the header the services use between themselves does not make a certificate act
        # for another tenant
        as_acme = (("x-fortis-tenant", "acme"),)
        exc = refused(lambda: ev.GetEvaluation(pb.GetEvaluationRequest(evaluation_id="ev-acme"),
                                               metadata=as_acme, timeout=30))
        assert exc.code() == grpc.StatusCode.NOT_FOUND
        assert list(ev.ListEvaluations(pb.ListEvaluationsRequest(), metadata=as_acme,
                                       timeout=30).evaluations) == []
        mine = ev.CreateEvaluation(pb.CreateEvaluationRequest(
            plan=PLAN.replace("seed: 5", "seed: 6"), evaluation_id="ev-acme"),
            timeout=60).evaluation
        assert mine.tenant == "globex"
        wait_final(ev, "ev-acme")
    with _channel(served, pki, "acme") as ch:
        ev = evaluation_pb2_grpc.EvaluationServiceStub(ch)
        theirs = ev.GetEvaluation(pb.GetEvaluationRequest(evaluation_id="ev-acme"),
                                  timeout=30).evaluation
        assert theirs.tenant == "acme" and "seed: 5" in theirs.plan_text


@pytest.mark.parametrize("who", ["star", "spaces", "two_cns"])
def test_a_certificate_naming_no_tenant_is_unauthenticated(served, pki, who) -> None:
    """``*`` is the tenant of the services' internal key; a certificate saying so is still
    just a certificate whose CN is no tenant name. A subject with two CNs names no one
    tenant (the server does not pick the first or the last)."""
    with _channel(served, pki, who) as ch:
        ev = evaluation_pb2_grpc.EvaluationServiceStub(ch)
        exc = refused(lambda: ev.ListEvaluations(pb.ListEvaluationsRequest(), timeout=15))
        assert exc.code() == grpc.StatusCode.UNAUTHENTICATED, exc.details()
        assert "CN" in exc.details()
