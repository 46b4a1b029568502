"""CANARY scoring (seed 003): IRT 3PL scores by MH-within-Gibbs (CAN-8), and the two-way
squeeze, transfer heat maps and fast mode of services/scoring/twoway.py (CAN-7, CAN-10)."""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET

import numpy as np
import pytest
import scipy.stats
from fortis.services.common.errors import Cancelled, DeadlineExceeded, InvalidArgument
from fortis.services.scoring.irt import (
    D_SCALE,
    IRTConfig,
    Metric,
    fit_3pl,
    minmax_normalise,
    rank_descending,
    simulate_3pl,
    three_pl,
    two_layer_irt,
)
from fortis.services.scoring.twoway import (
    DataMatrix,
    add_attack,
    add_model,
    competition_ranks,
    fast_rank_attack,
    fast_rank_model,
    transfer_heatmap,
    transfer_summary,
    two_way,
)

SHORT = IRTConfig(chain_length=1500, burn_in=500)


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rho from numpy ranks (average ranks for ties)."""
    def ranks(v: np.ndarray) -> np.ndarray:
        order = np.argsort(v, kind="stable")
        r = np.empty(len(v))
        r[order] = np.arange(len(v), dtype=np.float64)
        for val in np.unique(v):            # average ranks of ties
            tie = v == val
            r[tie] = r[tie].mean()
        return r
    rx, ry = ranks(np.asarray(x, float)), ranks(np.asarray(y, float))
    return float(np.corrcoef(rx, ry)[0, 1])


def simulated_items(seed: int, n: int = 30, m: int = 20):
    g = np.random.default_rng(seed)
    theta = g.standard_normal(n)                  # theta ~ N(0, 1), the prior
    a = np.exp(0.3 * g.standard_normal(m))        # log a ~ N(0, 0.3^2): informative items
    b = g.standard_normal(m)
    c = g.beta(5, 17, m)                          # c ~ Beta(5, 17), the prior
    return g, theta, a, b, c


# ------------------------------------------------------------------------ CAN-8: the model ---


def test_three_pl_matches_the_formula() -> None:
    theta = np.array([-1.0, 0.0, 2.0])
    a, b, c = np.array([1.5, 0.7]), np.array([0.0, 1.0]), np.array([0.2, 0.1])
    p = three_pl(theta, a, b, c)
    for i, t in enumerate(theta):
        for j in range(2):
            want = c[j] + (1 - c[j]) / (1 + math.exp(-D_SCALE * a[j] * (t - b[j])))
            assert p[i, j] == pytest.approx(want, abs=1e-12)
    assert D_SCALE == 1.702
    assert p[1, 0] == pytest.approx(0.2 + 0.8 / 2)     # theta = b: halfway above the guess


def test_numpy_spearman_agrees_with_scipy() -> None:
    g = np.random.default_rng(3)
    x, y = g.standard_normal(30), g.standard_normal(30)
    y[:5] = y[5]                                        # with ties
    assert spearman(x, y) == pytest.approx(scipy.stats.spearmanr(x, y).statistic, abs=1e-12)


# ------------------------------------------------------- CAN-8: recovery (Algorithm 1) -------


@pytest.mark.parametrize("seed", [0, 1])
def test_recovers_abilities_from_3pl_data_30x20(seed: int) -> None:
    """CAN-8: 30 subjects x 20 items simulated from the 3PL model with continuous responses
    (scores in [0, 1] whose mean is P: the paper's reading of a normalised metric); the
    posterior-mean abilities rank the subjects like the true ones (Spearman >= 0.9)."""
    g, theta, a, b, c = simulated_items(seed)
    x = simulate_3pl(theta, a, b, c, g, continuous=True)
    fit = fit_3pl(x, np.random.default_rng(100 + seed))
    rho = spearman(fit.theta, theta)
    assert rho >= 0.9, rho
    assert 0.2 < fit.acceptance_theta < 0.8 and 0.2 < fit.acceptance_items < 0.8
    assert fit.theta.shape == (30,) and fit.a.shape == fit.b.shape == fit.c.shape == (20,)
    assert np.all(fit.a > 0) and np.all((fit.c > 0) & (fit.c < 1))
    assert spearman(fit.b, b) > 0.7                      # difficulties recovered as well
    assert fit.score.min() == 0.0 and fit.score.max() == 1.0
    assert set(fit.rank.tolist()) == set(range(1, 31))
    assert fit.rank[np.argmax(fit.theta)] == 1


def test_binary_responses_are_as_good_as_the_oracle() -> None:
    """CAN-8 with 0/1 responses: 20 binary items cannot rank 30 subjects to 0.9 even with the
    true item parameters known (the oracle posterior mean reaches about 0.89 on average); the
    sampler's abilities agree with that oracle and are as close to the truth."""
    g, theta, a, b, c = simulated_items(0)
    x = simulate_3pl(theta, a, b, c, g)
    assert set(np.unique(x)) <= {0.0, 1.0}
    fit = fit_3pl(x, np.random.default_rng(7))
    grid = np.linspace(-4, 4, 801)
    p = np.clip(three_pl(grid, a, b, c), 1e-10, 1 - 1e-10)
    loglik = x @ np.log(p).T + (1 - x) @ np.log(1 - p).T - 0.5 * grid ** 2
    post = np.exp(loglik - loglik.max(axis=1, keepdims=True))
    oracle = (post * grid).sum(axis=1) / post.sum(axis=1)
    assert spearman(fit.theta, oracle) >= 0.9
    assert spearman(fit.theta, theta) >= spearman(oracle, theta) - 0.05


def test_same_seed_same_result_other_seed_differs() -> None:
    g, theta, a, b, c = simulated_items(5, n=12, m=8)
    x = simulate_3pl(theta, a, b, c, g, continuous=True)
    f1 = fit_3pl(x, np.random.default_rng(42), SHORT)
    f2 = fit_3pl(x, np.random.default_rng(42), SHORT)
    f3 = fit_3pl(x, np.random.default_rng(43), SHORT)
    for name in ("theta", "a", "b", "c", "theta_sd"):
        assert np.array_equal(getattr(f1, name), getattr(f2, name))
    assert f1.acceptance_theta == f2.acceptance_theta
    assert not np.array_equal(f1.theta, f3.theta)


def test_missing_responses_are_left_out() -> None:
    g, theta, a, b, c = simulated_items(2, n=30, m=20)
    x = simulate_3pl(theta, a, b, c, g, continuous=True)
    x[g.random(x.shape) < 0.15] = np.nan
    fit = fit_3pl(x, np.random.default_rng(1), IRTConfig(chain_length=3000, burn_in=1000))
    assert np.isfinite(fit.theta).all()
    assert spearman(fit.theta, theta) >= 0.85


def test_bad_input_names_the_field() -> None:
    with pytest.raises(InvalidArgument) as e:
        fit_3pl(np.array([[0.2, 1.5]]), np.random.default_rng(0))
    assert e.value.violations[0].field == "responses"
    with pytest.raises(InvalidArgument) as e:
        IRTConfig(chain_length=100, burn_in=100)
    assert e.value.violations[0].field == "irt.burn_in"
    with pytest.raises(TypeError):
        fit_3pl(np.zeros((2, 2)), 0)  # type: ignore[arg-type]


# --------------------------------------------------- CAN-8: normalisation and two layers ----


def test_sampler_stops_within_a_few_steps_of_should_stop() -> None:
    """The chain checks ``should_stop`` every few steps and stops, so that one tenant's long
    chain cannot stall every tenant."""
    g, theta, a, b, c = simulated_items(3)
    x = simulate_3pl(theta, a, b, c, g, continuous=True)
    calls = 0

    def stop_after_5() -> bool:
        nonlocal calls
        calls += 1
        return calls > 5

    with pytest.raises(Cancelled):
        fit_3pl(x, np.random.default_rng(0), IRTConfig(chain_length=100_000, burn_in=0),
                should_stop=stop_after_5)
    assert calls == 6           # checked every <= 32 steps: stopped within ~200 of 100000

    steps = 0

    def deadline() -> bool:     # a check may raise the error that fits its cause itself
        nonlocal steps
        steps += 1
        if steps > 2:
            raise DeadlineExceeded("deadline passed")
        return False

    metrics = [Metric(name=f"m{j}", category=f"c{j % 2}", values=list(x[:, j]),
                      higher_is_better=True) for j in range(x.shape[1])]
    with pytest.raises(DeadlineExceeded):
        two_layer_irt([f"s{i}" for i in range(x.shape[0])], metrics, np.random.default_rng(0),
                      IRTConfig(chain_length=100_000, burn_in=0), should_stop=deadline)


def test_should_stop_never_true_changes_nothing() -> None:
    g, theta, a, b, c = simulated_items(4)
    x = simulate_3pl(theta, a, b, c, g, continuous=True)
    cfg = IRTConfig(chain_length=200, burn_in=50)
    plain = fit_3pl(x, np.random.default_rng(1), cfg)
    checked = fit_3pl(x, np.random.default_rng(1), cfg, should_stop=lambda: False)
    assert np.array_equal(plain.theta, checked.theta)


def test_minmax_normalise_orients_and_drops_constant_metrics() -> None:
    raw = np.array([[0.1, 10.0, 3.0, np.nan],
                    [0.5, 30.0, 3.0, 2.0],
                    [0.9, 20.0, 3.0, 4.0]])
    norm, informative = minmax_normalise(raw, [True, False, True, True])
    assert informative.tolist() == [True, True, False, True]
    assert norm[:, 0] == pytest.approx([0.0, 0.5, 1.0])
    assert norm[:, 1] == pytest.approx([1.0, 0.0, 0.5])        # lower is better: flipped
    assert np.isnan(norm[:, 2]).all()
    assert np.isnan(norm[0, 3]) and norm[1:, 3] == pytest.approx([0.0, 1.0])


def test_rank_descending_ties_share_the_best_rank() -> None:
    assert rank_descending(np.array([0.3, 0.9, 0.3, np.nan, 0.1])).tolist() == [2, 1, 2, 0, 4]


def test_two_layer_irt_ranks_subjects_and_reports_both_layers() -> None:
    """CAN-8 two layers: three categories of metrics (some lower-is-better, on raw scales),
    one fit per category, then one over the categories."""
    g, theta, _, _, _ = simulated_items(11, n=20, m=1)
    metrics: list[Metric] = []
    for cat, m in (("capability", 3), ("attack_effect", 6), ("perturbation_cost", 4)):
        a = np.exp(0.3 * g.standard_normal(m))
        b = g.standard_normal(m)
        c = g.beta(5, 17, m)
        x = simulate_3pl(theta, a, b, c, g, continuous=True)
        for j in range(m):
            lower_better = j % 2 == 1
            raw = (1.0 - x[:, j] if lower_better else x[:, j]) * 37.0 + 5.0   # raw scale
            metrics.append(Metric(name=f"{cat}_{j}", category=cat, values=raw.tolist(),
                                  higher_is_better=not lower_better))
    metrics.append(Metric(name="constant", category="capability", values=[1.0] * 20,
                          higher_is_better=True))
    subjects = [f"model{i}" for i in range(20)]
    res = two_layer_irt(subjects, metrics, np.random.default_rng(0),
                        IRTConfig(chain_length=2000, burn_in=700))
    assert list(res.layer1) == ["capability", "attack_effect", "perturbation_cost"]
    assert res.layer2_items == ("capability", "attack_effect", "perturbation_cost")
    assert res.overall is not None and res.overall.a.shape == (3,)
    assert "capability/constant" in res.dropped
    assert res.layer1_items["capability"] == ("capability_0", "capability_1", "capability_2")
    assert spearman(res.theta, theta) >= 0.9
    for fit in res.layer1.values():
        assert spearman(fit.theta, theta) >= 0.7
    assert res.score.min() == 0.0 and res.score.max() == 1.0
    assert res.rank[np.argmax(res.theta)] == 1
    tree = json.loads(json.dumps(res.to_dict()))
    assert set(tree["subjects"]) == set(subjects)
    assert set(tree["layer1"]) == set(res.layer1) and tree["layer2"] is not None
    # same seed -> same scores (a short chain is enough to check that)
    tiny = IRTConfig(chain_length=200, burn_in=50)
    r1 = two_layer_irt(subjects, metrics, np.random.default_rng(9), tiny)
    r2 = two_layer_irt(subjects, metrics, np.random.default_rng(9), tiny)
    assert np.array_equal(r1.theta, r2.theta) and np.array_equal(r1.rank, r2.rank)


def test_two_layer_irt_validates_input() -> None:
    with pytest.raises(InvalidArgument) as e:
        two_layer_irt(["a", "b"], [Metric(name="m", category="c", values=[1.0],
                                          higher_is_better=True)], np.random.default_rng(0))
    assert e.value.violations[0].field == "metrics[0].values"
    with pytest.raises(InvalidArgument):
        two_layer_irt(["a"], [], np.random.default_rng(0))


# ============================================================================================
# Two-way evaluation, transfer heat maps, fast mode (CAN-7, CAN-10)
# ============================================================================================

MODELS = ("resnet", "vgg", "vit")
ATTACKS = ("fgsm", "pgd")
# values[k, i, j]: MR of attack k, crafted on model i, evaluated on model j
VALUES = np.array([
    [[0.60, 0.30, 0.10],
     [0.20, 0.80, 0.15],
     [0.05, 0.10, 0.40]],
    [[0.90, 0.40, 0.20],
     [0.35, 1.00, 0.25],
     [0.10, 0.20, 0.70]],
])


def baseline() -> DataMatrix:
    return DataMatrix(attacks=ATTACKS, models=MODELS, values=VALUES)


def test_two_way_squeeze_ranks_models_and_attacks() -> None:
    """CAN-7: mean over attacks of the white-box blocks ranks the models (lower MR = more
    robust); mean over models ranks the attacks (higher MR = more effective)."""
    res = two_way(baseline())
    mr = res.model_robustness
    assert mr.value == pytest.approx([0.75, 0.90, 0.55])
    assert mr.rank.tolist() == [2, 3, 1]
    assert mr.order() == ["vit", "resnet", "vgg"]
    assert mr.score == pytest.approx([(0.90 - 0.75) / 0.35, 0.0, 1.0])
    ae = res.attack_effectiveness
    assert ae.value == pytest.approx([0.60, 2.60 / 3])
    assert ae.rank.tolist() == [2, 1]
    assert json.loads(json.dumps(res.to_dict()))["model_robustness"]["entries"]["vit"]["rank"] == 1


def test_two_way_excludes_incomplete_items_by_default() -> None:
    """Seed 003 Fig. 4b: an attack not run on every model is left out of the model ranking
    (complete_only); with complete_only=False every entry averages what it has."""
    vals = VALUES.copy()
    vals[1, 2, 2] = np.nan                      # pgd not run (white-box) on vit
    d = DataMatrix(attacks=ATTACKS, models=MODELS, values=vals)
    res = two_way(d)
    assert res.model_robustness.over == ("fgsm",)
    assert res.model_robustness.value == pytest.approx([0.60, 0.80, 0.40])
    assert res.attack_effectiveness.over == ("resnet", "vgg")
    assert res.attack_effectiveness.value == pytest.approx([0.70, 0.95])
    loose = two_way(d, complete_only=False)
    assert loose.model_robustness.value == pytest.approx([0.75, 0.90, 0.40])
    assert loose.model_robustness.n.tolist() == [2, 2, 1]


def test_competition_ranks_and_unranked_entries() -> None:
    assert competition_ranks(np.array([0.2, 0.2, 0.5, np.nan]),
                             higher_is_better=False).tolist() == [1, 1, 3, 0]


def test_transfer_summary_squeezes_off_diagonal_blocks() -> None:
    s = transfer_summary(baseline())
    assert s.by_source[0] == pytest.approx([0.20, 0.175, 0.075])   # crafted on i, j != i
    assert s.by_target[0] == pytest.approx([0.125, 0.20, 0.125])   # evaluated on j, i != j
    fgsm_off = (0.30 + 0.10 + 0.20 + 0.15 + 0.05 + 0.10) / 6
    assert s.attack_transferability.value[0] == pytest.approx(fgsm_off)
    assert s.attack_transferability.rank.tolist() == [2, 1]
    assert s.model_transfer_robustness.value == pytest.approx(s.by_target.mean(axis=0))
    json.dumps(s.to_dict())


def test_transfer_heatmap_data_and_svg() -> None:
    vals = VALUES.copy()
    vals[0, 2, 0] = np.nan
    d = DataMatrix(attacks=ATTACKS, models=("res<net>", "vgg & co", "vit"), values=vals)
    hm = transfer_heatmap(d, "fgsm")
    assert np.array_equal(hm.values, vals[0], equal_nan=True)
    assert hm.rows == hm.cols == d.models
    assert hm.svg is not None
    root = ET.fromstring(hm.svg)                       # well-formed, labels escaped
    ns = "{http://www.w3.org/2000/svg}"
    cells = [g for g in root.iter(f"{ns}g")]
    assert len(cells) == 9
    texts = [t.text for t in root.iter(f"{ns}text")]
    assert "res<net>" in texts and "vgg & co" in texts and "n/a" in texts and "0.60" in texts
    assert "http" not in hm.svg.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert transfer_heatmap(d, "pgd", render_svg=False).svg is None
    with pytest.raises(InvalidArgument):
        transfer_heatmap(d, "cw")


def test_fast_mode_ranks_a_new_model_against_a_stored_baseline() -> None:
    """CAN-10: the stored baseline (JSON round trip) is extended by the new model's blocks only;
    the ranks are those of a full recomputation, and the baseline's data are untouched."""
    stored = json.loads(json.dumps(baseline().to_dict()))
    base = DataMatrix.from_dict(stored)
    assert np.array_equal(base.values, VALUES)
    fr = fast_rank_model(base, "convnext", white_box=[0.30, 0.50])
    assert fr.rank == 1 and fr.of == 4 and fr.value == pytest.approx(0.40)
    assert fr.result.model_robustness.order() == ["convnext", "vit", "resnet", "vgg"]
    assert np.array_equal(fr.data.values[:, :3, :3], VALUES)
    assert np.isnan(fr.data.values[:, 3, :3]).all()           # transfer blocks not run
    full = DataMatrix(attacks=ATTACKS, models=(*MODELS, "convnext"), values=fr.data.values)
    assert np.array_equal(two_way(full).model_robustness.rank, fr.result.model_robustness.rank)
    # a model evaluated under one attack only: ranked over that attack (incomplete excluded)
    part = fast_rank_model(base, "new", white_box=[0.58, np.nan])
    assert part.result.model_robustness.over == ("fgsm",)
    assert part.rank == 2                                       # vit (0.40) stays first
    # transfer blocks can come with it
    with_t = add_model(base, "new", white_box=[0.5, 0.6], crafted_on_new=np.full((2, 3), 0.1),
                       evaluated_on_new=np.full((2, 3), 0.2))
    assert with_t.values[0, 3, 0] == 0.1 and with_t.values[0, 0, 3] == 0.2
    with pytest.raises(InvalidArgument):
        add_model(base, "vgg", white_box=[0.1, 0.2])
    with pytest.raises(InvalidArgument):
        add_model(base, "x", white_box=[0.1])


def test_fast_mode_ranks_a_new_attack() -> None:
    fr = fast_rank_attack(baseline(), "cw", values=[0.95, 0.99, 0.90])
    assert fr.rank == 1 and fr.of == 3
    assert fr.result.attack_effectiveness.order() == ["cw", "pgd", "fgsm"]
    block = add_attack(baseline(), "cw", values=np.full((3, 3), 0.5))
    assert block.values.shape == (3, 3, 3)
    assert fr.to_dict()["two_way"]["attack_effectiveness"]["entries"]["cw"]["rank"] == 1


def test_data_matrix_validates_shape() -> None:
    with pytest.raises(InvalidArgument) as e:
        DataMatrix(attacks=ATTACKS, models=MODELS, values=np.zeros((2, 3, 2)))
    assert e.value.violations[0].field == "values"
    d = baseline()
    assert not d.values.flags.writeable
