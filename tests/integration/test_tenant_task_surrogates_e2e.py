"""A tenant's own detector and segmenter as the surrogates of transfer attacks (IEEE-A7 on
IEEE-C4 / IEEE-C5 targets), end to end over real loopback gRPC with the upload API:

- Detection: MTCNN's P-Net (facenet-pytorch's weights) at one scale, wrapped as a detector
  whose outputs are the 12 x 12 windows of its cells (boxes N x K x 4, pixels of its 72 x 72
  input) and their face probabilities (scores N x K), exported to ONNX in the test and
  uploaded by tenant A. A multi-target plan names it the surrogate of ``haar-face`` beside
  ``mtcnn`` with the built-in ``mtcnn-surrogate``: PGD is crafted once on each and sent to
  both models. The P-Net surrogate's own face evidence near the faces collapses (the attack
  follows the declared outputs); each entry of the matrix is re-judged here with the
  scoring service's IEEE-C4 rule on the in-process models' answers to the stored examples.
- Segmentation: the built-in U2-Net-p's own ONNX file, uploaded as a tenant's segmenter whose
  output 0 is the foreground probability, attacks the ``u2netp`` target; the report's verdicts
  are re-judged with the IEEE-C5 rule.
- Every example is within the plan's L-inf bound; tenant B naming A's blob gets exactly what
  an unknown id gets (CreateEvaluation refuses the plan with "no such upload", naming
  ``surrogates[0].model``, before anything runs).
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from fortis.client import FortisClient, progress_of

from tests.conftest import API_KEY, OTHER_KEY
from tests.e2e.test_attacks_tasks import _detection_data, _segmentation_data
from tests.e2e.test_benchmark_tasks_e2e import (
    _detection_correct,
    _segmentation_correct,
    rejudged_mr,
    stored_examples,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SIDE = 72          # the P-Net detector's input: a 31 px face of a 160 px photo is ~14 px
DET = "detection: {mode: threshold, iou_threshold: 0.5, confidence_threshold: 0.5, aggregate: all}"


class PNetDetector(torch.nn.Module):
    """P-Net at one scale as a detector: its cells' windows and face probabilities."""

    def __init__(self, pnet: torch.nn.Module) -> None:
        super().__init__()
        self.p = pnet
        with torch.no_grad():
            h, w = self._map(torch.zeros(1, 3, SIDE, SIDE)).shape[-2:]
        jj, ii = torch.meshgrid(torch.arange(w), torch.arange(h), indexing="xy")
        self.register_buffer("grid", torch.stack(
            [2 * jj, 2 * ii, 2 * jj + 12, 2 * ii + 12], -1).reshape(1, -1, 4).float())

    def _map(self, x: torch.Tensor) -> torch.Tensor:
        p = self.p
        z = p.prelu3(p.conv3(p.prelu2(p.conv2(p.pool1(p.prelu1(p.conv1(x)))))))
        return p.conv4_1(z)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s = F.softmax(self._map(x), dim=1)[:, 1].flatten(1)
        # boxes broadcast by arithmetic (no Shape op: onnx2torch converts none of opset 19)
        return s.unsqueeze(-1) * 0.0 + self.grid, s


def _pnet_onnx() -> bytes:
    from fortis.adapters.vision_targets.mtcnn import _load_mtcnn_module

    net = PNetDetector(_load_mtcnn_module().PNet().eval()).eval()
    buf = io.BytesIO()
    torch.onnx.export(net, torch.zeros(1, 3, SIDE, SIDE), buf, dynamo=False, opset_version=17,
                      input_names=["x"], output_names=["boxes", "scores"],
                      dynamic_axes={"x": {0: "n"}, "boxes": {0: "n"}, "scores": {0: "n"}})
    return buf.getvalue()


def _pnet_definition(blob_id: str) -> dict[str, Any]:
    return {"name": "my-pnet", "model": blob_id, "format": "onnx", "task": "detection",
            "input": {"height": SIDE, "width": SIDE, "channels": 3},
            "mean": [0.5], "std": [0.50196], "labels": ["face"],
            "outputs": {"boxes": {"output": 0, "units": "pixels"},
                        "scores": {"output": 1, "kind": "probability"}}}


def _u2netp_definition(blob_id: str) -> dict[str, Any]:
    return {"name": "my-u2netp", "model": blob_id, "format": "onnx", "task": "segmentation",
            "input": {"height": 320, "width": 320, "channels": 3},
            "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225],
            "labels": ["background", "salient"],
            "outputs": {"mask": {"output": 0, "kind": "probability"}}}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, vision_setup: None) -> Iterator[tuple]:
    from fortis.server.app.stack import StackSettings, TargetConfig, start_stack

    root = tmp_path_factory.mktemp("task-surrogates")
    (root / "det").mkdir()
    (root / "seg").mkdir()
    det = _detection_data(root / "det")
    seg = _segmentation_data(root / "seg")
    s = start_stack(StackSettings(
        state_dir=root / "state", api_keys={API_KEY: "tenant-a", OTHER_KEY: "tenant-b"},
        whitebox_grants={"tenant-a": frozenset({"*"})},  # twins: granted
        data_root=root, targets=[TargetConfig.parse(f"{t}=builtin:{t}")
                                 for t in ("haar-face", "mtcnn", "u2netp")]))
    yield s, root, det, seg
    s.stop(0)


def _report(fc: FortisClient, plan: str) -> tuple[dict[str, Any], str]:
    ev = fc.submit(plan)
    final = fc.wait(ev.evaluation_id, timeout_s=800)
    assert progress_of(final).state == "SUCCEEDED", final.error.message
    return fc.report(ev.evaluation_id), ev.evaluation_id


def test_a_tenant_detector_surrogate_in_a_multi_target_plan(stack, tmp_path):
    from fortis.adapters.torch_models.surrogate import load_surrogate
    from fortis.adapters.vision_targets.haar import HaarFaceTarget
    from fortis.adapters.vision_targets.mtcnn import MtcnnTarget
    from fortis.core.boxes import iou_xyxy as _iou
    from fortis.services.common.surrogates import parse_definition, spec_of

    s, root, (images, truth), _ = stack
    n, eps = len(images), 0.05
    data = _pnet_onnx()
    with FortisClient(s.address, api_key=API_KEY) as fc:
        blob = fc.upload(data, kind="model")
        definition = _pnet_definition(blob.blob_id)
        report, eid = _report(fc, f"""
name: tenant-detector-surrogate
seed: 11
targets:
  - {{name: haar-face, task: detection, surrogate: my-pnet}}
  - {{name: mtcnn, task: detection, surrogate: mtcnn-surrogate}}
dataset: {{source: manifest, path: det/manifest.jsonl, limit: {n}}}
{DET}
surrogates: [{json.dumps(definition)}]
attacks:
  - {{id: pgd, params: {{epsilon: {eps}, steps: 20}}}}
""")
    b = report["benchmark"]
    assert b["sources"] == ["my-pnet", "mtcnn-surrogate"] and b["task"] == "detection"
    test = next(t for t in report["tests"] if t["id"] == "pgd.my-pnet")
    assert test["surrogate"] == "my-pnet"
    models = {"haar-face": HaarFaceTarget(), "mtcnn": MtcnnTarget()}
    figures: dict[str, Any] = {}
    for i, src in enumerate(b["sources"]):
        examples = stored_examples(s, eid, f"pgd.{src}")
        for k, a in examples.items():            # IEEE-A9: within the bound, as sent
            assert a.shape == images[k].shape and a.dtype == np.uint8
            assert np.abs(a.astype(np.int64) - images[k]).max() <= int(eps * 255)
        for j, name in enumerate(b["model_names"]):
            mr, per = rejudged_mr(_detection_correct, models[name], images, truth, examples)
            entry = b["matrix"][0][i][j]
            assert entry == (None if mr is None else pytest.approx(mr)), (src, name, per)
            figures[f"{src}->{name}"] = (entry, per)
    # the attack followed the declared outputs: the surrogate's own face evidence is gone
    path = tmp_path / "pnet.onnx"
    path.write_bytes(data)
    defn, problems = parse_definition(_pnet_definition(blob.blob_id), "surrogates[0]")
    assert not problems and defn is not None
    sur = load_surrogate(path, spec_of(defn, ["face"], "surrogates[0]"), "surrogates[0].model")
    examples = stored_examples(s, eid, "pgd.my-pnet")
    evidence = {}
    for k in ("astronaut", "astronaut-pair"):
        for kind, im in (("clean", images[k]), ("example", examples[k])):
            x = torch.from_numpy(im).float().div(255).permute(2, 0, 1)[None]
            with torch.no_grad():
                boxes, logit, _, _ = sur.detections(x)
            near = (_iou(boxes[0].numpy(), truth[k]) > 0.2).any(axis=1)
            evidence[(k, kind)] = float(torch.sigmoid(logit[0][torch.from_numpy(near)]).max())
        assert evidence[(k, "clean")] > 0.9 and evidence[(k, "example")] < 0.5, evidence
    print(f"\n[tenant detector surrogate] PGD L-inf {eps} x20; MR crafted -> evaluated: "
          + "; ".join(f"{key} {v if v is None else round(v, 3)} {per}"
                      for key, (v, per) in figures.items())
          + "; P-Net face probability near the faces, clean -> example: "
          + ", ".join(f"{k} {kind} {v:.3f}" for (k, kind), v in evidence.items()))

    # tenant B naming A's blob: refused before anything runs, exactly as an unknown id
    from fortis.client.errors import InvalidArgument
    unknown = "sha256:" + "0" * 64
    failures = []
    with FortisClient(s.address, api_key=OTHER_KEY) as other:
        for blob_id in (blob.blob_id, unknown):
            with pytest.raises(InvalidArgument) as info:
                other.submit(f"""
name: foreign-surrogate
seed: 1
target: {{name: haar-face, task: detection}}
dataset: {{source: manifest, path: det/manifest.jsonl, limit: 1}}
{DET}
surrogates: [{json.dumps(_pnet_definition(blob_id))}]
attacks: [{{id: fgsm, surrogate: my-pnet, params: {{epsilon: 0.05}}}}]
""")
            failures.append([(v.field, v.description) for v in info.value.violations])
    assert failures[0] == failures[1], failures
    assert failures[0][0][0] == "surrogates[0].model" and "no such upload" in failures[0][0][1]


def test_a_tenant_segmenter_surrogate_attacks_the_segmenter(stack):
    from fortis.adapters.vision_targets.u2netp import U2NetpTarget

    s, root, _, (images, truth) = stack
    eps = 0.03
    with FortisClient(s.address, api_key=API_KEY) as fc:
        blob = fc.upload(Path(U2NetpTarget.model_file()).read_bytes(), kind="model")
        report, eid = _report(fc, f"""
name: tenant-segmenter-surrogate
seed: 11
target: {{name: u2netp, task: segmentation}}
dataset: {{source: manifest, path: seg/manifest.jsonl, limit: 1}}
segmentation: {{classes: [1], miou_threshold: 0.5}}
surrogates: [{json.dumps(_u2netp_definition(blob.blob_id))}]
attacks:
  - {{id: pgd, surrogate: my-u2netp, params: {{epsilon: {eps}, steps: 3}}}}
""")
    m = report["metrics"]["attacks"]["pgd"]
    examples = stored_examples(s, eid, "pgd")
    for k, a in examples.items():
        assert np.abs(a.astype(np.int64) - images[k]).max() <= int(eps * 255)
    mr, per = rejudged_mr(_segmentation_correct, U2NetpTarget(), images, truth, examples)
    assert m["correct"] == sum(adv for _, adv in per.values())          # IEEE-C5 verdicts
    assert m["successes"] == sum(c and not adv for c, adv in per.values())
    assert next(t for t in report["tests"] if t["id"] == "pgd")["surrogate"] == "my-u2netp"
    print(f"\n[tenant segmenter surrogate] PGD L-inf {eps} x3 on the uploaded u2netp.onnx "
          f"(foreground probability): success {m['successes']}/{m['success_rate_n']}, "
          f"clean -> example {per}")
