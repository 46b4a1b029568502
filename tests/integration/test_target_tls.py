"""TLS from the proxy to a remote target (transport security): ``--target
NAME=grpcs://HOST:PORT?ca=FILE[&cert=FILE&key=FILE][&server_name=NAME]``.

The target is a real gRPC ``TargetService`` of the test's own (the Fashion-MNIST CNN) serving
TLS, or mTLS requiring a client certificate, with certificates made by ``openssl`` in the
test. The proxy reaches it when it trusts the target's CA (and presents a certificate when
asked), and refuses to send anything otherwise: a wrong CA, or no client certificate for an
mTLS target, is UNAVAILABLE with no answer from the target."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from fortis.common.v1 import common_pb2
from fortis.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from fortis.services.common import errors
from fortis.target.v1 import target_pb2_grpc

from tests.conftest import API_KEY, MD
from tests.integration.test_tls import Pki, make_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("target-pki"))


def _target_server(pki: Pki, *, require_client_cert: bool) -> tuple[grpc.Server, int, list[int]]:
    from fortis.adapters.builtin import load_model
    from fortis.adapters.torch_target import ClassifierTarget, TargetServicer

    seen: list[int] = []

    class Counting(TargetServicer):
        def Predict(self, request: Any, context: Any) -> Any:  # noqa: N802 - gRPC name
            seen.append(len(request.images))
            return super().Predict(request, context)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    target_pb2_grpc.add_TargetServiceServicer_to_server(
        Counting(ClassifierTarget(load_model("fmnist-cnn"))), server)
    creds = grpc.ssl_server_credentials(
        [(pki.server_key.read_bytes(), pki.server_crt.read_bytes())],
        root_certificates=pki.ca_crt.read_bytes() if require_client_cert else None,
        require_client_auth=require_client_cert)
    port = server.add_secure_port("127.0.0.1:0", creds)
    server.start()
    return server, port, seen


def _stack(tmp_path: Path, spec: str) -> Any:
    from fortis.server.app.stack import StackSettings, TargetConfig, start_stack
    return start_stack(StackSettings(state_dir=tmp_path / "state", api_keys={API_KEY: "tenant-a"},
                                     targets=[TargetConfig.parse(spec)]))


def _predict(stack: Any, session: str) -> Any:
    with grpc.insecure_channel(stack.address) as ch:
        stub = proxy_pb2_grpc.TargetProxyServiceStub(ch)
        stub.CreateSession(proxy_pb2.CreateSessionRequest(target="own", session_id=session,
                                                          query_budget=4), metadata=MD)
        img = common_pb2.Image(image_id="i0", tensor=common_pb2.Tensor(
            dtype=common_pb2.D_TYPE_UINT8, shape=[28, 28, 1], data=bytes(784)))
        return stub.Predict(proxy_pb2.PredictRequest(session_id=session, images=[img]),
                            metadata=MD, timeout=60)


@pytest.fixture()
def tls_target(pki: Pki, fmnist_target: Any) -> Iterator[tuple[int, list[int]]]:
    server, port, seen = _target_server(pki, require_client_cert=False)
    yield port, seen
    server.stop(0)


@pytest.fixture()
def mtls_target(pki: Pki, fmnist_target: Any) -> Iterator[tuple[int, list[int]]]:
    server, port, seen = _target_server(pki, require_client_cert=True)
    yield port, seen
    server.stop(0)


def test_proxy_reaches_a_tls_target_it_trusts(tmp_path: Path, pki: Pki, tls_target) -> None:
    port, seen = tls_target
    stack = _stack(tmp_path, f"own=grpcs://127.0.0.1:{port}?ca={pki.ca_crt}")
    try:
        out = _predict(stack, "tls-ok")
        assert [p.image_id for p in out.predictions] == ["i0"] and seen == [1]
    finally:
        stack.stop(0)


def test_proxy_refuses_a_target_signed_by_another_ca(tmp_path: Path, pki: Pki,
                                                      tls_target) -> None:
    port, seen = tls_target
    stack = _stack(tmp_path, f"own=grpcs://127.0.0.1:{port}?ca={pki.otherca_crt}")
    try:
        with pytest.raises(grpc.RpcError) as exc:
            _predict(stack, "tls-wrong-ca")
        assert exc.value.code() == grpc.StatusCode.UNAVAILABLE
        assert seen == []                  # nothing reached the target
    finally:
        stack.stop(0)


def test_mtls_target_needs_the_proxys_client_certificate(tmp_path: Path, pki: Pki,
                                                         mtls_target) -> None:
    port, seen = mtls_target
    without = _stack(tmp_path / "a", f"own=grpcs://127.0.0.1:{port}?ca={pki.ca_crt}")
    try:
        with pytest.raises(grpc.RpcError) as exc:
            _predict(without, "mtls-no-cert")
        assert exc.value.code() == grpc.StatusCode.UNAVAILABLE and seen == []
    finally:
        without.stop(0)
    with_cert = _stack(tmp_path / "b", f"own=grpcs://127.0.0.1:{port}?ca={pki.ca_crt}"
                                       f"&cert={pki.client_crt}&key={pki.client_key}")
    try:
        out = _predict(with_cert, "mtls-cert")
        assert [p.image_id for p in out.predictions] == ["i0"] and seen == [1]
    finally:
        with_cert.stop(0)


def test_bad_grpcs_settings_name_the_field(tmp_path: Path, pki: Pki) -> None:
    from fortis.server.app.stack import TargetConfig
    with pytest.raises(errors.InvalidArgument, match="cert= and key="):
        TargetConfig.parse(f"own=grpcs://127.0.0.1:1?ca={pki.ca_crt}&cert={pki.client_crt}")
    from fortis.infra.serving.startup import StartupError
    with pytest.raises(StartupError) as exc:      # the step, with the field's error as cause
        _stack(tmp_path, f"own=grpcs://127.0.0.1:1?ca={tmp_path / 'missing.crt'}")
    assert exc.value.__cause__.violations[0].field == "target.ca"
