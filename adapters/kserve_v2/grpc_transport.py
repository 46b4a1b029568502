"""OIP over gRPC (``inference.GRPCInferenceService``): the only module of the adapter that
imports grpc (docs/architecture.md section 4; tests/contract lists it as a transport module).

gRPC UNAVAILABLE / DEADLINE_EXCEEDED / RESOURCE_EXHAUSTED become ``TargetUnavailable`` (with a
``retry-after`` trailer when the server sent one), "larger than max" ``MessageTooLarge``, any
other code ``TargetResponseError``.
"""

from __future__ import annotations

from typing import Any

import grpc
from fortis.adapters.http_client import parse_retry_after
from fortis.adapters.kserve_v2.codec import (
    InTensor,
    OutTensor,
    infer_request_proto,
    outputs_from_proto,
)
from fortis.adapters.kserve_v2.metadata import ModelMeta, meta_from_proto
from fortis.adapters.kserve_v2.options import KServeOptions, bearer_token
from fortis.adapters.kserve_v2.transport import MAX_MESSAGE_BYTES, MessageTooLarge
from fortis.adapters.kserve_v2_protos import grpc_predict_v2_pb2 as pb
from fortis.adapters.kserve_v2_protos import grpc_predict_v2_pb2_grpc as pb_grpc
from fortis.adapters.target_errors import TargetResponseError, TargetUnavailable
from fortis.infra.serving.tracing_grpc import traced

_RETRYABLE_GRPC = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                   grpc.StatusCode.RESOURCE_EXHAUSTED}


class GrpcTransport:
    """OIP over gRPC with the generated ``GRPCInferenceService`` stub."""

    def __init__(self, opts: KServeOptions) -> None:
        self.opts = opts
        self.endpoint = opts.endpoint
        address = f"{opts.host}:{opts.port}"
        options: list[tuple[str, Any]] = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                                          ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)]
        if opts.host_header:
            options.append(("grpc.default_authority", opts.host_header))
        if opts.tls:
            channel = grpc.secure_channel(address, grpc.ssl_channel_credentials(), options)
        else:
            channel = grpc.insecure_channel(address, options)
        self._channel = traced(channel)       # the trace context in each call's metadata
        self._stub = pb_grpc.GRPCInferenceServiceStub(self._channel)
        self._metadata: tuple[tuple[str, str], ...] = ()
        self._token = bearer_token(opts.token_env, "kserve")
        if self._token:
            self._metadata = (("authorization", f"Bearer {self._token}"),)

    def _call(self, rpc: str, request: Any) -> Any:
        try:
            return getattr(self._stub, rpc)(request, timeout=self.opts.timeout_s,
                                            metadata=self._metadata)
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
            details = exc.details() if hasattr(exc, "details") else str(exc)
            if self._token:     # a server may echo the request's metadata in its details
                details = str(details).replace(self._token, "[redacted]")
            where = f"{self.endpoint} {rpc}"
            if code == grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in str(details):
                raise MessageTooLarge(f"{where}: {code.name}: {details}") from None
            if code in _RETRYABLE_GRPC:
                retry = None
                trailing = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
                for key, value in trailing or ():
                    if key == "retry-after":
                        retry = parse_retry_after(str(value))
                raise TargetUnavailable(f"{where}: {code.name}: {details}", retry) from None
            raise TargetResponseError(f"{where}: {code.name}: {details}") from None

    def ready(self) -> bool:
        resp = self._call("ModelReady", pb.ModelReadyRequest(name=self.opts.model,
                                                             version=self.opts.version))
        return bool(resp.ready)

    def metadata(self) -> ModelMeta:
        return meta_from_proto(self._call("ModelMetadata", pb.ModelMetadataRequest(
            name=self.opts.model, version=self.opts.version)))

    def infer(self, tensor: InTensor, output_name: str) -> list[OutTensor]:
        req = infer_request_proto(tensor, model=self.opts.model, version=self.opts.version,
                                  output_name=output_name, raw=self.opts.raw)
        resp = self._call("ModelInfer", req)
        try:
            return outputs_from_proto(resp)
        except TargetResponseError as exc:
            raise TargetResponseError(f"{self.endpoint} ModelInfer: {exc.message}") from None

    def close(self) -> None:
        self._channel.close()
