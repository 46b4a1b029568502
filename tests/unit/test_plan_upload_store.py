"""The plan's ``dataset.store.upload`` (a dataset read from the tenant's uploaded archive):
hostile shapes refused with the field named, before anything is read."""

from __future__ import annotations

from typing import Any

import pytest
from fortis.services.common.errors import FailedPrecondition, InvalidArgument
from fortis.services.evaluation.datasets import PlanDatasets
from fortis.services.evaluation.plan_model import MAX_UPLOAD_SHARDS, UploadLocation

from tests.unit.test_dataset_streams import _plan

ID = "sha256:" + "a" * 64


def _fields(dataset: dict[str, Any]) -> list[str]:
    with pytest.raises(InvalidArgument) as e:
        _plan(dataset)
    return [f"{v.field}: {v.description}" for v in e.value.violations]


def test_one_archive_and_a_list_of_shards_parse():
    assert _plan(
        {"source": "hf", "path": "d", "store": {"upload": ID}}
    ).dataset.store == UploadLocation(blobs=(ID,))
    ids = ["sha256:" + c * 64 for c in "abc"]
    plan = _plan({"source": "webdataset", "store": {"upload": ids}})
    assert plan.dataset.store == UploadLocation(blobs=tuple(ids)) and plan.dataset.path == ""


@pytest.mark.parametrize(
    "dataset,field,text",
    [
        (
            {"source": "hf", "path": "d", "store": {"upload": "../../etc/passwd"}},
            "dataset.store.upload",
            "uploaded archive",
        ),
        ({"source": "hf", "path": "d", "store": {"upload": 7}}, "dataset.store.upload", "sha256"),
        (
            {"source": "hf", "path": "d", "store": {"upload": {"a": [[ID]]}}},
            "dataset.store.upload",
            "sha256",
        ),
        (
            {"source": "hf", "path": "d", "store": {"upload": [ID]}},
            "dataset.store.upload",
            "WebDataset shards",
        ),
        ({"source": "webdataset", "store": {"upload": []}}, "dataset.store.upload", "1..1000"),
        (
            {"source": "webdataset", "store": {"upload": [ID] * (MAX_UPLOAD_SHARDS + 1)}},
            "dataset.store.upload",
            "1..1000",
        ),
        (
            {"source": "webdataset", "store": {"upload": [ID, ID]}},
            "dataset.store.upload",
            "named twice",
        ),
        (
            {"source": "webdataset", "store": {"upload": [ID, None]}},
            "dataset.store.upload[1]",
            "sha256",
        ),
        (
            {"source": "webdataset", "path": "s.tar", "store": {"upload": ID}},
            "dataset.path",
            "leave dataset.path out",
        ),
        ({"source": "hf", "store": {"upload": ID}}, "dataset.path", "save_to_disk"),
        (
            {
                "source": "hf",
                "path": "d",
                "store": {"upload": ID, "s3": {"bucket": "bkt", "credentials": "c"}},
            },
            "dataset.store",
            "one of s3 and upload",
        ),
        ({"source": "fashion-mnist", "store": {"upload": ID}}, "dataset.store", "only sources"),
    ],
)
def test_hostile_shapes_are_refused_naming_the_field(
    dataset: dict[str, Any], field: str, text: str
):
    got = _fields(dataset)
    assert any(f.startswith(f"{field}: ") and text in f for f in got), got


def test_a_server_without_blob_storage_refuses_precisely(tmp_path):
    plan = _plan({"source": "hf", "path": "d", "store": {"upload": ID}})
    with pytest.raises(FailedPrecondition, match="dataset.store.upload"):
        PlanDatasets({}, data_root=tmp_path).for_tenant("t").check(plan)
