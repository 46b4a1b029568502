"""WebDataset shards and Hugging Face save_to_disk folders read from the data root: the
samples selected, labels mapped (IEEE-P6), and every hostile input refused with an error
naming the plan field, the shard and the member (or the Arrow file and row)."""

from __future__ import annotations

import gzip
import json
import os
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fortis.services.common.errors import FortisError, InvalidArgument
from fortis.services.evaluation import dataset_hf, dataset_streams
from fortis.services.evaluation.dataset_sources import read_samples
from fortis.services.evaluation.dataset_store import LocalStore
from fortis.services.evaluation.dataset_streams import expand_braces
from fortis.services.evaluation.datasets import PlanDatasets

from tests import dataset_builders as build


def _plan(dataset: dict[str, Any], task: str = "classification") -> Any:
    from fortis.server.app.stack import local_catalogue
    from fortis.services.evaluation.plan import load_plan

    target = "fmnist-cnn" if task == "classification" else "haar-face"
    section = "detection: {mode: threshold, iou_threshold: 0.5}\n" if task == "detection" else ""
    return load_plan(
        f"name: streams\nseed: 1\ntarget: {{name: {target}, task: {task}}}\n"
        f"dataset: {json.dumps(dataset)}\n{section}"
        "corruptions: [{id: contrast, severities: [1]}]\n",
        local_catalogue(),
    )


def _refused(fn: Any, field: str, *words: str) -> str:
    with pytest.raises(FortisError) as e:
        fn()
    fields = (
        [v.field for v in e.value.violations]
        if isinstance(e.value, InvalidArgument)
        else [e.value.message]
    )
    assert any(f.startswith(field) for f in fields), (fields, e.value.message)
    assert "/tmp" not in e.value.message, e.value.message
    for w in words:
        assert w in e.value.message, e.value.message
    return e.value.message


# -- WebDataset ------------------------------------------------------------------------------


def test_braces_expand_bounded():
    assert expand_braces("a-{008..011}.tar", "f") == [
        "a-008.tar",
        "a-009.tar",
        "a-010.tar",
        "a-011.tar",
    ]
    assert expand_braces("{x,y}/p-{1..2}.tar", "f") == [
        "x/p-1.tar",
        "x/p-2.tar",
        "y/p-1.tar",
        "y/p-2.tar",
    ]
    _refused(
        lambda: expand_braces("s-{0..999999999}.tar", "dataset.path"), "dataset.path", "more than"
    )
    _refused(lambda: expand_braces("s-{0..40}{0..40}.tar", "dataset.path"), "dataset.path")
    _refused(lambda: expand_braces("s-{9..1}.tar", "dataset.path"), "dataset.path", "backwards")
    _refused(lambda: expand_braces("s-{a}.tar", "dataset.path"), "dataset.path")


def test_webdataset_selects_across_shards_and_maps_labels(tmp_path):
    truth = build.shards(tmp_path / "wds", 3, 4)
    plan = _plan(
        {
            "source": "webdataset",
            "path": "wds/s-{000..002}.tar",
            "offset": 3,
            "limit": 6,
            "label_map": {"0": 7, "1": 8, "2": 9},
        }
    )
    got = read_samples(plan, LocalStore(tmp_path))
    assert [s.id for s in got] == [k for k, _ in truth[3:9]]
    assert [s.labels for s in got] == [({0: 7, 1: 8, 2: 9}[c],) for _, c in truth[3:9]]
    assert all(s.image is not None and s.image.shape == (12, 10, 3) for s in got)
    # through the service's port, as the runner reads them
    ds = PlanDatasets({}, data_root=tmp_path)
    ds.check(plan)
    assert [i for i, _, _ in ds.images(plan)] == [k for k, _ in truth[3:9]]


def test_webdataset_stops_reading_after_the_selection(tmp_path):
    """Shards after the selected samples are never opened (a broken one is not noticed)."""
    build.shards(tmp_path / "wds", 1, 4)
    (tmp_path / "wds" / "s-001.tar").write_bytes(b"not a tar at all" * 100)
    plan = _plan({"source": "webdataset", "path": "wds/s-{000..001}.tar", "limit": 4})
    assert len(read_samples(plan, LocalStore(tmp_path))) == 4
    plan = _plan({"source": "webdataset", "path": "wds/s-{000..001}.tar", "limit": 5})
    _refused(
        lambda: read_samples(plan, LocalStore(tmp_path)),
        "dataset.path:wds/s-001.tar",
        "not a readable tar",
    )


def test_webdataset_detection_labels_by_name(tmp_path):
    build.shards(tmp_path / "wds", 1, 3, detection=True)
    plan = _plan(
        {
            "source": "webdataset",
            "path": "wds/s-000.tar",
            "label_map": {"cat": 0, "dog": 0, "car": 0},
        },
        "detection",
    )
    got = PlanDatasets({}, data_root=tmp_path).truths(plan)
    assert got["s0/k1"] == {
        "boxes": [[1.0, 2.0, 5.0, 6.0]],
        "labels": [0],
        "box_format": "xyxy",
        "label_base": 0,
        "image_size": [10, 12],
    }
    plan = _plan(
        {"source": "webdataset", "path": "wds/s-000.tar", "label_map": {"cat": 0}}, "detection"
    )
    _refused(
        lambda: read_samples(plan, LocalStore(tmp_path)),
        "dataset.path:wds/s-000.tar:s0/k1.json:labels[0]",
        "'dog'",
        "label_map",
    )


def _shard(tmp_path: Path, *members: tuple[str, bytes, dict[str, Any]]) -> Any:
    (tmp_path / "w").mkdir(exist_ok=True)
    with tarfile.open(tmp_path / "w" / "bad.tar", "w") as tf:
        for name, data, info in members:
            build.add(tf, name, data, **info)
    return _plan({"source": "webdataset", "path": "w/bad.tar"})


GOOD = ("a.png", build.png(9), {})
GOOD_CLS = ("a.cls", b"1", {})


@pytest.mark.parametrize(
    ("member", "words"),
    [
        (("x.png", b"", {"type": tarfile.SYMTYPE, "linkname": "/etc/passwd"}), ["x.png", "links"]),
        (("x.png", b"", {"type": tarfile.LNKTYPE, "linkname": "a.png"}), ["x.png", "links"]),
        (("x.png", b"", {"type": tarfile.CHRTYPE}), ["x.png", "devices"]),
        (("x.png", b"", {"type": tarfile.FIFOTYPE}), ["x.png", "FIFOs"]),
        (("/abs/x.png", build.png(1), {}), ["/abs/x.png", "absolute"]),
        (("../x.png", build.png(1), {}), ["../x.png", "'..'"]),
        (("d/../../x.png", build.png(1), {}), ["'..'"]),
    ],
)
def test_webdataset_hostile_members_are_refused_naming_shard_and_member(tmp_path, member, words):
    plan = _shard(tmp_path, GOOD, GOOD_CLS, member)
    _refused(lambda: read_samples(plan, LocalStore(tmp_path)), "dataset.path:w/bad.tar", *words)


def test_webdataset_huge_declared_member_refused_before_reading(tmp_path, monkeypatch):
    monkeypatch.setattr(dataset_streams, "MAX_MEMBER_BYTES", 1000)
    plan = _shard(tmp_path, ("a.png", build.png(1) + b"\0" * 2000, {}), GOOD_CLS)
    _refused(
        lambda: read_samples(plan, LocalStore(tmp_path)),
        "dataset.path:w/bad.tar:a.png",
        "larger than 1000",
    )
    # the total streamed is bounded too (here: two members of 600 bytes against 1000)
    monkeypatch.setattr(dataset_streams, "MAX_MEMBER_BYTES", 10_000)
    monkeypatch.setattr(dataset_streams, "MAX_STREAM_BYTES", 1000)
    plan = _shard(tmp_path, ("a.png", b"\0" * 600, {}), ("b.png", b"\0" * 600, {}))
    _refused(
        lambda: read_samples(plan, LocalStore(tmp_path)),
        "dataset.path:w/bad.tar",
        "bytes of members",
    )


def test_webdataset_truncated_and_garbage_shards(tmp_path):
    plan = _shard(tmp_path, GOOD, GOOD_CLS, ("b.png", build.png(3), {}), ("b.cls", b"2", {}))
    data = (tmp_path / "w" / "bad.tar").read_bytes()
    (tmp_path / "w" / "bad.tar").write_bytes(data[:700])  # inside a.png's data
    _refused(lambda: read_samples(plan, LocalStore(tmp_path)), "dataset.path:w/bad.tar")
    (tmp_path / "w" / "bad.tar").write_bytes(os.urandom(4096))
    _refused(
        lambda: read_samples(plan, LocalStore(tmp_path)),
        "dataset.path:w/bad.tar",
        "not a readable tar",
    )


@pytest.mark.parametrize(
    ("label", "task", "field"),
    [
        (("a.cls", b"three", {}), "classification", "dataset.path:w/bad.tar:a.cls"),
        (
            ("a.json", b'{"label": [1]}', {}),
            "classification",
            "dataset.path:w/bad.tar:a.json:label",
        ),
        (("a.json", b"[[[[", {}), "classification", "dataset.path:w/bad.tar:a.json"),
        (
            ("a.json", b'{"boxes": [[NaN, 1, 2, 3]], "labels": [0]}', {}),
            "detection",
            "dataset.path:w/bad.tar:a.json:boxes[0][0]",
        ),
        (
            ("a.json", b'{"boxes": [[1, 2, 3]], "labels": [0]}', {}),
            "detection",
            "dataset.path:w/bad.tar:a.json:boxes[0]",
        ),
        (
            ("a.json", b'{"boxes": [[1, 2, 3, 4]], "labels": [0, 1]}', {}),
            "detection",
            "dataset.path:w/bad.tar:a.json:labels",
        ),
        (
            ("a.json", b'{"boxes": [[1, 2, 3, 4]], "labels": [0], "box_format": "zz"}', {}),
            "detection",
            "dataset.path:w/bad.tar:a.json:box_format",
        ),
        (("a.txt", b"hello", {}), "classification", "dataset.path:w/bad.tar:a"),
    ],
)
def test_webdataset_bad_labels_are_named(tmp_path, label, task, field):
    plan = _shard(tmp_path, GOOD, label)
    if task == "detection":
        plan = _plan({"source": "webdataset", "path": "w/bad.tar"}, "detection")
    _refused(lambda: read_samples(plan, LocalStore(tmp_path)), field)


def test_webdataset_shards_confined_to_the_data_root(tmp_path):
    root = tmp_path / "root"
    build.shards(tmp_path / "outside", 1, 2)
    (root / "w").mkdir(parents=True)
    (root / "w" / "s-000.tar").symlink_to(tmp_path / "outside" / "s-000.tar")
    plan = _plan({"source": "webdataset", "path": "w/s-000.tar"})
    _refused(
        lambda: read_samples(plan, LocalStore(root)),
        "dataset.path:w/s-000.tar",
        "not found under the data root",
    )
    for path in ("../outside/s-000.tar", "/etc/passwd"):
        with pytest.raises(FortisError):
            read_samples(_plan({"source": "webdataset", "path": path}), LocalStore(root))


# -- Hugging Face ----------------------------------------------------------------------------


def test_hf_classification_rows_and_class_names(tmp_path):
    labels = [0, 1, 1, 0, 1]
    build.hf_classification(tmp_path / "hf" / "pets", labels, ["cat", "dog"])
    plan = _plan(
        {
            "source": "hf",
            "path": "hf/pets",
            "offset": 1,
            "limit": 3,
            "label_map": {"cat": 4, "dog": 6},
        }
    )
    got = read_samples(plan, LocalStore(tmp_path))
    assert [s.id for s in got] == ["row-000001", "row-000002", "row-000003"]
    assert [s.labels for s in got] == [({0: 4, 1: 6}[c],) for c in labels[1:4]]
    assert got[0].image is not None and got[0].image.shape == (12, 10, 3)
    plan = _plan({"source": "hf", "path": "hf/pets", "label_map": {"cat": 4}})
    _refused(
        lambda: read_samples(plan, LocalStore(tmp_path)),
        "dataset.path/data-00000-of-00001.arrow:1.label",
        "'dog'",
    )


def test_hf_dataset_dict_split(tmp_path):
    build.hf_classification(tmp_path / "hf" / "dd", [1, 0], ["a", "b"], split="validation")
    plan = _plan({"source": "hf", "path": "hf/dd", "split": "validation"})
    got = read_samples(plan, LocalStore(tmp_path))
    assert [(s.id, s.labels) for s in got] == [
        ("validation-000000", (1,)),
        ("validation-000001", (0,)),
    ]
    _refused(
        lambda: read_samples(
            _plan({"source": "hf", "path": "hf/dd", "split": "train"}), LocalStore(tmp_path)
        ),
        "dataset.split",
        "validation",
    )


def test_hf_detection_objects(tmp_path):
    imgs = [np.full((20, 30, 3), 50, np.uint8)] * 2
    build.hf_detection(
        tmp_path / "hf" / "det",
        imgs,
        [{"bbox": [[1, 2, 3, 4], [5, 6, 7, 8]], "category": [1, 0]}, {"bbox": [], "category": []}],
        ["face", "hat"],
    )
    plan = _plan(
        {"source": "hf", "path": "hf/det", "label_map": {"face": 0, "hat": 0}}, "detection"
    )
    got = PlanDatasets({}, data_root=tmp_path).truths(plan)
    assert got["row-000000"] == {
        "boxes": [[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]],
        "labels": [0, 0],
        "box_format": "xywh",
        "label_base": 0,
        "image_size": [30, 20],
    }
    assert got["row-000001"]["boxes"] == []


def _arrow(folder: Path, table: Any) -> None:
    import pyarrow as pa

    folder.mkdir(parents=True, exist_ok=True)
    with (
        pa.OSFile(str(folder / "data-00000-of-00001.arrow"), "wb") as f,
        pa.ipc.new_stream(f, table.schema) as w,
    ):
        w.write_table(table)
    (folder / "state.json").write_text(
        json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]})
    )
    (folder / "dataset_info.json").write_text(json.dumps({"features": {}}))


def test_hf_rows_naming_a_path_instead_of_bytes_are_refused(tmp_path):
    """A row whose image is only a path must not make the server read its own files."""
    import pyarrow as pa

    img = pa.array(
        [{"bytes": None, "path": "/etc/passwd"}],
        pa.struct([("bytes", pa.binary()), ("path", pa.string())]),
    )
    _arrow(tmp_path / "hf" / "p", pa.table({"image": img, "label": pa.array([0], pa.int64())}))
    _refused(
        lambda: read_samples(_plan({"source": "hf", "path": "hf/p"}), LocalStore(tmp_path)),
        "dataset.path/data-00000-of-00001.arrow:0.image",
        "only a path",
    )


def test_hf_wrong_column_types_and_nan_boxes(tmp_path):
    import pyarrow as pa

    _arrow(
        tmp_path / "hf" / "t",
        pa.table({"image": pa.array([build.png(1)], pa.binary()), "label": pa.array(["cat"])}),
    )
    _refused(
        lambda: read_samples(_plan({"source": "hf", "path": "hf/t"}), LocalStore(tmp_path)),
        "dataset.path/data-00000-of-00001.arrow:label",
        "integer",
    )
    _arrow(tmp_path / "hf" / "n", pa.table({"label": pa.array([1])}))
    _refused(
        lambda: read_samples(_plan({"source": "hf", "path": "hf/n"}), LocalStore(tmp_path)),
        "dataset.path/data-00000-of-00001.arrow",
        "no 'image' column",
    )
    objs = pa.array([{"bbox": [[float("nan"), 1.0, 2.0, 3.0]], "category": [0]}])
    _arrow(
        tmp_path / "hf" / "d",
        pa.table({"image": pa.array([build.png(1)], pa.binary()), "objects": objs}),
    )
    _refused(
        lambda: read_samples(
            _plan({"source": "hf", "path": "hf/d"}, "detection"), LocalStore(tmp_path)
        ),
        "dataset.path/data-00000-of-00001.arrow:0.objects.bbox[0][0]",
        "finite",
    )


def test_hf_bad_arrow_files_and_state(tmp_path):
    build.hf_classification(tmp_path / "hf" / "x", [0, 1], ["a", "b"])
    folder = tmp_path / "hf" / "x"
    arrow = folder / "data-00000-of-00001.arrow"
    good = arrow.read_bytes()
    arrow.write_bytes(good[: len(good) // 2])  # cut inside the record batch
    _refused(
        lambda: read_samples(_plan({"source": "hf", "path": "hf/x"}), LocalStore(tmp_path)),
        "dataset.path/data-00000-of-00001.arrow",
    )
    arrow.write_bytes(os.urandom(2000))
    _refused(
        lambda: read_samples(_plan({"source": "hf", "path": "hf/x"}), LocalStore(tmp_path)),
        "dataset.path/data-00000-of-00001.arrow",
        "not an Arrow stream",
    )
    arrow.write_bytes(good)
    for bad in ("../../../etc/passwd.arrow", "/abs.arrow", "sub/d.arrow", 7):
        (folder / "state.json").write_text(json.dumps({"_data_files": [{"filename": bad}]}))
        _refused(
            lambda: read_samples(_plan({"source": "hf", "path": "hf/x"}), LocalStore(tmp_path)),
            "dataset.path/state.json:_data_files[0]",
            "plain .arrow file name",
        )
    (folder / "state.json").write_text("{" * 100_000)
    _refused(
        lambda: read_samples(_plan({"source": "hf", "path": "hf/x"}), LocalStore(tmp_path)),
        "dataset.path/state.json",
    )


def test_hf_symlinked_arrow_out_of_the_root_is_not_found(tmp_path):
    build.hf_classification(tmp_path / "outside", [0], ["a"])
    root = tmp_path / "root"
    (root / "hf").mkdir(parents=True)
    (root / "hf" / "ds").mkdir()
    for f in ("state.json", "dataset_info.json"):
        (root / "hf" / "ds" / f).write_bytes((tmp_path / "outside" / f).read_bytes())
    (root / "hf" / "ds" / "data-00000-of-00001.arrow").symlink_to(
        tmp_path / "outside" / "data-00000-of-00001.arrow"
    )
    _refused(
        lambda: read_samples(_plan({"source": "hf", "path": "hf/ds"}), LocalStore(root)),
        "dataset.path/state.json:_data_files[0]",
        "not found under the data root",
    )


def test_hf_huge_file_refused_by_its_size_before_mapping(tmp_path, monkeypatch):
    build.hf_classification(tmp_path / "hf" / "x", [0, 1], ["a", "b"])
    monkeypatch.setattr(dataset_hf, "MAX_HF_FILE_BYTES", 100)
    _refused(
        lambda: read_samples(_plan({"source": "hf", "path": "hf/x"}), LocalStore(tmp_path)),
        "dataset.path/state.json:_data_files[0]",
        "larger than 100 bytes",
    )


# -- plan validation -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dataset", "task", "field"),
    [
        ({"source": "hf", "path": "x"}, "segmentation", "dataset.source"),
        ({"source": "webdataset"}, "classification", "dataset.path"),
        ({"source": "hf", "path": "x", "split": "../train"}, "classification", "dataset.split"),
        (
            {"source": "coco", "path": "a.json", "box_format": "xywh"},
            "detection",
            "dataset.box_format",
        ),
        (
            {
                "source": "manifest",
                "path": "m.jsonl",
                "store": {"s3": {"bucket": "bkt", "credentials": "c"}},
            },
            "classification",
            "dataset.store",
        ),
        (
            {"source": "hf", "path": "x", "store": {"s3": {"bucket": "B_ad", "credentials": "c"}}},
            "classification",
            "dataset.store.s3.bucket",
        ),
        (
            {
                "source": "hf",
                "path": "x",
                "store": {"s3": {"bucket": "bkt", "prefix": "../up", "credentials": "c"}},
            },
            "classification",
            "dataset.store.s3.prefix",
        ),
        (
            {
                "source": "hf",
                "path": "x",
                "store": {"s3": {"bucket": "bkt", "prefix": "/abs", "credentials": "c"}},
            },
            "classification",
            "dataset.store.s3.prefix",
        ),
        (
            {
                "source": "hf",
                "path": "x",
                "store": {
                    "s3": {"bucket": "bkt", "credentials": "c", "endpoint_url": "http://u:p@h/x"}
                },
            },
            "classification",
            "dataset.store.s3.endpoint_url",
        ),
        (
            {
                "source": "hf",
                "path": "x",
                "store": {"s3": {"bucket": "bkt", "credentials": "AKIA/SECRET+KEY"}},
            },
            "classification",
            "dataset.store.s3.credentials",
        ),
        (
            {"source": "hf", "path": "x", "store": {"s3": {"bucket": "bkt"}}},
            "classification",
            "dataset.store.s3.credentials",
        ),
        (
            {
                "source": "hf",
                "path": "x",
                "store": {"s3": {"bucket": "bkt", "credentials": "c", "secret": "x"}},
            },
            "classification",
            "dataset.store.s3.secret",
        ),
        (
            {
                "source": "hf",
                "path": "x",
                "store": {"s3": {"bucket": "bkt", "credentials": "c", "region": 3}},
            },
            "classification",
            "dataset.store.s3.region",
        ),
    ],
)
def test_plan_dataset_fields_refused(dataset, task, field):
    with pytest.raises(InvalidArgument) as e:
        _plan(dataset, task) if task != "segmentation" else _seg_plan(dataset)
    assert any(v.field.startswith(field) for v in e.value.violations), e.value.message
    assert "SECRET" not in e.value.message


def _seg_plan(dataset: dict[str, Any]) -> Any:
    from fortis.server.app.stack import local_catalogue
    from fortis.services.evaluation.plan import load_plan

    return load_plan(
        "name: s\nseed: 1\ntarget: {name: u2netp, task: segmentation}\n"
        f"dataset: {json.dumps(dataset)}\n"
        "segmentation: {classes: [1], miou_threshold: 0.5}\n"
        "corruptions: [{id: contrast, severities: [1]}]\n",
        local_catalogue(),
    )


def test_store_plan_without_an_opener_is_a_precise_failed_precondition(tmp_path):
    from fortis.services.common.errors import FailedPrecondition

    plan = _plan(
        {"source": "hf", "path": "x", "store": {"s3": {"bucket": "bkt", "credentials": "team"}}}
    )
    with pytest.raises(FailedPrecondition, match="dataset.store.s3"):
        PlanDatasets({}, data_root=tmp_path).for_tenant("t").check(plan)


# -- class folders ---------------------------------------------------------------------------


def _folders(root: Path) -> None:
    for cls, n in (("dog", 2), ("cat", 3)):
        for k in range(n):
            (root / "pets" / cls).mkdir(parents=True, exist_ok=True)
            (root / "pets" / cls / f"{k:03d}.png").write_bytes(build.png(20 * k))
    (root / "pets" / "README.txt").write_text("not an image")
    (root / "pets" / "cat" / "notes.txt").write_text("not an image either")


def test_class_folders_in_sorted_order_with_names_mapped(tmp_path):
    _folders(tmp_path)
    got = read_samples(
        _plan({"source": "folders", "path": "pets", "offset": 2, "limit": 3}), LocalStore(tmp_path)
    )
    # cat = 0, dog = 1 (sorted folder names, as ImageFolder numbers them)
    assert [(s.id, s.labels) for s in got] == [
        ("cat/002.png", (0,)),
        ("dog/000.png", (1,)),
        ("dog/001.png", (1,)),
    ]
    plan = _plan({"source": "folders", "path": "pets", "label_map": {"cat": 281, "dog": 207}})
    assert [s.labels[0] for s in read_samples(plan, LocalStore(tmp_path))] == [281] * 3 + [207] * 2
    plan = _plan({"source": "folders", "path": "pets", "label_map": {"cat": 281}})
    _refused(lambda: read_samples(plan, LocalStore(tmp_path)), "dataset.path:dog/000.png", "'dog'")


def test_class_folders_confined(tmp_path):
    root = tmp_path / "root"
    _folders(tmp_path / "outside")
    (root / "pets" / "cat").mkdir(parents=True)
    (root / "pets" / "cat" / "000.png").write_bytes(build.png(1))
    (root / "pets" / "dog").symlink_to(tmp_path / "outside" / "pets" / "dog")  # not walked
    got = read_samples(_plan({"source": "folders", "path": "pets"}), LocalStore(root))
    assert [s.id for s in got] == ["cat/000.png"]
    (root / "pets" / "cat" / "001.png").symlink_to(
        tmp_path / "outside" / "pets" / "cat" / "000.png"
    )
    _refused(
        lambda: read_samples(_plan({"source": "folders", "path": "pets"}), LocalStore(root)),
        "dataset.path:cat/001.png",
        "not found under the data root",
    )
    (root / "link").symlink_to(tmp_path / "outside")
    _refused(
        lambda: read_samples(_plan({"source": "folders", "path": "link/pets"}), LocalStore(root)),
        "dataset.path",
        "no such folder",
    )
    _refused(
        lambda: read_samples(
            _plan({"source": "folders", "path": "../outside/pets"}), LocalStore(root)
        ),
        "dataset.path",
        "'..'",
    )


def test_class_folders_bounded_and_classification_only(tmp_path, monkeypatch):
    from fortis.services.evaluation import dataset_folders

    _folders(tmp_path)
    monkeypatch.setattr(dataset_folders, "MAX_FOLDER_FILES", 4)
    _refused(
        lambda: read_samples(_plan({"source": "folders", "path": "pets"}), LocalStore(tmp_path)),
        "dataset.path",
        "more than 4 files",
    )
    with pytest.raises(InvalidArgument) as e:
        _plan({"source": "folders", "path": "pets"}, "detection")
    assert any(v.field == "dataset.source" for v in e.value.violations)


def test_numeric_class_folders_map_by_name_first(tmp_path):
    """Folders 3/ and 7/ with the map {3: 30, 7: 70}: the key naming the folder wins over the
    folder's number among the classes (which would be 0 and 1)."""
    for cls in ("3", "7"):
        (tmp_path / "d" / cls).mkdir(parents=True)
        (tmp_path / "d" / cls / "a.png").write_bytes(build.png(5))
    plan = _plan({"source": "folders", "path": "d", "label_map": {"3": 30, "7": 70}})
    assert [s.labels for s in read_samples(plan, LocalStore(tmp_path))] == [(30,), (70,)]


def test_embedded_run_roots_hf_folders_and_shards_at_their_parent(tmp_path):
    """``fortis run`` (embedded) takes local paths for these sources too; a plan reading from
    an S3 store keeps its paths (they are keys under the prefix)."""
    from fortis.server.cli.local import _embedded_manifest_root

    build.hf_classification(tmp_path / "sets" / "pets-hf", [1, 0], ["a", "b"])
    build.shards(tmp_path / "sets" / "wds", 2, 2)
    _folders(tmp_path / "sets")
    for dataset, n in (
        ({"source": "hf", "path": str(tmp_path / "sets" / "pets-hf")}, 2),
        ({"source": "webdataset", "path": str(tmp_path / "sets" / "wds" / "s-{000..001}.tar")}, 4),
        ({"source": "folders", "path": str(tmp_path / "sets" / "pets")}, 5),
    ):
        text, root = _embedded_manifest_root(json.dumps({"dataset": dataset}))
        ds = json.loads(text)["dataset"]
        assert root is not None and not Path(ds["path"]).is_absolute()
        assert len(read_samples(_plan(ds), LocalStore(root))) == n
    s3 = {"source": "hf", "path": "/abs", "store": {"s3": {"bucket": "bkt", "credentials": "c"}}}
    text, root = _embedded_manifest_root(json.dumps({"dataset": s3}))
    assert root is None and json.loads(text)["dataset"] == s3


def test_gzipped_shards_stream_too(tmp_path):
    build.shards(tmp_path / "w", 1, 3)
    raw = (tmp_path / "w" / "s-000.tar").read_bytes()
    (tmp_path / "w" / "s-000.tar.gz").write_bytes(gzip.compress(raw))
    plan = _plan({"source": "webdataset", "path": "w/s-000.tar.gz"})
    assert [s.labels for s in read_samples(plan, LocalStore(tmp_path))] == [(0,), (1,), (2,)]
