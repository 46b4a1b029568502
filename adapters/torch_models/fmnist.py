"""Fashion-MNIST models: the target CNN, the tester's surrogate, an MLP and the target CNN
adversarially trained ("robust", built-in ``fmnist-cnn-at``), each trained on first use.

Weights are generated, never committed: :func:`load_fmnist_model` loads
``<cache_dir>/fmnist-<kind>-v1.pt`` (+ ``.json`` metrics) when present and otherwise trains,
saves atomically (temp file + rename, under an ``fcntl`` lock so parallel processes train
once) and returns the model. Both models take float32 N x 1 x 28 x 28 in [0, 1] (they
normalise internally) and return logits over the 10 classes.

Measured on 2 CPU cores (torch 2.13, full 60k/10k splits): target 3 epochs, 81.7 s,
test accuracy 0.9131; surrogate 2 epochs, 19.9 s, test accuracy 0.9012; mlp (a third design, for
ensembles) 3 epochs, 25.9 s, test accuracy 0.8810; robust (FGSM-RS adversarial training, eps 0.1)
3 epochs, 132 s, test accuracy 0.8488; accuracy under white-box PGD-10 at eps 0.1: 0.715, the
undefended target 0.049 (bench/defended.py, first 1000 test images).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch
from torch import nn

from .datasets import load_fashion_mnist

__all__ = [
    "DEFAULT_EPOCHS",
    "DEFAULT_SEEDS",
    "FMNIST_MEAN",
    "FMNIST_STD",
    "KINDS",
    "FashionCNN",
    "SurrogateCNN",
    "build_model",
    "default_cache_dir",
    "evaluate",
    "load_fmnist_model",
    "model_paths",
    "train",
]

FMNIST_MEAN = 0.2860
FMNIST_STD = 0.3530
CACHE_VERSION = "v1"
KINDS = ("target", "surrogate", "mlp", "robust")
DEFAULT_EPOCHS = {"target": 3, "surrogate": 2, "mlp": 3, "robust": 3}
DEFAULT_SEEDS = {"target": 0, "surrogate": 1, "mlp": 2, "robust": 3}
BATCH_SIZE = 128
MAX_LR = 3e-3
#: "robust": the target's architecture, adversarially trained ("fast" FGSM with a random start,
#: Wong, Rice & Kolter 2020) on every batch: L-inf bound in [0, 1] pixel scale (the demo plan's
#: epsilon) and the FGSM step (1.25 x the bound). The loss is the adversarial loss alone: mixing
#: in the clean loss (weight 0.5, 2 epochs for the same time) gave clean 0.869 but PGD-10
#: accuracy 0.612, against 0.849 and 0.706 without it (500 test images, eps 0.1).
AT_EPSILON = 0.1
AT_STEP = 1.25 * AT_EPSILON
ADVERSARIAL_KINDS = frozenset({"robust"})

Log = Callable[[str], None]


class _Normalized(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mean", torch.tensor(FMNIST_MEAN), persistent=False)
        self.register_buffer("std", torch.tensor(FMNIST_STD), persistent=False)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        mean, std = self.get_buffer("mean"), self.get_buffer("std")
        return (x - mean) / std


class FashionCNN(_Normalized):
    """Target: conv32-BN-maxpool, conv64-BN-maxpool, dropout, fc128, dropout, fc10."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Dropout(0.25), nn.Linear(64 * 7 * 7, 128), nn.ReLU(),
            nn.Dropout(0.25), nn.Linear(128, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(self.normalize(x)))


class SurrogateCNN(_Normalized):
    """Surrogate: a different design -- strided 5x5 conv24, conv48, maxpool, fc96; no BN."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 24, 5, stride=2, padding=2), nn.ReLU(),
            nn.Conv2d(24, 48, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(48 * 7 * 7, 96), nn.ReLU(), nn.Linear(96, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(self.normalize(x)))


class FashionMLP(_Normalized):
    """A third design, no convolutions (a second surrogate for model ensembles, IEEE-A7):
    fc256, fc128, fc10."""

    def __init__(self) -> None:
        super().__init__()
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(28 * 28, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
            nn.Linear(128, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.normalize(x))


_ARCHS: dict[str, type[nn.Module]] = {"target": FashionCNN, "surrogate": SurrogateCNN,
                                      "mlp": FashionMLP, "robust": FashionCNN}


def build_model(kind: str) -> nn.Module:
    """A freshly initialised (untrained) model of the given kind."""
    if kind not in _ARCHS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    return _ARCHS[kind]()


def _to_float(images: torch.Tensor) -> torch.Tensor:
    """uint8 N x 1 x 28 x 28 -> float32 in [0, 1]."""
    return images.to(torch.float32).div_(255.0)


def _nchw_uint8(images: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(images.transpose(0, 3, 1, 2)))


@contextlib.contextmanager
def _deterministic_cpu(threads: int) -> Iterator[None]:
    """Deterministic algorithms and a fixed thread count, restored afterwards."""
    prev_det = torch.are_deterministic_algorithms_enabled()
    prev_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    prev_threads = torch.get_num_threads()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(prev_det, warn_only=prev_warn)
        torch.set_num_threads(prev_threads)


def _fgsm_rs(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
             gen: torch.Generator) -> torch.Tensor:
    """FGSM from a uniform random start in the L-inf ball (Wong et al. 2020): one signed step of
    ``AT_STEP``, projected back onto the ball of radius ``AT_EPSILON`` and onto [0, 1]. The
    model stays in training mode, as in the paper; the start is drawn from ``gen``."""
    delta = (torch.rand(x.shape, generator=gen) * 2.0 - 1.0) * AT_EPSILON
    delta = ((x + delta).clamp_(0.0, 1.0) - x).requires_grad_(True)
    loss = nn.functional.cross_entropy(model(x + delta), y)
    (grad,) = torch.autograd.grad(loss, delta)
    delta = (delta.detach() + AT_STEP * grad.sign()).clamp_(-AT_EPSILON, AT_EPSILON)
    return (x + delta).clamp_(0.0, 1.0)


@torch.inference_mode()
def evaluate(model: nn.Module, images: np.ndarray, labels: np.ndarray,
             batch_size: int = 1000) -> float:
    """Top-1 accuracy of ``model`` on uint8 N x 28 x 28 x 1 images."""
    was_training = model.training
    model.eval()
    x = _nchw_uint8(images)
    correct = 0
    for i in range(0, len(x), batch_size):
        pred = model(_to_float(x[i:i + batch_size])).argmax(1).numpy()
        correct += int((pred == labels[i:i + batch_size]).sum())
    model.train(was_training)
    return correct / max(1, len(x))


def train(
    kind: str,
    *,
    seed: int = 0,
    epochs: int | None = None,
    log: Log | None = None,
    n_train: int | None = None,
    n_test: int | None = None,
) -> tuple[nn.Module, dict]:
    """Train a ``kind`` ("target" or "surrogate") model from scratch, deterministically.

    Adam with a one-cycle learning-rate schedule (max 3e-3), batch 128, epochs from
    ``DEFAULT_EPOCHS``. ``n_train``/``n_test`` restrict training/evaluation to the first
    rows of each split (cheap runs for tests). The same seed, data and thread count give
    bit-identical weights. Returns the eval-mode model and its metrics.
    """
    model = build_model(kind)  # validates kind before the data is read
    epochs = DEFAULT_EPOCHS[kind] if epochs is None else int(epochs)
    if epochs < 1:
        raise ValueError("epochs must be >= 1")
    say = log or (lambda _msg: None)
    adversarial = kind in ADVERSARIAL_KINDS
    threads = os.cpu_count() or 1
    xtr, ytr = load_fashion_mnist("train", limit=n_train)
    xte, yte = load_fashion_mnist("test", limit=n_test)
    with _deterministic_cpu(threads):
        torch.manual_seed(seed)
        model = build_model(kind)
        x, y = _nchw_uint8(xtr), torch.from_numpy(ytr.copy())
        steps_per_epoch = (len(x) + BATCH_SIZE - 1) // BATCH_SIZE
        opt = torch.optim.Adam(model.parameters(), lr=MAX_LR / 25)
        sched = torch.optim.lr_scheduler.OneCycleLR(
            opt, max_lr=MAX_LR, total_steps=epochs * steps_per_epoch)
        gen = torch.Generator().manual_seed(seed)
        start = time.perf_counter()
        for epoch in range(epochs):
            model.train()
            perm = torch.randperm(len(x), generator=gen)
            total = 0.0
            for i in range(0, len(x), BATCH_SIZE):
                idx = perm[i:i + BATCH_SIZE]
                xb, yb = _to_float(x[idx]), y[idx]
                if adversarial:     # the batch replaced by its FGSM-RS examples
                    xb = _fgsm_rs(model, xb, yb, gen)
                opt.zero_grad(set_to_none=True)
                loss = nn.functional.cross_entropy(model(xb), yb)
                loss.backward()
                opt.step()
                sched.step()
                total += loss.detach().item() * len(idx)
            say(f"fmnist-{kind}: epoch {epoch + 1}/{epochs} loss {total / len(x):.4f} "
                f"({time.perf_counter() - start:.1f} s)")
        train_seconds = time.perf_counter() - start
        accuracy = evaluate(model, xte, yte)
    model.eval()
    metrics = {
        "kind": kind,
        "arch": type(model).__name__,
        "test_accuracy": accuracy,
        "train_seconds": round(train_seconds, 2),
        "epochs": epochs,
        "seed": seed,
        "n_train": len(xtr),
        "n_test": len(xte),
        "batch_size": BATCH_SIZE,
        "threads": threads,
        "torch": torch.__version__,
    }
    if adversarial:
        metrics["adversarial_training"] = {
            "method": "fgsm-rs", "epsilon": AT_EPSILON, "step": AT_STEP}
    say(f"fmnist-{kind}: test accuracy {accuracy:.4f} after {train_seconds:.1f} s")
    return model, metrics


def default_cache_dir() -> Path:
    base = Path(os.environ.get("FORTIS_CACHE", Path.home() / ".cache" / "fortis"))
    return base / "models"


def model_paths(kind: str, cache_dir: Path | None = None) -> tuple[Path, Path]:
    """(weights, metrics) paths of a cached model."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    stem = f"fmnist-{kind}-{CACHE_VERSION}"
    return root / f"{stem}.pt", root / f"{stem}.json"


def _atomic_write(path: Path, write: Callable[[Path], object]) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(Path(tmp))
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with open(path, "a+b") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _try_load(kind: str, weights: Path, metrics_path: Path, say: Log) -> tuple[nn.Module, dict] | None:
    # The .json is written after the .pt, so its presence means both are complete.
    if not (metrics_path.is_file() and weights.is_file()):
        return None
    try:
        metrics = json.loads(metrics_path.read_text(encoding="utf-8"))
        model = build_model(kind)
        state = torch.load(weights, map_location="cpu", weights_only=True)
        model.load_state_dict(state, strict=True)
    except Exception as exc:  # stale or damaged cache entry: retrain
        say(f"fmnist-{kind}: cannot load {weights} ({exc}); retraining")
        return None
    model.eval()
    return model, metrics


def load_fmnist_model(
    kind: str = "target", *, cache_dir: Path | None = None, log: Log | None = None,
    force: bool = False,
) -> tuple[nn.Module, dict]:
    """The trained ``kind`` model (eval mode) and its training metrics; trains on first use."""
    build_model(kind)  # validate kind
    say = log or (lambda _msg: None)
    weights, metrics_path = model_paths(kind, cache_dir)
    if not force and (hit := _try_load(kind, weights, metrics_path, say)) is not None:
        return hit
    weights.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(weights.with_suffix(".lock")):
        if not force and (hit := _try_load(kind, weights, metrics_path, say)) is not None:
            return hit  # another process trained it while we waited
        say(f"fmnist-{kind}: training (cache {weights.parent})")
        model, metrics = train(kind, seed=DEFAULT_SEEDS[kind], log=say)
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        _atomic_write(weights, lambda p: torch.save(state, p))
        _atomic_write(metrics_path, lambda p: p.write_text(
            json.dumps(metrics, indent=2, sort_keys=True) + "\n", encoding="utf-8"))
    model.eval()
    return model, metrics
