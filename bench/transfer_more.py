#!/usr/bin/env python3
"""The five further transfer attacks of IEEE-A7 -- Spatial, Sparse L1 Descent, Dispersion
Reduction, Fast Feature, the AdvGAN-style generator -- crafted white-box on the built-in
``fmnist-surrogate`` and sent to ``fmnist-cnn``, on the first N Fashion-MNIST test images both
models classify correctly. Per attack (one JSON row each):

* ``surrogate_success``: share of the images the surrogate misclassifies after the attack
  (fast_feature: misclassifies; ``guide_rate``: takes the guide's class);
* ``transfer_rate``: share the target (fmnist-cnn) misclassifies -- the transfer rate
  fmnist-surrogate -> fmnist-cnn;
* ``images_per_s``: crafting throughput (wall clock, this machine, torch threads as set);
* the bound (``bound``: IEEE-A9) and, where the venv holds one, ``references``: the reference
  tool's surrogate success, transfer rate and throughput at the same bound (Foolbox 3.3.4
  SpatialAttack and SparseL1DescentAttack, ART 1.20.1 FeatureAdversariesPyTorch; none for DR
  and the generator), once at the tool's documented defaults (``"settings":
  "reference_defaults"``) and once given Fortis's values where they differ (``"matched"``),
  each with the ``setting`` it was given. Ours is judged on its uint8 outputs, the reference
  on its float outputs (as the tool reports it). Every rate has its standard error.

Fortis runs at its registry defaults (``SETTINGS``: only the bound is set where the attack has
one).

Never part of the test run.

    python bench/transfer_more.py [--n 100] [--threads 2] [--attacks spatial,sparse_l1]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import torch
from fortis.adapters.builtin import load_model
from fortis.adapters.torch_models.datasets import load_fashion_mnist
from fortis.services.common.params import validate_params
from fortis.services.common.seeding import rng_for
from fortis.services.perturbation.attacks import generative
from fortis.services.perturbation.attacks.base import AttackContext, Misclassification
from fortis.services.perturbation.attacks.fast_feature import choose_guides
from fortis.services.perturbation.attacks.registry import ATTACKS
from fortis.services.perturbation.attacks.sparse_l1 import l1_distance
from fortis.services.perturbation.attacks.whitebox import to_tensor

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:     # tests/reference/refkit.py: what the reference tests use too
    sys.path.insert(0, str(ROOT))
from tests.reference.refkit import Normalise  # noqa: E402

#: attack id -> (params: Fortis's registry defaults, the bound set; the bound in words)
SETTINGS: dict[str, tuple[dict[str, Any], str]] = {
    "spatial": ({}, "rotation <= 30 deg, shift <= 3 px (grid 31x5x5)"),
    "sparse_l1": ({"epsilon": 10.0}, "L1 <= 10.0"),
    "dispersion_reduction": ({"epsilon": 0.2}, "Linf <= 0.2, layer features.3"),
    "fast_feature": ({"epsilon": 0.1}, "Linf <= 0.1, layer classifier.2"),
    "advgan": ({"epsilon": 0.1}, "Linf <= 0.1 (60 epochs)"),
}

#: attack id -> (the reference's constructor defaults, the values Fortis uses where they
#: differ); functions of Fortis's validated params where Fortis's value depends on them.
#: The bound is fixed by the comparison and passed apart.
REFERENCE_SETTINGS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    # foolbox SpatialAttack: max_translation 3 px and 5 translations are Fortis's too
    "spatial": ({"max_translation": 3, "max_rotation": 30, "num_translations": 5,
                 "num_rotations": 5, "grid_search": True, "random_steps": 100},
                {"max_translation": lambda p: round(p["max_translation"] * 28, 3),
                 "max_rotation": lambda p: p["max_rotation"],
                 "num_translations": lambda p: p["translation_steps"],
                 "num_rotations": lambda p: p["rotation_steps"]}),
    # foolbox's rel_stepsize 0.2 is Fortis's eps / 5
    "sparse_l1": ({"quantile": 0.99, "rel_stepsize": 0.2, "steps": 10, "random_start": False},
                  {"quantile": lambda p: p["percentile"] / 100,
                   "steps": lambda p: p["steps"]}),
    # ART requires a step size when it runs its own PGD (its default optimizer None): none is
    # documented, so both runs take Fortis's; its default layer -1 is the network's output
    "fast_feature": ({"layer": -1, "max_iter": 100, "lambda_": 0.0, "random_start": False,
                      "step_size": lambda p: max(1 / 255, 2.5 * p["epsilon"] / p["steps"])},
                     {"layer": "8", "max_iter": lambda p: p["steps"]}),
}


def _rate(ok: np.ndarray) -> tuple[float, float]:
    p = float(np.mean(ok))
    return round(p, 3), round(float(np.sqrt(p * (1 - p) / len(ok))), 3)


def _predict(model: torch.nn.Module, t: torch.Tensor) -> np.ndarray:
    with torch.inference_mode():
        return model.eval()(t).argmax(dim=1).numpy()


def _rates(sur: torch.nn.Module, tgt: torch.nn.Module, adv: torch.Tensor, y: np.ndarray
           ) -> tuple[np.ndarray, np.ndarray]:
    """Per image: the surrogate / the target misclassifies the adversarial."""
    return _predict(sur, adv) != y, _predict(tgt, adv) != y


def _configurations(attack_id: str, params: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    defaults, matched = REFERENCE_SETTINGS[attack_id]

    def resolve(d: dict[str, Any]) -> dict[str, Any]:
        return {k: v(params) if callable(v) else v for k, v in d.items()}

    base = resolve(defaults)
    both = {**base, **resolve(matched)}
    if both == base:
        return [("defaults=matched", base)]
    return [("reference_defaults", base), ("matched", both)]


def _reference(attack_id: str, params: dict[str, Any], setting: dict[str, Any],
               sur: torch.nn.Module, x: np.ndarray, y: np.ndarray, guides: np.ndarray
               ) -> tuple[str, torch.Tensor, float]:
    """(tool, float adversarials, seconds) of the reference at ``setting``."""
    xt, yt = to_tensor(x), torch.from_numpy(y.astype(np.int64))
    if attack_id in ("spatial", "sparse_l1"):
        import foolbox as fb
        fmodel = fb.PyTorchModel(sur.eval(), bounds=(0.0, 1.0))
        t0 = time.perf_counter()
        if attack_id == "spatial":
            _, adv, _ = fb.attacks.SpatialAttack(**setting)(
                fmodel, xt, fb.criteria.Misclassification(yt))
        else:
            _, adv, _ = fb.attacks.SparseL1DescentAttack(**setting)(
                fmodel, xt, yt, epsilons=params["epsilon"])
        return "foolbox " + fb.__version__, adv, time.perf_counter() - t0
    import art
    from art.attacks.evasion import FeatureAdversariesPyTorch
    from art.estimators.classification import PyTorchClassifier
    flat = torch.nn.Sequential(Normalise(sur), *sur.features, *sur.classifier).eval()
    clf = PyTorchClassifier(model=flat, loss=torch.nn.CrossEntropyLoss(),
                            input_shape=(1, 28, 28), nb_classes=10, clip_values=(0.0, 1.0))
    atk = FeatureAdversariesPyTorch(clf, delta=params["epsilon"], batch_size=len(x),
                                    verbose=False, **setting)
    xf = xt.numpy()
    t0 = time.perf_counter()
    adv = atk.generate(xf, xf[guides])
    return "art " + art.__version__, torch.from_numpy(adv), time.perf_counter() - t0


def rows(n_images: int = 100, only: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """One row per attack (see the module doc); ``only``: these attacks (default all)."""
    sur_c, tgt_c = load_model("fmnist-surrogate"), load_model("fmnist-cnn")
    sur, tgt = sur_c.model.eval(), tgt_c.model.eval()
    x_all, y_all = load_fashion_mnist("test", limit=max(4 * n_images, 400))
    t_all = to_tensor(x_all)
    ok = np.flatnonzero((_predict(sur, t_all) == y_all) & (_predict(tgt, t_all) == y_all))
    x, y = x_all[ok[:n_images]], y_all[ok[:n_images]]
    ids = tuple(f"b{k}" for k in range(len(x)))
    out = []
    for attack_id, (params, bound) in SETTINGS.items():
        if only and attack_id not in only:
            continue
        spec = ATTACKS[attack_id]
        used = validate_params(spec, params)
        ctx = AttackContext(spec=spec, images=x, labels=y, image_ids=ids,
                            label_sets=tuple((int(v),) for v in y),
                            params=MappingProxyType(used), seed=0,
                            criterion=Misclassification(), surrogate=sur_c)
        generative.clear_cache()
        t0 = time.perf_counter()
        res = spec.run(ctx)
        took = time.perf_counter() - t0
        adv_u8 = np.stack([r.adversarial for r in res])
        adv = to_tensor(adv_u8)
        s_rate, t_rate = _rates(sur, tgt, adv, y)
        row: dict[str, Any] = {
            "attack": attack_id, "bound": bound, "n": len(y), "fortis_params": used,
            "surrogate_success": _rate(s_rate)[0], "surrogate_success_se": _rate(s_rate)[1],
            "transfer_rate": _rate(t_rate)[0], "transfer_rate_se": _rate(t_rate)[1],
            "images_per_s": round(len(y) / took, 1), "seconds": round(took, 2),
            "max_linf": round(max(r.linf for r in res), 4),
        }
        if attack_id == "sparse_l1":
            row["max_l1"] = round(max(l1_distance(a, b) for a, b in zip(x, adv_u8, strict=True)), 4)
        guides = choose_guides(y, rng_for(0, "fast_feature", *ids))
        if attack_id == "fast_feature":
            row["guide_rate"] = round(float(np.mean(_predict(sur, adv) == y[guides])), 3)
        if attack_id == "advgan":
            t0 = time.perf_counter()
            spec.run(ctx)
            row["cached_images_per_s"] = round(len(y) / (time.perf_counter() - t0), 1)
        if attack_id in REFERENCE_SETTINGS:
            row["references"] = []
            for settings, setting in _configurations(attack_id, used):
                tool, radv, secs = _reference(attack_id, used, setting, sur, x, y, guides)
                rs, rt = _rates(sur, tgt, radv.float(), y)
                ref: dict[str, Any] = {
                    "tool": tool, "settings": settings, "setting": setting,
                    "surrogate_success": _rate(rs)[0], "surrogate_success_se": _rate(rs)[1],
                    "transfer_rate": _rate(rt)[0], "transfer_rate_se": _rate(rt)[1],
                    "images_per_s": round(len(y) / secs, 1)}
                if attack_id == "fast_feature":
                    ref["guide_rate"] = round(
                        float(np.mean(_predict(sur, radv.float()) == y[guides])), 3)
                row["references"].append(ref)
        out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--attacks", default="", help="comma-separated attack ids (default: all)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(json.dumps({"machine": platform.machine(), "torch": torch.__version__,
                      "threads": args.threads}))
    for r in rows(args.n, tuple(a for a in args.attacks.split(",") if a)):
        print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
