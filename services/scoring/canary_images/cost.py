"""CANARY perturbation cost (CAN-4; seed 003, Sun et al. 2023, paper 3.1.3). Pure domain code
(no gRPC), numpy and torch only.

:func:`perturbation_cost` returns (JSON-able)::

    n                 adversarial examples averaged over (the successful ones, see below)
    AMD               mean ||x_a - x||_inf                                   paper 3.1.3 (2)
    AED               mean ||x_a - x||_2 / ||x||_0
    APCR              mean ||x_a - x||_0 / ||x||_0
    AED_FD_L          mean ||phi_ll(x_a) - phi_ll(x)||_2            (one-level 2-D Haar DWT)
    AED_FD_H          mean ||phi_lh+hl+hh(x_a) - phi_lh+hl+hh(x)||_2
    ALMS              mean MS-GMSD(x_a, x)          (Zhang, Sander, Bermak 2017, MS-GMSDc)
    ADMS              mean DISTS(x_a, x)            (Ding et al. 2020; user-supplied weights)

Every metric is a node ``{"value", "n", "status", "reason"}``: ``status`` is ``"ok"``,
``"not available"`` (an input the metric needs is missing, e.g. DISTS weights) or ``"not
applicable"`` (the metric has no meaning here, e.g. no successful adversarial example);
``value`` is then ``None``, never 0.

Scale: images are uint8 (divided by 255) or float in [0, 1]; every distance is on the [0, 1]
scale, as in the authors' code (``img / 255``). Which examples: the paper defines ALMS and
ADMS over "all successfully attacked adversarial examples" and the authors' code averages
every perturbation metric over those only (``ground_valid``); pass ``include`` (a boolean
mask, normally ``clean correct and adversarial wrong``) to do the same.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np
from fortis.services.common.arrays import chunk_slices
from fortis.services.common.errors import InvalidArgument
from fortis.services.scoring.canary_images.common import (
    NOT_APPLICABLE,
    NOT_AVAILABLE,
    check_images,
    check_mask,
    mean_node,
    missing_node,
    to_unit,
)
from fortis.services.scoring.canary_images.haar import haar_split
from fortis.services.scoring.canary_images.similarity import MS_GMSD_MIN_SIZE, DistsModel, ms_gmsd

__all__ = ["perturbation_cost"]


def perturbation_cost(
    clean: Any,
    adversarial: Any,
    *,
    include: Any = None,
    change_tolerance: float = 0.0,
    l0_denominator: Literal["size", "nonzero"] = "size",
    dists: DistsModel | None = None,
    chunk_size: int = 32,
) -> dict[str, Any]:
    """CAN-4 perturbation-awareness cost of adversarial examples (see the module docstring).

    ``clean`` and ``adversarial`` are N x H x W x C images (uint8 or float [0, 1]) of the same
    shape; ``include`` (boolean N) selects the examples averaged over: pass the successful
    ones (the paper's "successfully attacked adversarial examples"). A value counts as changed
    for APCR when ``|x_a - x| > change_tolerance`` (on the [0, 1] scale).

    ``||x||_0`` in AED and APCR: the paper writes ``/ ||x_i||_0`` and describes APCR as the
    share of modified pixels; the authors' code divides by the number of values in the image
    (``reduce(mul, img.shape)``) -- the default here (``"size"``: H*W*C). ``"nonzero"``
    counts the clean image's non-zero values instead (the literal L0 "norm"; an all-black
    image then has no AED/APCR).

    AED-FD is the plain L2 norm of each band's reconstruction (the paper's formulas for
    FD_L/FD_H carry no ``/ ||x||_0``). ALMS needs H, W >= 17 (else "not applicable"); ADMS
    needs ``dists`` (:func:`load_dists`), else "not available".
    """
    x_all = check_images(clean, "clean")
    xa_all = check_images(adversarial, "adversarial")
    if x_all.shape != xa_all.shape:
        raise InvalidArgument("adversarial", f"shape {xa_all.shape} differs from the clean "
                                             f"images' {x_all.shape}")
    if l0_denominator not in ("size", "nonzero"):
        raise InvalidArgument("l0_denominator", f"must be 'size' or 'nonzero'; got {l0_denominator!r}")
    if not (isinstance(change_tolerance, int | float) and change_tolerance >= 0
            and math.isfinite(change_tolerance)):
        raise InvalidArgument("change_tolerance", f"must be a number >= 0; got {change_tolerance!r}")
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise InvalidArgument("chunk_size", f"must be an integer >= 1; got {chunk_size!r}")
    n_total = x_all.shape[0]
    idx = np.arange(n_total)
    if include is not None:
        idx = idx[check_mask(include, "include", n_total)]
    n = int(idx.size)
    _, h, w, c = x_all.shape

    md: list[np.ndarray] = []
    ed: list[np.ndarray] = []
    pcr: list[np.ndarray] = []
    fdl: list[np.ndarray] = []
    fdh: list[np.ndarray] = []
    lms: list[np.ndarray] = []
    dms: list[np.ndarray] = []
    ms_ok = h >= MS_GMSD_MIN_SIZE and w >= MS_GMSD_MIN_SIZE and c in (1, 3)
    for sl in chunk_slices(n, chunk_size):
        sel = idx[sl]
        x = to_unit(x_all[sel])
        xa = to_unit(xa_all[sel])
        d = xa - x
        flat = np.abs(d.reshape(len(sel), -1))
        if l0_denominator == "size":
            denom = np.full(len(sel), float(h * w * c))
        else:
            denom = np.count_nonzero(x.reshape(len(sel), -1), axis=1).astype(np.float64)
            if np.any(denom == 0):
                bad = int(sel[np.flatnonzero(denom == 0)[0]])
                raise InvalidArgument("l0_denominator", f"clean image {bad} is all zeros: "
                                                        "||x||_0 = 0 (use 'size')")
        md.append(flat.max(axis=1))
        ed.append(np.sqrt((flat ** 2).sum(axis=1)) / denom)
        pcr.append((flat > change_tolerance).sum(axis=1) / denom)
        low, high = haar_split(d)
        fdl.append(np.sqrt((low.reshape(len(sel), -1) ** 2).sum(axis=1)))
        fdh.append(np.sqrt((high.reshape(len(sel), -1) ** 2).sum(axis=1)))
        if ms_ok:
            lms.append(ms_gmsd(x, xa))
        if dists is not None and c in (1, 3):
            dms.append(dists.score(x, xa))

    def cat(parts: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(parts) if parts else np.empty(0)

    empty = ("no adversarial example to average over (none included)" if n_total
             else "no adversarial example given")
    out: dict[str, Any] = {"n": n, "n_total": n_total}
    out["AMD"] = mean_node(cat(md), empty_reason=empty)
    out["AED"] = mean_node(cat(ed), empty_reason=empty, denominator=l0_denominator)
    out["APCR"] = mean_node(cat(pcr), empty_reason=empty, denominator=l0_denominator,
                            change_tolerance=float(change_tolerance))
    out["AED_FD_L"] = mean_node(cat(fdl), empty_reason=empty, wavelet="haar", levels=1)
    out["AED_FD_H"] = mean_node(cat(fdh), empty_reason=empty, wavelet="haar", levels=1)
    if not ms_ok:
        out["ALMS"] = missing_node(NOT_APPLICABLE, f"MS-GMSD needs 1 or 3 channels and images "
                                   f"of at least {MS_GMSD_MIN_SIZE} x {MS_GMSD_MIN_SIZE}; got "
                                   f"{h} x {w} x {c}", n)
    else:
        out["ALMS"] = mean_node(cat(lms), empty_reason=empty, measure="MS-GMSD",
                                chromatic=c == 3)
    if dists is not None and c not in (1, 3):
        out["ADMS"] = missing_node(NOT_APPLICABLE, f"DISTS needs grey or RGB images; got {c} "
                                   "channels", n)
    elif dists is None:
        out["ADMS"] = missing_node(NOT_AVAILABLE, "DISTS needs VGG16 ImageNet weights and the "
                                   "DISTS alpha/beta weights supplied by the user (none given)", n)
    else:
        out["ADMS"] = mean_node(cat(dms), empty_reason=empty, measure="DISTS")
    return out
