"""The ONE place where the typed report parts become the report document (``report.json``).

:func:`build_report` takes a ``fortis.report.v1.ReportParts`` message and returns one plain,
JSON-able dict whose shape is the report's public schema (``schema_version``
``fortis.report/v1``, unchanged since the parts travelled as an untyped Struct). Integers come
out as ``int`` and rates as ``float`` because they are read from typed fields; nothing is
guessed back from doubles. Unset optional fields are ``None`` (``null``), never 0, so "not
applicable" stays distinguishable from "zero". Sentences come from
:mod:`fortis.services.report.prose`; the metrics tree from :mod:`.metrics_tree`; the plan
from :mod:`.plan_doc`, the example images from :mod:`.example_images`, the CANARY and
benchmark sections from :mod:`.canary_parts`.

``report.json`` top-level keys:

    schema_version      "fortis.report/v1"
    plan                the plan document parsed from plan_text                IEEE-P3
    plan_text           the plan exactly as submitted                          IEEE-P4 (repeat)
    target              name, model_name, task_type, endpoint (user:password and secret query
                        values redacted), output_kind, top_k, labels_count, version, input,
                        service_type_parameters
    tester              name, organization, roles {requester, tester, provider}   IEEE-P1
    environment         python, platform, fortis, torch, numpy, seed, seeds
    service_parameters  service-type parameters and the correctness rule       IEEE-P3, C1/C2
    metrics_used        the metric names and where they are defined            IEEE-P4
    metrics             the metric tree (see metrics_tree)                     IEEE-M1..M8
    tests               one entry per test: id, kind, ieee_ref, image_source, parameters,
                        severities, epsilon, norm, query_budget, steps, metrics, ...
    ledger              query totals per session, as the proxy's ledger recorded them
    evaluation          id, started, finished, started_at, ended_at, duration_s, images, ...
    repeat              command, plan_file, seeds, instructions                IEEE-P4
    examples            example images: kind, setting, level, image_id, target, original,
                        perturbed, difference (PNG data URIs), answers, note;
                        the rule's verdicts on both answers (IEEE-C1..C5), detection boxes
                        (ground truth, clean and perturbed answers), segmentation masks

Pure domain code: protobuf messages in, dicts out; no gRPC. Bad or missing parts raise
``InvalidArgument`` naming the field (``parts.metrics.ieee``), which the server maps to
INVALID_ARGUMENT.
"""

from __future__ import annotations

import datetime as _dt
import re
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from fortis.common.v1 import common_pb2
from fortis.report.v1 import report_pb2
from fortis.services.common.errors import InvalidArgument
from fortis.services.report import prose
from fortis.services.report.canary_parts import benchmark_part, canary_part, sequential_part
from fortis.services.report.example_images import example_images
from fortis.services.report.metrics_tree import metrics_tree
from fortis.services.report.outcomes_part import outcomes_part
from fortis.services.report.plan_doc import MAX_PLAN_BYTES, plan_document
from fortis.services.report.values import enum_text, message_dict, optional
from fortis.services.report.verdict import criteria_of_plan, verdict
from google.protobuf.message import Message
from google.rpc import code_pb2

__all__ = ["MAX_PLAN_BYTES", "SCHEMA_VERSION", "build_report", "plan_document"]

SCHEMA_VERSION: Final = "fortis.report/v1"

#: Query parameters of an endpoint whose values are credentials.
_SECRET_KEY: Final = re.compile(r"(password|passwd|secret|token|api[_-]?key|credential|^auth|"
                                r"^key$|signature)", re.IGNORECASE)

_TEST_KINDS: Final = {
    report_pb2.TEST_KIND_CORRUPTION: ("corruption", None),
    report_pb2.TEST_KIND_STYLE: ("corruption", None),
    report_pb2.TEST_KIND_DEGRADATION: ("degradation", None),
    report_pb2.TEST_KIND_TRANSFER_ATTACK: ("attack", "transfer"),
    report_pb2.TEST_KIND_SCORE_ATTACK: ("attack", "score"),
    report_pb2.TEST_KIND_DECISION_ATTACK: ("attack", "decision"),
}
#: The report's names of output kinds are those the target record always used.
_OUTPUT_KINDS: Final = {common_pb2.OUTPUT_KIND_TOP_K_SCORES: "top_k"}

_PLAN_FILE: Final = "plan.yaml"
_REPEAT_COMMAND: Final = f"fortis run {_PLAN_FILE}"


# --------------------------------------------------------------------------------------------
# parts
# --------------------------------------------------------------------------------------------


def _require(parent: Message, name: str, path: str) -> Any:
    """A required sub-message of ``parent``; its absence names the field."""
    if not parent.HasField(name):
        raise InvalidArgument(f"{path}.{name}", "required report part is missing")
    return getattr(parent, name)


def _text(value: str) -> str | None:
    return value or None


def _party(p: report_pb2.Party) -> dict[str, Any]:
    return {"name": _text(p.name), "organisation": _text(p.organisation)}


def redact_endpoint(endpoint: str) -> str:
    """The endpoint without ``user:password@`` and without the values of query parameters that
    carry credentials (``?api_key=...``): a report is shared, credentials are not."""
    if "://" not in endpoint:
        return endpoint
    parts = urlsplit(endpoint)
    netloc = parts.netloc
    if parts.username is not None or parts.password is not None:
        netloc = "***@" + netloc.rpartition("@")[2]
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(_SECRET_KEY.search(k) for k, _ in pairs):
            query = urlencode([(k, "***" if _SECRET_KEY.search(k) else v) for k, v in pairs],
                              safe="*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _criterion(target: report_pb2.TargetReport) -> dict[str, Any]:
    """The service-type parameters (IEEE-P3): the correctness criterion, by task type, with
    only the fields its mode uses: top1 -> mode; topk -> mode, k; threshold -> mode,
    threshold (IEEE-C1/C2); detection's k only in topk mode, q only when aggregating
    "at_least" (IEEE-C3/C4)."""
    which = target.WhichOneof("service_parameters")
    if which is None:
        return {}
    msg = getattr(target, which)
    out = message_dict(msg)
    if which in ("correctness", "detection"):
        if out.get("mode") != "topk":
            out.pop("k", None)
        if which == "correctness" and out.get("mode") != "threshold":
            out.pop("threshold", None)
    if which == "detection":
        agg = {"mode": out.pop("aggregate"), "q": out.pop("q")}
        if agg["mode"] != "at_least":
            agg.pop("q")
        out["aggregate"] = agg
        if out.get("confidence_threshold") is None:
            out.pop("confidence_threshold", None)
    return {which: out}


def _target(t: report_pb2.TargetReport) -> dict[str, Any]:
    if not t.name:
        raise InvalidArgument("parts.target.name", "the target's name is required")
    return {
        "name": t.name, "model_name": _text(t.model_name),
        "task_type": enum_text(t, "task"),
        "endpoint": redact_endpoint(t.endpoint) if t.endpoint else None,
        "output_kind": _OUTPUT_KINDS.get(t.output_kind, enum_text(t, "output_kind")),
        "top_k": t.top_k, "labels_count": t.labels_count, "version": _text(t.version),
        "input": f"{t.input_height}x{t.input_width}x{t.input_channels}",
        "service_type_parameters": _criterion(t),
    }


def _tester(roles: report_pb2.Roles) -> dict[str, Any]:
    return {"name": _text(roles.tester.name), "organization": _text(roles.tester.organisation),
            "roles": {"tester": _party(roles.tester), "requester": _party(roles.requester),
                      "provider": _party(roles.provider)}}


def _environment(env: report_pb2.Environment, plan: Mapping[str, Any]) -> dict[str, Any]:
    seeds = plan.get("seeds")
    return {"python": _text(env.python), "platform": _text(env.platform),
            "fortis": _text(env.fortis), "torch": _text(env.torch), "numpy": _text(env.numpy),
            "seed": env.seed,
            "seeds": dict(seeds) if isinstance(seeds, Mapping) else {"seed": env.seed}}


def _timestamp(parent: Message, name: str) -> tuple[_dt.datetime, float]:
    """A required Timestamp as an aware UTC datetime and as epoch seconds (nanoseconds kept:
    a datetime holds only microseconds)."""
    ts = _require(parent, name, "parts.evaluation")
    try:
        when = ts.ToDatetime(tzinfo=_dt.UTC)
    except (ValueError, OverflowError, OSError) as exc:
        raise InvalidArgument(f"parts.evaluation.{name}", f"not a valid time: {exc}") from None
    return when, ts.seconds + ts.nanos / 1e9


def _evaluation(ev: report_pb2.EvaluationInfo, m: int) -> dict[str, Any]:
    if not ev.evaluation_id:
        raise InvalidArgument("parts.evaluation.evaluation_id", "the evaluation id is required")
    (start, started), (end, finished) = _timestamp(ev, "start_time"), _timestamp(ev, "end_time")
    if finished < started:
        raise InvalidArgument("parts.evaluation.end_time", "must not be before start_time")
    ds = ev.dataset
    return {"id": ev.evaluation_id, "started": started, "finished": finished,
            "started_at": start.isoformat(timespec="seconds"),
            "ended_at": end.isoformat(timespec="seconds"),
            "duration_s": round(finished - started, 3), "images": m,
            "dataset": {"source": ds.source, "split": ds.split, "offset": ds.offset,
                        "limit": ds.limit},
            "resumed_count": ev.resumed_count}


def _failed_setting(f: report_pb2.FailedSetting) -> dict[str, Any]:
    """A setting that failed to run, as report.json lists it (IEEE-P4: every test with its
    outcome)."""
    graded = f.kind in ("corruption", "degradation")
    code = code_pb2.Code.Name(f.code) if f.code in code_pb2.Code.values() else str(f.code)
    return {"kind": f.kind, "name": f.name, "level": f.level if graded else None,
            "setting": f"{f.name}@{f.level}" if graded else f.name, "code": code,
            "message": f.message, "images_done": f.images_done,
            "images_planned": f.images_planned}


def _ledger(ledger: report_pb2.LedgerSummary) -> dict[str, Any]:
    return {"sessions": dict(ledger.sessions), "total_queries": ledger.total_queries,
            "aborted_attempt_sessions": dict(ledger.aborted_attempt_sessions),
            "aborted_attempt_queries": ledger.aborted_attempt_queries, "note": prose.LEDGER_NOTE}


def _named_value(v: Any) -> Any:
    which = v.WhichOneof("value")
    if which == "numbers":
        return list(v.numbers.values)
    return getattr(v, which) if which else None


def _level_parameters(t: report_pb2.TestDefinition) -> dict[str, dict[str, Any]]:
    return {str(row.level): {v.name: _named_value(v) for v in row.values}
            for row in t.level_parameters}


def _test(t: report_pb2.TestDefinition, n: int, ev: report_pb2.EvaluationInfo,
          m: int) -> dict[str, Any]:
    path = f"parts.tests[{n}]"
    if not t.name:
        raise InvalidArgument(f"{path}.name", "each test needs a non-empty name")
    if t.kind not in _TEST_KINDS:
        raise InvalidArgument(f"{path}.kind", f"must be a known TestKind; got {t.kind}")
    kind, attack_kind = _TEST_KINDS[t.kind]
    params = {v.name: _named_value(v) for v in t.params}
    entry: dict[str, Any] = {
        "id": t.name, "kind": kind, "family": _text(t.family),
        "ieee_ref": ", ".join(t.refs) or prose.DEFAULT_REF[kind],
        "image_source": prose.image_source(source=ev.dataset.source, split=ev.dataset.split,
                                           offset=ev.dataset.offset, m=m, covered=t.images),
        "severities": list(t.levels) if kind == "corruption" else None,
        "epsilon": optional(t, "epsilon"), "norm": _text(t.norm),
        "query_budget": optional(t, "query_budget"),
        "steps": prose.test_steps(kind, t.name, attack_kind=attack_kind,
                                  surrogate=_text(t.surrogate)),
        "metrics": prose.test_metrics(kind, attack_kind=attack_kind),
    }
    if t.HasField("characterisation"):
        entry["characterisation"] = message_dict(t.characterisation)
    if kind == "attack":
        entry.update({"attack": _text(t.perturbation_id), "attack_kind": attack_kind,
                      "parameters": params, "surrogate": _text(t.surrogate),
                      "images_attacked": t.images, "criterion": _text(t.criterion) or None,
                      "signal": _text(t.signal) or None,
                      "signal_note": prose.signal_note(_text(t.signal), attack_kind)})
        return entry
    entry["parameters"] = _level_parameters(t)
    if kind == "corruption":
        entry["params"] = params
        entry["perturbation_kind"] = "style" if t.kind == report_pb2.TEST_KIND_STYLE else "corruption"
    else:
        entry["levels"] = list(t.levels)
        if t.surrogate:
            entry["surrogate"] = t.surrogate
    return entry


def _service_parameters(plan: Mapping[str, Any], typed: Mapping[str, Any]) -> dict[str, Any]:
    """The plan's own service-type parameters as written (IEEE-P3); what it leaves out is
    filled from the resolved criterion the evaluation service used."""
    given = plan.get("service_parameters") or plan.get("service_type_parameters") or {}
    out = dict(given) if isinstance(given, Mapping) else {}
    for key in ("correctness", "detection", "segmentation"):
        if key not in out and isinstance(plan.get(key), Mapping):
            out[key] = plan[key]
    for key, value in typed.items():
        out.setdefault(key, value)
    return out


def _canary(parts: report_pb2.ReportParts, report: dict[str, Any]) -> None:
    """``report["canary"]``: the CANARY metrics per attack when the plan asked for them
    (:func:`.canary_parts.canary_part`); and the metrics_used entries of the
    success-vs-queries curves (IEEE-M6), the PER-4 fooling rate and CANARY, when present."""
    canary = canary_part(parts)
    if canary is not None:
        report["canary"] = canary
    attacks = report["metrics"]["attacks"].values()
    report["metrics_used"] += prose.attack_metrics_used(
        success_curve=any(a.get("success_by_queries") for a in attacks),
        fooling_rate=any(a.get("fooling_rate") is not None for a in attacks),
        canary="canary" in report)


def _sequential_tests(tests: list[dict[str, Any]], sequential: Mapping[str, Any]) -> None:
    """Each test's ``sequential`` entry: how many of its planned images it was sent (the
    first ones of the seeded sequential order) per setting, or that it was skipped."""
    rows = {str(r.get("setting")): r for r in sequential.get("settings") or ()
            if isinstance(r, Mapping)}
    for t in tests:
        name = str(t.get("id") or "")
        if t.get("kind") == "attack":
            mine = {name: rows[name]} if name in rows else {}
        else:
            mine = {k: r for k, r in rows.items() if k.rsplit("@", 1)[0] == name}
        if not mine:
            continue
        statuses = {str(r.get("status")) for r in mine.values()}
        t["sequential"] = {
            "status": "skipped: no acceptance criterion reads it" if statuses == {"skip"}
            else "stopped once its criteria were decided" if any(
                r.get("stopped_early") for r in mine.values())
            else "every planned image",
            "images_used": {k: r.get("images_used") for k, r in mine.items()},
            "images_planned": {k: r.get("images_planned") for k, r in mine.items()}}


_ESTIMATE_KINDS = {report_pb2.ESTIMATE_KIND_FIXED: "fixed",
                   report_pb2.ESTIMATE_KIND_UPPER_BOUND: "upper_bound"}


def _estimate(e: report_pb2.EstimateReport) -> dict[str, Any]:
    """``report["estimate"]``: the estimate made before the run and the ledger's counts."""
    return {"fixed": e.fixed, "upper_bound": e.upper_bound,
            "expected": e.expected if e.HasField("expected") else None,
            "per_setting": [{"stage": r.stage, "setting": r.setting,
                             "kind": _ESTIMATE_KINDS.get(r.kind, "unspecified"),
                             "estimated": r.estimated, "actual": r.actual}
                            for r in e.per_setting],
            "total_actual": e.total_actual}


def build_report(parts: report_pb2.ReportParts) -> dict[str, Any]:
    """The IEEE 3129 4.6 report document (IEEE-P1, P3, P4; metrics IEEE-M1..M8) of ``parts``.

    Raises ``InvalidArgument`` naming the first missing or invalid part."""
    plan = plan_document(parts.plan_text)
    for name in ("target", "roles", "environment", "metrics", "ledger", "evaluation"):
        _require(parts, name, "parts")
    metrics = metrics_tree(parts.metrics)
    m = parts.evaluation.images or parts.metrics.ieee.m
    target = _target(parts.target)
    env = _environment(parts.environment, plan)
    attacks = metrics["attacks"].values()
    used = [dict(u) for u in prose.METRICS_USED] + prose.extra_metrics_used(
        ranking=bool(metrics["ranking"].get("applicable")),
        degradation=bool(metrics.get("degradation")),
        perturbation_size=any(a.get("median_l2_successful") is not None for a in attacks))
    report: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "plan": plan,
        "plan_text": parts.plan_text,
        "target": target,
        "tester": _tester(parts.roles),
        "environment": env,
        "service_parameters": _service_parameters(plan, target["service_type_parameters"]),
        "metrics_used": used,
        "metrics": metrics,
        "tests": [_test(t, n, parts.evaluation, m) for n, t in enumerate(parts.tests)],
        "ledger": _ledger(parts.ledger),
        "evaluation": _evaluation(parts.evaluation, m),
        "repeat": {"command": _REPEAT_COMMAND, "plan_file": _PLAN_FILE, "seeds": env["seeds"],
                   "seeds_in_plan": True,
                   "instructions": prose.repeat_instructions(_PLAN_FILE, _REPEAT_COMMAND)},
    }
    report["examples"] = example_images(parts.examples,      # example images
                                        enum_text(parts.target, "task"))
    report["failed_settings"] = [_failed_setting(f) for f in parts.failed_settings]
    benchmark = benchmark_part(parts)
    if benchmark is not None:     # multi-target plans (CAN-5/7/8/10)
        report["benchmark"] = benchmark
    if parts.HasField("estimate"):      # the query estimate beside the ledger's counts
        report["estimate"] = _estimate(parts.estimate)
    _canary(parts, report)      # CAN-1..4 when the plan asked; PER-4 / curves metrics_used
    sequential = sequential_part(parts)
    if sequential is not None:      # sequential acceptance: intervals at the stopping times
        report["sequential"] = sequential
        _sequential_tests(report["tests"], sequential)
    outcomes = outcomes_part(parts)
    if outcomes is not None:    # per-image outcomes: paired comparisons (fortis compare)
        report["outcomes"] = outcomes
    # the plan's acceptance criteria judged on the metrics (services/report/verdict)
    report["verdict"] = verdict(criteria_of_plan(plan, path="parts.plan_text.acceptance"),
                                metrics, report["failed_settings"], sequential=sequential)
    return report
