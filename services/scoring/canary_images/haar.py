"""One-level orthonormal 2-D Haar DWT behind AED-FD (CAN-4): the low- and high-frequency parts
of a perturbation (CANARY, seed 003, paper 3.1.3). Pure numpy, no gRPC.
"""

from __future__ import annotations

import math

import numpy as np
from fortis.services.common.errors import InvalidArgument

__all__ = ["haar_dwt2", "haar_idwt2", "haar_split"]

_SQRT1_2 = 1.0 / math.sqrt(2.0)


def _analysis(a: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """Orthonormal 1-D Haar analysis along ``axis``. An odd length keeps its last sample as a
    low-pass coefficient of weight 1 (the rows of [L; H] stay orthonormal)."""
    a = np.moveaxis(a, axis, 0)
    n = a.shape[0]
    m = n // 2
    even, odd = a[0:2 * m:2], a[1:2 * m:2]
    low = (even + odd) * _SQRT1_2
    high = (even - odd) * _SQRT1_2
    if n % 2:
        low = np.concatenate([low, a[n - 1:n]], axis=0)
    return np.moveaxis(low, 0, axis), np.moveaxis(high, 0, axis)


def _synthesis(low: np.ndarray, high: np.ndarray, axis: int) -> np.ndarray:
    """Inverse of :func:`_analysis` (L^T low + H^T high)."""
    low = np.moveaxis(low, axis, 0)
    high = np.moveaxis(high, axis, 0)
    m = high.shape[0]
    n = low.shape[0] + m
    out = np.empty((n, *low.shape[1:]), dtype=np.result_type(low, high))
    out[0:2 * m:2] = (low[:m] + high) * _SQRT1_2
    out[1:2 * m:2] = (low[:m] - high) * _SQRT1_2
    if n % 2:
        out[n - 1] = low[m]
    return np.moveaxis(out, 0, axis)


def haar_dwt2(images: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One-level orthonormal 2-D Haar DWT of N x H x W x C arrays, per channel.

    Returns ``(ll, lh, hl, hh)``: ``ll = L x L^T``, ``lh = L x H^T`` (low along H, high along
    W), ``hl = H x L^T``, ``hh = H x H^T`` with L, H the Haar low/high-pass analysis matrices
    (rows ``[1, 1]/sqrt(2)`` and ``[1, -1]/sqrt(2)``). Any H, W (odd sizes handled exactly).
    """
    x = np.asarray(images, dtype=np.float64)
    if x.ndim != 4:
        raise InvalidArgument("images", f"must be N x H x W x C; got shape {x.shape}")
    lo_h, hi_h = _analysis(x, 1)
    ll, lh = _analysis(lo_h, 2)
    hl, hh = _analysis(hi_h, 2)
    return ll, lh, hl, hh


def haar_idwt2(ll: np.ndarray, lh: np.ndarray, hl: np.ndarray, hh: np.ndarray) -> np.ndarray:
    """Inverse of :func:`haar_dwt2` (perfect reconstruction)."""
    lo_h = _synthesis(ll, lh, 2)
    hi_h = _synthesis(hl, hh, 2)
    return _synthesis(lo_h, hi_h, 1)


def haar_split(images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Low- and high-frequency reconstructions of N x H x W x C arrays (CAN-4, AED-FD).

    ``low = phi_ll(x) = L^T L x L^T L`` (from the LL band alone) and ``high =
    phi_lh+hl+hh(x) = L^T L x H^T H + H^T H x L^T L + H^T H x H^T H`` (from the three detail
    bands). The wavelet is orthogonal, so ``low + high == x`` and ``||low||^2 + ||high||^2 ==
    ||x||^2``.
    """
    ll, lh, hl, hh = haar_dwt2(images)
    low = haar_idwt2(ll, np.zeros_like(lh), np.zeros_like(hl), np.zeros_like(hh))
    high = haar_idwt2(np.zeros_like(ll), lh, hl, hh)
    return low, high
