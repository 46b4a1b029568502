"""End to end: a detection plan on a COCO dataset and a segmentation plan on a Pascal VOC
dataset, both kept as they are under the server's data root, run through the real services
against the built-in vision targets (the Haar face detector, U2-Net-p).

The demo's astronaut photo, made small, with its face box written as a COCO ``bbox``
(category "face", id 1, mapped to the detector's label 0 by name through
``dataset.label_map``) beside the coffee photo with no annotation (an image with no
objects); the astronaut's outline as a VOC SegmentationClass palette PNG (class "person",
index 15, mapped to U2-Net-p's foreground 1). Each report scores every selected image with
the task's rule (IEEE-C4 / IEEE-C5).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from fortis.client import FortisClient, progress_of
from PIL import Image

KEY = "test-key-dataset-formats"


def _run(root: Path, target: str, plan: str) -> dict[str, Any]:
    from fortis.server.app.stack import StackSettings, TargetConfig, start_stack

    stack = start_stack(StackSettings(
        state_dir=root / "state", api_keys={KEY: "tenant-a"}, data_root=root / "data",
        targets=[TargetConfig.parse(f"{target}=builtin:{target}")],
        metrics_port=0, metrics_host="127.0.0.1"))
    try:
        with FortisClient(stack.address, api_key=KEY) as fc:
            fc.validate(plan)              # ValidatePlan reads the annotations too
            ev = fc.submit(plan)
            final = fc.wait(ev.evaluation_id)
            assert progress_of(final).state == "SUCCEEDED", final.error.message
            path = fc.write_report(ev.evaluation_id, root / ev.evaluation_id)[0]
            return dict(json.loads(path.read_text()))
    finally:
        stack.stop(0)


def test_coco_detection_plan_runs_end_to_end(tmp_path):
    from fortis.adapters.vision_demo import ASTRONAUT_FACE, _photos

    photos = _photos()
    a = photos["astronaut"]
    s = 160 / a.shape[0]
    x1, y1, x2, y2 = (v * s for v in ASTRONAUT_FACE)
    folder = tmp_path / "data" / "coco" / "val"
    folder.mkdir(parents=True)
    small = cv2.resize(a, (160, 160), interpolation=cv2.INTER_AREA)
    coffee = cv2.resize(photos["coffee"], (213, 142), interpolation=cv2.INTER_AREA)
    for name, img in (("astronaut.png", small), ("coffee.jpg", coffee)):
        cv2.imwrite(str(folder / name), cv2.cvtColor(img, cv2.COLOR_RGB2BGR))
    (tmp_path / "data" / "coco" / "instances_val.json").write_text(json.dumps({
        "images": [{"id": 1, "file_name": "astronaut.png", "width": 160, "height": 160},
                   {"id": 2, "file_name": "coffee.jpg", "width": 213, "height": 142}],
        "categories": [{"id": 1, "name": "face"}],
        "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "iscrowd": 0,
                         "bbox": [x1, y1, x2 - x1, y2 - y1]}]}))
    report = _run(tmp_path, "haar-face", """
name: coco-detection
seed: 3
target: {name: haar-face, task: detection}
dataset: {source: coco, path: coco/instances_val.json, images: coco/val, limit: 2,
          label_map: {face: 0}}
detection: {mode: threshold, iou_threshold: 0.5, aggregate: all}
corruptions:
  - {id: contrast, severities: [1]}
""")
    acc = report["metrics"]["accuracy"]
    # the face found with the mapped label, nothing found on the coffee (IEEE-C4)
    assert acc["m"] == 2 and acc["value"] == 1.0, acc


@pytest.mark.usefixtures("vision_setup")
def test_voc_segmentation_plan_runs_end_to_end(tmp_path):
    from fortis.adapters.vision_demo import ASTRONAUT_POLYGON, _photos

    a = _photos()["astronaut"]
    mask = cv2.fillPoly(np.zeros((512, 512), np.uint8),
                        [np.array(ASTRONAUT_POLYGON, np.int32)], 15)
    img = cv2.resize(a, (128, 128), interpolation=cv2.INTER_AREA)
    m = cv2.resize(mask, (128, 128), interpolation=cv2.INTER_NEAREST)
    voc = tmp_path / "data" / "VOCdevkit" / "VOC2012"
    for sub in ("JPEGImages", "SegmentationClass", "ImageSets/Segmentation"):
        (voc / sub).mkdir(parents=True)
    cv2.imwrite(str(voc / "JPEGImages" / "astro_1.jpg"), cv2.cvtColor(img, cv2.COLOR_RGB2BGR),
                [cv2.IMWRITE_JPEG_QUALITY, 95])
    pal = Image.fromarray(m, mode="L").convert("P")
    pal.putpalette([c for j in range(256) for c in (j, j // 2, 255 - j)])
    pal.save(voc / "SegmentationClass" / "astro_1.png")
    (voc / "ImageSets" / "Segmentation" / "val.txt").write_text("astro_1\n")
    report = _run(tmp_path, "u2netp", """
name: voc-segmentation
seed: 3
target: {name: u2netp, task: segmentation}
dataset: {source: voc, path: VOCdevkit/VOC2012, split: val, limit: 1,
          label_map: {person: 1}}
segmentation: {classes: [1], miou_threshold: 0.3}
corruptions:
  - {id: contrast, severities: [1]}
""")
    acc = report["metrics"]["accuracy"]
    assert acc["m"] == 1 and acc["value"] == 1.0, acc       # the outline found (IEEE-C5)
