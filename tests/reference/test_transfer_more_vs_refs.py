"""Side by side with the reference implementations in the venv (IEEE-A7, IEEE-A9): Fortis's
Spatial attack against Foolbox 3.3.4's ``SpatialAttack`` (grid search), Sparse L1 Descent
against Foolbox's ``SparseL1DescentAttack`` and the Fast Feature attack against IBM ART
1.20.1's ``FeatureAdversariesPyTorch`` (its PGD optimiser), each at the same bound, grid or
iterations and on the same images, crafted on the built-in ``fmnist-surrogate``. Success is
the surrogate misclassifying (untargeted) or taking the guide's class (feature attack), over
the images it got right; Fortis's is judged on its uint8 outputs, the reference's on its
float outputs (as its own tool reports it: a looser judgement than ours). Ours must be at
least the reference's minus two standard errors (``test_attacks_vs_art.tolerance``).

Dispersion Reduction and the AdvGAN-style generator have no implementation in the venv
(ART 1.20.1, torchattacks 3.5.1, Foolbox 3.3.4): they are covered by
``tests/unit/test_transfer_more.py`` only.
"""

from __future__ import annotations

from types import MappingProxyType

import foolbox as fb
import numpy as np
import pytest
import torch
from art.attacks.evasion import FeatureAdversariesPyTorch
from art.estimators.classification import PyTorchClassifier
from fortis.services.common.params import validate_params
from fortis.services.perturbation.attacks.base import AttackContext, Misclassification
from fortis.services.perturbation.attacks.fast_feature import choose_guides
from fortis.services.perturbation.attacks.registry import ATTACKS
from fortis.services.perturbation.attacks.sparse_l1 import l1_distance
from fortis.services.perturbation.attacks.whitebox import to_tensor

from tests.reference.refkit import Normalise
from tests.reference.test_attacks_vs_art import tolerance

N = 64


@pytest.fixture(scope="module")
def right(fmnist_surrogate, fmnist_test_images):
    """The first N test images the surrogate gets right."""
    x, y = fmnist_test_images
    ok = np.flatnonzero(_predict(fmnist_surrogate.model, to_tensor(x)) == y)[:N]
    return x[ok], y[ok]


def _predict(model: torch.nn.Module, t: torch.Tensor) -> np.ndarray:
    with torch.inference_mode():
        return model.eval()(t).argmax(dim=1).numpy()


def _ours(attack_id: str, x: np.ndarray, y: np.ndarray, sur, params: dict) -> np.ndarray:
    spec = ATTACKS[attack_id]
    ctx = AttackContext(spec=spec, images=x, labels=y,
                        image_ids=tuple(f"r{k}" for k in range(len(x))),
                        label_sets=tuple((int(v),) for v in y),
                        params=MappingProxyType(validate_params(spec, params)), seed=0,
                        criterion=Misclassification(), surrogate=sur)
    return np.stack([r.adversarial for r in spec.run(ctx)])


def _compare(name: str, ours: float, ref: float, n: int) -> None:
    tol = tolerance(ours, ref, n)
    print(f"\n{name}: Fortis {ours:.3f} vs reference {ref:.3f} (n={n}, 2 SE = {tol:.3f})")
    assert ours >= ref - tol


def test_spatial_vs_foolbox(right, fmnist_surrogate) -> None:
    x, y = right
    model = fmnist_surrogate.model.eval()
    # a small grid, so neither side is at 100 %: 10 degrees, 1 px, 5 angles, 3 shifts
    adv = _ours("spatial", x, y, fmnist_surrogate,
                {"max_rotation": 10.0, "max_translation": 1 / 28, "rotation_steps": 5,
                 "translation_steps": 3})
    ours = float(np.mean(_predict(model, to_tensor(adv)) != y))
    fmodel = fb.PyTorchModel(model, bounds=(0.0, 1.0))
    attack = fb.attacks.SpatialAttack(max_translation=1.0, max_rotation=10.0,
                                      num_translations=3, num_rotations=5, grid_search=True)
    xt, yt = to_tensor(x), torch.from_numpy(y.astype(np.int64))
    _, ref_adv, success = attack(fmodel, xt, fb.criteria.Misclassification(yt))
    ref = float(success.float().mean())
    assert ref == pytest.approx(float(np.mean(_predict(model, ref_adv) != y)))
    _compare("spatial (10 deg, 1 px)", ours, ref, len(y))


def test_sparse_l1_vs_foolbox(right, fmnist_surrogate) -> None:
    x, y = right
    model = fmnist_surrogate.model.eval()
    eps, steps = 5.0, 20
    adv = _ours("sparse_l1", x, y, fmnist_surrogate,
                {"epsilon": eps, "steps": steps, "percentile": 99.0})
    assert max(l1_distance(a, b) for a, b in zip(x, adv, strict=True)) <= eps + 1e-9
    ours = float(np.mean(_predict(model, to_tensor(adv)) != y))
    fmodel = fb.PyTorchModel(model, bounds=(0.0, 1.0))
    attack = fb.attacks.SparseL1DescentAttack(quantile=0.99, rel_stepsize=0.2, steps=steps)
    xt, yt = to_tensor(x), torch.from_numpy(y.astype(np.int64))
    _, ref_adv, success = attack(fmodel, xt, yt, epsilons=eps)
    ref = float(success.float().mean())
    assert float((ref_adv - xt).abs().flatten(1).sum(1).max()) <= eps + 1e-4
    _compare("sparse_l1 (L1 5.0, 20 steps)", ours, ref, len(y))


def test_fast_feature_vs_art(right, fmnist_surrogate) -> None:
    """Same guides (Fortis's choice from the seed), same layer, bound, steps and step size:
    success = the surrogate takes the guide's class."""
    from fortis.services.common.seeding import rng_for

    x, y = right
    model = fmnist_surrogate.model.eval()
    eps, steps, layer = 0.1, 30, "classifier.2"
    size = 2.5 * eps / steps
    adv = _ours("fast_feature", x, y, fmnist_surrogate,
                {"epsilon": eps, "steps": steps, "layer": layer, "step_size": size})
    ids = tuple(f"r{k}" for k in range(len(x)))
    guides = choose_guides(y, rng_for(0, "fast_feature", *ids))
    ours = float(np.mean(_predict(model, to_tensor(adv)) == y[guides]))
    # ART names only a model's top-level children: the same layers, flattened (after the
    # model's input normalisation), so that classifier.2 (the ReLU after the first Linear)
    # is child "8"
    flat = torch.nn.Sequential(Normalise(model), *model.features, *model.classifier).eval()
    with torch.inference_mode():
        assert torch.equal(flat(to_tensor(x[:4])), model(to_tensor(x[:4])))
    assert flat[8] is model.classifier[2]
    clf = PyTorchClassifier(model=flat, loss=torch.nn.CrossEntropyLoss(),
                            input_shape=(1, 28, 28), nb_classes=10, clip_values=(0.0, 1.0))
    attack = FeatureAdversariesPyTorch(clf, delta=eps, layer="8", max_iter=steps,
                                       step_size=size, batch_size=len(x), verbose=False)
    xf = to_tensor(x).numpy()
    ref_adv = attack.generate(xf, xf[guides])
    assert float(np.abs(ref_adv - xf).max()) <= eps + 1e-6
    ref = float(np.mean(_predict(model, torch.from_numpy(ref_adv)) == y[guides]))
    _compare("fast_feature (eps 0.1, classifier.2, 30 steps)", ours, ref, len(y))
