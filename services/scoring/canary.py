"""CANARY metrics (seed 003: Sun et al., "CANARY: An Adversarial Robustness Evaluation Platform
for Deep Learning Models on Image Classification", Electronics 12(17) 3665, 2023, section 3.1).

Pure domain code (no gRPC), vectorised with numpy (and torch for the image metrics in
:mod:`fortis.services.scoring.canary_images`, re-exported here):

    CAN-1  model_capability        CA, CF, CC
    CAN-2  attack_effect           MR, TAS, AIAC, ARTC, ACAMC-A/T (white-box), OTR
           observable_transfer_rate, acamc, grad_cam
    CAN-3  attack_cost, ctc_grades CTC (seconds + 5-level grade), QNC-F, QNC-B
    CAN-4  perturbation_cost       AMD, AED, APCR, AED-FD L/H, ALMS (MS-GMSD), ADMS (DISTS)
    CAN-5  defence_effect          AV/FV/CV, RR/SR, ACV, ARAC/AITC

Inputs: ``labels`` are N integer class indices; a model's answers on N images are either an
N x K probability matrix (the softmax P; the predicted class F(x) is its arg-max, ties to
the lowest index) or, for a labels-only target, N predicted labels (the confidence metrics
are then "not available"). Images are N x H x W x C, uint8 or float in [0, 1].

Output: plain JSON-able dicts. Every metric is a node ``{"value", "n", "status", "reason",
...}`` with ``status`` one of ``"ok"``, ``"not available"`` (an input it needs is missing:
scores, a white-box model, DISTS weights, timings, ledger counts) or ``"not applicable"``
(no meaning here: untargeted attack for TAS, no other model for OTR, no correctly
classified image); ``value`` is then ``None``, never 0.

Where the paper's typesetting leaves a sign or a normaliser open, the reading implemented
is stated at the function (the authors' code, Canary_Master/canary_sefi, was the tie-break).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from fortis.services.common.errors import InvalidArgument
from fortis.services.scoring.canary_images import (
    MS_GMSD_MIN_SIZE,
    MS_GMSD_SCALE_WEIGHTS,
    NOT_APPLICABLE,
    NOT_AVAILABLE,
    OK,
    DistsModel,
    WhiteBoxModel,
    acamc,
    check_mask,
    cosine_similarity,
    grad_cam,
    haar_dwt2,
    haar_idwt2,
    haar_split,
    load_dists,
    mean_node,
    missing_node,
    ms_gmsd,
    ok_node,
    perturbation_cost,
    resolve_layer,
)

__all__ = [
    "ACV_METRICS",
    "ATTACK_KINDS",
    "BLACK_BOX_KINDS",
    "CTC_GRADES",
    "MS_GMSD_MIN_SIZE",
    "MS_GMSD_SCALE_WEIGHTS",
    "NOT_APPLICABLE",
    "NOT_AVAILABLE",
    "OK",
    "DistsModel",
    "WhiteBoxModel",
    "acamc",
    "attack_cost",
    "attack_effect",
    "cosine_similarity",
    "ctc_grades",
    "defence_effect",
    "grad_cam",
    "haar_dwt2",
    "haar_idwt2",
    "haar_split",
    "load_dists",
    "macro_f1",
    "model_capability",
    "ms_gmsd",
    "observable_transfer_rate",
    "perturbation_cost",
    "resolve_layer",
    "successful_examples",
]

#: CAN-3: the paper's five CTC levels, fastest first (Table 5).
CTC_GRADES = ("Very Fast", "Fast", "Normal", "Slow", "Very Slow")
#: Attack kinds: the paper's white-box / transferable black-box / query black-box, with the
#: query kinds named as in Fortis's catalogue (score- and decision-based).
ATTACK_KINDS = ("white-box", "transfer", "score", "decision", "black-box")
#: Kinds that only query the target: QNC-B must be 0 (CAN-3).
BLACK_BOX_KINDS = ("score", "decision", "black-box")
#: CAN-5 ACV: X_Def - X_Ori for these attack metrics (paper 3.1.4).
ACV_METRICS = ("MR", "AMD", "AED", "APCR", "ADMS", "ALMS")

_PROB_TOL = 1e-6


# --------------------------------------------------------------------------------------------
# Input checks
# --------------------------------------------------------------------------------------------


def _labels(labels: Any, field: str = "labels") -> np.ndarray:
    y = np.asarray(labels)
    if y.ndim != 1 or y.size == 0:
        raise InvalidArgument(field, f"must be a non-empty vector of class indices; got shape "
                                     f"{y.shape}")
    if y.dtype == np.bool_ or not np.issubdtype(y.dtype, np.integer):
        raise InvalidArgument(field, f"must be integer class indices; got dtype {y.dtype}")
    if int(y.min()) < 0:
        raise InvalidArgument(field, "class indices must be >= 0")
    return y.astype(np.int64)


def _answers(answers: Any, field: str, n: int) -> tuple[np.ndarray, np.ndarray | None]:
    """N x K probabilities -> (arg-max labels, probabilities); N labels -> (labels, None)."""
    a = np.asarray(answers)
    if a.ndim == 1:
        return _labels(a, field), None
    if a.ndim != 2 or a.shape[1] == 0:
        raise InvalidArgument(field, f"must be N x K probabilities or N predicted labels; got "
                                     f"shape {a.shape}")
    if a.shape[0] != n:
        raise InvalidArgument(field, f"{a.shape[0]} rows for {n} images")
    if a.dtype == np.bool_ or not np.issubdtype(a.dtype, np.number):
        raise InvalidArgument(field, f"must be numeric; got dtype {a.dtype}")
    p = a.astype(np.float64)
    if not np.all(np.isfinite(p)):
        raise InvalidArgument(field, "contains NaN or infinite values")
    if float(p.min()) < -_PROB_TOL or float(p.max()) > 1.0 + _PROB_TOL:
        raise InvalidArgument(field, "probabilities must lie in [0, 1] (softmax output, not "
                                     "logits)")
    return p.argmax(axis=1).astype(np.int64), p


def _check_len(arr: np.ndarray, field: str, n: int) -> None:
    if arr.shape[0] != n:
        raise InvalidArgument(field, f"{arr.shape[0]} entries for {n} images")


def _check_in_classes(y: np.ndarray, probs: np.ndarray | None, field: str) -> None:
    if probs is not None and int(y.max()) >= probs.shape[1]:
        raise InvalidArgument(field, f"class index {int(y.max())} outside the {probs.shape[1]} "
                                     "classes of the probability matrix")


def _rows(probs: np.ndarray, cols: np.ndarray) -> np.ndarray:
    return probs[np.arange(len(cols)), cols]


# --------------------------------------------------------------------------------------------
# CAN-1 model capability
# --------------------------------------------------------------------------------------------


def macro_f1(labels: Any, predicted: Any) -> float:
    """Macro F1 (CF, CAN-1): the mean over classes of ``2 TP / (2 TP + FP + FN)`` (= 2 P R /
    (P + R)), over the classes present in the labels or the predictions (scikit-learn's
    ``f1_score(average="macro")``, which the authors' code calls)."""
    y = _labels(labels)
    p = _labels(predicted, "predicted")
    _check_len(p, "predicted", len(y))
    size = int(max(y.max(), p.max())) + 1
    tp = np.bincount(y[y == p], minlength=size).astype(np.float64)
    fp = np.bincount(p, minlength=size) - tp
    fn = np.bincount(y, minlength=size) - tp
    present = np.union1d(y, p)
    return float(np.mean(2 * tp[present] / (2 * tp[present] + fp[present] + fn[present])))


def model_capability(labels: Any, clean: Any) -> dict[str, Any]:
    """CAN-1 (paper 3.1.1) on the clean test set of N images:

    - CA = 1/n sum_i [F(x_i) = y_i]
    - CF = macro F1 over the classes (:func:`macro_f1`)
    - CC = 1/n sum_i P(x_i)_{y_i}, the mean confidence of the true class over all images
      ("not available" for labels-only answers)
    """
    y = _labels(labels)
    n = len(y)
    pred, probs = _answers(clean, "clean", n)
    _check_len(pred, "clean", n)
    _check_in_classes(y, probs, "labels")
    out: dict[str, Any] = {"n": n}
    out["CA"] = ok_node(float(np.mean(pred == y)), n, correct=int(np.sum(pred == y)))
    out["CF"] = ok_node(macro_f1(y, pred), n, average="macro",
                        classes=int(np.union1d(y, pred).size))
    if probs is None:
        out["CC"] = missing_node(NOT_AVAILABLE, "needs confidence scores; the answers are "
                                 "labels only", n)
    else:
        out["CC"] = ok_node(float(np.mean(_rows(probs, y))), n)
    return out


# --------------------------------------------------------------------------------------------
# CAN-2 attack effect
# --------------------------------------------------------------------------------------------


def successful_examples(labels: Any, clean: Any, adversarial: Any) -> np.ndarray:
    """Boolean N: the model was right on x_i and wrong on x_i^a (an untargeted success). The
    ``include`` mask for :func:`perturbation_cost` and :func:`attack_cost`."""
    y = _labels(labels)
    cp, _ = _answers(clean, "clean", len(y))
    ap, _ = _answers(adversarial, "adversarial", len(y))
    _check_len(cp, "clean", len(y))
    _check_len(ap, "adversarial", len(y))
    return np.asarray((cp == y) & (ap != y), dtype=bool)


def observable_transfer_rate(labels: Any, source_clean: Any, source_adversarial: Any,
                             others: Mapping[str, Mapping[str, Any]] | None) -> dict[str, Any]:
    """OTR (CAN-2, paper 3.1.2): of the adversarial examples an attack made on the source
    model F_s, the share that other observed models F_d also misclassify,

        OTR = 1/(n (m-1)) sum_{d != s} sum_i [F_d(x_i^a) != y_i  and  F_s(x_i^a) != y_i]

    ``others[name] = {"clean": ..., "adversarial": ...}``: model ``name``'s answers on the
    clean images and on the source's adversarial examples (probabilities or labels). As for
    every CAN-2 metric only images classified correctly count: for model d, n_d is the
    number of images both F_s and F_d get right on the clean input (the authors' code drops
    the others); OTR is the mean of the per-model rates (the formula when all n_d are equal).
    """
    y = _labels(labels)
    n = len(y)
    sc, _ = _answers(source_clean, "source_clean", n)
    sa, _ = _answers(source_adversarial, "source_adversarial", n)
    _check_len(sc, "source_clean", n)
    _check_len(sa, "source_adversarial", n)
    if not others:
        return missing_node(NOT_APPLICABLE, "no other model observed the adversarial examples "
                            "(m = 1)", 0, per_model={})
    if not isinstance(others, Mapping):
        raise InvalidArgument("transfer", "must map model name -> {clean, adversarial}")
    per_model: dict[str, Any] = {}
    rates: list[float] = []
    counted = 0
    for name, answers in others.items():
        field = f"transfer.{name}"
        if not isinstance(answers, Mapping) or set(answers) != {"clean", "adversarial"}:
            raise InvalidArgument(field, "must be {'clean': ..., 'adversarial': ...}")
        dc, _ = _answers(answers["clean"], f"{field}.clean", n)
        da, _ = _answers(answers["adversarial"], f"{field}.adversarial", n)
        _check_len(dc, f"{field}.clean", n)
        _check_len(da, f"{field}.adversarial", n)
        valid = (sc == y) & (dc == y)
        nd = int(valid.sum())
        if nd == 0:
            per_model[str(name)] = missing_node(NOT_APPLICABLE, "no image classified correctly "
                                                "by both models", 0)
            continue
        rate = float(np.mean((sa[valid] != y[valid]) & (da[valid] != y[valid])))
        per_model[str(name)] = ok_node(rate, nd)
        rates.append(rate)
        counted += nd
    if not rates:
        return missing_node(NOT_APPLICABLE, "no image classified correctly by the source and "
                            "any other model", 0, per_model=per_model)
    return ok_node(float(np.mean(rates)), counted, models=len(rates), per_model=per_model)


def attack_effect(
    labels: Any,
    clean: Any,
    adversarial: Any,
    *,
    target_labels: Any = None,
    transfer: Mapping[str, Mapping[str, Any]] | None = None,
    white_box: Any = None,
    clean_images: Any = None,
    adv_images: Any = None,
    cam_layer: Any = None,
    batch_size: int = 32,
) -> dict[str, Any]:
    """CAN-2 (paper 3.1.2), over the n images the attacked model classifies correctly
    (F(x_i) = y_i; the others are discarded):

    - MR   = 1/n sum_i [F(x_i^a) != y_i]
    - TAS  = 1/n sum_i [F(x_i^a) = y_i^adv]   (targeted attacks: ``target_labels``; the paper
      requires y_adv != y, so a target equal to the label is an error; untargeted -> "not
      applicable")
    - AIAC = 1/n sum_i (P(x_i^a)_{F(x_i^a)} - P(x_i)_{F(x_i^a)}): the *increase* of the
      adversarial class's confidence. (The paper's typeset formula lost its sign; the name,
      Table 4's positive values and the authors' code, ``adv - ori``, fix it.)
    - ARTC = 1/n sum_i (P(x_i)_{y_i} - P(x_i^a)_{y_i}): the reduction of the true class's.
    - ACAMC-A / ACAMC-T: :func:`acamc` on ``white_box`` with ``clean_images``/``adv_images``
      ("not available" without a white-box model).
    - OTR: :func:`observable_transfer_rate` with ``transfer`` ("not applicable" without).

    ``clean``/``adversarial``: the attacked model's answers on x_i and x_i^a (probabilities,
    or labels: AIAC/ARTC are then "not available").
    """
    y = _labels(labels)
    n_total = len(y)
    cp, cprob = _answers(clean, "clean", n_total)
    ap, aprob = _answers(adversarial, "adversarial", n_total)
    _check_len(cp, "clean", n_total)
    _check_len(ap, "adversarial", n_total)
    _check_in_classes(y, cprob, "labels")
    _check_in_classes(y, aprob, "labels")
    if cprob is not None and aprob is not None and cprob.shape[1] != aprob.shape[1]:
        raise InvalidArgument("adversarial", f"{aprob.shape[1]} classes; the clean answers have "
                                             f"{cprob.shape[1]}")
    valid = cp == y
    n = int(valid.sum())
    none_right = "the model classified none of the clean images correctly (CAN-2 counts only those)"
    out: dict[str, Any] = {"n": n, "n_total": n_total}

    out["MR"] = mean_node((ap[valid] != y[valid]).astype(np.float64), empty_reason=none_right,
                          misclassified=int(np.sum(ap[valid] != y[valid])))

    if target_labels is None:
        out["TAS"] = missing_node(NOT_APPLICABLE, "untargeted attack (no target labels)", n)
    else:
        t = _labels(target_labels, "target_labels")
        _check_len(t, "target_labels", n_total)
        same = np.flatnonzero(t == y)
        if same.size:
            raise InvalidArgument("target_labels", f"image {int(same[0])}: the target equals the "
                                  "true label; a targeted attack needs y_adv != y (CAN-2)")
        out["TAS"] = mean_node((ap[valid] == t[valid]).astype(np.float64),
                               empty_reason=none_right)

    if cprob is None or aprob is None:
        reason = "needs confidence scores before and after the attack; the answers are labels only"
        out["AIAC"] = missing_node(NOT_AVAILABLE, reason, n)
        out["ARTC"] = missing_node(NOT_AVAILABLE, reason, n)
    else:
        adv_cls = ap[valid]
        iac = _rows(aprob[valid], adv_cls) - _rows(cprob[valid], adv_cls)
        rtc = _rows(cprob[valid], y[valid]) - _rows(aprob[valid], y[valid])
        out["AIAC"] = mean_node(iac, empty_reason=none_right)
        out["ARTC"] = mean_node(rtc, empty_reason=none_right)

    if white_box is None:
        cams = acamc(None, None, None, None)
    else:
        if clean_images is None or adv_images is None:
            raise InvalidArgument("clean_images" if clean_images is None else "adv_images",
                                  "ACAMC with a white-box model needs the clean and adversarial "
                                  "images")
        cams = acamc(white_box, clean_images, adv_images, y, layer=cam_layer,
                     batch_size=batch_size)
    out["ACAMC_A"] = {**cams["ACAMC_A"], "layer": cams["layer"]}
    out["ACAMC_T"] = {**cams["ACAMC_T"], "layer": cams["layer"]}

    out["OTR"] = observable_transfer_rate(y, cp, ap, transfer)
    return out


# --------------------------------------------------------------------------------------------
# CAN-3 attack cost
# --------------------------------------------------------------------------------------------


def _per_example(values: Any, field: str, *, integer: bool) -> np.ndarray:
    a = np.asarray(values)
    if a.ndim != 1 or a.size == 0:
        raise InvalidArgument(field, f"must be a non-empty vector, one value per example; got "
                                     f"shape {a.shape}")
    if a.dtype == np.bool_ or not np.issubdtype(a.dtype, np.number):
        raise InvalidArgument(field, f"must be numeric; got dtype {a.dtype}")
    f = a.astype(np.float64)
    if not np.all(np.isfinite(f)) or float(f.min()) < 0:
        raise InvalidArgument(field, "values must be finite and >= 0")
    if integer and not np.all(f == np.round(f)):
        raise InvalidArgument(field, "query counts must be whole numbers (the ledger's counts)")
    return f


def ctc_grades(mean_seconds: Mapping[str, float | None]) -> dict[str, dict[str, Any]]:
    """CTC grades (CAN-3): the paper times attacks "on the same device, the same model, or the
    same group of models" and "assign[s] them five levels of ranking after sorting"
    (Very Fast, Fast, Normal, Slow, Very Slow); it gives no thresholds in seconds. Implemented
    as quintiles of the rank: with K timed attacks sorted by mean seconds per example and r
    the number strictly faster (ties share a grade), level = floor(5 r / K).

    ``mean_seconds[name]`` is each attack's CTC in seconds (``None``: not timed, e.g. an
    attack that needs prior training). Fewer than two timed attacks -> "not applicable".
    """
    if not isinstance(mean_seconds, Mapping):
        raise InvalidArgument("mean_seconds", "must map attack name -> seconds per example")
    timed: dict[str, float] = {}
    for name, v in mean_seconds.items():
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
            raise InvalidArgument(f"mean_seconds.{name}", f"must be seconds >= 0 or null; got {v!r}")
        timed[str(name)] = float(v)
    k = len(timed)
    values = np.array(sorted(timed.values()))
    out: dict[str, dict[str, Any]] = {}
    for name in mean_seconds:
        key = str(name)
        if key not in timed:
            out[key] = {"grade": None, "level": None, "seconds": None, "status": NOT_AVAILABLE,
                        "reason": "the attack was not timed"}
        elif k < 2:
            out[key] = {"grade": None, "level": None, "seconds": timed[key],
                        "status": NOT_APPLICABLE,
                        "reason": "grades rank attacks timed together; needs at least two"}
        else:
            rank = int(np.searchsorted(values, timed[key], side="left"))
            level = (5 * rank) // k
            out[key] = {"grade": CTC_GRADES[level], "level": level, "seconds": timed[key],
                        "rank": rank, "of": k, "status": OK, "reason": None}
    return out


def attack_cost(
    *,
    kind: str,
    seconds: Any = None,
    qnc_forward: Any = None,
    qnc_backward: Any = None,
    include: Any = None,
    ctc_peers: Mapping[str, float | None] | None = None,
) -> dict[str, Any]:
    """CAN-3 (paper 3.1.3 (1)) per adversarial example:

    - CTC: mean of ``seconds`` (time to compute each adversarial example), with its grade
      among ``ctc_peers`` (other attacks' CTC on the same device and model(s), see
      :func:`ctc_grades`; without peers the grade is "not applicable").
    - QNC-F / QNC-B: mean forward / backward queries, from the proxy's ledger counts.

    ``kind`` is one of :data:`ATTACK_KINDS`; for a query black-box attack (``score``,
    ``decision``, ``black-box``) any backward query is an :class:`InvalidArgument` ("the
    attack will be considered a white-box attack"). ``include`` (boolean, per example)
    restricts the means (the authors' code averages over successful examples only).
    Missing inputs -> "not available".
    """
    if kind not in ATTACK_KINDS:
        raise InvalidArgument("kind", f"must be one of {', '.join(ATTACK_KINDS)}; got {kind!r}")
    given = {name: arr for name, arr in (
        ("seconds", None if seconds is None else _per_example(seconds, "seconds", integer=False)),
        ("qnc_forward", None if qnc_forward is None
         else _per_example(qnc_forward, "qnc_forward", integer=True)),
        ("qnc_backward", None if qnc_backward is None
         else _per_example(qnc_backward, "qnc_backward", integer=True)),
    ) if arr is not None}
    sizes = {arr.size for arr in given.values()}
    if len(sizes) > 1:
        raise InvalidArgument(next(iter(given)), "seconds, qnc_forward and qnc_backward must "
                              f"have one value per example each; got lengths {sorted(sizes)}")
    qb = given.get("qnc_backward")
    if kind in BLACK_BOX_KINDS and qb is not None and np.any(qb > 0):
        i = int(np.flatnonzero(qb > 0)[0])
        raise InvalidArgument("qnc_backward", f"a black-box ({kind}) attack must make no backward "
                              f"queries (QNC-B = 0, CAN-3); example {i} made {int(qb[i])} -- "
                              "such an attack is a white-box attack")
    n_total = sizes.pop() if sizes else 0
    mask = None
    if include is not None:
        if not given:
            raise InvalidArgument("include", "nothing to select: no seconds or query counts")
        mask = check_mask(include, "include", n_total)
    empty = "no example to average over (none included)"

    def node(name: str, what: str, **extra: Any) -> dict[str, Any]:
        arr = given.get(name)
        if arr is None:
            return missing_node(NOT_AVAILABLE, what, 0, **extra)
        return mean_node(arr if mask is None else arr[mask], empty_reason=empty, **extra)

    out: dict[str, Any] = {"kind": kind, "n_total": n_total,
                           "n": int(mask.sum()) if mask is not None else n_total}
    ctc = node("seconds", "the attack was not timed (e.g. it needs prior training)",
               unit="seconds per example")
    if ctc["status"] != OK:
        ctc.update(grade=None, grade_reason="no time")
    elif not ctc_peers:
        ctc.update(grade=None, grade_reason="grades rank attacks timed together; no peers given")
    else:
        peers = {str(k): v for k, v in ctc_peers.items()}
        me = "\0this attack"
        grade = ctc_grades({**peers, me: ctc["value"]})[me]
        ctc.update(grade=grade["grade"], level=grade["level"], grade_reason=grade["reason"])
    out["CTC"] = ctc
    out["QNC_F"] = node("qnc_forward", "no forward query counts (the proxy's ledger) given",
                        unit="queries per example")
    out["QNC_B"] = node("qnc_backward", "no backward query counts given",
                        unit="queries per example")
    return out


# --------------------------------------------------------------------------------------------
# CAN-5 defence effect
# --------------------------------------------------------------------------------------------


def _value(report: Mapping[str, Any] | None, key: str) -> float | None:
    if report is None:
        return None
    v = report.get(key)
    if isinstance(v, Mapping):
        v = v.get("value")
    if v is None or isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return float(v)


def _delta(name: str, before: float | None, after: float | None, missing: str) -> dict[str, Any]:
    if before is None or after is None:
        side = "baseline" if before is None else "defended"
        return {"value": None, "baseline": before, "defended": after,
                "status": NOT_AVAILABLE, "reason": f"{name} is not available for the {side} "
                                                   f"model{missing}"}
    return {"value": after - before, "baseline": before, "defended": after,
            "status": OK, "reason": None}


def defence_effect(
    labels: Any,
    *,
    baseline_clean: Any,
    defended_clean: Any,
    baseline_adv: Any = None,
    defended_adv: Any = None,
    baseline_attack: Mapping[str, Any] | None = None,
    defended_attack: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """CAN-5 (paper 3.1.4): a baseline model F_O against a defended one F_D on the same N test
    images (``*_clean``: their answers on the clean images).

    - AV, FV, CV = X_Def - X_Ori for X = CA, CF, CC (model capability variance)
    - RR = 1/N sum_i [F_O(x_i) != y_i and F_D(x_i) = y_i]   (rectify ratio)
      SR = 1/N sum_i [F_O(x_i) = y_i and F_D(x_i) != y_i]   (sacrifice ratio)
    - ACV: X_Def - X_Ori for X in MR, AMD, AED, APCR, ADMS, ALMS, read from the two attack
      reports (``baseline_attack``/``defended_attack``: the merged dicts of
      :func:`attack_effect` and :func:`perturbation_cost`, or plain numbers)
    - ARAC = 1/n sum_i (P_O(x_i^a)_{F_O(x_i^a)} - P_D(x_i^aD)_{F_D(x_i^aD)})
      AITC = 1/n sum_i (P_D(x_i^aD)_{y_i} - P_O(x_i^a)_{y_i})
      ``baseline_adv``: F_O's probabilities on x^a (made on F_O); ``defended_adv``: F_D's on
      x^aD (regenerated on F_D for adversarial training; x^a itself for an image-processing
      defence). ARAC is a reduction (Ori - Def) as typeset; AITC is an *increase* (Def -
      Ori): the typeset formula lost its sign, and the name fixes it as for AIAC. The n
      images are those both models classify correctly when clean (CAN-2's rule, per model).
    """
    y = _labels(labels)
    n = len(y)
    cap_o = model_capability(y, baseline_clean)
    cap_d = model_capability(y, defended_clean)
    po, _ = _answers(baseline_clean, "baseline_clean", n)
    pd, _ = _answers(defended_clean, "defended_clean", n)
    out: dict[str, Any] = {"n": n, "baseline": cap_o, "defended": cap_d}
    for name, key in (("AV", "CA"), ("FV", "CF"), ("CV", "CC")):
        out[name] = _delta(key, cap_o[key]["value"], cap_d[key]["value"],
                           " (needs confidence scores)")
    out["RR"] = ok_node(float(np.mean((po != y) & (pd == y))), n)
    out["SR"] = ok_node(float(np.mean((po == y) & (pd != y))), n)

    no_report = " (no attack report given)"
    out["ACV"] = {
        key: _delta(key, _value(baseline_attack, key), _value(defended_attack, key),
                    no_report if baseline_attack is None or defended_attack is None else "")
        for key in ACV_METRICS}

    if baseline_adv is None or defended_adv is None:
        reason = "needs both models' probabilities on their adversarial examples"
        out["ARAC"] = missing_node(NOT_AVAILABLE, reason)
        out["AITC"] = missing_node(NOT_AVAILABLE, reason)
        return out
    ao, aprob_o = _answers(baseline_adv, "baseline_adv", n)
    ad, aprob_d = _answers(defended_adv, "defended_adv", n)
    _check_len(ao, "baseline_adv", n)
    _check_len(ad, "defended_adv", n)
    if aprob_o is None or aprob_d is None:
        reason = "needs confidence scores on the adversarial examples; the answers are labels only"
        out["ARAC"] = missing_node(NOT_AVAILABLE, reason)
        out["AITC"] = missing_node(NOT_AVAILABLE, reason)
        return out
    _check_in_classes(y, aprob_o, "labels")
    _check_in_classes(y, aprob_d, "labels")
    valid = (po == y) & (pd == y)
    empty = "no image is classified correctly by both models"
    rac = _rows(aprob_o[valid], ao[valid]) - _rows(aprob_d[valid], ad[valid])
    itc = _rows(aprob_d[valid], y[valid]) - _rows(aprob_o[valid], y[valid])
    out["ARAC"] = mean_node(rac, empty_reason=empty)
    out["AITC"] = mean_node(itc, empty_reason=empty)
    return out
