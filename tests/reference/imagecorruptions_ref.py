"""The reference ``imagecorruptions`` 1.1.2 (PyPI; Hendrycks & Dietterich's ImageNet-C code,
packaged by Michaelis et al. 2019), importable and runnable on today's stack, for
tests/reference/test_corruptions_vs_imagecorruptions.py and bench/corruptions.py.

Test and benchmark environments only: Fortis never imports this at run time. None of the
reference's code is copied; only its module is imported and a few of its names patched for
the duration of one call. Shims:

(1) ``pkg_resources`` (gone with setuptools >= 81) is stubbed while ``imagecorruptions`` is
    imported: its only use is ``resource_filename``, for frost's texture files;
(2) numpy 2 removed ``np.float_`` (fog's plasma map): the reference module sees a numpy
    stand-in that provides it as ``float64``;
(3) scikit-image 0.19+ removed ``multichannel=`` from ``skimage.filters.gaussian``: the
    reference module's ``gaussian`` is wrapped, ``multichannel=True`` -> ``channel_axis=-1``;
(4) same draws only: the stand-in's ``random`` draws from a seeded ``numpy.random.Generator``
    with the same methods in the same order as Fortis, and ``skimage.util.random_noise``
    (impulse_noise), which seeds its own Generator, is given that one.

``imagecorruptions`` is installed with ``--no-deps``: it requires ``opencv-python``, which
would clash with our ``opencv-python-headless``; it needs Pillow, scikit-image and scipy, all
present. Its motion blur (1.1.2) is numpy-only (no Wand/ImageMagick).
"""

from __future__ import annotations

import functools
import importlib
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import skimage.filters
import skimage.util
from PIL import Image


def _resource_filename(module: str, name: str) -> str:
    """``pkg_resources.resource_filename`` for a file beside a module (here: the frost files
    next to ``imagecorruptions/corruptions.py``)."""
    return str(Path(sys.modules[module].__file__ or "").parent / name)


def _import_reference() -> types.ModuleType:
    try:
        import pkg_resources  # noqa: F401
        return importlib.import_module("imagecorruptions")
    except ImportError:
        pass
    # shim (1): frost's resource_filename only; removed again once the module is imported
    stub = types.ModuleType("pkg_resources")
    stub.resource_filename = _resource_filename  # type: ignore[attr-defined]
    sys.modules["pkg_resources"] = stub
    try:
        return importlib.import_module("imagecorruptions")
    finally:
        if sys.modules.get("pkg_resources") is stub:
            del sys.modules["pkg_resources"]


#: The package (raises ImportError when it is not installed: callers skip).
imagecorruptions = _import_reference()
_REF: Any = sys.modules["imagecorruptions.corruptions"]   # patched per call, see below

#: The reference's frost photographs (read for their statistics only; never copied).
FROST_DIR = Path(_REF.__file__).parent / "frost"
#: The files its frost() can pick: ``np.random.randint(5)`` -> indices 0..4 of its list of 6,
#: so frost6.jpg is never used (and frost2.png and frost3.png are the same picture).
FROST_FILES = ("frost1.png", "frost2.png", "frost3.png", "frost4.jpg", "frost5.jpg")


class _GeneratorRandom:
    """The part of ``numpy.random`` the reference uses, drawing from one Generator. Same
    methods, same argument order, so the same values as ours in the same order."""

    def __init__(self, rng: np.random.Generator) -> None:
        self._rng = rng

    def normal(self, loc=0.0, scale=1.0, size=None):
        return self._rng.normal(loc, scale, size)

    def uniform(self, low=0.0, high=1.0, size=None):
        return self._rng.uniform(low, high, size)

    def poisson(self, lam=1.0, size=None):
        return self._rng.poisson(lam, size)

    def randint(self, low, high=None, size=None):
        return self._rng.integers(low, high, size)


class _ForcedFirstRandint(_GeneratorRandom):
    """As ``_GeneratorRandom``, but the first ``randint`` call returns ``first`` (frost: the
    index of the photograph) without drawing; later calls draw as usual."""

    def __init__(self, rng: np.random.Generator, first: int) -> None:
        super().__init__(rng)
        self._first: int | None = first

    def randint(self, low, high=None, size=None):
        if self._first is not None:
            first, self._first = self._first, None
            return first
        return super().randint(low, high, size)


class _NumpyStandIn:
    """``numpy`` for the reference module: everything forwarded, except ``random`` (shim (4):
    a seeded Generator; or numpy's own global RNG) and ``float_`` (shim (2))."""

    float_ = np.float64

    def __init__(self, random: Any) -> None:
        self.random = random

    def __getattr__(self, name: str):
        return getattr(np, name)


_skimage_gaussian = skimage.filters.gaussian


def _gaussian_compat(image, sigma=1, *args, multichannel=None, **kwargs):
    """Shim (3): ``multichannel=True`` (scikit-image < 0.19) is ``channel_axis=-1`` now."""
    if multichannel:
        kwargs["channel_axis"] = -1
    return _skimage_gaussian(image, sigma, *args, **kwargs)


@contextmanager
def reference_draws_from(rng: np.random.Generator | None,
                         first_randint: int | None = None) -> Iterator[None]:
    """Run the reference with shims (2)-(4). ``rng`` None: it draws from numpy's global RNG as
    it was written to (benchmarks); a Generator: it makes our draws (same-draw tests).
    ``first_randint``: the value its first ``np.random.randint`` call returns (frost: which
    photograph), for stratified sampling."""
    saved = _REF.np, _REF.gaussian, skimage.util.random_noise
    if rng is None:
        random: Any = np.random
    elif first_randint is None:
        random = _GeneratorRandom(rng)
    else:
        random = _ForcedFirstRandint(rng, first_randint)
    _REF.np = _NumpyStandIn(random)
    _REF.gaussian = _gaussian_compat
    if rng is not None:
        skimage.util.random_noise = functools.partial(saved[2], rng=rng)   # shim (4)
    try:
        yield
    finally:
        _REF.np, _REF.gaussian, skimage.util.random_noise = saved


def reference_float(name: str, image: np.ndarray, severity: int,
                    rng: np.random.Generator, first_randint: int | None = None) -> np.ndarray:
    """The reference's output as float64 in [0, 255], before its ``np.uint8`` truncation."""
    with reference_draws_from(rng, first_randint):
        out = imagecorruptions.corruption_dict[name](Image.fromarray(image), severity)
    return np.clip(np.asarray(out, dtype=np.float64), 0.0, 255.0)


def reference_corrupt(name: str, image: np.ndarray, severity: int) -> np.ndarray:
    """The reference's public ``corrupt()`` (uint8 in, uint8 out), drawing from numpy's
    global RNG: what a user of the package runs (benchmarks)."""
    with reference_draws_from(None):
        return np.asarray(imagecorruptions.corrupt(image, severity=severity,
                                                   corruption_name=name))


def frost_crop_statistics(name: str, size: int = 224) -> dict[str, tuple[float, ...]]:
    """What the reference's frost() blends into a ``size`` x ``size`` RGB image, per channel
    (R, G, B), over every crop it can draw from one of its photographs: the photo is read
    (BGR) and scaled by 1.1 with cubic interpolation (the factor it uses when the photo is
    larger than the image), then a crop at (randint(0, H' - size), randint(0, W' - size)) is
    taken, i.e. every top-left corner in [0, H' - size) x [0, W' - size) with equal chance.

    Returns the mean over crops of the crop's mean (``mean``) and of its standard deviation
    (``std``), the standard deviation over crops of the crop's mean (``mean_sd``), and the
    mean over crops of the skewness of the crop's luminance (BT.601; ``skew``); exact
    (summed-area tables over all corners, no sampling)."""
    import cv2

    bgr = cv2.imread(str(FROST_DIR / name))
    if bgr is None:
        raise FileNotFoundError(FROST_DIR / name)
    fh, fw = bgr.shape[:2]
    if fh < size or fw < size:
        raise ValueError(f"{name} is smaller than {size} px: the reference would rescale it")
    scaled = cv2.resize(bgr, (int(np.ceil(fw * 1.1)), int(np.ceil(fh * 1.1))),
                        interpolation=cv2.INTER_CUBIC)
    rgb = scaled[:, :, ::-1].astype(np.float64)
    n_y, n_x = rgb.shape[0] - size, rgb.shape[1] - size    # corners the randint calls reach
    area = float(size * size)

    def box_mean(v: np.ndarray) -> np.ndarray:
        s = cv2.integral(v, sdepth=cv2.CV_64F)
        return (s[size:size + n_y, size:size + n_x] - s[:n_y, size:size + n_x]
                - s[size:size + n_y, :n_x] + s[:n_y, :n_x]) / area

    means, stds, mean_sds = [], [], []
    for ch in range(3):
        v = rgb[:, :, ch]
        m = box_mean(v)
        var = np.maximum(box_mean(v * v) - m * m, 0.0)
        means.append(float(m.mean()))
        stds.append(float(np.sqrt(var).mean()))
        mean_sds.append(float(m.std()))
    lum = rgb @ np.array([0.299, 0.587, 0.114])
    lum -= lum.mean()                                  # keeps the third moments well-conditioned
    m1, m2, m3 = box_mean(lum), box_mean(lum ** 2), box_mean(lum ** 3)
    var = np.maximum(m2 - m1 * m1, 1e-12)
    skew = (m3 - 3 * m1 * m2 + 2 * m1 ** 3) / var ** 1.5
    return {"mean": tuple(means), "std": tuple(stds), "mean_sd": tuple(mean_sds),
            "skew": (float(skew.mean()),)}
