"""Tenant surrogates (IEEE-A7 transfer attacks on a model the tester supplies; IEEE-P6 label
mapping between the surrogate's and the target's label sets), with real models and files:

- a TorchScript and an ONNX file (exported here with torch.jit / torch.onnx) load as one
  differentiable module: normalisation -> model -> target-space logits (logsumexp over the
  surrogate classes mapped to each target class, many-to-one included);
- the ONNX export of the project's trained Fashion-MNIST surrogate, converted by onnx2torch,
  gives the same logits as the torch original, and FGSM / PGD crafted through it (the real
  engine) lower its accuracy: gradients flow through the converted graph;
- every hostile definition is refused naming its field (NaN / negative std, huge inputs,
  label_map to unknown labels, built-in names, a repeated name, unmapped true labels);
- uploads accept ONNX by content and still refuse anything else;
- the built-in EfficientNet-Lite0 loads offline and classifies the offline ImageNet photos.
"""

from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from fortis.adapters.torch_models.surrogate import (
    UNMAPPED_LOGIT,
    OperatorSurrogates,
    SurrogateCache,
    TenantSurrogates,
    load_surrogate,
)
from fortis.infra.storage.blobs import UploadChecks
from fortis.services.common.errors import InvalidArgument
from fortis.services.common.surrogates import (
    SurrogateSpec,
    parse_definition,
    resolve_label_map,
    spec_of,
)
from fortis.services.perturbation import engine
from fortis.services.perturbation.surrogates import check_mapped_labels, resolve_surrogates


class Tiny(torch.nn.Module):
    """4 logits from a 1 x 8 x 8 image (a fixed random net, seeded)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(1, 3, 3)
        self.fc = torch.nn.Linear(3 * 6 * 6, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x)).flatten(1))


def _onnx_bytes(model: torch.nn.Module, shape: tuple[int, ...]) -> bytes:
    buf = io.BytesIO()
    torch.onnx.export(model.eval(), torch.zeros(1, *shape), buf, dynamo=False,
                      input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "n"}, "y": {0: "n"}})
    return buf.getvalue()


def _script_bytes(model: torch.nn.Module) -> bytes:
    buf = io.BytesIO()
    torch.jit.save(torch.jit.script(model.eval()), buf)
    return buf.getvalue()


def _spec(**kw: object) -> SurrogateSpec:
    base: dict[str, object] = dict(name="tiny", model="sha256:" + "a" * 64, height=8, width=8,
                                   channels=1, mean=(0.5,), std=(0.25,),
                                   labels=("a", "b", "c", "d"),
                                   mapping=((0, 0), (1, 0), (2, 2)), target_classes=3)
    base.update(kw)
    return SurrogateSpec(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize("fmt", ["torchscript", "onnx"])
def test_both_formats_load_and_map_labels_by_logsumexp(tmp_path: Path, fmt: str) -> None:
    net = Tiny().eval()
    path = tmp_path / "m"
    path.write_bytes(_script_bytes(net) if fmt == "torchscript" else _onnx_bytes(net, (1, 8, 8)))
    spec = _spec()
    for declared in ("", fmt):               # detected from the content, or declared
        s = load_surrogate(path, SurrogateSpec(**{**spec.__dict__, "format": declared}), "m")
        x = torch.rand(5, 1, 8, 8, generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            z = net((x - 0.5) / 0.25)
            out = s.model(x)
        assert out.shape == (5, 3)
        # target 0 <- surrogate 0 and 1 (many-to-one), 1 <- none, 2 <- surrogate 2
        assert torch.allclose(out[:, 0], torch.logsumexp(z[:, :2], dim=1), atol=1e-5)
        assert torch.all(out[:, 1] == UNMAPPED_LOGIT)
        assert torch.allclose(out[:, 2], z[:, 2], atol=1e-5)
        assert s.mapped_targets == {0, 2} and s.input_spec.channels == 1
        # gradients reach the input through the mapping (and no NaN from the unmapped class)
        xg = x.clone().requires_grad_(True)
        loss = torch.nn.functional.cross_entropy(s.model(xg), torch.tensor([0, 2, 0, 2, 0]))
        (g,) = torch.autograd.grad(loss, xg)
        assert torch.isfinite(g).all() and float(g.abs().sum()) > 0
    wrong = "onnx" if fmt == "torchscript" else "torchscript"
    with pytest.raises(InvalidArgument) as e:
        load_surrogate(path, SurrogateSpec(**{**spec.__dict__, "format": wrong}), "m.model")
    assert e.value.violations[0].field == "m.model"


def test_a_model_that_does_not_fit_the_definition_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "m"
    path.write_bytes(_onnx_bytes(Tiny(), (1, 8, 8)))
    with pytest.raises(InvalidArgument) as e:      # 5 labels declared, the model has 4 logits
        load_surrogate(path, _spec(labels=("a", "b", "c", "d", "e")), "surrogate_models[0].model")
    assert e.value.violations[0].field == "surrogate_models[0].model"
    assert "5 logits" in str(e.value)
    with pytest.raises(InvalidArgument) as e:      # declared 16 x 16 input: the model breaks
        load_surrogate(path, _spec(height=16, width=16), "surrogate_models[0].model")
    assert e.value.violations[0].field == "surrogate_models[0].model"
    junk = tmp_path / "junk"
    junk.write_bytes(b"\x08\x09\x12\x03abc")        # ONNX-looking start, not a model
    with pytest.raises(InvalidArgument) as e:
        load_surrogate(junk, _spec(), "f")
    assert "ONNX" in str(e.value)


def test_onnx_fmnist_surrogate_matches_torch_and_attacks_lower_its_accuracy(
        tmp_path: Path, fmnist_surrogate, fmnist_test_images) -> None:
    x, y = fmnist_test_images
    x, y = x[:64], y[:64]
    path = tmp_path / "fm.onnx"
    path.write_bytes(_onnx_bytes(fmnist_surrogate.model, (1, 28, 28)))
    from fortis.adapters.torch_models.datasets import FASHION_MNIST_CLASSES
    spec = SurrogateSpec(name="my-net", model="f", format="onnx", height=28, width=28,
                         channels=1, labels=FASHION_MNIST_CLASSES,
                         mapping=tuple((i, i) for i in range(10)), target_classes=10)
    sur = load_surrogate(path, spec, "m")
    t = fmnist_surrogate.to_model_input(x)
    with torch.no_grad():
        assert torch.allclose(sur.model(t), torch.log_softmax(fmnist_surrogate.model(t), 1)
                              + torch.logsumexp(fmnist_surrogate.model(t), 1, keepdim=True),
                              atol=1e-3)

    def acc(images: np.ndarray) -> float:
        with torch.no_grad():
            return float((sur.model(fmnist_surrogate.to_model_input(images)).argmax(1).numpy()
                          == y).mean())

    items = [engine.AttackItem(image_id=f"i{i}", image=x[i], labels=(int(y[i]),))
             for i in range(len(x))]
    clean = acc(x)
    for attack, params in (("fgsm", {"epsilon": 0.1}), ("pgd", {"epsilon": 0.1, "steps": 5})):
        res = engine.run_attack(attack, params, 0, items, surrogate=sur)
        adv = np.stack([r.adversarial for r in res])
        assert max(r.linf for r in res) <= 0.1 + 1 / 255
        assert acc(adv) < clean - 0.4, (attack, clean, acc(adv))


def test_definitions_are_checked_field_by_field() -> None:
    good = {"name": "my-net", "model": "sha256:" + "b" * 64, "format": "onnx",
            "input": {"height": 28, "width": 28, "channels": 1}, "mean": [0.286],
            "std": [0.353], "labels": ["x", "y", "z"], "label_map": {"x": 0, "1": "T", 2: 1}}
    defn, problems = parse_definition(good, "surrogates[0]")
    assert problems == [] and defn is not None
    mapping, problems = resolve_label_map(defn, ["S", "T"], "surrogates[0]")
    assert mapping == ((0, 0), (1, 1), (2, 1)) and problems == []     # by name and index
    hostile = [
        ({"std": [float("nan")]}, "surrogates[0].std[0]"),
        ({"std": [-0.5]}, "surrogates[0].std[0]"),
        ({"mean": [float("inf")]}, "surrogates[0].mean[0]"),
        ({"mean": [0.1, 0.2]}, "surrogates[0].mean"),
        ({"input": {"height": 10**6, "width": 28, "channels": 1}}, "surrogates[0].input.height"),
        ({"input": {"height": 28, "width": 0, "channels": 1}}, "surrogates[0].input.width"),
        ({"input": {"height": 28, "width": 28, "channels": 2}}, "surrogates[0].input.channels"),
        ({"name": "fmnist-surrogate"}, "surrogates[0].name"),
        ({"name": "../x"}, "surrogates[0].name"),
        ({"model": "/etc/passwd"}, "surrogates[0].model"),
        ({"format": "pickle"}, "surrogates[0].format"),
        ({"labels": ["x", "x"]}, "surrogates[0].labels[1]"),
        ({"labels": []}, "surrogates[0].labels"),
        ({"path": "/tmp/m"}, "surrogates[0].path"),
    ]
    for change, field in hostile:
        _, problems = parse_definition({**good, **change}, "surrogates[0]")
        assert field in [p.field for p in problems], (change, problems)
    for lm, field in (({"nope": 0}, "surrogates[0].label_map.nope"),
                      ({"x": "no-such-target"}, "surrogates[0].label_map.x"),
                      ({"x": 7}, "surrogates[0].label_map.x")):
        d, _ = parse_definition({**good, "label_map": lm}, "surrogates[0]")
        assert d is not None
        _, problems = resolve_label_map(d, ["S", "T"], "surrogates[0]")
        assert [p.field for p in problems] == [field]
    d, _ = parse_definition({**good, "label_map": None}, "surrogates[0]")
    assert d is not None
    with pytest.raises(InvalidArgument) as e:              # no name in common, no map
        spec_of(d, ["S", "T"], "surrogates[0]")
    assert e.value.violations[0].field == "surrogates[0].label_map"


def test_resolution_refuses_clashes_repeats_and_unmapped_labels(tmp_path: Path) -> None:
    loaded: list[str] = []

    def builtin(name: str, field: str) -> object:
        if name != "fmnist-surrogate":
            raise InvalidArgument(field, f"unknown built-in model '{name}'")
        loaded.append(name)
        return object()

    spec = _spec(name="mine")
    with pytest.raises(InvalidArgument) as e:
        resolve_surrogates("x", [], [_spec(name="fmnist-surrogate")], builtin=builtin,
                           tenant=None, reserved=("fmnist-surrogate",))
    assert e.value.violations[0].field == "surrogate_models[0].name"
    with pytest.raises(InvalidArgument) as e:
        resolve_surrogates("mine", [], [spec, spec], builtin=builtin, tenant=None)
    assert e.value.violations[0].field == "surrogate_models[1].name"
    with pytest.raises(InvalidArgument) as e:
        resolve_surrogates("mine", ["fmnist-surrogate", "mine"], [spec], builtin=builtin,
                           tenant=lambda s, f: s)
    assert e.value.violations[0].field == "ensemble[1]"
    with pytest.raises(InvalidArgument) as e:
        resolve_surrogates("mine", ["nope"], [spec], builtin=builtin, tenant=lambda s, f: s)
    assert e.value.violations[0].field == "ensemble[0]"
    with pytest.raises(InvalidArgument) as e:              # NaN std from a raw request
        resolve_surrogates("mine", [], [_spec(name="mine", std=(float("nan"),))],
                           builtin=builtin, tenant=lambda s, f: s)
    assert e.value.violations[0].field == "surrogate_models[0].std[0]"
    with pytest.raises(InvalidArgument) as e:
        resolve_surrogates("mine", [], [_spec(name="mine", mapping=((9, 0),))],
                           builtin=builtin, tenant=lambda s, f: s)
    assert e.value.violations[0].field == "surrogate_models[0].label_map[0].surrogate_label"
    first, rest = resolve_surrogates("mine", ["fmnist-surrogate"], [spec], builtin=builtin,
                                     tenant=lambda s, f: (s.name, f))
    assert first == ("mine", "surrogate_models[0]") and len(rest) == 1

    path = tmp_path / "m"
    path.write_bytes(_onnx_bytes(Tiny(), (1, 8, 8)))
    sur = load_surrogate(path, spec, "m")
    check_mapped_labels([sur], [(0,), (2, 1)])
    with pytest.raises(InvalidArgument) as e:
        check_mapped_labels([sur], [(0,), (1,)])           # target label 1 has no class
    assert e.value.violations[0].field == "images[1].labels"


def test_tenant_cache_is_bounded_and_checks_the_blob_first(tmp_path: Path) -> None:
    path = tmp_path / "m"
    path.write_bytes(_script_bytes(Tiny()))
    owners = {("a", "sha256:" + "a" * 64): path}

    def path_of(tenant: str, blob: str, field: str) -> Path:
        if (tenant, blob) not in owners:
            raise InvalidArgument(field, "no such upload of this tenant")
        return owners[(tenant, blob)]

    cache = SurrogateCache(size=2)
    ts = TenantSurrogates(path_of, cache)
    a1 = ts.load("a", _spec(), "surrogate_models[0]")
    assert ts.load("a", _spec(), "surrogate_models[0]") is a1 and cache.loads == 1
    with pytest.raises(InvalidArgument) as e:              # another tenant: not found
        ts.load("b", _spec(), "surrogate_models[0]")
    assert e.value.violations[0].field == "surrogate_models[0].model"
    for k in range(3):
        ts.load("a", _spec(mean=(0.1 * k,)), "surrogate_models[0]")
    assert len(cache) == 2


def test_operator_folder_names_behave_like_builtins(tmp_path: Path) -> None:
    (tmp_path / "tiny.onnx").write_bytes(_onnx_bytes(Tiny(), (1, 8, 8)))
    (tmp_path / "op-net.json").write_text(
        '{"model": "tiny.onnx", "input": {"height": 8, "width": 8, "channels": 1}, '
        '"labels": ["a", "b", "c", "d"], "label_map": {"a": 0, "b": 1, "c": 1, "d": 2}}')
    (tmp_path / "evil.json").write_text(
        '{"model": "../etc/passwd", "input": {"height": 8, "width": 8, "channels": 1}, '
        '"labels": ["a"]}')
    ops = OperatorSurrogates(tmp_path)
    assert ops.names() == ["evil", "op-net"] and "op-net" in ops
    s = ops.load("op-net")
    assert s.name == "op-net" and s.spec.target_classes == 3 and s.mapped_targets == {0, 1, 2}
    assert ops.load("op-net") is s
    with pytest.raises(InvalidArgument) as e:
        ops.load("evil")
    assert "model" in e.value.violations[0].field


def test_uploads_take_onnx_and_torchscript_by_content() -> None:
    onnx_data = _onnx_bytes(Tiny(), (1, 8, 8))
    for data in (onnx_data, _script_bytes(Tiny())):
        for step in (1, 2, len(data)):                      # any chunking
            c = UploadChecks(kind="model", size=len(data), media_type="", expected_hex="")
            for i in range(0, len(data), step):
                c.accept(data[i:i + step])
                if i > 8:
                    break
    for bad in (b"not a model", b"\x08\x00\x12", b"\x08\x09\xff", b"GIF89a", b"\x89PNG"):
        c = UploadChecks(kind="model", size=100, media_type="", expected_hex="")
        with pytest.raises(InvalidArgument) as e:
            c.accept(bad)
        assert e.value.violations[0].field == "chunk"


@pytest.mark.slow
def test_efficientnet_lite0_classifies_the_offline_photos() -> None:
    from fortis.adapters.builtin import BUILTIN_MODELS, load_model
    from fortis.adapters.torch_models.datasets import load_imagenet_photos
    from fortis.adapters.torch_models.mobilenet import IMAGENET_CLASSES, preprocess_photo
    from fortis.services.common.surrogates import BUILTIN_SURROGATE_NAMES

    assert set(BUILTIN_MODELS) <= set(BUILTIN_SURROGATE_NAMES)   # no tenant may take them
    model = load_model("efficientnet-lite0")
    assert model.class_names == tuple(IMAGENET_CLASSES) and model.input_spec.height == 224
    photos = load_imagenet_photos()
    assert len(photos) >= 6
    pred = model.predict(np.stack([preprocess_photo(p.image) for p in photos]))
    right = sum(int(c) in p.labels for c, p in zip(pred, photos, strict=True))
    assert right >= math.ceil(0.7 * len(photos)), [IMAGENET_CLASSES[int(c)] for c in pred]
