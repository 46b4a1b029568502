"""gRPC server reflection, v1 and v1alpha, from the contracts' descriptor set (comments
included), registered on every Fortis server by ``server.build_server``.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import grpc
import structlog
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection_pb2

log = structlog.get_logger("fortis.server")

#: The contracts as a FileDescriptorSet *with* source info (comments) plus google.rpc's status,
#: code and error_details; written by scripts/gen_protos.py. The _pb2 modules strip comments
#: and nothing imports error_details, so reflection from the default pool would serve neither.
DESCRIPTOR_SET = Path(__file__).with_name("fortis_descriptors.binpb")
#: Both reflection versions: buf curl and grpcurl ask for v1 first, older tools for v1alpha.
REFLECTION_SERVICES = ("grpc.reflection.v1.ServerReflection",
                       "grpc.reflection.v1alpha.ServerReflection")


def _v1_reflection_file() -> descriptor_pb2.FileDescriptorProto:
    """grpc/reflection/v1/reflection.proto, made from v1alpha's descriptor.

    grpcio-reflection 1.81 ships only v1alpha's stubs; v1 has the same messages under another
    package, so the wire format is identical and only the descriptor needs renaming.
    """
    fdp = descriptor_pb2.FileDescriptorProto.FromString(reflection_pb2.DESCRIPTOR.serialized_pb)
    old, new = ".grpc.reflection.v1alpha.", ".grpc.reflection.v1."
    fdp.name, fdp.package = "grpc/reflection/v1/reflection.proto", "grpc.reflection.v1"
    fdp.ClearField("options")
    for msg in fdp.message_type:
        for f in msg.field:
            if f.HasField("type_name"):  # scalars must keep it unset
                f.type_name = f.type_name.replace(old, new)
    for svc in fdp.service:
        for m in svc.method:
            m.input_type, m.output_type = (m.input_type.replace(old, new),
                                           m.output_type.replace(old, new))
    return fdp


class ReflectionServicer:
    """Serves grpc.reflection (v1 and v1alpha) from serialized files that keep their comments.

    The files come from DESCRIPTOR_SET first (documented contracts, google.rpc error details),
    then from the default pool for any registered service the set lacks (health, test
    services), so every listed service resolves.
    """

    def __init__(self, service_names: Iterable[str]) -> None:
        self._names = sorted(set(service_names))
        self._pool = descriptor_pool.DescriptorPool()
        self._files: dict[str, bytes] = {}
        if DESCRIPTOR_SET.exists():
            fds = descriptor_pb2.FileDescriptorSet.FromString(DESCRIPTOR_SET.read_bytes())
            for fdp in fds.file:  # protoc writes dependencies first
                self._add(fdp.name, fdp.SerializeToString())
        else:
            log.warning("reflection without comments: descriptor set missing",
                        path=str(DESCRIPTOR_SET))
        v1 = _v1_reflection_file()
        self._add(v1.name, v1.SerializeToString())
        default = descriptor_pool.Default()
        for name in self._names:
            if self._find_file(name) is None:
                try:
                    self._add_from(default.FindFileContainingSymbol(name))
                except KeyError:
                    log.warning("reflection: no descriptor for service", service=name)

    def _add(self, name: str, serialized: bytes) -> None:
        if name not in self._files:
            self._pool.AddSerializedFile(serialized)
            self._files[name] = serialized

    def _add_from(self, fd: Any) -> None:
        for dep in fd.dependencies:
            if dep.name not in self._files:
                self._add_from(dep)
        self._add(fd.name, fd.serialized_pb)

    def _find_file(self, symbol: str) -> str | None:
        try:
            return str(self._pool.FindFileContainingSymbol(symbol).name)
        except KeyError:
            return None

    def _closure(self, name: str) -> list[bytes]:
        """The file and its transitive imports, the file first (as the reflection spec asks)."""
        order: list[str] = []
        todo = [name]
        while todo:
            n = todo.pop()
            if n not in order:
                order.append(n)
                todo.extend(d.name for d in self._pool.FindFileByName(n).dependencies)
        return [self._files[n] for n in order]

    def _answer(self, req: Any) -> Any:
        pb = reflection_pb2
        kind = req.WhichOneof("message_request")
        filename: str | None = None
        try:
            if kind == "file_by_filename":
                filename = req.file_by_filename if req.file_by_filename in self._files else None
            elif kind == "file_containing_symbol":
                filename = self._find_file(req.file_containing_symbol)
            elif kind == "file_containing_extension":
                ext = req.file_containing_extension
                msg = self._pool.FindMessageTypeByName(ext.containing_type)
                filename = self._pool.FindExtensionByNumber(msg, ext.extension_number).file.name
            elif kind == "all_extension_numbers_of_type":
                msg = self._pool.FindMessageTypeByName(req.all_extension_numbers_of_type)
                numbers = sorted(e.number for e in self._pool.FindAllExtensions(msg))
                return pb.ServerReflectionResponse(
                    original_request=req, all_extension_numbers_response=pb.ExtensionNumberResponse(
                        base_type_name=msg.full_name, extension_number=numbers))
            elif kind == "list_services":
                return pb.ServerReflectionResponse(
                    original_request=req, list_services_response=pb.ListServiceResponse(
                        service=[pb.ServiceResponse(name=n) for n in self._names]))
            else:
                return pb.ServerReflectionResponse(
                    original_request=req, error_response=pb.ErrorResponse(
                        error_code=grpc.StatusCode.INVALID_ARGUMENT.value[0],
                        error_message="unknown reflection request"))
        except KeyError:
            filename = None
        if filename is None:
            return pb.ServerReflectionResponse(
                original_request=req, error_response=pb.ErrorResponse(
                    error_code=grpc.StatusCode.NOT_FOUND.value[0], error_message="not found"))
        return pb.ServerReflectionResponse(
            original_request=req, file_descriptor_response=pb.FileDescriptorResponse(
                file_descriptor_proto=self._closure(filename)))

    def ServerReflectionInfo(self, requests: Iterable[Any],  # noqa: N802 - gRPC method name
                             context: grpc.ServicerContext) -> Iterable[Any]:
        for req in requests:
            yield self._answer(req)


def add_reflection(server: grpc.Server, service_names: Iterable[str]) -> ReflectionServicer:
    """Register reflection v1 and v1alpha (both exempt from API keys) on ``server``."""
    servicer = ReflectionServicer(service_names)
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString)
    server.add_generic_rpc_handlers(tuple(
        grpc.method_handlers_generic_handler(name, {"ServerReflectionInfo": handler})
        for name in REFLECTION_SERVICES))
    return servicer


