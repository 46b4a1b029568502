"""Perceptual distances behind ALMS and ADMS (CAN-4, CANARY seed 003): MS-GMSD (Zhang, Sander,
Bermak 2017, as piq computes it) and DISTS (Ding et al. 2020, from weights the user supplies;
Fortis downloads nothing). Domain code: no gRPC; torch for the convolutions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from fortis.services.common.errors import InvalidArgument
from torch import nn

__all__ = ["MS_GMSD_MIN_SIZE", "MS_GMSD_SCALE_WEIGHTS", "DistsModel", "load_dists", "ms_gmsd"]

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
