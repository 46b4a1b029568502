"""No plan reads the server's disk outside the operator's folders.

Before the fix, a plan with ``dataset: {source: manifest, path: <any server path>}`` made the
server open that path, a binary file's bytes came back in the error, manifest image paths and
``neural_style``'s ``model_path`` opened any file, and "no such file" told which files exist.
Checked here, on the real code (``datasets.PlanDatasets``, ``styles.load_style_model``) and
real files in tmp_path: manifests exist only under ``data_root`` (none configured: refused);
absolute paths, ``..`` and symlinks out of the root are refused; a missing file and one outside
give the same message, which never names a server path; an evaluation's error stays short and
free of a binary file's bytes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import cv2
import numpy as np
import pytest
import torch
from fortis.infra.serving.status import status_for
from fortis.services.common.errors import FailedPrecondition, FortisError, InvalidArgument
from fortis.services.evaluation.datasets import PlanDatasets
from fortis.services.perturbation import styles
from fortis.services.perturbation.style_models import StyleModels

SECRET = b"TOP-SECRET-TENANT-B"


def _plan(path: str, task: str = "classification", offset: int = 0, limit: int = 100) -> Any:
    """The two parts of a Plan the dataset port reads."""
    return SimpleNamespace(dataset=SimpleNamespace(source="manifest", path=path, offset=offset,
                                                   limit=limit, label_map={}),
                           target=SimpleNamespace(task=task))


def _png(path: Path, h: int = 8, w: int = 6, value: int = 0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(path), np.full((h, w, 3), value, np.uint8))


@pytest.fixture()
def layout(tmp_path: Path) -> tuple[Path, Path]:
    """(data root, a folder beside it holding another tenant's files)."""
    root, other = tmp_path / "data", tmp_path / "other"
    _png(root / "imgs" / "a.png")
    _png(root / "imgs" / "b.png", value=9)
    (root / "m.jsonl").write_text(
        '{"id": "a", "image": "imgs/a.png", "labels": [1]}\n\n'
        '{"id": "b", "image": "imgs/b.png", "labels": 2}\n')
    other.mkdir()
    (other / "secret.txt").write_bytes(SECRET * 10)
    _png(other / "x.png")
    return root, other


def _refused(ds: PlanDatasets, plan: Any) -> FortisError:
    with pytest.raises(FortisError) as e:
        ds.images(plan)
    msg = e.value.message
    assert len(msg) <= 1024 and "/tmp" not in msg and "/work" not in msg, msg
    return e.value


def test_manifest_under_the_root_loads(layout):
    root, _ = layout
    got = PlanDatasets({}, data_root=root).images(_plan("m.jsonl"))
    assert [(i, lab) for i, _, lab in got] == [("a", (1,)), ("b", (2,))]
    assert got[1][1].shape == (8, 6, 3) and int(got[1][1][0, 0, 0]) == 9
    assert [i for i, _, _ in PlanDatasets({}, data_root=root).images(_plan("m.jsonl", offset=1))] == ["b"]


def test_no_data_root_refuses_manifests(layout):
    root, _ = layout
    e = _refused(PlanDatasets({}), _plan("m.jsonl"))
    assert isinstance(e, FailedPrecondition)
    assert "dataset.path" in e.message and "data root" in e.message


@pytest.mark.parametrize("path", ["/etc/passwd", "../other/secret.txt", "imgs/../../other/secret.txt",
                                  "\\etc\\passwd"])
def test_absolute_and_dotdot_manifest_paths_are_refused(layout, path):
    root, _ = layout
    e = _refused(PlanDatasets({}, data_root=root), _plan(path))
    assert isinstance(e, InvalidArgument) and e.violations[0].field == "dataset.path"
    assert "etc" not in e.message and "other" not in e.message


def test_missing_and_outside_read_the_same(layout):
    root, other = layout
    os.symlink(other / "secret.txt", root / "link.jsonl")     # exists, but outside the root
    os.symlink(other, root / "dirlink")
    ds = PlanDatasets({}, data_root=root)
    msgs = {p: _refused(ds, _plan(p)) for p in ("nope.jsonl", "link.jsonl", "dirlink/secret.txt",
                                                "imgs", "dirlink/nope.txt")}
    assert {e.message for e in msgs.values()} == {"dataset.path: not found under the data root"}
    assert all(str(root) not in e.message for e in msgs.values())


@pytest.mark.parametrize("image", ["/work/main/README.md", "../other/x.png", "x/../../other/x.png",
                                   "escape/x.png", "missing.png"])
def test_manifest_image_and_mask_paths_are_confined(layout, image):
    root, other = layout
    os.symlink(other, root / "escape")
    (root / "bad.jsonl").write_text(json.dumps({"id": "z", "image": image, "labels": [0]}) + "\n")
    e = _refused(PlanDatasets({}, data_root=root), _plan("bad.jsonl"))
    assert isinstance(e, InvalidArgument) and e.violations[0].field == "dataset.path:1.image"
    if image in ("escape/x.png", "missing.png"):
        assert e.violations[0].description == "not found under the data root"
    (root / "seg.jsonl").write_text(json.dumps({"id": "z", "image": "imgs/a.png",
                                                "mask": image}) + "\n")
    with pytest.raises(InvalidArgument) as em:
        PlanDatasets({}, data_root=root).truths(_plan("seg.jsonl", task="segmentation"))
    assert em.value.violations[0].field == "dataset.path:1.mask"


def test_image_paths_are_relative_to_the_manifest_folder(layout):
    root, _ = layout
    (root / "imgs" / "m2.jsonl").write_text('{"image": "a.png", "labels": [3]}\n')
    got = PlanDatasets({}, data_root=root).images(_plan("imgs/m2.jsonl"))
    assert [(i, lab) for i, _, lab in got] == [("a", (3,))]


def test_binary_file_as_manifest_gives_a_short_error_without_its_bytes(layout):
    """The finding's exploit: a binary file as the manifest. The evaluation's stored error
    (``status_for`` of what the runner raised) is short and holds none of the file's bytes."""
    root, _ = layout
    blob = os.urandom(300_000) + SECRET + b"\x00\xff" * 1000
    (root / "blob.bin").write_bytes(blob)
    (root / "blob2.bin").write_bytes(SECRET + b"\n" + b"\xff\xfe" * 50 + b"\n")
    for name in ("blob.bin", "blob2.bin", "imgs/a.png"):
        e = _refused(PlanDatasets({}, data_root=root), _plan(name))
        status = status_for(e)
        assert len(status.message) <= 1024, name
        assert "SECRET" not in status.message and "\\x" not in status.message, status.message
        assert SECRET not in status.SerializeToString()


def test_bad_json_lines_quote_at_most_a_short_excerpt(layout):
    root, _ = layout
    (root / "j.jsonl").write_text('{"image": "imgs/a.png", "labels": ["' + "S" * 5000 + '"]}\n'
                                  '{"image": ' + "Q" * 5000 + '}\n')
    with pytest.raises(InvalidArgument) as e:
        PlanDatasets({}, data_root=root).images(_plan("j.jsonl", limit=1))
    assert e.value.violations[0].field == "dataset.path:1.labels[0]" and len(e.value.message) < 200
    with pytest.raises(InvalidArgument) as e2:
        PlanDatasets({}, data_root=root).images(_plan("j.jsonl", offset=1))
    assert e2.value.violations[0].field == "dataset.path:2" and "QQQQ" not in e2.value.message


# -- neural_style model_path --------------------------------------------------------------------

class _Invert(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 1.0 - x


@pytest.fixture()
def model_layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    root, other = tmp_path / "models", tmp_path / "other"
    root.mkdir()
    other.mkdir()
    torch.jit.save(torch.jit.script(_Invert()), str(root / "ok.pt"))
    torch.jit.save(torch.jit.script(_Invert()), str(other / "theirs.pt"))
    monkeypatch.delenv(styles.MODEL_ROOT_ENV, raising=False)
    return root, other


def _model_error(root: Path | None, path: object) -> InvalidArgument:
    """The refusal of ``path`` under the operator's model root ``root``, handed in as the
    perturbation servicer hands it to every call (None: no root configured)."""
    with pytest.raises(InvalidArgument) as e:
        styles.load_style_model({"model_path": path}, StyleModels(root=root))
    assert e.value.violations[0].field == "params.model_path"
    assert len(e.value.message) <= 1024
    return e.value


def test_model_path_under_the_root_loads(model_layout):
    root, _ = model_layout
    assert styles.load_style_model({"model_path": "ok.pt"}, StyleModels(root=root)) is not None


def test_no_model_root_refuses_neural_style(model_layout):
    assert "model root" in _model_error(None, "ok.pt").message


@pytest.mark.parametrize("path", ["/etc/passwd", "../other/theirs.pt", "a/../../other/theirs.pt"])
def test_model_path_absolute_or_dotdot_refused(model_layout, path):
    msg = _model_error(model_layout[0], path).message
    assert "etc" not in msg and "other" not in msg


def test_model_path_missing_and_outside_read_the_same(model_layout):
    root, other = model_layout
    os.symlink(other / "theirs.pt", root / "link.pt")
    os.symlink(other, root / "dir")
    (other / "secret.pt").write_bytes(SECRET)
    msgs = {_model_error(root, p).message for p in ("nope.pt", "link.pt", "dir/theirs.pt", "dir/no.pt")}
    assert msgs == {"params.model_path: not found under the model root"}
    (root / "junk.pt").write_bytes(SECRET * 100)
    msg = _model_error(root, "junk.pt").message
    assert "SECRET" not in msg and str(root) not in msg
