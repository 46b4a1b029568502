#!/usr/bin/env python3
"""C&W L2, EAD, DDN and FAB (IEEE-A7 transfer attacks, crafted on the Fashion-MNIST surrogate)
against the reference libraries, side by side: foolbox 3.3.4 (C&W, EAD, DDN), ART 1.20.1 (C&W,
EAD), torchattacks 3.5.1 (EAD-EN, FAB).

Fortis runs at its registry defaults (``fortis attacks --json``). Every reference runs at its
own documented defaults (its constructor's; ``"settings": "reference_defaults"``) and again
given Fortis's values wherever they differ (``"settings": "matched"``); where they coincide,
once (``"defaults=matched"``). Each row's ``setting`` is what the tool was given. Only the
batch size of ART's C&W / EAD is not its default (1): it changes no result, only the speed.

On the first ``n_images`` test images the surrogate classifies correctly, per attack and tool:
success rate on the surrogate judged on the uint8 images (a reference's float output rounded
to nearest; foolbox's all-zero "nothing found" sentinel counted as a failure) with its standard
error, the median distance in the attack's norm with failures counted as infinite (``null``
when more than half fail), the median over the successful images only, and crafting speed
(images / s, wall clock). Prints JSON. Never part of the test run.

    python bench/transfer_optim.py [--n 100] [--skip "cw_l2/art@matched" ...]
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
import torch
from fortis.adapters.builtin import load_model
from fortis.adapters.torch_models.datasets import load_fashion_mnist
from fortis.services.perturbation.attacks.registry import attack_spec
from fortis.services.perturbation.engine import AttackItem, run_attack
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:     # tests/reference/refkit.py: what the reference tests use too
    sys.path.insert(0, str(ROOT))
from tests.reference.refkit import Frozen, to_uint8  # noqa: E402

EAD_BETA = 0.01   # Fortis's EAD beta (its registry default; the distance of the EN norm)


def to_nchw(u8: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(u8.transpose(0, 3, 1, 2))).float() / 255.0


def distance(adv: np.ndarray, x: np.ndarray, norm: str) -> np.ndarray:
    d = (adv.astype(np.float64) - x.astype(np.float64)).reshape(len(x), -1) / 255.0
    if norm == "l2":
        return np.sqrt((d * d).sum(axis=1))
    if norm == "linf":
        return np.abs(d).max(axis=1)
    return EAD_BETA * np.abs(d).sum(axis=1) + (d * d).sum(axis=1)


def row(attack: str, tool: str, settings: str, norm: str, net: nn.Module, x: np.ndarray,
        y: np.ndarray, make: Callable[[], np.ndarray], sentinel: bool = False,
        setting: dict[str, Any] | None = None) -> dict:
    """Run one tool and measure it (``setting``: the hyper-parameters it was given)."""
    t0 = time.perf_counter()
    adv = make()
    wall = time.perf_counter() - t0
    with torch.inference_mode():
        pred = net(to_nchw(adv)).argmax(dim=1).numpy()
    ok = pred != y
    if sentinel:
        ok &= adv.reshape(len(adv), -1).any(axis=1)
    d = distance(adv, x, norm)
    all_d = np.where(ok, d, np.inf)
    med = float(np.median(all_d))
    p = float(ok.mean())
    out = {"attack": attack, "tool": tool, "settings": settings,
           "norm": "en (beta*L1+L2^2)" if norm == "en" else norm,
           "n_images": len(x), "success_rate": round(p, 4),
           "success_rate_se": round(math.sqrt(p * (1 - p) / len(x)), 4),
           "median_norm": round(med, 4) if np.isfinite(med) else None,
           "median_norm_successes": round(float(np.median(d[ok])), 4) if ok.any() else None,
           "images_per_s": round(len(x) / wall, 2), "wall_s": round(wall, 2),
           "setting": setting or {}}
    print(json.dumps(out), file=sys.stderr, flush=True)
    return out


def fortis_defaults(attack: str) -> dict[str, Any]:
    """Fortis's registry defaults of an attack (the boosters left out: off by default)."""
    boosters = {"di_prob", "di_resize", "ti_kernel", "si_copies", "ensemble_mode"}
    return {p.name: p.default for p in attack_spec(attack).params
            if p.name not in boosters and p.default is not None}


#: (attack, tool) -> (the tool's constructor defaults, the values Fortis uses where they
#: differ, or None where they coincide). Read from the installed sources.
REFERENCE_SETTINGS: dict[tuple[str, str], tuple[dict[str, Any], dict[str, Any] | None]] = {
    ("cw_l2", "foolbox"): ({"binary_search_steps": 9, "steps": 10_000, "stepsize": 0.01,
                            "confidence": 0.0, "initial_const": 1e-3, "abort_early": True},
                           {"steps": 1000}),
    ("cw_l2", "art"): ({"confidence": 0.0, "learning_rate": 0.01, "binary_search_steps": 10,
                        "max_iter": 10, "initial_const": 0.01, "max_halving": 5,
                        "max_doubling": 5},
                       {"binary_search_steps": 9, "max_iter": 1000, "initial_const": 1e-3}),
    ("ead", "foolbox"): ({"binary_search_steps": 9, "steps": 10_000, "initial_stepsize": 0.01,
                          "confidence": 0.0, "initial_const": 1e-3, "regularization": 0.01,
                          "decision_rule": "EN", "abort_early": True},
                         {"steps": 1000}),
    ("ead", "art"): ({"confidence": 0.0, "learning_rate": 0.01, "binary_search_steps": 9,
                      "max_iter": 100, "beta": 1e-3, "initial_const": 1e-3,
                      "decision_rule": "EN"},
                     {"max_iter": 1000, "beta": EAD_BETA}),
    ("ead", "torchattacks"): ({"kappa": 0, "lr": 0.01, "binary_search_steps": 9,
                               "max_iterations": 100, "abort_early": True,
                               "initial_const": 1e-3, "beta": 1e-3},
                              {"max_iterations": 1000, "beta": EAD_BETA}),
    ("ddn", "foolbox"): ({"init_epsilon": 1.0, "steps": 100, "gamma": 0.05}, None),
    # eps is FAB's bound (a comparison fixes it: unbounded here, as Fortis's epsilon 0)
    ("fab", "torchattacks"): ({"steps": 10, "n_restarts": 1, "alpha_max": 0.1, "eta": 1.05,
                               "beta": 0.9, "seed": 0, "multi_targeted": False},
                              {"steps": 100}),
}


def configurations(attack: str, tool: str) -> list[tuple[str, dict[str, Any]]]:
    defaults, matched = REFERENCE_SETTINGS[(attack, tool)]
    if matched is None:
        return [("defaults=matched", defaults)]
    return [("reference_defaults", defaults), ("matched", {**defaults, **matched})]


def rows(n_images: int = 100, skip: tuple[str, ...] = ()) -> list[dict]:
    """One dict per (attack, tool, settings). ``skip``: "attack/tool@settings" (or
    "attack/tool") left out: ART's C&W and EAD run at ~0.4 images / s at 250 iterations."""
    import foolbox as fb
    import torchattacks
    from art.attacks.evasion import CarliniL2Method, ElasticNet
    from art.estimators.classification import PyTorchClassifier

    surrogate = load_model("fmnist-surrogate")
    net = surrogate.model.eval()
    xs, ys = load_fashion_mnist("test", limit=max(4 * n_images, 256))
    with torch.inference_mode():
        keep = np.flatnonzero(net(to_nchw(xs)).argmax(dim=1).numpy() == ys)[:n_images]
    x, y = xs[keep], ys[keep]
    xt, yt = to_nchw(x), torch.from_numpy(y)
    items = [AttackItem(image_id=f"img{i}", image=x[i], labels=(int(y[i]),))
             for i in range(len(x))]
    fmodel = fb.PyTorchModel(Frozen(net), bounds=(0.0, 1.0))
    art_clf = PyTorchClassifier(model=Frozen(net), loss=nn.CrossEntropyLoss(),
                                input_shape=(1, 28, 28), nb_classes=10, clip_values=(0.0, 1.0))
    crit = fb.criteria.Misclassification(yt)
    onehot = np.eye(10)[y]

    def fortis(aid: str, params: dict) -> Callable[[], np.ndarray]:
        return lambda: np.stack([r.adversarial for r in run_attack(
            aid, params, 0, items, surrogate=surrogate)])

    makers: dict[tuple[str, str], Callable[[dict[str, Any]], Callable[[], np.ndarray]]] = {
        ("cw_l2", "foolbox"): lambda p: lambda: to_uint8(fb.attacks.L2CarliniWagnerAttack(**p)(
            fmodel, xt, crit, epsilons=None)[0]),
        ("cw_l2", "art"): lambda p: lambda: to_uint8(CarliniL2Method(
            art_clf, batch_size=32, verbose=False, **p).generate(xt.numpy(), y=onehot)),
        ("ead", "foolbox"): lambda p: lambda: to_uint8(fb.attacks.EADAttack(**p)(
            fmodel, xt, crit, epsilons=None)[0]),
        ("ead", "art"): lambda p: lambda: to_uint8(ElasticNet(
            art_clf, batch_size=32, verbose=False, **p).generate(xt.numpy(), y=onehot)),
        ("ead", "torchattacks"): lambda p: lambda: to_uint8(torchattacks.EADEN(
            Frozen(net), **p)(xt, yt)),
        ("ddn", "foolbox"): lambda p: lambda: to_uint8(fb.attacks.DDNAttack(**p)(
            fmodel, xt, crit, epsilons=None)[0]),
    }
    sentinel = {"foolbox"}
    norms = {"cw_l2": "l2", "ead": "en", "ddn": "l2"}
    plan: list[tuple[str, str, str, str, Callable[[], np.ndarray], bool, dict]] = []
    for attack in ("cw_l2", "ead", "ddn"):
        fp = fortis_defaults(attack)
        plan.append((attack, "fortis", "fortis_defaults", norms[attack], fortis(attack, fp),
                     False, fp))
        for (a, tool), make in makers.items():
            if a != attack:
                continue
            for settings, p in configurations(attack, tool):
                plan.append((attack, tool, settings, norms[attack], make(p), tool in sentinel,
                             p))
    for norm in ("linf", "l2"):
        fp = {**fortis_defaults("fab"), "norm": norm}
        plan.append((f"fab_{norm}", "fortis", "fortis_defaults", norm, fortis("fab", fp),
                     False, fp))
        for settings, p in configurations("fab", "torchattacks"):
            plan.append((f"fab_{norm}", "torchattacks", settings, norm,
                         lambda norm=norm, p=p: to_uint8(torchattacks.FAB(
                             Frozen(net), norm="Linf" if norm == "linf" else "L2",
                             eps=1.0 if norm == "linf" else 100.0, n_classes=10, **p)(xt, yt)),
                         False, p))
    short = {"reference_defaults": "defaults", "matched": "matched"}
    out = [row(attack, tool, settings, norm, net, x, y, make, sentinel=snt, setting=setting)
           for attack, tool, settings, norm, make, snt, setting in plan
           if f"{attack}/{tool}" not in skip
           and f"{attack}/{tool}@{short.get(settings, settings)}" not in skip]
    assert not net.training
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--skip", nargs="*", default=[],
                    help='attack/tool[@defaults|@matched] to leave out, e.g. "ead/art@matched"')
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (1: no spin-waiting when the cores are shared)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    print(json.dumps({
        "machine": {"python": platform.python_version(), "torch": torch.__version__,
                    "threads": torch.get_num_threads(), "foolbox": version("foolbox"),
                    "art": version("adversarial-robustness-toolbox"),
                    "torchattacks": version("torchattacks")},
        "rows": rows(a.n, tuple(a.skip))}, indent=1))


if __name__ == "__main__":
    main()
