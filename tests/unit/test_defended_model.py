"""The defended built-in model (for benchmarks across models, CAN-5 defence effect, CAN-7
models x attacks): ``fmnist-cnn-at``, the target's CNN adversarially trained ("fast" FGSM with a
random start, Wong, Rice & Kolter 2020, L-inf 0.1), measured against the undefended
``fmnist-cnn`` on real Fashion-MNIST test images with white-box PGD (IEEE-A7: the project's own
``pgd``, 10 steps, bound 0.1 in [0, 1] scale, IEEE-A9) and torchattacks' PGD as the reference
attack. Every threshold is a property of a defended model, not a measured number: the defended
model keeps a clean-accuracy floor and stays clearly more accurate under the attack (robust
accuracy several times the undefended model's and above chance by far), and the white-box
attack is the stronger one (a transfer attack from another model hurts less: no sign of
gradient masking, Athalye et al. 2018). The model is served like the other built-ins: as a
target (full scores, 28 x 28 x 1, the Fashion-MNIST labels) and as a white-box surrogate.

Trained once per machine (tests/conftest.py pre-trains it); later runs load the cache.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from fortis.adapters.builtin import BUILTIN_MODELS, load_model
from fortis.adapters.torch_models import fmnist
from fortis.adapters.torch_models.classifier import TorchClassifier
from fortis.adapters.torch_models.datasets import FASHION_MNIST_CLASSES, load_fashion_mnist
from fortis.services.perturbation.attacks import fgsm, pgd

pytestmark = pytest.mark.usefixtures("one_thread")

N = 300            # test images the attacks run on (a few hundred: CPU time)
OFFSET = 2000      # away from the first rows other tests use
EPSILON = 0.1      # the demo plan's bound, the one the model was trained for


def _accuracy(clf: TorchClassifier, images: np.ndarray, labels: np.ndarray) -> float:
    return float((clf.predict(images) == labels).mean())


def _pgd_accuracy(clf: TorchClassifier, x: np.ndarray, y: np.ndarray, *,
                  crafted_on: TorchClassifier | None = None) -> float:
    """Accuracy of ``clf`` on PGD examples crafted on ``crafted_on`` (default: ``clf`` itself,
    white box); the uint8 images within the bound, as a target would receive them."""
    source = crafted_on or clf
    results = pgd(source.model, x, y, epsilon=EPSILON, steps=10,
                  generator=torch.Generator().manual_seed(0))
    adv = np.stack([r.adversarial for r in results])
    assert all(r.linf <= EPSILON + 1e-6 for r in results)
    assert np.abs(adv.astype(np.int16) - x.astype(np.int16)).max() <= math.floor(EPSILON * 255)
    return _accuracy(clf, adv, y)


@pytest.fixture(scope="module")
def data() -> tuple[np.ndarray, np.ndarray]:
    return load_fashion_mnist("test", limit=N, offset=OFFSET)


@pytest.fixture(scope="module")
def defended() -> TorchClassifier:
    return load_model("fmnist-cnn-at")


@pytest.fixture(scope="module")
def undefended() -> TorchClassifier:
    return load_model("fmnist-cnn")


def test_defended_model_is_the_target_architecture_adversarially_trained(defended) -> None:
    _, metrics = fmnist.load_fmnist_model("robust")
    assert type(defended.model) is type(load_model("fmnist-cnn").model) is fmnist.FashionCNN
    at = metrics["adversarial_training"]
    assert at["method"] == "fgsm-rs" and at["epsilon"] == EPSILON == fmnist.AT_EPSILON
    assert at["step"] == pytest.approx(1.25 * EPSILON)
    assert metrics["seed"] == fmnist.DEFAULT_SEEDS["robust"] != fmnist.DEFAULT_SEEDS["target"]
    assert metrics["n_train"] == 60_000 and metrics["n_test"] == 10_000
    assert not defended.model.training


def test_clean_accuracy_keeps_a_floor() -> None:
    """On all 10k test images (recomputed, not read from the json): the defence costs some clean
    accuracy (CAN-5 sacrifice), never the classifier."""
    x, y = load_fashion_mnist("test")
    robust, _ = fmnist.load_fmnist_model("robust")
    target, _ = fmnist.load_fmnist_model("target")
    clean_at, clean_cnn = fmnist.evaluate(robust, x, y), fmnist.evaluate(target, x, y)
    print(f"clean accuracy: fmnist-cnn-at {clean_at:.4f}, fmnist-cnn {clean_cnn:.4f}")
    assert clean_at >= 0.80
    assert clean_at <= clean_cnn + 0.01       # no free lunch: robustness is paid in accuracy


def test_white_box_pgd_leaves_the_defended_model_clearly_more_accurate(
        defended, undefended, data) -> None:
    x, y = data
    clean_at, clean_cnn = _accuracy(defended, x, y), _accuracy(undefended, x, y)
    rob_at, rob_cnn = _pgd_accuracy(defended, x, y), _pgd_accuracy(undefended, x, y)
    fgsm_at = _accuracy(defended, np.stack([r.adversarial for r in fgsm(
        defended.model, x, y, epsilon=EPSILON)]), y)
    print(f"n={N} eps={EPSILON}: fmnist-cnn clean {clean_cnn:.3f} pgd {rob_cnn:.3f}; "
          f"fmnist-cnn-at clean {clean_at:.3f} fgsm {fgsm_at:.3f} pgd {rob_at:.3f}")
    assert rob_cnn < clean_cnn - 0.5          # the attack works: the undefended model collapses
    assert rob_at < clean_at                  # ... and is not vacuous on the defended one
    assert rob_at >= 0.4
    assert rob_at >= 3 * rob_cnn
    assert rob_at >= rob_cnn + 0.3
    assert rob_at <= fgsm_at + 2 / N          # 10 PGD steps do at least what one FGSM step does


def test_the_white_box_attack_is_the_stronger_one(defended, undefended, data) -> None:
    """PGD crafted on another model (fmnist-cnn, transferred) hurts the defended model less than
    PGD on its own gradients: its gradients are informative, not masked."""
    x, y = data
    white = _pgd_accuracy(defended, x, y)
    transferred = _pgd_accuracy(defended, x, y, crafted_on=undefended)
    print(f"fmnist-cnn-at under PGD: white box {white:.3f}, transferred from fmnist-cnn "
          f"{transferred:.3f}")
    assert white < transferred


def test_the_reference_pgd_agrees(defended, undefended, data) -> None:
    """torchattacks' PGD (same bound, steps, step size; its random start seeded) gives the same
    picture, within two standard errors of the difference of the two rates."""
    import torchattacks

    from tests.reference.refkit import Frozen, to_uint8
    from tests.reference.test_attacks_vs_art import tolerance

    x, y = data
    xt = torch.from_numpy(x).permute(0, 3, 1, 2).float() / 255.0
    for clf in (defended, undefended):
        torch.manual_seed(0)
        atk = torchattacks.PGD(Frozen(clf.model), eps=EPSILON, alpha=2.5 * EPSILON / 10,
                               steps=10, random_start=True)
        adv = to_uint8(atk(xt, torch.from_numpy(y)))
        assert np.abs(adv.astype(np.int16) - x.astype(np.int16)).max() <= round(EPSILON * 255)
        ref, ours = _accuracy(clf, adv, y), _pgd_accuracy(clf, x, y)
        print(f"{clf.name}: pgd accuracy fortis {ours:.3f}, torchattacks {ref:.3f}")
        assert abs(ours - ref) <= tolerance(ours, ref, N)
    assert not defended.model.training and not undefended.model.training


@pytest.mark.parametrize("name", ["fmnist-cnn-at", "fmnist-mlp"])
def test_served_as_a_built_in_target_with_full_scores(name: str, data) -> None:
    from fortis.adapters.torch_target import ClassifierTarget
    from fortis.server.app.stack import DEFAULT_TARGETS, TargetConfig, builtin_target
    from fortis.services.common.codec import dense_scores, image_msg

    cfg = next(c for c in map(TargetConfig.parse, DEFAULT_TARGETS) if c.name == name)
    assert cfg.builtin == name and cfg.output == "full_scores"
    target = builtin_target(cfg)
    assert isinstance(target, ClassifierTarget)
    info = target.info()
    assert list(info.labels) == list(FASHION_MNIST_CLASSES)
    assert (info.input.height, info.input.width, info.input.channels) == (28, 28, 1)
    assert info.version == fmnist.CACHE_VERSION and info.name.startswith("fmnist-")
    x, y = data
    preds = target.predict([image_msg(f"i{k}", im) for k, im in enumerate(x[:20])])
    scores = np.stack([dense_scores(p, 10) for p in preds])
    assert scores.shape == (20, 10)
    np.testing.assert_allclose(scores.sum(axis=1), 1.0, atol=1e-4)
    assert (scores.argmax(axis=1) == load_model(name).predict(x[:20])).all()


def test_served_as_a_white_box_surrogate(defended, undefended, data) -> None:
    """The built-in loader (the perturbation service's surrogate loader) hands out the same
    classifier; the registry's pgd through the engine (``run_attack``, the white box a plan's
    transfer stage uses) crafts on it within the bound, and its examples transfer to
    fmnist-cnn less than fmnist-cnn's own white-box examples fool it."""
    from fortis.services.common.surrogates import BUILTIN_SURROGATE_NAMES
    from fortis.services.perturbation.engine import AttackItem, run_attack

    assert "fmnist-cnn-at" in BUILTIN_MODELS and "fmnist-cnn-at" in BUILTIN_SURROGATE_NAMES
    assert load_model("fmnist-cnn-at", "surrogate_models") is defended
    x, y = data[0][:100], data[1][:100]
    items = [AttackItem(image_id=f"i{k}", image=x[k], labels=(int(y[k]),)) for k in range(len(x))]
    res = run_attack("pgd", {"epsilon": EPSILON, "steps": 10}, 0, items, surrogate=defended)
    adv = np.stack([r.adversarial for r in res])
    assert adv.shape == x.shape and all(r.success is None and r.queries == 0 for r in res)
    assert np.abs(adv.astype(np.int16) - x.astype(np.int16)).max() <= math.floor(EPSILON * 255)
    assert _accuracy(defended, adv, y) < _accuracy(defended, x, y)
    assert _accuracy(undefended, adv, y) < _accuracy(undefended, x, y)
    assert _accuracy(undefended, adv, y) > _pgd_accuracy(undefended, x, y)
