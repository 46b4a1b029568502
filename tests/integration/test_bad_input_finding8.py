"""Case by case: bad input gets INVALID_ARGUMENT naming the field, never
INTERNAL or another code, over real loopback gRPC to a real stack (tests/conftest.py ``stack``:
all five services, two tenants).

"INTERNAL for: a tensor with shape ``[]``, shapes that overflow int64 (``[2^62+1, 4]``), a PNG
header declaring 100000x100000, ``severities: [[1]]``, JSON/YAML nested 100k deep, Struct params
nested 90 deep, RunAttack epsilon NaN/Inf, ``page_token`` 2^70; ``page_token`` "nan"/"inf"
accepted. Error messages over the metadata limit arrive as RESOURCE_EXHAUSTED "Stream removed"
(10 unknown corruption ids), a 1 MB id is echoed back, ... 1 MB ids, origins and names are
stored as given." (The oversized target error retried 4x: tests/integration/
test_target_errors.py.) Each case also keeps the rules of tests/fuzz/harness.py (message
<= 1 KB, no echo of the input, BadRequest present) and the stack serves a normal call after.
"""

from __future__ import annotations

import base64
import json
import struct
import zlib
from typing import Any

import grpc
import pytest
from fortis.common.v1 import common_pb2
from fortis.evaluation.v1 import evaluation_pb2 as ev
from fortis.perturbation.v1 import perturbation_pb2 as pt
from fortis.proxy.v1 import proxy_pb2 as px
from fortis.proxy.v1 import proxy_pb2_grpc
from fortis.scoring.v1 import scoring_pb2 as sc
from google.protobuf import struct_pb2
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from tests.conftest import MD
from tests.fuzz.harness import call
from tests.fuzz.strategies import RPCS, nested_struct, png_header

MB = "x" * 1_000_000
PLAN = """name: f8
seed: 1
target: {name: fmnist-cnn, task: classification}
dataset: {source: fashion-mnist, split: test, limit: 8}
corruptions: [{id: gaussian_noise, severities: [1]}]
"""


def _tensor(shape: list[int], data: bytes = b"\x00" * 16) -> common_pb2.Tensor:
    return common_pb2.Tensor(dtype=common_pb2.D_TYPE_UINT8, shape=shape, data=data)


def _img(**content: Any) -> common_pb2.Image:
    return common_pb2.Image(image_id="i0", **content)


def _ok_img() -> common_pb2.Image:
    return _img(tensor=_tensor([28, 28, 1], bytes(784)))


def _struct(**kw: Any) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    for k, v in kw.items():
        if isinstance(v, struct_pb2.Struct):
            s.fields[k].struct_value.CopyFrom(v)
        elif isinstance(v, float):
            s.fields[k].number_value = v
        else:
            s.update({k: v})
    return s


def _token(o: Any, k: str = "evaluations") -> str:
    return base64.urlsafe_b64encode(json.dumps({"k": k, "o": o}).encode()).decode().rstrip("=")


def _with_params(req: Any, params: struct_pb2.Struct | None) -> Any:
    if params is not None:      # CopyFrom: the constructor round-trips a Struct through bytes
        req.params.CopyFrom(params)
    return req


def _apply(params: struct_pb2.Struct | None = None, **kw: Any) -> pt.ApplyPerturbationRequest:
    base: dict[str, Any] = {"perturbation_id": "gaussian_noise", "severity": 1, "seed": 1,
                            "images": [_ok_img()]}
    base.update(kw)
    return _with_params(pt.ApplyPerturbationRequest(**base), params)


def _attack(params: struct_pb2.Struct) -> pt.RunAttackRequest:
    return _with_params(pt.RunAttackRequest(
        attack_id="square", seed=1, images=[pt.LabeledImage(image=_ok_img(), labels=[0])]),
        params)


def _compute(metric: str, params: struct_pb2.Struct) -> sc.ComputeRequest:
    return _with_params(sc.ComputeRequest(metric=metric), params)


def _jpeg_sof(width: int, height: int) -> bytes:
    sof = b"\xff\xc0" + struct.pack(">HBHHB", 11, 8, height, width, 1) + b"\x01\x11\x00"
    return b"\xff\xd8" + sof + b"\xff\xd9"


UNKNOWN_IDS = ", ".join("{id: " + "no_such_corruption_" * 15 + f"{i}, severities: [1]}}"
                        for i in range(10))

# (RPC, request, the field the BadRequest must name: exact, or a prefix ending in '.'/'[')
CASES: list[tuple[str, str, Any, str]] = [
    ("tensor shape []", "PerturbationService.ApplyPerturbation",
     _apply(images=[_img(tensor=_tensor([]))]), "images[0]"),
    ("tensor shape [] to the proxy", "TargetProxyService.Predict",
     px.PredictRequest(session_id="f8", images=[_img(tensor=_tensor([]))]), "images[0]"),
    ("shape overflowing int64", "PerturbationService.ApplyPerturbation",
     _apply(images=[_img(tensor=_tensor([2**62 + 1, 4]))]), "images[0]"),
    ("shape overflowing int64 in Compute", "ScoringService.Compute",
     sc.ComputeRequest(metric="drr", arrays={"perturbed_probs": _tensor([2**62 + 1, 4])}),
     "arrays.perturbed_probs"),
    ("negative dimension", "TargetProxyService.Predict",
     px.PredictRequest(session_id="f8", images=[_img(tensor=_tensor([-1, 28, 1]))]),
     "images[0]"),
    ("PNG declaring 100000x100000", "PerturbationService.ApplyPerturbation",
     _apply(images=[_img(encoded=png_header(100000, 100000))]), "images[0]"),
    ("PNG declaring 100000x100000 to the proxy", "TargetProxyService.Predict",
     px.PredictRequest(session_id="f8", images=[_img(encoded=png_header(100000, 100000))]),
     "images[0]"),
    ("JPEG declaring 65500x65500", "PerturbationService.ApplyPerturbation",
     _apply(images=[_img(encoded=_jpeg_sof(65500, 65500))]), "images[0]"),
    ("severities: [[1]]", "EvaluationService.ValidatePlan",
     ev.ValidatePlanRequest(plan=PLAN.replace("severities: [1]", "severities: [[1]]")),
     "corruptions[0].severities"),
    ("JSON nested 100k deep", "EvaluationService.ValidatePlan",
     ev.ValidatePlanRequest(plan="[" * 100_000 + "]" * 100_000,
                            format=ev.PLAN_FORMAT_JSON), "plan"),
    ("YAML nested 100k deep", "EvaluationService.CreateEvaluation",
     ev.CreateEvaluationRequest(plan="a: " + "[" * 100_000 + "]" * 100_000), "plan"),
    ("Struct params nested 90 deep", "PerturbationService.ApplyPerturbation",
     _apply(params=_struct(sigma=nested_struct(90))), "request"),
    ("Struct params nested 90 deep to RunAttack", "PerturbationService.RunAttack",
     _attack(_struct(epsilon=nested_struct(90))), "request"),
    ("Struct params nested 90 deep to Compute", "ScoringService.Compute",
     _compute("irt", _struct(chain_length=nested_struct(90))), "request"),
    ("Struct params nested 30 deep (parses)", "ScoringService.Compute",
     _compute("irt", _struct(chain_length=nested_struct(30))), "params"),
    ("RunAttack epsilon NaN", "PerturbationService.RunAttack",
     _attack(_struct(epsilon=float("nan"), max_queries=4.0)), "params.epsilon"),
    ("RunAttack epsilon Inf", "PerturbationService.RunAttack",
     _attack(_struct(epsilon=float("inf"), max_queries=4.0)), "params.epsilon"),
    ("RunAttack epsilon -Inf", "PerturbationService.RunAttack",
     _attack(_struct(epsilon=float("-inf"), max_queries=4.0)), "params.epsilon"),
    ("page_token 2^70", "EvaluationService.ListEvaluations",
     ev.ListEvaluationsRequest(page_token=_token(2**70)), "page_token"),
    ("page_token 'nan'", "EvaluationService.ListEvaluations",
     ev.ListEvaluationsRequest(page_token="nan"), "page_token"),
    ("page_token 'inf'", "TargetProxyService.ListTargets",
     px.ListTargetsRequest(page_token="inf"), "page_token"),
    ("page_token NaN inside", "ScoringService.ListMetrics",
     sc.ListMetricsRequest(page_token=_token("nan", "metrics")), "page_token"),
    ("page_token 2^70 for the ledger", "TargetProxyService.ListLedgerEntries",
     px.ListLedgerEntriesRequest(session_id="f8", page_token=_token(2**70, "ledger")),
     "page_token"),
    ("10 unknown corruption ids", "EvaluationService.ValidatePlan",
     ev.ValidatePlanRequest(plan=PLAN.replace(
         "[{id: gaussian_noise, severities: [1]}]", f"[{UNKNOWN_IDS}]")), "corruptions[0].id"),
    ("1 MB evaluation id", "EvaluationService.GetEvaluation",
     ev.GetEvaluationRequest(evaluation_id=MB), "evaluation_id"),
    ("1 MB evaluation id at creation", "EvaluationService.CreateEvaluation",
     ev.CreateEvaluationRequest(plan=PLAN, evaluation_id=MB), "evaluation_id"),
    ("1 MB session id", "TargetProxyService.CreateSession",
     px.CreateSessionRequest(target="fmnist-cnn", session_id=MB), "session_id"),
    ("1 MB origin", "TargetProxyService.Predict",
     px.PredictRequest(session_id="f8", origin=MB, images=[_ok_img()]), "origin"),
    ("1 MB image id", "TargetProxyService.Predict",
     px.PredictRequest(session_id="f8", images=[common_pb2.Image(
         image_id=MB, tensor=_tensor([28, 28, 1], bytes(784)))]), "images[0].image_id"),
    ("100 KB plan name", "EvaluationService.ValidatePlan",
     ev.ValidatePlanRequest(plan=PLAN.replace("name: f8", f"name: {MB[:100_000]}")), "name"),
    ("1 MB plan", "EvaluationService.ValidatePlan",
     ev.ValidatePlanRequest(plan=PLAN.replace("name: f8", f"name: {MB}")), "plan"),
    ("1 MB session description", "TargetProxyService.CreateSession",
     px.CreateSessionRequest(target="fmnist-cnn", session_id="f8-d", description=MB),
     "description"),
]


def _fields(exc_status: Any) -> list[str]:
    out = []
    for d in exc_status.details:
        br = error_details_pb2.BadRequest()
        if d.Unpack(br):
            out += [v.field for v in br.field_violations]
    return out


@pytest.fixture()
def f8_channel(stack: Any, channel: grpc.Channel) -> grpc.Channel:
    proxy_pb2_grpc.TargetProxyServiceStub(channel).CreateSession(
        px.CreateSessionRequest(target="fmnist-cnn", session_id="f8"), metadata=MD)
    return channel


@pytest.mark.parametrize(("what", "rpc", "request_", "field"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_invalid_argument_naming_the_field(f8_channel: grpc.Channel, what: str,
                                                        rpc: str, request_: Any, field: str
                                                        ) -> None:
    out = call(f8_channel, RPCS[rpc], request_, metadata=MD, timeout=60)
    assert out.code == grpc.StatusCode.INVALID_ARGUMENT, (out.code, out.message[:300])
    assert not out.problems, out.problems
    assert out.status is not None
    fields = _fields(out.status)
    assert field in fields or any(f.startswith(field + ".") or f.startswith(field + "[")
                                  for f in fields), (fields, out.message[:300])
    assert len(out.message.encode()) <= 1024 and out.status.ByteSize() <= 3072
    # ... and the service keeps serving
    stub = proxy_pb2_grpc.TargetProxyServiceStub(f8_channel)
    assert stub.GetTargetInfo(px.GetTargetInfoRequest(target="fmnist-cnn"), metadata=MD).info


def test_nothing_of_a_1mb_id_is_stored(f8_channel: grpc.Channel) -> None:
    """Refused ids, origins and names leave no session, ledger row or evaluation behind."""
    stub = proxy_pb2_grpc.TargetProxyServiceStub(f8_channel)
    for rpc, req in [("TargetProxyService.CreateSession",
                      px.CreateSessionRequest(target="fmnist-cnn", session_id=MB)),
                     ("TargetProxyService.Predict",
                      px.PredictRequest(session_id="f8", origin=MB, images=[_ok_img()]))]:
        assert call(f8_channel, RPCS[rpc], req, metadata=MD).code == \
            grpc.StatusCode.INVALID_ARGUMENT
    entries = stub.ListLedgerEntries(px.ListLedgerEntriesRequest(session_id="f8"),
                                     metadata=MD).entries
    assert list(entries) == []
    listed = call(f8_channel, RPCS["EvaluationService.ListEvaluations"],
                  ev.ListEvaluationsRequest(), metadata=MD)
    assert listed.code == grpc.StatusCode.OK


def test_the_png_bomb_is_refused_before_decoding_from_its_header() -> None:
    """The PNG of the cases really is tiny and really declares 100000x100000."""
    data = png_header(100000, 100000)
    assert len(data) < 200 and data[12:16] == b"IHDR"
    assert struct.unpack(">II", data[16:24]) == (100000, 100000)
    assert zlib.crc32(data[12:29]) == struct.unpack(">I", data[29:33])[0]
    assert rpc_status is not None
