#!/usr/bin/env python3
"""C&W L2, EAD, DDN and FAB (IEEE-A7 transfer attacks, crafted on the Fashion-MNIST surrogate)
against the reference libraries, side by side, at the same iterations and hyper-parameters:
foolbox 3.3.4 (C&W, EAD, DDN), ART 1.20.1 (C&W, EAD), torchattacks 3.5.1 (EAD-EN, FAB).

On the first ``n_images`` test images the surrogate classifies correctly, per attack and tool:
success rate on the surrogate judged on the uint8 images (a reference's float output rounded
to nearest; foolbox's all-zero "nothing found" sentinel counted as a failure), the median
distance in the attack's norm with failures counted as infinite (``null`` when more than half
fail), the median over the successful images only, and crafting speed (images / s, wall
clock, torch's default threads). Prints JSON. Never part of the test run.

    python bench/transfer_optim.py [--n 100] [--steps 100] [--search 5]
"""

from __future__ import annotations

import argparse
import json
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
from fortis.services.perturbation.engine import AttackItem, run_attack
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:     # tests/reference/refkit.py: what the reference tests use too
    sys.path.insert(0, str(ROOT))
from tests.reference.refkit import Frozen, to_uint8  # noqa: E402

EAD_BETA = 0.01
C0 = 0.1          # initial c of C&W / EAD for every tool (see tests/reference)
LR = 0.01


def to_nchw(u8: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(u8.transpose(0, 3, 1, 2))).float() / 255.0


def distance(adv: np.ndarray, x: np.ndarray, norm: str) -> np.ndarray:
    d = (adv.astype(np.float64) - x.astype(np.float64)).reshape(len(x), -1) / 255.0
    if norm == "l2":
        return np.sqrt((d * d).sum(axis=1))
    if norm == "linf":
        return np.abs(d).max(axis=1)
    return EAD_BETA * np.abs(d).sum(axis=1) + (d * d).sum(axis=1)


def row(attack: str, tool: str, norm: str, net: nn.Module, x: np.ndarray, y: np.ndarray,
        make: Callable[[], np.ndarray], sentinel: bool = False, **setting: Any) -> dict:
    """Run one tool and measure it (``setting``: the hyper-parameters, reported)."""
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
    out = {"attack": attack, "tool": tool,
           "norm": "en (beta*L1+L2^2)" if norm == "en" else norm,
           "n_images": len(x), "success_rate": round(float(ok.mean()), 4),
           "median_norm": round(med, 4) if np.isfinite(med) else None,
           "median_norm_successes": round(float(np.median(d[ok])), 4) if ok.any() else None,
           "images_per_s": round(len(x) / wall, 2), "wall_s": round(wall, 2),
           "setting": setting}
    print(json.dumps(out), file=sys.stderr, flush=True)
    return out


def rows(n_images: int = 100, steps: int = 100, search: int = 5,
         skip: tuple[str, ...] = ()) -> list[dict]:
    """One dict per (attack, tool); every tool at the same iterations. ``skip``: "attack/tool"
    pairs left out (ART's C&W and EAD take minutes: ~0.4 images / s at 50 steps)."""
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

    cw = {"binary_search_steps": search, "steps": steps, "initial_const": C0,
          "learning_rate": LR}
    ead = dict(cw, beta=EAD_BETA, decision_rule="EN")
    ddn = {"steps": steps}
    plan: list[tuple[str, str, str, Callable[[], np.ndarray], bool, dict]] = [
        ("cw_l2", "fortis", "l2", fortis("cw_l2", cw), False, cw),
        ("cw_l2", "foolbox", "l2", lambda: to_uint8(fb.attacks.L2CarliniWagnerAttack(
            binary_search_steps=search, steps=steps, stepsize=LR, initial_const=C0)(
            fmodel, xt, crit, epsilons=None)[0]), True, cw),
        ("cw_l2", "art", "l2", lambda: to_uint8(CarliniL2Method(
            art_clf, learning_rate=LR, binary_search_steps=search, max_iter=steps,
            initial_const=C0, batch_size=32, verbose=False).generate(xt.numpy(), y=onehot)),
         False, cw),
        ("ead", "fortis", "en", fortis("ead", ead), False, ead),
        ("ead", "foolbox", "en", lambda: to_uint8(fb.attacks.EADAttack(
            binary_search_steps=search, steps=steps, initial_stepsize=LR, initial_const=C0,
            regularization=EAD_BETA, decision_rule="EN")(fmodel, xt, crit, epsilons=None)[0]),
         True, ead),
        ("ead", "art", "en", lambda: to_uint8(ElasticNet(
            art_clf, learning_rate=LR, binary_search_steps=search, max_iter=steps,
            beta=EAD_BETA, initial_const=C0, batch_size=32, decision_rule="EN",
            verbose=False).generate(xt.numpy(), y=onehot)), False, ead),
        ("ead", "torchattacks", "en", lambda: to_uint8(torchattacks.EADEN(
            Frozen(net), kappa=0, lr=LR, binary_search_steps=search, max_iterations=steps,
            initial_const=C0, beta=EAD_BETA)(xt, yt)), False, ead),
        ("ddn", "fortis", "l2", fortis("ddn", ddn), False, ddn),
        ("ddn", "foolbox", "l2", lambda: to_uint8(fb.attacks.DDNAttack(
            init_epsilon=1.0, steps=steps, gamma=0.05)(fmodel, xt, crit, epsilons=None)[0]),
         True, ddn),
    ]
    for norm in ("linf", "l2"):
        fab = {"steps": steps, "fab_norm": norm}
        plan.append((f"fab_{norm}", "fortis", norm,
                     fortis("fab", {"steps": steps, "norm": norm}), False, fab))
        plan.append((f"fab_{norm}", "torchattacks", norm, lambda norm=norm: to_uint8(
            torchattacks.FAB(Frozen(net), norm="Linf" if norm == "linf" else "L2",
                             eps=1.0 if norm == "linf" else 100.0, steps=steps, n_restarts=1,
                             seed=0, n_classes=10)(xt, yt)), False, fab))
    out = [row(attack, tool, norm, net, x, y, make, sentinel=sentinel, **setting)
           for attack, tool, norm, make, sentinel, setting in plan
           if f"{attack}/{tool}" not in skip]
    assert not net.training
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--search", type=int, default=5)
    ap.add_argument("--skip", nargs="*", default=[],
                    help='attack/tool pairs to leave out, e.g. "ead/art"')
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (1: no spin-waiting when the cores are shared)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    print(json.dumps({
        "machine": {"python": platform.python_version(), "torch": torch.__version__,
                    "threads": torch.get_num_threads(), "foolbox": version("foolbox"),
                    "art": version("adversarial-robustness-toolbox"),
                    "torchattacks": version("torchattacks")},
        "rows": rows(a.n, a.steps, a.search, tuple(a.skip))}, indent=1))


if __name__ == "__main__":
    main()
