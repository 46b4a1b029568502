"""Decision-based query attacks (IEEE-A8, IEEE-A9, IEEE-M6): every ``decision`` entry of the
attack registry (HopSkipJump, Boundary, QEBA, qFool, GeoDA L2 / L-inf, SurFree and any added
later) run as the engine runs it (``AttackSpec.run(AttackContext)``, queries through
``ctx.decision_query()``) against a **label-only** target (its ``scores`` refuse: a decision
attack must never read them), on the project's Fashion-MNIST CNN and, for other shapes, on
small CNNs trained here on non-square 1- and 3-channel images.

Invariants: every query counted per image, the clean
image first, never more than Q_m; a success lies within the bound (L2 or L-inf, on the uint8
image sent) and is really adversarial; an image stops at the query call that first sent an
adversarial within the bound; the returned adversarial is the smallest (in the attack's norm)
of all the images the target answered adversarial (best so far, never worse); an image
already adversarial costs exactly one query (also when the whole batch is); proxy refusals
stop cleanly; a resumed attempt's spent queries count against Q_m; the same seed gives the
same run; the targeted variant (``SPEC.targeted``) reaches the target class.
"""

from __future__ import annotations

from types import MappingProxyType

import numpy as np
import pytest
import torch
from fortis.services.common.arrays import l2_distance, linf_distance
from fortis.services.common.errors import BudgetExhausted, QuotaViolation
from fortis.services.common.params import validate_params
from fortis.services.perturbation.attacks.base import (
    STOP_REASONS,
    AttackContext,
    AttackResult,
    AttackSpec,
    linf_levels,
)
from fortis.services.perturbation.attacks.registry import ATTACKS
from fortis.services.perturbation.criteria import (
    Criterion,
    Misclassification,
    TargetedMisclassification,
)
from torch import nn

from tests.unit.test_attacks import TinyCNN, make_images, predict, to_input

pytestmark = pytest.mark.usefixtures("one_thread")

DECISION = [s for s in ATTACKS.values() if s.kind == "decision" and s.family == "decision-based"]
IDS = [s.id for s in DECISION]
TARGETED = [s for s in DECISION if s.targeted]
#: A bound most images reach within small budgets, per norm ([0, 1] scale).
EPS = {"l2": 5.0, "linf": 0.25}


class LabelTarget:
    """A label-only target: top-1 labels, every image of every call counted per image id (as
    the proxy counts), each answer logged with its call number; can refuse like a proxy whose
    budget ran out. Reading scores is a test failure."""

    signal = "labels"

    def __init__(self, predict_fn, ids: tuple[str, ...], num_classes: int = 10, *,
                 fail_after_calls: int | None = None) -> None:
        self.predict_fn = predict_fn
        self.index = {s: k for k, s in enumerate(ids)}
        self.num_classes = num_classes
        self.counts = np.zeros(len(ids), dtype=np.int64)
        self.calls = 0
        self.fail_after_calls = fail_after_calls
        self.log: list[tuple[int, int, np.ndarray, int]] = []  # (call, index, image, label)

    def labels(self, images: np.ndarray, image_ids) -> np.ndarray:
        assert images.dtype == np.uint8 and images.ndim == 4 and len(images) == len(image_ids)
        if self.fail_after_calls is not None and self.calls >= self.fail_after_calls:
            raise BudgetExhausted([QuotaViolation("session", "query budget spent")])
        self.calls += 1
        idx = [self.index[s] for s in image_ids]
        np.add.at(self.counts, idx, 1)
        labels = np.asarray(self.predict_fn(images))
        for i, img, lab in zip(idx, images, labels, strict=True):
            self.log.append((self.calls, i, img.copy(), int(lab)))
        return labels

    def scores(self, images: np.ndarray, image_ids) -> np.ndarray:  # pragma: no cover
        raise AssertionError("a decision-based attack read scores")


def run_attack(spec: AttackSpec, target_fn, x: np.ndarray, y: np.ndarray, *, epsilon: float,
               max_queries: int, seed: int = 0, criterion: Criterion | None = None,
               fail_after_calls: int | None = None,
               spent: np.ndarray | None = None) -> tuple[list[AttackResult], LabelTarget]:
    """The attack through the registry, as the perturbation engine runs it."""
    ids = tuple(f"img{i}" for i in range(len(x)))
    target = LabelTarget(target_fn, ids, fail_after_calls=fail_after_calls)
    if spent is not None:
        target.lost = lambda image_ids: [int(spent[target.index[s]]) for s in image_ids]
    params = validate_params(spec, {"epsilon": epsilon, "max_queries": max_queries})
    ctx = AttackContext(spec=spec, images=x, labels=y, image_ids=ids,
                        label_sets=tuple((int(v),) for v in y),
                        params=MappingProxyType(params), seed=seed,
                        criterion=criterion or Misclassification(), query=target)
    results = spec.run(ctx)
    assert ctx.used_signal() in ("labels", "")
    return results, target


def distance(spec: AttackSpec, x: np.ndarray, adv: np.ndarray) -> float:
    return l2_distance(x, adv) if spec.norm == "l2" else linf_distance(x, adv)


def within(spec: AttackSpec, x: np.ndarray, adv: np.ndarray, epsilon: float) -> bool:
    if spec.norm == "l2":
        return l2_distance(x, adv) <= epsilon
    return int(np.abs(adv.astype(np.int64) - x).max()) <= linf_levels(epsilon)


def adversarial(label: int, y: int, criterion: Criterion | None) -> bool:
    if isinstance(criterion, TargetedMisclassification):
        return label == criterion.target
    return label != y


def check_invariants(spec: AttackSpec, results: list[AttackResult], target: LabelTarget,
                     x: np.ndarray, y: np.ndarray, epsilon: float, max_queries: int,
                     criterion: Criterion | None = None) -> None:
    """Every invariant of the module docstring that one run shows."""
    assert [r.index for r in results] == list(range(len(x)))
    for r in results:
        i = r.index
        mine = [(c, img, lab) for c, j, img, lab in target.log if j == i]
        # counted, clean image first, capped
        assert r.queries == target.counts[i] == len(mine) <= max_queries
        assert r.stop_reason in STOP_REASONS
        assert r.adversarial.dtype == np.uint8 and r.adversarial.shape == x.shape[1:]
        assert np.isfinite(r.l2) and np.isfinite(r.linf)
        np.testing.assert_array_equal(r.adversarial_float,
                                      r.adversarial.astype(np.float32) / 255)
        if not mine:
            continue
        np.testing.assert_array_equal(mine[0][1], x[i])
        if r.stop_reason == "already_misclassified":
            assert r.queries == 1 and r.success is True and r.initially_correct is False
            np.testing.assert_array_equal(r.adversarial, x[i])
            continue
        assert r.initially_correct is True
        advs = [(distance(spec, x[i], img), c, img) for c, img, lab in mine
                if adversarial(lab, int(y[i]), criterion)]
        # best so far: the smallest adversarial the target answered, never a worse one
        if advs:
            best = min(d for d, _, _ in advs)
            assert distance(spec, x[i], r.adversarial) == pytest.approx(best, abs=1e-12)
            assert any(np.array_equal(img, r.adversarial) for _, _, img in advs)
        else:
            assert r.success is False
            np.testing.assert_array_equal(r.adversarial, x[i])
        # success: within the bound, really adversarial, and the image stopped there
        good = [c for d, c, img in advs if within(spec, x[i], img, epsilon)]
        assert bool(r.success) == bool(good)
        if r.success:
            assert r.stop_reason == "success"
            assert within(spec, x[i], r.adversarial, epsilon)
            assert mine[-1][0] == min(good), "queries sent after the first success"
        else:
            assert r.stop_reason in ("budget", "iterations", "budget_exhausted_by_proxy")
        if r.stop_reason == "budget":
            assert r.queries == max_queries


# ------------------------------------------------------------------------------ fixtures ----



@pytest.fixture(scope="module")
def fmnist(fmnist_target, fmnist_test_images):
    """(label function, correctly classified Fashion-MNIST test images, their labels)."""
    x, y = fmnist_test_images
    ok = np.flatnonzero(fmnist_target.predict(x) == y)
    return fmnist_target.predict, x[ok], y[ok]


#: Non-square shapes, 1 and 3 channels; odd sides exercise partial 8 x 8 DCT blocks and
#: uneven resizing.
SHAPES = [(11, 19, 1), (12, 20, 3)]


def quick_net(shape: tuple[int, int, int]) -> nn.Module:
    """test_attacks.py's tiny CNN, trained briefly (the invariants need a working classifier,
    not a good one)."""
    torch.manual_seed(0)
    x, y = make_images(240, shape, seed=1)
    xt, yt = to_input(x), torch.from_numpy(y)
    net = TinyCNN(shape[2])
    opt = torch.optim.Adam(net.parameters(), lr=2e-2)
    for _ in range(40):
        idx = torch.randint(0, len(y), (48,))
        loss = nn.functional.cross_entropy(net(xt[idx]), yt[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return net.eval()


@pytest.fixture(scope="module")
def small_nets() -> dict[tuple[int, int, int], nn.Module]:
    return {shape: quick_net(shape) for shape in SHAPES}


def correct_small(net: nn.Module, shape: tuple[int, int, int], n: int,
                  seed: int) -> tuple[np.ndarray, np.ndarray]:
    x, y = make_images(6 * n, shape, seed)
    ok = predict(net, x) == y
    assert ok.sum() >= n
    return x[ok][:n], y[ok][:n]


# --------------------------------------------------------------------------------- tests ----


def test_every_decision_attack_is_registered() -> None:
    assert {"hsja", "boundary", "qeba", "qfool", "geoda", "geoda_linf", "surfree"} <= set(IDS)
    for spec in DECISION:
        assert spec.norm in EPS and spec.params[0].name == "epsilon"


@pytest.mark.parametrize("spec", DECISION, ids=IDS)
def test_bound_budget_first_success_and_best_so_far(spec: AttackSpec, fmnist) -> None:
    """On the Fashion-MNIST CNN, label-only: the invariants hold on every image, and the
    attack does succeed on some (not vacuous)."""
    fn, x, y = fmnist
    x, y = x[:4], y[:4]
    eps, budget = EPS[spec.norm], 120
    results, target = run_attack(spec, fn, x, y, epsilon=eps, max_queries=budget)
    check_invariants(spec, results, target, x, y, eps, budget)
    assert any(r.success for r in results)
    advs = np.stack([r.adversarial for r in results])
    ok = np.array([bool(r.success) for r in results])
    assert np.all(fn(advs[ok]) != y[ok])  # asked again: still adversarial


@pytest.mark.parametrize("spec", DECISION, ids=IDS)
def test_minimal_norm_mode_never_succeeds_and_spends_the_budget(spec: AttackSpec,
                                                                fmnist) -> None:
    """Bound 0: nothing adversarial lies within it; the attack keeps searching until Q_m (or
    gives up) and reports its smallest adversarial, which is not a success."""
    fn, x, y = fmnist
    x, y = x[4:7], y[4:7]
    results, target = run_attack(spec, fn, x, y, epsilon=0.0, max_queries=60)
    check_invariants(spec, results, target, x, y, 0.0, 60)
    assert all(r.success is False for r in results)
    assert any(r.stop_reason == "budget" for r in results)


@pytest.mark.parametrize("spec", DECISION, ids=IDS)
def test_already_adversarial_costs_one_query(spec: AttackSpec, fmnist) -> None:
    """An image the target already answers adversarial stops with its clean query; the
    others run on; a whole batch of them is one query call."""
    fn, x, y = fmnist
    x, y = x[7:10], y[7:10].copy()
    y[[0, 2]] = (y[[0, 2]] + 1) % 10
    results, target = run_attack(spec, fn, x, y, epsilon=EPS[spec.norm], max_queries=40)
    check_invariants(spec, results, target, x, y, EPS[spec.norm], 40)
    for i in (0, 2):
        assert results[i].stop_reason == "already_misclassified" and results[i].queries == 1
        assert results[i].l2 == 0.0
    assert results[1].queries > 1 and results[1].initially_correct is True

    y_all = (fmnist[2][7:10] + 1) % 10
    results, target = run_attack(spec, fn, x, y_all, epsilon=EPS[spec.norm], max_queries=40)
    assert target.calls == 1 and list(target.counts) == [1, 1, 1]
    assert all(r.stop_reason == "already_misclassified" and r.success for r in results)


@pytest.mark.parametrize("spec", DECISION, ids=IDS)
@pytest.mark.parametrize("budget", [1, 2, 9, 31])
def test_never_exceeds_small_budgets(spec: AttackSpec, budget: int, fmnist) -> None:
    fn, x, y = fmnist
    x, y = x[10:12], y[10:12]
    results, target = run_attack(spec, fn, x, y, epsilon=EPS[spec.norm], max_queries=budget)
    check_invariants(spec, results, target, x, y, EPS[spec.norm], budget)


@pytest.mark.parametrize("spec", DECISION, ids=IDS)
def test_deterministic_for_a_seed(spec: AttackSpec, fmnist) -> None:
    fn, x, y = fmnist
    x, y = x[12:14], y[12:14]
    runs = [run_attack(spec, fn, x, y, epsilon=0.0, max_queries=50, seed=7)[0]
            for _ in range(2)]
    for a, b in zip(*runs, strict=True):
        assert a.queries == b.queries and a.stop_reason == b.stop_reason
        np.testing.assert_array_equal(a.adversarial, b.adversarial)


@pytest.mark.parametrize("spec", DECISION, ids=IDS)
@pytest.mark.parametrize("shape", SHAPES, ids=["gray11x19", "rgb12x20"])
def test_non_square_one_and_three_channels(spec: AttackSpec, shape, small_nets) -> None:
    net = small_nets[shape]
    x, y = correct_small(net, shape, 3, seed=5)
    eps = {"l2": 3.0, "linf": 0.3}[spec.norm]

    def fn(images: np.ndarray) -> np.ndarray:
        return predict(net, images)

    results, target = run_attack(spec, fn, x, y, epsilon=eps, max_queries=100)
    check_invariants(spec, results, target, x, y, eps, 100)
    assert any(np.isfinite(r.l2) and r.l2 > 0 for r in results)  # it found adversarials


@pytest.mark.parametrize("spec", DECISION, ids=IDS)
def test_flat_and_saturated_images(spec: AttackSpec, small_nets) -> None:
    """Edge images: all black, all white and mid-grey (a flat image has no DCT structure for
    SurFree's directions; saturated pixels clip every step), labelled with the net's own
    answer: no NaN, no crash, the invariants hold."""
    shape = SHAPES[0]
    net = small_nets[shape]
    x = np.stack([np.full(shape, v, dtype=np.uint8) for v in (0, 255, 128)])
    y = predict(net, x)

    def fn(images: np.ndarray) -> np.ndarray:
        return predict(net, images)

    eps = {"l2": 3.0, "linf": 0.3}[spec.norm]
    results, target = run_attack(spec, fn, x, y, epsilon=eps, max_queries=80)
    check_invariants(spec, results, target, x, y, eps, 80)
    assert all(np.isfinite(r.adversarial_float).all() for r in results)


@pytest.mark.parametrize("spec", DECISION, ids=IDS)
@pytest.mark.parametrize("calls", [3, 25])
def test_proxy_refusal_and_resumed_budget(spec: AttackSpec, calls: int, fmnist) -> None:
    """A refused call (the proxy's budget) stops those images cleanly, during the start or
    mid-search; a resumed attempt's spent queries count against Q_m (an image with none left
    is not asked at all)."""
    fn, x, y = fmnist
    x, y = x[14:17], y[14:17]
    results, target = run_attack(spec, fn, x, y, epsilon=0.01, max_queries=500,
                                 fail_after_calls=calls)
    assert target.calls == calls
    check_invariants(spec, results, target, x, y, 0.01, 500)
    assert all(r.stop_reason == "budget_exhausted_by_proxy" and not r.success
               for r in results)

    spent = np.array([30, 10, 0])
    results, target = run_attack(spec, fn, x, y, epsilon=0.0, max_queries=30, spent=spent)
    assert target.counts[0] == 0 and results[0].stop_reason == "budget"
    assert results[0].initially_correct is None and not results[0].success
    for r, s in zip(results, spent, strict=True):
        assert r.queries == target.counts[r.index] <= 30 - s


@pytest.mark.parametrize("spec", TARGETED, ids=[s.id for s in TARGETED])
def test_targeted_variant_reaches_the_target_class(spec: AttackSpec, fmnist) -> None:
    """``SPEC.targeted``: under ``TargetedMisclassification`` every success is answered as the
    target class (re-asked), and with a loose bound most images reach it. The batch holds an
    image of the target class (already "adversarial": one query), the targeted start."""
    fn, x, y = fmnist
    tgt = 0
    others = np.flatnonzero(y != tgt)[:4]
    one = np.flatnonzero(y == tgt)[:1]
    sel = np.concatenate([others, one])
    x, y = x[sel], y[sel]
    crit = TargetedMisclassification(target=tgt)
    eps = {"l2": 8.0, "linf": 0.6}[spec.norm]
    results, target = run_attack(spec, fn, x, y, epsilon=eps, max_queries=150,
                                 criterion=crit)
    check_invariants(spec, results, target, x, y, eps, 150, criterion=crit)
    assert results[-1].stop_reason == "already_misclassified"
    ok = np.array([bool(r.success) for r in results[:-1]])
    assert ok.sum() >= 3
    advs = np.stack([r.adversarial for r in results[:-1]])
    assert np.all(fn(advs[ok]) == tgt)
