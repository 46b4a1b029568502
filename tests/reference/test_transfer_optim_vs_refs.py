"""C&W L2, EAD, DDN and FAB (IEEE-A7 transfer attacks, crafted white-box on the surrogate;
IEEE-A9 norms measured on the uint8 images) side by side with independent references on the
project's Fashion-MNIST surrogate (``fmnist-surrogate``), at equal iterations, binary-search
rounds and hyper-parameters:

* C&W L2 against foolbox ``L2CarliniWagnerAttack`` and ART ``CarliniL2Method``;
* EAD against foolbox ``EADAttack`` and torchattacks ``EADEN``;
* DDN against foolbox ``DDNAttack`` (the only packaged DDN);
* FAB (L-inf and L2) against torchattacks ``FAB`` (a port of the authors' code; foolbox 3.3.4
  and ART 1.20.1 have no FAB).

Every tool attacks the same correctly classified test images (correct on the surrogate). A
reference's float output is rounded to uint8 (what a target receives) and judged, as ours, by
the surrogate's top-1 on that uint8 image. Pass:

* success rate: ours >= the reference's minus two standard errors of the difference
  (``tolerance``);
* minimal norm: our median distance <= the reference's, in the norm the attack minimises
  (L2 for C&W and DDN, the elastic-net distance ``beta*L1 + L2^2`` of EAD's "EN" rule, the
  chosen norm for FAB), a failed image counting as an infinite distance (so the median also
  punishes failures). No tolerance is given: Fortis keeps the best iterate *after rounding*
  while a reference keeps its best float iterate, which may round to a non-adversarial image
  (reported as a failure) -- an advantage Fortis has by design (success is judged on what the
  target receives), stated here so it is not mistaken for a better optimiser.

torchattacks calls ``.train()`` on the model it attacks when it finishes: it gets
:class:`Frozen`, which keeps the surrogate in eval mode. Small iteration counts keep the file
well under 90 s on two cores (both tools get the same counts).
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from fortis.services.perturbation.engine import AttackItem, run_attack
from torch import nn

from tests.reference.refkit import Frozen, to_uint8
from tests.reference.test_attacks_vs_art import tolerance

N_IMAGES = 16
EAD_BETA = 0.01


def to_nchw(images: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(images.transpose(0, 3, 1, 2))).float() / 255.0


def predict(net: nn.Module, u8: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        return net(to_nchw(u8)).argmax(dim=1).numpy()


def dist(adv: np.ndarray, x: np.ndarray, norm: str) -> np.ndarray:
    d = (adv.astype(np.float64) - x.astype(np.float64)).reshape(len(x), -1) / 255.0
    if norm == "l2":
        return np.sqrt((d * d).sum(axis=1))
    if norm == "linf":
        return np.abs(d).max(axis=1)
    return EAD_BETA * np.abs(d).sum(axis=1) + (d * d).sum(axis=1)  # EAD's EN distance


def judge(net: nn.Module, adv: np.ndarray, x: np.ndarray, y: np.ndarray, norm: str,
          target: int | None = None, found: np.ndarray | None = None
          ) -> tuple[np.ndarray, float]:
    """(success per image, median distance with failures at +inf); ``found``: False where
    the tool says it found nothing (foolbox's all-zero sentinel)."""
    p = predict(net, adv)
    ok = p != y if target is None else p == target
    if found is not None:
        ok &= found
    d = np.where(ok, dist(adv, x, norm), np.inf)
    return ok, float(np.median(d))


def ours(surrogate, attack_id: str, params: dict, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    items = [AttackItem(image_id=f"img{i}", image=x[i], labels=(int(y[i]),))
             for i in range(len(x))]
    res = run_attack(attack_id, params, 0, items, surrogate=surrogate)
    assert all(r.stop_reason == "iterations" and r.queries == 0 and r.success is None
               for r in res)
    return np.stack([r.adversarial for r in res])


def foolbox_found(adv_u8: np.ndarray) -> np.ndarray:
    """Foolbox's minimal-norm attacks return an all-zero image where they found nothing (the
    all-black image, which this surrogate calls class 0): not an adversarial the attack
    found, so it counts as a failure."""
    return adv_u8.reshape(len(adv_u8), -1).any(axis=1)


def compare(name: str, net, x, y, mine: np.ndarray, theirs: np.ndarray, norm: str,
            found: np.ndarray | None = None) -> None:
    ok_m, med_m = judge(net, mine, x, y, norm)
    ok_t, med_t = judge(net, theirs, x, y, norm, found=found)
    tol = tolerance(ok_m.mean(), ok_t.mean(), len(x))
    print(f"{name}: success {ok_m.mean():.2f} vs {ok_t.mean():.2f} (tol {tol:.2f}); "
          f"median {norm} {med_m:.4f} vs {med_t:.4f}")
    assert ok_m.mean() >= ok_t.mean() - tol, (name, ok_m.mean(), ok_t.mean())
    assert med_m <= med_t, (name, med_m, med_t)
    assert ok_m.mean() >= 0.5, name  # not vacuous


@pytest.fixture(scope="module")
def surrogate_correct(fmnist_surrogate, fmnist_test_images):
    """The first ``N_IMAGES`` test images the surrogate classifies correctly."""
    x, y = fmnist_test_images
    net = fmnist_surrogate.model.eval()
    ok = np.flatnonzero(predict(net, x) == y)[:N_IMAGES]
    return x[ok], y[ok]


def _fb_model(net: nn.Module):
    import foolbox as fb
    return fb.PyTorchModel(Frozen(net), bounds=(0.0, 1.0))


def _art_classifier(net: nn.Module):
    from art.estimators.classification import PyTorchClassifier
    return PyTorchClassifier(model=Frozen(net), loss=nn.CrossEntropyLoss(),
                             input_shape=(1, 28, 28), nb_classes=10, clip_values=(0.0, 1.0))


# --------------------------------------------------------------------------------- C&W L2 ----


@pytest.mark.parametrize("tool", ["foolbox", "art"])
def test_cw_l2_not_weaker_than_references(tool, fmnist_surrogate, surrogate_correct):
    """C&W L2, 5 binary-search rounds x 40 Adam steps, lr 0.01, kappa 0; c_0 = 0.1 for every
    tool (the paper's 1e-3 needs more rounds than 5 to reach a useful c on this CNN). At 40
    steps ART, whose iteration is a line search over the step size (up to 2^5 x lr), reaches
    a few far images (L2 > 1) that Adam at lr 0.01 cannot: within the tolerance at 16
    images; with 200 steps Fortis reaches them too."""
    x, y = surrogate_correct
    net = fmnist_surrogate.model.eval()
    search, steps, lr, c0 = 5, 40, 0.01, 0.1
    mine = ours(fmnist_surrogate, "cw_l2", {"steps": steps, "binary_search_steps": search,
                                            "learning_rate": lr, "initial_const": c0}, x, y)
    xt, yt = to_nchw(x), torch.from_numpy(y)
    if tool == "foolbox":
        import foolbox as fb
        atk = fb.attacks.L2CarliniWagnerAttack(binary_search_steps=search, steps=steps,
                                               stepsize=lr, initial_const=c0, confidence=0.0,
                                               abort_early=True)
        adv = atk(_fb_model(net), xt, fb.criteria.Misclassification(yt), epsilons=None)[0]
    else:
        from art.attacks.evasion import CarliniL2Method
        atk = CarliniL2Method(_art_classifier(net), confidence=0.0, learning_rate=lr,
                              binary_search_steps=search, max_iter=steps, initial_const=c0,
                              batch_size=len(x), verbose=False)
        adv = atk.generate(xt.numpy(), y=np.eye(10)[y])
    theirs = to_uint8(adv)
    compare(f"C&W L2 vs {tool}", net, x, y, mine, theirs, "l2",
            found=foolbox_found(theirs) if tool == "foolbox" else None)


# ------------------------------------------------------------------------------------ EAD ----


@pytest.mark.parametrize("tool", ["foolbox", "torchattacks"])
def test_ead_not_weaker_than_references(tool, fmnist_surrogate, surrogate_correct):
    """EAD (FISTA, EN rule, beta 0.01), 5 rounds x 40 steps, lr 0.01, c_0 = 0.1, kappa 0."""
    x, y = surrogate_correct
    net = fmnist_surrogate.model.eval()
    search, steps, lr, c0 = 5, 40, 0.01, 0.1
    mine = ours(fmnist_surrogate, "ead", {"steps": steps, "binary_search_steps": search,
                                          "learning_rate": lr, "initial_const": c0,
                                          "beta": EAD_BETA, "decision_rule": "EN"}, x, y)
    xt, yt = to_nchw(x), torch.from_numpy(y)
    if tool == "foolbox":
        import foolbox as fb
        atk = fb.attacks.EADAttack(binary_search_steps=search, steps=steps,
                                   initial_stepsize=lr, confidence=0.0, initial_const=c0,
                                   regularization=EAD_BETA, decision_rule="EN",
                                   abort_early=True)
        adv = atk(_fb_model(net), xt, fb.criteria.Misclassification(yt), epsilons=None)[0]
    else:
        import torchattacks
        frozen = Frozen(net)
        atk = torchattacks.EADEN(frozen, kappa=0, lr=lr, binary_search_steps=search,
                                 max_iterations=steps, abort_early=True, initial_const=c0,
                                 beta=EAD_BETA)
        adv = atk(xt, yt)
        assert not net.training
    theirs = to_uint8(adv)
    compare(f"EAD vs {tool}", net, x, y, mine, theirs, "en",
            found=foolbox_found(theirs) if tool == "foolbox" else None)


# ------------------------------------------------------------------------------------ DDN ----


def test_ddn_not_weaker_than_foolbox(fmnist_surrogate, surrogate_correct):
    """DDN, 50 steps, epsilon_0 = 1, gamma = 0.05 (the paper's)."""
    import foolbox as fb
    x, y = surrogate_correct
    net = fmnist_surrogate.model.eval()
    steps = 50
    mine = ours(fmnist_surrogate, "ddn", {"steps": steps}, x, y)
    atk = fb.attacks.DDNAttack(init_epsilon=1.0, steps=steps, gamma=0.05)
    adv = atk(_fb_model(net), to_nchw(x), fb.criteria.Misclassification(torch.from_numpy(y)),
              epsilons=None)[0]
    theirs = to_uint8(adv)
    compare("DDN vs foolbox", net, x, y, mine, theirs, "l2", found=foolbox_found(theirs))


# ------------------------------------------------------------------------------------ FAB ----


@pytest.mark.parametrize("norm", ["linf", "l2"])
def test_fab_not_weaker_than_torchattacks(norm, fmnist_surrogate, surrogate_correct):
    """FAB, 20 steps, one run from the image (no restart), alpha_max 0.1, eta 1.05, beta 0.9
    (the paper's); torchattacks' ``eps`` (a success threshold only) set past any distance."""
    import torchattacks
    x, y = surrogate_correct
    net = fmnist_surrogate.model.eval()
    steps = 20
    mine = ours(fmnist_surrogate, "fab", {"steps": steps, "norm": norm}, x, y)
    atk = torchattacks.FAB(Frozen(net), norm="Linf" if norm == "linf" else "L2",
                           eps=1.0 if norm == "linf" else 100.0, steps=steps, n_restarts=1,
                           alpha_max=0.1, eta=1.05, beta=0.9, seed=0, n_classes=10)
    adv = atk(to_nchw(x), torch.from_numpy(y))
    assert not net.training
    compare(f"FAB-{norm} vs torchattacks", net, x, y, mine, to_uint8(adv), norm)


# ------------------------------------------------------------------------------- targeted ----


TARGET = 2  # not 0: the all-black image is class 0 on this surrogate (see below)


@pytest.mark.parametrize("attack_id", ["cw_l2", "ead", "ddn"])
def test_targeted_not_weaker_than_foolbox(attack_id, fmnist_surrogate, surrogate_correct):
    """The targeted variants (``TargetedMisclassification`` to class 2) against foolbox's, at
    equal iterations (images of class 2 left out). Foolbox returns an all-zero image where
    it finds nothing, which this surrogate classifies as class 0: a target of 0 would credit
    foolbox with black images, so the target is 2."""
    import foolbox as fb
    x, y = surrogate_correct
    keep = y != TARGET
    x, y = x[keep], y[keep]
    net = fmnist_surrogate.model.eval()
    items = [AttackItem(image_id=f"img{i}", image=x[i], labels=(int(y[i]),))
             for i in range(len(x))]
    if attack_id == "cw_l2":
        params = {"steps": 100, "binary_search_steps": 5, "initial_const": 0.1}
        atk = fb.attacks.L2CarliniWagnerAttack(binary_search_steps=5, steps=100,
                                               initial_const=0.1, abort_early=True)
    elif attack_id == "ead":
        params = {"steps": 100, "binary_search_steps": 5, "initial_const": 0.1,
                  "beta": EAD_BETA}
        atk = fb.attacks.EADAttack(binary_search_steps=5, steps=100, initial_const=0.1,
                                   regularization=EAD_BETA, abort_early=True)
    else:
        params = {"steps": 50}
        atk = fb.attacks.DDNAttack(init_epsilon=1.0, steps=50, gamma=0.05)
    t0 = time.perf_counter()
    res = run_attack(attack_id, params, 0, items, surrogate=fmnist_surrogate,
                     criterion={"target_label": TARGET})
    mine = np.stack([r.adversarial for r in res])
    adv = atk(_fb_model(net), to_nchw(x),
              fb.criteria.TargetedMisclassification(
                  torch.full((len(x),), TARGET, dtype=torch.long)), epsilons=None)[0]
    theirs = to_uint8(adv)
    norm = "en" if attack_id == "ead" else "l2"
    ok_m, med_m = judge(net, mine, x, y, norm, target=TARGET)
    ok_t, med_t = judge(net, theirs, x, y, norm, target=TARGET, found=foolbox_found(theirs))
    tol = tolerance(ok_m.mean(), ok_t.mean(), len(x))
    print(f"targeted {attack_id}: success {ok_m.mean():.2f} vs {ok_t.mean():.2f}; median {norm} "
          f"{med_m:.4f} vs {med_t:.4f} ({time.perf_counter() - t0:.1f} s)")
    assert ok_m.mean() >= ok_t.mean() - tol
    assert med_m <= med_t
    assert ok_m.mean() >= 0.5
