"""A tenant's detector or segmenter surrogate (IEEE-A7 on IEEE-C4 / C5 targets): the declared
output mapping validated field by field at plan time, carried unchanged from the evaluation
service's message to the perturbation service's, checked on the model when it is loaded, and
attacked with its task loss.

Real models throughout: small conv nets exported to TorchScript and ONNX here, a segmenter
trained for a few steps on generated squares (PGD on it then lowers its own IoU)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from fortis.services.common.errors import InvalidArgument
from fortis.services.common.surrogates import SurrogateSpec, parse_definition, spec_of
from torch import nn

BLOB = "sha256:" + "a" * 64
DET = {"name": "my-det", "model": BLOB, "task": "detection",
       "input": {"height": 32, "width": 32, "channels": 3}, "labels": ["face"],
       "outputs": {"boxes": {"output": 0, "units": "normalised"},
                   "scores": {"output": 1, "kind": "logit"}}}
SEG = {"name": "my-seg", "model": BLOB, "task": "segmentation",
       "input": {"height": 32, "width": 32, "channels": 3},
       "labels": ["background", "square"],
       "outputs": {"mask": {"output": 0, "kind": "class_logits"}}}


def _fields(doc: dict[str, Any]) -> list[str]:
    defn, problems = parse_definition(doc, "s")
    assert defn is None, defn
    return [p.field for p in problems]


def _with(base: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return {**base, **kw}


def test_output_mappings_are_checked_field_by_field():
    defn, problems = parse_definition(_with(DET, outputs={"boxes": 0, "scores": 1}), "s")
    assert not problems and defn is not None
    assert defn.outputs.boxes == 0 and not defn.outputs.boxes_normalised
    assert not defn.outputs.scores_are_logits            # defaults: pixels, probabilities
    assert _fields(_with(DET, outputs={"scores": 1})) == ["s.outputs.boxes"]
    assert _fields(_with(DET, outputs={})) == ["s.outputs.boxes", "s.outputs.scores"]
    assert _fields(_with(DET, outputs={"boxes": 0, "scores": 1, "labels": 2,
                                       "class_logits": 3})) == ["s.outputs.class_logits"]
    assert _fields(_with(DET, labels=["face", "hand"])) == ["s.outputs"]   # whose class?
    assert _fields(_with(DET, outputs={"boxes": 0, "scores": 0})) == ["s.outputs.scores"]
    assert _fields(_with(DET, outputs={"boxes": {"output": 16}, "scores": 1})) == \
        ["s.outputs.boxes.output"]
    assert _fields(_with(DET, outputs={"boxes": {"output": 0, "units": "cm"}, "scores": 1})) \
        == ["s.outputs.boxes.units"]
    assert _fields(_with(DET, outputs={"boxes": 0, "scores": 1, "mask": 2})) == \
        ["s.outputs.mask"]
    assert _fields(_with(DET, outputs={"boxes": {"output": 0, "unit": "px"}, "scores": 1})) \
        == ["s.outputs.boxes.unit"]
    assert _fields(_with(DET, outputs=[0, 1])) == ["s.outputs"]
    assert _fields(_with(SEG, outputs={"mask": 0})) == ["s.outputs.mask.kind"]
    assert _fields(_with(SEG, labels=["a", "b", "c"],
                         outputs={"mask": {"output": 0, "kind": "probability"}})) == ["s.labels"]
    assert _fields(_with(SEG, task="tracking")) == ["s.task"]
    assert _fields(_with(SEG, task="classification")) == ["s.outputs"]   # a classifier
    cls = {k: v for k, v in DET.items() if k not in ("task", "outputs")}
    assert _fields(_with(cls, outputs={"boxes": 0})) == ["s.outputs"]


def test_plans_check_the_surrogate_task_against_the_target(tmp_path):
    from fortis.server.app.stack import local_catalogue
    from fortis.services.evaluation.plan import load_plan

    cat = local_catalogue()
    head = "name: p\nseed: 1\ndataset: {source: manifest, path: m.jsonl, limit: 3}\n"
    det = "detection: {iou_threshold: 0.5}\n"
    own = f"surrogates: [{_flow(DET)}]\n"
    plan = load_plan(head + det + own + "target: {name: haar-face, task: detection}\n"
                     "attacks: [{id: pgd, surrogate: my-det, params: {epsilon: 0.05}}]\n", cat)
    assert plan.surrogates[0].task == "detection" and plan.surrogates[0].outputs.scores == 1
    # a multi-target plan: the tenant's detector stands for one model, a built-in for another
    plan = load_plan(head + det + own + "targets:\n  - {name: haar-face, task: detection, "
                     "surrogate: my-det}\n  - {name: mtcnn, task: detection, surrogate: "
                     "mtcnn-surrogate}\nattacks: [{id: fgsm, params: {epsilon: 0.05}}]\n", cat)
    assert [m.surrogate for m in plan.members] == ["my-det", "mtcnn-surrogate"]
    with pytest.raises(InvalidArgument) as e:        # a detector for a classifier
        load_plan("name: p\nseed: 1\ndataset: {source: fashion-mnist, limit: 3}\n" + own +
                  "target: {name: fmnist-cnn}\n"
                  "attacks: [{id: pgd, surrogate: my-det, params: {epsilon: 0.05}}]\n", cat)
    assert [v.field for v in e.value.violations] == ["attacks[0].surrogate"]
    with pytest.raises(InvalidArgument) as e:        # a classifier for a detector's twin
        load_plan(head + det + "targets:\n  - {name: haar-face, task: detection, surrogate: "
                  "fmnist-surrogate}\n  - {name: mtcnn, task: detection, surrogate: "
                  "u2netp-surrogate}\nattacks: [{id: fgsm, params: {epsilon: 0.05}}]\n", cat)
    assert [v.field for v in e.value.violations] == ["targets[0].surrogate",
                                                     "targets[1].surrogate"]
    with pytest.raises(InvalidArgument) as e:        # the mapping, named at plan time
        load_plan(head + det + f"surrogates: [{_flow(_with(DET, outputs={'boxes': 0}))}]\n"
                  "target: {name: haar-face, task: detection}\n"
                  "attacks: [{id: pgd, surrogate: my-det, params: {epsilon: 0.05}}]\n", cat)
    assert [v.field for v in e.value.violations] == ["surrogates[0].outputs.scores"]


def _flow(doc: Any) -> str:
    import json

    return json.dumps(doc)


def test_the_mapping_travels_unchanged_between_the_services():
    from fortis.services.evaluation.clients import surrogate_model
    from fortis.services.perturbation.servicer import surrogate_spec

    for doc, labels in ((_with(DET, outputs={"boxes": 2, "scores": {"output": 0},
                                             "class_logits": 1}, labels=["face", "hand"]),
                         ["hand", "face"]),
                        (SEG, ["background", "square"]),
                        (_with(SEG, outputs={"mask": {"output": 3, "kind": "logit"}}),
                         ["square", "background"])):
        defn, problems = parse_definition(doc, "s")
        assert not problems and defn is not None
        spec = spec_of(defn, labels, "s")
        back = surrogate_spec(surrogate_model(spec), "surrogate_models[0]")
        assert back == spec
        back.check("surrogate_models[0]")


# -- real models ---------------------------------------------------------------------------


class TinyDetector(nn.Module):
    """A grid detector: per 8 x 8 cell of a 32 x 32 input, a box (its cell, normalised), an
    objectness logit and class logits over two classes."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
                                  nn.Conv2d(8, 3, 8, stride=8))
        ii, jj = torch.meshgrid(torch.arange(4), torch.arange(4), indexing="ij")
        self.register_buffer("cells", torch.stack(
            [jj / 4, ii / 4, (jj + 1) / 4, (ii + 1) / 4], -1).reshape(1, 16, 4).float())

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        z = self.body(x).reshape(-1, 3, 16).transpose(1, 2)  # N x 16 x 3
        return z[..., :1] * 0.0 + self.cells, z[..., 0], z[..., 1:]


class TinySegmenter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
                                 nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
                                 nn.Conv2d(8, 2, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def _squares(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """uint8 n x 32 x 32 x 3 images of a brighter square on noise, and its masks (a low
    contrast, as a perturbation bounded by 0.1 can cross)."""
    rng = np.random.default_rng(seed)
    imgs = rng.integers(40, 110, (n, 32, 32, 3)).astype(np.uint8)
    masks = np.zeros((n, 32, 32), np.int64)
    for k in range(n):
        s = int(rng.integers(10, 18))
        y, x = rng.integers(0, 32 - s, 2)
        imgs[k, y:y + s, x:x + s] = rng.integers(120, 170, 3)
        masks[k, y:y + s, x:x + s] = 1
    return imgs, masks


def _save(net: nn.Module, fmt: str, path: Path, outputs: int) -> Path:
    x = torch.zeros(1, 3, 32, 32)
    if fmt == "torchscript":
        torch.jit.save(torch.jit.trace(net.eval(), x), str(path))
    else:
        buf = io.BytesIO()
        names = [f"y{i}" for i in range(outputs)]
        torch.onnx.export(net.eval(), x, buf, dynamo=False, opset_version=17,
                          input_names=["x"], output_names=names,
                          dynamic_axes={"x": {0: "n"}, **{k: {0: "n"} for k in names}})
        path.write_bytes(buf.getvalue())
    return path


def _spec(doc: dict[str, Any], target: list[str]) -> SurrogateSpec:
    defn, problems = parse_definition(doc, "surrogate_models[0]")
    assert not problems and defn is not None, problems
    return spec_of(defn, target, "surrogate_models[0]")


@pytest.mark.parametrize("fmt", ["torchscript", "onnx"])
def test_a_detector_loads_with_its_outputs_checked_and_has_a_task_loss(tmp_path, fmt):
    from fortis.adapters.torch_models.surrogate import load_surrogate
    from fortis.services.perturbation.criteria import ObjectMissed, ObjectRelabelled
    from fortis.services.perturbation.judges import BoxReference

    path = _save(TinyDetector(), fmt, tmp_path / f"det.{fmt}", 3)
    doc = _with(DET, labels=["face", "hand"], format=fmt,
                outputs={"boxes": {"output": 0, "units": "normalised"},
                         "scores": {"output": 1, "kind": "logit"}, "class_logits": 2})
    sur = load_surrogate(path, _spec(doc, ["hand", "face"]), "surrogate_models[0].model")
    assert sur.task == "detection" and sur.input_spec is None
    x = torch.rand(2, 3, 48, 64, requires_grad=True)     # any image size: resized inside
    refs = [BoxReference.of([[0, 0, 20, 20]], [1]), BoxReference.of(np.zeros((0, 4)), [])]
    loss = sur.task_loss(x, refs, ObjectMissed(iou_threshold=0.5, score_threshold=0.5))
    assert loss.shape == (2,)
    (g,) = torch.autograd.grad(loss.sum(), x)
    assert g[0].abs().sum() > 0 and g[1].abs().sum() > 0
    boxes, _, logp, _ = sur.detections(x.detach())
    assert boxes.shape == (2, 16, 4) and float(boxes[..., 2].max()) == pytest.approx(64.0)
    assert logp is not None and logp.shape == (2, 16, 2)      # the target's two classes
    relabel = sur.task_loss(x, refs[:1], ObjectRelabelled(target=0))
    assert torch.isfinite(relabel).all()
    # outputs that do not match the declaration are refused naming the output
    bad = {"surrogate_models[0].outputs.scores": {"scores": {"output": 2, "kind": "logit"},
                                                   "class_logits": 1},
           "surrogate_models[0].outputs.boxes": {"boxes": 1, "scores": 0, "class_logits": 2}}
    for field, outs in bad.items():
        d = _with(doc, outputs={"boxes": 0, **outs})
        with pytest.raises(InvalidArgument) as e:
            load_surrogate(path, _spec(d, ["hand", "face"]), "surrogate_models[0].model")
        assert e.value.violations[0].field == field, (field, e.value)
    with pytest.raises(InvalidArgument) as e:       # one class logit per label
        load_surrogate(path, _spec(_with(doc, labels=["face", "hand", "foot"]),
                                   ["hand", "face"]), "surrogate_models[0].model")
    assert e.value.violations[0].field == "surrogate_models[0].outputs.class_logits"
    with pytest.raises(InvalidArgument) as e:       # a position past the model's outputs
        load_surrogate(path, _spec(_with(doc, outputs={"boxes": 0, "scores": 7,
                                                       "class_logits": 2}), ["hand", "face"]),
                       "surrogate_models[0].model")
    assert e.value.violations[0].field == "surrogate_models[0].outputs.scores"
    one = _with(doc, labels=["face"], outputs={"boxes": 0, "scores": {"output": 1,
                                                                      "kind": "logit"}})
    sur1 = load_surrogate(path, _spec(one, ["face"]), "surrogate_models[0].model")
    with pytest.raises(InvalidArgument) as e:
        sur1.task_loss(x, refs[:1], ObjectRelabelled(target=0))
    assert e.value.violations[0].field == "criterion"


def test_pgd_on_a_trained_segmenter_surrogate_lowers_its_own_iou(tmp_path):
    from fortis.adapters.torch_models.surrogate import load_surrogate
    from fortis.services.common.matching import iou_per_class
    from fortis.services.perturbation import engine

    net = TinySegmenter()
    imgs, masks = _squares(64, 1)
    x = torch.from_numpy(imgs).float().div(255).permute(0, 3, 1, 2)
    y = torch.from_numpy(masks)
    opt = torch.optim.Adam(net.parameters(), lr=0.02)
    for _ in range(60):
        opt.zero_grad()
        F.cross_entropy(net(x), y).backward()
        opt.step()
    path = _save(net, "torchscript", tmp_path / "seg.pt", 1)
    sur = load_surrogate(path, _spec(SEG, ["background", "square"]),
                         "surrogate_models[0].model")
    test, tmask = _squares(6, 2)
    clean = iou_per_class(sur.class_map(test), tmask, np.array([1]), 255)[:, 0]
    items = [engine.AttackItem(image_id=str(k), image=test[k], labels=(), objects=None,
                               mask=tmask[k]) for k in range(len(test))]
    res = engine.run_attack("pgd", {"epsilon": 0.1, "steps": 10}, 3, items, surrogate=sur,
                            criterion={"kind": "miou_below",
                                       "segmentation": {"classes": [1], "miou_threshold": 0.5}})
    adv = np.stack([r.adversarial for r in res])
    assert np.abs(adv.astype(np.int64) - test).max() <= int(0.1 * 255)
    after = iou_per_class(sur.class_map(adv), tmask, np.array([1]), 255)[:, 0]
    print(f"\n[tiny segmenter] IoU of the square, clean {np.round(clean, 3).tolist()} -> "
          f"PGD 0.1 x10 {np.round(after, 3).tolist()}")
    assert clean.mean() > 0.7 and after.mean() < clean.mean() - 0.25
    # the declared output must hold one logit per label
    with pytest.raises(InvalidArgument) as e:
        load_surrogate(path, _spec(_with(SEG, labels=["a", "b", "c"]), ["a", "b", "c"]),
                       "surrogate_models[0].model")
    assert e.value.violations[0].field == "surrogate_models[0].outputs.mask"
