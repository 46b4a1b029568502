"""The input normalisation of a tenant's surrogate (``(x - mean) / std`` on images in [0, 1]),
shared by the classifier surrogates (``surrogate.py``) and the detector / segmenter ones
(``task_surrogate.py``)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

__all__ = ["register_normalisation"]


def register_normalisation(module: nn.Module, mean: Sequence[float], std: Sequence[float],
                           channels: int) -> None:
    """The ``(x - mean) / std`` buffers of a tenant's surrogate, one value per channel (one
    value given: every channel's), not saved with the module's state."""
    m = list(mean) or [0.0]
    s = list(std) or [1.0]
    m = m * channels if len(m) == 1 else m
    s = s * channels if len(s) == 1 else s
    module.register_buffer("mean", torch.tensor(m, dtype=torch.float32).view(1, -1, 1, 1),
                           persistent=False)
    module.register_buffer("std", torch.tensor(s, dtype=torch.float32).view(1, -1, 1, 1),
                           persistent=False)
