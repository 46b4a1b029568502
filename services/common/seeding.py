"""Seeded randomness: every random operation draws from a generator derived from the plan.

``rng_for(seed, "gaussian_noise", 3, "img-7")`` gives the same generator for the same keys,
whatever the batching or order of work, so a resumed evaluation redoes an item exactly.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch


def _entropy(seed: int, keys: tuple[object, ...]) -> list[int]:
    h = hashlib.sha256(repr((int(seed),) + tuple(str(k) for k in keys)).encode()).digest()
    return [int.from_bytes(h[i:i + 4], "little") for i in range(0, 16, 4)]


def rng_for(seed: int, *keys: object) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(_entropy(seed, keys)))


def torch_generator_for(seed: int, *keys: object) -> torch.Generator:
    # torch is imported here, not with the module: services without models (the evaluation
    # service's image order) derive numpy generators without loading torch
    import torch

    g = torch.Generator()
    e = _entropy(seed, keys)
    g.manual_seed((e[0] << 32 | e[1]) & ((1 << 63) - 1))
    return g
