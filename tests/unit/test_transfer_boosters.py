"""The boosters and ensembles of the gradient transfer attacks (IEEE-A7, IEEE-A9):
bounds on the uint8 outputs, determinism from the plan's seed, the ensemble objective, the
targeted form, refusals naming the field, and the transfer stage's crafted-once store (CAN-9).

Real models: the project's Fashion-MNIST surrogate, MLP and target CNN. Exactness against
torchattacks / ART is in tests/reference/test_transfer_vs_refs.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from fortis.services.common.errors import InvalidArgument
from fortis.services.perturbation.attacks.registry import ATTACKS, attack_boosters, list_boosters
from fortis.services.perturbation.attacks.whitebox import Boosters, WhiteBox, to_tensor
from fortis.services.perturbation.engine import AttackItem, run_attack

EPS = 0.1
N = 32


@pytest.fixture(scope="module")
def mlp():
    from fortis.adapters.builtin import load_model
    return load_model("fmnist-mlp")


@pytest.fixture(scope="module")
def batch(fmnist_test_images):
    x, y = fmnist_test_images
    return x[:N], y[:N]


def _items(x, y):
    return [AttackItem(image_id=f"i{k}", image=x[k], labels=(int(y[k]),)) for k in range(len(x))]


def _adv(attack, params, x, y, surrogate, seed=0, **kw):
    res = run_attack(attack, {"epsilon": EPS, **params}, seed, _items(x, y), surrogate=surrogate,
                     **kw)
    return np.stack([r.adversarial for r in res]), res


ALL = {"steps": 5, "di_prob": 0.5, "ti_kernel": 5, "si_copies": 3, "nesterov": True,
       "vmi_samples": 4}


@pytest.mark.parametrize("params", [{}, {"di_prob": 1.0}, {"ti_kernel": 7}, {"si_copies": 4},
                                    {"nesterov": True}, {"vmi_samples": 4}, ALL],
                         ids=["none", "DI", "TI", "SI", "NI", "VMI", "all"])
def test_every_booster_keeps_the_bound_and_fools_the_surrogate(params, batch, fmnist_surrogate):
    """IEEE-A9: every output within epsilon (uint8 levels); the boosted attack still fools
    the surrogate it was crafted on for most images (IEEE-A7)."""
    x, y = batch
    adv, res = _adv("mi_fgsm", {"steps": 5, **params}, x, y, fmnist_surrogate)
    assert adv.dtype == np.uint8 and adv.shape == x.shape
    assert np.abs(adv.astype(int) - x.astype(int)).max() <= int(EPS * 255)
    assert all(r.success is None and r.queries == 0 for r in res)
    fooled = float(np.mean(fmnist_surrogate.predict(adv) != y))
    print(params, "white-box success", fooled)
    assert fooled >= 0.6


def test_random_boosters_follow_the_seed(batch, fmnist_surrogate):
    """Determinism: DI and VMI draw from the call's seeded generator: same seed, same images;
    another seed, other images."""
    x, y = batch
    p = {"steps": 4, "di_prob": 0.7, "vmi_samples": 3}
    a, _ = _adv("mi_fgsm", p, x, y, fmnist_surrogate, seed=5)
    b, _ = _adv("mi_fgsm", p, x, y, fmnist_surrogate, seed=5)
    c, _ = _adv("mi_fgsm", p, x, y, fmnist_surrogate, seed=6)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


def test_ensemble_averages_logits_or_losses(batch, fmnist_surrogate, mlp):
    """Ensembles (Liu et al. 2017; Dong et al. 2018): the objective's logits are the mean of
    the surrogates' logits; in loss mode the loss is the mean of their losses."""
    x, y = batch
    xt = to_tensor(x)
    wb = WhiteBox([fmnist_surrogate, mlp], labels=y)
    with wb, torch.no_grad():
        a, b = fmnist_surrogate.model(xt), mlp.model(xt)
        assert torch.allclose(wb.plain_logits(xt), (a + b) / 2, atol=1e-6)
        assert torch.allclose(wb.loss(xt), F.cross_entropy((a + b) / 2, torch.from_numpy(y),
                                                           reduction="none"), atol=1e-5)
    wl = WhiteBox([fmnist_surrogate, mlp], labels=y, boosters=Boosters({"ensemble_mode": "loss"}))
    with wl, torch.no_grad():
        yt = torch.from_numpy(y)
        want = (F.cross_entropy(a, yt, reduction="none") + F.cross_entropy(b, yt, reduction="none")) / 2
        assert torch.allclose(wl.loss(xt), want, atol=1e-5)
    # the ensemble attack fools both members more than the single-surrogate attack fools the MLP
    single, _ = _adv("mi_fgsm", {"steps": 5}, x, y, fmnist_surrogate)
    both, _ = _adv("mi_fgsm", {"steps": 5}, x, y, fmnist_surrogate, ensemble=[mlp])
    assert np.mean(mlp.predict(both) != y) > np.mean(mlp.predict(single) != y)
    assert np.mean(fmnist_surrogate.predict(both) != y) >= 0.6


def test_targeted_reaches_the_target_class_on_the_surrogate(batch, fmnist_surrogate):
    """Targeted variants (IEEE-A7): the surrogate puts most images in the target class."""
    x, y = batch
    keep = y != 0
    for attack in ("fgsm", "bim", "pgd", "mi_fgsm"):
        adv, _ = _adv(attack, {"steps": 10} if attack in ("pgd", "mi_fgsm") else {}, x[keep], y[keep],
                      fmnist_surrogate, criterion={"kind": "targeted_misclassification",
                                                   "target_label": 0})
        hit = float(np.mean(fmnist_surrogate.predict(adv) == 0))
        print(attack, "targeted hit rate", hit)
        # one FGSM step is weak but aimed (chance: 0); momentum overshoots a target class
        assert hit >= {"fgsm": 0.1, "mi_fgsm": 0.4}.get(attack, 0.7)


def test_pgd_l2_keeps_its_radius(batch, fmnist_surrogate):
    x, y = batch
    adv, res = _adv("pgd", {"norm": "l2", "epsilon": 1.5, "steps": 10}, x, y, fmnist_surrogate)
    assert max(r.l2 for r in res) <= 1.5 + 1e-9
    assert float(np.mean(fmnist_surrogate.predict(adv) != y)) >= 0.6


@pytest.mark.parametrize("params,field", [
    ({"ti_kernel": 4}, "params.ti_kernel"),
    ({"si_copies": 0}, "params.si_copies"),
    ({"di_prob": float("nan")}, "params.di_prob"),
    ({"vmi_samples": -1}, "params.vmi_samples"),
    ({"ensemble_mode": "max"}, "params.ensemble_mode"),
    ({"norm": "l2", "epsilon": 2.0, "steps": 2}, None),
])
def test_bad_booster_params_name_the_field(params, field, batch, fmnist_surrogate):
    x, y = batch
    attack = "pgd" if "norm" in params else "mi_fgsm"
    if field is None:     # a valid L2 radius > 1 is accepted; the same number in L-inf is not
        _adv(attack, params, x[:2], y[:2], fmnist_surrogate)
        with pytest.raises(InvalidArgument) as e:
            _adv(attack, {**params, "norm": "linf"}, x[:2], y[:2], fmnist_surrogate)
        assert "params.epsilon" in str(e.value)
        return
    with pytest.raises(InvalidArgument) as e:
        _adv(attack, params, x[:2], y[:2], fmnist_surrogate)
    assert field in str(e.value)


def test_ensemble_only_for_transfer_attacks(batch, fmnist_surrogate, mlp):
    x, y = batch

    class NoQuery:
        num_classes = 10

    with pytest.raises(InvalidArgument) as e:
        run_attack("square", {"epsilon": EPS, "max_queries": 5}, 0, _items(x[:2], y[:2]),
                   query=NoQuery(), ensemble=[mlp])
    assert "ensemble" in str(e.value)


def test_boosters_are_listed_with_the_attacks_that_take_them():
    """``fortis attacks`` lists the boosters; each gradient transfer attack takes DI/TI/SI and
    ensembles, MI-FGSM also NI and VMI."""
    ids = {b["id"]: b for b in list_boosters()}
    assert set(ids) == {"DI", "TI", "SI", "NI", "VMI", "ensemble"}
    for a in ("fgsm", "bim", "pgd", "mi_fgsm"):
        assert {"DI", "TI", "SI", "ensemble"} <= set(attack_boosters(ATTACKS[a]))
        assert a in ids["DI"]["attacks"]
    assert {"NI", "VMI"} <= set(attack_boosters(ATTACKS["mi_fgsm"]))
    assert "NI" not in attack_boosters(ATTACKS["bim"])


def test_transfer_chunks_are_crafted_once(tmp_path):
    """CAN-9: a chunk's adversarials are kept before they are sent; a resumed attempt finds
    them (same images, same order) instead of crafting again; other ids or an unreadable
    artifact: None (craft again). Real SQLite evaluation store."""
    from fortis.services.evaluation.stages.base import RunContext
    from fortis.services.evaluation.store import EvaluationStore

    store = EvaluationStore(tmp_path / "ev.sqlite").for_tenant("t1")
    store.insert(evaluation_id="ev1", tenant="t1", plan_text="x", plan_name="p")
    ctx = RunContext(evaluation_id="ev1", plan=None, plan_text="", store=store,  # type: ignore[arg-type]
                     proxy=None, perturbation=None, scoring=None, report=None,  # type: ignore[arg-type]
                     images=[], target=None, progress=None)  # type: ignore[arg-type]
    rng = np.random.default_rng(0)
    u8 = [rng.integers(0, 256, (28, 28, 1), dtype=np.uint8) for _ in range(3)]
    fl = [a.astype(np.float32) / 255 for a in u8]
    assert ctx.load_adversarials("pgd", 0, ["a", "b", "c"]) is None
    ctx.save_adversarials("pgd", 0, ["a", "b", "c"], u8, fl)
    got = ctx.load_adversarials("pgd", 0, ["a", "b", "c"])
    assert got is not None and all(np.array_equal(a, b) for a, b in zip(got[0], u8, strict=True))
    assert ctx.load_adversarials("pgd", 0, ["a", "c", "b"]) is None
    assert ctx.load_adversarials("pgd", 1, ["a", "b", "c"]) is None
    store.put_artifact("ev1", "adversarial/pgd-00002.npz", b"not an npz")
    assert ctx.load_adversarials("pgd", 2, ["a"]) is None
    # sizes that differ (detection photos): one array per image
    mixed = [np.zeros((5, 7, 3), np.uint8), np.ones((9, 4, 3), np.uint8)]
    ctx.save_adversarials("pgd", 3, ["p", "q"], mixed, [m.astype(np.float32) for m in mixed])
    got = ctx.load_adversarials("pgd", 3, ["p", "q"])
    assert got is not None and [g.shape for g in got[0]] == [(5, 7, 3), (9, 4, 3)]
