#!/usr/bin/env python3
"""Fortis's ImageNet-C corruptions against the reference implementation, timed in one run.

The 15 ImageNet-C corruptions (IEEE-A1..A4: gaussian_noise, shot_noise, impulse_noise,
defocus_blur, glass_blur, motion_blur, zoom_blur, snow, frost, fog, brightness, contrast,
elastic_transform, pixelate, jpeg_compression) at severities 1, 3 and 5 on N (default 64)
natural RGB photos of 224x224: crops of the photos available offline (scikit-image's bundled
photos and Debian darknet's test photos), each a random square crop (55-100% of the shorter
side, seeded), maybe mirrored, area-resized to 224x224.

Each call is timed with ``time.perf_counter``: Fortis's ``apply_corruption`` (uint8 in, uint8
out) and the reference's public ``imagecorruptions.corrupt`` (uint8 in, uint8 out; version
1.1.2, run with the import shims of tests/reference/imagecorruptions_ref.py and drawing from
numpy's global RNG as it was written to). The two are interleaved image by image, alternating
which goes first, so machine noise hits both alike. Before timing, each corruption runs once
per severity on both sides (caches, lazy imports). Reported per corruption and severity:
seconds summed over the images for each side and the speedup (reference / ours); the
per-corruption speedup is over all its severities; ``geomean_speedup`` is the geometric mean
of the 15 per-corruption speedups, ``min_speedup`` the smallest. Prints JSON. Never part of
the test run.

Settings: ``imagecorruptions.corrupt`` takes nothing but the corruption and the severity, and
Fortis's corruptions use its parameter tables per severity, so the reference runs once at its
defaults, which are Fortis's (``"settings": "defaults=matched"``).

    python bench/corruptions.py [--n 64] [--severities 1,3,5] [--corruptions a,b,...]
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

import cv2
import numpy as np
from fortis.services.perturbation.corruptions import apply_corruption
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
IMAGENET_C = ("gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "glass_blur",
              "motion_blur", "zoom_blur", "snow", "frost", "fog", "brightness", "contrast",
              "elastic_transform", "pixelate", "jpeg_compression")
SIZE = 224
SKIMAGE_PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "stereo_motorcycle")
DARKNET_DIR = Path("/usr/share/darknet/data")
DARKNET_PHOTOS = ("dog", "eagle", "giraffe", "horses", "kite", "person")


def _reference() -> Any:
    """tests/reference/imagecorruptions_ref.py (the shims), importable from the repo root."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return importlib.import_module("tests.reference.imagecorruptions_ref")


def source_photos() -> list[tuple[str, np.ndarray]]:
    """The offline photos, RGB uint8."""
    out: list[tuple[str, np.ndarray]] = []
    try:
        import skimage.data
        for name in SKIMAGE_PHOTOS:
            img = getattr(skimage.data, name)()
            img = img[0] if isinstance(img, tuple) else img
            if img.ndim == 3 and img.shape[2] == 3:
                out.append((f"skimage/{name}", np.ascontiguousarray(img)))
    except ImportError:  # pragma: no cover - scikit-image is a dev dependency
        pass
    for name in DARKNET_PHOTOS:
        path = DARKNET_DIR / f"{name}.jpg"
        if path.is_file():
            with Image.open(path) as im:
                out.append((f"darknet/{name}", np.asarray(im.convert("RGB"))))
    if not out:
        raise SystemExit("no offline photos found (scikit-image data, /usr/share/darknet/data)")
    return out


def benchmark_images(n: int, seed: int = 0) -> tuple[list[np.ndarray], list[str]]:
    """n 224x224 RGB crops, round-robin over the photos, seeded."""
    sources = source_photos()
    rng = np.random.default_rng(seed)
    images, names = [], []
    for i in range(n):
        name, photo = sources[i % len(sources)]
        h, w = photo.shape[:2]
        side = int(min(h, w) * rng.uniform(0.55, 1.0))
        top = int(rng.integers(0, h - side + 1))
        left = int(rng.integers(0, w - side + 1))
        crop = photo[top:top + side, left:left + side]
        if rng.random() < 0.5:
            crop = crop[:, ::-1]
        images.append(np.ascontiguousarray(
            cv2.resize(np.ascontiguousarray(crop), (SIZE, SIZE), interpolation=cv2.INTER_AREA)))
        names.append(name)
    return images, names


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run(corruption_ids: list[str], severities: list[int], images: list[np.ndarray],
        ref: Any) -> dict[str, Any]:
    table: dict[str, Any] = {}
    for cid in corruption_ids:
        # warm-up: caches and lazy imports on both sides
        for s in severities:
            apply_corruption(cid, images[0], s, np.random.default_rng(0))
            np.random.seed(0)
            ref.reference_corrupt(cid, images[0], s)
        per_sev: dict[str, Any] = {}
        ours_total = ref_total = 0.0
        for s in severities:
            t_ours = t_ref = 0.0
            for i, img in enumerate(images):
                seed = 1_000 * s + i
                rng = np.random.default_rng(seed)
                np.random.seed(seed)

                def mine(cid: str = cid, img: np.ndarray = img, s: int = s,
                         rng: np.random.Generator = rng) -> object:
                    return apply_corruption(cid, img, s, rng)

                def theirs(cid: str = cid, img: np.ndarray = img, s: int = s) -> object:
                    return ref.reference_corrupt(cid, img, s)

                if i % 2 == 0:
                    t_ours += _timed(mine)
                    t_ref += _timed(theirs)
                else:
                    t_ref += _timed(theirs)
                    t_ours += _timed(mine)
            per_sev[str(s)] = {"ours_s": round(t_ours, 4), "reference_s": round(t_ref, 4),
                               "speedup": round(t_ref / t_ours, 2)}
            ours_total += t_ours
            ref_total += t_ref
        calls = len(images) * len(severities)
        table[cid] = {"ours_s": round(ours_total, 4), "reference_s": round(ref_total, 4),
                      "speedup": round(ref_total / ours_total, 2),
                      "ours_ms_per_image": round(1000 * ours_total / calls, 3),
                      "reference_ms_per_image": round(1000 * ref_total / calls, 3),
                      "per_severity": per_sev}
        print(f"{cid}: {table[cid]['speedup']}x", file=sys.stderr, flush=True)
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=64, help="number of 224x224 photos (default 64)")
    ap.add_argument("--severities", default="1,3,5", help="comma-separated, default 1,3,5")
    ap.add_argument("--corruptions", default=",".join(IMAGENET_C),
                    help="comma-separated ids (default: the 15 ImageNet-C corruptions)")
    ns = ap.parse_args()
    severities = [int(s) for s in ns.severities.split(",") if s]
    corruption_ids = [c for c in ns.corruptions.split(",") if c]
    ref = _reference()
    images, names = benchmark_images(ns.n)
    t0 = time.perf_counter()
    table = run(corruption_ids, severities, images, ref)
    speedups = {cid: row["speedup"] for cid, row in table.items()}
    slowest = min(speedups, key=lambda c: speedups[c])
    out = {
        "benchmark": "corruptions_vs_imagecorruptions",
        "settings": "defaults=matched",
        "n_images": len(images), "image_shape": [SIZE, SIZE, 3], "severities": severities,
        "photos": sorted(set(names)),
        "geomean_speedup": round(math.exp(float(np.mean(np.log(list(speedups.values()))))), 2),
        "min_speedup": speedups[slowest], "min_speedup_corruption": slowest,
        "all_faster": all(v > 1.0 for v in speedups.values()),
        "total_ours_s": round(sum(r["ours_s"] for r in table.values()), 3),
        "total_reference_s": round(sum(r["reference_s"] for r in table.values()), 3),
        "wall_s": round(time.perf_counter() - t0, 1),
        "corruptions": table,
        "timing": "perf_counter per call, ours and reference interleaved image by image "
                  "(alternating which runs first), after one warm-up call per severity",
        "python": platform.python_version(), "machine": platform.machine(),
        "cpus": os.cpu_count(), "opencv_threads": cv2.getNumThreads(),
        "versions": {pkg: version(pkg) for pkg in ("numpy", "opencv-python-headless", "pillow",
                                                  "scikit-image", "scipy", "imagecorruptions")},
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
