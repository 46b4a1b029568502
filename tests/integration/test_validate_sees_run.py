"""ValidatePlan runs every check CreateEvaluation and the first stage would, except calling
the target: plans that could only fail at run time are refused when validated, naming the
plan's field, and CreateEvaluation refuses them the same way (nothing is stored).

Reproduced: a manifest path absolute or with ``..`` (the path itself, or an image of a line),
a ``neural_style`` model on a server with no model root, another tenant's uploaded manifest
or surrogate model, and a target's white-box twin without the operator's grant."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fortis.client import FortisClient
from fortis.client.errors import FortisError, InvalidArgument, PermissionDenied
from fortis.server.app.stack import StackSettings, TargetConfig, start_stack
from fortis.services.common.codec import encode_png

from tests.conftest import API_KEY, OTHER_KEY

pytestmark = pytest.mark.usefixtures("one_thread")

HEAD = """
name: validate-sees-run
seed: 1
target: {name: fmnist-cnn, task: classification}
"""
CORRUPT = "corruptions:\n  - {id: contrast, severities: [1]}\n"


@pytest.fixture(scope="module")
def world(tmp_path_factory, fmnist_target, fmnist_surrogate) -> Iterator[Any]:
    root = tmp_path_factory.mktemp("vsr")
    data = root / "data"
    (data / "imgs").mkdir(parents=True)
    (data / "imgs" / "a.png").write_bytes(encode_png(np.zeros((28, 28, 1), np.uint8)))
    (data / "good.jsonl").write_text(json.dumps({"id": "a", "image": "imgs/a.png",
                                                 "labels": [1]}) + "\n")
    (data / "escape.jsonl").write_text(json.dumps({"id": "a", "image": "../../etc/passwd",
                                                   "labels": [1]}) + "\n")
    s = start_stack(StackSettings(
        state_dir=root / "state", api_keys={API_KEY: "tenant-a", OTHER_KEY: "tenant-b"},
        data_root=data, targets=[TargetConfig.parse("fmnist-cnn=builtin:fmnist-cnn")]))
    a = FortisClient(s.address, api_key=API_KEY)
    b = FortisClient(s.address, api_key=OTHER_KEY)
    yield s, a, b
    a.close()
    b.close()
    s.stop(0)


def _refused(client: FortisClient, plan: str) -> tuple[type, list[str]]:
    """(error class, fields) of ValidatePlan, and CreateEvaluation refusing it the same."""
    fields: list[list[str]] = []
    kinds = []
    for call in (client.validate, client.submit):
        with pytest.raises(FortisError) as info:
            call(plan)
        e = info.value
        kinds.append(type(e))
        fields.append([v.field for v in e.violations] if isinstance(e, InvalidArgument)
                      else [getattr(e, "field", "")] if isinstance(e, PermissionDenied)
                      else [e.message.split(":")[0]])
    assert kinds[0] is kinds[1] and fields[0] == fields[1], (kinds, fields)
    return kinds[0], fields[0]


@pytest.mark.parametrize("path,field", [
    ("/etc/passwd", "dataset.path"),
    ("../state/evaluations.sqlite", "dataset.path"),
    ("escape.jsonl", "dataset.path:1.image"),
])
def test_manifest_paths_outside_the_root(world, path, field):
    _, a, _ = world
    plan = HEAD + f"dataset: {{source: manifest, path: {json.dumps(path)}, limit: 4}}\n" + CORRUPT
    kind, fields = _refused(a, plan)
    assert kind is InvalidArgument and fields == [field]
    a.validate(HEAD + "dataset: {source: manifest, path: good.jsonl, limit: 4}\n" + CORRUPT)


def test_neural_style_without_a_model_root(world):
    _, a, _ = world
    plan = (HEAD + "dataset: {source: fashion-mnist, split: test, limit: 2}\n"
            "corruptions:\n  - {id: neural_style, severities: [1], "
            "params: {model_path: style.pt}}\n")
    kind, fields = _refused(a, plan)
    assert kind is InvalidArgument and fields == ["corruptions[0].params.model_path"]


def test_another_tenants_uploads(world):
    _, a, b = world
    img = a.upload(encode_png(np.full((28, 28, 1), 7, np.uint8)), "image")
    manifest = a.upload((json.dumps({"id": "x", "image": img.blob_id, "labels": [2]})
                         + "\n").encode(), "manifest", media_type="application/x-ndjson")
    plan = HEAD + f"dataset: {{source: uploads, manifest: '{manifest.blob_id}'}}\n" + CORRUPT
    a.validate(plan)
    kind, fields = _refused(b, plan)
    assert kind is InvalidArgument and fields == ["dataset.manifest"]
    # B's own manifest naming A's image: refused at the line that names it
    own = b.upload((json.dumps({"id": "x", "image": img.blob_id, "labels": [2]})
                    + "\n").encode(), "manifest", media_type="application/x-ndjson")
    kind, fields = _refused(b, HEAD + f"dataset: {{source: uploads, manifest: "
                                      f"'{own.blob_id}'}}\n" + CORRUPT)
    assert kind is InvalidArgument and fields == ["dataset.manifest:1.image"]
    # A surrogate definition naming another tenant's (or no) uploaded model
    sur = (HEAD + "dataset: {source: fashion-mnist, split: test, limit: 2}\n"
           "surrogates:\n  - {name: mine, model: 'sha256:" + "ab" * 32 + "', "
           "input: {height: 28, width: 28, channels: 1}, "
           "labels: [T-shirt/top, Trouser, Pullover, Dress, Coat, Sandal, Shirt, Sneaker, Bag, "
           "Ankle boot]}\n"
           "attacks:\n  - {id: fgsm, params: {epsilon: 0.05}, surrogate: mine}\n")
    kind, fields = _refused(b, sur)
    assert kind is InvalidArgument and fields == ["surrogates[0].model"]


def test_whitebox_twin_refused_when_validated(world):
    _, a, _ = world
    plan = (HEAD + "dataset: {source: fashion-mnist, split: test, limit: 2}\n"
            "attacks:\n  - {id: fgsm, params: {epsilon: 0.05}, surrogate: fmnist-cnn}\n")
    kind, fields = _refused(a, plan)
    assert kind is PermissionDenied and fields == ["attacks[0].surrogate"]
    deg = (HEAD + "dataset: {source: fashion-mnist, split: test, limit: 2}\n"
           "degradation:\n  - {id: model_gradient_descent, levels: [1], "
           "surrogate: fmnist-cnn}\n")
    kind, fields = _refused(a, deg)
    assert kind is PermissionDenied and fields == ["degradation[0].surrogate"]

