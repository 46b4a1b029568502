#!/usr/bin/env python3
"""The corruption stage of an evaluation against the bare target model, in one run.

Reference: the target model alone (``predict_proba`` on uint8 batches of the plan's batch
size, ``--threads`` torch threads), images/s at the machine's best: the batches one after the
other, and spread over one thread per core (the stage runs several items side by side, each
model call on a core of its own), whichever is faster. Measured: an embedded Fortis (all five services
and the built-in target in this process, same torch threads, loopback gRPC) running a plan of
corruptions only; the corruption stage's throughput is the images it sent to the target
(through the perturbation service and the proxy, every query recorded in the ledger)
divided by the time between the stage's first progress update and the next stage's, read
from WatchEvaluation. The machine is shared and noisy, so each round brackets one stage run
with two bare passes (best of two each, before and after; their mean is the round's
reference), targets and rounds interleaved, and the median of the rounds' ratios is reported.

Targets: the built-in Fashion-MNIST CNN (``fmnist-cnn``, the Fashion-MNIST test images) and
ImageNet MobileNetV2 (``mobilenet-v2``, 224 x 224 RGB: the offline ImageNet photos, resized
and centre-cropped, and seeded flips and crops of them, written as PNGs with a manifest under
a temporary data root). Goals: the stage at >= 0.85x the bare model on Fashion-MNIST and
>= 0.9x on MobileNetV2.
Prints JSON (flat, stable top-level keys); never part of the test run.

    python bench/evaluation.py [--target fmnist-cnn,mobilenet-v2] [--rounds 3]
        [--images 2000] [--batch 64] [--mobilenet-images 32] [--mobilenet-batch 16]
        [--corruption brightness] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import best_images_per_s, command_line, machine  # noqa: E402 - bench/_report.py

GOALS = {"fmnist-cnn": 0.85, "mobilenet-v2": 0.9}
#: The stack's target as ``fortis serve`` serves it by default.
TARGETS = {"fmnist-cnn": "fmnist-cnn=builtin:fmnist-cnn",
           "mobilenet-v2": "mobilenet-v2=builtin:mobilenet-v2?output=top_k&top_k=5"}
SEVERITIES = (1, 2, 3, 4, 5)



def bare_model(name: str, images: np.ndarray, batch: int, repeats: int) -> float:
    """Images/s of the target model alone (best of ``repeats`` passes, each at the machine's
    best: one batch after the other or side by side, ``best_images_per_s``)."""
    from fortis.adapters.builtin import load_model

    model = load_model(name)

    def piece(s: int):
        def run() -> int:
            return len(model.predict_proba(images[s:s + batch]))
        return run

    pieces = [piece(s) for s in range(0, len(images), batch)]
    return max(best_images_per_s(pieces) for _ in range(repeats))


def photo_set(n: int, root: Path) -> tuple[np.ndarray, str]:
    """``n`` 224 x 224 RGB images from the offline ImageNet photos (each photo, then seeded
    flips and crops of it, resized back to 224 x 224), written as PNGs with a manifest under
    ``root``; returns them and the plan's dataset section."""
    import cv2
    from fortis.adapters.torch_models.datasets import load_imagenet_photos
    from fortis.adapters.torch_models.mobilenet import preprocess_photo

    photos = [(p.labels, preprocess_photo(p.image)) for p in load_imagenet_photos()]
    rng = np.random.default_rng(0)
    out, lines = [], []
    (root / "photos").mkdir(parents=True, exist_ok=True)
    for k in range(n):
        labels, im = photos[k % len(photos)]
        if k >= len(photos):
            if rng.random() < 0.5:
                im = im[:, ::-1]
            y, x = rng.integers(0, 33, size=2)
            im = cv2.resize(np.ascontiguousarray(im[y:y + 192, x:x + 192]), (224, 224),
                            interpolation=cv2.INTER_LINEAR)
        im = np.ascontiguousarray(im)
        cv2.imwrite(str(root / "photos" / f"{k:04d}.png"), cv2.cvtColor(im, cv2.COLOR_RGB2BGR))
        lines.append(json.dumps({"id": f"photo-{k:04d}", "image": f"photos/{k:04d}.png",
                                 "labels": [int(labels[0])]}))
        out.append(im)
    (root / "manifest.jsonl").write_text("\n".join(lines) + "\n")
    return np.stack(out), f"{{source: manifest, path: manifest.jsonl, limit: {n}}}"


def one_stage(target: str, dataset: str, n: int, corruption: str, batch: int,
              data_root: Path | None) -> dict[str, Any]:
    from fortis.client import FortisClient
    from fortis.server.app.stack import StackSettings, TargetConfig, start_stack

    key = "bench-key"
    plan = (f"name: bench\nseed: 1\ntarget: {{name: {target}}}\n"
            f"dataset: {dataset}\n"
            f"corruptions: [{{id: {corruption}, severities: {list(SEVERITIES)}}}]\n"
            f"execution: {{batch_size: {batch}}}\n")
    with tempfile.TemporaryDirectory() as tmp:
        stack = start_stack(StackSettings(state_dir=Path(tmp), api_keys={key: "bench"},
                                          data_root=data_root,
                                          targets=[TargetConfig.parse(TARGETS[target])]))
        try:
            with FortisClient(stack.address, api_key=key, timeout_s=600) as fc:
                ev = fc.submit(plan)
                marks: dict[str, list[float]] = {}
                for e in fc.watch(ev.evaluation_id, timeout_s=1800):
                    marks.setdefault(e.progress.stage, []).append(time.perf_counter())
                final = fc.get(ev.evaluation_id)
        finally:
            stack.stop(0)
    state = final.state.name if hasattr(final.state, "name") else str(final.state)
    if state != "SUCCEEDED":
        raise SystemExit(f"evaluation {ev.evaluation_id} ended {state}: {final}")
    stages = list(marks)
    i = stages.index("corruptions")
    start = marks["corruptions"][0]
    end = marks[stages[i + 1]][0] if i + 1 < len(stages) else marks["corruptions"][-1]
    sent = n * len(SEVERITIES)
    return {"images_sent": sent, "seconds": round(end - start, 3),
            "images_per_s": round(sent / (end - start), 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="fmnist-cnn,mobilenet-v2",
                    help=f"comma-separated, of: {', '.join(TARGETS)}")
    ap.add_argument("--images", type=int, default=2000, help="Fashion-MNIST test images")
    ap.add_argument("--batch", type=int, default=64, help="the Fashion-MNIST plan's batch_size")
    ap.add_argument("--mobilenet-images", type=int, default=32)
    ap.add_argument("--mobilenet-batch", type=int, default=16,
                    help="the MobileNetV2 plan's batch_size")
    ap.add_argument("--corruption", default="brightness")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (model and stack)")
    ap.add_argument("--rounds", type=int, default=3, help="paired bare/stage measurements")
    ns = ap.parse_args()
    targets = [t for t in ns.target.split(",") if t]
    for t in targets:
        if t not in TARGETS:
            ap.error(f"unknown target {t!r}; known: {', '.join(TARGETS)}")
    import torch
    from fortis.adapters.torch_models.datasets import load_fashion_mnist
    from fortis.server.cli.logs import configure

    configure("warning")            # logs to stderr: stdout is the JSON result
    torch.set_num_threads(ns.threads)
    with tempfile.TemporaryDirectory() as data:
        inputs: dict[str, tuple[np.ndarray, str, int, Path | None]] = {}
        if "fmnist-cnn" in targets:
            images, _ = load_fashion_mnist("test", limit=ns.images)
            inputs["fmnist-cnn"] = (
                images, f"{{source: fashion-mnist, split: test, limit: {ns.images}}}",
                ns.batch, None)
        if "mobilenet-v2" in targets:
            photos, section = photo_set(ns.mobilenet_images, Path(data))
            inputs["mobilenet-v2"] = (photos, section, ns.mobilenet_batch, Path(data))
        rounds: dict[str, list[dict[str, Any]]] = {t: [] for t in targets}
        for _ in range(ns.rounds):  # the machine is shared: pair each stage with a bare pass
            for t in targets:
                images, section, batch, root = inputs[t]
                before = bare_model(t, images, batch, repeats=2)
                stage = one_stage(t, section, len(images), ns.corruption, batch, root)
                after = bare_model(t, images, batch, repeats=2)
                bare = (before + after) / 2
                rounds[t].append({"bare_model_images_per_s": round(bare, 1),
                                  "bare_before_after": [round(before, 1), round(after, 1)],
                                  "corruption_stage": stage,
                                  "ratio": round(stage["images_per_s"] / bare, 3)})
                print(f"{t}: {rounds[t][-1]}", file=sys.stderr, flush=True)
    goals = []
    for t in targets:
        ratios = sorted(r["ratio"] for r in rounds[t])
        med = ratios[len(ratios) // 2]
        goals.append({"name": f"corruption stage on {t} vs the bare model", "ratio": med,
                      "target": GOALS[t], "met": med >= GOALS[t]})
    print(json.dumps({
        "benchmark": "corruption stage vs bare model",
        "command": command_line(),
        "machine": machine(),
        "goals": goals,
        "rounds": rounds,
        "settings": {"corruption": ns.corruption, "severities": list(SEVERITIES),
                     "images": {t: len(inputs[t][0]) for t in targets},
                     "batch_size": {t: inputs[t][2] for t in targets}},
    }, indent=2))


if __name__ == "__main__":
    main()
