"""What the side-by-side attack tests share (tests/reference): the counting oracle every
reference tool reaches the network through (float NCHW in [0, 1], rounded to uint8 levels,
charged per image, credited only within the bound and the budget, memoised), the wrapper a
torch tool gets, Fortis's counting view of the target, the checks of Fortis's own results and
the success comparison within two standard errors (IEEE-A8, IEEE-A9, IEEE-M6). The modules'
docstrings say how each uses them."""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import torch
from torch import nn

from tests.reference.test_attacks_vs_art import tolerance

SHAPE_NCHW = (1, 28, 28)


class Frozen(nn.Module):
    """A surrogate as a reference tool gets it (transfer attacks): the network's forward,
    always in eval mode (torchattacks calls ``.train()`` on the model it is given when it
    finishes). ``first_channel``: the tool is given three copies of a grey image
    (torchattacks' TI-FGSM smooths three channels) and the network reads the first."""

    def __init__(self, net: nn.Module, first_channel: bool = False) -> None:
        super().__init__()
        self.net = net.eval()
        self.first_channel = first_channel
        self.training = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x[:, :1] if self.first_channel else x)

    def train(self, mode: bool = True) -> Frozen:  # noqa: ARG002 - always eval
        self.training = False
        self.net.eval()
        return self


class Normalise(nn.Module):
    """A built-in Fashion-MNIST model's input normalisation as a layer (a tool that needs
    the network as a flat Sequential, e.g. ART's feature attack, gets it first)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.fn = model.normalize

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)


def to_uint8(adv: torch.Tensor | np.ndarray) -> np.ndarray:
    """A reference's float NCHW output in [0, 1], rounded to uint8 NHWC as Fortis rounds
    (nearest level): what a target receives."""
    a = adv.detach().cpu().numpy() if isinstance(adv, torch.Tensor) else np.asarray(adv)
    return np.clip(np.rint(a.astype(np.float64) * 255.0), 0, 255).astype(np.uint8) \
        .transpose(0, 2, 3, 1)
NUM_CLASSES = 10


class Done(Exception):  # noqa: N818 - a signal
    """Raised into a per-image reference when its image is done (success or budget)."""


class Oracle:
    """The reference tools' view of the target (see the module docstring). ``norm``/``epsilon``:
    the bound a credited point must lie within ([0, 1] scale, measured on the uint8 image);
    ``single``: the index of the one image a per-image run attacks (then ``Done`` is raised
    when it is done), else rows are charged to the nearest original."""

    def __init__(self, net: nn.Module, x: np.ndarray, y: np.ndarray, norm: str,
                 epsilon: float, budget: int) -> None:
        self.net, self.x, self.y = net, x, y
        self.flat = x.reshape(len(x), -1).astype(np.float64) / 255.0
        self.sq = np.sum(self.flat ** 2, axis=1)
        self.norm, self.epsilon, self.budget = norm, epsilon, budget
        self.counts = np.zeros(len(x), dtype=np.int64)
        self.first = np.full(len(x), -1)
        self.seen: list[dict[bytes, np.ndarray]] = [{} for _ in range(len(x))]
        self.single: int | None = None

    def _within(self, u8: np.ndarray, i: int) -> bool:
        d = (u8.astype(np.int64) - self.x[i].astype(np.int64)) / 255.0
        if self.norm == "l2":
            return bool(np.sqrt(np.sum(d * d)) <= self.epsilon + 1e-9)
        if self.norm == "linf":
            return bool(np.abs(d).max() <= self.epsilon + 1e-9)
        return bool(np.sum(np.any(d != 0, axis=2)) <= self.epsilon)

    def done(self, i: int) -> bool:
        return bool(self.first[i] > 0 or self.counts[i] >= self.budget)

    def __call__(self, batch_nchw: np.ndarray) -> np.ndarray:
        b = np.asarray(batch_nchw, dtype=np.float64)
        u8 = np.clip(np.rint(b * 255.0), 0, 255).astype(np.uint8).transpose(0, 2, 3, 1)
        if self.single is not None:
            owner = np.full(len(b), self.single)
        else:
            rows = u8.reshape(len(b), -1).astype(np.float64) / 255.0
            owner = np.argmin(self.sq[None, :] - 2.0 * rows @ self.flat.T, axis=1)
        probs = np.zeros((len(b), NUM_CLASSES), dtype=np.float32)
        todo = []
        for j, i in enumerate(owner):
            key = u8[j].tobytes()
            if key in self.seen[i]:
                probs[j] = self.seen[i][key]
            elif self.done(int(i)):
                probs[j, self.y[i]] = 1.0
            else:
                todo.append(j)
        if todo:
            with torch.inference_mode():
                t = torch.from_numpy(np.ascontiguousarray(u8[todo].transpose(0, 3, 1, 2)))
                fresh = torch.softmax(self.net(t.float() / 255.0), dim=1).numpy()
            for j, p in zip(todo, fresh, strict=True):
                i = int(owner[j])
                if self.done(i):      # spent within this very call
                    probs[j, self.y[i]] = 1.0
                    continue
                probs[j] = self.seen[i][u8[j].tobytes()] = p
                self.counts[i] += 1
                if int(p.argmax()) != self.y[i] and self._within(u8[j], i):
                    self.first[i] = self.counts[i]
        if self.single is not None and self.done(self.single):
            raise Done
        return probs

    def nhwc255(self, batch: Iterable[np.ndarray]) -> np.ndarray:
        """bat's view: a list/array of H x W x C in [0, 255]."""
        arr = np.stack([np.asarray(v, dtype=np.float64) for v in batch])
        return self(arr.transpose(0, 3, 1, 2) / 255.0)

    @property
    def success(self) -> np.ndarray:
        return self.first > 0


class ToolNet(nn.Module):
    """What a torch tool gets: calls the oracle, owns no parameters (its ``.train()`` cannot
    reach the network)."""

    def __init__(self, oracle: Oracle) -> None:
        super().__init__()
        self.oracle = oracle

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(self.oracle(x.detach().cpu().numpy())).clamp_min(1e-30).log()


class Counting:
    """Fortis's view of the target: uint8 NHWC in, counted per batch index."""

    def __init__(self, clf, n: int) -> None:
        self.clf = clf
        self.counts = np.zeros(n, dtype=np.int64)

    def scores(self, images: np.ndarray, idx: np.ndarray) -> np.ndarray:
        assert images.dtype == np.uint8
        np.add.at(self.counts, np.asarray(idx), 1)
        return self.clf.predict_proba(images)


def check_ours(results, target: Counting, clf, x, y, norm: str, epsilon: float,
               budget: int) -> np.ndarray:
    ok = np.array([bool(r.success) for r in results])
    assert np.array_equal(np.array([r.queries for r in results]), target.counts)
    assert target.counts.max() <= budget
    advs = np.stack([r.adversarial for r in results])
    d = (advs.astype(np.int64) - x.astype(np.int64)) / 255.0
    if norm == "l2":
        assert np.sqrt(np.sum(d.reshape(len(x), -1) ** 2, axis=1)).max() <= epsilon + 1e-9
    elif norm == "l0":
        assert np.sum(np.any(d != 0, axis=3).reshape(len(x), -1), axis=1).max() <= epsilon
    else:
        assert np.abs(d).max() <= epsilon + 1e-9
    if ok.any():
        assert np.all(clf.predict(advs[ok]) != y[ok])
    return ok


def compare(name: str, ours: np.ndarray, ref: np.ndarray, ours_q: np.ndarray,
            ref_q: np.ndarray) -> None:
    n = len(ours)
    a, b = float(ours.mean()), float(ref.mean())
    tol = tolerance(a, b, n)
    qa = float(ours_q[ours].mean()) if ours.any() else math.nan
    qb = float(ref_q[ref].mean()) if ref.any() else math.nan
    print(f"{name}: ours {a:.3f} (mean queries {qa:.0f}) vs reference {b:.3f} "
          f"(mean queries {qb:.0f}), tolerance {tol:.3f}, n {n}")
    assert a >= b - tol, f"{name}: ours {a:.3f} vs reference {b:.3f} (tolerance {tol:.3f})"



def net_state(net: nn.Module) -> tuple[tuple[bool, ...], list[torch.Tensor]]:
    return (tuple(m.training for m in net.modules()),
            [t.detach().clone() for t in net.state_dict().values()])


def assert_unchanged(net: nn.Module, before: tuple[tuple[bool, ...], list[torch.Tensor]]) -> None:
    modes, tensors = net_state(net)
    assert modes == before[0]
    assert all(torch.equal(a, b) for a, b in zip(tensors, before[1], strict=True))
