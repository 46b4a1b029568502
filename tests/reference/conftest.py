"""Fixtures of the side-by-side reference tests."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture(scope="module", autouse=True)
def _one_thread_everywhere(one_thread: None) -> None:
    """Every reference test runs on one torch thread (tests/conftest.py ``one_thread``)."""


@pytest.fixture(scope="module")
def correct(fmnist_target, fmnist_test_images):
    """Test images the target gets right (every tool starts from the same correct images)."""
    x, y = fmnist_test_images
    ok = np.flatnonzero(fmnist_target.predict(x) == y)
    return x[ok], y[ok]
