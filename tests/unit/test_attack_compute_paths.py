"""The fast computations of SimBA, ZO-NGD, the decision oracle and the score-based attacks'
L-inf feasibility give what the plain computation gives (IEEE-A8, IEEE-A9).

Each fast path is checked against an independent, straightforward computation of the same
quantity, never against stored numbers: SimBA's support-only candidates against the same
directions given as dense arrays (the dense loop: every candidate built, clipped, scaled and
rounded over the whole image); ZO-NGD's stacked Woodbury solve against ``F^{-1} g`` with
``F`` built and solved as a D x D matrix; the oracle's cheap "may be within" against the exact
bound test; the in-place clipping against ``np.clip``. The target is a fixed random linear
classifier seen through its margin (what ``ctx.margin_query()`` gives an attack).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from fortis.services.perturbation.attacks._decision import DecisionOracle
from fortis.services.perturbation.attacks._zo import ZoSearch
from fortis.services.perturbation.attacks.ngd import natural_direction
from fortis.services.perturbation.attacks.score_run import ScoreRun
from fortis.services.perturbation.attacks.simba import (
    Sparse,
    _basis_directions,
    simba_search,
)


def _linear_target(shape: tuple[int, ...], n: int, seed: int = 3):
    """n random uint8 images, a random linear classifier's labels for them and its margin
    (true-class score minus the best other; < 0 = misclassified)."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, (n, *shape), dtype=np.uint8)
    d = int(np.prod(shape))
    w = rng.standard_normal((d, 10)) * 3.0 / (255.0 * np.sqrt(d))
    y = (x.reshape(n, -1) @ w).argmax(axis=1)

    def margin(images: np.ndarray, idx: np.ndarray) -> np.ndarray:
        s = images.reshape(len(images), -1).astype(np.float64) @ w
        rows = np.arange(len(s))
        true = s[rows, y[idx]]
        s[rows, y[idx]] = -np.inf
        return true - s.max(axis=1)

    return x, y, margin


def _dense(directions: Callable, shape: tuple[int, int, int]) -> Callable:
    """The same directions as full H x W x C arrays (the dense loop's input)."""
    h, w, c = shape

    def dense(k: int, idx: np.ndarray, delta: np.ndarray) -> np.ndarray | None:
        q = directions(k, idx, delta)
        if q is None:
            return None
        assert isinstance(q, Sparse)
        out = np.zeros((len(idx), h * w * c))
        if q.flat is not None:
            out[np.arange(len(idx)), q.flat] = 1.0
        else:
            out = out.reshape(len(idx), h, w, c)
            out[np.arange(len(idx)), :, :, q.chan] = q.plane
        return out.reshape(len(idx), h, w, c)

    return dense


@pytest.mark.parametrize("basis", ["pixel", "dct"])
@pytest.mark.parametrize("shape,epsilon", [((12, 10, 1), 0.3), ((12, 10, 1), 3.0),
                                           ((8, 10, 3), 0.4), ((8, 10, 3), 5.0)])
def test_simba_support_path_equals_dense_loop(basis, shape, epsilon):
    """Same seed, same directions: the support-only candidates send exactly the images the
    dense loop sends, query for query (small bounds make most candidates leave the fast path,
    large ones keep them on it; both are covered)."""
    x, y, margin = _linear_target(shape, 6)
    sent: dict[str, list[np.ndarray]] = {"fast": [], "dense": []}
    outcome = {}
    for mode in ("fast", "dense"):
        def logged(images, idx, mode=mode):
            sent[mode].append(images.copy())
            return margin(images, idx)

        run = ScoreRun(logged, x, y, 150, None)
        run.begin()
        dirs = _basis_directions(np.random.default_rng(7), run.n, shape, basis, 0.25, 0.125,
                                 run.qb.limit)
        simba_search(run, dirs if mode == "fast" else _dense(dirs, shape), step_size=0.2,
                     epsilon=epsilon, signs=(-1, 1))
        outcome[mode] = [(r.adversarial, r.queries, r.stop_reason) for r in run.results("x")]
    assert len(sent["fast"]) == len(sent["dense"]) > 10
    for a, b in zip(sent["fast"], sent["dense"], strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(outcome["fast"], outcome["dense"], strict=True):
        np.testing.assert_array_equal(a[0], b[0])
        assert a[1:] == b[1:]


def test_ngd_stacked_solve_equals_full_fisher_inverse():
    """``F^{-1} g`` with ``F = G^T G / n + gamma I`` over the nonzero samples of each image,
    solved as a D x D system, for images with all, some and no nonzero samples."""
    rng = np.random.default_rng(0)
    k, q, d = 4, 5, 30
    samples = rng.standard_normal((k, q, d))
    samples[1, [0, 3]] = 0.0          # two samples not sent
    samples[2] = 0.0                  # nothing sent: F = gamma I
    g = rng.standard_normal((k, d))
    gamma = rng.uniform(0.1, 2.0, k)
    got = natural_direction(samples, g, gamma)
    for j in range(k):
        gj = samples[j][np.any(samples[j] != 0, axis=1)]
        fisher = (gj.T @ gj / max(len(gj), 1)) + gamma[j] * np.eye(d)
        np.testing.assert_allclose(got[j], np.linalg.solve(fisher, g[j]), rtol=1e-9, atol=1e-12)


def test_decision_oracle_cheap_bound_test_never_rejects_a_point_within():
    """For distances just inside, on and just outside the bound, the cheap test says "may be
    within" wherever the exact test says within."""
    rng = np.random.default_rng(1)
    x = rng.integers(50, 200, (1, 6, 6, 3), dtype=np.uint8)
    for eps in (0.05, 0.2, 1.0):
        oracle = DecisionOracle(lambda im, i: np.zeros(len(im), bool), x, epsilon=eps,
                                norm="l2", max_queries=10, spent=None)
        for _ in range(200):
            adv = np.clip(x[0].astype(np.int64) + rng.integers(-12, 13, x.shape[1:]), 0, 255)
            adv = adv.astype(np.uint8)
            oracle.best_dist[0] = oracle.distances(adv[None], np.array([0]))[0]
            if oracle.within(0, adv):
                assert oracle.may_be_within(0)
            if not oracle.may_be_within(0):
                assert not oracle.within(0, adv)
    linf = DecisionOracle(lambda im, i: np.zeros(len(im), bool), x, epsilon=8 / 255,
                          norm="linf", max_queries=10, spent=None)
    for step in range(0, 12):
        adv = np.clip(x[0].astype(np.int64) + step, 0, 255).astype(np.uint8)
        linf.best_dist[0] = linf.distances(adv[None], np.array([0]))[0]
        assert linf.may_be_within(0) == linf.within(0, adv)


def test_linf_feasible_equals_np_clip():
    """The score-based attacks' L-inf feasibility gives ``np.clip``'s images."""
    rng = np.random.default_rng(2)
    x, y, margin = _linear_target((5, 7, 3), 4)
    zs = ZoSearch(margin, x, y, norm="linf", epsilon=6 / 255, max_queries=10)
    scattered = rng.integers(0, 4, 9)             # one row per owner in turn
    runs = np.repeat([2, 0, 3], 12)                # long runs of one owner (NES's probes)
    for owners in (scattered, runs):
        for dtype in (np.float32, np.float64):
            cand = (x[owners].astype(np.float64) +
                    rng.normal(0, 9, (len(owners), 5, 7, 3))).astype(dtype)
            xo = zs.x[owners]
            want = np.clip(np.clip(np.rint(cand), xo - zs.e, xo + zs.e), 0, 255)
            np.testing.assert_array_equal(zs.feasible(cand, owners), want.astype(np.uint8))
            np.testing.assert_array_equal(zs.feasible(cand.copy(), owners, scratch=True),
                                          want.astype(np.uint8))
