"""Server reflection serves the documented contracts and the error-detail types.

Why: reflection is how `buf curl`, grpcurl and IDEs learn the contracts without a checkout. It
must answer on v1 (what current tools ask first) and v1alpha (older tools), hand out the proto
comments (the _pb2 modules strip them, so the server serves services/common/
fortis_descriptors.binpb instead of the default pool), and resolve google.rpc.BadRequest and
the other google.rpc details, which no Fortis proto imports, so a client can decode the
details of a failed call from reflection alone.
"""

from __future__ import annotations

import base64
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from fortis.evaluation.v1 import evaluation_pb2_grpc
from fortis.infra.serving.server import RunningServer, ServerSettings, build_server
from fortis.scoring.v1 import scoring_pb2_grpc
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from grpc_reflection.v1alpha import reflection_pb2

from tests.conftest import API_KEY

ROOT = Path(__file__).resolve().parents[2]
BUF = ROOT / "node_modules" / ".bin" / "buf"
VERSIONS = ("grpc.reflection.v1", "grpc.reflection.v1alpha")


@pytest.fixture()
def server() -> Iterator[RunningServer]:
    """A server with two Fortis services (unimplemented bodies: reflection needs no logic)."""
    srv = build_server(ServerSettings(api_keys={API_KEY: "tenant-a"}), [
        (evaluation_pb2_grpc.add_EvaluationServiceServicer_to_server,
         evaluation_pb2_grpc.EvaluationServiceServicer(), "fortis.evaluation.v1.EvaluationService"),
        (scoring_pb2_grpc.add_ScoringServiceServicer_to_server,
         scoring_pb2_grpc.ScoringServiceServicer(), "fortis.scoring.v1.ScoringService"),
    ])
    yield srv
    srv.stop(0)


def reflect(address: str, version: str,
            *requests: reflection_pb2.ServerReflectionRequest
            ) -> list[reflection_pb2.ServerReflectionResponse]:
    """One ServerReflectionInfo stream (v1 and v1alpha share the wire format), no API key."""
    with grpc.insecure_channel(address) as ch:
        call = ch.stream_stream(
            f"/{version}.ServerReflection/ServerReflectionInfo",
            request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
            response_deserializer=reflection_pb2.ServerReflectionResponse.FromString)
        return list(call(iter(requests), timeout=10))


def files_of(resp: reflection_pb2.ServerReflectionResponse
             ) -> list[descriptor_pb2.FileDescriptorProto]:
    assert resp.WhichOneof("message_response") == "file_descriptor_response", resp
    return [descriptor_pb2.FileDescriptorProto.FromString(b)
            for b in resp.file_descriptor_response.file_descriptor_proto]


def leading_comment(fdp: descriptor_pb2.FileDescriptorProto, path: list[int]) -> str:
    for loc in fdp.source_code_info.location:
        if list(loc.path) == path:
            return loc.leading_comments
    return ""


@pytest.mark.parametrize("version", VERSIONS)
def test_list_services_on_both_versions(server, version):
    (resp,) = reflect(server.address, version,
                      reflection_pb2.ServerReflectionRequest(list_services=""))
    names = {s.name for s in resp.list_services_response.service}
    assert {"fortis.evaluation.v1.EvaluationService", "fortis.scoring.v1.ScoringService",
            "grpc.health.v1.Health", *(f"{v}.ServerReflection" for v in VERSIONS)} <= names


@pytest.mark.parametrize("version", VERSIONS)
def test_service_descriptor_carries_its_comments(server, version):
    (resp,) = reflect(server.address, version, reflection_pb2.ServerReflectionRequest(
        file_containing_symbol="fortis.evaluation.v1.EvaluationService"))
    fdp = files_of(resp)[0]
    assert fdp.name == "fortis/evaluation/v1/evaluation.proto"
    svc = [i for i, s in enumerate(fdp.service) if s.name == "EvaluationService"][0]
    # FileDescriptorProto.service = 6; ServiceDescriptorProto.method = 2
    comment = leading_comment(fdp, [6, svc])
    assert "Auth: every call needs an API key" in comment
    assert "Checks a plan without running it" in leading_comment(fdp, [6, svc, 2, 0])
    # field behaviours travel too: CreateEvaluationRequest.plan is REQUIRED
    create = next(m for m in fdp.message_type if m.name == "CreateEvaluationRequest")
    assert create.field[0].options.ByteSize() > 0


@pytest.mark.parametrize("version", VERSIONS)
def test_error_detail_types_resolve(server, version):
    resps = reflect(server.address, version, *(
        reflection_pb2.ServerReflectionRequest(file_containing_symbol=s)
        for s in ("google.rpc.BadRequest", "google.rpc.QuotaFailure", "google.rpc.Status",
                  "google.rpc.Code")))
    names = [files_of(r)[0].name for r in resps]
    assert names == ["google/rpc/error_details.proto"] * 2 + ["google/rpc/status.proto",
                                                            "google/rpc/code.proto"]


def test_unknown_symbol_is_not_found_and_stream_survives(server):
    resps = reflect(server.address, "grpc.reflection.v1",
                    reflection_pb2.ServerReflectionRequest(file_containing_symbol="no.Such"),
                    reflection_pb2.ServerReflectionRequest(file_by_filename="nope.proto"),
                    reflection_pb2.ServerReflectionRequest(
                        file_by_filename="google/rpc/status.proto"))
    assert [r.WhichOneof("message_response") for r in resps] == [
        "error_response", "error_response", "file_descriptor_response"]
    assert resps[0].error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0]


def _decode_with_reflection(address: str, type_name: str, value: bytes) -> dict:
    """Decode a detail using only descriptors served by reflection (no Fortis stubs)."""
    (resp,) = reflect(address, "grpc.reflection.v1",
                      reflection_pb2.ServerReflectionRequest(file_containing_symbol=type_name))
    pool = descriptor_pool.DescriptorPool()
    pending = {f.name: f for f in files_of(resp)}
    while pending:  # add in dependency order
        for name, f in list(pending.items()):
            if all(d not in pending for d in f.dependency):
                pool.Add(f)
                del pending[name]
    cls = message_factory.GetMessageClass(pool.FindMessageTypeByName(type_name))
    return json_format.MessageToDict(cls.FromString(value))


@pytest.mark.slow
@pytest.mark.parametrize("reflect_protocol", ["grpc-v1", "grpc-v1alpha"])
def test_buf_curl_through_reflection_gets_bad_request_details(stack, reflect_protocol):
    """`buf curl` (reflection only, no protos) calls ValidatePlan with a bad plan and gets
    INVALID_ARGUMENT with a google.rpc.BadRequest naming the fields.

    buf 1.75 prints details through connect-go's error writer, which decodes only the types
    compiled into the buf binary (google.rpc.BadRequest is not), so it shows the detail's
    value as base64 whatever the server serves. The test therefore checks that the value
    decodes with the descriptors the server hands out by reflection, and accepts buf's own
    decoded form ("debug") should a later buf provide it.
    """
    r = subprocess.run(
        [str(BUF), "curl", "--protocol", "grpc", "--http2-prior-knowledge",
         "--reflect-protocol", reflect_protocol, "-H", f"x-api-key: {API_KEY}",
         "-d", json.dumps({"plan": "name: x"}),
         f"http://{stack.address}/fortis.evaluation.v1.EvaluationService/ValidatePlan"],
        capture_output=True, text=True, timeout=60)
    assert r.returncode != 0, r.stdout
    err = json.loads(r.stderr)
    assert err["code"] == "invalid_argument"
    (detail,) = [d for d in err["details"] if d["type"] == "google.rpc.BadRequest"]
    if "debug" in detail:
        decoded = detail["debug"]
    else:
        raw = base64.b64decode(detail["value"] + "=" * (-len(detail["value"]) % 4))
        decoded = _decode_with_reflection(stack.address, "google.rpc.BadRequest", raw)
    fields = {v["field"] for v in decoded["fieldViolations"]}
    assert {"target", "dataset"} <= fields, decoded


@pytest.mark.parametrize("reflect_protocol", ["grpc-v1", "grpc-v1alpha"])
def test_buf_curl_lists_methods_by_reflection(server, reflect_protocol):
    r = subprocess.run([str(BUF), "curl", "--protocol", "grpc", "--http2-prior-knowledge",
                        "--reflect-protocol", reflect_protocol, "--list-methods",
                        f"http://{server.address}"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    methods = r.stdout.split()
    assert "fortis.evaluation.v1.EvaluationService/ValidatePlan" in methods
    assert "fortis.scoring.v1.ScoringService/ScoreEvaluation" in methods
