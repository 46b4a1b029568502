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
* the bound (``bound``: IEEE-A9) and, where the venv holds one, the reference tool's
  surrogate success, transfer rate and throughput at the same bound / grid / iterations
  (Foolbox 3.3.4 SpatialAttack and SparseL1DescentAttack, ART 1.20.1
  FeatureAdversariesPyTorch; none for DR and the generator). Ours is judged on its uint8
  outputs, the reference on its float outputs (as the tool reports it).

Never part of the test run.

    python bench/transfer_more.py [--n 100] [--threads 2]
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

#: attack id -> (params, the bound in words)
SETTINGS: dict[str, tuple[dict[str, Any], str]] = {
    "spatial": ({"max_rotation": 30.0, "max_translation": 3 / 28, "rotation_steps": 31,
                 "translation_steps": 5}, "rotation <= 30 deg, shift <= 3 px (grid 31x5x5)"),
    "sparse_l1": ({"epsilon": 10.0, "steps": 20, "percentile": 99.0}, "L1 <= 10.0"),
    "dispersion_reduction": ({"epsilon": 0.2, "steps": 40}, "Linf <= 0.2, layer features.3"),
    "fast_feature": ({"epsilon": 0.1, "steps": 30}, "Linf <= 0.1, layer classifier.2"),
    "advgan": ({"epsilon": 0.1}, "Linf <= 0.1 (60 epochs)"),
}


def _predict(model: torch.nn.Module, t: torch.Tensor) -> np.ndarray:
    with torch.inference_mode():
        return model.eval()(t).argmax(dim=1).numpy()


def _rates(sur: torch.nn.Module, tgt: torch.nn.Module, adv: torch.Tensor, y: np.ndarray
           ) -> tuple[float, float]:
    return (float(np.mean(_predict(sur, adv) != y)), float(np.mean(_predict(tgt, adv) != y)))


def _reference(attack_id: str, params: dict[str, Any], sur: torch.nn.Module,
               x: np.ndarray, y: np.ndarray, guides: np.ndarray
               ) -> tuple[str, torch.Tensor, float] | None:
    """(tool, float adversarials, seconds), or None where the venv has no reference."""
    xt, yt = to_tensor(x), torch.from_numpy(y.astype(np.int64))
    if attack_id in ("spatial", "sparse_l1"):
        import foolbox as fb
        fmodel = fb.PyTorchModel(sur.eval(), bounds=(0.0, 1.0))
        t0 = time.perf_counter()
        if attack_id == "spatial":
            atk = fb.attacks.SpatialAttack(
                max_translation=params["max_translation"] * 28, max_rotation=params["max_rotation"],
                num_translations=params["translation_steps"],
                num_rotations=params["rotation_steps"], grid_search=True)
            _, adv, _ = atk(fmodel, xt, fb.criteria.Misclassification(yt))
        else:
            atk = fb.attacks.SparseL1DescentAttack(quantile=params["percentile"] / 100,
                                                   rel_stepsize=0.2, steps=params["steps"])
            _, adv, _ = atk(fmodel, xt, yt, epsilons=params["epsilon"])
        return "foolbox " + fb.__version__, adv, time.perf_counter() - t0
    if attack_id == "fast_feature":
        import art
        from art.attacks.evasion import FeatureAdversariesPyTorch
        from art.estimators.classification import PyTorchClassifier
        flat = torch.nn.Sequential(Normalise(sur), *sur.features, *sur.classifier).eval()
        clf = PyTorchClassifier(model=flat, loss=torch.nn.CrossEntropyLoss(),
                                input_shape=(1, 28, 28), nb_classes=10, clip_values=(0.0, 1.0))
        eps, steps = params["epsilon"], params["steps"]
        atk = FeatureAdversariesPyTorch(clf, delta=eps, layer="8", max_iter=steps,
                                        step_size=2.5 * eps / steps, batch_size=len(x),
                                        verbose=False)
        xf = xt.numpy()
        t0 = time.perf_counter()
        adv = atk.generate(xf, xf[guides])
        return "art " + art.__version__, torch.from_numpy(adv), time.perf_counter() - t0
    return None


def rows(n_images: int = 100) -> list[dict[str, Any]]:
    """One row per attack (see the module doc)."""
    sur_c, tgt_c = load_model("fmnist-surrogate"), load_model("fmnist-cnn")
    sur, tgt = sur_c.model.eval(), tgt_c.model.eval()
    x_all, y_all = load_fashion_mnist("test", limit=max(4 * n_images, 400))
    t_all = to_tensor(x_all)
    ok = np.flatnonzero((_predict(sur, t_all) == y_all) & (_predict(tgt, t_all) == y_all))
    x, y = x_all[ok[:n_images]], y_all[ok[:n_images]]
    ids = tuple(f"b{k}" for k in range(len(x)))
    out = []
    for attack_id, (params, bound) in SETTINGS.items():
        spec = ATTACKS[attack_id]
        ctx = AttackContext(spec=spec, images=x, labels=y, image_ids=ids,
                            label_sets=tuple((int(v),) for v in y),
                            params=MappingProxyType(validate_params(spec, params)), seed=0,
                            criterion=Misclassification(), surrogate=sur_c)
        generative.clear_cache()
        t0 = time.perf_counter()
        res = spec.run(ctx)
        took = time.perf_counter() - t0
        adv_u8 = np.stack([r.adversarial for r in res])
        adv = to_tensor(adv_u8)
        s_rate, t_rate = _rates(sur, tgt, adv, y)
        row: dict[str, Any] = {
            "attack": attack_id, "bound": bound, "n": len(y),
            "surrogate_success": round(s_rate, 3), "transfer_rate": round(t_rate, 3),
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
        ref = _reference(attack_id, params, sur, x, y, guides)
        if ref is not None:
            tool, radv, secs = ref
            rs, rt = _rates(sur, tgt, radv.float(), y)
            row.update({"reference": tool, "reference_surrogate_success": round(rs, 3),
                        "reference_transfer_rate": round(rt, 3),
                        "reference_images_per_s": round(len(y) / secs, 1)})
            if attack_id == "fast_feature":
                row["reference_guide_rate"] = round(
                    float(np.mean(_predict(sur, radv.float()) == y[guides])), 3)
        out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(json.dumps({"machine": platform.machine(), "torch": torch.__version__,
                      "threads": args.threads}))
    for r in rows(args.n):
        print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
