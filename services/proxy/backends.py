"""gRPC client of ``fortis.target.v1.TargetService``: how the proxy reaches a target.

Transport: maps UNAVAILABLE / DEADLINE_EXCEEDED to ``errors.Unavailable`` (retried by the
proxy) and other failures to domain errors recorded in the ledger.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
from fortis.common.v1 import common_pb2
from fortis.infra.serving.server import DEFAULT_MAX_MESSAGE_BYTES, channel, error_from_rpc
from fortis.infra.serving.tracing_grpc import traced
from fortis.services.common import errors
from fortis.target.v1 import target_pb2, target_pb2_grpc

#: What gRPC says when it, not the target, refused an answer for its size.
_TOO_LARGE = ("Stream removed", "metadata size exceeds", "larger than max")
_RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
              grpc.StatusCode.RESOURCE_EXHAUSTED}


@dataclass(frozen=True)
class TargetTls:
    """TLS to a remote target (``--target NAME=grpcs://HOST:PORT?ca=...``):
    ``ca`` signs the target's certificate (empty: the system roots), ``cert`` and
    ``key`` are the proxy's client certificate when the target asks for mTLS, ``server_name``
    the name verified when the certificate does not name the address."""

    ca: str = ""
    cert: str = ""
    key: str = ""
    server_name: str = ""


def _read(path: str, field: str) -> bytes | None:
    if not path:
        return None
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise errors.InvalidArgument(field, f"cannot read '{path[:200]}' "
                                     f"({exc.strerror or type(exc).__name__})") from None
    if b"-----BEGIN" not in data:
        raise errors.InvalidArgument(field, f"'{path[:200]}' is not a PEM file")
    return data


def _tls_channel(address: str, tls: TargetTls) -> grpc.Channel:
    creds = grpc.ssl_channel_credentials(root_certificates=_read(tls.ca, "target.ca"),
                                         private_key=_read(tls.key, "target.key"),
                                         certificate_chain=_read(tls.cert, "target.cert"))
    opts: list[tuple[str, object]] = [
        ("grpc.max_receive_message_length", DEFAULT_MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", DEFAULT_MAX_MESSAGE_BYTES)]
    if tls.server_name:
        opts.append(("grpc.ssl_target_name_override", tls.server_name))
    return traced(grpc.secure_channel(address, creds, options=opts))


class GrpcTargetBackend:
    """A target reached over gRPC at ``address`` (plain text, or TLS with ``tls``)."""

    def __init__(self, address: str, *, timeout_s: float = 30.0,
                 metadata: Sequence[tuple[str, str]] = (), tls: TargetTls | None = None) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self._metadata = tuple(metadata)
        self._channel = channel(address) if tls is None else _tls_channel(address, tls)
        self._stub = target_pb2_grpc.TargetServiceStub(self._channel)
        self._info: target_pb2.TargetInfo | None = None

    def close(self) -> None:
        self._channel.close()

    def _map(self, exc: grpc.RpcError) -> errors.FortisError:
        code = exc.code()
        text = (exc.details() or "")[:300]
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED and any(m in text for m in _TOO_LARGE):
            # gRPC's own limit, not the target's quota: an answer or error trailers too large
            # to receive is a malformed answer, the same on every retry.
            return _detailed(errors.FortisError("answer too large to receive"),
                             f"target {self.address}: answer too large ({text})")
        if code in _RETRYABLE:
            return _detailed(errors.Unavailable(f"{code.name} from the target"),
                             f"target {self.address}: {code.name}: {exc.details()}")
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            # Keep the target's own field violations (e.g. images[3].encoded).
            return error_from_rpc(exc)
        # The target's own text (its address, paths, traces) is for the operator's log only
        # (the proxy's target_failure logs operator_detail); the message is the code alone.
        return _detailed(errors.FortisError(f"{code.name} from the target"),
                         f"target {self.address}: {code.name}: {exc.details()}")

    def info(self) -> target_pb2.TargetInfo:
        if self._info is None:
            try:
                resp = self._stub.GetTargetInfo(target_pb2.GetTargetInfoRequest(),
                                                timeout=self.timeout_s, metadata=self._metadata)
            except grpc.RpcError as exc:
                raise self._map(exc) from None
            self._info = resp.info
        return self._info

    def predict(self, images: Sequence[common_pb2.Image]) -> list[common_pb2.Prediction]:
        try:
            req = target_pb2.PredictRequest()
            for image in images:            # CopyFrom: fast under upb (see codec)
                req.images.add().CopyFrom(image)
            resp = self._stub.Predict(req, timeout=self.timeout_s, metadata=self._metadata)
        except grpc.RpcError as exc:
            raise self._map(exc) from None
        return list(resp.predictions)


def _detailed(exc: errors.FortisError, detail: str) -> errors.FortisError:
    """``exc`` carrying ``detail`` for the operator's log (never in its message)."""
    exc.operator_detail = detail[:4000]  # type: ignore[attr-defined]
    return exc
