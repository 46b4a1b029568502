"""Targeted Square (Andriushchenko et al. 2020 define a targeted variant): the same
attack given ``TargetedMisclassification``, minimising the margin "best other class minus the
target class" (the paper's targeted runs use cross-entropy on the target: a deviation, so that
the attack stays on ``ctx.margin_query()`` for every task and signal). No reference tool runs
targeted Square at equal budgets here, so the paper's qualitative claim is shown on the
project's tiny CNN: the targeted variant reaches the target class, more often with a larger
budget, within the bound and the budget, success judged on the uint8 image."""

from __future__ import annotations

import numpy as np
import pytest
from fortis.services.perturbation.attacks import square_attack
from fortis.services.perturbation.attacks.registry import ATTACKS
from fortis.services.perturbation.criteria import TargetedMisclassification

from tests.unit.test_attacks import (
    GRAY,
    NUM_CLASSES,
    Target,
    assert_linf_bound,
    assert_query_accounting,
    correct_images,
    predict,
    train,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def test_square_targeted_reaches_the_target_class():
    assert ATTACKS["square"].targeted and ATTACKS["square"].untargeted
    net = train(GRAY)
    x, y = correct_images(net, GRAY, 8, seed=11)
    goal = (y + 1) % NUM_CLASSES
    rates = []
    for budget in (20, 300):
        reached = 0
        for t in range(NUM_CLASSES):
            sel = np.flatnonzero(goal == t)
            if not len(sel):
                continue
            target = Target(net, len(sel))
            res = square_attack(target.scores, x[sel], y[sel], epsilon=0.15,
                                max_queries=budget, rng=np.random.default_rng(1),
                                criterion=TargetedMisclassification(t))
            assert_query_accounting(res, target, budget)
            assert_linf_bound(res, x[sel], 0.15)
            for r in res:
                got = int(predict(net, r.adversarial[None])[0])
                assert bool(r.success) == (got == t)       # judged on the uint8 image
                reached += bool(r.success)
        rates.append(reached / len(x))
    assert rates[1] > rates[0] and rates[1] >= 0.4, rates        # measured 0.125 -> 0.5
