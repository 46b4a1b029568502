#!/usr/bin/env python3
"""Our attacks against IBM's Adversarial Robustness Toolbox (ART), side by side in one run.

FGSM and PGD (IEEE-A7, white-box on the Fashion-MNIST surrogate, then sent to the target),
Square (IEEE-A8, score-based, L-inf) and HopSkipJump (IEEE-A8, decision-based, L2) on the
Fashion-MNIST target, on the first N test images the target classifies correctly. For each:
success rate, mean queries (query attacks; IEEE-M6), mean L2 / L-inf of the adversarials
(in [0, 1] scale, over the successful ones for query attacks, over all for transfer attacks),
wall seconds, and the ratios ours / ART. Prints JSON. Never part of the test run.

Budgets are made equal as in tests/reference/test_attacks_vs_art.py: ART (no query cap of its
own) talks to the target through a counting black box that answers at most Q images per
attacked image, clean image included, and is credited with its first queried point that is
misclassified within the bound (ours: the same rule). Square: ART's points are rounded to
uint8 (on the grid anyway at eps = e/255) and a repeated image is not charged; ART runs with
max_iter = 4 Q (and, for comparison, Q - 2), since it spends an iteration on a candidate that
repeats its current image. HopSkipJump is
run twice for ART: on float points (ART's own regime) and on uint8-rounded points (the target
ours faces, repeats charged as a proxy would); plus a minimum-norm run (epsilon 0: never
"succeeds", so both spend the whole budget) comparing the median smallest adversarial L2 found.

    python bench/attacks_vs_art.py [--n 100] [--square-queries 300] [--hsja-queries 1000]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import platform
import time
from collections.abc import Iterator
from importlib.metadata import version

import numpy as np
import torch
from art.attacks.evasion import (
    FastGradientMethod,
    HopSkipJump,
    ProjectedGradientDescent,
    SquareAttack,
)
from art.estimators.classification import (
    BlackBoxClassifier,
    BlackBoxClassifierNeuralNetwork,
    PyTorchClassifier,
)
from fortis.adapters.builtin import load_model
from fortis.adapters.torch_models.datasets import load_fashion_mnist
from fortis.services.perturbation.attacks import fgsm, hop_skip_jump, pgd, square_attack
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


class CountingTarget:
    """Our attacks' query function: uint8 in, counted per batch index (IEEE-M6)."""

    def __init__(self, classifier, n: int) -> None:
        self.classifier = classifier
        self.counts = np.zeros(n, dtype=np.int64)

    def scores(self, images: np.ndarray, idx: np.ndarray) -> np.ndarray:
        np.add.at(self.counts, np.asarray(idx), 1)
        return self.classifier.predict_proba(images)

    def labels(self, images: np.ndarray, idx: np.ndarray) -> np.ndarray:
        return self.scores(images, idx).argmax(axis=1)


class ArtSquareOracle:
    """Batched black box for ART's Square: rows charged to the nearest original (checked to be
    within the bound), rounded to uint8, one charge per distinct image, first success within
    the budget credited."""

    def __init__(self, classifier, x: np.ndarray, y: np.ndarray, epsilon: float,
                 budget: int) -> None:
        self.classifier, self.x, self.y = classifier, x, y
        self.flat = to_nchw(x).reshape(len(x), -1).astype(np.float64)
        self.sq = np.sum(self.flat ** 2, axis=1)
        self.epsilon, self.budget = epsilon, budget
        self.counts = np.zeros(len(x), dtype=np.int64)
        self.seen: list[dict[bytes, np.ndarray]] = [{} for _ in range(len(x))]
        self.first = np.full(len(x), -1)
        self.adv = x.copy()

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        rows = np.asarray(batch, dtype=np.float64).reshape(len(batch), -1)
        owner = np.argmin(self.sq[None, :] - 2.0 * rows @ self.flat.T, axis=1)
        if np.abs(rows - self.flat[owner]).max() > self.epsilon + 1e-6:
            raise AssertionError("ART queried a point outside the L-inf ball")
        u8 = np.clip(np.rint(np.asarray(batch) * 255), 0, 255).astype(np.uint8)
        u8 = u8.transpose(0, 2, 3, 1)
        keys = [u8[j].tobytes() for j in range(len(u8))]
        ask = [j for j, (i, k) in enumerate(zip(owner, keys, strict=True))
               if k not in self.seen[i] and self.counts[i] < self.budget]
        fresh = dict(zip(ask, self.classifier.predict_proba(u8[ask]), strict=True)) if ask else {}
        probs = np.empty((len(u8), NUM_CLASSES), dtype=np.float32)
        for j, (i, k) in enumerate(zip(owner, keys, strict=True)):
            if k in self.seen[i]:  # a repeat: answered from memory, not charged
                probs[j] = self.seen[i][k]
            elif self.counts[i] >= self.budget:  # past the budget: never credited, no model
                probs[j] = np.eye(NUM_CLASSES, dtype=np.float32)[self.y[i]]
            else:
                probs[j] = self.seen[i][k] = fresh[j]
                self.counts[i] += 1
                if int(probs[j].argmax()) != self.y[i] and self.first[i] < 0:
                    self.first[i] = self.counts[i]
                    self.adv[i] = u8[j].copy()
        return probs


class _Done(Exception):
    pass


class ArtHsjaOracle:
    """Black box for ART's HopSkipJump on one image: at most ``budget`` answers, success = first
    point misclassified with L2 <= epsilon (then ART is stopped); also the smallest adversarial
    L2 seen. ``uint8``: points are rounded before the target sees them (distances on the
    rounded image), else float points go to the network directly."""

    def __init__(self, classifier, x: np.ndarray, y: int, epsilon: float, budget: int,
                 uint8: bool) -> None:
        self.classifier = classifier
        self.x = to_nchw(x[None])[0].astype(np.float64)
        self.y, self.epsilon, self.budget, self.uint8 = y, epsilon, budget, uint8
        self.count, self.first = 0, -1
        self.best_l2, self.best = math.inf, None

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        batch = np.asarray(batch, dtype=np.float32)
        allowed = batch[: self.budget - self.count]
        if self.uint8:
            u8 = np.clip(np.rint(allowed * 255), 0, 255).astype(np.uint8)
            points = u8.astype(np.float64) / 255.0
            probs = self.classifier.predict_proba(u8.transpose(0, 2, 3, 1))
        else:
            points = allowed.astype(np.float64)
            with torch.inference_mode():
                probs = torch.softmax(self.classifier.model(torch.from_numpy(allowed)),
                                      dim=1).numpy()
        for j, p in enumerate(probs):
            self.count += 1
            if int(p.argmax()) != self.y:
                l2 = float(np.sqrt(np.sum((points[j] - self.x) ** 2)))
                if l2 < self.best_l2:
                    self.best_l2, self.best = l2, points[j]
                if l2 <= self.epsilon:
                    self.first = self.count
                    raise _Done
        if len(allowed) < len(batch) or self.count >= self.budget:
            raise _Done
        out = np.zeros((len(batch), NUM_CLASSES), dtype=np.float32)
        out[: len(probs)] = probs
        return out


@contextlib.contextmanager
def art_seeded(seed: int) -> Iterator[None]:
    """ART draws from numpy's global generator, and HopSkipJump's starting noise from an
    unseeded ``np.random.RandomState()``: both are seeded here (and restored afterwards), so
    the comparison is reproducible."""
    state = np.random.get_state()
    unseeded = np.random.RandomState
    draws = itertools.count(seed)

    class Seeded(unseeded):  # type: ignore[misc, valid-type]
        def __init__(self, s=None) -> None:
            super().__init__(next(draws) if s is None else s)

    np.random.seed(seed)
    setattr(np.random, "RandomState", Seeded)  # noqa: B010
    try:
        yield
    finally:
        setattr(np.random, "RandomState", unseeded)  # noqa: B010
        np.random.set_state(state)


# ----------------------------------------------------------------------------- attacks ----


def transfer_summary(advs: np.ndarray, x, y, target, surrogate, seconds: float) -> dict:
    l2, linf = distances(advs, x)
    return {"success_rate_target": round(float(np.mean(target.predict(advs) != y)), 4),
            "success_rate_surrogate": round(float(np.mean(surrogate.predict(advs) != y)), 4),
            "mean_l2": mean_or_none(l2), "mean_linf": mean_or_none(linf),
            "wall_s": round(seconds, 3)}


def bench_fgsm(x, y, target, surrogate, art_sur, eps: float) -> dict:
    t = time.perf_counter()
    ours = np.stack([r.adversarial for r in fgsm(surrogate.model, x, y, epsilon=eps)])
    t_ours = time.perf_counter() - t
    t = time.perf_counter()
    a = FastGradientMethod(art_sur, norm=np.inf, eps=eps, batch_size=32).generate(to_nchw(x), y=y)
    t_art = time.perf_counter() - t
    ref = quantise(a, x, eps)
    o = transfer_summary(ours, x, y, target, surrogate, t_ours)
    r = transfer_summary(ref, x, y, target, surrogate, t_art)
    return {"epsilon": eps, "ours": o, "art": r, "ratio": ratios(o, r),
            "pixels_identical": round(float(np.mean(ours == ref)), 6)}


def bench_pgd(x, y, target, surrogate, art_sur, eps: float, steps: int, step: float) -> dict:
    t = time.perf_counter()
    ours = np.stack([r.adversarial for r in pgd(surrogate.model, x, y, epsilon=eps, steps=steps,
                                                step_size=step, random_start=False)])
    t_ours = time.perf_counter() - t
    t = time.perf_counter()
    a = ProjectedGradientDescent(art_sur, norm=np.inf, eps=eps, eps_step=step, max_iter=steps,
                                 num_random_init=0, batch_size=32,
                                 verbose=False).generate(to_nchw(x), y=y)
    t_art = time.perf_counter() - t
    ref = quantise(a, x, eps)
    o = transfer_summary(ours, x, y, target, surrogate, t_ours)
    r = transfer_summary(ref, x, y, target, surrogate, t_art)
    return {"epsilon": eps, "steps": steps, "step_size": step, "random_start": False,
            "ours": o, "art": r, "ratio": ratios(o, r),
            "pixels_identical": round(float(np.mean(ours == ref)), 6),
            "max_level_difference": int(np.abs(ours.astype(int) - ref).max())}


def query_summary(success: np.ndarray, queries: np.ndarray, advs: np.ndarray, x,
                  seconds: float) -> dict:
    l2, linf = distances(advs, x)
    return {"success_rate": round(float(success.mean()), 4),
            "mean_queries_successful": mean_or_none(queries[success]),
            "mean_queries_all": mean_or_none(queries),
            "max_queries": int(queries.max()) if len(queries) else 0,
            "mean_l2": mean_or_none(l2[success]), "mean_linf": mean_or_none(linf[success]),
            "wall_s": round(seconds, 3)}


def bench_square(x, y, target, levels: int, budget: int, p_init: float, seed: int) -> dict:
    eps = levels / 255
    counting = CountingTarget(target, len(x))
    t = time.perf_counter()
    res = square_attack(counting.scores, x, y, epsilon=eps, max_queries=budget, p_init=p_init,
                        rng=np.random.default_rng(seed))
    t_ours = time.perf_counter() - t
    ok = np.array([bool(r.success) for r in res])
    o = query_summary(ok, counting.counts, np.stack([r.adversarial for r in res]), x, t_ours)
    out: dict = {"epsilon": eps, "epsilon_levels": levels, "max_queries": budget,
                 "p_init": p_init, "ours": o}
    # ART spends an iteration even when its square leaves the image unchanged (ours draws
    # again): with max_iter = Q - 2 it cannot use its budget, so the main comparison gives it
    # max_iter = 4 Q, credited within its first Q distinct queries all the same.
    for name, max_iter in (("art", 4 * budget), ("art_max_iter_q", budget - 2)):
        oracle = ArtSquareOracle(target, x, y, eps, budget)
        clf = BlackBoxClassifierNeuralNetwork(oracle, input_shape=SHAPE_NCHW,
                                              nb_classes=NUM_CLASSES, channels_first=True,
                                              clip_values=(0.0, 1.0))
        t = time.perf_counter()
        with art_seeded(seed):
            SquareAttack(clf, norm=np.inf, eps=eps, max_iter=max_iter, p_init=p_init,
                         nb_restarts=1, batch_size=128, verbose=False).generate(to_nchw(x), y=y)
        t_art = time.perf_counter() - t
        art_ok = oracle.first > 0
        queries = np.where(art_ok, oracle.first, oracle.counts)
        r = query_summary(art_ok, queries, oracle.adv, x, t_art)
        r["art_max_iter"] = max_iter
        out[name] = r
        out["ratio" if name == "art" else f"ratio_vs_{name}"] = ratios(o, r)
    return out


def run_art_hsja(x, y, target, eps: float, budget: int, uint8: bool, seed: int):
    n = len(x)
    first = np.full(n, -1)
    counts = np.zeros(n, dtype=np.int64)
    best_l2 = np.full(n, math.inf)
    advs = x.astype(np.float64).copy()
    t = time.perf_counter()
    with art_seeded(seed):
        for i in range(n):
            oracle = ArtHsjaOracle(target, x[i], int(y[i]), eps, budget, uint8)
            clf = BlackBoxClassifier(oracle, input_shape=SHAPE_NCHW, nb_classes=NUM_CLASSES,
                                     clip_values=(0.0, 1.0))
            attack = HopSkipJump(clf, norm=2, max_iter=100_000, max_eval=10_000, init_eval=100,
                                 init_size=100, batch_size=10_000, verbose=False)
            try:
                attack.generate(to_nchw(x[i:i + 1]), y=y[i:i + 1])
            except _Done:
                pass
            first[i], counts[i], best_l2[i] = oracle.first, oracle.count, oracle.best_l2
            if oracle.best is not None:
                advs[i] = oracle.best.transpose(1, 2, 0) * 255.0
    return first, counts, best_l2, advs, time.perf_counter() - t


def bench_hsja(x, y, target, eps: float, budget: int, seed: int, min_norm: bool) -> dict:
    counting = CountingTarget(target, len(x))
    t = time.perf_counter()
    res = hop_skip_jump(counting.labels, x, y, epsilon=eps, max_queries=budget,
                        rng=np.random.default_rng(seed))
    t_ours = time.perf_counter() - t
    ok = np.array([bool(r.success) for r in res])
    o = query_summary(ok, counting.counts, np.stack([r.adversarial for r in res]), x, t_ours)
    out: dict = {"epsilon_l2": eps, "max_queries": budget, "ours": o}
    for name, uint8 in (("art_float", False), ("art_uint8", True)):
        first, counts, _, advs, secs = run_art_hsja(x, y, target, eps, budget, uint8, seed)
        art_ok = first > 0
        r = query_summary(art_ok, np.where(art_ok, first, counts), advs, x, secs)
        out[name] = r
        out[f"ratio_vs_{name}"] = ratios(o, r)
    if min_norm:  # epsilon 0: nobody stops early; the smallest adversarial L2 within budget
        counting = CountingTarget(target, len(x))
        t = time.perf_counter()
        res = hop_skip_jump(counting.labels, x, y, epsilon=0.0, max_queries=budget,
                            rng=np.random.default_rng(seed))
        t_ours = time.perf_counter() - t
        ours_l2 = np.array([r.l2 if r.adversarial is not None and r.l2 > 0 else math.inf
                            for r in res])
        _, _, art_l2, _, t_art = run_art_hsja(x, y, target, 0.0, budget, False, seed)
        med_o, med_a = float(np.median(ours_l2)), float(np.median(art_l2))
        out["min_norm_at_budget"] = {
            "ours_median_l2": round(med_o, 4), "art_float_median_l2": round(med_a, 4),
            "ratio": ratio(med_o, med_a),
            "ours_found_adversarial": round(float(np.mean(np.isfinite(ours_l2))), 4),
            "art_found_adversarial": round(float(np.mean(np.isfinite(art_l2))), 4),
            "ours_wall_s": round(t_ours, 3), "art_wall_s": round(t_art, 3)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100, help="images (correct on the target)")
    ap.add_argument("--eps", type=float, default=0.1, help="L-inf bound of FGSM/PGD")
    ap.add_argument("--pgd-steps", type=int, default=10)
    ap.add_argument("--pgd-step-size", type=float, default=0.025)
    ap.add_argument("--square-levels", type=int, default=25, help="Square bound, uint8 levels")
    ap.add_argument("--square-queries", type=int, default=300)
    ap.add_argument("--p-init", type=float, default=0.05)
    ap.add_argument("--hsja-eps", type=float, default=1.5, help="HopSkipJump L2 bound")
    ap.add_argument("--hsja-queries", type=int, default=1000)
    ap.add_argument("--no-min-norm", action="store_true", help="skip the minimum-norm HSJA run")
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
        "pgd": bench_pgd(x, y, target, surrogate, art_sur, args.eps, args.pgd_steps,
                         args.pgd_step_size),
        "square": bench_square(x, y, target, args.square_levels, args.square_queries,
                               args.p_init, args.seed),
        "hsja": bench_hsja(x, y, target, args.hsja_eps, args.hsja_queries, args.seed,
                           not args.no_min_norm),
    }
    report["setup"]["total_wall_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
