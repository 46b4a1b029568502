"""TLS for clients and mTLS between services (transport security: ``--tls-cert``,
``--tls-key``, ``--tls-ca``; TLS/mTLS tested with certificates generated in the test;
SPEC section 0: one shared Fortis, many tenants).

Certificates are made here by the ``openssl`` command line (a CA, a second unrelated CA, and
leaf certificates signed by each); servers are real gRPC servers on loopback:

- a TLS server answers a client that trusts its CA; a plain-text client and a client that
  trusts another CA are refused; the API key is still required over TLS;
- ``client_auth=require`` (mTLS): no client certificate, or one from another CA, refused;
  the CA's client certificate accepted; embedded mode's own loopback calls pass too;
- split mode: five single-service stacks calling each other over mTLS run a small
  evaluation (clean pass, a corruption, a query attack streamed by the perturbation service
  through the proxy);
- the server certificate is replaced on disk and new connections get the new one with no
  restart, while a connection opened before keeps working;
- settings that cannot work are refused at start with the setting named.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from fortis.client import FortisClient, InvalidArgument, State, Unauthenticated, Unavailable
from fortis.infra.serving.startup import StartupError
from fortis.infra.serving.tls import TlsSettings
from fortis.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from fortis.services.common.errors import InvalidArgument as ServerInvalidArgument

from tests.conftest import API_KEY, MD

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI")


@dataclass(frozen=True)
class Pki:
    """Files of a small PKI made by :func:`make_pki`."""

    folder: Path

    def __getattr__(self, name: str) -> Path:       # pki.ca_crt -> folder/ca.crt
        stem, _, ext = name.rpartition("_")
        return self.folder / f"{stem}.{ext}"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _ca(name: str, d: Path) -> None:
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.crt", "-days", "2", "-subj", f"/CN={name}",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)


def _leaf(name: str, ca: str, d: Path, sans: str = "DNS:localhost,IP:127.0.0.1") -> None:
    (d / f"{name}.ext").write_text(f"subjectAltName={sans}\nbasicConstraints=CA:FALSE\n"
                                   "extendedKeyUsage=serverAuth,clientAuth\n")
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext",
             cwd=d)


def make_pki(d: Path) -> Pki:
    """CA ``ca`` signs ``server``, ``client``, ``internal`` (a name-only cert for
    ``fortis.internal``); CA ``otherca`` signs ``rogue`` and ``server2``."""
    d.mkdir(parents=True, exist_ok=True)
    _ca("ca", d)
    _ca("otherca", d)
    _leaf("server", "ca", d)
    _leaf("client", "ca", d)
    _leaf("internal", "ca", d, sans="DNS:fortis.internal")
    _leaf("rogue", "otherca", d)
    _leaf("server2", "otherca", d)
    return Pki(d)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _tls(pki: Pki, *, require: bool = False, cert: str = "server", server_name: str = "",
         folder: Path | None = None) -> TlsSettings:
    f = folder or pki.folder
    return TlsSettings(cert_file=f / f"{cert}.crt", key_file=f / f"{cert}.key",
                       ca_file=pki.ca_crt, client_auth="require" if require else "none",
                       server_name=server_name)


def _stack(tmp_path: Path, tls: TlsSettings, **kw: object):  # type: ignore[no-untyped-def]
    from fortis.server.app.stack import StackSettings, TargetConfig, start_stack
    return start_stack(StackSettings(
        state_dir=tmp_path / f"state-{kw.get('only', 'all')}", api_keys={API_KEY: "tenant-a"},
        targets=[TargetConfig.parse("fmnist-cnn=builtin:fmnist-cnn")], tls=tls,
        **kw))  # type: ignore[arg-type]


def _targets(address: str, creds: grpc.ChannelCredentials | None, md=MD,
             options: tuple = ()) -> list[str]:
    ch = (grpc.secure_channel(address, creds, options=options) if creds is not None
          else grpc.insecure_channel(address))
    try:
        stub = proxy_pb2_grpc.TargetProxyServiceStub(ch)
        return [t.name for t in stub.ListTargets(proxy_pb2.ListTargetsRequest(), metadata=md,
                                                 timeout=10).targets]
    finally:
        ch.close()


def _creds(pki: Pki, ca: str = "ca", client: str = "") -> grpc.ChannelCredentials:
    f = pki.folder
    return grpc.ssl_channel_credentials(
        root_certificates=(f / f"{ca}.crt").read_bytes(),
        private_key=(f / f"{client}.key").read_bytes() if client else None,
        certificate_chain=(f / f"{client}.crt").read_bytes() if client else None)


def _refused(fn) -> grpc.RpcError:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as ei:
        fn()
    return ei.value


@pytest.fixture()
def tls_stack(tmp_path: Path, pki: Pki, fmnist_target) -> Iterator:
    s = _stack(tmp_path, _tls(pki))
    yield s
    s.stop(0)


@pytest.fixture()
def mtls_stack(tmp_path: Path, pki: Pki, fmnist_target) -> Iterator:
    s = _stack(tmp_path, _tls(pki, require=True))
    yield s
    s.stop(0)


def test_tls_server_answers_its_ca_and_refuses_plain_text_and_other_cas(tls_stack, pki) -> None:
    addr = tls_stack.address
    assert _targets(addr, _creds(pki)) == ["fmnist-cnn"]
    plain = _refused(lambda: _targets(addr, None))
    assert plain.code() == grpc.StatusCode.UNAVAILABLE
    other = _refused(lambda: _targets(addr, _creds(pki, ca="otherca")))
    assert other.code() == grpc.StatusCode.UNAVAILABLE
    no_key = _refused(lambda: _targets(addr, _creds(pki), md=()))
    assert no_key.code() == grpc.StatusCode.UNAUTHENTICATED       # TLS does not replace keys

    # The SDK: CA file -> works; no TLS -> Unavailable; key still checked.
    with FortisClient(addr, api_key=API_KEY, tls_ca=pki.ca_crt, timeout_s=10) as fc:
        assert [t.name for t in fc.targets()] == ["fmnist-cnn"]
    with FortisClient(addr, api_key=API_KEY, timeout_s=5) as fc, pytest.raises(Unavailable):
        fc.targets()
    with FortisClient(addr, api_key="wrong", tls_ca=pki.ca_crt, timeout_s=5) as fc, \
            pytest.raises(Unauthenticated):
        fc.targets()
    with pytest.raises(InvalidArgument) as ei:
        FortisClient(addr, tls_ca=pki.ca_crt, tls_cert=pki.client_crt)     # cert without key
    assert ei.value.violations[0].field == "tls_key"


def test_mtls_requires_a_client_certificate_from_the_ca(mtls_stack, pki) -> None:
    addr = mtls_stack.address
    for creds in (_creds(pki), _creds(pki, client="rogue")):     # none; another CA's
        assert _refused(lambda c=creds: _targets(addr, c)).code() == grpc.StatusCode.UNAVAILABLE
    assert _targets(addr, _creds(pki, client="client")) == ["fmnist-cnn"]
    with FortisClient(addr, api_key=API_KEY, tls_ca=pki.ca_crt, tls_cert=pki.client_crt,
                      tls_key=pki.client_key, timeout_s=10) as fc:
        assert [t.name for t in fc.targets()] == ["fmnist-cnn"]
        assert fc.list() == []                   # the evaluation service over mTLS too


def test_server_certificate_is_reloaded_without_restart(tmp_path: Path, pki: Pki,
                                                        fmnist_target) -> None:
    live = tmp_path / "live"
    live.mkdir()
    for ext in ("crt", "key"):
        shutil.copy(pki.folder / f"server.{ext}", live / f"server.{ext}")
    s = _stack(tmp_path, _tls(pki, folder=live))
    try:
        before = grpc.secure_channel(s.address, _creds(pki))
        stub = proxy_pb2_grpc.TargetProxyServiceStub(before)
        assert stub.ListTargets(proxy_pb2.ListTargetsRequest(), metadata=MD, timeout=10).targets
        # Swap in a certificate of another CA (key first, then certificate: the half-way
        # state is a mismatched pair, which the reloader refuses and keeps the old one).
        for ext in ("key", "crt"):
            tmp = live / f"new.{ext}"
            shutil.copy(pki.folder / f"server2.{ext}", tmp)
            os.replace(tmp, live / f"server.{ext}")
        deadline = time.monotonic() + 10
        while True:      # each new connection asks for the files (mtime granularity aside)
            try:
                assert _targets(s.address, _creds(pki, ca="otherca")) == ["fmnist-cnn"]
                break
            except grpc.RpcError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        assert _refused(lambda: _targets(s.address, _creds(pki))).code() == \
            grpc.StatusCode.UNAVAILABLE                      # the old CA no longer verifies
        # The connection opened before the swap keeps its session.
        assert stub.ListTargets(proxy_pb2.ListTargetsRequest(), metadata=MD, timeout=10).targets
        before.close()
    finally:
        s.stop(0)


def test_settings_that_cannot_work_are_refused_at_start(tmp_path: Path, pki: Pki,
                                                       fmnist_target) -> None:
    with pytest.raises(ServerInvalidArgument) as ei:
        TlsSettings(cert_file=pki.server_crt, key_file=pki.server_key, client_auth="require")
    assert ei.value.violations[0].field == "tls_ca"
    with pytest.raises(ServerInvalidArgument) as ei:
        TlsSettings(cert_file=pki.server_crt, key_file=pki.server_key, client_auth="optional")
    assert ei.value.violations[0].field == "tls_client_auth"
    mismatched = TlsSettings(cert_file=pki.server_crt, key_file=pki.client_key)
    # start_stack names the step (StartupError) and keeps the field's error as its cause
    with pytest.raises(StartupError) as se:
        _stack(tmp_path, mismatched)
    assert se.value.step == "TLS material"
    assert se.value.__cause__.violations[0].field == "tls_cert"
    assert "PRIVATE KEY" not in str(se.value)
    with pytest.raises(StartupError) as se:
        _stack(tmp_path, TlsSettings(cert_file=tmp_path / "none.crt", key_file=pki.server_key))
    assert se.value.__cause__.violations[0].field == "tls_cert"

    # Embedded mode: the services call each other at 127.0.0.1; a certificate naming only
    # fortis.internal fails that check at start, naming the setting that fixes it ...
    with pytest.raises(StartupError) as se:
        _stack(tmp_path, _tls(pki, cert="internal"))
    assert se.value.__cause__.violations[0].field == "tls_server_name"
    # ... and works with it; a client verifies that name the same way.
    s = _stack(tmp_path, _tls(pki, cert="internal", server_name="fortis.internal"))
    try:
        with FortisClient(s.address, api_key=API_KEY, tls_ca=pki.ca_crt,
                          tls_server_name="fortis.internal", timeout_s=10) as fc:
            assert [t.name for t in fc.targets()] == ["fmnist-cnn"]
    finally:
        s.stop(0)


SPLIT_PLAN = """
name: split-mtls
seed: 3
target: {name: fmnist-cnn, task: classification}
dataset: {source: fashion-mnist, split: test, limit: 16}
corruptions: [{id: gaussian_noise, severities: [1]}]
attacks:
  - {id: square, params: {epsilon: 0.05, max_queries: 20}, limit: 4}
execution: {batch_size: 8}
"""


def test_split_mode_runs_an_evaluation_over_mtls(tmp_path: Path, pki: Pki, fmnist_target,
                                                 fmnist_surrogate) -> None:
    """Five single-service stacks (the Kubernetes shape), every one requiring client
    certificates: the evaluation service reaches the other four, and the perturbation
    service the proxy, only with their own certificate as client certificate."""
    internal = "internal-key-shared-by-the-services"
    common = {"internal_key": internal}
    tls = _tls(pki, require=True)
    started = []
    try:
        for only in ("proxy", "scoring", "report"):
            started.append(_stack(tmp_path, tls, only=only, **common))
        proxy, scoring, report = (s.address for s in started)
        started.append(_stack(tmp_path, tls, only="perturbation", proxy_address=proxy, **common))
        evaluation = _stack(tmp_path, tls, only="evaluation", proxy_address=proxy,
                            perturbation_address=started[-1].address, scoring_address=scoring,
                            report_address=report, **common)
        started.append(evaluation)
        # A service's port refuses a client without a certificate, like the front door.
        assert _refused(lambda: _targets(proxy, _creds(pki))).code() == grpc.StatusCode.UNAVAILABLE
        with FortisClient(evaluation.address, api_key=API_KEY, tls_ca=pki.ca_crt,
                          tls_cert=pki.client_crt, tls_key=pki.client_key, timeout_s=30) as fc:
            ev = fc.submit(SPLIT_PLAN)
            final = fc.wait(ev.evaluation_id, timeout_s=300)
            assert final.state == State.SUCCEEDED, final.error
            report_json = fc.report(ev.evaluation_id)
        # Clean pass, one corruption and the square attack all reached the target through
        # the proxy: its ledger counts them (16 clean + 16 corrupted + the attack's queries).
        assert final.progress.queries > 32
        assert report_json
    finally:
        for s in reversed(started):
            s.stop(0)
