"""CANARY image-level metrics (seed 003, Sun et al. 2023): perturbation cost (CAN-4) and the
Grad-CAM maps behind ACAMC (CAN-2). Pure domain code (no gRPC), numpy and torch only.

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
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np
import torch
import torch.nn.functional as F
from fortis.services.common.errors import InvalidArgument
from torch import nn

__all__ = [
    "MS_GMSD_MIN_SIZE",
    "MS_GMSD_SCALE_WEIGHTS",
    "DistsModel",
    "WhiteBoxModel",
    "acamc",
    "cosine_similarity",
    "grad_cam",
    "haar_dwt2",
    "haar_idwt2",
    "haar_split",
    "load_dists",
    "ms_gmsd",
    "perturbation_cost",
    "resolve_layer",
]

OK = "ok"
NOT_AVAILABLE = "not available"
NOT_APPLICABLE = "not applicable"

_RANGE_TOL = 1e-6  # float images may overshoot [0, 1] by rounding this much
_SQRT1_2 = 1.0 / math.sqrt(2.0)


# --------------------------------------------------------------------------------------------
# Result nodes (shared with canary.py)
# --------------------------------------------------------------------------------------------


def ok_node(value: float, n: int, **extra: Any) -> dict[str, Any]:
    """A computed metric."""
    return {"value": float(value), "n": int(n), "status": OK, "reason": None, **extra}


def missing_node(status: str, reason: str, n: int = 0, **extra: Any) -> dict[str, Any]:
    """A metric that could not be computed: ``value`` None with the reason, never 0."""
    return {"value": None, "n": int(n), "status": status, "reason": reason, **extra}


def mean_node(values: np.ndarray, *, empty_reason: str, **extra: Any) -> dict[str, Any]:
    """Mean of ``values`` or "not applicable" when there is none."""
    if values.size == 0:
        return missing_node(NOT_APPLICABLE, empty_reason, 0, **extra)
    return ok_node(float(np.mean(values)), int(values.size), **extra)


# --------------------------------------------------------------------------------------------
# Input checks
# --------------------------------------------------------------------------------------------


def check_images(images: Any, field: str) -> np.ndarray:
    """N x H x W x C (or N x H x W grey) uint8, or float in [0, 1]. Returns the array as given
    (4-D); :func:`to_unit` converts a slice to float64 [0, 1]."""
    a = np.asarray(images)
    if a.ndim == 3:
        a = a[..., None]
    if a.ndim != 4 or 0 in a.shape:
        raise InvalidArgument(field, f"must be N x H x W x C images (or N x H x W grey); "
                                     f"got shape {tuple(np.shape(images))}")
    if a.dtype == np.uint8:
        return a
    if a.dtype == np.bool_ or not np.issubdtype(a.dtype, np.floating):
        raise InvalidArgument(field, f"must be uint8 or float in [0, 1]; got dtype {a.dtype}")
    if not np.all(np.isfinite(a)):
        raise InvalidArgument(field, "contains NaN or infinite values")
    lo, hi = float(a.min()), float(a.max())
    if lo < -_RANGE_TOL or hi > 1.0 + _RANGE_TOL:
        raise InvalidArgument(field, f"float images must lie in [0, 1]; got [{lo:.4g}, {hi:.4g}]"
                                     " (uint8 images are scaled by 1/255)")
    return a


def to_unit(a: np.ndarray) -> np.ndarray:
    """uint8 -> float64 / 255; float -> float64 clipped to [0, 1]."""
    if a.dtype == np.uint8:
        return a.astype(np.float64) / 255.0
    return np.clip(a.astype(np.float64), 0.0, 1.0)


def check_mask(mask: Any, field: str, n: int) -> np.ndarray:
    m = np.asarray(mask)
    if m.shape != (n,):
        raise InvalidArgument(field, f"must be a boolean vector of length {n}; got shape {m.shape}")
    if m.dtype != np.bool_:
        if not np.issubdtype(m.dtype, np.integer) or not np.isin(m, (0, 1)).all():
            raise InvalidArgument(field, "must be boolean (or 0/1)")
        m = m.astype(bool)
    return m


def _chunks(n: int, size: int) -> Iterator[slice]:
    for start in range(0, n, size):
        yield slice(start, min(n, start + size))


# --------------------------------------------------------------------------------------------
# One-level 2-D Haar DWT (AED-FD, CAN-4)
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# MS-GMSD (ALMS, CAN-4)
# --------------------------------------------------------------------------------------------

#: Scale weights of MS-GMSD (Zhang, Sander, Bermak, ICASSP 2017), finest scale first.
MS_GMSD_SCALE_WEIGHTS = (0.096, 0.596, 0.289, 0.019)
#: Smallest height/width for four scales (2 ** 4 + 1).
MS_GMSD_MIN_SIZE = 2 ** len(MS_GMSD_SCALE_WEIGHTS) + 1
_GMS_T = 170.0      # stability constant on the 0..255 scale
_GMS_ALPHA = 0.5    # masking coefficient
_CHROMA_BETA1 = 0.01
_CHROMA_BETA2 = 0.32
_CHROMA_BETA3 = 15.0
_RGB2YIQ = torch.tensor([[0.299, 0.587, 0.114],
                         [0.5959, -0.2746, -0.3213],
                         [0.2115, -0.5227, 0.3112]], dtype=torch.float64)


def _gmsd(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """GMSD with masking of N x 1 x H x W luminance on the 0..255 scale -> N."""
    prewitt = torch.tensor([[-1.0, 0.0, 1.0]] * 3, dtype=x.dtype) / 3.0
    kernels = torch.stack([prewitt, prewitt.T])[:, None]  # 2 x 1 x 3 x 3
    gx = F.conv2d(x, kernels, padding=1).pow(2).sum(dim=1).sqrt()
    gy = F.conv2d(y, kernels, padding=1).pow(2).sum(dim=1).sqrt()
    prod = gx * gy
    gms = ((2.0 - _GMS_ALPHA) * prod + _GMS_T) / (gx ** 2 + gy ** 2 - _GMS_ALPHA * prod + _GMS_T)
    return (gms - gms.mean(dim=(1, 2), keepdim=True)).pow(2).mean(dim=(1, 2)).sqrt()


def ms_gmsd(reference: np.ndarray, distorted: np.ndarray, *, chromatic: bool = True) -> np.ndarray:
    """Multi-scale gradient magnitude similarity deviation per image (ALMS's G, CAN-4).

    Zhang, Sander & Bermak, "Gradient magnitude similarity deviation on multiple scales for
    color image quality assessment" (ICASSP 2017), as implemented by piq's
    ``MultiScaleGMSDLoss``, which the CANARY authors call (``chromatic=True, data_range=1``):

    - images scaled to 0..255; RGB converted to YIQ, the GMSD is taken on Y (grey images are
      their own Y);
    - four scales: scale 0 is the image, each next one a 2 x 2 average (zero-padded at the
      bottom/right when a side is odd);
    - per scale, Prewitt gradient magnitudes m_r, m_d (zero padding) and the masked similarity
      ``GMS = ((2 - a) m_r m_d + T) / (m_r^2 + m_d^2 - a m_r m_d + T)``, a = 0.5, T = 170;
      GMSD_j = the standard deviation of GMS over the pixels;
    - ``G = sqrt(sum_j w_j GMSD_j^2)`` with w = (0.096, 0.596, 0.289, 0.019);
    - ``chromatic`` (RGB only, MS-GMSDc): with the I, Q RMSE ``c`` (taken, as piq does, at the
      coarsest scale), ``gamma = 2 / (1 + 0.32 exp(-15 G)) - 1`` and the score
      ``gamma G + (1 - gamma) 0.01 c``.

    Inputs are N x H x W x C in [0, 1] (float64), H and W >= 17. Identical images score 0.
    """
    x = torch.from_numpy(np.ascontiguousarray(reference, dtype=np.float64)).permute(0, 3, 1, 2)
    y = torch.from_numpy(np.ascontiguousarray(distorted, dtype=np.float64)).permute(0, 3, 1, 2)
    if x.shape != y.shape:
        raise InvalidArgument("distorted", f"shape {tuple(y.shape)} differs from {tuple(x.shape)}")
    if x.shape[2] < MS_GMSD_MIN_SIZE or x.shape[3] < MS_GMSD_MIN_SIZE:
        raise InvalidArgument("reference", f"MS-GMSD needs images of at least "
                                           f"{MS_GMSD_MIN_SIZE} x {MS_GMSD_MIN_SIZE}")
    x = x * 255.0
    y = y * 255.0
    channels = x.shape[1]
    if channels == 3:
        x = torch.einsum("nchw,dc->ndhw", x, _RGB2YIQ)
        y = torch.einsum("nchw,dc->ndhw", y, _RGB2YIQ)
    elif channels != 1:
        raise InvalidArgument("reference", f"MS-GMSD needs 1 or 3 channels; got {channels}")
    per_scale = []
    for scale in range(len(MS_GMSD_SCALE_WEIGHTS)):
        if scale > 0:
            pad = max(x.shape[2] % 2, x.shape[3] % 2)
            x = F.avg_pool2d(F.pad(x, [0, pad, 0, pad]), kernel_size=2)
            y = F.avg_pool2d(F.pad(y, [0, pad, 0, pad]), kernel_size=2)
        per_scale.append(_gmsd(x[:, :1], y[:, :1]))
    weights = torch.tensor(MS_GMSD_SCALE_WEIGHTS, dtype=torch.float64)
    score = (weights[None, :] * torch.stack(per_scale, dim=1) ** 2).sum(dim=1).sqrt()
    if chromatic and channels == 3:
        rmse_iq = (x[:, 1:] - y[:, 1:]).pow(2).mean(dim=(2, 3)).sqrt()
        rmse_chroma = rmse_iq.pow(2).sum(dim=1).sqrt()
        gamma = 2.0 / (1.0 + _CHROMA_BETA2 * torch.exp(-_CHROMA_BETA3 * score)) - 1.0
        score = gamma * score + (1.0 - gamma) * _CHROMA_BETA1 * rmse_chroma
    return score.numpy()


# --------------------------------------------------------------------------------------------
# DISTS (ADMS, CAN-4): only with weights the user supplies
# --------------------------------------------------------------------------------------------

_DISTS_CHANNELS = (3, 64, 128, 256, 512, 512)
# torchvision VGG16 ``features``: conv indices and their (in, out) channels; 4, 9, 16, 23 are
# the max-pools that DISTS replaces by L2 pooling; the stages end after 3, 8, 15, 22, 29.
_VGG16_CONVS = {0: (3, 64), 2: (64, 64), 5: (64, 128), 7: (128, 128), 10: (128, 256),
                12: (256, 256), 14: (256, 256), 17: (256, 512), 19: (512, 512), 21: (512, 512),
                24: (512, 512), 26: (512, 512), 28: (512, 512)}
_VGG16_POOLS = {4: 64, 9: 128, 16: 256, 23: 512}
_DISTS_STAGE_ENDS = (3, 8, 15, 22, 29)
_IMAGENET_MEAN = (0.485, 0.456, 0.406)
_IMAGENET_STD = (0.229, 0.224, 0.225)


class _L2Pool(nn.Module):
    """DISTS's L2 pooling: sqrt(hanning-3x3 * x^2), stride 2."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        a = torch.tensor([0.5, 1.0, 0.5])  # np.hanning(5)[1:-1]
        g = a[:, None] * a[None, :]
        self.register_buffer("kernel", (g / g.sum())[None, None].repeat(channels, 1, 1, 1))
        self.channels = channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kernel: torch.Tensor = self.kernel  # type: ignore[assignment]
        out = F.conv2d(x ** 2, kernel, stride=2, padding=1, groups=self.channels)
        return (out + 1e-12).sqrt()


class DistsModel(nn.Module):
    """DISTS (Ding, Ma, Wang, Simoncelli 2020): VGG16 features with L2 pooling, structure and
    texture similarity per channel, weighted by the learnt alpha/beta (1475 each).

    Build with :func:`load_dists` from the two files the user supplies (Fortis downloads
    nothing): torchvision's ImageNet VGG16 state dict and the DISTS alpha/beta weights.
    """

    def __init__(self, vgg16_state: dict[str, torch.Tensor], alpha: torch.Tensor,
                 beta: torch.Tensor) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for idx in range(30):
            if idx in _VGG16_CONVS:
                cin, cout = _VGG16_CONVS[idx]
                conv = nn.Conv2d(cin, cout, kernel_size=3, padding=1)
                with torch.no_grad():
                    conv.weight.copy_(vgg16_state[f"{idx}.weight"])
                    assert conv.bias is not None
                    conv.bias.copy_(vgg16_state[f"{idx}.bias"])
                layers.append(conv)
            elif idx in _VGG16_POOLS:
                layers.append(_L2Pool(_VGG16_POOLS[idx]))
            else:
                layers.append(nn.ReLU(inplace=False))
        self.features = nn.Sequential(*layers)
        total = sum(_DISTS_CHANNELS)
        self.register_buffer("alpha", alpha.reshape(1, total, 1, 1).to(torch.float32))
        self.register_buffer("beta", beta.reshape(1, total, 1, 1).to(torch.float32))
        self.register_buffer("mean", torch.tensor(_IMAGENET_MEAN).view(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor(_IMAGENET_STD).view(1, 3, 1, 1))
        self.requires_grad_(False)
        self.eval()

    def _features(self, x: torch.Tensor) -> list[torch.Tensor]:
        mean: torch.Tensor = self.mean  # type: ignore[assignment]
        std: torch.Tensor = self.std  # type: ignore[assignment]
        feats = [x]
        h = (x - mean) / std
        for idx, layer in enumerate(self.features):
            h = layer(h)
            if idx in _DISTS_STAGE_ENDS:
                feats.append(h)
        return feats

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """N x 3 x H x W in [0, 1] (float32) -> N distances (0 for identical images)."""
        alpha_all: torch.Tensor = self.alpha  # type: ignore[assignment]
        beta_all: torch.Tensor = self.beta  # type: ignore[assignment]
        with torch.no_grad():
            fx, fy = self._features(x), self._features(y)
            w_sum = alpha_all.sum() + beta_all.sum()
            alphas = torch.split(alpha_all / w_sum, list(_DISTS_CHANNELS), dim=1)
            betas = torch.split(beta_all / w_sum, list(_DISTS_CHANNELS), dim=1)
            c1 = c2 = 1e-6
            dist1 = torch.zeros(x.shape[0], 1, 1, 1)
            dist2 = torch.zeros(x.shape[0], 1, 1, 1)
            for k in range(len(_DISTS_CHANNELS)):
                xm = fx[k].mean(dim=(2, 3), keepdim=True)
                ym = fy[k].mean(dim=(2, 3), keepdim=True)
                s1 = (2 * xm * ym + c1) / (xm ** 2 + ym ** 2 + c1)
                dist1 = dist1 + (alphas[k] * s1).sum(dim=1, keepdim=True)
                xv = ((fx[k] - xm) ** 2).mean(dim=(2, 3), keepdim=True)
                yv = ((fy[k] - ym) ** 2).mean(dim=(2, 3), keepdim=True)
                cov = (fx[k] * fy[k]).mean(dim=(2, 3), keepdim=True) - xm * ym
                s2 = (2 * cov + c2) / (xv + yv + c2)
                dist2 = dist2 + (betas[k] * s2).sum(dim=1, keepdim=True)
            return 1.0 - (dist1 + dist2).reshape(-1)

    def score(self, reference: np.ndarray, distorted: np.ndarray) -> np.ndarray:
        """N x H x W x C float [0, 1] (C = 1 is repeated to RGB) -> N DISTS values."""
        if reference.shape[-1] not in (1, 3):
            raise InvalidArgument("reference", "DISTS needs grey or RGB images; got "
                                               f"{reference.shape[-1]} channels")

        def prep(a: np.ndarray) -> torch.Tensor:
            t = torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).permute(0, 3, 1, 2)
            return t.repeat(1, 3, 1, 1) if t.shape[1] == 1 else t
        return self(prep(reference), prep(distorted)).numpy().astype(np.float64)


def _load_state(path: str | Path, field: str) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise InvalidArgument(field, f"no such file: {p}")
    try:
        state = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unreadable file is the caller's input error
        raise InvalidArgument(field, f"cannot read torch weights from {p}: {e}") from None
    if not isinstance(state, dict):
        raise InvalidArgument(field, f"{p} does not hold a state dict")
    return state


def load_dists(vgg16_weights: str | Path, dists_weights: str | Path) -> DistsModel:
    """ADMS's DISTS model from user-supplied files (CAN-4): ``vgg16_weights`` is torchvision's
    ImageNet VGG16 state dict (``vgg16-397923af.pth``; keys ``features.<i>.weight|bias``, or
    without the ``features.`` prefix), ``dists_weights`` the DISTS file with ``alpha`` and
    ``beta`` (1475 values each; the authors' ``weights.pt``). A missing or malformed file is an
    :class:`InvalidArgument` naming the field."""
    raw = _load_state(vgg16_weights, "vgg16_weights")
    vgg: dict[str, torch.Tensor] = {}
    for key, value in raw.items():
        k = key.removeprefix("features.")
        if isinstance(value, torch.Tensor):
            vgg[k] = value
    for idx, (cin, cout) in _VGG16_CONVS.items():
        w, b = vgg.get(f"{idx}.weight"), vgg.get(f"{idx}.bias")
        if w is None or b is None or tuple(w.shape) != (cout, cin, 3, 3) or tuple(b.shape) != (cout,):
            raise InvalidArgument("vgg16_weights", f"not a VGG16 state dict: features.{idx} "
                                                   f"must be a {cin}->{cout} 3x3 convolution")
    ab = _load_state(dists_weights, "dists_weights")
    total = sum(_DISTS_CHANNELS)
    parts = {}
    for name in ("alpha", "beta"):
        t = ab.get(name)
        if not isinstance(t, torch.Tensor) or t.numel() != total:
            raise InvalidArgument("dists_weights", f"needs '{name}' with {total} values")
        parts[name] = t.detach().to(torch.float32)
    return DistsModel(vgg, parts["alpha"], parts["beta"])


# --------------------------------------------------------------------------------------------
# CAN-4 perturbation cost
# --------------------------------------------------------------------------------------------


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
    for sl in _chunks(n, chunk_size):
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


# --------------------------------------------------------------------------------------------
# Grad-CAM and ACAMC (CAN-2)
# --------------------------------------------------------------------------------------------


@runtime_checkable
class WhiteBoxModel(Protocol):
    """What ACAMC needs of a white-box model (``TorchClassifier`` has both)."""

    model: nn.Module

    def to_model_input(self, images: np.ndarray) -> torch.Tensor: ...


def resolve_layer(model: nn.Module, layer: nn.Module | str | None) -> tuple[nn.Module, str]:
    """The module Grad-CAM reads: a module of ``model``, its dotted name, or (``None``) the
    last ``nn.Conv2d`` (the paper: "generally the feature layer of the last convolutional
    layer output")."""
    named = dict(model.named_modules())
    if layer is None:
        convs = [(name, m) for name, m in named.items() if isinstance(m, nn.Conv2d)]
        if not convs:
            raise InvalidArgument("layer", "the model has no nn.Conv2d; name the layer to use")
        return convs[-1][1], convs[-1][0]
    if isinstance(layer, str):
        if layer not in named:
            raise InvalidArgument("layer", f"the model has no module named {layer!r}")
        return named[layer], layer
    for name, m in named.items():
        if m is layer:
            return m, name
    raise InvalidArgument("layer", "the module is not part of the model")


def _cams(model: nn.Module, layer: nn.Module, inputs: torch.Tensor,
          class_sets: Sequence[torch.Tensor | None]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One forward pass; Grad-CAM maps for each class set (``None`` = the predicted class).
    Returns the logits and one N x h x w map per class set."""
    captured: list[torch.Tensor] = []

    def hook(_m: nn.Module, _inp: Any, out: Any) -> Any:
        if not isinstance(out, torch.Tensor):
            raise InvalidArgument("layer", "Grad-CAM needs a layer whose output is one tensor")
        captured.append(out)
        return out.clone()  # later in-place ops cannot touch the captured activation

    handle = layer.register_forward_hook(hook)
    try:
        with torch.enable_grad():
            x = inputs.detach().clone().requires_grad_(True)
            logits = model(x)
    finally:
        handle.remove()
    if not captured:
        raise InvalidArgument("layer", "the layer was not run by the model's forward pass")
    act = captured[-1]
    if act.ndim != 4:
        raise InvalidArgument("layer", f"Grad-CAM needs an N x K x h x w activation; got "
                                       f"{tuple(act.shape)}")
    predicted = logits.argmax(dim=1)
    maps = []
    for i, classes in enumerate(class_sets):
        cls = predicted if classes is None else classes
        score = logits.gather(1, cls.view(-1, 1).to(torch.long)).sum()
        (grad,) = torch.autograd.grad(score, act, retain_graph=i < len(class_sets) - 1)
        weights = grad.mean(dim=(2, 3), keepdim=True)          # a_k^c = 1/Z sum_ij dy^c/dA^k_ij
        maps.append(torch.relu((weights * act).sum(dim=1)).detach())  # ReLU(sum_k a_k^c A^k)
    return logits.detach(), maps


def grad_cam(model: nn.Module, inputs: torch.Tensor, classes: Sequence[int] | torch.Tensor,
             *, layer: nn.Module | str | None = None) -> np.ndarray:
    """Grad-CAM maps ``L^c = ReLU(sum_k a_k^c A^k)``, ``a_k^c = mean_ij d y^c / d A^k_ij``
    (Selvaraju et al. 2017; CANARY 3.1.2 ACAMC, CAN-2) of ``inputs`` (N x C x H x W, the model's
    own input) for ``classes`` (one per image). ``y^c`` is the model's pre-softmax score (as in
    Grad-CAM and the CANARY code); ``A`` is ``layer``'s output (default: the last Conv2d).
    Returns N x h x w float64 maps at the layer's resolution (not normalised or resized).
    The model should be in eval mode (batch-norm statistics fixed); it is not switched."""
    module, _ = resolve_layer(model, layer)
    cls = torch.as_tensor(classes, dtype=torch.long).reshape(-1)
    if cls.numel() != inputs.shape[0]:
        raise InvalidArgument("classes", f"need one class per image ({inputs.shape[0]}); "
                                         f"got {cls.numel()}")
    _, maps = _cams(model, module, inputs, [cls])
    return maps[0].to(torch.float64).numpy()


def cosine_similarity(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity of N x ... arrays; NaN where either row is all zeros."""
    fa = np.asarray(a, dtype=np.float64).reshape(len(a), -1)
    fb = np.asarray(b, dtype=np.float64).reshape(len(b), -1)
    na, nb = np.linalg.norm(fa, axis=1), np.linalg.norm(fb, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        sim = (fa * fb).sum(axis=1) / (na * nb)
    sim[(na == 0) | (nb == 0)] = np.nan
    return np.clip(sim, -1.0, 1.0)


class _BareModel:
    """A bare ``nn.Module`` taking float N x C x H x W in [0, 1]."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def to_model_input(self, images: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(to_unit(images).astype(np.float32)).permute(0, 3, 1, 2)


def _model_input(wb: WhiteBoxModel, images: np.ndarray) -> torch.Tensor:
    if images.dtype == np.uint8:
        return wb.to_model_input(images)
    # Float adversarial examples (kept as float arrays, CAN-9) go in as they are; they must
    # already have the model's input size.
    spec = getattr(wb, "input_spec", None)
    t = torch.from_numpy(to_unit(images).astype(np.float32)).permute(0, 3, 1, 2)
    if spec is not None and tuple(t.shape[1:]) != (spec.channels, spec.height, spec.width):
        raise InvalidArgument("adv_images", f"float images must already be "
                                            f"{spec.height} x {spec.width} x {spec.channels} "
                                            "(the model's input); pass uint8 to have them resized")
    return t


def acamc(
    white_box: WhiteBoxModel | nn.Module | None,
    clean_images: Any,
    adv_images: Any,
    labels: Any,
    *,
    layer: nn.Module | str | None = None,
    batch_size: int = 32,
) -> dict[str, Any]:
    """ACAMC-A and ACAMC-T (CAN-2, CANARY 3.1.2): mean cosine similarity of Grad-CAM maps
    before and after the attack,

        ACAMC-A = 1/n sum_i S(L_{x_i}^{F(x_i)}, L_{x_i^a}^{F(x_i^a)})   (inferred class)
        ACAMC-T = 1/n sum_i S(L_{x_i}^{y_i},    L_{x_i^a}^{y_i})        (true class)

    over the images the white-box model classifies correctly (F(x_i) = y_i, judged by the
    model itself). An image whose map is all zeros on either side has no cosine and is left
    out of that metric (as the authors' code does; counted in ``zero_maps``).

    ``white_box``: a :class:`WhiteBoxModel` (e.g. ``TorchClassifier``: uint8 images go
    through its ``to_model_input``; float images must already have its input size) or a bare
    ``nn.Module`` on float N x C x H x W in [0, 1]. ``None`` -> both "not available".
    """
    if white_box is None:
        reason = "needs a white-box model (Grad-CAM on its convolutional layer); none given"
        return {"ACAMC_A": missing_node(NOT_AVAILABLE, reason),
                "ACAMC_T": missing_node(NOT_AVAILABLE, reason), "layer": None}
    wb: WhiteBoxModel = _BareModel(white_box) if isinstance(white_box, nn.Module) else white_box
    if not isinstance(wb, WhiteBoxModel):
        raise InvalidArgument("white_box", "must be a torch nn.Module or have .model and "
                                           ".to_model_input (e.g. TorchClassifier)")
    x_all = check_images(clean_images, "clean_images")
    xa_all = check_images(adv_images, "adv_images")
    if x_all.shape[0] != xa_all.shape[0]:
        raise InvalidArgument("adv_images", f"{xa_all.shape[0]} images for "
                                            f"{x_all.shape[0]} clean images")
    y_all = np.asarray(labels)
    if y_all.shape != (x_all.shape[0],) or not np.issubdtype(y_all.dtype, np.integer):
        raise InvalidArgument("labels", f"must be {x_all.shape[0]} integer labels")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InvalidArgument("batch_size", f"must be an integer >= 1; got {batch_size!r}")
    module, layer_name = resolve_layer(wb.model, layer)

    sims_a: list[np.ndarray] = []
    sims_t: list[np.ndarray] = []
    n_correct = 0
    for sl in _chunks(x_all.shape[0], batch_size):
        y = torch.from_numpy(y_all[sl].astype(np.int64))
        clean_logits, (clean_true,) = _cams(wb.model, module, _model_input(wb, x_all[sl]), [y])
        if clean_logits.shape[1] <= int(y.max()) or int(y.min()) < 0:
            raise InvalidArgument("labels", f"must lie in [0, {clean_logits.shape[1]})")
        correct = (clean_logits.argmax(dim=1) == y).numpy()
        if not correct.any():
            continue
        n_correct += int(correct.sum())
        # F(x) = y on these images, so L_x^{F(x)} is L_x^{y}: one clean map serves both.
        _, (adv_inferred, adv_true) = _cams(wb.model, module,
                                            _model_input(wb, xa_all[sl][correct]),
                                            [None, y[correct]])
        ref = clean_true[correct].numpy()
        sims_a.append(cosine_similarity(ref, adv_inferred.numpy()))
        sims_t.append(cosine_similarity(ref, adv_true.numpy()))

    out: dict[str, Any] = {"layer": layer_name, "n_correct": n_correct}
    for key, parts in (("ACAMC_A", sims_a), ("ACAMC_T", sims_t)):
        sims = np.concatenate(parts) if parts else np.empty(0)
        valid = sims[~np.isnan(sims)]
        reason = ("the model classified none of the images correctly" if n_correct == 0 else
                  "every Grad-CAM map pair had an all-zero map (no cosine similarity)")
        out[key] = mean_node(valid, empty_reason=reason, zero_maps=int(np.isnan(sims).sum()))
    return out
