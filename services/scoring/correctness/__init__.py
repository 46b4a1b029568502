"""IEEE Std 3129-2023 4.7.6 prediction correctness for every service type. Domain code: no gRPC.

Decides the per-image booleans (Clean_Result(i), Corr_Result(i, j), Adv_Result(i, j)) that
``ieee.compute_ieee_metrics`` turns into the IEEE-M1..M7 tree. Every function works on a whole
batch of images with numpy (no per-image Python work in the inner loops), so M = 10,000 images
under 75 settings scores in seconds.

One module per task type, with what they share in one place:

``common``          :class:`AggregationRule` (IEEE-C3, s label sets / objects -> the image),
                    :class:`LabelMapping` (IEEE-P6, dataset -> service labels), validation
                    helpers.
``classification``  IEEE-C1/C2 per label set on ranked labels, score vectors or recorded
                    answers, then IEEE-C3.
``boxes``           detection box formats (:data:`BOX_FORMATS`), :func:`to_xyxy`,
                    :func:`box_iou`, :class:`Detections`, :class:`DetectionBatch`.
``detection``       IEEE-C4: :class:`DetectionCriterion`, verdicts from the greedy one-to-one
                    IoU matching of :mod:`fortis.core.matching`, IEEE-C3 over the objects.
``segmentation``    IEEE-C5: per-class IoU, mIoU > threshold, ``all_absent``.

A failed query (``error`` set on the prediction) makes that image incorrect in every task.
Every public name is re-exported here: import from ``fortis.services.scoring.correctness``.
"""

from __future__ import annotations

from fortis.services.scoring.correctness.boxes import (
    BOX_FORMATS,
    DetectionBatch,
    Detections,
    box_iou,
    to_xyxy,
)
from fortis.services.scoring.correctness.classification import (
    class_predictions_correct,
    class_truth_array,
    classification_correct,
    classification_correct_from_scores,
)
from fortis.services.scoring.correctness.common import (
    AGGREGATE_MODES,
    AggregationRule,
    LabelMapping,
)
from fortis.services.scoring.correctness.detection import (
    DetectionCriterion,
    DetectionMatch,
    detection_correct,
    match_detections,
)
from fortis.services.scoring.correctness.segmentation import (
    ALL_ABSENT_POLICIES,
    SCORE_LAYOUTS,
    SegmentationCriterion,
    SegmentationPrediction,
    masks_from_scores,
    segmentation_correct,
    segmentation_iou,
    segmentation_miou,
)

__all__ = [
    "AGGREGATE_MODES",
    "ALL_ABSENT_POLICIES",
    "BOX_FORMATS",
    "SCORE_LAYOUTS",
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
