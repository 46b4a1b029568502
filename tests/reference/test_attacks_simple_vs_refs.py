"""SimBA, Square L2, SimBA-ODS, the low-frequency DCT attack and the single-pixel attack side
by side with independent references on the project's Fashion-MNIST CNN (IEEE-A8, IEEE-A9,
IEEE-M6), at the same bound and the same per-image query budget counted in real model
queries, as ``test_attacks_vs_art.py`` does:

* Every tool reaches the network through one counting oracle: float NCHW in [0, 1] in,
  rounded to uint8 levels first (what a target receives), softmax probabilities out. Every
  row is charged to the image it perturbs (the nearest original for batched tools, the one
  image for tools run one image at a time), the clean image included; a reference is
  credited with its first point that meets the criterion within the bound, only within its
  first ``budget`` charged queries; past that its points are answered "true class, certain"
  without the model (so it runs on as usual but can no longer gain): a reference that
  overruns the budget is scored at the budget. Repeated identical points of one image are
  answered from memory and not charged (generous to the references).
* Pass: Fortis's success rate >= the reference's minus two standard errors of the
  difference (``tolerance``); every Fortis adversarial within the bound and misclassified
  when asked again; queries as counted, never more than the budget.
* Where no reference exists (SimBA-ODS, LF-DCT), the paper's qualitative claim is shown
  instead (said in each test).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from fortis.services.perturbation.attacks.base import margins_of
from fortis.services.perturbation.attacks.local_search import local_search_attack
from fortis.services.perturbation.attacks.lowfreq_dct import lowfreq_dct_attack
from fortis.services.perturbation.attacks.ods import ods_attack
from fortis.services.perturbation.attacks.simba import simba_attack
from fortis.services.perturbation.attacks.single_pixel import single_pixel_attack
from fortis.services.perturbation.attacks.square_l2 import square_l2_attack
from fortis.services.perturbation.criteria import Misclassification

from tests.reference.refkit import (
    NUM_CLASSES,
    SHAPE_NCHW,
    Counting,
    Done,
    Oracle,
    ToolNet,
    assert_unchanged,
    check_ours,
    compare,
    net_state,
)
from tests.reference.test_attacks_vs_art import art_seeded, to_nchw, tolerance

# ------------------------------------------------------------------------------- SimBA -------


@pytest.mark.slow
@pytest.mark.parametrize("basis", ["pixel", "dct"])
def test_simba_not_weaker_than_art(basis, fmnist_target, correct):
    """SimBA (``basis="pixel"``) and SimBA-DCT (``basis="dct"``), L2 <= 2.0, step 0.2, 300
    queries per image, 30 correctly classified images, against ART ``SimBA(attack="px" /
    "dct", epsilon=0.2, freq_dim=4, stride=1)`` (ART's 28 x 28 equivalents of the paper's
    28/224 and 7/224; ours: ``round(28 / 8) = 4``, ``max(1, round(28 / 32)) = 1``). ART asks
    both signs every iteration and has no L2 bound: it is credited only with points within
    L2 <= 2.0. It runs one image at a time (as it does internally)."""
    from art.attacks.evasion import SimBA
    from art.estimators.classification import BlackBoxClassifierNeuralNetwork

    x, y = correct[0][:30], correct[1][:30]
    n, budget, eps = len(x), 300, 2.0
    net = fmnist_target.model.eval()
    before = net_state(net)
    target = Counting(fmnist_target, n)
    results = simba_attack(margins_of(target.scores, y, Misclassification()), x, y,
                           epsilon=eps, max_queries=budget, rng=np.random.default_rng(0),
                           basis=basis)
    ours = check_ours(results, target, fmnist_target, x, y, "l2", eps, budget)

    oracle = Oracle(net, x, y, "l2", eps, budget)
    clf = BlackBoxClassifierNeuralNetwork(oracle, input_shape=SHAPE_NCHW,
                                          nb_classes=NUM_CLASSES, channels_first=True,
                                          clip_values=(0.0, 1.0))
    xs = to_nchw(x)
    with art_seeded(0):
        for i in range(n):
            oracle.single = i
            attack = SimBA(clf, attack="px" if basis == "pixel" else "dct", max_iter=budget,
                           epsilon=0.2, freq_dim=4, stride=1, order="random", verbose=False)
            try:
                attack.generate(xs[i:i + 1], y=np.eye(NUM_CLASSES)[y[i:i + 1]])
            except Done:
                pass
    assert oracle.counts.max() <= budget
    assert_unchanged(net, before)
    compare(f"SimBA-{basis} vs ART", ours, oracle.success, target.counts, oracle.first)
    assert ours.mean() > 0.3


# ---------------------------------------------------------------------------- Square L2 -----


@pytest.mark.slow
@pytest.mark.parametrize("tool", ["art", "torchattacks"])
def test_square_l2_not_weaker_than_references(tool, fmnist_target, correct):
    """Square L2 (L2 <= 1.5, ``p_init`` 0.1, 150 queries per image, 30 images) against ART
    ``SquareAttack(norm=2)`` and torchattacks ``Square(norm="L2", loss="margin")``, both
    batched (rows charged to the nearest original), given more iterations than the budget:
    the budget, counted by the oracle, stops them."""
    x, y = correct[0][:30], correct[1][:30]
    n, budget, eps, p_init = len(x), 150, 1.5, 0.1
    net = fmnist_target.model.eval()
    before = net_state(net)
    target = Counting(fmnist_target, n)
    results = square_l2_attack(margins_of(target.scores, y, Misclassification()), x, y,
                               epsilon=eps, max_queries=budget, rng=np.random.default_rng(0),
                               p_init=p_init)
    ours = check_ours(results, target, fmnist_target, x, y, "l2", eps, budget)

    oracle = Oracle(net, x, y, "l2", eps, budget)
    if tool == "art":
        from art.attacks.evasion import SquareAttack
        from art.estimators.classification import BlackBoxClassifierNeuralNetwork

        clf = BlackBoxClassifierNeuralNetwork(oracle, input_shape=SHAPE_NCHW,
                                              nb_classes=NUM_CLASSES, channels_first=True,
                                              clip_values=(0.0, 1.0))
        with art_seeded(0):
            SquareAttack(clf, norm=2, eps=eps, max_iter=2 * budget, p_init=p_init,
                         nb_restarts=1, batch_size=128, verbose=False).generate(
                to_nchw(x), y=np.eye(NUM_CLASSES)[y])
    else:
        import torchattacks

        atk = torchattacks.Square(ToolNet(oracle), norm="L2", eps=eps, n_queries=2 * budget,
                                  n_restarts=1, p_init=p_init, loss="margin",
                                  resc_schedule=False, seed=0, verbose=False)
        atk(torch.from_numpy(to_nchw(x)), torch.from_numpy(y))
    assert oracle.counts.max() <= budget
    assert_unchanged(net, before)
    compare(f"Square L2 vs {tool}", ours, oracle.success, target.counts, oracle.first)
    assert ours.mean() > 0.15  # not vacuous (26.7 % of 30 images at this budget)


# ------------------------------------------------------------------ SimBA-ODS: the claim -----


@pytest.mark.slow
def test_simba_ods_needs_fewer_queries_than_simba(fmnist_target, fmnist_surrogate, correct):
    """No reference implementation is installable (the authors' ``ermongroup/ODS`` is not
    packaged): the paper's claim instead. SimBA-ODS with a surrogate of another architecture
    (``fmnist-surrogate``) succeeds at least as often as SimBA-DCT and SimBA-pixel (within
    two standard errors) with fewer mean queries on the images both succeed on (L2 <= 2.0,
    300 queries, 30 images)."""
    x, y = correct[0][:30], correct[1][:30]
    n, budget, eps = len(x), 300, 2.0
    runs = {}
    for name in ("ods", "dct", "pixel"):
        target = Counting(fmnist_target, n)
        m = margins_of(target.scores, y, Misclassification())
        if name == "ods":
            res = ods_attack(m, x, y, surrogate=fmnist_surrogate.model, epsilon=eps,
                             max_queries=budget, rng=np.random.default_rng(0))
        else:
            res = simba_attack(m, x, y, epsilon=eps, max_queries=budget,
                               rng=np.random.default_rng(0), basis=name)
        runs[name] = (check_ours(res, target, fmnist_target, x, y, "l2", eps, budget),
                      target.counts.copy())
    ok_ods, q_ods = runs["ods"]
    for name in ("dct", "pixel"):
        ok, q = runs[name]
        compare(f"SimBA-ODS vs SimBA-{name}", ok_ods, ok, q_ods, q)
        both = ok_ods & ok
        assert both.sum() >= 5
        assert q_ods[both].mean() < q[both].mean(), (q_ods[both].mean(), q[both].mean())


# ----------------------------------------------------------------- LF-DCT: the claims --------


def test_lowfreq_dct_success_grows_with_budget(fmnist_target, correct):
    """No packaged reference of LF-NES: the paper's qualitative claims on the project's CNN:
    success grows with the budget (L-inf 0.1; 150 vs 600 queries, 30 images), and the
    low-frequency subspace is not worse than plain NES (``freq_ratio = 1``) at equal budget
    (within two standard errors; the paper's gain is on 224 x 224 images, where the
    subspace is 16-1000 x smaller; at 28 x 28 the two are close)."""
    x, y = correct[0][:30], correct[1][:30]
    n, eps = len(x), 0.1
    rates = {}
    for budget, ratio in ((150, 0.5), (600, 0.5), (600, 1.0)):
        target = Counting(fmnist_target, n)
        res = lowfreq_dct_attack(margins_of(target.scores, y, Misclassification()), x, y,
                                 epsilon=eps, max_queries=budget, rng=np.random.default_rng(0),
                                 freq_ratio=ratio)
        ok = check_ours(res, target, fmnist_target, x, y, "linf", eps, budget)
        advs = np.stack([r.adversarial for r in res]).astype(np.int64)
        assert np.abs(advs - x).max() <= 25
        rates[(budget, ratio)] = ok.mean()
    print("LF-NES success:", rates)
    assert rates[(600, 0.5)] > rates[(150, 0.5)]
    assert rates[(600, 0.5)] >= rates[(600, 1.0)] - tolerance(rates[(600, 0.5)],
                                                             rates[(600, 1.0)], n)


# ------------------------------------------------------------------------ single pixel -------


@pytest.mark.slow
@pytest.mark.parametrize("tool", ["art", "torchattacks"])
def test_single_pixel_not_weaker_than_references(tool, fmnist_target, correct):
    """The one-pixel attack (L0 = 1) on 30 images against ART ``PixelAttack(th=1, es=1)``
    (differential evolution, its population of 400 // 3 x 3 = 399, as the paper's 400) at 450
    queries per image, and torchattacks ``OnePixel(pixels=1, popsize=30)`` (scipy's DE,
    population 30) at 300; ours with the same population as each (400 / 30). Both
    references run one image at a time; their DE is given generations to spare: the budget,
    counted by the oracle, stops them."""
    x, y = correct[0][:30], correct[1][:30]
    n = len(x)
    budget, pop = (450, 400) if tool == "art" else (300, 30)
    net = fmnist_target.model.eval()
    before = net_state(net)
    target = Counting(fmnist_target, n)
    results = single_pixel_attack(margins_of(target.scores, y, Misclassification()), x, y,
                                  epsilon=1, max_queries=budget, rng=np.random.default_rng(0),
                                  popsize=pop)
    ours = check_ours(results, target, fmnist_target, x, y, "l0", 1, budget)

    oracle = Oracle(net, x, y, "l0", 1, budget)
    xs = to_nchw(x)
    with art_seeded(0):
        if tool == "art":
            from art.attacks.evasion import PixelAttack
            from art.estimators.classification import BlackBoxClassifierNeuralNetwork

            clf = BlackBoxClassifierNeuralNetwork(oracle, input_shape=SHAPE_NCHW,
                                                  nb_classes=NUM_CLASSES, channels_first=True,
                                                  clip_values=(0.0, 1.0))
            for i in range(n):
                oracle.single = i
                try:
                    PixelAttack(clf, th=1, es=1, max_iter=10, targeted=False,
                                verbose=False).generate(xs[i:i + 1], y=y[i:i + 1])
                except Done:
                    pass
        else:
            import torchattacks

            atk = torchattacks.OnePixel(ToolNet(oracle), pixels=1, steps=20, popsize=30)
            for i in range(n):
                oracle.single = i
                try:
                    atk(torch.from_numpy(xs[i:i + 1]), torch.from_numpy(y[i:i + 1]))
                except Done:
                    pass
    assert oracle.counts.max() <= budget
    assert_unchanged(net, before)
    compare(f"single pixel vs {tool}", ours, oracle.success, target.counts, oracle.first)


# ------------------------------------------------------------ Local Search: the claims -------


def test_local_search_success_grows_with_budget_and_pixels(fmnist_target, correct):
    """No installable reference (LocSearchAdv was in Foolbox 2 and advertorch, neither
    installable beside Foolbox 3 / torch 2): the paper's qualitative claims on the project's
    CNN: success grows with the query budget (100 vs 500 queries at L0 <= 30) and with the
    pixels allowed (L0 <= 10 vs 30 at 500 queries), 30 images; every adversarial within its
    L0 bound and misclassified when asked again."""
    x, y = correct[0][:30], correct[1][:30]
    n = len(x)
    rates = {}
    for budget, l0 in ((100, 30), (500, 30), (500, 10)):
        target = Counting(fmnist_target, n)
        res = local_search_attack(margins_of(target.scores, y, Misclassification()), x, y,
                                  epsilon=l0, max_queries=budget, rng=np.random.default_rng(0))
        rates[(budget, l0)] = check_ours(res, target, fmnist_target, x, y, "l0", l0,
                                         budget).mean()
    print("Local Search success:", rates)
    assert rates[(500, 30)] > rates[(100, 30)]
    # more pixels: not significantly fewer successes (one-sided pooled two-proportion z test
    # at 5 %: with 30 images a rate moves by a few images with the machine's floating point,
    # e.g. 0.13 vs 0.17 on one machine, 0.17 vs 0.13 or 0.13 vs 0.20 on others)
    from scipy.stats import norm

    hi, lo = rates[(500, 30)] * n, rates[(500, 10)] * n
    pooled = (hi + lo) / (2 * n)
    z = (lo - hi) / n / max(math.sqrt(2 * pooled * (1 - pooled) / n), 1e-12)
    assert norm.sf(z) > 0.05, (rates, z)
    assert rates[(500, 30)] >= 0.1
