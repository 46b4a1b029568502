"""The Spatial attack (IEEE-A7 transfer; Engstrom et al. 2019, "Exploring the landscape of
spatial robustness"): the worst rotation + translation of each image over a grid, "worst"
meaning the highest loss of the local surrogate -- cross-entropy on the true label
(untargeted), minus the cross-entropy on the target label (targeted) -- crafted on the
surrogate (or an ensemble: ``whitebox.py``) and sent to the target afterwards.

**The grid** (the paper's grid-search adversary): ``rotation_steps`` angles evenly spaced in
``[-max_rotation, +max_rotation]`` degrees times ``translation_steps`` shifts evenly spaced in
``[-max_translation, +max_translation]`` (a fraction of the image's width, resp. height) along
each axis, so ``rotation_steps * translation_steps**2`` transformations per image (the
paper's MNIST grid: 30 degrees, 3 of 28 px, 31 x 5 x 5 = 775). The identity is always
a candidate when a step count is odd. Each transformed image is resampled bilinearly
(``torch.nn.functional.grid_sample``) with the area moved in from outside filled with black
(zeros), as the paper does, rounded to uint8, and the surrogate's loss judged *on that uint8
image* (what the target will receive); the highest loss wins, ties to the first grid point.
Everything runs under ``torch.inference_mode`` (no gradient: it is a search).

**The bound (IEEE-A9)** is not an Lp ball: it is the transformation range, fixed before the
attack and recorded in the parameters (``max_rotation``, ``max_translation``). The spec's
norm is ``"spatial"`` (``base.NORMS``); the results' ``linf`` / ``l2`` fields still measure
the pixel distance honestly (a rotation moves many pixels far). :func:`worst_transforms`
returns the chosen angle and shifts per image, so the bound can be checked on the output.

Nothing here queries the target: ``success`` is None, ``queries`` 0, stop reason
``iterations``. Registry entry: :data:`SPEC`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from fortis.services.common.errors import InvalidArgument
from fortis.services.common.params import Param

from .base import AttackContext, AttackResult, AttackSpec, check_batch
from .whitebox import WhiteBox, chunks, crafted, to_tensor

__all__ = ["SPEC", "Grid", "run", "transform", "worst_transforms"]



@dataclass(frozen=True, kw_only=True)
class Grid:
    """The transformation grid: angles in degrees, shifts as fractions of width / height."""

    max_rotation: float = 30.0
    max_translation: float = 3.0 / 28.0
    rotation_steps: int = 31
    translation_steps: int = 5

    def __post_init__(self) -> None:
        for name in ("max_rotation", "max_translation"):
            v = float(getattr(self, name))
            if not math.isfinite(v) or v < 0:
                raise InvalidArgument(f"params.{name}", f"must be a finite number >= 0, got {v!r}")
        for name in ("rotation_steps", "translation_steps"):
            v = getattr(self, name)
            if isinstance(v, bool) or int(v) != v or v < 1:
                raise InvalidArgument(f"params.{name}", f"must be an integer >= 1, got {v!r}")

    @staticmethod
    def _axis(limit: float, steps: int) -> np.ndarray:
        return np.zeros(1) if steps == 1 or limit == 0 else np.linspace(-limit, limit, steps)

    def points(self) -> np.ndarray:
        """(K, 3): every (angle degrees, shift x fraction, shift y fraction) of the grid."""
        rots = self._axis(self.max_rotation, self.rotation_steps)
        shifts = self._axis(self.max_translation, self.translation_steps)
        return np.array([(a, tx, ty) for a in rots for tx in shifts for ty in shifts],
                        dtype=np.float64)


def transform(x: torch.Tensor, params: np.ndarray) -> torch.Tensor:
    """Rotate each image of ``x`` (N x C x H x W, [0, 1]) by ``params[:, 0]`` degrees about its
    centre (in pixel space; positive: clockwise on screen, rows counted downwards), then
    shift it right by ``params[:, 1]`` of its width and down by ``params[:, 2]`` of its
    height; bilinear resampling, zeros (black) where nothing comes in."""
    p = torch.as_tensor(np.asarray(params, dtype=np.float64), dtype=torch.float64)
    theta = torch.deg2rad(p[:, 0])
    c, s = torch.cos(theta), torch.sin(theta)
    fx, fy = p[:, 1], p[:, 2]
    h, w = x.shape[-2:]
    # affine_grid maps each output point (coordinates normalised to [-1, 1]) to the input
    # point it samples: output(q) = input(R(-theta) (q - t)) in pixel units, rewritten in
    # normalised units (a pixel is 2/W wide and 2/H high).
    m = torch.zeros((p.shape[0], 2, 3), dtype=torch.float64)
    m[:, 0, 0], m[:, 0, 1] = c, s * (h / w)
    m[:, 1, 0], m[:, 1, 1] = -s * (w / h), c
    m[:, 0, 2] = -2.0 * (c * fx + s * fy * (h / w))
    m[:, 1, 2] = -2.0 * (-s * fx * (w / h) + c * fy)
    grid = F.affine_grid(m.to(x.dtype), list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


def _u8(t: torch.Tensor) -> torch.Tensor:
    """Round to the uint8 levels the target will receive (still float [0, 1])."""
    return torch.round(t.clamp(0.0, 1.0) * 255.0) / 255.0


def worst_transforms(wb: WhiteBox, images: np.ndarray, grid: Grid
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For uint8 ``images`` (the WhiteBox's batch, in order): the uint8 adversarials (each
    image at its worst grid point), the chosen (angle, shift x, shift y) per image, and
    whether the surrogate got each clean image right."""
    pts = grid.points()
    n = images.shape[0]
    advs = np.empty_like(images)
    chosen = np.zeros((n, 3), dtype=np.float64)
    correct = np.zeros(n, dtype=bool)
    with wb, torch.inference_mode():
        for _start, rows in chunks(n):
            xs = images[rows]
            x = to_tensor(xs)
            correct[rows] = wb.check_classifier(x, rows)
            best = torch.full((xs.shape[0],), -math.inf, dtype=torch.float64)
            best_k = torch.zeros(xs.shape[0], dtype=torch.long)
            # one pass per grid point over the chunk (K x chunk forward rows in blocks)
            per = max(1, 2048 // max(1, xs.shape[0]))
            for k0 in range(0, len(pts), per):
                block = pts[k0:k0 + per]
                kk = len(block)
                xr = x.repeat(kk, 1, 1, 1)
                pr = np.repeat(block, xs.shape[0], axis=0)
                cand = _u8(transform(xr, pr))
                loss = wb.loss(cand, np.tile(rows, kk)).to(torch.float64).view(kk, -1)
                val, arg = loss.max(dim=0)
                better = val > best
                best = torch.where(better, val, best)
                best_k = torch.where(better, arg + k0, best_k)
            sel = pts[best_k.numpy()]
            chosen[rows] = sel
            out = _u8(transform(x, sel))
            advs[rows] = np.rint(out.permute(0, 2, 3, 1).numpy() * 255.0).astype(np.uint8)
    return advs, chosen, correct


def _grid(params: object) -> Grid:
    p = dict(params)  # type: ignore[call-overload]
    return Grid(max_rotation=float(p["max_rotation"]),
                max_translation=float(p["max_translation"]),
                rotation_steps=int(p["rotation_steps"]),
                translation_steps=int(p["translation_steps"]))


def run(ctx: AttackContext) -> list[AttackResult]:
    images, _ = check_batch(ctx.images, ctx.labels)
    wb = WhiteBox.from_ctx(ctx)
    advs, _, correct = worst_transforms(wb, images, _grid(ctx.params))
    return crafted(images, advs, correct)


SPEC = AttackSpec(
    id="spatial", kind="transfer", family="spatial", norms=("spatial",),
    refs=("IEEE-A7", "IEEE-A9"), needs_surrogate=True, stochastic=False, targeted=True,
    description="Spatial attack (Engstrom et al. 2019): the worst rotation + translation of "
                "each image over a grid, judged by the local surrogate's loss, then sent to "
                "the target; bounded by the transformation range, not an Lp ball",
    params=(
        Param(name="max_rotation", type="float", default=30.0, minimum=0.0, maximum=180.0,
              description="largest rotation in degrees, either way (the bound, IEEE-A9; "
                          "the paper uses 30)"),
        Param(name="max_translation", type="float", default=round(3.0 / 28.0, 6),
              minimum=0.0, maximum=0.5,
              description="largest shift as a fraction of the image's width / height, each "
                          "axis, either way (the bound, IEEE-A9; the paper: 3 px of 28)"),
        Param(name="rotation_steps", type="int", default=31, minimum=1, maximum=361,
              description="angles on the grid (the paper uses 31)"),
        Param(name="translation_steps", type="int", default=5, minimum=1, maximum=61,
              description="shifts on the grid per axis (the paper uses 5)"),
    ),
    run=run)
