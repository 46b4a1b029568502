"""Every field of every request has a documented limit, so work is bounded: every numeric
parameter of every RPC has a documented maximum; plans, strings and nesting depth have limits
(SPEC IEEE-M6 / IEEE-A9 for the budget and bound parameters).

- Walks every request message of every service's descriptor, recursively, and fails on a
  numeric, string, bytes or repeated field without a bound in services/common/limits.py. The
  explicit exceptions: enums and bools ("free", with a reason), and the values of messages a
  caller only hands back to be printed in a report (``ECHO_MESSAGES``).
- No stale entry: every key of ``FIELD_LIMITS`` names a field that exists.
- One source of truth: the constants other modules enforce equal the named limits, and every
  numeric parameter of every perturbation and attack schema has a minimum and a maximum.
- docs/limits.md is what scripts/gen_limits_doc.py generates from all of the above.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from fortis.evaluation.v1 import evaluation_pb2, uploads_pb2
from fortis.perturbation.v1 import perturbation_pb2
from fortis.proxy.v1 import proxy_pb2
from fortis.report.v1 import report_pb2
from fortis.scoring.v1 import scoring_pb2
from fortis.services.common import limits
from fortis.services.common.errors import InvalidArgument
from fortis.target.v1 import target_pb2
from google.protobuf import descriptor_pool
from google.protobuf.descriptor import FieldDescriptor

ROOT = Path(__file__).resolve().parents[2]
MODULES = (evaluation_pb2, uploads_pb2, perturbation_pb2, proxy_pb2, report_pb2, scoring_pb2, target_pb2)
_NUMERIC = {FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_INT32,
            FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_UINT64,
            FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SINT64}


def _request_fields() -> list[tuple[str, str, FieldDescriptor]]:
    out = []
    for mod in MODULES:
        for svc in mod.DESCRIPTOR.services_by_name.values():
            for m in svc.methods:
                out += [(f"{svc.name}.{m.name}", path, fd)
                        for path, fd in limits.request_fields(m.input_type)]
    return out


def test_the_walk_sees_every_rpc() -> None:
    rpcs = {r for r, _, _ in _request_fields()}
    assert {"PerturbationService.RunAttack", "ScoringService.Compute",
            "ReportService.RenderReport", "EvaluationService.CreateEvaluation",
            "TargetProxyService.CreateSession"} <= rpcs
    assert len(_request_fields()) > 200          # the report's parts included


def test_every_request_field_has_a_documented_limit() -> None:
    problems = []
    for rpc, path, fd in _request_fields():
        lim = limits.limit_for(fd)
        where = f"{rpc}: {path} ({fd.full_name})"
        if lim is None:
            problems.append(f"{where}: no documented limit")
            continue
        echo = fd.containing_type.full_name in limits.ECHO_MESSAGES
        if lim.kind == "free":
            allowed = (fd.type in (FieldDescriptor.TYPE_ENUM, FieldDescriptor.TYPE_BOOL)
                       or (echo and fd.type in _NUMERIC))
            if not allowed or not lim.note:
                problems.append(f"{where}: 'free' is only for enums, bools and report values, "
                                "with a reason")
        elif fd.type in _NUMERIC and not echo:
            if lim.kind not in ("integer", "number") or lim.lo is None or lim.hi is None:
                problems.append(f"{where}: a number needs an inclusive [lo, hi]")
        elif fd.type in (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES):
            if lim.kind not in ("text", "bytes") or not lim.length:
                problems.append(f"{where}: a string needs a length bound")
        if fd.is_repeated and lim.kind != "free" and not lim.entries:
            problems.append(f"{where}: a repeated field needs a bound on its entries")
        if fd.message_type is not None and fd.message_type.full_name == "google.protobuf.Struct":
            if lim.kind != "struct":
                problems.append(f"{where}: a Struct is bounded as a struct")
    assert not problems, "\n".join(problems)


def test_no_stale_entries() -> None:
    pool = descriptor_pool.Default()
    stale = []
    for name in limits.FIELD_LIMITS:
        message, field = name.rsplit(".", 1)
        try:
            md = pool.FindMessageTypeByName(message)
        except KeyError:
            stale.append(name)
            continue
        if field not in md.fields_by_name:
            stale.append(name)
    for name in limits.ECHO_MESSAGES:
        try:
            pool.FindMessageTypeByName(name)
        except KeyError:
            stale.append(name)
    assert not stale, stale


def test_the_code_enforces_the_named_limits() -> None:
    """Where a module keeps its own constant, it equals the documented one."""
    from fortis.infra.serving import server
    from fortis.services.common import codec, pagination
    from fortis.services.evaluation import plan, service
    from fortis.services.perturbation.attacks.base import MAX_QUERIES
    from fortis.services.proxy import proxy
    from fortis.services.report import convert as report_convert
    from fortis.services.scoring import convert as scoring_convert
    from fortis.services.scoring import evaluation_scoring
    from fortis.services.scoring import limits as scoring_limits
    from fortis.services.scoring import servicer as scoring_servicer

    pairs = {
        "codec.MAX_PIXELS": (codec.MAX_PIXELS, limits.MAX_PIXELS),
        "pagination.MAX_TOKEN_CHARS": (pagination.MAX_TOKEN_CHARS, limits.MAX_PAGE_TOKEN_CHARS),
        "server.DEFAULT_MAX_MESSAGE_BYTES": (server.DEFAULT_MAX_MESSAGE_BYTES,
                                             limits.MAX_MESSAGE_BYTES),
        "proxy.SESSION_ID_MAX": (proxy.SESSION_ID_MAX, limits.MAX_SESSION_ID_CHARS),
        "service.EVALUATION_ID_MAX": (service.EVALUATION_ID_MAX, limits.MAX_EVALUATION_ID_CHARS),
        "evaluation_scoring.MAX_LEVEL": (evaluation_scoring.MAX_LEVEL, limits.MAX_SCORING_LEVEL),
        "scoring convert.MAX_SETTINGS": (scoring_convert.MAX_SETTINGS, limits.MAX_SETTINGS),
        "report convert.MAX_PLAN_BYTES": (report_convert.MAX_PLAN_BYTES,
                                          limits.MAX_REPORT_PLAN_BYTES),
        "plan.MAX_PLAN_BYTES": (plan.MAX_PLAN_BYTES, limits.MAX_PLAN_BYTES),
        "plan.MAX_DEPTH": (plan.MAX_DEPTH, limits.MAX_PLAN_DEPTH),
        "attacks MAX_QUERIES.maximum": (MAX_QUERIES.maximum, limits.MAX_QUERIES_PER_IMAGE),
        "scoring limits.MAX_RANK": (scoring_limits.MAX_RANK, limits.MAX_RANK),
        "scoring servicer.MAX_PAGE_SIZE": (scoring_servicer.MAX_PAGE_SIZE, limits.MAX_PAGE_SIZE),
    }
    wrong = {k: v for k, v in pairs.items() if v[0] != v[1]}
    assert not wrong, wrong


def test_every_catalogue_parameter_is_bounded() -> None:
    from fortis.services.common.params import validate_params
    from fortis.services.perturbation.attacks.registry import ATTACKS
    from fortis.services.perturbation.registry import PERTURBATIONS

    unbounded, free_strings = [], []
    for spec in (*PERTURBATIONS.values(), *ATTACKS.values()):
        for p in spec.params:
            if p.type in ("int", "float") and (p.minimum is None or p.maximum is None):
                unbounded.append(f"{spec.id}.{p.name}")
            if p.type == "string" and not p.choices:
                free_strings.append((spec, p.name))
    assert not unbounded, unbounded
    # A string without choices is still bounded in length by the one validator.
    for spec, name in free_strings:
        with pytest.raises(InvalidArgument) as ei:
            validate_params(spec, {name: "x" * (limits.MAX_TEXT_CHARS + 1)})
        assert f"params.{name}" in [v.field for v in ei.value.violations]


def test_docs_limits_md_is_generated_and_current() -> None:
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_limits_doc.py"), "--check"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    text = (ROOT / "docs" / "limits.md").read_text()
    assert "UNDOCUMENTED" not in text
    for needle in ("#### RunAttack", "`max_queries`", "`params.chain_length`",
                   "`execution.batch_size`", "## Deadlines and cancellation"):
        assert needle in text, needle
