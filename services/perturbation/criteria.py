"""Threat criteria (PER-2, seed 004 Table I) and the success criteria of the attacks
(IEEE-A7/A8): when does the target's answer on a perturbed image "meet the threat"?

Pure domain code of the perturbation service (no gRPC, nothing of another service). One
definition serves two callers, which is why it lives here and not beside either of them:

* the PertKnob search (``pertknob_search.py``, PER-3) calls ``criterion(prediction, reference)``
  on one prediction at a time;
* the adversarial attacks (``attacks/``) judge whole batches through the vectorised forms
  :meth:`Criterion.adversarial_labels` (decision-based: top-1 labels only) and
  :meth:`Criterion.margins` (score-based: < 0 means the criterion is met), so a targeted
  variant of an attack is the same attack given :class:`TargetedMisclassification`.

A criterion decides given a :class:`Reference` (the clean image's ground-truth label G(x) and
the target's prediction on the clean image):

- :class:`Misclassification`: C(x + delta) != G(x).
- :class:`ConfidentMisclassification` (threshold): some class l != G(x) has P_l(x + delta) >=
  threshold (Table I; Perceptron's code also requires the top-1 to differ, which follows when
  threshold > 0.5).
- :class:`TopKMisclassification` (k): C(x + delta) is not in the top-k labels of the clean
  prediction, C_topK(x) (Table I: the label leaves the original top-K). With
  ``variant="perceptron"``: G(x) is not in the top-k of the perturbed prediction (Foolbox's and
  Perceptron's code).
- :class:`OriginalClassProbability` (threshold): P_G(x)(x + delta) < threshold.
- :class:`TargetClassProbBoost` (target, threshold): P_target(x + delta) > threshold.
- :class:`TargetedMisclassification` (target): C(x + delta) == target.
- Detection (the criteria marked with a dagger in Table I): :class:`TargetObjectMiss`: the target
  object is no longer detected as its class: no detection of the reference class with score >=
  ``score_threshold`` overlaps the target box with IoU >= ``iou_threshold``;
  :class:`DetectionTargetClassProbBoost`: a detection of class ``target`` with score >=
  ``threshold`` overlaps the target box with IoU >= ``iou_threshold``. The target box is
  ``Reference.box``, or, when not given, the highest-scoring detection of ``Reference.label``
  in the clean prediction.

Query attacks on detectors and segmenters (IEEE-A8 with the IEEE-C4 / IEEE-C5 rules of the
plan, judged batch-wise by ``judges.py``; the matching is the one the scoring service
applies, ``fortis.core.matching``):

- :class:`ObjectMissed` (IEEE-C4, untargeted): an object of interest "disappears or changes
  label": no box of its class with IoU *strictly above* ``iou_threshold`` (the scoring rule)
  and score >= ``score_threshold`` (the plan's ``confidence_threshold``; None: every box
  counts), boxes matched to objects one-to-one in the plan's ``mode`` exactly as scoring
  matches them (``common.matching.match_objects``, the batched rule on one image); with
  IEEE-C3 ``min_objects`` (at least Q of the s objects; 0 = all) the image is
  incorrect once fewer than Q objects are found. An image with no object of interest is
  incorrect once some box is kept (as scoring judges it). Margin per object: the best
  ``min(score - score_threshold, IoU - iou_threshold)`` over the boxes of its class (the
  matched boxes' scores drive it, a box sliding off the object too); the image's margin is
  the Q-th largest object margin.
- :class:`ObjectRelabelled` (IEEE-C4, targeted): every object of interest is found as class
  ``target`` (a box of that class with IoU > ``iou_threshold`` and score >= ``threshold``);
  margin ``-min_j max_k min(score_k - threshold, IoU_jk - iou_threshold)``.
- :class:`MIoUBelow` (IEEE-C5): the mIoU over ``classes`` against the reference mask is at or
  below ``miou_threshold`` (the image is no longer correct: scoring needs mIoU strictly
  above). Margin ``mIoU - miou_threshold``; where the target returns per-pixel probabilities
  (``Segmentation.probabilities``) the soft mIoU of those probabilities against the reference
  (probabilities in place of the 0/1 mask in each class's intersection and union: a per-pixel
  probability loss) is added while the image is still correct, so progress below a pixel
  flip is seen. An undefined mIoU (no class of interest anywhere) is judged by
  ``all_absent_incorrect``.

Every margin is < 0 exactly when its criterion is met (:func:`signed_margins` enforces it at
the boundaries, e.g. a score equal to the threshold).

Predictions (PER-5: classifiers, detectors and cloud APIs alike). Classification: a 1-D array of
class probabilities, or any object with ranked ``labels``, optional aligned ``scores`` and an
optional ``error`` (:class:`RankedPrediction`, or the scoring service's ``ClassPrediction``,
which has the same shape: what a remote API that returns its top-k labels gives; a label it
did not return has probability 0; criteria that need probabilities refuse a labels-only
prediction). Detection: a sequence of :class:`Detection` (or mappings with ``box``, ``label``,
``score``), boxes as (x1, y1, x2, y2) in any one unit.

The definitions live in parts, each importable from here as before: ``criteria_base.py``
(predictions, references, the :class:`Criterion` base and the margin helpers),
``criteria_classification.py``, ``criteria_detection.py`` and ``criteria_segmentation.py``;
this module builds a criterion from a plan or request (:func:`criterion_from_spec`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fortis.core.criteria import TARGETED_CRITERIA
from fortis.core.strategy import STRATEGIES, strategy
from fortis.services.common.errors import InvalidArgument
from fortis.services.perturbation.criteria_base import (
    Criterion,
    Detection,
    RankedPrediction,
    Reference,
    margins,
    signed_margins,
)
from fortis.services.perturbation.criteria_classification import (
    ConfidentMisclassification,
    Misclassification,
    OriginalClassProbability,
    TargetClassProbBoost,
    TargetedMisclassification,
    TopKMisclassification,
)
from fortis.services.perturbation.criteria_detection import (
    DetectionTargetClassProbBoost,
    ObjectMissed,
    ObjectRelabelled,
    TargetObjectMiss,
)
from fortis.services.perturbation.criteria_segmentation import MIoUBelow

__all__ = [
    "CRITERION_KINDS",
    "ConfidentMisclassification",
    "Criterion",
    "Detection",
    "DetectionTargetClassProbBoost",
    "MIoUBelow",
    "Misclassification",
    "ObjectMissed",
    "ObjectRelabelled",
    "OriginalClassProbability",
    "RankedPrediction",
    "Reference",
    "TargetClassProbBoost",
    "TargetObjectMiss",
    "TargetedMisclassification",
    "TopKMisclassification",
    "criterion_from_spec",
    "margins",
    "signed_margins",
]

# --------------------------------------------------------------------------------------------
# A criterion from a plan / request (kind + parameters)
# --------------------------------------------------------------------------------------------

#: Criterion kinds a plan or RunAttackRequest may name (PER-2 and the task criteria): those
#: of every task's strategy (``core/strategy.py``; plans are validated with the same table).
CRITERION_KINDS = tuple(k for st in STRATEGIES.values() for k in st.attack_criteria)


def criterion_from_spec(task: str, spec: Mapping[str, Any] | None) -> Criterion:
    """The criterion of an attack on a ``task`` target from plain data: ``kind`` (one of
    :data:`CRITERION_KINDS`; empty: the task's default, or ``targeted_misclassification`` /
    ``object_relabelled`` when ``target_label`` is given), ``target_label``, ``threshold``,
    ``k`` and the task's parameters (``detection``: iou_threshold, score_threshold,
    min_objects; ``segmentation``: classes, miou_threshold, ignore_label,
    all_absent_incorrect). Errors name ``criterion.<field>``."""
    d = dict(spec or {})
    st = strategy(task)              # an unknown task: InvalidArgument naming ``task``
    target = d.get("target_label")
    kind = d.get("kind") or ""
    if not kind:
        kind = (st.targeted_default or "") if target is not None else ""
        kind = kind or st.default_attack_criterion
    if kind not in st.attack_criteria:
        raise InvalidArgument("criterion.kind", f"'{kind}' does not apply to a {task} target; "
                              f"use one of {', '.join(st.attack_criteria)}")
    needs_target = kind in TARGETED_CRITERIA
    if needs_target and target is None:
        raise InvalidArgument("criterion.target_label", f"{kind} needs the target class")
    if target is not None and not needs_target:
        raise InvalidArgument("criterion.target_label", f"{kind} takes no target class")
    if target is not None and (isinstance(target, bool) or not isinstance(target, int)
                               or target < 0):
        raise InvalidArgument("criterion.target_label", f"must be a class id >= 0, got "
                              f"{target!r}")
    thr = d.get("threshold")
    tgt = int(target) if target is not None else -1
    det = dict(d.get("detection") or {})
    seg = dict(d.get("segmentation") or {})
    if kind == "misclassification":
        return Misclassification()
    if kind == "targeted_misclassification":
        return TargetedMisclassification(tgt)
    if kind == "confident_misclassification":
        return ConfidentMisclassification(0.5 if thr is None else float(thr))
    if kind == "top_k_misclassification":
        return TopKMisclassification(k=int(d.get("k") or 5))
    if kind == "original_class_probability":
        return OriginalClassProbability(0.5 if thr is None else float(thr))
    if kind == "target_class_prob_boost":
        return TargetClassProbBoost(tgt, 0.5 if thr is None else float(thr))
    iou = float(det.get("iou_threshold", 0.5))
    score = det.get("score_threshold")
    if kind == "object_missed":
        return ObjectMissed(iou_threshold=iou,
                            score_threshold=None if score is None else float(score),
                            min_objects=int(det.get("min_objects", 0)),
                            mode=str(det.get("mode") or "threshold"), k=int(det.get("k", 5)))
    if kind == "object_relabelled":
        cut = thr if thr is not None else score if score is not None else 0.5
        return ObjectRelabelled(tgt, threshold=float(cut), iou_threshold=iou)
    if "classes" not in seg:
        raise InvalidArgument("criterion.segmentation.classes", "the classes of interest are "
                              "required")
    ign = seg.get("ignore_label", 255)
    return MIoUBelow(classes=tuple(seg["classes"]),
                     miou_threshold=float(seg.get("miou_threshold", 0.5)),
                     ignore_label=None if ign is None else int(ign),
                     all_absent_incorrect=bool(seg.get("all_absent_incorrect", False)))

