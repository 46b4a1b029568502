"""The optimisation-based transfer attacks C&W L2, EAD, DDN and FAB (IEEE-A7, crafted
white-box on the Fashion-MNIST surrogate; IEEE-A9 bounds on the uint8 output): registry
entries, uint8 outputs, bounds, determinism, targeted variants, parameter rejection, FAB's
box-constrained projection against a solver, and the boosters composing. Side-by-side runs
with the reference libraries: ``tests/reference/test_transfer_optim_vs_refs.py``."""

from __future__ import annotations

from types import MappingProxyType

import numpy as np
import pytest
import torch
from fortis.services.common.errors import InvalidArgument
from fortis.services.perturbation.attacks.base import AttackContext
from fortis.services.perturbation.attacks.fab import box_projection
from fortis.services.perturbation.attacks.registry import ATTACKS
from fortis.services.perturbation.engine import AttackItem, run_attack

pytestmark = pytest.mark.usefixtures("one_thread")

IDS = ("cw_l2", "ead", "ddn", "fab")
#: Small but effective settings (unit tests run on 2 shared cores).
FAST = {"cw_l2": {"steps": 30, "binary_search_steps": 3, "initial_const": 1.0,
                  "learning_rate": 0.1},
        "ead": {"steps": 30, "binary_search_steps": 3, "initial_const": 1.0},
        "ddn": {"steps": 30},
        "fab": {"steps": 10}}



@pytest.fixture(scope="module")
def batch(fmnist_surrogate, fmnist_test_images):
    """Eight test images the surrogate classifies correctly."""
    x, y = fmnist_test_images
    with torch.inference_mode():
        t = torch.from_numpy(x[:64]).permute(0, 3, 1, 2).float() / 255.0
        pred = fmnist_surrogate.model.eval()(t).argmax(dim=1).numpy()
    ok = np.flatnonzero(pred == y[:64])[:8]
    return x[ok], y[ok]


def items_of(x: np.ndarray, y: np.ndarray) -> list[AttackItem]:
    return [AttackItem(image_id=f"img{i}", image=x[i], labels=(int(y[i]),))
            for i in range(len(x))]


def predict(surrogate, advs: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        t = torch.from_numpy(advs).permute(0, 3, 1, 2).float() / 255.0
        return surrogate.model(t).argmax(dim=1).numpy()


# ------------------------------------------------------------------------------ registry ----


def test_registered_after_mi_fgsm_with_their_schemas() -> None:
    """IEEE-A7: four transfer entries, crafted on a surrogate, with the boosters' parameters
    and bounded parameters; listed together, after MI-FGSM."""
    ids = list(ATTACKS)
    at = ids.index("cw_l2")
    assert ids[at:at + 4] == ["cw_l2", "ead", "ddn", "fab"]
    assert at > ids.index("mi_fgsm")  # with the other transfer attacks
    for aid in IDS:
        spec = ATTACKS[aid]
        assert spec.kind == "transfer" and spec.needs_surrogate and spec.targeted
        assert spec.refs == ("IEEE-A7", "IEEE-A9")
        names = {p.name for p in spec.params}
        assert {"di_prob", "ti_kernel", "si_copies", "ensemble_mode"} <= names
        for p in spec.params:
            assert p.description
            if p.type in ("int", "float"):
                assert p.minimum is not None and p.maximum is not None, (aid, p.name)
    assert ATTACKS["fab"].norms == ("linf", "l2")
    assert ATTACKS["cw_l2"].family == "optimisation"
    assert ATTACKS["ddn"].family == "minimal-norm"


# ------------------------------------------------------------------------- outputs -----------


@pytest.mark.parametrize("aid", IDS)
def test_outputs_are_uint8_minimal_and_adversarial(aid, fmnist_surrogate, batch):
    """Every output is a uint8 image of the input's shape; it is either adversarial on the
    surrogate after rounding or the clean image (minimal-norm: nothing else is returned);
    the distances are those of the uint8 images; success is the target's to judge."""
    x, y = batch
    res = run_attack(aid, FAST[aid], 0, items_of(x, y), surrogate=fmnist_surrogate)
    advs = np.stack([r.adversarial for r in res])
    assert advs.dtype == np.uint8 and advs.shape == x.shape
    p = predict(fmnist_surrogate, advs)
    for r, xi, yi, pi in zip(res, x, y, p, strict=True):
        assert r.success is None and r.queries == 0 and r.stop_reason == "iterations"
        assert r.initially_correct is True
        assert pi != yi or np.array_equal(r.adversarial, xi)
        d = (r.adversarial.astype(np.float64) - xi) / 255.0
        assert r.l2 == pytest.approx(float(np.sqrt((d * d).sum())), abs=1e-6)
        assert r.linf == pytest.approx(float(np.abs(d).max()), abs=1e-6)
        np.testing.assert_allclose(r.adversarial_float * 255.0, r.adversarial, atol=1e-3)
    assert (p != y).mean() >= 0.75, (aid, p, y)


def test_an_image_already_misclassified_is_returned_clean(fmnist_surrogate, batch):
    """Minimal norm: an image the surrogate already gets wrong needs no perturbation."""
    x, y = batch
    wrong = (y[:2] + 1) % 10
    for aid in ("ddn", "fab"):
        res = run_attack(aid, FAST[aid], 0, items_of(x[:2], wrong), surrogate=fmnist_surrogate)
        for r, xi in zip(res, x[:2], strict=True):
            assert r.initially_correct is False
            assert np.array_equal(r.adversarial, xi) and r.l2 == 0.0


@pytest.mark.parametrize(("aid", "params", "norm", "bound"), [
    ("ddn", {"steps": 30, "max_norm": 0.6}, "l2", 0.6),
    ("fab", {"steps": 10, "epsilon": 0.6, "norm": "l2"}, "l2", 0.6),
    ("fab", {"steps": 10, "epsilon": 0.04, "norm": "linf"}, "linf", 0.04),
])
def test_bounds_hold_on_the_uint8_images(aid, params, norm, bound, fmnist_surrogate, batch):
    """IEEE-A9: with a bound, no returned image is further than it (measured on uint8)."""
    x, y = batch
    res = run_attack(aid, params, 0, items_of(x, y), surrogate=fmnist_surrogate)
    dists = np.array([r.l2 if norm == "l2" else r.linf for r in res])
    assert (dists <= bound + 1e-9).all(), dists
    assert (dists > 0).any()  # some image is attacked within the bound


@pytest.mark.parametrize("aid", IDS)
def test_deterministic_under_the_same_seed(aid, fmnist_surrogate, batch):
    """The same seed gives the same images (with the DI booster and FAB's random restarts,
    which draw from the call's seeded generator)."""
    x, y = batch
    params = dict(FAST[aid], di_prob=0.5)
    if aid == "fab":
        params["restarts"] = 2
    runs = [np.stack([r.adversarial for r in run_attack(
        aid, params, 7, items_of(x[:4], y[:4]), surrogate=fmnist_surrogate)])
        for _ in range(2)]
    np.testing.assert_array_equal(runs[0], runs[1])


@pytest.mark.parametrize("aid", IDS)
def test_targeted_variants_reach_the_target(aid, fmnist_surrogate, batch):
    """``TargetedMisclassification``: most images end in the target class on the surrogate,
    and the others are returned clean."""
    x, y = batch
    target = 2
    keep = y != target
    x, y = x[keep], y[keep]
    params = dict(FAST[aid])
    if aid in ("cw_l2", "ead"):
        params.update(steps=100, initial_const=10.0)
    res = run_attack(aid, params, 0, items_of(x, y), surrogate=fmnist_surrogate,
                     criterion={"target_label": target})
    advs = np.stack([r.adversarial for r in res])
    p = predict(fmnist_surrogate, advs)
    hit = p == target
    assert hit.mean() >= 0.6, (aid, p)
    assert all(np.array_equal(advs[i], x[i]) for i in np.flatnonzero(~hit))


def test_confidence_gives_a_margin(fmnist_surrogate, batch):
    """C&W's kappa: every returned adversarial has a logit margin of at least kappa on the
    surrogate (judged on the uint8 image)."""
    x, y = batch
    kappa = 2.0
    res = run_attack("cw_l2", dict(FAST["cw_l2"], confidence=kappa), 0, items_of(x, y),
                     surrogate=fmnist_surrogate)
    advs = np.stack([r.adversarial for r in res])
    with torch.inference_mode():
        z = fmnist_surrogate.model(torch.from_numpy(advs).permute(0, 3, 1, 2).float() / 255)
    changed = np.array([not np.array_equal(a, xi) for a, xi in zip(advs, x, strict=True)])
    assert changed.sum() >= 4
    for i in np.flatnonzero(changed):
        other = torch.cat([z[i, :y[i]], z[i, y[i] + 1:]]).max()
        assert float(other - z[i, y[i]]) >= kappa - 1e-4


def test_boosters_and_ensembles_compose(fmnist_surrogate, batch):
    """DI / TI / SI and a model ensemble switch on through the parameters (``whitebox.py``)
    and the attacks still return valid minimal adversarials."""
    x, y = batch
    for aid in IDS:
        params = dict(FAST[aid], di_prob=0.5, ti_kernel=3, si_copies=2, ensemble_mode="loss")
        res = run_attack(aid, params, 0, items_of(x[:4], y[:4]), surrogate=fmnist_surrogate,
                         ensemble=[fmnist_surrogate])
        advs = np.stack([r.adversarial for r in res])
        assert advs.dtype == np.uint8
        p = predict(fmnist_surrogate, advs)
        assert all(p[i] != y[i] or np.array_equal(advs[i], x[i]) for i in range(4))


# ---------------------------------------------------------------------- bad parameters ------


@pytest.mark.parametrize(("aid", "name", "value"), [
    ("cw_l2", "steps", -1), ("cw_l2", "initial_const", float("nan")),
    ("cw_l2", "confidence", -0.5), ("cw_l2", "learning_rate", float("inf")),
    ("ead", "beta", -0.1), ("ead", "decision_rule", "L2"), ("ead", "binary_search_steps", 0),
    ("ddn", "gamma", float("nan")), ("ddn", "max_norm", -1.0), ("ddn", "steps", 2.5),
    ("fab", "norm", "l1"), ("fab", "eta", 0.5), ("fab", "epsilon", float("nan")),
    ("fab", "alpha_max", -0.1),
])
def test_bad_params_are_rejected_naming_the_field(aid, name, value, fmnist_surrogate, batch):
    """Through the engine (the schema validator) and when ``run`` is called directly with
    unvalidated parameters (the module's own checks): InvalidArgument on ``params.<name>``."""
    x, y = batch
    with pytest.raises(InvalidArgument) as err:
        run_attack(aid, {name: value}, 0, items_of(x[:1], y[:1]), surrogate=fmnist_surrogate)
    assert err.value.violations[0].field == f"params.{name}"
    spec = ATTACKS[aid]
    params = {p.name: p.default for p in spec.params}
    params[name] = value
    ctx = AttackContext(spec=spec, images=x[:1], labels=y[:1], image_ids=("a",),
                        label_sets=((int(y[0]),),), params=MappingProxyType(params),
                        surrogate=fmnist_surrogate)
    with pytest.raises(InvalidArgument) as err:
        spec.run(ctx)
    assert err.value.violations[0].field == f"params.{name}"


def test_fab_linf_epsilon_above_one_is_rejected(fmnist_surrogate, batch):
    x, y = batch
    with pytest.raises(InvalidArgument) as err:
        run_attack("fab", {"epsilon": 2.0, "norm": "linf"}, 0, items_of(x[:1], y[:1]),
                   surrogate=fmnist_surrogate)
    assert err.value.violations[0].field == "params.epsilon"


# ------------------------------------------------------------------ FAB's projection -------


@pytest.mark.parametrize("norm", ["l2", "linf"])
def test_fab_box_projection_is_the_constrained_minimum(norm):
    """``box_projection`` solves min ||d|| s.t. g.d = r, 0 <= p + d <= 1 exactly: checked
    against scipy (SLSQP for L2, a linear program for L-inf) on random small instances,
    including zero gradients, pixels at the box's faces and an unreachable hyperplane."""
    from scipy.optimize import linprog, minimize

    gen = torch.Generator().manual_seed(0)
    b, dim = 8, 10
    g = torch.randn(b, dim, generator=gen, dtype=torch.float64)
    g[0, :4] = 0.0
    p = torch.rand(b, dim, generator=gen, dtype=torch.float64)
    p[1, :3], p[1, 3:6] = 0.0, 1.0
    r = torch.randn(b, generator=gen, dtype=torch.float64) * 0.5
    r[2] = 0.0
    r[3] = 100.0  # out of reach inside the box
    d = box_projection(g, r, p, norm).numpy()
    gn, pn, rn = g.numpy(), p.numpy(), r.numpy()
    assert ((pn + d) >= -1e-12).all() and ((pn + d) <= 1 + 1e-12).all()
    for i in range(b):
        bounds = list(zip(-pn[i], 1 - pn[i], strict=True))
        if i == 3:   # unreachable: as far along g as the box allows
            best = np.where(gn[i] > 0, 1 - pn[i], np.where(gn[i] < 0, -pn[i], 0.0))
            assert gn[i] @ d[i] == pytest.approx(gn[i] @ best, rel=1e-9)
            continue
        assert gn[i] @ d[i] == pytest.approx(rn[i], abs=1e-9)
        if norm == "l2":
            sol = minimize(lambda v: v @ v, np.zeros(dim), jac=lambda v: 2 * v,
                           bounds=bounds, method="SLSQP",
                           constraints=[{"type": "eq", "fun": lambda v, i=i: gn[i] @ v - rn[i],
                                         "jac": lambda v, i=i: gn[i]}],
                           options={"ftol": 1e-14, "maxiter": 500})
            assert np.linalg.norm(d[i]) == pytest.approx(np.linalg.norm(sol.x), abs=1e-6)
        else:
            # variables (v, t): minimise t with -t <= v <= t, g.v = r, box
            c = np.r_[np.zeros(dim), 1.0]
            a_ub = np.block([[np.eye(dim), -np.ones((dim, 1))],
                             [-np.eye(dim), -np.ones((dim, 1))]])
            lp = linprog(c, A_ub=a_ub, b_ub=np.zeros(2 * dim),
                         A_eq=np.r_[gn[i], 0.0][None, :], b_eq=[rn[i]],
                         bounds=[*bounds, (0, None)], method="highs")
            assert np.abs(d[i]).max() == pytest.approx(lp.fun, abs=1e-9)
