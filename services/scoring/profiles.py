"""Degradation profiles and failure points (DEG-2..DEG-4), after Swingler, "A Suite of
Incremental Image Degradation Operators for Testing Image Classification Algorithms" (seed 001).

Pure domain code (no gRPC), vectorised with numpy; results are plain JSON-able dicts. Works for
the incremental degradation operators (levels 0..30) and for any corruption with severities
(level = severity, level 0 = the clean image).

Inputs (per operator)
---------------------
* ``image_ids``: M distinct ids; ``true_labels``: (M,) int class indices.
* ``labels[level]``: (M, K) int array, row i = the labels the target returned for image i at
  that level, best first, padded at the end with -1 (a labels-only top-1 target: K = 1, or an
  (M,) array). A row with no label (failed query) is all -1.
* ``probs[level]`` (optional): (M, C) probabilities by class index, NaN = class not returned.
  :func:`fortis.services.scoring.ranking.prediction_arrays` builds both from ClassPredictions.
* Every level needs labels or probs; level 0 (the undegraded image) is required.
* ``changes[level]`` (optional): the change made at that level, passed through to the report
  and the failure points (DEG-4): a number (e.g. the mean of
  ``services.perturbation.degradation.fraction_changed``), a string, a JSON-able mapping or an
  object with ``as_dict()`` (``LevelChange``), or an (M,) numeric array of per-image values,
  reported as ``{"mean": mean over the DEG-3 images, "example": the example image's value}``.

What is computed
----------------
* DEG-3: only the images the target classifies correctly (top-1) at level 0 are used, at every
  level. ``m`` counts all images, ``m_used`` the level-0-correct ones.
* DEG-2, three profiles against level:
  - accuracy: top-1 accuracy over the DEG-3 images, with a 95 % Wilson interval
    (``ieee.wilson_interval``, IEEE-M8). Level 0 is 1.0 by construction.
  - rank: mean 0-based rank of the true label (0 = top, the seed's convention). The rank comes
    from ``labels`` when given for the level (the target's own order), else from ``probs``
    (descending probability, equal probabilities ordered by class index -- a stable sort;
    :func:`~fortis.services.scoring.ranking.rank_of_class`). When the target returned only a
    top-k list without the true label, that image's rank is only known to be >= k (k = the
    number of labels it returned): the mean rank is then *not applicable* (``value`` None) and
    ``at_least`` gives the mean with each such rank counted as k, a lower bound on the true
    mean; ``censored`` counts those images. A failed query (no label) is counted the same way
    (rank >= 0, i.e. unknown) and is incorrect.
  - probability: mean probability of the true label; needs ``probs`` with the true label's
    probability present for every DEG-3 image (a labels-only target, or a top-k list without
    the true label, gives ``value`` None with the reason -- never 0).
* DEG-4, failure points: for each threshold t (default 0.9, 0.5, 0.1) the first level > 0 (in
  increasing order) whose accuracy is strictly below t, with its accuracy, the change made at
  that level and an example image: the first DEG-3 image (in ``image_ids`` order) that is wrong
  at that level but was right at the previous level, or, if none flipped there, the first one
  wrong at that level. ``None`` when accuracy never drops below t at the levels given.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from fortis.services.common.errors import FieldViolation, InvalidArgument
from fortis.services.scoring.ieee import wilson_interval
from fortis.services.scoring.ranking import rank_of_class

__all__ = ["FAILURE_THRESHOLDS", "degradation_profile", "degradation_profiles"]

#: DEG-4: accuracy thresholds of the failure points (seed 001 section 3.1 and Figs. 7-9).
FAILURE_THRESHOLDS: tuple[float, ...] = (0.9, 0.5, 0.1)

DEFINITIONS = {
    "accuracy": "top-1 accuracy on the images correct at level 0 (DEG-2, DEG-3), 95 % Wilson "
                "interval (IEEE-M8)",
    "rank": "mean 0-based rank of the true label (0 = top) on the images correct at level 0; "
            "None when a top-k answer lacked the true label (then at_least is a lower bound, "
            "such ranks counted as k) (DEG-2)",
    "probability": "mean probability of the true label on the images correct at level 0; None "
                   "without full scores for the true label (DEG-2)",
    "failure_point": "first level whose accuracy is strictly below the threshold, with the "
                     "change made at that level and an example image (DEG-4)",
}


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------


def _level_key(key: Any, field: str) -> int:
    if isinstance(key, bool):
        raise InvalidArgument(field, f"level must be an integer >= 0; got {key!r}")
    try:
        lv = int(key)
        if str(lv) != str(key).strip() and not isinstance(key, int | np.integer):
            raise ValueError
    except (TypeError, ValueError):
        raise InvalidArgument(field, f"level must be an integer >= 0; got {key!r}") from None
    if lv < 0:
        raise InvalidArgument(field, f"level must be an integer >= 0; got {key!r}")
    return lv


def _by_level(d: Mapping[Any, Any] | None, field: str) -> dict[int, Any]:
    if d is None:
        return {}
    if not isinstance(d, Mapping):
        raise InvalidArgument(field, "must map level -> array")
    out: dict[int, Any] = {}
    for key, value in d.items():
        lv = _level_key(key, f"{field}.{key}")
        if lv in out:
            raise InvalidArgument(f"{field}.{lv}", "level given twice")
        out[lv] = value
    return out


def _int_array(x: Any, field: str) -> np.ndarray:
    a = np.asarray(x)
    if a.dtype.kind == "f" and a.size and np.all(np.isfinite(a)) and np.all(a == np.round(a)):
        a = a.astype(np.int64)
    if a.size and a.dtype.kind not in "iu":
        raise InvalidArgument(field, f"must hold integer class indices; got dtype {a.dtype}")
    return a.astype(np.int64)


def _labels_matrix(x: Any, field: str, m: int, c: int | None) -> np.ndarray:
    a = _int_array(x, field)
    if a.ndim == 1:
        a = a[:, None]
    if a.ndim != 2 or a.shape[0] != m or a.shape[1] < 1:
        raise InvalidArgument(field, f"must have shape ({m}, K) with K >= 1 (ranked labels, "
                                     f"-1 = padding); got shape {a.shape}")
    if (a < -1).any() or (c is not None and (a >= c).any()):
        hi = "" if c is None else f", < {c}"
        raise InvalidArgument(field, f"labels must be class indices >= 0{hi} (or -1 = padding)")
    if a.shape[1] > 1 and ((a[:, 1:] >= 0) & (a[:, :-1] < 0)).any():
        raise InvalidArgument(field, "padding (-1) may only follow the returned labels")
    return a


def _probs_matrix(x: Any, field: str, m: int) -> np.ndarray:
    try:
        a = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(field, f"must be a numeric array: {exc}") from None
    if a.ndim != 2 or a.shape[0] != m or a.shape[1] < 1:
        raise InvalidArgument(field, f"must have shape ({m}, C); got shape {a.shape}")
    with np.errstate(invalid="ignore"):
        bad = np.isinf(a) | (a < 0.0) | (a > 1.0)
    if bad.any():
        raise InvalidArgument(field, "probabilities must lie in [0, 1] (NaN = not returned)")
    return a


def _thresholds(values: Any) -> tuple[float, ...]:
    try:
        ts = tuple(values)
    except TypeError:
        raise InvalidArgument("thresholds", "must be a sequence of accuracies in (0, 1]") from None
    for t in ts:
        if (isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t)
                or not 0.0 < t <= 1.0):
            raise InvalidArgument("thresholds", f"each must lie in (0, 1]; got {t!r}")
    if not ts:
        raise InvalidArgument("thresholds", "at least one threshold is needed")
    return tuple(float(t) for t in ts)


# --------------------------------------------------------------------------------------------
# Per level
# --------------------------------------------------------------------------------------------


def _ranks_from_labels(lab: np.ndarray, truth: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """0-based rank of the true label and whether it is exact; when the true label is absent
    the rank is the number of labels returned (a lower bound)."""
    hit = lab == truth[:, None]
    found = hit.any(axis=1)
    n_ret = (lab >= 0).sum(axis=1)
    return np.where(found, hit.argmax(axis=1), n_ret), found


def _change(value: Any, field: str, m: int, used: np.ndarray, example: int | None) -> Any:
    if value is None or isinstance(value, str | bool):
        return value
    if isinstance(value, int | float | np.integer | np.floating):
        return value.item() if isinstance(value, np.generic) else value
    if hasattr(value, "as_dict") and callable(value.as_dict):
        return value.as_dict()
    if isinstance(value, Mapping):
        return dict(value)
    try:
        a = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise InvalidArgument(field, "must be a number, string, mapping, object with as_dict() "
                                     f"or an array of {m} per-image numbers") from None
    if a.shape != (m,):
        raise InvalidArgument(field, f"a per-image array must have shape ({m},); got {a.shape}")
    sub = a[used]
    return {"mean": float(sub.mean()) if sub.size else None,
            "example": None if example is None else float(a[example])}


def _mean(a: np.ndarray) -> float | None:
    return float(a.mean()) if a.size else None


def degradation_profile(*, image_ids: Sequence[str], true_labels: Any,
                        labels: Mapping[Any, Any] | None = None,
                        probs: Mapping[Any, Any] | None = None,
                        changes: Mapping[Any, Any] | None = None,
                        thresholds: Sequence[float] = FAILURE_THRESHOLDS,
                        num_classes: int | None = None) -> dict[str, Any]:
    """The three degradation profiles (DEG-2) on the level-0-correct images (DEG-3) and the
    failure points (DEG-4) of one operator (or corruption). Input formats: module docstring.

    Returns {applicable, reason, m, m_used, levels, accuracy: [{level, value, ci95, m,
    correct}], rank: [{level, value, at_least, censored, n, source, reason}], probability:
    [{level, value, n, missing, reason}], changes: [{level, change}], failure_points: {"0.9":
    {threshold, level, accuracy, ci95, change, example_image} | None, ...}, definitions}.
    Thresholds are keyed by ``str(t)`` so the tree survives a JSON round trip.
    """
    ids = [str(i) for i in image_ids]
    m = len(ids)
    if m == 0:
        raise InvalidArgument("image_ids", "at least one image is needed")
    if len(set(ids)) != m:
        dup = sorted(i for i, k in Counter(ids).items() if k > 1)
        raise InvalidArgument("image_ids", f"duplicate image ids: {', '.join(dup[:10])}")
    ths = _thresholds(thresholds)
    c: int | None = None
    if num_classes is not None:
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
            raise InvalidArgument("num_classes", f"must be an integer >= 1; got {num_classes!r}")
        c = num_classes
    by_probs = {lv: _probs_matrix(v, f"probs.{lv}", m) for lv, v in _by_level(probs, "probs")
                .items()}
    widths = {a.shape[1] for a in by_probs.values()}
    if len(widths) > 1 or (c is not None and widths and widths != {c}):
        raise InvalidArgument("probs", f"every level needs the same number of classes "
                                       f"{'(num_classes = ' + str(c) + ')' if c else ''}; got "
                                       f"{sorted(widths)}")
    if c is None and widths:
        c = widths.pop()
    by_labels = {lv: _labels_matrix(v, f"labels.{lv}", m, c)
                 for lv, v in _by_level(labels, "labels").items()}
    truth = _int_array(true_labels, "true_labels")
    if truth.shape != (m,):
        raise InvalidArgument("true_labels", f"must have shape ({m},); got {truth.shape}")
    if (truth < 0).any() or (c is not None and (truth >= c).any()):
        raise InvalidArgument("true_labels", "must be class indices in [0, C)")
    levels = sorted(set(by_labels) | set(by_probs))
    if 0 not in levels:
        raise InvalidArgument("probs" if by_probs and not by_labels else "labels",
                              "level 0 (the undegraded images) is needed for DEG-3")
    by_changes = _by_level(changes, "changes")
    unknown = [FieldViolation(f"changes.{lv}", "no predictions at this level")
               for lv in by_changes if lv not in levels]
    if unknown:
        raise InvalidArgument.from_violations(unknown)

    # Ranks, exactness, correctness and true-label probability per level (all M images).
    rank: dict[int, np.ndarray] = {}
    exact: dict[int, np.ndarray] = {}
    p_true: dict[int, np.ndarray | None] = {}
    for lv in levels:
        if lv in by_labels:
            rank[lv], exact[lv] = _ranks_from_labels(by_labels[lv], truth)
        else:
            rank[lv], exact[lv], _ = rank_of_class(by_probs[lv], truth)
        p_true[lv] = by_probs[lv][np.arange(m), truth] if lv in by_probs else None
    correct = {lv: exact[lv] & (rank[lv] == 0) for lv in levels}

    used = np.flatnonzero(correct[0])  # DEG-3
    n = int(used.size)
    out: dict[str, Any] = {"m": m, "m_used": n, "levels": levels, "definitions": DEFINITIONS,
                           "thresholds": list(ths)}
    reason = None if n else ("no image is classified correctly at level 0: nothing to "
                             "profile (DEG-3)")
    out["applicable"] = n > 0
    out["reason"] = reason

    acc_rows: list[dict[str, Any]] = []
    rank_rows: list[dict[str, Any]] = []
    prob_rows: list[dict[str, Any]] = []
    acc: dict[int, float | None] = {}
    for lv in levels:
        k = int(correct[lv][used].sum())
        lo, hi = wilson_interval(k, n)
        acc[lv] = k / n if n else None
        acc_rows.append({"level": lv, "value": acc[lv], "ci95": [lo, hi], "m": n, "correct": k})

        r, ex = rank[lv][used], exact[lv][used]
        censored = int((~ex).sum())
        source = "labels" if lv in by_labels else "probs"
        rank_reason = reason if not n else None if not censored else (
            f"{censored} image(s) without the true label in a top-k answer: their rank is only "
            "known to be >= k, so the mean rank is not applicable (at_least is a lower bound)")
        rank_rows.append({
            "level": lv, "value": _mean(r.astype(np.float64)) if censored == 0 else None,
            "at_least": _mean(r.astype(np.float64)), "censored": censored, "n": n,
            "source": source, "reason": rank_reason})

        pt = p_true[lv]
        if pt is None:
            prob_rows.append({"level": lv, "value": None, "n": n, "missing": n,
                              "reason": reason or "no scores at this level (labels-only "
                                                  "target): probability not applicable"})
        else:
            sub = pt[used]
            missing = int(np.isnan(sub).sum())
            prob_reason = reason if not n else None if not missing else (
                f"{missing} image(s) without a score for the true label (top-k answer): the "
                "mean probability is not applicable")
            prob_rows.append({"level": lv, "value": _mean(sub) if missing == 0 else None,
                              "n": n, "missing": missing, "reason": prob_reason})
    out["accuracy"] = acc_rows
    out["rank"] = rank_rows
    out["probability"] = prob_rows

    # DEG-4 failure points.
    fps: dict[str, Any] = {}
    first_example: dict[int, int] = {}
    for t in ths:
        fp = None
        for j, lv in enumerate(levels):
            a = acc[lv]
            if lv == 0 or a is None or a >= t:
                continue
            wrong = used[~correct[lv][used]]
            flipped = wrong[correct[levels[j - 1]][wrong]]
            ex_idx = int(flipped[0]) if flipped.size else int(wrong[0])
            first_example[lv] = ex_idx
            change = _change(by_changes.get(lv), f"changes.{lv}", m, used, ex_idx)
            fp = {"threshold": t, "level": lv, "accuracy": a, "ci95": acc_rows[j]["ci95"],
                  "change": change, "example_image": ids[ex_idx]}
            break
        fps[str(t)] = fp
    out["failure_points"] = fps
    out["changes"] = [{"level": lv, "change": _change(by_changes[lv], f"changes.{lv}", m, used,
                                                      first_example.get(lv))}
                      for lv in levels if lv in by_changes]
    return out


def degradation_profiles(operators: Mapping[str, Mapping[str, Any]], *,
                         image_ids: Sequence[str], true_labels: Any,
                         thresholds: Sequence[float] = FAILURE_THRESHOLDS,
                         num_classes: int | None = None) -> dict[str, Any]:
    """:func:`degradation_profile` for several operators (DEG-2..DEG-4) plus the mean of each
    profile over the operators at each level (the seed's Figs. 1-3).

    ``operators[name]`` is a mapping with the keys ``labels``, ``probs`` and ``changes`` (any
    may be absent) as for :func:`degradation_profile`; every operator includes level 0. An
    invalid field is named ``operators.<name>.<field>``. Returns {operators: {name: profile},
    average: {accuracy, rank, probability: [{level, value, n_operators}]}}; an average over the
    operators whose value at that level is not None (``n_operators``), None if there is none.
    """
    if not isinstance(operators, Mapping) or not operators:
        raise InvalidArgument("operators", "must map at least one operator name -> predictions")
    out: dict[str, Any] = {}
    for name, spec in operators.items():
        if not isinstance(spec, Mapping):
            raise InvalidArgument(f"operators.{name}", "must be a mapping (labels, probs, changes)")
        bad = [FieldViolation(f"operators.{name}.{key}", "unknown key (allowed: labels, probs, "
                                                         "changes)")
               for key in spec if key not in ("labels", "probs", "changes")]
        if bad:
            raise InvalidArgument.from_violations(bad)
        try:
            out[name] = degradation_profile(
                image_ids=image_ids, true_labels=true_labels, labels=spec.get("labels"),
                probs=spec.get("probs"), changes=spec.get("changes"), thresholds=thresholds,
                num_classes=num_classes)
        except InvalidArgument as exc:
            prefixed = [FieldViolation(v.field if v.field in ("image_ids", "true_labels",
                                                              "thresholds", "num_classes")
                                       else f"operators.{name}.{v.field}", v.description)
                        for v in exc.violations]
            raise InvalidArgument.from_violations(prefixed) from None
    average: dict[str, list[dict[str, Any]]] = {}
    for profile in ("accuracy", "rank", "probability"):
        values: dict[int, list[float]] = {}
        for prof in out.values():
            for row in prof[profile]:
                values.setdefault(row["level"], [])
                if row["value"] is not None:
                    values[row["level"]].append(row["value"])
        average[profile] = [{"level": lv, "value": float(np.mean(v)) if v else None,
                             "n_operators": len(v)} for lv, v in sorted(values.items())]
    return {"operators": out, "average": average}
