#!/usr/bin/env python3
"""Our transfer attacks against IBM's Adversarial Robustness Toolbox (ART), side by side.

FGSM and PGD (IEEE-A7, white-box on the Fashion-MNIST surrogate, then sent to the target) on
the first N test images the target classifies correctly: success rate on the target and on the
surrogate (each with its standard error), mean L2 / L-inf of the adversarials ([0, 1] scale),
wall seconds, the ratios ours / ART and the share of identical pixels. Prints JSON. Never part
of the test run.

Fortis runs at its registry defaults (PGD: 10 steps of 2.5 eps / 10, random start). ART runs at
its constructor defaults (``"settings": "reference_defaults"``; PGD: ``eps_step`` 0.1,
``max_iter`` 100, no random start) and again given Fortis's values where they differ
(``"matched"``); FGSM's defaults coincide with Fortis's (``"defaults=matched"``). ``exactness``
compares the two PGD without a random start at Fortis's steps (the same uint8 images are
expected; tests/reference checks it too).

The query attacks (Square, HopSkipJump and the other IEEE-A8 attacks) are compared with ART,
torchattacks, foolbox and bat in ``bench/attacks.py`` (one counting model function for every
tool).

    python bench/attacks_vs_art.py [--n 100] [--eps 0.1]
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time
from importlib.metadata import version

import numpy as np
import torch
from art.attacks.evasion import FastGradientMethod, ProjectedGradientDescent
from art.estimators.classification import PyTorchClassifier
from fortis.adapters.builtin import load_model
from fortis.adapters.torch_models.datasets import load_fashion_mnist
from fortis.services.perturbation.attacks import fgsm, pgd
from fortis.services.perturbation.attacks.registry import attack_spec
from torch import nn

SHAPE_NCHW = (1, 28, 28)
NUM_CLASSES = 10


def to_nchw(images: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(images.transpose(0, 3, 1, 2), dtype=np.float32) / np.float32(255)


def quantise(adv_nchw: np.ndarray, x: np.ndarray, epsilon: float) -> np.ndarray:
    """Float adversarials -> uint8 NHWC as Fortis quantises: round, clip to x +- e, [0, 255]."""
    e = math.floor(epsilon * 255 + 1e-6)
    levels = np.rint(adv_nchw.transpose(0, 2, 3, 1).astype(np.float64) * 255)
    xi = x.astype(np.int64)
    return np.clip(np.clip(levels, xi - e, xi + e), 0, 255).astype(np.uint8)


def distances(adv: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-image L2 and L-inf of (adv - x) in [0, 1] scale (adv uint8 or float in [0, 255])."""
    d = (np.asarray(adv, dtype=np.float64) - x.astype(np.float64)) / 255.0
    flat = d.reshape(len(d), -1)
    return np.sqrt(np.sum(flat ** 2, axis=1)), np.abs(flat).max(axis=1, initial=0.0)


def mean_or_none(values: np.ndarray) -> float | None:
    return round(float(np.mean(values)), 4) if len(values) else None


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return round(a / b, 3)


def ratios(ours: dict, art: dict) -> dict:
    keys = [k for k, v in ours.items() if isinstance(v, (int, float)) and k in art]
    return {k: ratio(ours[k], art[k]) for k in keys}


# ----------------------------------------------------------------------------- attacks ----


def _se(ok: np.ndarray) -> float:
    p = float(np.mean(ok))
    return round(math.sqrt(p * (1 - p) / len(ok)), 4)


def transfer_summary(advs: np.ndarray, x, y, target, surrogate, seconds: float) -> dict:
    l2, linf = distances(advs, x)
    hit_t, hit_s = target.predict(advs) != y, surrogate.predict(advs) != y
    return {"success_rate_target": round(float(np.mean(hit_t)), 4),
            "success_rate_target_se": _se(hit_t),
            "success_rate_surrogate": round(float(np.mean(hit_s)), 4),
            "success_rate_surrogate_se": _se(hit_s),
            "mean_l2": mean_or_none(l2), "mean_linf": mean_or_none(linf),
            "wall_s": round(seconds, 3)}


def bench_fgsm(x, y, target, surrogate, art_sur, eps: float) -> dict:
    t = time.perf_counter()
    ours = np.stack([r.adversarial for r in fgsm(surrogate.model, x, y, epsilon=eps)])
    t_ours = time.perf_counter() - t
    setting = {"norm": "inf", "eps_step": 0.1, "num_random_init": 0, "minimal": False,
               "batch_size": 32}   # ART's defaults: eps_step acts only with a random init
    t = time.perf_counter()
    a = FastGradientMethod(art_sur, eps=eps, **{**setting, "norm": np.inf}).generate(
        to_nchw(x), y=y)
    t_art = time.perf_counter() - t
    ref = quantise(a, x, eps)
    o = transfer_summary(ours, x, y, target, surrogate, t_ours)
    r = transfer_summary(ref, x, y, target, surrogate, t_art)
    return {"epsilon": eps, "ours": o, "art": [{"settings": "defaults=matched",
                                                 "setting": setting, **r}],
            "ratio": ratios(o, r), "pixels_identical": round(float(np.mean(ours == ref)), 6)}


def _art_pgd(art_sur, x, y, eps: float, setting: dict) -> tuple[np.ndarray, float]:
    t = time.perf_counter()
    a = ProjectedGradientDescent(art_sur, norm=np.inf, eps=eps, verbose=False,
                                 **setting).generate(to_nchw(x), y=y)
    return quantise(a, x, eps), time.perf_counter() - t


def bench_pgd(x, y, target, surrogate, art_sur, eps: float, seed: int) -> dict:
    steps = int(fortis_default("pgd", "steps"))
    step = float(fortis_default("pgd", "step_size")) or 2.5 * eps / steps
    t = time.perf_counter()
    ours = np.stack([r.adversarial for r in pgd(surrogate.model, x, y, epsilon=eps,
                                                generator=torch.Generator().manual_seed(seed))])
    t_ours = time.perf_counter() - t
    o = transfer_summary(ours, x, y, target, surrogate, t_ours)
    defaults = {"eps_step": 0.1, "max_iter": 100, "num_random_init": 0, "decay": None,
                "random_eps": False, "batch_size": 32}
    matched = {**defaults, "eps_step": step, "max_iter": steps, "num_random_init": 1}
    arts = []
    for settings, setting in (("reference_defaults", defaults), ("matched", matched)):
        np.random.seed(seed)   # ART's random init draws from numpy's global generator
        ref, secs = _art_pgd(art_sur, x, y, eps, setting)
        r = transfer_summary(ref, x, y, target, surrogate, secs)
        arts.append({"settings": settings, "setting": setting, **r, "ratio": ratios(o, r)})
    # exactness: both without a random start, at Fortis's steps and step size
    exact = np.stack([r.adversarial for r in pgd(surrogate.model, x, y, epsilon=eps,
                                                 random_start=False)])
    ref, _ = _art_pgd(art_sur, x, y, eps, {**matched, "num_random_init": 0})
    return {"epsilon": eps, "fortis_params": {"steps": steps, "step_size": step,
                                              "random_start": True},
            "ours": o, "art": arts,
            "exactness": {"steps": steps, "step_size": step, "random_start": False,
                          "pixels_identical": round(float(np.mean(exact == ref)), 6),
                          "max_level_difference": int(np.abs(exact.astype(int) - ref).max())}}


def fortis_default(attack: str, param: str):
    return next(p.default for p in attack_spec(attack).params if p.name == param)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100, help="images (correct on the target)")
    ap.add_argument("--eps", type=float, default=0.1, help="L-inf bound of FGSM/PGD")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (0: torch default; 1 is fastest for this small CNN)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    target, surrogate = load_model("fmnist-cnn"), load_model("fmnist-surrogate")
    images, labels = load_fashion_mnist("test")
    ok = np.flatnonzero(target.predict(images[: 4 * args.n]) == labels[: 4 * args.n])[: args.n]
    x, y = images[ok], labels[ok]
    art_sur = PyTorchClassifier(model=surrogate.model, loss=nn.CrossEntropyLoss(),
                                input_shape=SHAPE_NCHW, nb_classes=NUM_CLASSES,
                                clip_values=(0.0, 1.0), device_type="cpu")
    t0 = time.perf_counter()
    report = {
        "setup": {"n_images": len(x), "images": "first Fashion-MNIST test images the target "
                  "classifies correctly", "target": "fmnist-cnn", "surrogate": "fmnist-surrogate",
                  "art_version": version("adversarial-robustness-toolbox"),
                  "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
                  "python": platform.python_version(), "machine": platform.machine(),
                  "seed": args.seed},
        "fgsm": bench_fgsm(x, y, target, surrogate, art_sur, args.eps),
        "pgd": bench_pgd(x, y, target, surrogate, art_sur, args.eps, args.seed),
    }
    report["setup"]["total_wall_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
