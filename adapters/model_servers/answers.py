"""Reading one image's JSON answer from a model server into a Fortis ``Prediction``: the pure,
server-free half of the adapter.

Accepted answers (one image each):

* classification -- ``{"tabby": 0.41, "tiger_cat": 0.22, ...}`` (TorchServe's
  image_classifier), the same wrapped in a one-element list, ``[{"label": "tabby", "score":
  0.41}, ...]``, or a list of numbers, one score per class of the label set, in its order.
* detection -- a list of ``{"person": [x1, y1, x2, y2], "score": 0.98}`` (TorchServe's
  object_detector: the one key other than ``score`` is the label) or of ``{"label": "person",
  "box": [x1, y1, x2, y2], "score": 0.98}``; a one-element list holding that list, or
  ``{"detections": [...]}``, also do.

An answer is a hostile input until checked: its nesting depth, item count and every number
are bounded (NaN, infinities, booleans for numbers, scores outside [0, 1], boxes outside the
image or inverted), and every failure is a ``BadAnswer`` naming the field of the answer
(``[2].score``, ``detections[0].box[3]``) so the operator sees what the server got wrong.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from fortis.common.v1 import common_pb2
from fortis.core.task import Task

#: Deepest nesting a valid answer needs is 4 (list > object > list > number); refuse far more.
MAX_DEPTH = 16
#: Classes or boxes in one image's answer.
MAX_ITEMS = 100_000
#: Box edges may stick out of the image this far (pixels) and are then clipped (rounding).
BOX_TOLERANCE_PX = 1.0
#: Score in [0, 1] up to rounding.
SCORE_EPS = 1e-6


class BadAnswer(ValueError):
    """An answer that does not fit: ``field`` names where, ``problem`` says what."""

    def __init__(self, field_name: str, problem: str) -> None:
        super().__init__(f"field '{field_name or '(answer)'}': {problem}")
        self.field = field_name or "(answer)"
        self.problem = problem


@dataclass(frozen=True, kw_only=True)
class AnswerSpec:
    """How to read answers: the task, the label set, the output kind and the box format."""

    task: Task
    labels: tuple[str, ...] = ()
    output: str = "top_k"  # top_k | full_scores | label_only
    top_k: int = 5
    min_score: float = 0.0
    box_format: str = "xyxy"  # xyxy | xywh (pixels)
    labels_from: str = ""  # for messages: where the label set came from
    _index: dict[str, int] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._index.update({name: i for i, name in enumerate(self.labels)})

    def label_id(self, name: Any, where: str) -> tuple[int, str]:
        """(label id, name) of a label as the server wrote it: a name of the label set, or,
        without a label set, a class index written as digits."""
        if not isinstance(name, str) or not name:
            raise BadAnswer(where, f"label must be a non-empty string, got {_short(name)}")
        idx = self._index.get(name)
        if idx is not None:
            return idx, name
        if name.isdigit() and len(name) <= 9:
            i = int(name)
            if self.labels and i < len(self.labels):
                return i, self.labels[i]
            if not self.labels:
                return i, name
        if not self.labels:
            raise BadAnswer(
                where,
                f"label {_short(name)} is a class name, but the target has "
                "no label set to number it: give labels=FILE",
            )
        raise BadAnswer(
            where,
            f"label {_short(name)} is not in the target's label set "
            f"({self.labels_from or 'labels'}, {len(self.labels)} classes)",
        )


def _short(value: Any) -> str:
    text = repr(value) if not isinstance(value, dict | list) else json.dumps(value)[:60]
    return text if len(text) <= 60 else text[:57] + "..."


def parse_json(body: bytes) -> Any:
    """The JSON document of an answer; ``BadAnswer`` when it is not JSON or nests too deep.
    NaN and infinities are read (Python's json accepts them) and refused where they stand."""
    try:
        doc = json.loads(body)
    except RecursionError:
        raise BadAnswer("", f"nested deeper than {MAX_DEPTH} levels") from None
    except (ValueError, UnicodeDecodeError) as exc:
        start = body[:40].decode("utf-8", "replace")
        raise BadAnswer("", f"not valid JSON ({type(exc).__name__}); it starts {start!r}") from None
    _check_depth(doc)
    return doc


def _check_depth(doc: Any) -> None:
    """Iteratively, so a deep answer cannot exhaust the stack here either."""
    stack: list[tuple[Any, int]] = [(doc, 1)]
    seen = 0
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise BadAnswer("", f"nested deeper than {MAX_DEPTH} levels")
        if isinstance(node, dict):
            children: Sequence[Any] = list(node.values())
        elif isinstance(node, list):
            children = node
        else:
            continue
        seen += len(children)
        if seen > 4 * MAX_ITEMS:
            raise BadAnswer("", f"more than {4 * MAX_ITEMS} values")
        stack.extend((c, depth + 1) for c in children)


def number(value: Any, where: str) -> float:
    """A finite JSON number (not a boolean, not a string)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadAnswer(where, f"must be a number, got {_short(value)}")
    f = float(value)
    if not math.isfinite(f):
        raise BadAnswer(where, f"must be a finite number, got {value!r}")
    return f


def score(value: Any, where: str) -> float:
    s = number(value, where)
    if s < -SCORE_EPS or s > 1.0 + SCORE_EPS:
        raise BadAnswer(where, f"score {s:g} is outside [0, 1]")
    return min(max(s, 0.0), 1.0)


def prediction(spec: AnswerSpec, doc: Any, width: int, height: int) -> common_pb2.Prediction:
    """The Prediction for one image (``width`` x ``height``) from its answer ``doc``."""
    if spec.task == Task.DETECTION:
        return common_pb2.Prediction(
            detection=common_pb2.Detection(boxes=_boxes(spec, doc, width, height))
        )
    return common_pb2.Prediction(
        classification=common_pb2.Classification(classes=_classes(spec, doc))
    )


# -- classification ---------------------------------------------------------------------------
def _scored_labels(spec: AnswerSpec, doc: Any) -> list[tuple[int, str, float]]:
    prefix = ""
    if (
        isinstance(doc, list)
        and len(doc) == 1
        and isinstance(doc[0], dict | list)
        and not (isinstance(doc[0], dict) and "label" in doc[0])
    ):
        doc, prefix = doc[0], "[0]"
    if isinstance(doc, dict):
        if len(doc) > MAX_ITEMS:
            raise BadAnswer(prefix, f"{len(doc)} classes; at most {MAX_ITEMS}")
        out = []
        for name, value in doc.items():
            where = f"{prefix}.{name}" if prefix else str(name)
            idx, label = spec.label_id(name, where)
            out.append((idx, label, score(value, where)))
        return out
    if not isinstance(doc, list):
        raise BadAnswer(
            prefix,
            "a classification answer must be an object of label -> score "
            f"or a list, got {type(doc).__name__}",
        )
    if len(doc) > MAX_ITEMS:
        raise BadAnswer(prefix, f"{len(doc)} items; at most {MAX_ITEMS}")
    if doc and all(not isinstance(v, dict | list) for v in doc):
        # one score per class, in the label set's order
        if spec.labels and len(doc) != len(spec.labels):
            raise BadAnswer(prefix, f"{len(doc)} scores for {len(spec.labels)} classes")
        return [
            (i, spec.labels[i] if spec.labels else str(i), score(v, f"{prefix}[{i}]"))
            for i, v in enumerate(doc)
        ]
    out = []
    for i, item in enumerate(doc):
        where = f"{prefix}[{i}]"
        if not isinstance(item, dict):
            raise BadAnswer(where, f"must be an object with label and score, got {_short(item)}")
        if "label" not in item:
            raise BadAnswer(f"{where}.label", "missing")
        if "score" not in item:
            raise BadAnswer(f"{where}.score", "missing")
        idx, label = spec.label_id(item["label"], f"{where}.label")
        out.append((idx, label, score(item["score"], f"{where}.score")))
    return out


def _classes(spec: AnswerSpec, doc: Any) -> list[common_pb2.ClassScore]:
    best: dict[int, tuple[str, float]] = {}
    for idx, label, s in _scored_labels(spec, doc):
        if s < spec.min_score:
            continue
        if idx not in best or s > best[idx][1]:
            best[idx] = (label, s)
    if spec.output == "full_scores":
        for i, name in enumerate(spec.labels):
            best.setdefault(i, (name, 0.0))
    ranked = sorted(best.items(), key=lambda kv: (-kv[1][1], kv[0]))
    if spec.output == "label_only":
        return [common_pb2.ClassScore(label=i, name=n) for i, (n, _) in ranked[:1]]
    if spec.output == "top_k":
        ranked = ranked[: spec.top_k]
    return [common_pb2.ClassScore(label=i, name=n, score=s) for i, (n, s) in ranked]


# -- detection --------------------------------------------------------------------------------
def _detections(doc: Any) -> tuple[list[Any], str]:
    if isinstance(doc, dict):
        if set(doc) != {"detections"}:
            raise BadAnswer(
                "",
                "a detection answer must be a list of objects (or "
                '{"detections": [...]}), got an object with keys ' + _short(sorted(doc)[:8]),
            )
        doc, prefix = doc["detections"], "detections"
    else:
        prefix = ""
    if isinstance(doc, list) and len(doc) == 1 and isinstance(doc[0], list):
        doc, prefix = doc[0], prefix + "[0]"
    if not isinstance(doc, list):
        raise BadAnswer(prefix, f"a detection answer must be a list, got {type(doc).__name__}")
    if len(doc) > MAX_ITEMS:
        raise BadAnswer(prefix, f"{len(doc)} detections; at most {MAX_ITEMS}")
    return doc, prefix


def _boxes(spec: AnswerSpec, doc: Any, width: int, height: int) -> list[common_pb2.BoundingBox]:
    items, prefix = _detections(doc)
    out = []
    for i, item in enumerate(items):
        where = f"{prefix}[{i}]"
        if not isinstance(item, dict):
            raise BadAnswer(where, f"must be an object, got {_short(item)}")
        if "score" not in item:
            raise BadAnswer(f"{where}.score", "missing")
        s = score(item["score"], f"{where}.score")
        if "label" in item or "box" in item:
            for key in ("label", "box"):
                if key not in item:
                    raise BadAnswer(f"{where}.{key}", "missing")
            raw_label, raw_box, box_where = item["label"], item["box"], f"{where}.box"
            label_where = f"{where}.label"
        else:
            keys = [k for k in item if k != "score"]
            if len(keys) != 1:
                raise BadAnswer(
                    where,
                    "must hold one label -> box entry besides score, got "
                    f"keys {_short(sorted(item)[:8])}",
                )
            raw_label, raw_box = keys[0], item[keys[0]]
            label_where = box_where = f"{where}.{keys[0]}"
        idx, label = spec.label_id(raw_label, label_where)
        if s < spec.min_score:
            continue
        x0, y0, x1, y1 = _box(spec.box_format, raw_box, box_where, width, height)
        out.append(
            common_pb2.BoundingBox(
                x_min=x0, y_min=y0, x_max=x1, y_max=y1, label=idx, name=label, score=s
            )
        )
    return out


def _box(
    fmt: str, raw: Any, where: str, width: int, height: int
) -> tuple[float, float, float, float]:
    if not isinstance(raw, list) or len(raw) != 4:
        raise BadAnswer(
            where, f"a box must be a list of 4 numbers ({fmt}, pixels), got {_short(raw)}"
        )
    a, b, c, d = (number(v, f"{where}[{k}]") for k, v in enumerate(raw))
    if fmt == "xywh":
        if c < 0 or d < 0:
            raise BadAnswer(where, f"negative box width/height ({c:g}, {d:g})")
        c, d = a + c, b + d
    if c < a or d < b:
        raise BadAnswer(where, f"box ({a:g}, {b:g}, {c:g}, {d:g}) is inverted (x2 < x1 or y2 < y1)")
    t = BOX_TOLERANCE_PX
    if a < -t or b < -t or c > width + t or d > height + t:
        raise BadAnswer(
            where, f"box ({a:g}, {b:g}, {c:g}, {d:g}) lies outside the {width}x{height} image"
        )
    return (
        min(max(a, 0.0), width),
        min(max(b, 0.0), height),
        min(max(c, 0.0), width),
        min(max(d, 0.0), height),
    )
