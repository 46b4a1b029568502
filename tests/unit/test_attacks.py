"""Adversarial attacks on a real (tiny, trained here) CNN: transfer attacks on the surrogate
(IEEE-A7), Square and HopSkipJump through a counting query wrapper (IEEE-A8, IEEE-M6), bounds
fixed before the attack (IEEE-A9), and known pitfalls: uncounted
queries, no query cap, HSJA from an already-misclassified start, a non-best adversarial,
Square on an all-misclassified batch or non-square images, examples that fail after uint8.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fortis.services.common.arrays import l2_distance
from fortis.services.common.errors import BudgetExhausted, InvalidArgument, QuotaViolation
from fortis.services.perturbation.attacks import (
    STOP_REASONS,
    AttackResult,
    fgsm,
    hop_skip_jump,
    pgd,
    square_attack,
)
from fortis.services.perturbation.attacks.base import linf_levels
from fortis.services.perturbation.attacks.square import p_selection
from fortis.services.perturbation.criteria import margins
from torch import nn

pytestmark = pytest.mark.usefixtures("one_thread")

NUM_CLASSES = 3
GRAY = (16, 16, 1)
RGB = (12, 20, 3)  # non-square on purpose: attacks must not assume square images


# ------------------------------------------------------------------ data, model, target ----


def make_images(n: int, shape: tuple[int, int, int], seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Three pattern classes: horizontal stripes, vertical stripes, checkerboard; random phase,
    contrast, tint and noise. uint8 N x H x W x C."""
    h, w, c = shape
    rng = np.random.default_rng(seed)
    y = rng.integers(0, NUM_CLASSES, n)
    rr, cc = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    out = np.empty((n, h, w, c))
    for i in range(n):
        ph = int(rng.integers(0, 4))
        if y[i] == 0:
            cells = (rr + ph) // 2
        elif y[i] == 1:
            cells = (cc + ph) // 2
        else:
            cells = (rr + ph) // 2 + (cc + ph) // 2
        pattern = np.where(cells % 2 == 0, 1.0, -1.0)[..., None]
        tint = rng.uniform(0.7, 1.0, size=c)
        out[i] = 0.5 + rng.uniform(0.12, 0.25) * pattern * tint + rng.normal(0, 0.06, (h, w, c))
    return np.clip(np.rint(out * 255), 0, 255).astype(np.uint8), y.astype(np.int64)


class TinyCNN(nn.Module):
    """Takes float32 NCHW in [0, 1], returns logits; any H, W."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(channels, 8, 3, padding=1), nn.ReLU(),
            nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, NUM_CLASSES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def to_input(images: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(images).float().permute(0, 3, 1, 2) / 255.0


def train(shape: tuple[int, int, int]) -> TinyCNN:
    torch.manual_seed(0)
    x, y = make_images(600, shape, seed=1)
    xt, yt = to_input(x), torch.from_numpy(y)
    net = TinyCNN(shape[2])
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    for _ in range(150):
        idx = torch.randint(0, len(y), (64,))
        loss = nn.functional.cross_entropy(net(xt[idx]), yt[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return net.eval()


def predict(net: nn.Module, images: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return net(to_input(images)).argmax(1).numpy()



@pytest.fixture(scope="module")
def gray_net() -> TinyCNN:
    return train(GRAY)


@pytest.fixture(scope="module")
def rgb_net() -> TinyCNN:
    return train(RGB)


class Target:
    """The 'remote' target: counts every image of every call per batch index (as the proxy
    does), logs what it answered, and can refuse like a proxy whose budget ran out."""

    def __init__(self, net: nn.Module, n: int, *, fail_after_calls: int | None = None,
                 top_k: int | None = None) -> None:
        self.net = net
        self.counts = np.zeros(n, dtype=np.int64)
        self.calls = 0
        self.fail_after_calls = fail_after_calls
        self.top_k = top_k
        self.log: list[tuple[int, np.ndarray, int]] = []  # (index, image, top-1 label)

    def _probs(self, images: np.ndarray, idx: np.ndarray) -> np.ndarray:
        assert images.dtype == np.uint8 and images.ndim == 4  # the target receives uint8
        assert len(idx) == len(images)
        if self.fail_after_calls is not None and self.calls >= self.fail_after_calls:
            raise BudgetExhausted([QuotaViolation("session", "query budget spent")])
        self.calls += 1
        np.add.at(self.counts, np.asarray(idx), 1)
        with torch.no_grad():
            probs = torch.softmax(self.net(to_input(images)), dim=1).numpy()
        for i, img, lab in zip(idx, images, probs.argmax(1), strict=True):
            self.log.append((int(i), img.copy(), int(lab)))
        if self.top_k is not None:  # only the top-k scores come back; the rest read as 0
            cut = np.sort(probs, axis=1)[:, -self.top_k][:, None]
            probs = np.where(probs >= cut, probs, 0.0)
        return probs

    def scores(self, images: np.ndarray, idx: np.ndarray) -> np.ndarray:
        return self._probs(images, idx)

    def labels(self, images: np.ndarray, idx: np.ndarray) -> np.ndarray:
        return self._probs(images, idx).argmax(1)


def correct_images(net: nn.Module, shape: tuple[int, int, int], n: int,
                   seed: int) -> tuple[np.ndarray, np.ndarray]:
    """n test images the target classifies correctly."""
    x, y = make_images(4 * n, shape, seed)
    ok = predict(net, x) == y
    assert ok.sum() >= n
    return x[ok][:n], y[ok][:n]


def assert_linf_bound(results: list[AttackResult], x: np.ndarray, epsilon: float) -> None:
    """IEEE-A9: |adv - x| <= floor(eps*255 + 1e-6) on the uint8 output."""
    e = linf_levels(epsilon)
    for r in results:
        assert r.adversarial.dtype == np.uint8 and r.adversarial.shape == x.shape[1:]
        diff = np.abs(r.adversarial.astype(int) - x[r.index].astype(int))
        assert diff.max() <= e
        assert r.linf <= e / 255 + 1e-12
        np.testing.assert_array_equal(r.adversarial_float, r.adversarial.astype(np.float32) / 255)
        assert r.adversarial_float.dtype == np.float32


def assert_query_accounting(results: list[AttackResult], target: Target, max_queries: int) -> None:
    """IEEE-M6: every image passed is counted, the clean one included; cap holds."""
    assert [r.index for r in results] == list(range(len(results)))
    for r in results:
        assert r.queries == target.counts[r.index]
        assert r.queries <= max_queries
        assert r.stop_reason in STOP_REASONS


def assert_successes_real(results: list[AttackResult], target: Target, net: nn.Module,
                          y: np.ndarray) -> None:
    """Success is judged on the uint8 image: re-asking the target must give a wrong label."""
    for r in results:
        if r.success:
            assert predict(net, r.adversarial[None])[0] != y[r.index]
            assert np.isfinite(r.l2) and np.isfinite(r.linf)


# ---------------------------------------------------------------------------- common ------


def test_linf_levels_floor_in_uint8_space() -> None:
    """IEEE-A9: the bound in uint8 levels is floor(eps * 255 + 1e-6)."""
    assert linf_levels(8 / 255) == 8
    assert linf_levels(0.1) == 25
    assert linf_levels(0.0) == 0
    assert linf_levels(1.0) == 255
    with pytest.raises(InvalidArgument):
        linf_levels(-0.1)


def test_margin_with_probabilities_and_missing_classes() -> None:
    scores = np.array([[0.7, 0.2, 0.1], [0.0, 0.6, 0.0], [0.5, 0.5, 0.0]])
    m = margins(scores, np.array([0, 0, 1]))
    np.testing.assert_allclose(m, [0.5, -0.6, 0.0])  # a tie is not counted as a success


def test_p_schedule_is_the_reference() -> None:
    assert p_selection(0.05, 0, 10_000) == 0.05
    assert p_selection(0.05, 11, 10_000) == 0.025
    assert p_selection(0.05, 9_000, 10_000) == 0.05 / 512
    assert p_selection(0.05, 100, 1_000) == p_selection(0.05, 1_000, 10_000)


def _window_rows(n_iters: int | None) -> int:
    """Square on one mid-gray image against a target whose margin never improves: every
    candidate is the stripe image plus one window, so the rows that differ from the stripe
    image (the 2nd query) are the window's side at that iteration."""
    x = np.full((1, 28, 28, 1), 128, dtype=np.uint8)
    sent: list[np.ndarray] = []

    def scores(images: np.ndarray, idx: np.ndarray) -> np.ndarray:
        sent.extend(images.copy())
        return np.tile([0.9, 0.05, 0.05], (len(images), 1))

    kw = {} if n_iters is None else {"n_iters": n_iters}
    r = square_attack(scores, x, np.array([0]), epsilon=0.1, max_queries=200,
                      rng=np.random.default_rng(0), **kw)[0]
    assert r.queries == 200 and not r.success
    changed = np.any(sent[-1] != sent[1], axis=(1, 2))
    return int(changed.sum())


def test_square_schedule_runs_over_the_reference_iterations_not_the_budget() -> None:
    """square.py: the p schedule is laid over max(n_iters, max_queries) (the reference's
    10,000 by default), so a 200-query budget ends with p_init / 4 squares (side 3 on 28 x 28),
    not the p_init / 256 (side 1) of a schedule squeezed into the budget (n_iters <= budget)."""
    assert _window_rows(None) == round(np.sqrt(0.05 / 4 * 28 * 28)) == 3
    assert _window_rows(1) == 1
    assert _window_rows(200) == 1
    x, y = make_images(1, GRAY, seed=1)
    with pytest.raises(InvalidArgument) as err:
        square_attack(lambda im, i: np.ones((len(im), 3)) / 3, x, y, epsilon=0.1,
                      max_queries=10, rng=np.random.default_rng(0), n_iters=0)
    assert err.value.violations[0].field == "n_iters"


def test_bad_inputs_are_rejected_with_the_field(gray_net: TinyCNN) -> None:
    x, y = make_images(2, GRAY, seed=3)
    target = Target(gray_net, 2)
    with pytest.raises(InvalidArgument) as err:
        square_attack(target.scores, x.astype(np.float32), y, epsilon=0.1, max_queries=10,
                      rng=np.random.default_rng(0))
    assert err.value.violations[0].field == "images"
    with pytest.raises(InvalidArgument) as err:
        hop_skip_jump(target.labels, x, y, epsilon=-1.0, max_queries=10,
                      rng=np.random.default_rng(0))
    assert err.value.violations[0].field == "epsilon"
    with pytest.raises(InvalidArgument) as err:
        square_attack(target.scores, x, y, epsilon=0.1, max_queries=0,
                      rng=np.random.default_rng(0))
    assert err.value.violations[0].field == "max_queries"
    assert target.calls == 0


# ------------------------------------------------------------------- transfer (IEEE-A7) ---


@pytest.mark.parametrize("shape", [GRAY, RGB])
def test_fgsm_and_pgd_keep_the_bound_and_hurt_the_surrogate(
        shape: tuple[int, int, int], gray_net: TinyCNN, rgb_net: TinyCNN) -> None:
    net = gray_net if shape == GRAY else rgb_net
    x, y = make_images(48, shape, seed=2)
    eps = 0.1 if shape == GRAY else 0.15
    clean_acc = float((predict(net, x) == y).mean())
    for attack in (fgsm, pgd):
        kwargs = {"generator": torch.Generator().manual_seed(1)} if attack is pgd else {}
        results = attack(net, x, y, epsilon=eps, **kwargs)
        assert len(results) == len(x)
        assert_linf_bound(results, x, eps)
        for r in results:
            assert r.success is None and r.queries == 0 and r.stop_reason == "iterations"
            assert r.initially_correct == bool(predict(net, x[r.index][None])[0] == y[r.index])
        adv = np.stack([r.adversarial for r in results])
        adv_acc = float((predict(net, adv) == y).mean())
        if attack is pgd:  # white-box PGD on uint8 output: a big drop
            assert clean_acc >= 0.95
            assert adv_acc <= clean_acc - 0.4, (clean_acc, adv_acc)
        else:
            assert adv_acc < clean_acc
    assert not net.training  # eval mode kept


def test_pgd_is_deterministic_with_the_same_generator(gray_net: TinyCNN) -> None:
    x, y = make_images(8, GRAY, seed=4)

    def run(seed: int) -> np.ndarray:
        res = pgd(gray_net, x, y, epsilon=0.05, steps=5, generator=torch.Generator().manual_seed(seed))
        return np.stack([r.adversarial for r in res])

    np.testing.assert_array_equal(run(7), run(7))
    assert not np.array_equal(run(7), run(8))
    # a tiny epsilon below one uint8 level leaves the image unchanged
    res = fgsm(gray_net, x, y, epsilon=0.5 / 255)
    assert all(np.array_equal(r.adversarial, x[r.index]) for r in res)


# ---------------------------------------------------------------------- Square (IEEE-A8) ---


def test_square_counts_caps_and_succeeds_on_uint8(gray_net: TinyCNN) -> None:
    x, y = correct_images(gray_net, GRAY, 6, seed=5)
    target = Target(gray_net, len(x))
    eps, budget = 0.1, 400
    results = square_attack(target.scores, x, y, epsilon=eps, max_queries=budget,
                            rng=np.random.default_rng(0))
    assert_query_accounting(results, target, budget)
    assert_linf_bound(results, x, eps)
    assert_successes_real(results, target, gray_net, y)
    assert sum(bool(r.success) for r in results) >= 2
    for r in results:
        assert r.initially_correct is True
        if r.success:
            assert r.stop_reason == "success"
            # IEEE-M6: stopped at the first success, so its last query was the returned image
            last = [img for i, img, _ in target.log if i == r.index][-1]
            np.testing.assert_array_equal(last, r.adversarial)
        else:
            assert r.stop_reason == "budget" and r.queries == budget


def test_square_is_deterministic_with_the_same_rng(gray_net: TinyCNN) -> None:
    x, y = correct_images(gray_net, GRAY, 3, seed=6)

    def run() -> list[AttackResult]:
        return square_attack(Target(gray_net, 3).scores, x, y, epsilon=0.08, max_queries=60,
                             rng=np.random.default_rng(42))

    a, b = run(), run()
    for ra, rb in zip(a, b, strict=True):
        np.testing.assert_array_equal(ra.adversarial, rb.adversarial)
        assert ra.queries == rb.queries


def test_square_all_already_misclassified(gray_net: TinyCNN) -> None:
    x, _ = make_images(5, GRAY, seed=7)
    wrong = (predict(gray_net, x) + 1) % NUM_CLASSES
    target = Target(gray_net, len(x))
    results = square_attack(target.scores, x, wrong, epsilon=0.1, max_queries=100,
                            rng=np.random.default_rng(0))
    assert target.calls == 1
    for r in results:
        assert r.queries == 1 and r.success is True and r.initially_correct is False
        assert r.stop_reason == "already_misclassified"
        np.testing.assert_array_equal(r.adversarial, x[r.index])
        assert r.l2 == 0.0 and r.linf == 0.0


def test_square_non_square_rgb_with_top1_scores_only(rgb_net: TinyCNN) -> None:
    """H != W, C = 3, and a target that returns only its top-1 score (others read 0)."""
    x, y = correct_images(rgb_net, RGB, 4, seed=8)
    x = x.copy()
    # one of them is misclassified from the start
    y = y.copy()
    y[1] = (y[1] + 1) % NUM_CLASSES
    target = Target(rgb_net, len(x), top_k=1)
    eps, budget = 0.15, 150
    results = square_attack(target.scores, x, y, epsilon=eps, max_queries=budget,
                            rng=np.random.default_rng(1))
    assert_query_accounting(results, target, budget)
    assert_linf_bound(results, x, eps)
    assert_successes_real(results, target, rgb_net, y)
    assert results[1].stop_reason == "already_misclassified" and results[1].queries == 1
    for r in results:
        if r.index != 1:
            assert r.queries > 1


def test_square_stops_cleanly_when_the_proxy_budget_runs_out(gray_net: TinyCNN) -> None:
    x, y = correct_images(gray_net, GRAY, 4, seed=9)
    target = Target(gray_net, len(x), fail_after_calls=5)
    results = square_attack(target.scores, x, y, epsilon=0.03, max_queries=500,
                            rng=np.random.default_rng(0))
    assert target.calls == 5
    assert_query_accounting(results, target, 500)
    for r in results:
        if not r.success:
            assert r.stop_reason == "budget_exhausted_by_proxy"
            assert r.queries == 5  # clean + stripes + 3 updates; the refused call sent nothing

    # refused at the very first (clean) query
    target = Target(gray_net, len(x), fail_after_calls=0)
    results = square_attack(target.scores, x, y, epsilon=0.03, max_queries=500,
                            rng=np.random.default_rng(0))
    assert all(r.stop_reason == "budget_exhausted_by_proxy" and r.queries == 0
               and r.success is False and r.initially_correct is None for r in results)


def test_square_tiny_budgets(gray_net: TinyCNN) -> None:
    x, y = correct_images(gray_net, GRAY, 2, seed=10)
    for budget in (1, 2):
        target = Target(gray_net, len(x))
        results = square_attack(target.scores, x, y, epsilon=0.05, max_queries=budget,
                                rng=np.random.default_rng(0))
        assert_query_accounting(results, target, budget)
        assert all(r.queries == budget and r.stop_reason == "budget" for r in results)


# ---------------------------------------------------------------- HopSkipJump (IEEE-A8) ---


def assert_best_and_adversarial(results: list[AttackResult], target: Target, x: np.ndarray,
                                y: np.ndarray) -> None:
    """The returned adversarial is the smallest-L2 uint8 image the target answered wrongly for
    that index, never a worse one met before it."""
    for r in results:
        adv_seen = [(l2_distance(img, x[r.index]), img)
                    for i, img, lab in target.log if i == r.index and lab != y[r.index]]
        if r.stop_reason == "already_misclassified":
            continue
        if not adv_seen:
            assert r.success is False and r.l2 == 0.0
            continue
        best_l2 = min(d for d, _ in adv_seen)
        assert r.l2 == pytest.approx(best_l2, abs=1e-12)
        assert any(np.array_equal(img, r.adversarial) for _, img in adv_seen)


def test_hsja_counts_caps_and_returns_the_best_adversarial(gray_net: TinyCNN) -> None:
    x, y = correct_images(gray_net, GRAY, 4, seed=11)
    target = Target(gray_net, len(x))
    eps, budget = 1.0, 300
    results = hop_skip_jump(target.labels, x, y, epsilon=eps, max_queries=budget,
                            rng=np.random.default_rng(0))
    assert_query_accounting(results, target, budget)
    assert_successes_real(results, target, gray_net, y)
    assert_best_and_adversarial(results, target, x, y)
    for r in results:
        assert np.isfinite(r.l2)
        if r.success:
            assert r.l2 <= eps and r.stop_reason == "success"
        else:
            assert r.l2 > eps or r.l2 == 0.0
            assert r.stop_reason in ("budget", "iterations")
        if r.stop_reason == "budget":
            assert r.queries == budget


@pytest.mark.parametrize("shape", [GRAY, RGB])
def test_hsja_large_epsilon_succeeds_on_most(shape: tuple[int, int, int], gray_net: TinyCNN,
                                             rgb_net: TinyCNN) -> None:
    net = gray_net if shape == GRAY else rgb_net
    x, y = correct_images(net, shape, 6, seed=12)
    target = Target(net, len(x))
    eps, budget = (5.0 if shape == GRAY else 8.0), 250  # sqrt(d) is 16 and 26.8
    results = hop_skip_jump(target.labels, x, y, epsilon=eps, max_queries=budget,
                            rng=np.random.default_rng(3))
    assert_query_accounting(results, target, budget)
    assert_successes_real(results, target, net, y)
    assert sum(bool(r.success) for r in results) >= 4
    for r in results:
        if r.success:
            assert 0.0 < r.l2 <= eps


def test_hsja_already_misclassified_start(gray_net: TinyCNN) -> None:
    """HSJA from a misclassified start must not NaN or loop; 1 query."""
    x, y = correct_images(gray_net, GRAY, 3, seed=13)
    y = y.copy()
    y[[0, 2]] = (y[[0, 2]] + 1) % NUM_CLASSES
    target = Target(gray_net, len(x))
    results = hop_skip_jump(target.labels, x, y, epsilon=0.5, max_queries=40,
                            rng=np.random.default_rng(0))
    assert_query_accounting(results, target, 40)
    for i in (0, 2):
        r = results[i]
        assert r.queries == 1 and r.success is True and r.initially_correct is False
        assert r.stop_reason == "already_misclassified"
        assert r.l2 == 0.0 and not np.isnan(r.adversarial_float).any()
    assert results[1].initially_correct is True and results[1].queries > 1


def test_hsja_runs_the_batch_side_by_side(gray_net: TinyCNN) -> None:
    """hsja.py "Side by side": one call per round carries every running image's request (far
    fewer calls than queries), and an image's run is its own: from noise, image 0 does the
    same in another batch."""
    x, y = correct_images(gray_net, GRAY, 4, seed=15)
    target = Target(gray_net, len(x))
    results = hop_skip_jump(target.labels, x, y, epsilon=0.0, max_queries=80,
                            rng=np.random.default_rng(0), start="noise")
    assert_query_accounting(results, target, 80)
    assert target.calls <= max(r.queries for r in results)
    assert target.calls < sum(r.queries for r in results)
    other = Target(gray_net, 2)
    again = hop_skip_jump(other.labels, x[[0, 2]], y[[0, 2]], epsilon=0.0, max_queries=80,
                          rng=np.random.default_rng(0), start="noise")
    assert again[0].queries == results[0].queries
    np.testing.assert_array_equal(again[0].adversarial, results[0].adversarial)


def test_hsja_stops_cleanly_when_the_proxy_budget_runs_out(gray_net: TinyCNN) -> None:
    x, y = correct_images(gray_net, GRAY, 3, seed=14)
    target = Target(gray_net, len(x), fail_after_calls=4)
    results = hop_skip_jump(target.labels, x, y, epsilon=0.01, max_queries=1000,
                            rng=np.random.default_rng(0))
    assert target.calls == 4
    assert_query_accounting(results, target, 1000)
    assert all(r.stop_reason == "budget_exhausted_by_proxy" for r in results)
    # the images run side by side: each took part in every call the proxy answered
    assert all(r.queries == target.calls for r in results)

    target = Target(gray_net, len(x), fail_after_calls=0)
    results = hop_skip_jump(target.labels, x, y, epsilon=0.01, max_queries=1000,
                            rng=np.random.default_rng(0))
    assert all(r.queries == 0 and r.success is False and r.initially_correct is None
               for r in results)


@pytest.mark.parametrize("budget", [1, 2, 7, 23])
def test_hsja_never_exceeds_small_budgets(gray_net: TinyCNN, budget: int) -> None:
    x, y = correct_images(gray_net, GRAY, 2, seed=15)
    target = Target(gray_net, len(x))
    results = hop_skip_jump(target.labels, x, y, epsilon=0.01, max_queries=budget,
                            rng=np.random.default_rng(0))
    assert_query_accounting(results, target, budget)
    assert_successes_real(results, target, gray_net, y)


def test_square_epsilon_below_one_level_spends_only_the_clean_query(gray_net: TinyCNN) -> None:
    """IEEE-A9: e = floor(0.003 * 255) = 0 levels: nothing can change, so no further query."""
    x, y = correct_images(gray_net, GRAY, 2, seed=16)
    target = Target(gray_net, len(x))
    results = square_attack(target.scores, x, y, epsilon=0.003, max_queries=50,
                            rng=np.random.default_rng(0))
    assert_query_accounting(results, target, 50)
    for r in results:
        assert r.queries == 1 and r.success is False and r.stop_reason == "iterations"
        np.testing.assert_array_equal(r.adversarial, x[r.index])


@pytest.mark.parametrize("attack", ["square", "hsja"])
def test_spent_queries_of_a_killed_attempt_count_against_q_m(attack: str,
                                                             gray_net: TinyCNN) -> None:
    """Resumed attempts never push an image past Q_m. An attempt resumed after a
    crash starts from the queries the killed one left charged without an answer (``spent``):
    each image gets at most Q_m - spent more, one with nothing left is not queried at all."""
    x, y = correct_images(gray_net, GRAY, 4, seed=3)
    budget = 30
    spent = np.array([budget, 7, 0, budget - 1])
    target = Target(gray_net, len(x))
    if attack == "square":
        results = square_attack(target.scores, x, y, epsilon=0.05, max_queries=budget,
                                rng=np.random.default_rng(0), spent=spent)
    else:
        results = hop_skip_jump(target.labels, x, y, epsilon=0.5, max_queries=budget,
                                rng=np.random.default_rng(0), spent=spent)
    for r, s, sent in zip(results, spent, target.counts, strict=True):
        assert sent <= budget - s and r.queries == sent
    assert target.counts[0] == 0 and results[0].stop_reason == "budget"
    assert not results[0].success and results[0].initially_correct is None
    assert target.counts[2] > target.counts[3]          # a fresh image gets its whole Q_m


def test_hsja_batch_start_is_the_nearest_adversarial_image_and_beats_noise(
        gray_net: TinyCNN) -> None:
    """hsja.py ``start``: "batch" (default) asks the batch's other images for image i, nearest
    in L2 first, before any noise; "noise" (the paper's untargeted start) asks noise first.
    At equal budget the batch start ends closer on these images (a closer start)."""
    x, y = correct_images(gray_net, GRAY, 6, seed=21)
    best: dict[str, float] = {}
    for mode in ("batch", "noise"):
        target = Target(gray_net, len(x))
        results = hop_skip_jump(target.labels, x, y, epsilon=0.0, max_queries=120,
                                rng=np.random.default_rng(0), start=mode)
        assert_query_accounting(results, target, 120)
        first = [img for i, img, _ in target.log if i == 0][1]  # after the clean image
        others = sorted((l2_distance(x[0], x[j]), j) for j in range(1, len(x)))
        is_nearest = np.array_equal(first, x[others[0][1]])
        assert is_nearest == (mode == "batch")
        assert not any(np.array_equal(first, x[j]) for j in range(len(x))) or mode == "batch"
        found = [r.l2 for r in results if np.any(r.adversarial != x[r.index])]
        assert len(found) == len(x), mode  # every image got an adversarial start
        best[mode] = float(np.median(found))
    assert best["batch"] < best["noise"], best
    with pytest.raises(InvalidArgument) as err:
        hop_skip_jump(Target(gray_net, len(x)).labels, x, y, epsilon=0.1, max_queries=10,
                      rng=np.random.default_rng(0), start="nearest")
    assert err.value.violations[0].field == "start"
