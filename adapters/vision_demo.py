"""Offline photos with hand-made ground truth for the detection and segmentation demos
(IEEE-C4 / IEEE-C5): ``write_demo_manifest`` writes the images and a JSON-lines manifest
(``dataset: {source: manifest}``) that ``fortis demo --task detection|segmentation`` evaluates
against the built-in ``haar-face`` and ``u2netp`` targets.

Photos: scikit-image's astronaut (one frontal face) and coffee (a cup on a saucer, no face),
the astronaut beside its mirror image (two faces), and Debian darknet's person.jpg (a person
seen from behind: no face). Ground truth in pixel coordinates, drawn by hand.
"""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
from fortis.services.common.errors import FailedPrecondition

#: The astronaut's face: forehead (hairline) to chin, ear to ear (x1, y1, x2, y2).
ASTRONAUT_FACE = (175.0, 65.0, 275.0, 175.0)
#: The astronaut with her helmet (salient object).
ASTRONAUT_POLYGON = [(225, 14), (270, 22), (296, 50), (300, 110), (290, 150), (305, 200),
                     (330, 262), (352, 300), (362, 345), (440, 343), (490, 372), (512, 420),
                     (512, 512), (22, 512), (18, 380), (30, 300), (52, 262), (110, 222),
                     (115, 185), (160, 150), (152, 100), (158, 50), (185, 22)]
DARKNET_PERSON = Path("/usr/share/darknet/data/person.jpg")


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


def write_demo_manifest(task: str, out_dir: Path) -> Path:
    """Write the photos and ``manifest.jsonl`` for ``task`` into ``out_dir``; returns the path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    photos = _photos()
    rows = []
    if task == "detection":
        w = photos["astronaut"].shape[1]
        x0, y0, x1, y1 = ASTRONAUT_FACE
        truth = {"astronaut": [list(ASTRONAUT_FACE)],
                 "astronaut-pair": [list(ASTRONAUT_FACE), [2 * w - x1, y0, 2 * w - x0, y1]],
                 "coffee": [], "person": []}
        for name, img in photos.items():
            cv2.imwrite(str(out_dir / f"{name}.png"), cv2.cvtColor(img, cv2.COLOR_RGB2BGR))
            rows.append({"id": name, "image": f"{name}.png", "boxes": truth[name],
                         "labels": [0] * len(truth[name]), "box_format": "xyxy"})
    elif task == "segmentation":
        # u2netp (salient object): the astronaut and the cup, both 512 px high; one size for all
        masks = {"astronaut": cv2.fillPoly(np.zeros((512, 512), np.uint8),
                                           [np.array(ASTRONAUT_POLYGON, np.int32)], 1),
                 "coffee": _coffee_mask(photos["coffee"].shape)}
        for name, mask in masks.items():
            img = photos[name]
            if img.shape[:2] != (512, 512):          # coffee is 400 x 600: pad to 512 x 600
                pad = 512 - img.shape[0]
                img = np.pad(img, ((0, pad), (0, 0), (0, 0)), constant_values=255)
                mask = np.pad(mask, ((0, pad), (0, 0)))
            img, mask = img[:, :512], mask[:, :512]
            cv2.imwrite(str(out_dir / f"{name}.png"), cv2.cvtColor(img, cv2.COLOR_RGB2BGR))
            cv2.imwrite(str(out_dir / f"{name}-mask.png"), mask.astype(np.uint8))
            rows.append({"id": name, "image": f"{name}.png", "mask": f"{name}-mask.png"})
    else:
        raise ValueError(f"unknown task {task!r}")
    path = out_dir / "manifest.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


DETECTION_PLAN = """
name: faces-demo
description: Face detection (IEEE-C4) under common corruptions, OpenCV Haar cascade served behind TargetService.
seed: 20261122
roles: {{tester: {{name: "Fortis demo", organisation: "Fortis"}}}}
target: {{name: haar-face, task: detection, endpoint: "builtin:haar-face"}}
dataset: {{source: manifest, path: "{manifest}", limit: 10}}
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
description: Salient-object segmentation (IEEE-C5) under common corruptions, U2-Net-p behind TargetService.
seed: 20261122
roles: {{tester: {{name: "Fortis demo", organisation: "Fortis"}}}}
target: {{name: u2netp, task: segmentation, endpoint: "builtin:u2netp"}}
dataset: {{source: manifest, path: "{manifest}", limit: 10}}
segmentation: {{classes: [1], miou_threshold: 0.6}}
corruptions:
  - {{id: gaussian_noise, severities: [1, 3, 5]}}
  - {{id: defocus_blur, severities: [1, 3, 5]}}
  - {{id: fog, severities: [1, 3, 5]}}
  - {{id: contrast, severities: [1, 3, 5]}}
"""


def demo_plan(task: str, manifest: Path) -> str:
    template = DETECTION_PLAN if task == "detection" else SEGMENTATION_PLAN
    return template.format(manifest=manifest.as_posix())
