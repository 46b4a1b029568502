"""The ONE place where the typed report parts become the report document (``report.json``).

:func:`build_report` takes a ``fortis.report.v1.ReportParts`` message and returns one plain,
JSON-able dict whose shape is the report's public schema (``schema_version``
``fortis.report/v1``, unchanged since the parts travelled as an untyped Struct). Integers come
out as ``int`` and rates as ``float`` because they are read from typed fields; nothing is
guessed back from doubles. Unset optional fields are ``None`` (``null``), never 0, so "not
applicable" stays distinguishable from "zero". Sentences come from
:mod:`fortis.services.report.prose`; the metrics tree from :mod:`.metrics_tree`.

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

import base64
import datetime as _dt
import io
import math
import re
import struct
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, Final
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import numpy as np
import yaml
from fortis.common.v1 import common_pb2
from fortis.report.v1 import report_pb2
from fortis.services.common.errors import InvalidArgument
from fortis.services.common.limits import (
    MAX_EXAMPLE_BOXES,
    MAX_EXAMPLE_MASK_CLASSES,
    MAX_EXAMPLE_PNG_BYTES,
    MAX_EXAMPLE_SIDE,
    MAX_REPORT_EXAMPLES,
)
from fortis.services.report import prose
from fortis.services.report.metrics_tree import metrics_tree
from fortis.services.report.values import enum_text, message_dict, optional
from fortis.services.report.verdict import criteria_of_plan, verdict
from google.protobuf.message import Message
from google.protobuf.struct_pb2 import Struct
from google.rpc import code_pb2
from PIL import Image

__all__ = ["MAX_PLAN_BYTES", "SCHEMA_VERSION", "build_report", "plan_document"]

SCHEMA_VERSION: Final = "fortis.report/v1"

#: The plan text is bounded: the evaluation service validated it already, and a report is no
#: place for a document larger than any real plan.
MAX_PLAN_BYTES: Final = 1 << 20
#: A YAML plan with anchors can name the same subtree many times; copying it into the report
#: expands every reference, so the number of values copied is bounded too.
_MAX_PLAN_VALUES: Final = 200_000

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
# plan
# --------------------------------------------------------------------------------------------


def _plain(value: Any, budget: list[int]) -> Any:
    """A JSON-able copy of a YAML value (str keys, lists, ISO dates, NaN -> None), counting
    every value against ``budget`` so an alias-expanded plan cannot blow up the report."""
    budget[0] -= 1
    if budget[0] < 0:
        raise InvalidArgument("parts.plan_text",
                              f"the plan expands to more than {_MAX_PLAN_VALUES} values")
    if value is None or isinstance(value, bool | str | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _plain(v, budget) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v, budget) for v in value]
    if isinstance(value, _dt.datetime | _dt.date):
        return value.isoformat()
    return str(value)


def plan_document(plan_text: str) -> dict[str, Any]:
    """The plan as a JSON-able mapping, parsed with ``yaml.safe_load`` (JSON plans are YAML
    too). Bounded in bytes and in values; anything but a mapping is refused."""
    if not plan_text.strip():
        raise InvalidArgument("parts.plan_text", "the plan's text is required")
    size = len(plan_text.encode("utf-8"))
    if size > MAX_PLAN_BYTES:
        raise InvalidArgument("parts.plan_text",
                              f"the plan is {size} bytes; at most {MAX_PLAN_BYTES} are accepted")
    try:
        doc = yaml.safe_load(plan_text)
    except (yaml.YAMLError, RecursionError) as exc:
        raise InvalidArgument("parts.plan_text", f"not a YAML or JSON document: {exc}") from None
    if not isinstance(doc, Mapping):
        raise InvalidArgument("parts.plan_text",
                              f"the plan must be a mapping; got {type(doc).__name__}")
    try:
        return dict(_plain(doc, [_MAX_PLAN_VALUES]))
    except RecursionError:
        raise InvalidArgument("parts.plan_text", "the plan is nested too deeply") from None


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


# --------------------------------------------------------------------------------------------
# example images
# --------------------------------------------------------------------------------------------

#: Example images are caller bytes put into a page (RenderReport is a public RPC): at most
#: this many, each PNG at most this many bytes and pixels on a side, read from the header
#: before anything is decoded.
MAX_EXAMPLES: Final = MAX_REPORT_EXAMPLES      # services/common/limits.py
_PNG_SIGNATURE: Final = b"\x89PNG\r\n\x1a\n"
_EXAMPLE_KINDS: Final = {report_pb2.EXAMPLE_KIND_CORRUPTION: "corruption",
                         report_pb2.EXAMPLE_KIND_ATTACK: "attack",
                         report_pb2.EXAMPLE_KIND_DEGRADATION: "degradation"}
_EXAMPLE_TEXT: Final = 4096
_GREY_MODES: Final = frozenset({"1", "L", "LA", "La", "I", "I;16", "I;16B", "I;16L", "F"})


def _decode_png(data: bytes, field: str) -> np.ndarray:
    """A caller's PNG as uint8 H x W (grey) or H x W x 3 (RGB), checked in this order: its
    size in bytes, the PNG signature, the IHDR header's width and height (before any
    decoding: no decompression bomb), then a full decode (Pillow, PNG only, its
    decompression-bomb guard as an error). Anything else names ``field``."""
    if not data:
        raise InvalidArgument(field, "a PNG image is required")
    if len(data) > MAX_EXAMPLE_PNG_BYTES:
        raise InvalidArgument(field, f"{len(data)} bytes; at most {MAX_EXAMPLE_PNG_BYTES} "
                                     "are accepted")
    if len(data) < 33 or data[:8] != _PNG_SIGNATURE or data[12:16] != b"IHDR":
        raise InvalidArgument(field, "not a PNG image (no PNG signature and IHDR header)")
    width, height = struct.unpack(">II", data[16:24])
    if not (0 < width <= MAX_EXAMPLE_SIDE and 0 < height <= MAX_EXAMPLE_SIDE):
        raise InvalidArgument(field, f"the header declares {width}x{height} pixels; at most "
                                     f"{MAX_EXAMPLE_SIDE}x{MAX_EXAMPLE_SIDE} are accepted")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data), formats=["PNG"]) as im:
                if im.size != (width, height):
                    raise ValueError(f"decoded size {im.size} is not the header's")
                im.load()
                arr = np.asarray(im.convert("L" if im.mode in _GREY_MODES else "RGB"))
    except Exception as exc:     # hostile bytes: any decoder failure is the caller's
        raise InvalidArgument(field, f"not a valid PNG image: {type(exc).__name__}: "
                                     f"{str(exc)[:200]}") from None
    return np.ascontiguousarray(arr, dtype=np.uint8)


def _png_uri(image: np.ndarray) -> str:
    """A ``data:image/png;base64,...`` URI of an image this module decoded (re-encoded, so
    nothing but a valid PNG reaches the page)."""
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="PNG", compress_level=6)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _difference(original: np.ndarray, perturbed: np.ndarray) -> np.ndarray:
    """|perturbed - original| per pixel and channel, amplified so the largest difference is
    255 (all black when the two are the same); RGB when either image is."""
    o, p = original.astype(np.int16), perturbed.astype(np.int16)
    if o.ndim != p.ndim:
        o = o if o.ndim == 3 else np.repeat(o[:, :, None], 3, axis=2)
        p = p if p.ndim == 3 else np.repeat(p[:, :, None], 3, axis=2)
    d = np.abs(p - o)
    top = int(d.max()) if d.size else 0
    if top == 0:
        return np.zeros(d.shape, dtype=np.uint8)
    return np.rint(d.astype(np.float64) * (255.0 / top)).astype(np.uint8)


def _example_text(value: str, field: str) -> str | None:
    if len(value) > _EXAMPLE_TEXT:
        raise InvalidArgument(field, f"{len(value)} characters; at most {_EXAMPLE_TEXT}")
    return value or None


_VERDICTS: Final = {report_pb2.EXAMPLE_VERDICT_UNSPECIFIED: None,
                    report_pb2.EXAMPLE_VERDICT_CORRECT: "correct",
                    report_pb2.EXAMPLE_VERDICT_INCORRECT: "incorrect"}


def _example_boxes(boxes: Sequence[report_pb2.ExampleBox], field: str) -> list[dict[str, Any]]:
    """Boxes to draw: at most :data:`MAX_EXAMPLE_BOXES`, finite, x_max >= x_min and y_max >=
    y_min; ``{box: [x_min, y_min, x_max, y_max], label, score (None: not given)}``."""
    if len(boxes) > MAX_EXAMPLE_BOXES:
        raise InvalidArgument(field, f"{len(boxes)} boxes; at most {MAX_EXAMPLE_BOXES} are "
                                     "accepted")
    out = []
    for n, b in enumerate(boxes):
        xyxy = [float(b.x_min), float(b.y_min), float(b.x_max), float(b.y_max)]
        if not all(math.isfinite(v) for v in xyxy) or xyxy[2] < xyxy[0] or xyxy[3] < xyxy[1]:
            raise InvalidArgument(f"{field}[{n}]", f"a box needs finite x_min <= x_max and "
                                                   f"y_min <= y_max, got {xyxy}")
        score = float(b.score) if b.HasField("score") else None
        if score is not None and not math.isfinite(score):
            raise InvalidArgument(f"{field}[{n}].score", "must be finite")
        out.append({"box": xyxy, "label": _example_text(b.label, f"{field}[{n}].label") or "",
                    "score": score})
    return out


def _example_mask(data: bytes, field: str, shape: tuple[int, ...], classes: int) -> str | None:
    """A class-slot mask (0: no class of interest, k: the k-th): an 8-bit grey PNG the
    images' size with no value above ``classes``, re-encoded; None when not given."""
    if not data:
        return None
    mask = _decode_png(data, field)
    if mask.ndim != 2:
        raise InvalidArgument(field, "an 8-bit grey PNG (one value per pixel) is needed")
    if mask.shape != tuple(shape[:2]):
        raise InvalidArgument(field, f"{mask.shape[1]}x{mask.shape[0]} pixels; the images are "
                                     f"{shape[1]}x{shape[0]}")
    top = int(mask.max()) if mask.size else 0
    if top > classes:
        raise InvalidArgument(field, f"value {top} but {classes} mask_classes")
    return _png_uri(mask)


def _example_marks(e: report_pb2.ExampleImage, path: str, shape: tuple[int, ...],
                   task: str | None) -> dict[str, Any]:
    """How the rule judged an example's answers (both keys when either is judged) and what
    the page draws on it: boxes in a detection report, masks in a segmentation report
    (masks and boxes another task's example carries are refused: nothing draws them)."""
    if len(e.mask_classes) > MAX_EXAMPLE_MASK_CLASSES:
        raise InvalidArgument(f"{path}.mask_classes", f"{len(e.mask_classes)} classes; at "
                                                      f"most {MAX_EXAMPLE_MASK_CLASSES} are "
                                                      "accepted")
    classes = [_example_text(c, f"{path}.mask_classes[{n}]") or ""
               for n, c in enumerate(e.mask_classes)]
    out: dict[str, Any] = {}
    verdicts = (_VERDICTS.get(e.original_verdict), _VERDICTS.get(e.perturbed_verdict))
    if any(verdicts):
        out["original_verdict"], out["perturbed_verdict"] = verdicts
    for side in ("truth", "original", "perturbed"):
        boxes = _example_boxes(getattr(e, f"{side}_boxes"), f"{path}.{side}_boxes")
        if boxes and task != "detection":
            raise InvalidArgument(f"{path}.{side}_boxes", f"boxes are drawn in detection "
                                                          f"reports; this target's task is {task}")
        if task == "detection":
            out[f"{side}_boxes"] = boxes
    for side in ("truth", "original", "perturbed"):
        mask = _example_mask(getattr(e, f"{side}_mask_png"), f"{path}.{side}_mask_png", shape,
                             len(classes))
        if mask is not None and task != "segmentation":
            raise InvalidArgument(f"{path}.{side}_mask_png", f"masks are drawn in segmentation "
                                                             f"reports; this target's task is "
                                                             f"{task}")
        if task == "segmentation":
            out[f"{side}_mask"] = mask
    if task == "segmentation":
        out["mask_classes"] = classes
    return out


def _examples(examples: Sequence[report_pb2.ExampleImage],
              task: str | None = None) -> list[dict[str, Any]]:
    """The report's example images: corruptions per severity (IEEE-A1..A6), attack original /
    adversarial / amplified difference (IEEE-A7, A8), DEG-4 failure points. Each:
    ``{kind, setting, level (None for attacks), image_id, target, original, perturbed,
    difference (data URIs of PNGs), original_answer, perturbed_answer, note}``; when the
    rule's verdicts are given, ``original_verdict`` and ``perturbed_verdict`` ("correct" /
    "incorrect" by the plan's rule, None: not judged); in a detection report (``task``)
    ``truth_boxes``, ``original_boxes``, ``perturbed_boxes`` ([{box: pixel xyxy, label,
    score}]); in a segmentation report ``truth_mask``, ``original_mask``, ``perturbed_mask``
    (data URIs of 8-bit PNGs, 0: no class of interest, k: ``mask_classes[k - 1]``; None: not
    given) and ``mask_classes``. The bytes are a caller's: bounded, decoded and re-encoded
    (``_decode_png``); a bad one raises InvalidArgument naming it
    (``parts.examples[3].perturbed_png``)."""
    if len(examples) > MAX_EXAMPLES:
        raise InvalidArgument("parts.examples", f"{len(examples)} examples; at most "
                                                f"{MAX_EXAMPLES} are accepted")
    out = []
    for n, e in enumerate(examples):
        path = f"parts.examples[{n}]"
        kind = _EXAMPLE_KINDS.get(e.kind)
        if kind is None:
            raise InvalidArgument(f"{path}.kind", f"must be a known ExampleKind; got {e.kind}")
        if not e.setting:
            raise InvalidArgument(f"{path}.setting", "the example's setting is required")
        original = _decode_png(e.original_png, f"{path}.original_png")
        perturbed = _decode_png(e.perturbed_png, f"{path}.perturbed_png")
        if original.shape[:2] != perturbed.shape[:2]:
            raise InvalidArgument(f"{path}.perturbed_png",
                                  f"{perturbed.shape[1]}x{perturbed.shape[0]} pixels; the "
                                  f"original is {original.shape[1]}x{original.shape[0]} "
                                  "(the two must be the same size)")
        out.append({
            "kind": kind, "setting": _example_text(e.setting, f"{path}.setting"),
            "level": None if kind == "attack" else int(e.level),
            "image_id": _example_text(e.image_id, f"{path}.image_id"),
            "target": _example_text(e.target, f"{path}.target"),
            "original": _png_uri(original), "perturbed": _png_uri(perturbed),
            "difference": _png_uri(_difference(original, perturbed)),
            "original_answer": _example_text(e.original_answer, f"{path}.original_answer"),
            "perturbed_answer": _example_text(e.perturbed_answer, f"{path}.perturbed_answer"),
            "note": _example_text(e.note, f"{path}.note"),
            **_example_marks(e, path, original.shape, task),
        })
    return out


#: An open (Struct) part of the report is bounded: values copied and nesting depth.
_MAX_OPEN_VALUES: Final = 500_000
_MAX_OPEN_DEPTH: Final = 32


def open_part(msg: Struct, path: str) -> dict[str, Any]:
    """A ``google.protobuf.Struct`` part (Compute results: open by design) as plain data,
    bounded in values and depth (a caller of RenderReport is not trusted); non-finite
    numbers become None. InvalidArgument naming ``path`` beyond the bounds."""
    budget = [_MAX_OPEN_VALUES]

    def value(v: Any, depth: int) -> Any:
        budget[0] -= 1
        if budget[0] < 0:
            raise InvalidArgument(path, f"more than {_MAX_OPEN_VALUES} values")
        if depth > _MAX_OPEN_DEPTH:
            raise InvalidArgument(path, f"nested deeper than {_MAX_OPEN_DEPTH}")
        kind = v.WhichOneof("kind")
        if kind == "struct_value":
            return {k: value(x, depth + 1) for k, x in v.struct_value.fields.items()}
        if kind == "list_value":
            return [value(x, depth + 1) for x in v.list_value.values]
        if kind == "number_value":
            n = v.number_value
            return (int(n) if n.is_integer() and abs(n) < 2 ** 53 else n) \
                if math.isfinite(n) else None
        if kind == "string_value":
            return v.string_value
        if kind == "bool_value":
            return v.bool_value
        return None

    return {k: value(x, 1) for k, x in msg.fields.items()}


def _canary(parts: report_pb2.ReportParts, report: dict[str, Any]) -> None:
    """``report["canary"]``: the CANARY metrics per attack when the plan asked for them
    (CAN-1..4: ``{"model", "attacks": {NAME: {"effect", "cost", "perturbation"}}, "notes"}``,
    as the scoring service's Compute returned them); and the metrics_used entries of the
    success-vs-queries curves (IEEE-M6), the PER-4 fooling rate and CANARY, when present."""
    if parts.HasField("canary"):
        report["canary"] = open_part(parts.canary, "parts.canary")
    attacks = report["metrics"]["attacks"].values()
    report["metrics_used"] += prose.attack_metrics_used(
        success_curve=any(a.get("success_by_queries") for a in attacks),
        fooling_rate=any(a.get("fooling_rate") is not None for a in attacks),
        canary="canary" in report)


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
    report["examples"] = _examples(parts.examples,      # example images
                                   enum_text(parts.target, "task"))
    report["failed_settings"] = [_failed_setting(f) for f in parts.failed_settings]
    if parts.HasField("benchmark"):     # multi-target plans (CAN-5/7/8/10)
        report["benchmark"] = open_part(parts.benchmark, "parts.benchmark")
    _canary(parts, report)      # CAN-1..4 when the plan asked; PER-4 / curves metrics_used
    # the plan's acceptance criteria judged on the metrics (services/report/verdict)
    report["verdict"] = verdict(criteria_of_plan(plan, path="parts.plan_text.acceptance"),
                                metrics, report["failed_settings"])
    return report
