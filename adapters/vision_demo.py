"""Offline scenes with known ground truth for the detection and segmentation demos (IEEE-C4 /
IEEE-C5): ``write_demo_manifest`` writes the images and a JSON-lines manifest (``dataset:
{source: manifest}``) that ``fortis demo --task detection|segmentation`` evaluates against the
built-in ``haar-face`` and ``u2netp`` targets.

A handful of photos makes every 95% interval (IEEE-M8) span half the scale, so the demos
evaluate generated scenes, :data:`DETECTION_IMAGES` and :data:`SEGMENTATION_IMAGES` of them,
whose ground truth is known by construction (the Wilson interval of a 90% accuracy on 96
images is 0.82-0.95). Every draw comes from ``rng_for(seed, "vision-demo", task, i)``: the
same seed makes the same scenes.

- Detection (:func:`detection_scenes`): 256 x 256 crops of offline photos without faces
  (scikit-image's brick, grass, gravel, coffee, cat, rocket and Hubble pictures, scikit-learn's
  china and flower, Debian darknet's dog, eagle, giraffe, horses and kite), flipped and
  toned at random, with 0, 1 or 2 frontal faces pasted at known squares (the ground-truth
  boxes) 44-112 pixels wide: the 100 faces of scikit-image's bundled Labeled Faces in the
  Wild subset (25 x 25 grey crops, forehead to chin), enlarged and tinted.
- Segmentation (:func:`segmentation_scenes`): one salient object on a blurred, muted
  256 x 256 background (the same photos): the astronaut with her helmet and the coffee cup
  (polygons drawn by hand on scikit-image's photos), the scikit-image horse silhouette filled
  with a crop of the cat's fur, the scikit-image logo, or a generated ellipse, star or
  rounded rectangle in a random colour, 35-70% of the side, at a random place; the object's
  pixels are the ground-truth mask (class 1, "salient").

The photos the earlier demo used (astronaut, coffee, the astronaut pair, darknet's person)
and their hand-drawn ground truth stay available to tests (:data:`ASTRONAUT_FACE`,
:data:`ASTRONAUT_POLYGON`, :func:`_photos`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
from fortis.core.task import Task
from fortis.services.common.errors import FailedPrecondition
from fortis.services.common.seeding import rng_for

__all__ = ["ASTRONAUT_FACE", "ASTRONAUT_POLYGON", "DEMO_SEED", "DETECTION_IMAGES",
           "DETECTION_PLAN", "SEGMENTATION_IMAGES", "SEGMENTATION_PLAN", "demo_plan",
           "describe", "detection_scenes", "segmentation_scenes", "write_demo_manifest"]

#: The astronaut's face: forehead (hairline) to chin, ear to ear (x1, y1, x2, y2).
ASTRONAUT_FACE = (175.0, 65.0, 275.0, 175.0)
#: The astronaut with her helmet (salient object).
ASTRONAUT_POLYGON = [(225, 14), (270, 22), (296, 50), (300, 110), (290, 150), (305, 200),
                     (330, 262), (352, 300), (362, 345), (440, 343), (490, 372), (512, 420),
                     (512, 512), (22, 512), (18, 380), (30, 300), (52, 262), (110, 222),
                     (115, 185), (160, 150), (152, 100), (158, 50), (185, 22)]
DARKNET = Path("/usr/share/darknet/data")
DARKNET_PERSON = DARKNET / "person.jpg"
#: Darknet's photos without a face in them (person.jpg and scream.jpg have one).
_DARKNET_BACKGROUNDS = ("dog.jpg", "eagle.jpg", "giraffe.jpg", "horses.jpg", "kite.jpg")

#: The plans' seed, and the scenes'.
DEMO_SEED = 20261122
#: Scenes per demo: enough for a 95% interval of about +-0.06 at 90% accuracy (detection)
#: and +-0.08 (segmentation). The segmenter answers in about 0.5 s per image on 2 cores,
#: so its plan has four corrupted settings (60 x 5 queries, about 2.5 minutes).
DETECTION_IMAGES = 96
SEGMENTATION_IMAGES = 60
#: Side of every scene, pixels.
SIDE = 256


def _photos() -> dict[str, np.ndarray]:
    try:
        import skimage.data
    except ImportError as exc:     # pragma: no cover - a dependency of the distribution
        raise FailedPrecondition(f"the vision demo needs scikit-image's photos: {exc}") from None
    astronaut = np.ascontiguousarray(skimage.data.astronaut())
    out = {"astronaut": astronaut,
           "astronaut-pair": np.ascontiguousarray(np.concatenate([astronaut, astronaut[:, ::-1]], 1)),
           "coffee": np.ascontiguousarray(skimage.data.coffee())}
    if DARKNET_PERSON.exists():
        img = cv2.imread(str(DARKNET_PERSON), cv2.IMREAD_COLOR)
        if img is not None:
            out["person"] = np.ascontiguousarray(cv2.cvtColor(img, cv2.COLOR_BGR2RGB))
    return out


def _coffee_mask(shape: tuple[int, ...]) -> np.ndarray:
    m = np.zeros(shape[:2], np.uint8)
    cv2.ellipse(m, (280, 240), (202, 148), 0, 0, 360, 1, -1)
    cv2.ellipse(m, (290, 82), (118, 64), 0, 0, 360, 1, -1)
    cv2.rectangle(m, (172, 82), (408, 240), 1, -1)
    return m


def _rgb(img: np.ndarray) -> np.ndarray:
    img = np.asarray(img)
    if img.ndim == 2:
        img = np.repeat(img[:, :, None], 3, axis=2)
    return np.ascontiguousarray(img[:, :, :3])


def _backgrounds() -> list[np.ndarray]:
    """Offline photos and textures without faces, RGB, each at least :data:`SIDE` a side."""
    import skimage.data as sd
    out = [_rgb(f()) for f in (sd.brick, sd.grass, sd.gravel, sd.coffee, sd.chelsea,
                                sd.rocket, sd.hubble_deep_field)]
    try:
        from sklearn.datasets import load_sample_images
        out += [_rgb(im) for im in load_sample_images().images]
    except ImportError:                                     # pragma: no cover - optional
        pass
    for name in _DARKNET_BACKGROUNDS:
        img = cv2.imread(str(DARKNET / name), cv2.IMREAD_COLOR)
        if img is not None:
            out.append(np.ascontiguousarray(cv2.cvtColor(img, cv2.COLOR_BGR2RGB)))
    return [b if min(b.shape[:2]) >= SIDE else
            cv2.resize(b, None, fx=SIDE / min(b.shape[:2]) + 1e-6, fy=SIDE / min(b.shape[:2])
                       + 1e-6, interpolation=cv2.INTER_CUBIC) for b in out]


def _crop(rng: np.random.Generator, bg: np.ndarray) -> np.ndarray:
    """A random :data:`SIDE`-square of ``bg`` at a random zoom, flipped at random."""
    short = min(bg.shape[:2])
    side = int(rng.integers(SIDE, max(SIDE, int(short * 0.9)) + 1))
    y = int(rng.integers(0, bg.shape[0] - side + 1))
    x = int(rng.integers(0, bg.shape[1] - side + 1))
    out = cv2.resize(bg[y:y + side, x:x + side], (SIDE, SIDE), interpolation=cv2.INTER_AREA)
    return np.ascontiguousarray(out[:, ::-1] if rng.random() < 0.5 else out)


def _place(rng: np.random.Generator, sizes: list[int],
           taken: list[tuple[int, int, int, int]] | None = None) -> list[tuple[int, int]]:
    """Top-left corners for squares of ``sizes`` inside the scene, not overlapping (a few
    pixels apart): the first free spot of up to 200 draws each."""
    boxes = list(taken or [])
    out = []
    for s in sizes:
        for _ in range(200):
            x, y = int(rng.integers(0, SIDE - s + 1)), int(rng.integers(0, SIDE - s + 1))
            if all(x + s + 6 <= a or a + c + 6 <= x or y + s + 6 <= b or b + c + 6 <= y
                   for a, b, c, _ in boxes):
                break
        boxes.append((x, y, s, s))
        out.append((x, y))
    return out


def detection_scenes(n: int = DETECTION_IMAGES, seed: int = DEMO_SEED
                     ) -> Iterator[tuple[str, np.ndarray, list[list[float]]]]:
    """``n`` face scenes (module docstring): (id, RGB image, ground-truth boxes xyxy)."""
    import skimage.data as sd
    faces = (sd.lfw_subset()[:100] * 255).round().astype(np.uint8)    # the first 100: faces
    backgrounds = _backgrounds()
    for i in range(n):
        rng = rng_for(seed, "vision-demo", "detection", i)
        img = _crop(rng, backgrounds[int(rng.integers(len(backgrounds)))]).astype(np.float32)
        img = np.clip(img * rng.uniform(0.75, 1.15) + rng.uniform(-20, 20), 0, 255)
        k = int(rng.choice([0, 1, 2], p=[0.1, 0.65, 0.25]))
        sizes = [int(rng.integers(48, 113) if k == 1 else rng.integers(44, 89))
                 for _ in range(k)]
        boxes = []
        for s, (x, y) in zip(sizes, _place(rng, sizes), strict=True):
            face = faces[int(rng.integers(len(faces)))]
            face = face[:, ::-1] if rng.random() < 0.5 else face
            grey = cv2.resize(face, (s, s), interpolation=cv2.INTER_CUBIC).astype(np.float32)
            grey = np.clip((grey - 128) * rng.uniform(0.85, 1.15) + 128 + rng.uniform(-15, 15),
                           0, 255)
            tint = np.array([1.0, rng.uniform(0.8, 0.92), rng.uniform(0.66, 0.82)], np.float32)
            img[y:y + s, x:x + s] = grey[:, :, None] * tint
            boxes.append([float(x), float(y), float(x + s), float(y + s)])
        yield f"faces-{i:03d}", np.clip(np.rint(img), 0, 255).astype(np.uint8), boxes


def _objects() -> list[tuple[np.ndarray, np.ndarray]]:
    """Salient objects cut out of offline pictures: (RGB, 0/1 mask), cropped to the mask."""
    import skimage.data as sd
    ast = sd.astronaut()
    amask = cv2.fillPoly(np.zeros((512, 512), np.uint8),
                         [np.array(ASTRONAUT_POLYGON, np.int32)], 1)
    coffee = sd.coffee()
    horse = (~sd.horse()).astype(np.uint8)
    fur = cv2.resize(sd.chelsea()[20:280, 40:400], (horse.shape[1], horse.shape[0]))
    logo = sd.logo()
    out = []
    for img, m in ((ast, amask), (coffee, _coffee_mask(coffee.shape)), (fur, horse),
                   (_rgb(logo), (logo[:, :, 3] > 127).astype(np.uint8))):
        ys, xs = np.nonzero(m)
        sl = (slice(ys.min(), ys.max() + 1), slice(xs.min(), xs.max() + 1))
        out.append((np.ascontiguousarray(_rgb(img)[sl]), np.ascontiguousarray(m[sl])))
    return out


def _shape(rng: np.random.Generator, textures: list[np.ndarray]
           ) -> tuple[np.ndarray, np.ndarray]:
    """A generated object: an ellipse, a star or a rounded rectangle, in a random colour or
    a crop of a photo."""
    s = 160
    m = np.zeros((s, s), np.uint8)
    kind = int(rng.integers(3))
    if kind == 0:
        cv2.ellipse(m, (s // 2, s // 2), (s // 2 - 2, int(s * rng.uniform(0.22, 0.48))),
                    float(rng.uniform(0, 180)), 0, 360, 1, -1)
    elif kind == 1:
        points = int(rng.integers(5, 9))
        ang = np.linspace(0, 2 * np.pi, 2 * points, endpoint=False) + rng.uniform(0, np.pi)
        r = np.where(np.arange(2 * points) % 2 == 0, s / 2 - 2, s * rng.uniform(0.2, 0.32))
        pts = np.stack([s / 2 + r * np.cos(ang), s / 2 + r * np.sin(ang)], 1)
        cv2.fillPoly(m, [pts.astype(np.int32)], 1)
    else:
        h = int(s * rng.uniform(0.45, 0.8))
        y0 = (s - h) // 2
        cv2.rectangle(m, (12, y0 + 12), (s - 12, y0 + h - 12), 1, -1)
        cv2.rectangle(m, (12, y0 + 12), (s - 12, y0 + h - 12), 1, 24)
    if rng.random() < 0.6:
        img = np.zeros((s, s, 3), np.uint8) + rng.integers(0, 256, 3).astype(np.uint8)
    else:
        img = _crop(rng, textures[int(rng.integers(len(textures)))])[:s, :s]
    ys, xs = np.nonzero(m)
    sl = (slice(ys.min(), ys.max() + 1), slice(xs.min(), xs.max() + 1))
    return np.ascontiguousarray(img[sl]), np.ascontiguousarray(m[sl])


def segmentation_scenes(n: int = SEGMENTATION_IMAGES, seed: int = DEMO_SEED
                        ) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
    """``n`` salient-object scenes (module docstring): (id, RGB image, uint8 mask 0/1)."""
    backgrounds = _backgrounds()
    objects = _objects()
    for i in range(n):
        rng = rng_for(seed, "vision-demo", "segmentation", i)
        crop = _crop(rng, backgrounds[int(rng.integers(len(backgrounds)))]).astype(np.float32)
        bg = np.asarray(cv2.GaussianBlur(crop, (0, 0), float(rng.uniform(3, 6))))
        grey = bg.mean(axis=2, keepdims=True)
        mute = float(rng.uniform(0.3, 0.6))
        img = (mute * bg + (1 - mute) * grey) * rng.uniform(0.6, 0.8) + rng.uniform(30, 60)
        obj, m = objects[i % len(objects)] if i % 5 != 4 else _shape(rng, backgrounds)
        if rng.random() < 0.5:
            obj, m = obj[:, ::-1], m[:, ::-1]
        scale = rng.uniform(0.35, 0.7) * SIDE / max(obj.shape[:2])
        w = max(8, int(obj.shape[1] * scale))
        h = max(8, int(obj.shape[0] * scale))
        obj = cv2.resize(np.ascontiguousarray(obj), (w, h), interpolation=cv2.INTER_AREA)
        m = cv2.resize(np.ascontiguousarray(m), (w, h), interpolation=cv2.INTER_NEAREST)
        x, y = int(rng.integers(0, SIDE - w + 1)), int(rng.integers(0, SIDE - h + 1))
        region = img[y:y + h, x:x + w]
        region[m > 0] = obj[m > 0]
        mask = np.zeros((SIDE, SIDE), np.uint8)
        mask[y:y + h, x:x + w] = m
        yield f"objects-{i:03d}", np.clip(np.rint(img), 0, 255).astype(np.uint8), mask


def describe(task: str) -> str:
    """What the demo evaluates, in one sentence (the CLI prints it; docs say the same)."""
    if task == Task.DETECTION:
        return (f"{DETECTION_IMAGES} generated {SIDE}x{SIDE} scenes: 0-2 faces of scikit-image's "
                "bundled Labeled Faces in the Wild subset pasted at known boxes onto offline "
                f"photos (seed {DEMO_SEED})")
    return (f"{SEGMENTATION_IMAGES} generated {SIDE}x{SIDE} scenes: one salient object (cut out "
            "of scikit-image's photos, or a generated shape) at a known mask on a blurred "
            f"offline photo (seed {DEMO_SEED})")


def write_demo_manifest(task: str, out_dir: Path) -> Path:
    """Write the scenes and ``manifest.jsonl`` for ``task`` into ``out_dir``; returns the
    manifest's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []

    def write(name: str, img: np.ndarray) -> None:
        cv2.imwrite(str(out_dir / name), img)

    if task == Task.DETECTION:
        for iid, img, boxes in detection_scenes():
            write(f"{iid}.png", cv2.cvtColor(img, cv2.COLOR_RGB2BGR))
            rows.append({"id": iid, "image": f"{iid}.png", "boxes": boxes,
                         "labels": [0] * len(boxes), "box_format": "xyxy"})
    elif task == Task.SEGMENTATION:
        for iid, img, mask in segmentation_scenes():
            write(f"{iid}.png", cv2.cvtColor(img, cv2.COLOR_RGB2BGR))
            write(f"{iid}-mask.png", mask)
            rows.append({"id": iid, "image": f"{iid}.png", "mask": f"{iid}-mask.png"})
    else:
        raise ValueError(f"unknown task {task!r}")
    path = out_dir / "manifest.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


DETECTION_PLAN = """
name: faces-demo
description: >-
  Face detection (IEEE-C4) under common corruptions, OpenCV Haar cascade served behind
  TargetService. Dataset: {what}.
seed: {seed}
roles: {{tester: {{name: "Fortis demo", organisation: "Fortis"}}}}
target: {{name: haar-face, task: detection, endpoint: "builtin:haar-face"}}
dataset: {{source: manifest, path: "{manifest}", limit: {n}}}
detection: {{mode: threshold, iou_threshold: 0.5, aggregate: all}}
corruptions:
  - {{id: gaussian_noise, severities: [1, 3, 5]}}
  - {{id: defocus_blur, severities: [1, 3, 5]}}
  - {{id: contrast, severities: [1, 3, 5]}}
  - {{id: jpeg_compression, severities: [1, 3, 5]}}
  - {{id: occlusion, severities: [1, 3, 5]}}
"""

SEGMENTATION_PLAN = """
name: salient-object-demo
description: >-
  Salient-object segmentation (IEEE-C5) under common corruptions, U2-Net-p behind
  TargetService. Dataset: {what}.
seed: {seed}
roles: {{tester: {{name: "Fortis demo", organisation: "Fortis"}}}}
target: {{name: u2netp, task: segmentation, endpoint: "builtin:u2netp"}}
dataset: {{source: manifest, path: "{manifest}", limit: {n}}}
segmentation: {{classes: [1], miou_threshold: 0.6}}
corruptions:
  - {{id: gaussian_noise, severities: [3, 5]}}
  - {{id: defocus_blur, severities: [3, 5]}}
"""


def demo_plan(task: str, manifest: Path) -> str:
    template = DETECTION_PLAN if task == Task.DETECTION else SEGMENTATION_PLAN
    n = DETECTION_IMAGES if task == Task.DETECTION else SEGMENTATION_IMAGES
    return template.format(manifest=manifest.as_posix(), n=n, seed=DEMO_SEED,
                           what=describe(task))
