"""Real models on real data: Fashion-MNIST CNNs (trained once per machine) and MobileNetV2.

The Fashion-MNIST models come from the default cache (``$FORTIS_CACHE/models``); the first
run on a machine trains them (~100 s on 2 cores), later runs load them.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from fortis.adapters.torch_models import datasets, fmnist
from fortis.adapters.torch_models.classifier import (
    InputSpec,
    TorchClassifier,
    fmnist_classifier,
    mobilenet_classifier,
)
from fortis.adapters.torch_models.datasets import (
    FASHION_MNIST_CLASSES,
    load_fashion_mnist,
    load_imagenet_photos,
)
from fortis.adapters.torch_models.fmnist import evaluate, load_fmnist_model, model_paths, train
from fortis.adapters.torch_models.mobilenet import (
    IMAGENET_CLASSES,
    MobileNetV2,
    load_mobilenet_v2,
    mobilenet_v2_weights_path,
    preprocess_photo,
)


# --------------------------------------------------------------------------- data
@pytest.mark.parametrize(("split", "n"), [("train", 60_000), ("test", 10_000)])
def test_load_fashion_mnist(split: str, n: int) -> None:
    x, y = load_fashion_mnist(split)
    assert x.shape == (n, 28, 28, 1) and x.dtype == np.uint8
    assert y.shape == (n,) and y.dtype == np.int64
    assert y.min() == 0 and y.max() == 9
    assert np.bincount(y).tolist() == [n // 10] * 10  # Fashion-MNIST is balanced
    assert 0.2 < x.mean() / 255 < 0.4
    assert len(FASHION_MNIST_CLASSES) == 10
    xs, ys = load_fashion_mnist(split, limit=5, offset=7)
    assert np.array_equal(xs, x[7:12]) and np.array_equal(ys, y[7:12])
    xs[0, 0, 0, 0] = 1  # writable copy


def test_load_fashion_mnist_missing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(datasets, "FASHION_MNIST_DIR", tmp_path)
    with pytest.raises(FileNotFoundError, match="apt-get install dataset-fashion-mnist"):
        load_fashion_mnist("test")
    with pytest.raises(ValueError):
        load_fashion_mnist("validation")


# --------------------------------------------------------------------------- Fashion-MNIST CNNs
@pytest.fixture(scope="module")
def test_set() -> tuple[np.ndarray, np.ndarray]:
    return load_fashion_mnist("test")


@pytest.fixture(scope="module")
def target_model() -> tuple[torch.nn.Module, dict]:
    return load_fmnist_model("target", log=print)


@pytest.fixture(scope="module")
def surrogate_model() -> tuple[torch.nn.Module, dict]:
    return load_fmnist_model("surrogate", log=print)


def test_target_accuracy(target_model, test_set) -> None:
    model, metrics = target_model
    accuracy = evaluate(model, *test_set)  # recomputed on all 10k, not read from the json
    print(f"target: test accuracy {accuracy:.4f}, trained in {metrics['train_seconds']} s")
    assert accuracy >= 0.88
    assert not model.training
    assert metrics["n_test"] == 10_000 and metrics["n_train"] == 60_000


def test_surrogate_accuracy(surrogate_model, test_set) -> None:
    model, metrics = surrogate_model
    accuracy = evaluate(model, *test_set)
    print(f"surrogate: test accuracy {accuracy:.4f}, trained in {metrics['train_seconds']} s")
    assert accuracy >= 0.85
    assert type(model) is fmnist.SurrogateCNN


def test_cache_reload_identical(target_model, surrogate_model, test_set) -> None:
    x = torch.from_numpy(test_set[0][:256]).permute(0, 3, 1, 2).float() / 255
    robust_model = load_fmnist_model("robust", log=print)
    for kind, (model, metrics) in (("target", target_model), ("surrogate", surrogate_model),
                                   ("robust", robust_model)):
        weights, metrics_path = model_paths(kind)
        assert weights.is_file() and metrics_path.is_file()
        again, metrics2 = load_fmnist_model(kind)
        assert metrics2 == metrics
        with torch.inference_mode():
            assert torch.equal(model(x), again(x))


@pytest.mark.parametrize("kind", fmnist.KINDS)
def test_training_is_deterministic(kind: str) -> None:
    def run(seed: int) -> tuple[torch.nn.Module, dict]:
        return train(kind, seed=seed, epochs=1, n_train=2000, n_test=500)

    (a, ma), (b, mb) = run(7), run(7)
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert ma["test_accuracy"] == mb["test_accuracy"]
    assert ma["n_train"] == 2000 and ma["n_test"] == 500 and ma["epochs"] == 1
    c, _ = run(8)
    last = [k for k in sa if k.endswith("weight")][-1]  # the final linear layer
    assert not torch.equal(sa[last], c.state_dict()[last])
    # training leaves global torch settings as they were
    assert not torch.are_deterministic_algorithms_enabled()


def test_robust_kind_is_the_target_cnn_trained_on_fgsm_rs_examples() -> None:
    """"robust" (built-in fmnist-cnn-at): the target's architecture; its training batches are
    FGSM examples from a random start (Wong et al. 2020), within the bound and [0, 1], drawn
    from the training generator (deterministic), and different from the clean batch."""
    target, robust = fmnist.build_model("target"), fmnist.build_model("robust")
    assert type(robust) is type(target) is fmnist.FashionCNN
    assert {k: v.shape for k, v in robust.state_dict().items()} == {
        k: v.shape for k, v in target.state_dict().items()}
    assert fmnist.AT_STEP == pytest.approx(1.25 * fmnist.AT_EPSILON)
    assert fmnist.ADVERSARIAL_KINDS == {"robust"} <= set(fmnist.KINDS)
    x, y = load_fashion_mnist("train", limit=64)
    xb = torch.from_numpy(x).permute(0, 3, 1, 2).float() / 255
    yb = torch.from_numpy(y)
    torch.manual_seed(0)
    robust.train()

    def craft(seed: int) -> torch.Tensor:
        torch.manual_seed(0)      # dropout masks
        return fmnist._fgsm_rs(robust, xb, yb, torch.Generator().manual_seed(seed))

    adv = craft(5)
    assert adv.shape == xb.shape and not adv.requires_grad
    assert float((adv - xb).abs().max()) <= fmnist.AT_EPSILON + 1e-6
    assert float(adv.min()) >= 0.0 and float(adv.max()) <= 1.0
    assert float((adv - xb).abs().mean()) > fmnist.AT_EPSILON / 4   # a real perturbation
    assert torch.equal(adv, craft(5)) and not torch.equal(adv, craft(6))
    assert all(p.grad is None for p in robust.parameters())       # crafting trains nothing
    _, metrics = train("robust", seed=0, epochs=1, n_train=256, n_test=64)
    assert metrics["adversarial_training"] == {"method": "fgsm-rs", "epsilon": fmnist.AT_EPSILON,
                                               "step": fmnist.AT_STEP}
    assert "adversarial_training" not in train("target", seed=0, epochs=1, n_train=256,
                                               n_test=64)[1]


def test_cache_trains_once_and_atomically(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls: list[str] = []
    real_train = fmnist.train

    def cheap_train(kind: str, **kwargs):
        calls.append(kind)
        kwargs.update(epochs=1, n_train=1000, n_test=200)
        return real_train(kind, **kwargs)

    monkeypatch.setattr(fmnist, "train", cheap_train)
    results: list[tuple[torch.nn.Module, dict]] = []
    threads = [threading.Thread(target=lambda: results.append(
        load_fmnist_model("surrogate", cache_dir=tmp_path))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == ["surrogate"] and len(results) == 3
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")) == [
        "fmnist-surrogate-v1.json", "fmnist-surrogate-v1.pt"]
    x = torch.rand(8, 1, 28, 28)
    with torch.inference_mode():
        outs = [m(x) for m, _ in results]
    assert all(torch.equal(outs[0], o) for o in outs[1:])
    # a damaged cache entry is retrained, not trusted
    model_paths("surrogate", tmp_path)[0].write_bytes(b"not a checkpoint")
    load_fmnist_model("surrogate", cache_dir=tmp_path)
    assert calls == ["surrogate", "surrogate"]


# --------------------------------------------------------------------------- MobileNetV2
@pytest.fixture(scope="module")
def mobilenet() -> TorchClassifier:
    return mobilenet_classifier()


def test_mobilenet_state_dict_loads_strictly() -> None:
    state = torch.load(mobilenet_v2_weights_path(), map_location="cpu", weights_only=True)
    result = MobileNetV2().load_state_dict(state, strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    wrapped = load_mobilenet_v2()
    assert not wrapped.training
    assert len(IMAGENET_CLASSES) == 1000 == len(set(IMAGENET_CLASSES))
    assert IMAGENET_CLASSES[281] == "tabby" and IMAGENET_CLASSES[22] == "bald eagle"


def test_mobilenet_photos_top5(mobilenet: TorchClassifier) -> None:
    photos = load_imagenet_photos()
    assert len(photos) >= 6, [p.image_id for p in photos]
    batch = np.stack([preprocess_photo(p.image) for p in photos])
    proba = mobilenet.predict_proba(batch)
    top5 = np.argsort(-proba, axis=1)[:, :5]
    top1_hits = 0
    misses = []
    for photo, row in zip(photos, top5, strict=True):
        top1_hits += int(row[0] in photo.labels)
        names = [IMAGENET_CLASSES[i] for i in row]
        print(f"{photo.image_id:20s} top-1 {'ok ' if row[0] in photo.labels else 'no '} {names}")
        if not set(row.tolist()) & set(photo.labels):
            misses.append((photo.image_id, names))
    print(f"top-1 {top1_hits}/{len(photos)}")
    assert not misses
    assert top1_hits >= len(photos) // 2


def test_preprocess_photo() -> None:
    rgb = np.random.default_rng(0).integers(0, 256, (300, 451, 3), dtype=np.uint8)
    out = preprocess_photo(rgb)
    assert out.shape == (224, 224, 3) and out.dtype == np.uint8
    assert preprocess_photo(rgb[:, :, 0]).shape == (224, 224, 3)
    assert preprocess_photo(rgb[:100, :80]).shape == (224, 224, 3)  # upscaling


# --------------------------------------------------------------------------- TorchClassifier
def test_classifier_fmnist(test_set) -> None:
    clf = fmnist_classifier("target")
    x, y = test_set
    proba = clf.predict_proba(x[:300])
    assert proba.shape == (300, 10) and proba.dtype == np.float32
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, atol=1e-5)
    assert (proba.argmax(1) == y[:300]).mean() >= 0.85
    assert clf.class_names == FASHION_MNIST_CLASSES and clf.input_spec.channels == 1
    # RGB at another size is converted to 28 x 28 grey
    rgb = np.repeat(x[:4], 3, axis=3)
    big = np.stack([np.kron(im, np.ones((2, 2, 1), dtype=np.uint8)) for im in rgb])
    assert clf.to_model_input(big).shape == (4, 1, 28, 28)
    np.testing.assert_allclose(clf.predict_proba(big).sum(axis=1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(clf.to_model_input(rgb), clf.to_model_input(x[:4]))
    with pytest.raises(ValueError):
        clf.predict_proba(x[:2].astype(np.float32))
    with pytest.raises(ValueError):
        clf.predict_proba(x[0])


def test_classifier_mobilenet_any_size(mobilenet: TorchClassifier) -> None:
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (3, 64, 48, 3), dtype=np.uint8)
    t = mobilenet.to_model_input(images)
    assert t.shape == (3, 3, 224, 224) and t.dtype == torch.float32
    assert 0.0 <= float(t.min()) and float(t.max()) <= 1.0
    proba = mobilenet.predict_proba(images)
    assert proba.shape == (3, 1000) and proba.dtype == np.float32
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, atol=1e-4)
    grey = rng.integers(0, 256, (2, 300, 200, 1), dtype=np.uint8)
    assert mobilenet.predict_proba(grey).shape == (2, 1000)
    assert len(mobilenet.predict_proba(images[:0])) == 0


def test_input_spec_validation() -> None:
    with pytest.raises(ValueError):
        InputSpec(height=28, width=28, channels=2)
    with pytest.raises(TypeError):
        InputSpec(28, 28, 1)  # type: ignore[misc]
