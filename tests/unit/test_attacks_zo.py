"""Score-based gradient-estimation attacks (IEEE-A8, IEEE-A9, IEEE-M6): NES, Bandits-TD,
SignHunter (L-inf and L2), ZOO, RGF / P-RGF and NGD, on a real tiny CNN trained here, through a
counting target (the proxy's per-image accounting) and ``margins_of`` (what
``ctx.margin_query()`` serves a classifier). The invariants: the bound
on every returned image, the budget never exceeded and every image counted (clean included),
the first success stops an image (its last query is the returned image), an image already
adversarial stops with 1 query (also when the whole batch is), determinism per seed, non-square
1- and 3-channel images, targeted variants reach the target class, registry dispatch."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from fortis.services.perturbation.attacks.base import (
    STOP_REASONS,
    AttackContext,
    AttackResult,
    linf_levels,
    margins_of,
)
from fortis.services.perturbation.attacks.registry import ATTACKS
from fortis.services.perturbation.criteria import (
    Criterion,
    Misclassification,
    TargetedMisclassification,
)
from torch import nn

from tests.unit.test_attacks import (
    GRAY,
    NUM_CLASSES,
    RGB,
    Target,
    TinyCNN,
    correct_images,
    make_images,
    predict,
    to_input,
    train,
)

pytestmark = pytest.mark.usefixtures("one_thread")

Runner = Callable[..., list[AttackResult]]


def _attack(name: str) -> Runner:
    from fortis.services.perturbation.attacks import bandits, nes, ngd, rgf, signhunter, zoo
    fns: dict[str, Runner] = {"nes": nes.nes_attack, "bandits": bandits.bandits_attack,
                              "signhunter": signhunter.signhunter_attack,
                              "rgf": rgf.rgf_attack, "prgf": rgf.rgf_attack,
                              "zoo": lambda *a, norm, **k: zoo.zoo_attack(*a, **k),
                              "ngd": ngd.ngd_attack}
    return fns[name]


#: (attack, norm, epsilon used in the tests: L-inf [0,1] scale, L2 [0,1]-scale norm)
CASES = [("nes", "linf", 0.1), ("nes", "l2", 2.0), ("bandits", "linf", 0.1),
         ("bandits", "l2", 2.0), ("signhunter", "linf", 0.1), ("signhunter", "l2", 2.0),
         ("rgf", "l2", 2.0), ("rgf", "linf", 0.15), ("prgf", "l2", 2.0), ("prgf", "linf", 0.1),
         ("zoo", "l2", 2.0), ("ngd", "linf", 0.15), ("ngd", "l2", 2.0)]
IDS = [f"{a}-{n}" for a, n, _ in CASES]
#: Settings for the tiny 16 x 16 images of these tests (the papers' are for 299 x 299): RGF's
#: L-inf step (the paper's 0.005 is for ImageNet's thousands of iterations: 1000 queries are
#: 19 iterations here); ZOO's ADAM step (0.01: a coordinate is updated about twice in 1000
#: queries here).
TINY: dict[str, dict[str, object]] = {"rgf-linf": {"learning_rate": 0.02},
                                      "prgf-linf": {"learning_rate": 0.02},
                                      "zoo": {"learning_rate": 0.1},
                                      "ngd-linf": {"learning_rate": 0.02}}



@pytest.fixture(scope="module")
def gray_net() -> TinyCNN:
    return train(GRAY)


@pytest.fixture(scope="module")
def rgb_net() -> TinyCNN:
    return train(RGB)


class CallTarget(Target):
    """:class:`Target` that also remembers which call each logged image came in."""

    def __init__(self, net: nn.Module, n: int, **kw: object) -> None:
        super().__init__(net, n, **kw)  # type: ignore[arg-type]
        self.call_of: list[int] = []

    def _probs(self, images: np.ndarray, idx: np.ndarray) -> np.ndarray:
        out = super()._probs(images, idx)
        self.call_of += [self.calls] * len(idx)
        return out

    def last_call_images(self, i: int) -> list[np.ndarray]:
        """The images sent for index ``i`` in the last call that carried it."""
        rows = [k for k, (j, _, _) in enumerate(self.log) if j == i]
        last = self.call_of[rows[-1]]
        return [self.log[k][1] for k in rows if self.call_of[k] == last]


def run(name: str, norm: str, target: Target, x: np.ndarray, y: np.ndarray, eps: float,
        budget: int, seed: int = 0, criterion: Criterion | None = None,
        **kw: object) -> list[AttackResult]:
    margin = margins_of(target.scores, y, criterion or Misclassification())
    if name == "prgf":  # the prior: the target's own network (a perfect surrogate)
        kw.setdefault("surrogate", target.net)
        if isinstance(criterion, TargetedMisclassification):
            kw.setdefault("target", criterion.target)
    return _attack(name)(margin, x, y, epsilon=eps, max_queries=budget,
                         rng=np.random.default_rng(seed), norm=norm,
                         **{**TINY.get(name, {}), **TINY.get(f"{name}-{norm}", {}), **kw})


def assert_bound(results: list[AttackResult], x: np.ndarray, norm: str, eps: float) -> None:
    """IEEE-A9 on every returned image, measured on the uint8 output."""
    for r in results:
        assert r.adversarial.dtype == np.uint8 and r.adversarial.shape == x.shape[1:]
        diff = r.adversarial.astype(np.float64) - x[r.index].astype(np.float64)
        if norm == "linf":
            assert np.abs(diff).max() <= linf_levels(eps)
        else:
            assert np.sqrt(((diff / 255.0) ** 2).sum()) <= eps + 1e-9
        assert np.isfinite(r.l2) and np.isfinite(r.linf)


def assert_accounting(results: list[AttackResult], target: CallTarget, budget: int) -> None:
    """IEEE-M6: every image sent counted (clean included), never past Q_m, first-success stop
    (the returned adversarial was sent in the last call that carried its index)."""
    assert [r.index for r in results] == list(range(len(results)))
    for r in results:
        assert r.queries == target.counts[r.index] <= budget
        assert r.stop_reason in STOP_REASONS
        if r.success:
            assert r.stop_reason in ("success", "already_misclassified")
            assert any(np.array_equal(img, r.adversarial)
                       for img in target.last_call_images(r.index))
        else:
            assert r.stop_reason in ("budget", "iterations")


@pytest.mark.parametrize(("name", "norm", "eps"), CASES, ids=IDS)
def test_bound_budget_first_success(name: str, norm: str, eps: float,
                                    gray_net: TinyCNN) -> None:
    x, y = correct_images(gray_net, GRAY, 6, seed=5)
    target = CallTarget(gray_net, len(x))
    budget = 1000
    results = run(name, norm, target, x, y, eps, budget)
    assert_accounting(results, target, budget)
    assert_bound(results, x, norm, eps)
    wins = [r for r in results if r.success]
    assert len(wins) >= 2, name
    for r in wins:
        assert predict(gray_net, r.adversarial[None])[0] != y[r.index]  # judged on uint8
        assert r.initially_correct is True


@pytest.mark.parametrize(("name", "norm", "eps"), CASES, ids=IDS)
def test_all_already_misclassified_one_query(name: str, norm: str, eps: float,
                                            gray_net: TinyCNN) -> None:
    x, _ = make_images(4, GRAY, seed=7)
    wrong = (predict(gray_net, x) + 1) % NUM_CLASSES
    target = CallTarget(gray_net, len(x))
    results = run(name, norm, target, x, wrong, eps, 50)
    assert target.calls == 1
    for r in results:
        assert r.queries == 1 and r.success is True and r.initially_correct is False
        assert r.stop_reason == "already_misclassified"
        np.testing.assert_array_equal(r.adversarial, x[r.index])


@pytest.mark.parametrize(("name", "norm", "eps"), CASES, ids=IDS)
def test_mixed_batch_deterministic_rgb_non_square(name: str, norm: str, eps: float,
                                                  rgb_net: TinyCNN) -> None:
    """H != W, C = 3; one image already misclassified stops at 1 query; a tiny budget (odd,
    so a last lone probe) holds; same seed, same result."""
    x, y = correct_images(rgb_net, RGB, 4, seed=8)
    y = y.copy()
    y[1] = (y[1] + 1) % NUM_CLASSES
    budget = 37
    out = []
    for _ in range(2):
        target = CallTarget(rgb_net, len(x))
        res = run(name, norm, target, x, y, eps, budget, seed=3)
        assert_accounting(res, target, budget)
        assert_bound(res, x, norm, eps)
        assert res[1].queries == 1 and res[1].stop_reason == "already_misclassified"
        out.append(res)
    for a, b in zip(*out, strict=True):
        np.testing.assert_array_equal(a.adversarial, b.adversarial)
        assert a.queries == b.queries and a.stop_reason == b.stop_reason


@pytest.mark.parametrize("budget", [1, 2, 3])
@pytest.mark.parametrize(("name", "norm", "eps"), CASES, ids=IDS)
def test_tiny_budgets(name: str, norm: str, eps: float, budget: int,
                      gray_net: TinyCNN) -> None:
    x, y = correct_images(gray_net, GRAY, 3, seed=9)
    target = CallTarget(gray_net, len(x))
    results = run(name, norm, target, x, y, eps, budget)
    assert_accounting(results, target, budget)
    assert_bound(results, x, norm, eps)


@pytest.mark.parametrize(("name", "norm", "eps"), CASES, ids=IDS)
def test_targeted_reaches_the_target_class(name: str, norm: str, eps: float,
                                          gray_net: TinyCNN) -> None:
    x, y = correct_images(gray_net, GRAY, 12, seed=11)
    goal = 2
    keep = y != goal
    x, y = x[keep][:6], y[keep][:6]
    target = CallTarget(gray_net, len(x))
    results = run(name, norm, target, x, y, 0.15 if norm == "linf" else 3.0, 1000,
                  criterion=TargetedMisclassification(target=goal))
    wins = [r for r in results if r.success]
    assert len(wins) >= 2, name
    for r in wins:
        assert predict(gray_net, r.adversarial[None])[0] == goal


def test_signhunter_l2_below_one_level_spends_only_the_clean_query(gray_net: TinyCNN) -> None:
    x, y = correct_images(gray_net, GRAY, 2, seed=12)
    target = CallTarget(gray_net, len(x))
    results = run("signhunter", "l2", target, x, y, 0.05, 100)  # 0.05*255/16 < 1 level
    for r in results:
        assert r.queries == 1 and r.stop_reason == "iterations" and not r.success


# -------------------------------------------------------------------- registry dispatch ----


class Client:
    """A classifier QueryClient over the tiny net, counting per image id."""

    def __init__(self, net: nn.Module) -> None:
        self.net, self.num_classes = net, NUM_CLASSES
        self.counts: dict[str, int] = {}

    def scores(self, images: np.ndarray, image_ids: list[str]) -> np.ndarray:
        for i in image_ids:
            self.counts[i] = self.counts.get(i, 0) + 1
        with torch.no_grad():
            return torch.softmax(self.net(to_input(images)), dim=1).numpy()

    def labels(self, images: np.ndarray, image_ids: list[str]) -> np.ndarray:
        return self.scores(images, image_ids).argmax(1)


@pytest.mark.parametrize("attack_id", ["nes", "nes_l2", "bandits", "bandits_l2", "signhunter",
                                       "signhunter_l2", "rgf", "rgf_linf", "prgf", "prgf_linf",
                                       "zoo", "ngd", "ngd_l2"])
def test_registered_and_run_through_the_context(attack_id: str, gray_net: TinyCNN) -> None:
    spec = ATTACKS[attack_id]
    assert spec.kind == "score" and spec.targeted and spec.untargeted
    x, y = correct_images(gray_net, GRAY, 3, seed=13)
    params = {p.name: p.default for p in spec.params}
    params.update(epsilon=0.1 if spec.norm == "linf" else 2.0, max_queries=120)
    client = Client(gray_net)
    ids = tuple(f"img{i}" for i in range(len(x)))
    surrogate = SimpleNamespace(model=gray_net, name="tiny", input_spec=SimpleNamespace(
        height=GRAY[0], width=GRAY[1], channels=GRAY[2])) if spec.uses_surrogate else None
    ctx = AttackContext(spec=spec, images=x, labels=y, image_ids=ids,
                        label_sets=tuple((int(v),) for v in y), params=params, seed=1,
                        query=client, surrogate=surrogate)
    results = spec.run(ctx)
    assert len(results) == len(x)
    for r in results:
        assert r.queries == client.counts[ids[r.index]] <= 120
    assert_bound(results, x, spec.norm, params["epsilon"])


def test_prgf_without_a_surrogate_is_refused(gray_net: TinyCNN) -> None:
    from fortis.services.common.errors import InvalidArgument
    spec = ATTACKS["prgf"]
    x, y = correct_images(gray_net, GRAY, 1, seed=13)
    params = {p.name: p.default for p in spec.params}
    params.update(epsilon=2.0, max_queries=10)
    ctx = AttackContext(spec=spec, images=x, labels=y, image_ids=("a",), label_sets=((0,),),
                        params=params, query=Client(gray_net))
    with pytest.raises(InvalidArgument) as e:
        spec.run(ctx)
    assert e.value.violations[0].field == "surrogate"


def test_optimal_lambda_is_the_papers() -> None:
    """Cheng et al. 2019, eq. 12: 0 below 1/(D+2q-2), 1 above (2q-1)/(D+2q-2), in (0, 1)
    between, growing with alpha."""
    from fortis.services.perturbation.attacks.rgf import optimal_lambda
    d, q = 1000, 50
    lo, hi = np.sqrt(1 / (d + 2 * q - 2)), np.sqrt((2 * q - 1) / (d + 2 * q - 2))
    lam = optimal_lambda(np.array([0.0, lo * 0.99, lo * 1.5, 0.2, hi * 0.99, hi * 1.01, 1.0]),
                         d, q)
    assert lam[0] == lam[1] == 0.0 and lam[-1] == lam[-2] == 1.0
    assert 0 < lam[2] < lam[3] < lam[4] <= 1.0


def test_zoo_reduced_space_hierarchy_and_importance(rgb_net: TinyCNN) -> None:
    """ZOO on a 12 x 20 RGB image with an attack space of side 8 (grid 5 x 8), doubled after
    2 iterations (hierarchy) and importance sampling on the reduced grid: bound, budget,
    first-success stop, determinism."""
    from fortis.services.perturbation.attacks.zoo import zoo_attack
    x, y = correct_images(rgb_net, RGB, 4, seed=14)
    out = []
    for _ in range(2):
        target = CallTarget(rgb_net, len(x))
        res = zoo_attack(margins_of(target.scores, y, Misclassification()), x, y,
                         epsilon=2.0, max_queries=400, rng=np.random.default_rng(5),
                         learning_rate=0.1, batch=16, reduced=8, hierarchy_iterations=(2,))
        assert_accounting(res, target, 400)
        assert_bound(res, x, "l2", 2.0)
        out.append(res)
    for a, b in zip(*out, strict=True):
        np.testing.assert_array_equal(a.adversarial, b.adversarial)
    assert all(r.l2 > 0 for r in out[0] if not r.success)  # the reduced grid moved the image
