#!/usr/bin/env python3
"""Transfer rates of Fortis's gradient transfer attacks (IEEE-A7), with and without each
booster and with a model ensemble, and crafting speed against torchattacks.

Prints one JSON object: ``rows`` (one per setting), ``speed`` (Fortis at its defaults vs
torchattacks at its own defaults and at Fortis's steps and step size, same surrogate, images/s
and white-box success) and ``meta``. Never part of the test
run: tests/reference holds the exactness checks (same uint8 images as torchattacks / ART).

    python bench/transfer.py [--n 500] [--models fmnist,imagenet] [--eps-fmnist 0.1]
                             [--eps-imagenet 0.03137] [--out result.json]

* Fashion-MNIST: crafted on ``fmnist-surrogate`` (a different CNN, trained apart), sent to
  ``fmnist-cnn`` (the target); the ensemble rows add ``fmnist-mlp`` (a third design) to the
  surrogate. Images: the first ``--n`` test images both the surrogate and the target get right.
* ImageNet: crafted on MobileNetV2, sent to EfficientNet-Lite0 (when installed: the built-in
  ``efficientnet-lite0``); images: the offline photos (bench/attacks.py ``offline_photos``,
  centre crops) plus three seeded random crops of each, those both models give the same top-1
  (that class is the label). A few dozen images: read the rates with their standard errors.

``transfer`` = share of the images the target misclassifies after the attack (all of them
were correct before; targeted rows: share the target puts in the target class), with its
standard error; ``white_box`` = the same on the surrogate (the attack's own success).
Boosters are the papers' settings scaled to the image side: DI p=0.5 (resize 0.9); TI kernel
5 on 28 px, 7 on 224 px (the paper: 15 on 299 px, against defended models); SI 5 copies; NI;
VMI 20 neighbours (5 on ImageNet, CPU time), beta 1.5. MI-FGSM: 10 steps of eps/10, decay 1.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # tests.reference.refkit

from fortis.services.perturbation.engine import AttackItem, run_attack  # noqa: E402


def _fmnist(n: int) -> dict[str, Any]:
    from fortis.adapters.builtin import load_model
    from fortis.adapters.torch_models.datasets import load_fashion_mnist

    target, sur, mlp = (load_model(k) for k in ("fmnist-cnn", "fmnist-surrogate", "fmnist-mlp"))
    x, y = load_fashion_mnist("test")
    ok = (target.predict(x) == y) & (sur.predict(x) == y)
    idx = np.flatnonzero(ok)[:n]
    return {"name": "fmnist", "x": x[idx], "y": y[idx], "target": target, "surrogate": sur,
            "ensemble": [mlp], "eps": None, "ti": 5, "vmi": 20,
            "pair": "fmnist-surrogate -> fmnist-cnn", "ensemble_name": "+ fmnist-mlp"}


def _imagenet() -> dict[str, Any] | None:
    from attacks import offline_photos  # bench/attacks.py
    from fortis.adapters.builtin import BUILTIN_MODELS, load_model
    from fortis.adapters.torch_models.mobilenet import preprocess_photo
    from PIL import Image

    if "efficientnet-lite0" not in BUILTIN_MODELS:
        return None
    sur, target = load_model("mobilenet-v2"), load_model("efficientnet-lite0")
    rng = np.random.default_rng(0)
    xs = []
    for _, img in offline_photos():
        xs.append(preprocess_photo(img))
        h, w = img.shape[:2]
        for _ in range(3):
            s = int(min(h, w) * rng.uniform(0.6, 0.9))
            top, left = int(rng.integers(0, h - s + 1)), int(rng.integers(0, w - s + 1))
            crop = Image.fromarray(img[top:top + s, left:left + s]).resize((224, 224),
                                                                          Image.BILINEAR)
            xs.append(np.asarray(crop, dtype=np.uint8))
    x = np.stack(xs)
    ps, pt = sur.predict(x), target.predict(x)
    keep = ps == pt
    return {"name": "imagenet", "x": x[keep], "y": pt[keep], "target": target,
            "surrogate": sur, "ensemble": [], "eps": None, "ti": 7, "vmi": 5,
            "pair": "mobilenet-v2 -> efficientnet-lite0", "ensemble_name": ""}


def _settings(d: dict[str, Any]) -> list[tuple[str, str, dict[str, Any], bool]]:
    """(label, attack, params without epsilon, ensemble?) in table order."""
    mi = {"steps": 10, "decay": 1.0}
    di = {"di_prob": 0.5}
    ti = {"ti_kernel": d["ti"]}
    si = {"si_copies": 5}
    ni = {"nesterov": True}
    vmi = {"vmi_samples": d["vmi"], "vmi_beta": 1.5}
    rows = [
        ("FGSM", "fgsm", {}, False),
        ("BIM (paper's steps, 1/255 each)", "bim", {}, False),
        ("PGD (10 steps, random start)", "pgd", {"steps": 10}, False),
        ("MI-FGSM", "mi_fgsm", mi, False),
        ("MI-FGSM + DI", "mi_fgsm", {**mi, **di}, False),
        ("MI-FGSM + TI", "mi_fgsm", {**mi, **ti}, False),
        ("MI-FGSM + SI", "mi_fgsm", {**mi, **si}, False),
        ("MI-FGSM + NI", "mi_fgsm", {**mi, **ni}, False),
        ("MI-FGSM + VMI", "mi_fgsm", {**mi, **vmi}, False),
        ("MI-FGSM + DI+TI+SI+NI+VMI", "mi_fgsm", {**mi, **di, **ti, **si, **ni, **vmi}, False),
        ("BIM + DI", "bim", di, False),
    ]
    if d["ensemble"]:
        rows += [("MI-FGSM, ensemble " + d["ensemble_name"], "mi_fgsm", mi, True),
                 ("MI-FGSM + DI+TI+SI+NI+VMI, ensemble " + d["ensemble_name"], "mi_fgsm",
                  {**mi, **di, **ti, **si, **ni, **vmi}, True)]
    return rows


def _rate(ok: np.ndarray) -> tuple[float, float]:
    n = max(len(ok), 1)
    p = float(np.mean(ok)) if len(ok) else float("nan")
    return round(p, 4), round(float(np.sqrt(max(p * (1 - p), 0.0) / n)), 4)


def run(d: dict[str, Any], eps: float, seed: int, targeted: bool = False) -> list[dict[str, Any]]:
    x, y = d["x"], d["y"]
    items = [AttackItem(image_id=f"{d['name']}-{k}", image=x[k], labels=(int(y[k]),))
             for k in range(len(x))]
    target_label = None
    crit = None
    if targeted:
        target_label = 0
        keep = [k for k in range(len(x)) if int(y[k]) != target_label]
        items = [items[k] for k in keep]
        x, y = x[keep], y[keep]
        crit = {"kind": "targeted_misclassification", "target_label": target_label}
    out = []
    for label, attack, params, ens in _settings(d):
        t0 = time.perf_counter()
        res = run_attack(attack, {**params, "epsilon": eps}, seed, items,
                         surrogate=d["surrogate"], ensemble=d["ensemble"] if ens else (),
                         criterion=crit)
        dt = time.perf_counter() - t0
        adv = np.stack([r.adversarial for r in res])
        assert np.abs(adv.astype(int) - x.astype(int)).max() <= int(np.floor(eps * 255 + 1e-6))
        pt, ps = d["target"].predict(adv), d["surrogate"].predict(adv)
        hit_t = pt == target_label if targeted else pt != y
        hit_s = ps == target_label if targeted else ps != y
        tr, tr_se = _rate(hit_t)
        wb, wb_se = _rate(hit_s)
        out.append({"model": d["name"], "pair": d["pair"], "setting": label, "attack": attack,
                    "params": params, "ensemble": bool(ens), "epsilon": round(eps, 5),
                    "targeted": targeted, "n": len(items), "transfer": tr, "transfer_se": tr_se,
                    "white_box": wb, "white_box_se": wb_se,
                    "craft_images_per_s": round(len(items) / dt, 1)})
        print(f"{d['name']:<9} {label:<58} transfer {tr:.3f} ± {tr_se:.3f}  "
              f"white-box {wb:.3f}  {len(items) / dt:8.1f} img/s", file=sys.stderr, flush=True)
    return out


def speed(d: dict[str, Any], eps: float, rounds: int = 5) -> list[dict[str, Any]]:
    """Crafting speed and white-box success, Fortis vs torchattacks, same surrogate (images/s;
    ``ratio`` > 1: Fortis faster). Fortis at its registry defaults; torchattacks at its
    constructor defaults (``"settings": "reference_defaults"``: alpha 2/255, 10 steps) and
    given Fortis's steps and step size (``"matched"``); FGSM has no setting but the bound
    (``"defaults=matched"``). Fortis's time includes everything ``run_attack`` does (parameter
    validation, uint8 quantisation within the bound, per-image results)."""
    import torchattacks
    from fortis.services.perturbation.attacks.bim import kurakin_steps

    from tests.reference.refkit import Frozen, to_uint8

    net = d["surrogate"].model.eval()
    x, y = d["x"], d["y"]
    items = [AttackItem(image_id=f"s{k}", image=x[k], labels=(int(y[k]),)) for k in range(len(x))]
    xt = torch.from_numpy(x).permute(0, 3, 1, 2).float() / 255.0
    yt = torch.from_numpy(y.astype(np.int64))
    bim_steps = kurakin_steps(eps)
    ta_defaults = {"alpha": 2 / 255, "steps": 10}
    # (attack, torchattacks class, its defaults, Fortis's values where they differ or None)
    cases: list[tuple[str, Any, dict[str, Any], dict[str, Any] | None]] = [
        ("fgsm", torchattacks.FGSM, {}, None),
        ("bim", torchattacks.BIM, ta_defaults, {"alpha": 1 / 255, "steps": bim_steps}),
        ("pgd", torchattacks.PGD, {**ta_defaults, "random_start": True},
         {"alpha": 2.5 * eps / 10}),
        ("mi_fgsm", torchattacks.MIFGSM, {**ta_defaults, "decay": 1.0}, {"alpha": eps / 10}),
    ]
    out = []
    for attack, cls, defaults, matched in cases:
        configs = [("defaults=matched", defaults)] if matched is None else \
            [("reference_defaults", defaults), ("matched", {**defaults, **matched})]
        for settings, setting in configs:
            atk = cls(Frozen(net), eps=eps, **setting)
            ours_t, theirs_t = [], []
            for _ in range(rounds):     # alternated, best of ``rounds``: robust to a shared CPU
                t0 = time.perf_counter()
                res = run_attack(attack, {"epsilon": eps}, 0, items, surrogate=d["surrogate"])
                ours_t.append(time.perf_counter() - t0)
                torch.manual_seed(0)
                t0 = time.perf_counter()
                theirs = np.concatenate([to_uint8(atk(xt[s:s + 32], yt[s:s + 32]))
                                         for s in range(0, len(x), 32)])  # whitebox.CHUNK
                theirs_t.append(time.perf_counter() - t0)
                net.eval()
            ours, tim = min(ours_t), min(theirs_t)
            adv = np.stack([r.adversarial for r in res])
            wb, wb_se = _rate(d["surrogate"].predict(adv) != y)
            rb, rb_se = _rate(d["surrogate"].predict(theirs) != y)
            out.append({"model": d["name"], "attack": attack, "n": len(x), "rounds": rounds,
                        "settings": settings, "torchattacks_setting": setting,
                        "fortis_images_per_s": round(len(x) / ours, 1),
                        "torchattacks_images_per_s": round(len(x) / tim, 1),
                        "ratio": round(tim / ours, 3),
                        "fortis_white_box": wb, "fortis_white_box_se": wb_se,
                        "torchattacks_white_box": rb, "torchattacks_white_box_se": rb_se})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--models", default="fmnist,imagenet")
    ap.add_argument("--eps-fmnist", type=float, default=0.1)
    ap.add_argument("--eps-imagenet", type=float, default=8 / 255)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--targeted", action="store_true", help="also the targeted rows (class 0)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--speed-only", action="store_true",
                    help="only the Fortis vs torchattacks comparison (no transfer rows)")
    a = ap.parse_args(argv)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    rows: list[dict[str, Any]] = []
    speeds: list[dict[str, Any]] = []
    meta: dict[str, Any] = {"torch": torch.__version__, "seed": a.seed,
                            "date": time.strftime("%Y-%m-%d")}
    for m in a.models.split(","):
        d = _fmnist(a.n) if m == "fmnist" else _imagenet() if m == "imagenet" else None
        if d is None:
            meta[f"{m}_skipped"] = "model not available (efficientnet-lite0 not installed?)"
            continue
        eps = a.eps_fmnist if m == "fmnist" else a.eps_imagenet
        meta[f"{m}_images"] = int(len(d["x"]))
        if not a.speed_only:
            rows += run(d, eps, a.seed)
        if a.targeted and not a.speed_only:
            rows += run(d, eps, a.seed, targeted=True)
        speeds += speed(d, eps)
    result = {"rows": rows, "speed": speeds, "meta": meta}
    text = json.dumps(result, indent=1)
    if a.out:
        a.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
