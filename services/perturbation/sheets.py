"""Example sheets: one image under every perturbation of the catalogue at a few levels.

One PNG per kind (``corruption``, ``style``, ``degradation``, ``property``): a row per
perturbation, a column per level (the original first), each tile captioned. A person looks
at them to check that every perturbation does what its name says; ``fortis sheets --out DIR``
writes them. Degradation operators that need a white-box model (DEG-1 model gradient descent)
are drawn on the Fashion-MNIST sheet only when a surrogate is given.
Domain code: no gRPC.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np
from fortis.services.common.errors import InvalidArgument
from fortis.services.common.seeding import rng_for
from fortis.services.perturbation.registry import PERTURBATIONS, apply_perturbation, make_context
from fortis.services.perturbation.spec import ApplyContext, PerturbationSpec

#: Columns of each sheet (the original image is always the first column).
SHEET_LEVELS: dict[str, tuple[float, ...]] = {
    "severity": (1, 2, 3, 4, 5),
    "level": (1, 3, 5, 10, 20, 30),
    "epsilon": (0.1, 0.25, 0.5, 0.75, 1.0),
}
KINDS = ("corruption", "style", "degradation", "property")
_LABEL_H = 18
_NAME_W = 190


def _fit(image: np.ndarray, size: int) -> np.ndarray:
    """Centre-crop to a square and resize to ``size`` (RGB uint8)."""
    h, w = image.shape[:2]
    s = min(h, w)
    y, x = (h - s) // 2, (w - s) // 2
    sq = image[y:y + s, x:x + s]
    interp = cv2.INTER_AREA if s > size else cv2.INTER_NEAREST
    out = cv2.resize(sq, (size, size), interpolation=interp)
    if out.ndim == 2:
        out = out[:, :, None]
    return np.ascontiguousarray(out)


def _rgb(tile: np.ndarray) -> np.ndarray:
    if tile.ndim == 2:
        tile = tile[:, :, None]
    return np.repeat(tile, 3, axis=2) if tile.shape[2] == 1 else tile


def _caption(width: int, text: str, height: int = _LABEL_H) -> np.ndarray:
    bar = np.full((height, width, 3), 255, np.uint8)
    cv2.putText(bar, text, (4, height - 5), cv2.FONT_HERSHEY_SIMPLEX, 0.42, (0, 0, 0), 1, cv2.LINE_AA)
    return bar


def _level_text(spec: PerturbationSpec, level: float) -> str:
    if spec.level_kind == "epsilon":
        return f"eps {level:g}"
    return f"{'sev' if spec.level_kind == 'severity' else 'level'} {int(level)}"


def render_sheet(kind: str, image: np.ndarray, *, seed: int = 0, size: int = 160,
                 model: Any = None, label: int | None = None,
                 ids: Sequence[str] | None = None) -> np.ndarray:
    """One RGB sheet: a row per perturbation of ``kind``, the original then each level."""
    specs = [s for s in PERTURBATIONS.values() if s.kind == kind and (ids is None or s.id in ids)
             and not any(p.needs_input for p in s.params)]   # e.g. neural_style: user model
    if not specs:
        raise InvalidArgument("kind", f"no perturbations of kind '{kind}'")
    base = _fit(image, size)
    rows = []
    for spec in specs:
        levels = SHEET_LEVELS[spec.level_kind]
        tiles = [_rgb(base)]
        captions = ["original"]
        ctx: ApplyContext | None = None
        skip = spec.needs_model and (model is None or label is None)
        if not skip:
            ctx = make_context(spec, model=model, label=label) if spec.needs_model else make_context(spec)
            if spec.needs_model:
                ctx = ApplyContext(params=ctx.params, model=model, label=label)
        for lv in levels:
            if skip:
                tiles.append(np.full_like(_rgb(base), 230))
                captions.append("needs a model")
                continue
            lvl: int | float = float(lv) if spec.level_kind == "epsilon" else int(lv)
            key = (spec.kind, spec.id) if spec.level_kind != "severity" else (spec.kind, spec.id, lvl)
            out = apply_perturbation(spec.id, base, lvl, rng_for(seed, *key), ctx)
            tiles.append(_rgb(out))
            captions.append(_level_text(spec, lvl))
        cells = [np.vstack([_caption(size, c), t]) for c, t in zip(captions, tiles, strict=True)]
        name = np.full((size + _LABEL_H, _NAME_W, 3), 255, np.uint8)
        cv2.putText(name, spec.id[:24], (4, _LABEL_H + size // 2), cv2.FONT_HERSHEY_SIMPLEX, 0.5,
                    (0, 0, 0), 1, cv2.LINE_AA)
        row = np.hstack([name] + [np.pad(c, ((0, 0), (0, 2), (0, 0)), constant_values=255) for c in cells])
        rows.append(row)
    width = max(r.shape[1] for r in rows)
    rows = [np.pad(r, ((0, 2), (0, width - r.shape[1]), (0, 0)), constant_values=255) for r in rows]
    title = _caption(width, f"Fortis {kind} sheet: {len(specs)} perturbations, seed {seed}", 24)
    return np.vstack([title] + rows)


def write_sheets(out_dir: Path, *, image: np.ndarray,
                 kinds: Sequence[str] | None = None, seed: int = 0, size: int = 160,
                 model: Any = None, label: int | None = None) -> list[Path]:
    """Write ``<kind>.png`` for each kind into ``out_dir``; returns the paths."""
    img = image
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for kind in kinds or KINDS:
        if kind not in KINDS:
            raise InvalidArgument("kind", f"unknown kind '{kind}'; one of {', '.join(KINDS)}")
        sheet = render_sheet(kind, img, seed=seed, size=size, model=model, label=label)
        path = out_dir / f"{kind}.png"
        cv2.imwrite(str(path), cv2.cvtColor(sheet, cv2.COLOR_RGB2BGR))
        written.append(path)
    return written
