"""The deterministic transfer attacks (IEEE-A7) against torchattacks 3.5.1 and IBM ART 1.20.1
on the same surrogate: FGSM, BIM, PGD without its random start, MI-FGSM, NI-FGSM, TI-FGSM
(torchattacks' TIFGSM with no input diversity) and SI-NI-FGSM, untargeted and targeted, give
the same uint8 images as torchattacks (every pixel), and FGSM and BIM the same as ART. The
reference's float images are rounded to uint8 as Fortis rounds (nearest level), since what
the target receives is uint8.

The surrogate is the project's Fashion-MNIST CNN (normalisation inside the model: both tools
get the same float NCHW [0, 1] input). torchattacks calls ``.train()`` on the model it is
given when it finishes, so it gets ``refkit.Frozen`` (always eval) and the
network's mode and weights are checked after.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fortis.services.perturbation.engine import AttackItem, run_attack
from torch import nn

from .refkit import Frozen, assert_unchanged, net_state, to_uint8

torchattacks = pytest.importorskip("torchattacks")

N = 32           # a power of two: torchattacks' mean loss is the per-image sum scaled exactly
EPS = 8 / 255


@pytest.fixture(scope="module")
def batch(fmnist_surrogate, fmnist_test_images):
    x, y = fmnist_test_images
    return x[:N], y[:N]


def _ours(attack: str, params: dict, x: np.ndarray, y: np.ndarray, surrogate,
          target: int | None = None) -> np.ndarray:
    items = [AttackItem(image_id=f"i{k}", image=x[k], labels=(int(y[k]),)) for k in range(len(x))]
    crit = {"kind": "targeted_misclassification", "target_label": target} if target is not None \
        else None
    res = run_attack(attack, params, 0, items, surrogate=surrogate, criterion=crit)
    return np.stack([r.adversarial for r in res])


def _theirs(atk, x: np.ndarray, y: np.ndarray, target: int | None = None,
            rgb: bool = False) -> np.ndarray:
    xt = torch.from_numpy(x).permute(0, 3, 1, 2).float() / 255.0
    if rgb:
        xt = xt.repeat(1, 3, 1, 1)
    yt = torch.from_numpy(y.astype(np.int64))
    if target is not None:
        atk.set_mode_targeted_by_function(lambda images, labels: torch.full_like(labels, target))
    adv = atk(xt, yt)
    return to_uint8(adv[:, :1] if rgb else adv)


CASES = [
    ("fgsm", {"epsilon": EPS}, lambda m: torchattacks.FGSM(m, eps=EPS)),
    ("bim", {"epsilon": EPS, "steps": 10, "step_size": 1 / 255},
     lambda m: torchattacks.BIM(m, eps=EPS, alpha=1 / 255, steps=10)),
    ("pgd", {"epsilon": EPS, "steps": 10, "step_size": 2 / 255, "random_start": False},
     lambda m: torchattacks.PGD(m, eps=EPS, alpha=2 / 255, steps=10, random_start=False)),
    ("mi_fgsm", {"epsilon": EPS, "steps": 10, "step_size": 2 / 255, "decay": 1.0},
     lambda m: torchattacks.MIFGSM(m, eps=EPS, alpha=2 / 255, steps=10, decay=1.0)),
    ("mi_fgsm", {"epsilon": EPS, "steps": 10, "step_size": 2 / 255, "decay": 1.0,
                 "nesterov": True},
     lambda m: torchattacks.NIFGSM(m, eps=EPS, alpha=2 / 255, steps=10, decay=1.0)),
    ("mi_fgsm", {"epsilon": EPS, "steps": 10, "step_size": 2 / 255, "decay": 1.0,
                 "ti_kernel": 5},
     lambda m: torchattacks.TIFGSM(m, eps=EPS, alpha=2 / 255, steps=10, decay=1.0,
                                   len_kernel=5, nsig=3, diversity_prob=0.0)),
    ("mi_fgsm", {"epsilon": EPS, "steps": 10, "step_size": 2 / 255, "decay": 1.0,
                 "nesterov": True, "si_copies": 4},
     lambda m: torchattacks.SINIFGSM(m, eps=EPS, alpha=2 / 255, steps=10, decay=1.0, m=4)),
]


@pytest.mark.parametrize("targeted", [False, True], ids=["untargeted", "targeted"])
@pytest.mark.parametrize("case", range(len(CASES)),
                         ids=["fgsm", "bim", "pgd", "mi_fgsm", "ni_fgsm", "ti_mi_fgsm",
                              "si_ni_fgsm"])
def test_same_uint8_images_as_torchattacks(case, targeted, batch, fmnist_surrogate) -> None:
    """IEEE-A7: every pixel of every image equal to torchattacks' (rounded to uint8)."""
    attack, params, make = CASES[case]
    x, y = batch
    target = 3 if targeted else None
    net = fmnist_surrogate.model
    before = net_state(net)
    rgb = "ti_kernel" in params
    theirs = _theirs(make(Frozen(net, rgb).eval()), x, y, target, rgb)
    assert_unchanged(net, before)
    ours = _ours(attack, params, x, y, fmnist_surrogate, target)
    assert_unchanged(net, before)
    diff = ours.astype(int) - theirs.astype(int)
    changed = int((ours != x).sum())
    print(f"{attack} {params} targeted={targeted}: {changed} pixels moved, "
          f"{int((diff != 0).sum())} differ from torchattacks")
    assert changed > 0.2 * x.size                       # the attack did something
    assert np.array_equal(ours, theirs)


def test_fgsm_and_bim_equal_art(batch, fmnist_surrogate) -> None:
    """IEEE-A7: FGSM and BIM (ART's BasicIterativeMethod) equal IBM ART's on the same model."""
    pytest.importorskip("art")
    from art.attacks.evasion import BasicIterativeMethod, FastGradientMethod
    from art.estimators.classification import PyTorchClassifier
    x, y = batch
    net = fmnist_surrogate.model
    clf = PyTorchClassifier(model=Frozen(net).eval(), loss=nn.CrossEntropyLoss(),
                            input_shape=(1, 28, 28), nb_classes=10, clip_values=(0.0, 1.0))
    xt = (x.transpose(0, 3, 1, 2).astype(np.float32) / np.float32(255.0))

    fg = to_uint8(FastGradientMethod(clf, eps=EPS, batch_size=N).generate(xt, y=y))
    ours = _ours("fgsm", {"epsilon": EPS}, x, y, fmnist_surrogate)
    assert np.array_equal(ours, fg)
    bim = to_uint8(BasicIterativeMethod(clf, eps=EPS, eps_step=1 / 255, max_iter=10, batch_size=N,
                                  verbose=False).generate(xt, y=y))
    ours = _ours("bim", {"epsilon": EPS, "steps": 10, "step_size": 1 / 255}, x, y,
                 fmnist_surrogate)
    print(f"bim vs ART: {int((ours != bim).sum())} of {ours.size} values differ")
    assert np.array_equal(ours, bim)
