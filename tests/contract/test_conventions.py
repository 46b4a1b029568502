"""API conventions of the contracts (Google AIP where Buf allows), checked on the descriptors.

Why: Buf STANDARD checks names, not conventions. These keep what a client of any language
relies on: language options for generated code, the auth rule in every service's comment,
paginated List RPCs with opaque tokens, field behaviours (REQUIRED ids, OUTPUT_ONLY
server-set fields), and `buf breaking` against the last released contract.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from google.api import field_behavior_pb2
from google.protobuf import descriptor_pb2

ROOT = Path(__file__).resolve().parents[2]
BUF = ROOT / "node_modules" / ".bin" / "buf"
DESCRIPTORS = ROOT / "infra" / "serving" / "fortis_descriptors.binpb"
BASELINE = ROOT / "protos" / "released" / "fortis-v1.binpb"

REQUIRED = field_behavior_pb2.FieldBehavior.REQUIRED
OPTIONAL = field_behavior_pb2.FieldBehavior.OPTIONAL
OUTPUT_ONLY = field_behavior_pb2.FieldBehavior.OUTPUT_ONLY


def _fortis_files() -> list[descriptor_pb2.FileDescriptorProto]:
    fds = descriptor_pb2.FileDescriptorSet.FromString(DESCRIPTORS.read_bytes())
    files = [f for f in fds.file if f.package.startswith("fortis.")]
    assert len(files) == 8, [f.name for f in files]   # + evaluation/v1/uploads.proto
    return files


FILES = _fortis_files()
MESSAGES = {f"{f.package}.{m.name}": m for f in FILES for m in f.message_type}


def behaviours(message: str, field: str) -> list[int]:
    (fd,) = [x for x in MESSAGES[message].field if x.name == field]
    return list(fd.options.Extensions[field_behavior_pb2.field_behavior])


def comment(f: descriptor_pb2.FileDescriptorProto, path: list[int]) -> str:
    return next((loc.leading_comments for loc in f.source_code_info.location
                 if list(loc.path) == path), "")


@pytest.mark.parametrize("f", FILES, ids=lambda f: f.package)
def test_language_options(f):
    area = f.package.split(".")[1]
    o = f.options
    assert o.go_package == f"github.com/fortis-robustness/fortis/gen/go/fortis/{area}/v1;{area}v1"
    assert o.java_package == f"ai.fortis.{area}.v1" and o.java_multiple_files
    # one outer class per file: <FileStem>Proto (EvaluationProto, UploadsProto)
    assert o.java_outer_classname == f"{Path(f.name).stem.capitalize()}Proto"
    assert o.csharp_namespace == f"Fortis.{area.capitalize()}.V1"
    assert o.php_namespace == f"Fortis\\{area.capitalize()}\\V1"
    assert o.ruby_package == f"Fortis::{area.capitalize()}::V1"
    assert len(o.objc_class_prefix) == 3


def test_every_service_states_its_auth_rule():
    services = [(f, i, s) for f in FILES for i, s in enumerate(f.service)]
    assert len(services) == 7  # common.proto has none; evaluation/v1 has two
    for f, i, s in services:
        assert "Auth:" in comment(f, [6, i]), f"{s.name}: leading comment has no auth rule"


def test_every_list_rpc_is_paginated_with_opaque_tokens():
    lists = [m for f in FILES for s in f.service for m in s.method
             if m.name.startswith("List")]
    assert len(lists) == 7
    for m in lists:
        req, resp = MESSAGES[m.input_type.lstrip(".")], MESSAGES[m.output_type.lstrip(".")]
        fields = {x.name: x for x in req.field}
        assert fields["page_size"].type == descriptor_pb2.FieldDescriptorProto.TYPE_INT32, m.name
        assert fields["page_token"].type == descriptor_pb2.FieldDescriptorProto.TYPE_STRING
        assert "next_page_token" in {x.name for x in resp.field}, m.name
        assert behaviours(m.input_type.lstrip("."), "page_token") == [OPTIONAL]


@pytest.mark.parametrize(("message", "field", "expected"), [
    ("fortis.evaluation.v1.CreateEvaluationRequest", "plan", REQUIRED),
    ("fortis.evaluation.v1.ValidatePlanRequest", "plan", REQUIRED),
    ("fortis.evaluation.v1.GetEvaluationRequest", "evaluation_id", REQUIRED),
    ("fortis.evaluation.v1.CancelEvaluationRequest", "evaluation_id", REQUIRED),
    ("fortis.evaluation.v1.Evaluation", "create_time", OUTPUT_ONLY),
    ("fortis.evaluation.v1.Evaluation", "state", OUTPUT_ONLY),
    ("fortis.evaluation.v1.Evaluation", "tenant", OUTPUT_ONLY),
    ("fortis.proxy.v1.PredictRequest", "session_id", REQUIRED),
    ("fortis.proxy.v1.PredictRequest", "images", REQUIRED),
    ("fortis.proxy.v1.Session", "tenant", OUTPUT_ONLY),
    ("fortis.proxy.v1.LedgerEntry", "entry_id", OUTPUT_ONLY),
    ("fortis.target.v1.PredictRequest", "images", REQUIRED),
    ("fortis.perturbation.v1.ApplyPerturbationRequest", "perturbation_id", REQUIRED),
    ("fortis.perturbation.v1.RunAttackRequest", "attack_id", REQUIRED),
    ("fortis.scoring.v1.ComputeRequest", "metric", REQUIRED),
    ("fortis.report.v1.RenderReportRequest", "parts", REQUIRED),
])
def test_field_behaviour(message, field, expected):
    assert behaviours(message, field) == [expected]


def test_every_request_id_field_has_a_behaviour():
    """A request's *_id (and `target`) field says whether it must be set."""
    missing = [f"{name}.{fd.name}" for name, m in MESSAGES.items() if name.endswith("Request")
               for fd in m.field if fd.name.endswith("_id") or fd.name == "target"
               if not fd.options.Extensions[field_behavior_pb2.field_behavior]]
    assert not missing, missing


@pytest.mark.slow
def test_buf_breaking_against_the_released_contract():
    """Wire and source compatibility with the last released contract (protos/released/)."""
    assert BASELINE.exists(), "record it: cd protos && buf build -o released/fortis-v1.binpb"
    r = subprocess.run([str(BUF), "breaking", "--against", str(BASELINE.relative_to(
        ROOT / "protos"))], cwd=ROOT / "protos", capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
