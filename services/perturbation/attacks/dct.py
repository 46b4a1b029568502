"""The 2-D discrete cosine transform (DCT-II, orthonormal) the low-frequency attacks share:
SimBA-DCT (``simba.py``, Guo et al., ICML 2019) draws its search directions from the DCT
basis in the authors' low-frequency-first order, and the low-frequency DCT attack
(``lowfreq_dct.py``, Guo, Frank and Weinberger, UAI 2019) draws its Gaussian samples in the
low-frequency block of DCT coefficients.

Images are ``N x H x W x C`` arrays; the transform is over H and W of each channel, with the
whole image as one block (as both papers' code does: ``block_idct(x, block_size=image_size)``).
Orthonormal: a unit coefficient maps to a unit-L2 image, so step sizes and norms mean the same
in both domains. Non-square images use their own H x W matrices. Domain code: no gRPC.
"""

from __future__ import annotations

import functools

import numpy as np

__all__ = ["block_sizes", "dct_matrix", "idct2", "low_frequency_order", "low_frequency_noise"]


@functools.lru_cache(maxsize=16)
def dct_matrix(n: int) -> np.ndarray:
    """The orthonormal DCT-II matrix ``D`` (``n x n``, rows are the basis vectors): the
    coefficients of a signal ``s`` are ``D @ s`` and ``s = D.T @ coefficients``."""
    k = np.arange(n)[:, None]
    i = np.arange(n)[None, :]
    d = np.sqrt(2.0 / n) * np.cos(np.pi * (2 * i + 1) * k / (2 * n))
    d[0, :] = np.sqrt(1.0 / n)
    d.setflags(write=False)
    return d


def idct2(coef: np.ndarray, h: int, w: int) -> np.ndarray:
    """Images ``N x h x w x C`` from coefficients ``N x fh x fw x C`` of the top-left (lowest
    frequency) ``fh x fw`` block; the other coefficients are 0."""
    fh, fw = coef.shape[1], coef.shape[2]
    dh, dw = dct_matrix(h)[:fh], dct_matrix(w)[:fw]
    z = np.moveaxis(coef, 3, 1)                      # N x C x fh x fw
    out = dh.T @ z @ dw                              # N x C x h x w
    return np.moveaxis(out, 1, 3)


def block_sizes(h: int, w: int, ratio: float) -> tuple[int, int]:
    """The low-frequency block ``round(ratio * H) x round(ratio * W)``, at least 1 x 1 and at
    most the image."""
    return (min(h, max(1, int(round(ratio * h)))), min(w, max(1, int(round(ratio * w)))))


def _rings(h: int, w: int, freq_ratio: float, stride_ratio: float) -> np.ndarray:
    """Per frequency (u, v) its ring: 0 for the initial ``fh x fw`` block, then 1, 2, ... for
    each band of ``sh`` rows / ``sw`` columns added around it (the authors' ``block_order``:
    start with the top-left ``initial_size`` block, expand by ``stride`` whenever exhausted)."""
    fh, fw = block_sizes(h, w, freq_ratio)
    sh, sw = block_sizes(h, w, stride_ratio)
    u = np.arange(h)[:, None]
    v = np.arange(w)[None, :]
    ru = np.where(u < fh, 0, (u - fh) // sh + 1)
    rv = np.where(v < fw, 0, (v - fw) // sw + 1)
    return np.maximum(ru, rv)


def low_frequency_order(rng: np.random.Generator, n: int, shape: tuple[int, int, int],
                        freq_ratio: float, stride_ratio: float, length: int) -> np.ndarray:
    """For each of ``n`` images, the first ``length`` coordinates (flat indices over
    ``H x W x C``, row-major) of an independent random order that visits the low-frequency
    block first and then each next ring (randomised within a ring and across channels), as
    SimBA-DCT's ``strided`` order; int64 ``n x length``."""
    h, w, c = shape
    d = h * w * c
    length = max(0, min(int(length), d))
    ring = np.repeat(_rings(h, w, freq_ratio, stride_ratio).reshape(-1), c).astype(np.float64)
    if n == 0 or length == 0:
        return np.zeros((n, length), dtype=np.int64)
    key = ring[None, :] + rng.random((n, d))         # ring first, random inside a ring
    if length < d:
        part = np.argpartition(key, length - 1, axis=1)[:, :length]
        sub = np.take_along_axis(key, part, axis=1)
        return np.take_along_axis(part, np.argsort(sub, axis=1), axis=1).astype(np.int64)
    return np.argsort(key, axis=1).astype(np.int64)


def low_frequency_noise(rng: np.random.Generator, n: int, shape: tuple[int, int, int],
                        ratio: float) -> np.ndarray:
    """``n`` Gaussian images restricted to the low-frequency subspace: i.i.d. N(0, 1)
    coefficients in the top-left ``round(ratio H) x round(ratio W)`` block of each channel,
    the rest 0, transformed back (the authors' ``sample_gaussian_torch``). ``ratio >= 1``:
    ordinary pixel-space Gaussian noise. float64 ``n x H x W x C``; each image is scaled to a
    root-mean-square of 1 per pixel, so the probe size means the same for every ratio."""
    h, w, c = shape
    if ratio >= 1.0:
        out = rng.standard_normal((n, h, w, c))
    else:
        fh, fw = block_sizes(h, w, ratio)
        out = idct2(rng.standard_normal((n, fh, fw, c)), h, w)
    rms = np.sqrt(np.mean(out.reshape(n, -1) ** 2, axis=1))
    return out / np.maximum(rms, 1e-12).reshape(n, 1, 1, 1)
