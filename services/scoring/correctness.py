"""IEEE Std 3129-2023 4.7.6 prediction correctness for every service type. Domain code: no gRPC.

Decides the per-image booleans (Clean_Result(i), Corr_Result(i, j), Adv_Result(i, j)) that
``ieee.compute_ieee_metrics`` turns into the IEEE-M1..M7 tree. Every function works on a
whole batch of images with numpy (no per-image Python work in the inner loops), so M = 10,000
images under 75 settings scores in seconds.

Classification (IEEE-C1..C3, IEEE-P6)
    Each image has ``s`` label sets (s = 1 for an ordinary classifier). The prediction for set
    ``i`` is judged by the plan's :class:`~fortis.services.scoring.ieee.CorrectnessRule`
    (IEEE-C2 Alternative 1 top-1, 2 top-K, 3 confidence > sigma); the image is correct when at
    least Q of the s sets are (IEEE-C3 Alternative 1) or all of them are (Alternative 2), see
    :class:`AggregationRule`. A :class:`LabelMapping` (IEEE-P6) maps each dataset label to one
    or more service labels; a dataset label it does not list is an error naming the mapping's
    field, never a silent miss. Inputs: ranked labels ``(N, T)`` / ``(N, S, T)`` padded with
    -1 (:func:`classification_correct`) or full score vectors ``(N, C)`` / ``(N, S, C)``
    (:func:`classification_correct_from_scores`).

Object detection (IEEE-C4)
    Ground-truth boxes are matched to predicted boxes by IoU with the class label agreeing.
    IoU takes the place of confidence in IEEE-C2 (:class:`DetectionCriterion`):

    - ``top1``: the object's highest-IoU *available* prediction has the object's class;
    - ``topk``: the object's class is among its ``k`` highest-IoU available predictions;
    - ``threshold``: some available prediction of the object's class has IoU > threshold.

    In every mode a prediction is a candidate for an object only when IoU > ``iou_threshold``
    (the plan's IoU threshold, IEEE-P3; 0 gives the literal "any overlap" reading of top-1/K),
    and, when the plan sets ``confidence_threshold``, only when its score is >= that threshold
    (a minimum confidence, IEEE-P3). Then IEEE-C3 over the s objects of the image.

    **One prediction never matches two objects.** Matching is greedy and one-to-one, as in
    COCO's evaluation, but ordered by IoU (IoU replaces confidence in IEEE-C4): all candidate
    (object, prediction) pairs of an image are visited by decreasing IoU (ties: higher score,
    then lower prediction index, then lower object index). A pair whose object is already
    matched, or whose prediction is already taken, is skipped. Otherwise the prediction is
    the object's next-ranked available prediction: if it has the object's class and its rank
    is within 1 (top1), k (topk) or unlimited (threshold), the two are matched and the
    prediction is taken; a wrong-class prediction is not taken (it may still match another
    object of its own class), but it uses up one of the object's ranks. A prediction already
    taken by an object it overlaps more is therefore not the next object's top-1.

    An image with no ground-truth object is correct iff no prediction survives the
    confidence threshold (it correctly reports nothing). When Q (at least Q of s) exceeds an
    image's number of objects s, Q is capped at s: that image needs all its objects.

    Boxes are validated inputs in an explicit format (:data:`BOX_FORMATS`): pixel ``xyxy``
    (x1, y1, x2, y2), pixel ``xywh`` (x1, y1, width, height), pixel ``cxcywh``, and the same
    normalised to [0, 1] (``xyxyn``, ``xywhn``, ``cxcywhn``), converted with the image size
    (width, height). Coordinates are continuous (COCO convention: area = w * h, no +1).
    Non-finite coordinates, zero- or negative-area boxes and normalised coordinates outside
    [0, 1] are rejected with :class:`InvalidArgument` naming the box. Labels carry an
    explicit ``label_base`` (0- or 1-indexed) on each side; without a label mapping a
    ground-truth label g and a predicted label p agree iff g - base_gt == p - base_pred. With
    a label mapping the keys are the ground truth's labels as written and the values the
    service's labels as written, so only the mapping decides.

Semantic segmentation (IEEE-C5)
    Per pixel top-1 (IEEE-C2 Alternative 1): an ``(H, W)`` integer label map, or per-class
    score maps reduced by argmax (ties go to the lower class index). For each class of
    interest c: IoU_c = |pred == c and truth == c| / |pred == c or truth == c| over the pixels
    whose ground truth is not the ``ignore_label`` (e.g. 255; the prediction at those pixels
    is ignored too). A class absent from both prediction and ground truth (union 0) is left
    out of the mean; a class present in only one of them has IoU 0 and counts. The image is
    correct iff the mean IoU over the remaining classes *exceeds* (>) ``miou_threshold``. If
    every class of interest is absent from both, the mIoU is undefined (NaN) and the image
    is judged by ``all_absent``: ``"correct"`` (default: the service rightly found none of
    the classes of interest, and M stays the same for every setting, which IEEE-M4/M5 need)
    or ``"incorrect"``.

A failed query (``error`` set on the prediction) makes that image incorrect in every task.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as dc_field
from typing import Any, Final

import numpy as np
import numpy.typing as npt
from fortis.services.common.errors import FieldViolation, InvalidArgument
from fortis.services.scoring.ieee import CORRECTNESS_MODES, ClassPrediction, CorrectnessRule

__all__ = [
    "AGGREGATE_MODES",
    "ALL_ABSENT_POLICIES",
    "BOX_FORMATS",
    "AggregationRule",
    "DetectionBatch",
    "DetectionCriterion",
    "DetectionMatch",
    "Detections",
    "LabelMapping",
    "SegmentationCriterion",
    "SegmentationPrediction",
    "box_iou",
    "class_predictions_correct",
    "class_truth_array",
    "classification_correct",
    "classification_correct_from_scores",
    "detection_correct",
    "match_detections",
    "masks_from_scores",
    "segmentation_correct",
    "segmentation_iou",
    "segmentation_miou",
    "to_xyxy",
]

#: IEEE-C3 (4.7.6.2.2): Alternative 2 "all" label sets / objects, Alternative 1 "at_least" Q.
AGGREGATE_MODES: Final = ("all", "at_least")
#: IEEE-C4 box formats; a trailing ``n`` means normalised to [0, 1] by the image size.
BOX_FORMATS: Final = ("xyxy", "xywh", "cxcywh", "xyxyn", "xywhn", "cxcywhn")
#: IEEE-C5: how an image is judged when no class of interest is in prediction or truth.
ALL_ABSENT_POLICIES: Final = ("correct", "incorrect")
#: Score-map layouts of a segmentation service (per image; a batch adds a leading N).
SCORE_LAYOUTS: Final = ("chw", "hwc")

_CHUNK = 1 << 22        # elements per vectorised chunk (bounds memory on large batches)
_PAIR_CHUNK = 1 << 21   # (object, prediction) pairs per detection matching chunk
_MAX_LISTED = 10


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def _chunks(n: int, per_row: int, budget: int = _CHUNK) -> Iterator[slice]:
    step = max(1, budget // max(1, per_row))
    for start in range(0, n, step):
        yield slice(start, min(n, start + step))


def _raise(violations: list[FieldViolation]) -> None:
    if violations:
        more = len(violations) - _MAX_LISTED
        listed = violations[:_MAX_LISTED]
        if more > 0:
            listed.append(FieldViolation(listed[-1].field, f"... and {more} more"))
        raise InvalidArgument.from_violations(listed)


def _image_name(image_ids: Sequence[str] | None, n: int) -> str:
    return repr(str(image_ids[n])) if image_ids is not None else str(n)


# --------------------------------------------------------------------------------------------
# IEEE-C3: from label sets / objects to the image
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class AggregationRule:
    """How the s per-label-set (or per-object) verdicts make the image's (IEEE-C3, 4.7.6.2.2).

    - ``all`` (Alternative 2): every label set / object must be correct.
    - ``at_least`` (Alternative 1): at least ``q`` of the s must be correct (1 <= Q <= s).
    """

    mode: str = "all"
    q: int = 1

    def __post_init__(self) -> None:
        _raise(_aggregation_violations(self.mode, self.q, "aggregate", "q"))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None, *,
                  prefix: str = "correctness") -> AggregationRule:
        """Read the ``aggregate`` and ``q`` keys of a plan section (other keys are the
        caller's); errors name ``<prefix>.aggregate`` / ``<prefix>.q``."""
        if d is None:
            return cls()
        mode = d.get("aggregate", "all")
        q = d.get("q", 1)
        _raise(_aggregation_violations(mode, q, f"{prefix}.aggregate", f"{prefix}.q"))
        return cls(mode=mode, q=int(q))

    def to_dict(self) -> dict[str, Any]:
        return {"aggregate": self.mode, "q": self.q}

    def combine(self, correct: npt.ArrayLike, *, field: str = "correctness.q") -> np.ndarray:
        """(N, S) per-set verdicts -> (N,) image verdicts. ``q > S`` is an error naming
        ``field`` (IEEE-C3 needs 1 <= Q <= s)."""
        c = np.asarray(correct, dtype=bool)
        if c.ndim != 2:
            raise InvalidArgument(field, f"per-set verdicts must be (N, S), got shape {c.shape}")
        if self.mode == "all":
            return np.asarray(c.all(axis=1))
        if self.q > c.shape[1]:
            raise InvalidArgument(field, f"Q = {self.q} exceeds the s = {c.shape[1]} label sets "
                                         "(IEEE-C3 needs 1 <= Q <= s)")
        return np.asarray(c.sum(axis=1) >= self.q)


def _aggregation_violations(mode: Any, q: Any, mode_field: str,
                            q_field: str) -> list[FieldViolation]:
    out: list[FieldViolation] = []
    if not isinstance(mode, str) or mode not in AGGREGATE_MODES:
        out.append(FieldViolation(mode_field, f"must be one of {', '.join(AGGREGATE_MODES)}; "
                                              f"got {mode!r}"))
    if not _is_int(q) or q < 1:
        out.append(FieldViolation(q_field, f"must be an integer >= 1; got {q!r}"))
    return out


# --------------------------------------------------------------------------------------------
# IEEE-P6: dataset labels -> service labels
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class LabelMapping:
    """Dataset label -> service label(s), from the plan (IEEE-P6).

    ``table`` maps each dataset label to one service label or to several (one-to-many: any of
    them is accepted). Labels are non-negative integers as written by the dataset and by the
    service. A dataset label missing from the table is an error naming ``field`` (the plan
    field the mapping came from), so an unmapped class never silently counts as a miss.
    """

    table: Mapping[int, int | Sequence[int]]
    field: str = "dataset.label_map"
    _norm: dict[int, tuple[int, ...]] = dc_field(init=False, repr=False)
    _keys: np.ndarray = dc_field(init=False, repr=False)
    _lut: np.ndarray = dc_field(init=False, repr=False)

    def __post_init__(self) -> None:
        norm: dict[int, tuple[int, ...]] = {}
        violations: list[FieldViolation] = []
        if not isinstance(self.table, Mapping):
            raise InvalidArgument(self.field, "must map dataset label -> service label(s)")
        for k, v in self.table.items():
            key = _label_key(k)
            if key is None:
                violations.append(FieldViolation(
                    f"{self.field}.{k}", f"dataset labels must be integers >= 0, got {k!r}"))
                continue
            vals = (v,) if not isinstance(v, Sequence) or isinstance(v, str) else tuple(v)
            if not vals:
                violations.append(FieldViolation(
                    f"{self.field}.{k}", "maps to no service label (drop the images instead)"))
            elif not all(_is_int(x) and x >= 0 for x in vals):
                violations.append(FieldViolation(
                    f"{self.field}.{k}", f"service labels must be integers >= 0, got {v!r}"))
            elif key in norm:
                violations.append(FieldViolation(f"{self.field}.{k}", "given twice"))
            else:
                norm[key] = tuple(dict.fromkeys(int(x) for x in vals))
        _raise(violations)
        object.__setattr__(self, "_norm", norm)
        keys = np.array(sorted(norm), dtype=np.int64)
        width = max((len(v) for v in norm.values()), default=1)
        lut = np.full((len(keys), width), -1, dtype=np.int64)
        for r, key in enumerate(keys.tolist()):
            lut[r, : len(norm[key])] = norm[key]
        object.__setattr__(self, "_keys", keys)
        object.__setattr__(self, "_lut", lut)

    @classmethod
    def from_dict(cls, d: Mapping[Any, Any], *, field: str = "dataset.label_map") -> LabelMapping:
        """From a plan mapping whose keys may be strings ("3": 7 or "3": [7, 8])."""
        if not isinstance(d, Mapping):
            raise InvalidArgument(field, "must map dataset label -> service label(s)")
        return cls(dict(d), field)

    @property
    def one_to_one(self) -> bool:
        """True when every dataset label maps to exactly one service label."""
        return int(self._lut.shape[1]) == 1

    def __getitem__(self, label: int) -> tuple[int, ...]:
        return self.map_label(label)

    def map_label(self, label: int, *, where: str = "") -> tuple[int, ...]:
        """The service labels of one dataset label; unmapped -> :class:`InvalidArgument`."""
        try:
            return self._norm[int(label)]
        except KeyError:
            raise InvalidArgument(self.field, f"no entry for dataset label {label}"
                                  + (f" (used by {where})" if where else "")) from None

    def map_array(self, labels: npt.ArrayLike, *, where: str = "",
                  ignore: int | None = None) -> np.ndarray:
        """Vectorised: an integer array of dataset labels -> service labels with one more
        trailing axis of width A (the most service labels any key maps to), padded with -1.
        Entries equal to ``ignore`` stay ``ignore`` (first column) untouched."""
        arr = np.asarray(labels)
        keys, lut = self._keys, self._lut
        if arr.size == 0 or len(keys) == 0:
            if arr.size:
                raise InvalidArgument(self.field, "is empty but labels need mapping"
                                      + (f" (used by {where})" if where else ""))
            return np.full((*arr.shape, lut.shape[1]), -1, dtype=np.int64)
        pos = np.clip(np.searchsorted(keys, arr), 0, len(keys) - 1)
        hit = keys[pos] == arr
        skip = (arr == ignore) if ignore is not None else np.zeros(arr.shape, bool)
        bad = ~hit & ~skip
        if bad.any():
            missing = sorted(set(np.asarray(arr[bad]).ravel().tolist()))
            raise InvalidArgument(self.field, "no entry for dataset label"
                                  f"{'s' if len(missing) > 1 else ''} "
                                  f"{', '.join(map(str, missing[:_MAX_LISTED]))}"
                                  + (f" (used by {where})" if where else ""))
        out = lut[pos]
        if ignore is not None and skip.any():
            out[skip] = -1
            out[skip, 0] = ignore
        return np.asarray(out)


def _label_key(k: Any) -> int | None:
    if _is_int(k):
        return int(k) if k >= 0 else None
    if isinstance(k, str) and k.strip().isdigit():
        return int(k.strip())
    return None


# --------------------------------------------------------------------------------------------
# Classification: IEEE-C1, C2 per label set, C3 per image
# --------------------------------------------------------------------------------------------


def _as_truth(truth: npt.ArrayLike, n: int, s: int, field: str) -> np.ndarray:
    tr = np.asarray(truth)
    if tr.size and not np.issubdtype(tr.dtype, np.integer):
        raise InvalidArgument(field, f"labels must be integers, got dtype {tr.dtype}")
    tr = tr.astype(np.int64, copy=False)
    if tr.ndim == 1:
        tr = tr[:, None, None]
    elif tr.ndim == 2:
        tr = tr[:, :, None]
    elif tr.ndim != 3:
        raise InvalidArgument(field, "must be (N,) one label per image, (N, S) one per label set "
                                     f"or (N, S, A) acceptable labels padded with -1; got "
                                     f"shape {tr.shape}")
    if tr.shape[:2] != (n, s):
        raise InvalidArgument(field, f"shape {tr.shape} does not match the predictions' "
                                     f"(N, S) = ({n}, {s}); several acceptable labels per set "
                                     "are given as (N, S, A)")
    empty = ~(tr >= 0).any(axis=2)
    if empty.any():
        i, j = (int(x) for x in np.argwhere(empty)[0])
        raise InvalidArgument(field, f"image {i}, label set {j} has no acceptable label "
                                     f"(every set needs at least one)")
    return tr


def classification_correct(
    ranked_labels: npt.ArrayLike,
    truth: npt.ArrayLike,
    rule: CorrectnessRule,
    *,
    ranked_scores: npt.ArrayLike | None = None,
    aggregate: AggregationRule | None = None,
    failed: npt.ArrayLike | None = None,
) -> np.ndarray:
    """IEEE-C1/C2/C3 for N images at once -> (N,) bool.

    ``ranked_labels``: integer ``(N, T)`` (one label set) or ``(N, S, T)``, the service's
    labels best first, padded with -1 when fewer than T were returned. ``ranked_scores``:
    the matching confidences (same shape), needed by ``threshold`` (C2 Alternative 3; a score
    must be strictly greater than sigma). ``truth``: ``(N,)``, ``(N, S)`` or ``(N, S, A)``
    acceptable service labels padded with -1 (any of them counts; see
    :func:`class_truth_array` to build it from dataset labels and a :class:`LabelMapping`).
    ``aggregate``: IEEE-C3 over the S sets (default ``all``). ``failed``: ``(N,)`` or
    ``(N, S)`` bool, failed queries, judged incorrect. Agrees exactly with
    :func:`~fortis.services.scoring.ieee.is_correct` on every single prediction.
    """
    lab = np.asarray(ranked_labels)
    if lab.ndim == 2:
        lab = lab[:, None, :]
    if lab.ndim != 3:
        raise InvalidArgument("ranked_labels", f"must be (N, T) or (N, S, T), got shape {lab.shape}")
    if lab.size and not np.issubdtype(lab.dtype, np.integer):
        raise InvalidArgument("ranked_labels", f"labels must be integers, got dtype {lab.dtype}")
    n, s, t = lab.shape
    tr = _as_truth(truth, n, s, "truth")
    sc: np.ndarray | None = None
    if rule.mode == "threshold":
        if ranked_scores is None:
            raise InvalidArgument("correctness.mode", "threshold needs a score-returning target")
        sc = np.asarray(ranked_scores, dtype=np.float64)
        if sc.ndim == 2:
            sc = sc[:, None, :]
        if sc.shape != lab.shape:
            raise InvalidArgument("ranked_scores", f"shape {np.shape(ranked_scores)} does not "
                                                   f"match ranked_labels {np.shape(ranked_labels)}")
    width = {"top1": 1, "topk": rule.k}.get(rule.mode, t)
    width = min(width, t)
    per_set = np.zeros((n, s), dtype=bool)
    a = tr.shape[2]
    for ch in _chunks(n, s * max(width, 1) * a):
        lc = lab[ch, :, :width]
        valid = lc >= 0
        if sc is not None:
            valid &= sc[ch, :, :width] > rule.threshold
        hit = (lc[..., None] == tr[ch, :, None, :]) & valid[..., None]
        per_set[ch] = hit.any(axis=(2, 3))
    return _finish_classification(per_set, aggregate, failed)


def classification_correct_from_scores(
    scores: npt.ArrayLike,
    truth: npt.ArrayLike,
    rule: CorrectnessRule,
    *,
    aggregate: AggregationRule | None = None,
    failed: npt.ArrayLike | None = None,
) -> np.ndarray:
    """IEEE-C1/C2/C3 from full score vectors: ``scores`` ``(N, C)`` or ``(N, S, C)`` (one
    confidence per service label, index = label) -> (N,) bool. ``truth`` as in
    :func:`classification_correct`. Ranks follow a stable descending sort: equal scores rank
    the lower label first (as ``numpy.argmax`` does for top-1). Scores must be finite.
    """
    sc = np.asarray(scores, dtype=np.float64)
    if sc.ndim == 2:
        sc = sc[:, None, :]
    if sc.ndim != 3 or sc.shape[2] == 0:
        raise InvalidArgument("scores", f"must be (N, C) or (N, S, C) with C >= 1, got shape "
                                        f"{np.shape(scores)}")
    if not np.isfinite(sc).all():
        raise InvalidArgument("scores", "scores must be finite (NaN or inf found)")
    n, s, c = sc.shape
    tr = _as_truth(truth, n, s, "truth")
    if (tr >= c).any():
        raise InvalidArgument("truth", f"label {int(tr.max())} is outside the C = {c} scores "
                                       "(labels index the score vector)")
    a = tr.shape[2]
    per_set = np.zeros((n, s), dtype=bool)
    cls_idx = np.arange(c)
    for ch in _chunks(n, s * a * (1 if rule.mode == "threshold" else c)):
        t = tr[ch]
        valid = t >= 0
        st = np.take_along_axis(sc[ch], np.where(valid, t, 0), axis=2)      # (n, S, A)
        if rule.mode == "threshold":
            hit = st > rule.threshold
        else:
            k = 1 if rule.mode == "top1" else rule.k
            block = sc[ch][:, :, None, :]                                    # (n, S, 1, C)
            rank = ((block > st[..., None]).sum(axis=3)
                    + ((block == st[..., None]) & (cls_idx < t[..., None])).sum(axis=3))
            hit = rank < k
        per_set[ch] = (hit & valid).any(axis=2)
    return _finish_classification(per_set, aggregate, failed)


def _finish_classification(per_set: np.ndarray, aggregate: AggregationRule | None,
                           failed: npt.ArrayLike | None) -> np.ndarray:
    n, s = per_set.shape
    if failed is not None:
        f = np.asarray(failed, dtype=bool)
        if f.shape == (n,):
            per_set &= ~f[:, None]
        elif f.shape == (n, s):
            per_set &= ~f
        else:
            raise InvalidArgument("failed", f"must be (N,) or (N, S) = ({n}, {s}), got {f.shape}")
    return (aggregate or AggregationRule()).combine(per_set)


def class_truth_array(
    labels: Sequence[Sequence[int] | Sequence[Sequence[int]] | int],
    *,
    label_mapping: LabelMapping | Sequence[LabelMapping | None] | None = None,
    image_ids: Sequence[str] | None = None,
    field: str = "labels",
) -> np.ndarray:
    """Per-image dataset labels -> the ``(N, S, A)`` truth array of service labels.

    ``labels[n]`` is an int, a sequence of acceptable labels (one label set, s = 1), or a
    sequence of s label sets each a sequence of acceptable labels (IEEE-C3). Every image
    must have the same s. ``label_mapping`` (IEEE-P6) is one mapping for every set or one per
    set (``None`` = identity); one-to-many entries widen the acceptable labels.
    """
    sets_per_image: list[list[tuple[int, ...]]] = []
    s_common: int | None = None
    violations: list[FieldViolation] = []
    for n, lab in enumerate(labels):
        where = f"{field}[{_image_name(image_ids, n)}]"
        sets = _label_sets(lab)
        if sets is None:
            violations.append(FieldViolation(where, "must be a label, a list of acceptable labels "
                                                    "or a list of label sets, all integers"))
            continue
        if any(not st for st in sets) or not sets:
            violations.append(FieldViolation(where, "every label set needs at least one label"))
            continue
        if s_common is None:
            s_common = len(sets)
        elif len(sets) != s_common:
            violations.append(FieldViolation(where, f"has {len(sets)} label sets, the images "
                                                    f"before it have {s_common}"))
            continue
        sets_per_image.append(sets)
    _raise(violations)
    s = s_common or 1
    maps: list[LabelMapping | None]
    if label_mapping is None or isinstance(label_mapping, LabelMapping):
        maps = [label_mapping] * s
    else:
        maps = list(label_mapping)
        if len(maps) != s:
            raise InvalidArgument("label_mapping", f"{len(maps)} mappings for {s} label sets")
    mapped: list[list[tuple[int, ...]]] = []
    for n, sets in enumerate(sets_per_image):
        row = []
        for j, st in enumerate(sets):
            mp = maps[j]
            if mp is None:
                row.append(st)
            else:
                where = f"{field}[{_image_name(image_ids, n)}]" + (f"[{j}]" if s > 1 else "")
                row.append(tuple(dict.fromkeys(x for lab in st
                                               for x in mp.map_label(lab, where=where))))
        mapped.append(row)
    a = max((len(st) for row in mapped for st in row), default=1)
    out = np.full((len(mapped), s, a), -1, dtype=np.int64)
    for n, row in enumerate(mapped):
        for j, st in enumerate(row):
            out[n, j, : len(st)] = st
    return out


def _label_sets(lab: Any) -> list[tuple[int, ...]] | None:
    if _is_int(lab):
        return [(int(lab),)] if lab >= 0 else None
    if isinstance(lab, np.ndarray):
        lab = lab.tolist()
    if not isinstance(lab, Sequence) or isinstance(lab, str):
        return None
    if all(_is_int(x) for x in lab):
        return [tuple(int(x) for x in lab)] if all(x >= 0 for x in lab) else None
    sets: list[tuple[int, ...]] = []
    for st in lab:
        if isinstance(st, np.ndarray):
            st = st.tolist()
        if _is_int(st):
            st = [st]
        if not isinstance(st, Sequence) or isinstance(st, str) \
                or not all(_is_int(x) and x >= 0 for x in st):
            return None
        sets.append(tuple(int(x) for x in st))
    return sets


def class_predictions_correct(
    predictions: Sequence[ClassPrediction | Sequence[ClassPrediction]],
    truth: npt.ArrayLike,
    rule: CorrectnessRule,
    *,
    aggregate: AggregationRule | None = None,
    image_ids: Sequence[str] | None = None,
    field: str = "predictions",
) -> np.ndarray:
    """IEEE-C1/C2/C3 on recorded answers -> (N,) bool.

    ``predictions[n]`` is a :class:`ClassPrediction` (one label set) or a sequence of s of them
    (one per label set, IEEE-C3); ``truth`` is the ``(N, S, A)`` array of
    :func:`class_truth_array`. A prediction with ``error`` is incorrect. The answers are
    padded into arrays once, then judged by :func:`classification_correct`.
    """
    tr = np.asarray(truth)
    n = len(predictions)
    if tr.ndim != 3 or tr.shape[0] != n:
        raise InvalidArgument("truth", f"must be (N, S, A) with N = {n}, got shape {tr.shape}")
    s = tr.shape[1]
    need_scores = rule.mode == "threshold"
    sets_list: list[Sequence[ClassPrediction]] = []
    for i, p in enumerate(predictions):
        sets = (p,) if isinstance(p, ClassPrediction) else p
        if len(sets) != s or not all(isinstance(x, ClassPrediction) for x in sets):
            raise InvalidArgument(f"{field}[{_image_name(image_ids, i)}]",
                                  f"needs {s} ClassPrediction(s), one per label set")
        sets_list.append(sets)
    flat = [x for sets in sets_list for x in sets]
    if need_scores:
        width = max((len(x.labels) for x in flat), default=0)
    else:
        width = 1 if rule.mode == "top1" else rule.k
    width = max(width, 1)
    pad_l = (-1,) * width
    pad_s = (math.nan,) * width
    lab_rows: list[int] = []
    score_rows: list[float] = []
    failed = np.zeros(len(flat), dtype=bool)
    for r, x in enumerate(flat):
        if x.error is not None:
            failed[r] = True
            lab_rows.extend(pad_l)
            if need_scores:
                score_rows.extend(pad_s)
            continue
        if x.scores is not None and len(x.scores) != len(x.labels):
            raise InvalidArgument(f"{field}[{_image_name(image_ids, r // s)}].scores",
                                  f"{len(x.scores)} scores for {len(x.labels)} labels")
        lb = x.labels[:width]
        lab_rows.extend(lb)
        lab_rows.extend(pad_l[: width - len(lb)])
        if need_scores:
            if x.scores is None:
                raise InvalidArgument("correctness.mode", "threshold needs a score-returning "
                                      f"target ({field}[{_image_name(image_ids, r // s)}] has "
                                      "no scores)")
            sc = x.scores[:width]
            score_rows.extend(sc)
            score_rows.extend(pad_s[: width - len(sc)])
    labels_arr = np.array(lab_rows, dtype=np.int64).reshape(n, s, width)
    scores_arr = np.array(score_rows, dtype=np.float64).reshape(n, s, width) if need_scores \
        else None
    return classification_correct(labels_arr, tr, rule, ranked_scores=scores_arr,
                                  aggregate=aggregate, failed=failed.reshape(n, s))


# --------------------------------------------------------------------------------------------
# Object detection: IEEE-C4
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class DetectionCriterion:
    """IEEE-C4 correctness of a detection answer, from the plan (service-type parameters,
    IEEE-P3). See the module docstring for the matching rule.

    ``mode``: ``top1`` / ``topk`` / ``threshold`` (C2's alternatives with IoU in place of
    confidence); ``k`` for ``topk``; ``iou_threshold``: a prediction is a candidate for an
    object only when IoU > it (in [0, 1)); ``confidence_threshold``: predictions with a
    score below it are dropped first (``None``: keep all); ``aggregate``: IEEE-C3 over the
    image's objects.
    """

    mode: str = "threshold"
    k: int = 5
    iou_threshold: float = 0.5
    confidence_threshold: float | None = None
    aggregate: AggregationRule = dc_field(default_factory=AggregationRule)

    def __post_init__(self) -> None:
        _raise(_detection_violations(self.mode, self.k, self.iou_threshold,
                                     self.confidence_threshold, "detection"))
        if not isinstance(self.aggregate, AggregationRule):
            raise InvalidArgument("detection.aggregate", "must be an AggregationRule")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None, *,
                  prefix: str = "detection") -> DetectionCriterion:
        """Plan section -> criterion; unknown keys and bad values name ``<prefix>.<key>``."""
        if d is None:
            return cls()
        if not isinstance(d, Mapping):
            raise InvalidArgument(prefix, "must be a mapping")
        allowed = ("mode", "k", "iou_threshold", "confidence_threshold", "aggregate", "q")
        violations = [FieldViolation(f"{prefix}.{key}", f"unknown key (allowed: "
                                                        f"{', '.join(allowed)})")
                      for key in d if key not in allowed]
        mode, k = d.get("mode", "threshold"), d.get("k", 5)
        iou, conf = d.get("iou_threshold", 0.5), d.get("confidence_threshold")
        violations += _detection_violations(mode, k, iou, conf, prefix)
        violations += _aggregation_violations(d.get("aggregate", "all"), d.get("q", 1),
                                              f"{prefix}.aggregate", f"{prefix}.q")
        _raise(violations)
        return cls(mode=mode, k=int(k), iou_threshold=float(iou),
                   confidence_threshold=None if conf is None else float(conf),
                   aggregate=AggregationRule.from_dict(d, prefix=prefix))

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "k": self.k, "iou_threshold": self.iou_threshold,
                "confidence_threshold": self.confidence_threshold, **self.aggregate.to_dict()}

    @property
    def rank_limit(self) -> int | None:
        """How many of an object's ranked candidates may match it (None: unlimited)."""
        return {"top1": 1, "topk": self.k}.get(self.mode)


def _detection_violations(mode: Any, k: Any, iou: Any, conf: Any,
                          prefix: str) -> list[FieldViolation]:
    out: list[FieldViolation] = []
    if not isinstance(mode, str) or mode not in CORRECTNESS_MODES:
        out.append(FieldViolation(f"{prefix}.mode", f"must be one of "
                                                    f"{', '.join(CORRECTNESS_MODES)}; got {mode!r}"))
    if not _is_int(k) or k < 1:
        out.append(FieldViolation(f"{prefix}.k", f"must be an integer >= 1; got {k!r}"))
    if not _is_number(iou) or not 0.0 <= iou < 1.0:
        out.append(FieldViolation(f"{prefix}.iou_threshold", f"must be a number in [0, 1); "
                                                             f"got {iou!r}"))
    if conf is not None and (not _is_number(conf) or not math.isfinite(conf)):
        out.append(FieldViolation(f"{prefix}.confidence_threshold",
                                  f"must be a finite number or null; got {conf!r}"))
    return out


@dataclass(frozen=True, kw_only=True, eq=False)
class Detections:
    """One image's boxes: ground truth (``scores=None``) or a detection service's answer.

    ``boxes``: ``(n, 4)`` in ``box_format`` (:data:`BOX_FORMATS`); ``labels``: ``(n,)``
    integer class labels, ``label_base`` 0 or 1 (0- or 1-indexed); ``scores``: ``(n,)``
    confidences or ``None``; ``image_size``: ``(width, height)`` in pixels, needed by the
    normalised formats (when ``None``, the ground truth's size is used for a prediction);
    ``error``: the query failed (the image is then incorrect). Validation happens when a
    batch is built (:meth:`DetectionBatch.from_images`), vectorised over all images.
    """

    boxes: npt.ArrayLike
    labels: npt.ArrayLike
    scores: npt.ArrayLike | None = None
    box_format: str = "xyxy"
    label_base: int = 0
    image_size: tuple[int, int] | None = None
    error: str | None = None


def _check_size(size: Any) -> tuple[float, float] | None:
    if size is None:
        return None
    try:
        w, h = size
    except (TypeError, ValueError):
        return None
    if not (_is_number(w) and _is_number(h)) or not (w > 0 and h > 0) \
            or not math.isfinite(w) or not math.isfinite(h):
        return None
    return float(w), float(h)


def _convert_rows(raw: np.ndarray, fmt: str, wh: np.ndarray | None,
                  where: Any) -> tuple[np.ndarray, list[FieldViolation]]:
    """(n, 4) boxes in ``fmt`` -> pixel xyxy, with per-row (width, height) ``wh`` for the
    normalised formats. ``where(row)`` names a row in an error."""
    violations: list[FieldViolation] = []
    bad = ~np.isfinite(raw).all(axis=1)
    for r in np.flatnonzero(bad)[:_MAX_LISTED]:
        violations.append(FieldViolation(where(int(r)), f"coordinates must be finite, got "
                                                        f"{raw[r].tolist()}"))
    if violations:
        return raw, violations
    b = raw
    if fmt.endswith("n"):
        out_of = ((b < 0.0) | (b > 1.0)).any(axis=1)
        for r in np.flatnonzero(out_of)[:_MAX_LISTED]:
            violations.append(FieldViolation(
                where(int(r)), f"normalised '{fmt}' coordinates must be in [0, 1], got "
                               f"{b[r].tolist()} (pixel boxes given as normalised?)"))
        if violations:
            return raw, violations
        assert wh is not None
        b = b * np.concatenate([wh, wh], axis=1)
        fmt = fmt[:-1]
    if fmt == "xyxy":
        w, h = b[:, 2] - b[:, 0], b[:, 3] - b[:, 1]
        xyxy = b
    else:
        w, h = b[:, 2], b[:, 3]
        if fmt == "xywh":
            x1, y1 = b[:, 0], b[:, 1]
        else:                                               # cxcywh
            x1, y1 = b[:, 0] - w / 2.0, b[:, 1] - h / 2.0
        xyxy = np.stack([x1, y1, x1 + w, y1 + h], axis=1)
    degenerate = ~((w > 0) & (h > 0))
    for r in np.flatnonzero(degenerate)[:_MAX_LISTED]:
        what = "zero-area box" if (w[r] == 0 or h[r] == 0) else "negative width or height"
        hint = " (x2 < x1 or y2 < y1: is it 'xywh'?)" if fmt == "xyxy" and what != \
            "zero-area box" else ""
        violations.append(FieldViolation(where(int(r)), f"{what} {raw[r].tolist()} in "
                                                        f"'{fmt}'{hint}: boxes need w, h > 0"))
    return xyxy, violations


def to_xyxy(boxes: npt.ArrayLike, box_format: str = "xyxy", *,
            image_size: tuple[int, int] | None = None, field: str = "boxes") -> np.ndarray:
    """Validated conversion of ``(n, 4)`` boxes in ``box_format`` to pixel xyxy (float64).

    Normalised formats need ``image_size`` = (width, height). Rejects non-finite values,
    zero- or negative-area boxes and normalised coordinates outside [0, 1], naming
    ``field[row]``."""
    if box_format not in BOX_FORMATS:
        raise InvalidArgument(f"{field}.box_format", f"must be one of {', '.join(BOX_FORMATS)}; "
                                                     f"got {box_format!r}")
    b = np.asarray(boxes, dtype=np.float64)
    if b.size == 0:
        b = b.reshape(0, 4)
    if b.ndim != 2 or b.shape[1] != 4:
        raise InvalidArgument(field, f"must be (n, 4), got shape {np.shape(boxes)}")
    wh = None
    if box_format.endswith("n"):
        size = _check_size(image_size)
        if size is None:
            raise InvalidArgument(f"{field}.image_size", f"normalised '{box_format}' boxes need "
                                  f"image_size (width, height) > 0, got {image_size!r}")
        wh = np.broadcast_to(np.array(size), (len(b), 2))
    xyxy, violations = _convert_rows(b, box_format, wh, lambda r: f"{field}[{r}]")
    _raise(violations)
    return xyxy


def box_iou(a: npt.ArrayLike, b: npt.ArrayLike, *, box_format: str = "xyxy",
            image_size: tuple[int, int] | None = None) -> np.ndarray:
    """Pairwise IoU ``(n, m)`` of two validated box sets in one format. Touching boxes (a
    shared edge, no shared area) have IoU exactly 0."""
    x = to_xyxy(a, box_format, image_size=image_size, field="a")
    y = to_xyxy(b, box_format, image_size=image_size, field="b")
    iw = np.clip(np.minimum(x[:, None, 2], y[None, :, 2]) - np.maximum(x[:, None, 0], y[None, :, 0]),
                 0.0, None)
    ih = np.clip(np.minimum(x[:, None, 3], y[None, :, 3]) - np.maximum(x[:, None, 1], y[None, :, 1]),
                 0.0, None)
    inter = iw * ih
    area_x = (x[:, 2] - x[:, 0]) * (x[:, 3] - x[:, 1])
    area_y = (y[:, 2] - y[:, 0]) * (y[:, 3] - y[:, 1])
    return np.asarray(inter / (area_x[:, None] + area_y[None, :] - inter))


def _pair_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    iw = np.clip(np.minimum(a[:, 2], b[:, 2]) - np.maximum(a[:, 0], b[:, 0]), 0.0, None)
    ih = np.clip(np.minimum(a[:, 3], b[:, 3]) - np.maximum(a[:, 1], b[:, 1]), 0.0, None)
    inter = iw * ih
    union = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1]) + (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    return np.asarray(inter / (union - inter))


@dataclass(frozen=True, eq=False)
class DetectionBatch:
    """N images' boxes in one flat (CSR) layout, validated: the vectorised input of IEEE-C4.

    ``boxes`` ``(T, 4)`` pixel xyxy float64; ``labels`` ``(T,)`` int64 as written;
    ``scores`` ``(T,)`` float64 (NaN where an image gave none) or ``None``; image n owns rows
    ``offsets[n]:offsets[n + 1]``; ``label_base`` ``(N,)``; ``failed`` ``(N,)`` (query
    failed: no rows, judged incorrect); ``image_ids`` and ``field`` name things in errors.
    Build with :meth:`from_images` or :meth:`from_arrays`.
    """

    boxes: np.ndarray
    labels: np.ndarray
    scores: np.ndarray | None
    offsets: np.ndarray
    label_base: np.ndarray
    failed: np.ndarray
    image_ids: tuple[str, ...] | None = None
    field: str = "detections"

    @property
    def n_images(self) -> int:
        return len(self.offsets) - 1

    @property
    def counts(self) -> np.ndarray:
        return np.diff(self.offsets)

    def image_of_row(self) -> np.ndarray:
        return np.repeat(np.arange(self.n_images), self.counts)

    def where(self, row: int, what: str = "boxes") -> str:
        n = int(np.searchsorted(self.offsets, row, side="right") - 1)
        return f"{self.field}[{_image_name(self.image_ids, n)}].{what}[{row - int(self.offsets[n])}]"

    @classmethod
    def from_arrays(cls, *, boxes: npt.ArrayLike, labels: npt.ArrayLike, counts: npt.ArrayLike,
                    scores: npt.ArrayLike | None = None, box_format: str = "xyxy",
                    label_base: int = 0, image_sizes: npt.ArrayLike | None = None,
                    failed: npt.ArrayLike | None = None, image_ids: Sequence[str] | None = None,
                    field: str = "detections") -> DetectionBatch:
        """Flat arrays (all images' boxes one after the other; ``counts[n]`` rows for image
        n) in one format and label base -> validated batch. ``image_sizes`` ``(N, 2)``
        (width, height) is needed by the normalised formats."""
        cnt = np.asarray(counts, dtype=np.int64)
        n = len(cnt)
        if cnt.ndim != 1 or (cnt < 0).any():
            raise InvalidArgument(f"{field}.counts", "must be (N,) non-negative integers")
        if box_format not in BOX_FORMATS:
            raise InvalidArgument(f"{field}.box_format",
                                  f"must be one of {', '.join(BOX_FORMATS)}; got {box_format!r}")
        if label_base not in (0, 1) or isinstance(label_base, bool):
            raise InvalidArgument(f"{field}.label_base", f"must be 0 or 1; got {label_base!r}")
        total = int(cnt.sum())
        b = np.asarray(boxes, dtype=np.float64)
        if b.size == 0:
            b = b.reshape(0, 4)
        if b.ndim != 2 or b.shape[1] != 4:
            raise InvalidArgument(f"{field}.boxes", f"must be (T, 4), got shape {b.shape}")
        lab = _int_labels(labels, f"{field}.labels")
        if len(b) != total or len(lab) != total:
            raise InvalidArgument(field, f"counts sum to {total} boxes but got {len(b)} boxes "
                                         f"and {len(lab)} labels")
        sc = None
        if scores is not None:
            sc = np.asarray(scores, dtype=np.float64).reshape(-1)
            if len(sc) != total:
                raise InvalidArgument(f"{field}.scores", f"{len(sc)} scores for {total} boxes")
        fl = np.zeros(n, bool) if failed is None else np.asarray(failed, dtype=bool).reshape(n)
        wh = None
        if box_format.endswith("n"):
            if image_sizes is None:
                raise InvalidArgument(f"{field}.image_sizes", f"normalised '{box_format}' boxes "
                                                              "need each image's (width, height)")
            sizes = np.asarray(image_sizes, dtype=np.float64).reshape(n, 2)
            if not (np.isfinite(sizes).all() and (sizes > 0).all()):
                raise InvalidArgument(f"{field}.image_sizes", "must be (N, 2) positive sizes")
            wh = np.repeat(sizes, cnt, axis=0)
        offsets = np.concatenate([[0], np.cumsum(cnt)]).astype(np.int64)
        batch = cls(np.zeros((0, 4)), lab, sc, offsets, np.full(n, label_base, np.int64), fl,
                    tuple(map(str, image_ids)) if image_ids is not None else None, field)
        xyxy, violations = _convert_rows(b, box_format, wh, batch.where)
        _raise(violations)
        return cls(xyxy, lab, sc, offsets, batch.label_base, fl, batch.image_ids, field)

    @classmethod
    def from_images(cls, images: Sequence[Detections], *, field: str = "detections",
                    image_ids: Sequence[str] | None = None,
                    image_sizes: Sequence[tuple[int, int] | None] | None = None) -> DetectionBatch:
        """One :class:`Detections` per image -> validated batch. Each image may use its own
        box format and label base. ``image_sizes[n]`` is used for an image whose
        ``image_size`` is ``None`` (e.g. the ground truth's size for a prediction)."""
        n = len(images)
        ids = tuple(map(str, image_ids)) if image_ids is not None else None
        counts: list[int] = []
        bases: list[int] = []
        fmt_code: list[int] = []
        failed = np.zeros(n, bool)
        sizes = np.full((n, 2), np.nan)
        box_parts: list[np.ndarray] = []
        label_parts: list[np.ndarray] = []
        score_parts: list[np.ndarray | None] = []
        any_scores = False
        violations: list[FieldViolation] = []
        codes = {f: c for c, f in enumerate(BOX_FORMATS)}

        def bad(i: int, what: str, description: str) -> None:
            violations.append(FieldViolation(f"{field}[{_image_name(ids, i)}]{what}", description))
            counts.append(0)
            bases.append(0)
            fmt_code.append(0)

        # lean per-image loop: shapes only; values are validated below, vectorised
        for i, d in enumerate(images):
            if not isinstance(d, Detections):
                bad(i, "", "must be a Detections")
                continue
            if d.error is not None:
                failed[i] = True
                counts.append(0)
                bases.append(0)
                fmt_code.append(0)
                continue
            code = codes.get(d.box_format)
            if code is None:
                bad(i, ".box_format", f"must be one of {', '.join(BOX_FORMATS)}; "
                                      f"got {d.box_format!r}")
                continue
            if d.label_base not in (0, 1) or isinstance(d.label_base, bool):
                bad(i, ".label_base", f"must be 0 or 1; got {d.label_base!r}")
                continue
            b = d.boxes if isinstance(d.boxes, np.ndarray) and d.boxes.dtype == np.float64 \
                else np.asarray(d.boxes, dtype=np.float64)
            if b.ndim != 2 or b.shape[1] != 4:
                if b.size != 0:
                    bad(i, ".boxes", f"must be (n, 4), got shape {np.shape(d.boxes)}")
                    continue
                b = b.reshape(0, 4)
            m = len(b)
            lab = d.labels if isinstance(d.labels, np.ndarray) else np.asarray(d.labels)
            if lab.shape != (m,):
                if not (m == 0 and lab.size == 0):
                    bad(i, ".labels", f"{lab.size} labels for {m} boxes")
                    continue
                lab = lab.reshape(0)
            sc = None
            if d.scores is not None:
                sc = np.asarray(d.scores, dtype=np.float64)
                if sc.shape != (m,):
                    if not (m == 0 and sc.size == 0):
                        bad(i, ".scores", f"{sc.size} scores for {m} boxes")
                        continue
                    sc = sc.reshape(0)
                any_scores = True
            if code >= 3:                       # normalised: needs the image size
                size = _check_size(d.image_size if d.image_size is not None else
                                   (image_sizes[i] if image_sizes is not None else None))
                if size is None:
                    bad(i, ".image_size", f"normalised '{d.box_format}' boxes need "
                                          f"image_size (width, height) > 0")
                    continue
                sizes[i] = size
            counts.append(m)
            bases.append(d.label_base)
            fmt_code.append(code)
            box_parts.append(b)
            label_parts.append(lab)
            score_parts.append(sc)
        _raise(violations)
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        raw = np.concatenate(box_parts) if box_parts else np.zeros((0, 4))
        labels = _int_labels(np.concatenate(label_parts) if label_parts else np.zeros(0, np.int64),
                             f"{field}.labels")
        scores = np.concatenate([x if x is not None else np.full(len(b), np.nan)
                                 for x, b in zip(score_parts, box_parts, strict=True)]) \
            if any_scores else None
        base_arr = np.asarray(bases, dtype=np.int64)
        batch = cls(raw, labels, scores, offsets, base_arr, failed, ids, field)
        row_fmt = np.repeat(np.asarray(fmt_code, dtype=np.int64), counts)
        row_wh = np.repeat(sizes, counts, axis=0)
        xyxy = np.empty_like(raw)
        for code in np.unique(row_fmt).tolist():
            rows = np.flatnonzero(row_fmt == code)
            fmt = BOX_FORMATS[code]
            conv, v = _convert_rows(raw[rows], fmt, row_wh[rows] if fmt.endswith("n") else None,
                                    lambda r, rows=rows: batch.where(int(rows[r])))
            violations += v
            xyxy[rows] = conv
        _raise(violations)
        return cls(xyxy, labels, scores, offsets, base_arr, failed, ids, field)

    def take(self, index: npt.ArrayLike) -> DetectionBatch:
        """The batch of images ``index`` (in that order)."""
        idx = np.asarray(index, dtype=np.int64)
        cnt = self.counts[idx]
        starts = self.offsets[:-1][idx]
        rows = np.repeat(starts - np.concatenate([[0], np.cumsum(cnt)[:-1]]), cnt) \
            + np.arange(int(cnt.sum()))
        ids = tuple(self.image_ids[i] for i in idx.tolist()) if self.image_ids is not None \
            else None
        return DetectionBatch(self.boxes[rows], self.labels[rows],
                              None if self.scores is None else self.scores[rows],
                              np.concatenate([[0], np.cumsum(cnt)]).astype(np.int64),
                              self.label_base[idx], self.failed[idx], ids, self.field)


def _int_labels(labels: npt.ArrayLike, field: str) -> np.ndarray:
    lab = np.asarray(labels).reshape(-1)
    if lab.size == 0:
        return np.zeros(0, np.int64)
    if np.issubdtype(lab.dtype, np.integer):
        return lab.astype(np.int64)
    if np.issubdtype(lab.dtype, np.floating) and np.isfinite(lab).all() \
            and (lab == np.round(lab)).all():
        return lab.astype(np.int64)                  # e.g. a detector's float class column
    raise InvalidArgument(field, f"class labels must be integers, got dtype {lab.dtype}")


@dataclass(frozen=True, eq=False)
class DetectionMatch:
    """One image's IEEE-C4 outcome: ``object_correct[i]`` per ground-truth object,
    ``matched[i]`` the index of the prediction matched to it (-1: none), ``iou`` the
    ``(objects, predictions)`` IoU matrix, ``kept`` which predictions survived the confidence
    threshold, ``correct`` the image's verdict after IEEE-C3."""

    correct: bool
    object_correct: np.ndarray
    matched: np.ndarray
    iou: np.ndarray
    kept: np.ndarray


def _as_batch(x: DetectionBatch | Sequence[Detections], field: str,
              image_ids: Sequence[str] | None,
              sizes: Sequence[tuple[int, int] | None] | None = None) -> DetectionBatch:
    if isinstance(x, DetectionBatch):
        return x
    return DetectionBatch.from_images(x, field=field, image_ids=image_ids, image_sizes=sizes)


def _sizes_of(truths: Sequence[Detections] | DetectionBatch) -> list[tuple[int, int] | None] | None:
    if isinstance(truths, DetectionBatch):
        return None
    return [t.image_size if isinstance(t, Detections) else None for t in truths]


def detection_correct(
    truths: DetectionBatch | Sequence[Detections],
    predictions: DetectionBatch | Sequence[Detections],
    criterion: DetectionCriterion,
    *,
    label_mapping: LabelMapping | None = None,
    image_ids: Sequence[str] | None = None,
) -> np.ndarray:
    """IEEE-C4 (+ C3 over objects) for N images at once -> (N,) bool: image n of
    ``predictions`` is judged against image n of ``truths`` (every image, not only the
    first). ``label_mapping`` maps ground-truth labels to service labels (IEEE-P6)."""
    t = _as_batch(truths, "truths", image_ids)
    p = _as_batch(predictions, "predictions", image_ids, _sizes_of(truths))
    return _match_batches(t, p, criterion, label_mapping)[0]


def match_detections(truth: Detections, prediction: Detections, criterion: DetectionCriterion,
                     *, label_mapping: LabelMapping | None = None) -> DetectionMatch:
    """IEEE-C4 for one image, with the per-object details (see :class:`DetectionMatch`)."""
    t = DetectionBatch.from_images([truth], field="truth", image_ids=["0"])
    p = DetectionBatch.from_images([prediction], field="prediction", image_ids=["0"],
                                   image_sizes=[truth.image_size])
    image_ok, obj_ok, matched, kept = _match_batches(t, p, criterion, label_mapping)
    iou = _iou_matrix(t.boxes, p.boxes)
    return DetectionMatch(bool(image_ok[0]), obj_ok, matched, iou, kept)


def _iou_matrix(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    if len(x) == 0 or len(y) == 0:
        return np.zeros((len(x), len(y)))
    return _pair_iou(np.repeat(x, len(y), axis=0), np.tile(y, (len(x), 1))).reshape(len(x), len(y))


def _canonical_labels(t: DetectionBatch, p: DetectionBatch,
                      mapping: LabelMapping | None) -> tuple[np.ndarray, np.ndarray]:
    """Ground truth -> (G, A) acceptable 0-based service labels (-1 padded); predictions ->
    (P,) 0-based service labels. Checks labels against their base."""
    img_p = p.image_of_row()
    pred = p.labels - p.label_base[img_p]
    below = np.flatnonzero(pred < 0)
    if len(below):
        r = int(below[0])
        raise InvalidArgument(p.where(r, "labels"), f"label {int(p.labels[r])} is below "
                              f"label_base {int(p.label_base[img_p[r]])} (are the labels "
                              "0-indexed?)")
    img_g = t.image_of_row()
    if mapping is None:
        acc = (t.labels - t.label_base[img_g])[:, None]
        below = np.flatnonzero(acc[:, 0] < 0)
        if len(below):
            r = int(below[0])
            raise InvalidArgument(t.where(r, "labels"), f"label {int(t.labels[r])} is below "
                                  f"label_base {int(t.label_base[img_g[r]])} (are the labels "
                                  "0-indexed?)")
        return acc, pred
    mapped = mapping.map_array(t.labels, where=f"{t.field} labels")
    base = p.label_base[img_g][:, None]
    acc = np.where(mapped >= 0, mapped - base, -1)
    bad = np.argwhere((mapped >= 0) & (acc < 0))
    if len(bad):
        r = int(bad[0][0])
        raise InvalidArgument(mapping.field, f"dataset label {int(t.labels[r])} maps to service "
                              f"label {int(mapped[r, bad[0][1]])}, below the predictions' "
                              f"label_base {int(base[r, 0])}")
    return acc, pred


def _match_batches(t: DetectionBatch, p: DetectionBatch, crit: DetectionCriterion,
                   mapping: LabelMapping | None
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Vectorised greedy one-to-one matching (module docstring). Returns image verdicts (N,),
    object verdicts (G,), matched prediction row per object (G,; -1 none, rows of ``p``)
    and the kept-prediction mask (P,)."""
    n = t.n_images
    if p.n_images != n:
        raise InvalidArgument(p.field, f"{p.n_images} images of predictions for {n} images of "
                                       "ground truth")
    acc, pred_lab = _canonical_labels(t, p, mapping)
    img_p = p.image_of_row()
    keep = ~p.failed[img_p]
    conf = crit.confidence_threshold
    if conf is not None and len(img_p):
        if p.scores is None or np.isnan(p.scores[keep]).any():
            r = int(np.flatnonzero(keep & (np.isnan(p.scores) if p.scores is not None
                                           else np.ones(len(keep), bool)))[0])
            raise InvalidArgument(p.where(r, "scores"), "detection.confidence_threshold needs "
                                                        "a score for every predicted box")
        keep &= p.scores >= conf
    kept_rows = np.flatnonzero(keep)
    pc = np.bincount(img_p[kept_rows], minlength=n).astype(np.int64)
    p_off = np.concatenate([[0], np.cumsum(pc)]).astype(np.int64)
    k_boxes = p.boxes[kept_rows]
    k_lab = pred_lab[kept_rows]
    k_score = p.scores[kept_rows] if p.scores is not None else np.zeros(len(kept_rows))
    k_score = np.where(np.isnan(k_score), -np.inf, k_score)

    gc = t.counts
    n_g = int(t.offsets[-1])
    img_g = t.image_of_row()
    g_matched = np.zeros(n_g, bool)
    g_rank = np.zeros(n_g, np.int64)
    g_pred = np.full(n_g, -1, np.int64)
    p_used = np.zeros(len(kept_rows), bool)
    limit = crit.rank_limit

    pairs_per_image = gc * pc
    cum = np.cumsum(pairs_per_image)
    start_img = 0
    while start_img < n:
        base = cum[start_img - 1] if start_img else 0
        end_img = int(np.searchsorted(cum, base + _PAIR_CHUNK, side="right"))
        end_img = max(end_img, start_img + 1)
        g_lo, g_hi = int(t.offsets[start_img]), int(t.offsets[end_img])
        if g_hi > g_lo and p_off[end_img] > p_off[start_img]:
            _match_chunk(np.arange(g_lo, g_hi), img_g, t.boxes, acc, pc, p_off, k_boxes,
                         k_lab, k_score, crit.iou_threshold, limit, g_matched, g_rank, g_pred,
                         p_used)
        start_img = end_img

    # IEEE-C3 over the objects of each image
    ok_count = np.bincount(img_g, weights=g_matched, minlength=n)
    agg = crit.aggregate
    if agg.mode == "all":
        image_ok = ok_count >= gc
    else:
        image_ok = ok_count >= np.minimum(agg.q, gc)
    image_ok = np.where(gc == 0, pc == 0, image_ok) & ~p.failed
    matched_rows = np.full(n_g, -1, np.int64)
    matched_rows[g_pred >= 0] = kept_rows[g_pred[g_pred >= 0]]
    return np.asarray(image_ok, bool), g_matched, matched_rows, keep


def _match_chunk(g_rows: np.ndarray, img_g: np.ndarray, g_boxes: np.ndarray, acc: np.ndarray,
                 pc: np.ndarray, p_off: np.ndarray, k_boxes: np.ndarray, k_lab: np.ndarray,
                 k_score: np.ndarray, iou_thr: float, limit: int | None, g_matched: np.ndarray,
                 g_rank: np.ndarray, g_pred: np.ndarray, p_used: np.ndarray) -> None:
    # every (object, prediction) pair of the same image, flat
    per_g = pc[img_g[g_rows]]
    total = int(per_g.sum())
    if total == 0:
        return
    gi = np.repeat(g_rows, per_g)
    first = np.repeat(np.cumsum(per_g) - per_g, per_g)
    pj = np.repeat(p_off[img_g[g_rows]], per_g) + (np.arange(total) - first)
    iou = _pair_iou(g_boxes[gi], k_boxes[pj])
    cand = iou > iou_thr
    agree = (acc[gi] == k_lab[pj][:, None]).any(axis=1)
    if limit is None:           # threshold mode: wrong-class pairs can never matter
        cand &= agree
    gi, pj, iou, agree = gi[cand], pj[cand], iou[cand], agree[cand]
    if len(gi) == 0:
        return
    img = img_g[gi]
    order = np.lexsort((gi, pj, -k_score[pj], -iou, img))
    gi, pj, agree, img = gi[order], pj[order], agree[order], img[order]
    # position of each pair within its image's IoU-descending list
    idx = np.arange(len(gi))
    run_start = np.maximum.accumulate(np.where(np.r_[True, img[1:] != img[:-1]], idx, 0))
    pos = idx - run_start
    by_pos = np.argsort(pos, kind="stable")
    bounds = np.r_[0, np.cumsum(np.bincount(pos))]
    # lockstep greedy: step s handles the s-th pair of every image at once (an image has at
    # most one pair per step, so the fancy-indexed updates never collide)
    for step in range(len(bounds) - 1):
        b = by_pos[bounds[step]:bounds[step + 1]]
        g, q = gi[b], pj[b]
        avail = ~g_matched[g] & ~p_used[q]
        ok = avail & agree[b]
        if limit is not None:
            ok &= g_rank[g] < limit
            g_rank[g[avail]] += 1
        g_matched[g[ok]] = True
        p_used[q[ok]] = True
        g_pred[g[ok]] = q[ok]


# --------------------------------------------------------------------------------------------
# Semantic segmentation: IEEE-C5
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class SegmentationCriterion:
    """IEEE-C5 correctness of a segmentation answer, from the plan (IEEE-P3).

    ``classes``: the Y classes of interest (service label ids); ``miou_threshold``: the image
    is correct iff their mIoU exceeds it (strictly); ``ignore_label``: ground-truth pixels
    with this value are left out (``None``: none); ``all_absent``: the verdict when no class
    of interest is in the prediction or the ground truth (see the module docstring).
    """

    classes: tuple[int, ...]
    miou_threshold: float = 0.5
    ignore_label: int | None = 255
    all_absent: str = "correct"

    def __post_init__(self) -> None:
        _raise(_segmentation_violations(self.classes, self.miou_threshold, self.ignore_label,
                                        self.all_absent, "segmentation"))
        object.__setattr__(self, "classes", tuple(int(c) for c in self.classes))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *,
                  prefix: str = "segmentation") -> SegmentationCriterion:
        if not isinstance(d, Mapping):
            raise InvalidArgument(prefix, "must be a mapping with classes and miou_threshold")
        allowed = ("classes", "miou_threshold", "ignore_label", "all_absent")
        violations = [FieldViolation(f"{prefix}.{key}", f"unknown key (allowed: "
                                                        f"{', '.join(allowed)})")
                      for key in d if key not in allowed]
        if "classes" not in d:
            violations.append(FieldViolation(f"{prefix}.classes", "is required (the Y classes "
                                                                  "of interest)"))
        classes = d.get("classes", [0])
        th, ign = d.get("miou_threshold", 0.5), d.get("ignore_label", 255)
        absent = d.get("all_absent", "correct")
        violations += _segmentation_violations(classes, th, ign, absent, prefix)
        _raise(violations)
        return cls(classes=tuple(classes), miou_threshold=float(th), ignore_label=ign,
                   all_absent=absent)

    def to_dict(self) -> dict[str, Any]:
        return {"classes": list(self.classes), "miou_threshold": self.miou_threshold,
                "ignore_label": self.ignore_label, "all_absent": self.all_absent}


def _segmentation_violations(classes: Any, th: Any, ign: Any, absent: Any,
                             prefix: str) -> list[FieldViolation]:
    out: list[FieldViolation] = []
    if isinstance(classes, str | bytes) or not isinstance(classes, Sequence) or not classes \
            or not all(_is_int(c) and c >= 0 for c in classes):
        out.append(FieldViolation(f"{prefix}.classes", f"must be a non-empty list of class ids "
                                                       f">= 0; got {classes!r}"))
    elif len(set(classes)) != len(classes):
        out.append(FieldViolation(f"{prefix}.classes", "lists a class twice"))
    elif ign is not None and _is_int(ign) and ign in classes:
        out.append(FieldViolation(f"{prefix}.ignore_label", f"{ign} is also a class of interest"))
    if not _is_number(th) or not 0.0 <= th < 1.0:
        out.append(FieldViolation(f"{prefix}.miou_threshold", f"must be a number in [0, 1); "
                                                              f"got {th!r}"))
    if ign is not None and not _is_int(ign):
        out.append(FieldViolation(f"{prefix}.ignore_label", f"must be an integer or null; "
                                                            f"got {ign!r}"))
    if absent not in ALL_ABSENT_POLICIES:
        out.append(FieldViolation(f"{prefix}.all_absent", f"must be one of "
                                                          f"{', '.join(ALL_ABSENT_POLICIES)}; "
                                                          f"got {absent!r}"))
    return out


@dataclass(frozen=True, kw_only=True, eq=False)
class SegmentationPrediction:
    """One answer of a segmentation service: an ``(H, W)`` integer label ``mask``, or per-class
    ``scores`` in ``layout`` ``"chw"`` (C, H, W) or ``"hwc"`` (H, W, C) reduced by argmax
    (IEEE-C5: per-pixel top-1). ``error``: the query failed (the image is incorrect)."""

    mask: npt.ArrayLike | None = None
    scores: npt.ArrayLike | None = None
    layout: str = "chw"
    error: str | None = None

    def label_map(self, *, field: str = "prediction") -> np.ndarray:
        if (self.mask is None) == (self.scores is None):
            raise InvalidArgument(field, "give exactly one of mask and scores")
        if self.mask is not None:
            return np.asarray(self.mask)
        return masks_from_scores(np.asarray(self.scores)[None], layout="n" + self.layout,
                                 field=f"{field}.scores")[0]


def masks_from_scores(scores: npt.ArrayLike, *, layout: str = "nchw",
                      field: str = "scores") -> np.ndarray:
    """Per-class score maps ``(N, C, H, W)`` (``nchw``) or ``(N, H, W, C)`` (``nhwc``) ->
    ``(N, H, W)`` int64 label maps by per-pixel argmax (ties: lower class index)."""
    sc = np.asarray(scores)
    if layout not in ("nchw", "nhwc"):
        raise InvalidArgument(f"{field}.layout", f"must be nchw or nhwc; got {layout!r}")
    if sc.ndim != 4 or sc.size == 0:
        raise InvalidArgument(field, f"must be 4-D {layout}, got shape {sc.shape}")
    if np.issubdtype(sc.dtype, np.floating) and np.isnan(sc).any():
        raise InvalidArgument(field, "scores contain NaN")
    return np.asarray(sc.argmax(axis=1 if layout == "nchw" else 3)).astype(np.int64)


def _mask_list(masks: npt.ArrayLike | Sequence[npt.ArrayLike], field: str) -> list[np.ndarray]:
    if isinstance(masks, np.ndarray):
        if masks.ndim == 2:
            return [masks]
        if masks.ndim == 3:
            return list(masks)
        raise InvalidArgument(field, f"must be (H, W) or (N, H, W) label maps, got shape "
                                     f"{masks.shape}")
    if not isinstance(masks, Sequence):
        raise InvalidArgument(field, "must be an array of label maps or a list of them")
    return [np.asarray(m) for m in masks]


def _stacked(masks: npt.ArrayLike | Sequence[npt.ArrayLike]) -> np.ndarray | None:
    if isinstance(masks, np.ndarray) and masks.ndim == 3:
        return masks
    return None


def _class_index(x: np.ndarray, classes_sorted: np.ndarray) -> np.ndarray:
    """Label map -> slot of each pixel's class among the classes of interest (Y: any other).
    A lookup table when the labels are small non-negative integers (one gather per pixel),
    else a binary search."""
    y = len(classes_sorted)
    dtype = np.uint8 if y < 250 else np.int64       # slots 0..Y+1 (see _seg_iou_block)
    if x.size == 0:
        return np.zeros(x.shape, dtype)
    lo, hi = int(x.min()), int(x.max())
    if lo >= 0 and hi < (1 << 16):
        lut = np.full(hi + 1, y, dtype=dtype)
        inside = classes_sorted[classes_sorted <= hi]
        lut[inside] = np.searchsorted(classes_sorted, inside)
        return np.asarray(lut[x])
    pos = np.minimum(np.searchsorted(classes_sorted, x), y - 1)
    return np.where(classes_sorted[pos] == x, pos, y).astype(dtype)


def segmentation_iou(
    predictions: npt.ArrayLike | Sequence[npt.ArrayLike],
    truths: npt.ArrayLike | Sequence[npt.ArrayLike],
    criterion: SegmentationCriterion,
    *,
    label_mapping: LabelMapping | None = None,
    image_ids: Sequence[str] | None = None,
    field: str = "predictions",
) -> np.ndarray:
    """Per-image, per-class IoU ``(N, Y)`` (columns in ``criterion.classes`` order; NaN where
    the class is absent from both prediction and ground truth). ``predictions`` and
    ``truths``: ``(N, H, W)`` integer label maps, one ``(H, W)`` map, or sequences of
    ``(H, W)`` maps (sizes may differ between images, never between an image's prediction and
    truth). ``label_mapping`` (IEEE-P6, one-to-one only) maps ground-truth labels to service
    labels; ``ignore_label`` pixels are left out. Three bincounts per chunk: no per-class loop."""
    classes = np.array(criterion.classes, dtype=np.int64)
    order = np.argsort(classes)
    cs = classes[order]
    y = len(cs)
    if label_mapping is not None and not label_mapping.one_to_one:
        raise InvalidArgument(label_mapping.field, "a segmentation label mapping must map each "
                                                   "dataset label to exactly one service label")
    ps, ts = _stacked(predictions), _stacked(truths)
    if ps is not None and ts is not None and ps.shape == ts.shape:
        _check_int(ps, field, image_ids, None)
        _check_int(ts, "truths", image_ids, None)
        out = np.empty((len(ps), y))
        for ch in _chunks(len(ps), ps.shape[1] * ps.shape[2] + y + 2):
            out[ch] = _seg_iou_block(ps[ch], _mapped(ts[ch], label_mapping, criterion), cs,
                                     criterion.ignore_label)
    else:
        pl, tl = _mask_list(predictions, field), _mask_list(truths, "truths")
        if len(pl) != len(tl):
            raise InvalidArgument(field, f"{len(pl)} predictions for {len(tl)} truths")
        groups: dict[tuple[int, ...], list[int]] = {}
        for n, (pm, tm) in enumerate(zip(pl, tl, strict=True)):
            _check_int(pm, field, image_ids, n)
            _check_int(tm, "truths", image_ids, n)
            if pm.shape != tm.shape or pm.ndim != 2:
                raise InvalidArgument(f"{field}[{_image_name(image_ids, n)}]",
                                      f"label map of shape {pm.shape} for a ground truth of "
                                      f"shape {tm.shape} (both must be the same (H, W))")
            groups.setdefault(pm.shape, []).append(n)
        out = np.empty((len(pl), y))
        for shape, members in groups.items():       # same-size images go through as one stack
            for ch in _chunks(len(members), int(np.prod(shape)) + y + 2):
                rows = members[ch]
                out[rows] = _seg_iou_block(
                    np.stack([pl[r] for r in rows]),
                    _mapped(np.stack([tl[r] for r in rows]), label_mapping, criterion), cs,
                    criterion.ignore_label)
    inverse = np.empty(y, dtype=np.int64)
    inverse[order] = np.arange(y)
    return np.asarray(out[:, inverse])


def _check_int(m: np.ndarray, field: str, image_ids: Sequence[str] | None, n: int | None) -> None:
    if m.dtype.kind not in "iu":
        where = field if n is None else f"{field}[{_image_name(image_ids, n)}]"
        raise InvalidArgument(where, f"label maps must be integers, got dtype {m.dtype} (give "
                                     "per-class scores as SegmentationPrediction.scores)")


def _mapped(truth: np.ndarray, mapping: LabelMapping | None,
            crit: SegmentationCriterion) -> np.ndarray:
    if mapping is None:
        return truth
    return mapping.map_array(truth, where="truths", ignore=crit.ignore_label)[..., 0]


def _seg_iou_block(pred: np.ndarray, truth: np.ndarray, cs: np.ndarray,
                   ignore: int | None) -> np.ndarray:
    """(n, H, W) label maps -> (n, Y) IoU per class of interest (NaN: absent from both).

    Each pixel gets a slot: its class's index among the Y classes, Y for "any other label",
    Y + 1 for "ignored". Few classes: one bincount of (image, truth slot, prediction slot)
    gives per-image confusion matrices. Many classes: three bincounts (truth count,
    prediction count, intersection), O(pixels + n * Y). No loop over classes or images."""
    n = len(pred)
    y = len(cs)
    w = y + 2
    t = truth.reshape(n, -1)
    gi = _class_index(t, cs)
    pi = _class_index(pred.reshape(n, -1), cs)
    if ignore is not None and t.size and int(t.min()) <= ignore <= int(t.max()):
        skip = t == ignore
        gi[skip] = y + 1
        pi[skip] = y + 1
    if w * w <= 256:
        code = gi.astype(np.uint16)
        code *= w
        code += pi
        flat = np.add(code, (np.arange(n, dtype=np.int64) * (w * w))[:, None], dtype=np.int64)
        conf = np.bincount(flat.ravel(), minlength=n * w * w).reshape(n, w, w)
        inter = np.diagonal(conf, axis1=1, axis2=2)[:, :y].astype(np.float64)
        gt_count = conf[:, :y, :].sum(axis=2)
        pred_count = conf[:, :, :y].sum(axis=1)
    else:
        base = (np.arange(n, dtype=np.int64) * w)[:, None]
        code_g = np.add(gi, base, dtype=np.int64).ravel()
        code_p = np.add(pi, base, dtype=np.int64).ravel()
        size = n * w
        gt_count = np.bincount(code_g, minlength=size).reshape(n, w)[:, :y]
        pred_count = np.bincount(code_p, minlength=size).reshape(n, w)[:, :y]
        same = (gi == pi).ravel()
        inter = np.bincount(code_g[same], minlength=size).reshape(n, w)[:, :y].astype(np.float64)
    union = gt_count + pred_count - inter
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(union > 0, inter / np.maximum(union, 1), np.nan)


def segmentation_miou(
    predictions: npt.ArrayLike | Sequence[npt.ArrayLike],
    truths: npt.ArrayLike | Sequence[npt.ArrayLike],
    criterion: SegmentationCriterion,
    *,
    label_mapping: LabelMapping | None = None,
    image_ids: Sequence[str] | None = None,
    field: str = "predictions",
) -> np.ndarray:
    """Per-image mIoU over the classes of interest present in prediction or truth (N,);
    NaN when none is (IEEE-C5)."""
    iou = segmentation_iou(predictions, truths, criterion, label_mapping=label_mapping,
                           image_ids=image_ids, field=field)
    present = ~np.isnan(iou)
    count = present.sum(axis=1)
    total = np.where(present, iou, 0.0).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.asarray(np.where(count > 0, total / np.maximum(count, 1), np.nan))


def segmentation_correct(
    predictions: npt.ArrayLike | Sequence[npt.ArrayLike],
    truths: npt.ArrayLike | Sequence[npt.ArrayLike],
    criterion: SegmentationCriterion,
    *,
    label_mapping: LabelMapping | None = None,
    failed: npt.ArrayLike | None = None,
    image_ids: Sequence[str] | None = None,
    field: str = "predictions",
) -> np.ndarray:
    """IEEE-C5 for N images -> (N,) bool: mIoU over the classes of interest > threshold;
    all classes absent -> ``criterion.all_absent``; ``failed`` images are incorrect."""
    miou = segmentation_miou(predictions, truths, criterion, label_mapping=label_mapping,
                             image_ids=image_ids, field=field)
    absent_ok = criterion.all_absent == "correct"
    ok = np.where(np.isnan(miou), absent_ok, miou > criterion.miou_threshold)
    if failed is not None:
        ok &= ~np.asarray(failed, dtype=bool).reshape(len(ok))
    return np.asarray(ok, dtype=bool)
