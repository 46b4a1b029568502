"""Shared types and helpers of the adversarial attacks (IEEE-A7, IEEE-A8, IEEE-A9, IEEE-M6).

Conventions every attack follows:

* Images are uint8 arrays ``N x H x W x C`` (any H, W; C = 1 or 3). What the target receives
  is uint8, so every attack returns uint8 adversarials and judges success on exactly those
  images (DESIGN.md section 5: examples must not stop working after encoding).
* The L-inf bound ``epsilon`` is given in [0, 1] pixel scale and fixed before the attack
  (IEEE-A9); in uint8 space it is ``e = floor(epsilon * 255 + 1e-6)`` levels, and every
  returned adversarial satisfies ``|adv - x| <= e`` pixel-wise.
* L2 distances are measured on images scaled to [0, 1]: ``||(adv - x) / 255||_2`` per image.
* Query attacks count one query per image per call to the query function, including the
  initial query of the clean image (IEEE-M6; DESIGN.md section 5: uncounted queries). A call
  that raises :class:`~fortis.services.common.errors.BudgetExhausted` sent nothing to the
  target and is not counted; the images of that call stop with
  ``stop_reason = "budget_exhausted_by_proxy"``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import numpy as np
from fortis.services.common.errors import InvalidArgument

STOP_SUCCESS: Final = "success"
STOP_BUDGET: Final = "budget"
STOP_ALREADY_MISCLASSIFIED: Final = "already_misclassified"
STOP_PROXY_BUDGET: Final = "budget_exhausted_by_proxy"
STOP_ITERATIONS: Final = "iterations"
STOP_REASONS: Final = (STOP_SUCCESS, STOP_BUDGET, STOP_ALREADY_MISCLASSIFIED, STOP_PROXY_BUDGET,
                       STOP_ITERATIONS)


@dataclass(kw_only=True)
class AttackResult:
    """Outcome of one attack on one image of the batch."""

    index: int                     # position in the input batch
    adversarial: np.ndarray        # uint8 HxWxC: best adversarial found (or original/last iterate)
    adversarial_float: np.ndarray  # float32 in [0,1] version of the same (CAN-9 keeps floats)
    success: bool | None           # judged on the uint8 image by the target's answer; None: transfer
    queries: int                   # queries this attack sent for this image (0 for transfer)
    initially_correct: bool | None
    linf: float                    # ||adv - x||_inf in [0,1] scale
    l2: float                      # ||adv - x||_2 in [0,1] scale
    stop_reason: str               # one of STOP_REASONS


ScoreQuery = Callable[[np.ndarray, np.ndarray], np.ndarray]
"""(images uint8 n x H x W x C, batch indices int n) -> scores float n x num_classes.

Probabilities or scores; classes the target did not return score 0. May raise
``BudgetExhausted``."""

LabelQuery = Callable[[np.ndarray, np.ndarray], np.ndarray]
"""(images uint8 n x H x W x C, batch indices int n) -> top-1 labels int n. May raise
``BudgetExhausted``."""


def linf_levels(epsilon: float) -> int:
    """The L-inf bound in uint8 levels: ``floor(epsilon * 255 + 1e-6)`` (IEEE-A9)."""
    eps = float(epsilon)
    if not np.isfinite(eps) or eps < 0.0:
        raise InvalidArgument("epsilon", f"must be a finite number >= 0, got {epsilon!r}")
    return min(int(np.floor(eps * 255.0 + 1e-6)), 255)


def check_l2_epsilon(epsilon: float) -> float:
    eps = float(epsilon)
    if not np.isfinite(eps) or eps < 0.0:
        raise InvalidArgument("epsilon", f"must be a finite number >= 0, got {epsilon!r}")
    return eps


def check_max_queries(max_queries: int) -> int:
    if isinstance(max_queries, bool) or int(max_queries) != max_queries or max_queries < 1:
        raise InvalidArgument("max_queries", f"must be an integer >= 1, got {max_queries!r}")
    return int(max_queries)


def check_batch(images: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Validate an ``N x H x W x C`` uint8 batch and its ``N`` integer labels."""
    images = np.asarray(images)
    if images.dtype != np.uint8:
        raise InvalidArgument("images", f"must be uint8, got {images.dtype}")
    if images.ndim != 4 or min(images.shape[1:]) < 1:
        raise InvalidArgument("images", f"must be N x H x W x C, got shape {images.shape}")
    labels = np.asarray(labels)
    if labels.shape != (images.shape[0],):
        raise InvalidArgument("labels", f"need one label per image: {images.shape[0]}, "
                              f"got shape {labels.shape}")
    if labels.size and (not np.issubdtype(labels.dtype, np.integer) or labels.min() < 0):
        raise InvalidArgument("labels", "must be non-negative integers")
    return images, labels.astype(np.int64)


def linf_distance(adv: np.ndarray, x: np.ndarray) -> float:
    """``||adv - x||_inf`` of two uint8 images, in [0, 1] scale."""
    diff = np.abs(adv.astype(np.int16) - x.astype(np.int16))
    return float(diff.max()) / 255.0 if diff.size else 0.0


def l2_distance(adv: np.ndarray, x: np.ndarray) -> float:
    """``||(adv - x) / 255||_2`` of two uint8 images."""
    diff = (adv.astype(np.float64) - x.astype(np.float64)) / 255.0
    return float(np.sqrt(np.sum(diff * diff)))


def clip_to_linf(adv_levels: np.ndarray, x: np.ndarray, e: int) -> np.ndarray:
    """Round-trip helper: clip integer-valued ``adv_levels`` into ``[x-e, x+e] & [0, 255]``."""
    xi = x.astype(np.int16)
    out = np.clip(adv_levels, xi - e, xi + e)
    return np.clip(out, 0, 255).astype(np.uint8)


def make_result(index: int, x: np.ndarray, adv: np.ndarray, *, success: bool | None,
                queries: int, initially_correct: bool | None, stop_reason: str) -> AttackResult:
    """Build an :class:`AttackResult` with distances measured on the uint8 images."""
    if stop_reason not in STOP_REASONS:
        raise ValueError(f"unknown stop reason {stop_reason!r}")
    adv = np.ascontiguousarray(adv, dtype=np.uint8)
    return AttackResult(
        index=int(index), adversarial=adv,
        adversarial_float=(adv.astype(np.float32) / np.float32(255.0)),
        success=None if success is None else bool(success), queries=int(queries),
        initially_correct=None if initially_correct is None else bool(initially_correct),
        linf=linf_distance(adv, x), l2=l2_distance(adv, x), stop_reason=stop_reason)
