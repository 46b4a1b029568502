#!/usr/bin/env python3
"""Clean and robust accuracy of the built-in Fashion-MNIST models, the defended one included
(benchmarks across models; CAN-5 defence effect, CAN-7 models x attacks).

Prints one JSON object: ``rows`` (one per model: ``fmnist-cnn``, ``fmnist-mlp``,
``fmnist-cnn-at``), each with the clean accuracy and the accuracy under white-box attacks
crafted on the model itself (IEEE-A7 white box, bound ``--eps`` in [0, 1] scale, IEEE-A9):
Fortis's FGSM, PGD at its registry defaults (10 steps, random start, step 2.5 eps / 10) and
PGD with 50 steps, and torchattacks' PGD side by side at its constructor defaults
(``pgd10_torchattacks_defaults``: alpha 2/255, 10 steps, random start) and given Fortis's step
(``pgd10_torchattacks_matched``: alpha 2.5 eps / 10); then
the accuracy under PGD crafted on ``fmnist-surrogate`` and transferred (a defended model whose
white-box accuracy were higher than its transfer accuracy would be masking its gradients).
Every rate comes with its standard error. ``meta`` holds each model's training record (epochs,
seconds, seed, adversarial training settings). Never part of the test run
(tests/unit/test_defended_model.py holds the property checks).

    python bench/defended.py [--n 1000] [--offset 0] [--eps 0.1] [--out result.json]

Fortis's attacks return uint8 images within the bound (what a target receives);
torchattacks' float output is rounded to uint8 levels the same way (tests/reference/refkit.py).
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # tests.reference.refkit

MODELS = {"fmnist-cnn": "target", "fmnist-mlp": "mlp", "fmnist-cnn-at": "robust"}


def _rate(ok: np.ndarray) -> dict[str, float]:
    n = max(len(ok), 1)
    p = float(np.mean(ok)) if len(ok) else float("nan")
    return {"value": round(p, 4), "se": round(float(np.sqrt(max(p * (1 - p), 0.0) / n)), 4)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1000, help="test images (default 1000)")
    ap.add_argument("--offset", type=int, default=0, help="first test image")
    ap.add_argument("--eps", type=float, default=0.1, help="L-inf bound, [0, 1] scale")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)

    import torchattacks
    from fortis.adapters.builtin import load_model
    from fortis.adapters.torch_models.datasets import load_fashion_mnist
    from fortis.adapters.torch_models.fmnist import load_fmnist_model
    from fortis.services.perturbation.attacks import fgsm, pgd

    from tests.reference.refkit import Frozen, to_uint8

    x, y = load_fashion_mnist("test", limit=args.n, offset=args.offset)
    xt, yt = torch.from_numpy(x).permute(0, 3, 1, 2).float() / 255.0, torch.from_numpy(y)
    eps = args.eps
    surrogate = load_model("fmnist-surrogate")

    def gen() -> torch.Generator:
        return torch.Generator().manual_seed(args.seed)

    def stack(results: list[Any]) -> np.ndarray:
        return np.stack([r.adversarial for r in results])

    transfer = stack(pgd(surrogate.model, x, y, epsilon=eps, steps=10, generator=gen()))
    rows, meta = [], {}
    for name, kind in MODELS.items():
        clf = load_model(name)
        _, record = load_fmnist_model(kind)
        meta[name] = {k: record.get(k) for k in ("kind", "arch", "epochs", "seed",
                                                  "train_seconds", "threads", "test_accuracy",
                                                  "adversarial_training") if k in record}

        def acc(images: np.ndarray, clf: Any = clf) -> dict[str, float]:
            return _rate(clf.predict(images) == y)

        timings: dict[str, float] = {}

        def timed(label: str, fn: Any, timings: dict[str, float] = timings) -> np.ndarray:
            t0 = time.perf_counter()
            out = fn()
            timings[label] = round(time.perf_counter() - t0, 2)
            return np.asarray(out)

        ref_defaults = torchattacks.PGD(Frozen(clf.model), eps=eps, alpha=2 / 255, steps=10,
                                        random_start=True)
        ref_matched = torchattacks.PGD(Frozen(clf.model), eps=eps, alpha=2.5 * eps / 10,
                                       steps=10, random_start=True)

        def seeded(atk: Any) -> Any:
            torch.manual_seed(args.seed)   # torchattacks' random start: torch's generator
            return atk(xt, yt)
        attacks = {
            "fgsm": timed("fgsm", lambda m=clf.model: stack(fgsm(m, x, y, epsilon=eps))),
            "pgd10": timed("pgd10", lambda m=clf.model: stack(
                pgd(m, x, y, epsilon=eps, steps=10, generator=gen()))),
            "pgd10_torchattacks_defaults": timed(
                "pgd10_torchattacks_defaults", lambda a=ref_defaults: to_uint8(seeded(a))),
            "pgd10_torchattacks_matched": timed(
                "pgd10_torchattacks_matched", lambda a=ref_matched: to_uint8(seeded(a))),
            "pgd50": timed("pgd50", lambda m=clf.model: stack(
                pgd(m, x, y, epsilon=eps, steps=50, generator=gen()))),
        }
        for adv in attacks.values():
            assert np.abs(adv.astype(np.int16) - x.astype(np.int16)).max() <= round(eps * 255)
        rows.append({
            "model": name, "clean": acc(x),
            "white_box": {k: acc(v) for k, v in attacks.items()},
            "transfer_pgd10_from_fmnist_surrogate": acc(transfer),
            "attack_seconds": timings,
        })
    clean = {r["model"]: r["clean"]["value"] for r in rows}
    robust = {r["model"]: r["white_box"]["pgd10"]["value"] for r in rows}
    out = {
        "rows": rows,
        "summary": {
            "defended_over_undefended_pgd10": round(robust["fmnist-cnn-at"]
                                                    / max(robust["fmnist-cnn"], 1.0 / len(x)), 2),
            "clean_cost_of_the_defence": round(clean["fmnist-cnn"] - clean["fmnist-cnn-at"], 4),
        },
        "meta": {"n": len(x), "offset": args.offset, "epsilon": eps, "seed": args.seed,
                 "torch": torch.__version__, "threads": torch.get_num_threads(),
                 "torchattacks": torchattacks.__version__, "models": meta,
                 "settings": {"pgd10": "Fortis's registry defaults",
                              "pgd10_torchattacks_defaults": {"alpha": 2 / 255, "steps": 10,
                                                              "random_start": True},
                              "pgd10_torchattacks_matched": {"alpha": 2.5 * eps / 10,
                                                             "steps": 10,
                                                             "random_start": True}}},
    }
    text = json.dumps(out, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
