"""Recorded answers as arrays, stored per work item and handed to the scoring service whole
(scoring on arrays, not per record). Domain code, no gRPC.

The answer types are the domain kernel's (:mod:`fortis.core.answers`, one per task, shared
with the scoring service) and are named here too: :class:`ClassAnswers` (ranked labels and
scores; every label and score the target returned is kept, so NDCG/DRR and degradation
rank/probability profiles work on full score vectors, RANK-1..3, DEG-2),
:class:`DetectionAnswers` (IEEE-C4) and :class:`SegmentationAnswers`. Here, every answer
carries ``errors``: per image, why its query failed ("" = answered); a failed query is scored
as incorrect and listed in the report.

What is the evaluation service's own: :func:`concat` joins the answers of consecutive
chunks, and :func:`pack` / :func:`unpack` store a work item's result as one ``.npz`` blob
(no pickle). Labels are stored in the narrowest integer type that holds them (int16 below
32,768 classes: 6 bytes per class and answer instead of 12). Scores stay float32 on purpose:
float16 would move a score across the plan's threshold rule (IEEE-C2 Alternative 3,
``score > sigma``) and change verdicts.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from fortis.core.answers import (
    Answers,
    ClassAnswers,
    DetectionAnswers,
    SegmentationAnswers,
)

__all__ = ["Answers", "ClassAnswers", "DetectionAnswers", "SegmentationAnswers", "concat",
           "pack", "unpack"]


def concat(parts: Sequence[Answers]) -> Answers:
    """Answers of consecutive chunks as one (same kind)."""
    first = parts[0]
    if isinstance(first, ClassAnswers):
        cl = [p for p in parts if isinstance(p, ClassAnswers)]
        k = max(p.labels.shape[1] for p in cl)
        labels = np.concatenate([np.pad(p.labels, ((0, 0), (0, k - p.labels.shape[1])),
                                        constant_values=-1) for p in cl])
        scores = None
        if any(p.scores is not None for p in cl):
            scores = np.concatenate([
                np.pad(p.scores, ((0, 0), (0, k - p.scores.shape[1])), constant_values=np.nan)
                if p.scores is not None else np.full((p.n, k), np.nan, np.float32) for p in cl])
        return ClassAnswers(labels=labels, scores=scores,
                            errors=tuple(e for p in cl for e in p.errors))
    if isinstance(first, DetectionAnswers):
        dl = [p for p in parts if isinstance(p, DetectionAnswers)]
        return DetectionAnswers(boxes=np.concatenate([p.boxes for p in dl]).reshape(-1, 4),
                                labels=np.concatenate([p.labels for p in dl]),
                                scores=np.concatenate([p.scores for p in dl]),
                                counts=np.concatenate([p.counts for p in dl]),
                                errors=tuple(e for p in dl for e in p.errors))
    sl = [p for p in parts if isinstance(p, SegmentationAnswers)]
    maps = [p.class_maps for p in sl if p.class_maps is not None]
    return SegmentationAnswers(class_maps=np.concatenate(maps) if len(maps) == len(sl) else None,
                               errors=tuple(e for p in sl for e in p.errors),
                               shapes=tuple(s for p in sl for s in p.shapes))


# -- storage -----------------------------------------------------------------------------------

def pack(result: Mapping[str, Any]) -> bytes:
    """One work item's result (answers and per-image arrays/strings) as an .npz blob."""
    arrays: dict[str, np.ndarray] = {}
    for key, value in result.items():
        if isinstance(value, ClassAnswers):
            arrays[f"{key}.class.labels"] = _narrow(value.labels)
            if value.scores is not None:
                arrays[f"{key}.class.scores"] = value.scores
            arrays[f"{key}.class.errors"] = _strings(value.errors)
        elif isinstance(value, DetectionAnswers):
            for name in ("boxes", "labels", "scores", "counts"):
                arrays[f"{key}.det.{name}"] = getattr(value, name)
            arrays[f"{key}.det.errors"] = _strings(value.errors)
        elif isinstance(value, SegmentationAnswers):
            if value.class_maps is not None:
                arrays[f"{key}.seg.class_maps"] = value.class_maps
            arrays[f"{key}.seg.shapes"] = np.asarray(value.shapes, dtype=np.int64).reshape(-1, 2)
            arrays[f"{key}.seg.errors"] = _strings(value.errors)
        elif isinstance(value, str):
            arrays[f"{key}.str"] = np.asarray(value)
        elif isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
            arrays[f"{key}.strs"] = _strings(value)
        else:
            arrays[f"{key}.arr"] = np.asarray(value)
    buf = io.BytesIO()
    np.savez(buf, **arrays)  # type: ignore[arg-type]  # numpy stubs take **kwds as allow_pickle
    return buf.getvalue()


def unpack(blob: bytes) -> dict[str, Any]:
    """The result :func:`pack` stored."""
    data = np.load(io.BytesIO(blob), allow_pickle=False)
    keys = list(data.files)
    out: dict[str, Any] = {}
    groups: dict[str, dict[str, np.ndarray]] = {}
    for name in keys:
        key, _, rest = name.partition(".")
        if rest == "str":
            out[key] = str(data[name])
        elif rest == "strs":
            out[key] = tuple(str(x) for x in data[name])
        elif rest == "arr":
            out[key] = data[name]
        else:
            groups.setdefault(key, {})[rest] = data[name]
    for key, g in groups.items():
        if "class.labels" in g:
            out[key] = ClassAnswers(labels=g["class.labels"].astype(np.int64),
                                    scores=g.get("class.scores"),
                                    errors=tuple(str(e) for e in g["class.errors"]))
        elif "det.boxes" in g:
            out[key] = DetectionAnswers(boxes=g["det.boxes"], labels=g["det.labels"],
                                        scores=g["det.scores"], counts=g["det.counts"],
                                        errors=tuple(str(e) for e in g["det.errors"]))
        else:
            out[key] = SegmentationAnswers(
                class_maps=g.get("seg.class_maps"),
                errors=tuple(str(e) for e in g["seg.errors"]),
                shapes=tuple((int(a), int(b)) for a, b in g["seg.shapes"]))
    return out


def _narrow(labels: np.ndarray) -> np.ndarray:
    """Ranked labels (-1 padded) in the narrowest signed integer type that holds them."""
    a = np.asarray(labels)
    if a.size == 0:
        return a.astype(np.int16)
    hi = int(a.max())
    for t in (np.int16, np.int32):
        if hi <= np.iinfo(t).max:
            return a.astype(t)
    return a.astype(np.int64)


def _strings(values: Sequence[str]) -> np.ndarray:
    return np.asarray(list(values), dtype=str) if values else np.zeros(0, dtype="<U1")
