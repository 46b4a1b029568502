"""Fixtures of the side-by-side reference tests."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """Small CNN, small batches: a second torch thread only adds overhead on 2 cores, and
    spin-waiting threads slow to a crawl when the cores are shared (as in tests/unit)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def correct(fmnist_target, fmnist_test_images):
    """Test images the target gets right (every tool starts from the same correct images)."""
    x, y = fmnist_test_images
    ok = np.flatnonzero(fmnist_target.predict(x) == y)
    return x[ok], y[ok]
