"""Datasets read from S3-compatible object storage through the evaluation service's store
(adapters/s3_store.py, botocore) against a real S3 HTTP server on 127.0.0.1: s3rver, an
emulator, because no real S3 server installs offline here (scripts/setup_s3rver.sh says
which were tried). s3rver checks each signed request's access key id against its one account
(an unknown one is refused with InvalidAccessKeyId), so these tests show the tenant's
configured credential is what the requests carry; it does not verify the V4 signature itself
(its own code says so), so a wrong *secret* is not caught by this server.

COCO, WebDataset, HF and class folders read from the prefix; per-tenant credentials (another tenant's name,
instance credentials, endpoints the operator did not list) and confinement (keys outside the
prefix) are refused with the plan field named and no secret in any message.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
from fortis.adapters.s3_store import load_config
from fortis.services.common.errors import FailedPrecondition, FortisError, PermissionDenied
from fortis.services.evaluation.datasets import PlanDatasets

from tests import dataset_builders as build
from tests.integration._s3rver_support import client, s3rver, upload_tree

BUCKET = "datasets"


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data = tmp_path_factory.mktemp("local")
    build.shards(data / "wds", 2, 3)
    build.hf_classification(data / "hf", [0, 1, 1], ["cat", "dog"])
    for cls, n in (("dog", 2), ("cat", 1)):
        for k in range(n):
            (data / "pets" / cls).mkdir(parents=True, exist_ok=True)
            (data / "pets" / cls / f"{k}.png").write_bytes(build.png(10 * k))
    (data / "coco" / "val").mkdir(parents=True)
    (data / "coco" / "val" / "a.png").write_bytes(build.png(50, 16, 20))
    (data / "coco" / "ann.json").write_text(
        json.dumps(
            {
                "images": [{"id": 1, "file_name": "a.png", "width": 20, "height": 16}],
                "categories": [{"id": 1, "name": "face"}],
                "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [1, 2, 3, 4]}],
            }
        )
    )
    with s3rver(tmp_path_factory.mktemp("s3rver"), BUCKET) as url:
        c = client(url)
        upload_tree(c, BUCKET, data, "team-a/sets")
        c.put_object(Bucket=BUCKET, Key="team-b/private.json", Body=b"{}")  # type: ignore[attr-defined]
        yield url


@pytest.fixture()
def stores(tmp_path: Path, endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("TEAM_A_KEY", "S3RVER")
    (tmp_path / "secret").write_text("S3RVER\n")
    monkeypatch.setenv("TEAM_A_BAD_KEY", "NOT-A-KEY-x9")
    (tmp_path / "bad-secret").write_text("NOT-THE-SECRET-x9\n")
    (tmp_path / "stores.yaml").write_text(f"""
s3:
  tenants:
    tenant-a:
      team:
        access_key_id: env:TEAM_A_KEY
        secret_access_key: file:{tmp_path / "secret"}
        endpoints: ["{endpoint}"]
      wrong:
        access_key_id: env:TEAM_A_BAD_KEY
        secret_access_key: file:{tmp_path / "bad-secret"}
        endpoints: ["{endpoint}"]
    tenant-b:
      theirs:
        access_key_id: env:TEAM_A_KEY
        secret_access_key: file:{tmp_path / "secret"}
        endpoints: ["{endpoint}"]
""")
    return load_config(tmp_path / "stores.yaml")


def _plan(dataset: dict[str, Any], task: str = "classification") -> Any:
    from fortis.server.app.stack import local_catalogue
    from fortis.services.evaluation.plan import load_plan

    target = "fmnist-cnn" if task == "classification" else "haar-face"
    section = "detection: {mode: threshold, iou_threshold: 0.5}\n" if task == "detection" else ""
    return load_plan(
        f"name: s3\nseed: 1\ntarget: {{name: {target}, task: {task}}}\n"
        f"dataset: {json.dumps(dataset)}\n{section}"
        "corruptions: [{id: contrast, severities: [1]}]\n",
        local_catalogue(),
    )


def _store(
    endpoint: str, credentials: str = "team", prefix: str = "team-a/sets", **kw: str
) -> dict[str, Any]:
    return {
        "s3": {
            "bucket": BUCKET,
            "prefix": prefix,
            "endpoint_url": endpoint,
            "credentials": credentials,
            **kw,
        }
    }


def test_coco_webdataset_hf_and_folders_read_from_the_prefix(stores, endpoint):
    ds = PlanDatasets({}, stores=stores).for_tenant("tenant-a")
    coco = _plan(
        {
            "source": "coco",
            "path": "coco/ann.json",
            "images": "coco/val",
            "label_map": {"face": 0},
            "store": _store(endpoint),
        },
        "detection",
    )
    ds.check(coco)
    truths = ds.truths(coco)
    assert truths["a.png"]["boxes"] == [[1.0, 2.0, 3.0, 4.0]]
    assert truths["a.png"]["image_size"] == [20, 16]
    wds = _plan(
        {
            "source": "webdataset",
            "path": "wds/s-{000..001}.tar",
            "offset": 2,
            "limit": 3,
            "store": _store(endpoint),
        }
    )
    ds.check(wds)
    assert [(i, lab) for i, _, lab in ds.images(wds)] == [
        ("s0/k2", (2,)),
        ("s1/k0", (0,)),
        ("s1/k1", (1,)),
    ]
    hf = _plan(
        {"source": "hf", "path": "hf", "label_map": {"cat": 3, "dog": 5}, "store": _store(endpoint)}
    )
    ds.check(hf)
    imgs = ds.images(hf)
    assert [lab for _, _, lab in imgs] == [(3,), (5,), (5,)]
    assert imgs[0][1].shape == (12, 10, 3)
    pets = _plan({"source": "folders", "path": "pets", "store": _store(endpoint)})
    ds.check(pets)
    assert [(i, lab) for i, _, lab in ds.images(pets)] == [
        ("cat/0.png", (0,)),
        ("dog/0.png", (1,)),
        ("dog/1.png", (1,)),
    ]
    missing = _plan({"source": "folders", "path": "nothing", "store": _store(endpoint)})
    with pytest.raises(FortisError, match="no such folder under the S3 prefix"):
        ds.check(missing)


def _refused(fn: Any, cls: type[FortisError], field: str) -> str:
    with pytest.raises(cls) as e:
        fn()
    msg = e.value.message
    assert field in msg or any(
        v.field.startswith(field) for v in getattr(e.value, "violations", [])
    ), msg
    for secret in ("S3RVER", "NOT-THE-SECRET", "NOT-A-KEY", "Signature="):
        assert secret not in msg, msg
    return msg


def test_credentials_are_the_tenants_own(stores, endpoint):
    plan = _plan({"source": "hf", "path": "hf", "store": _store(endpoint, "theirs")})
    mine = _refused(
        lambda: PlanDatasets({}, stores=stores).for_tenant("tenant-a").check(plan),
        FailedPrecondition,
        "dataset.store.s3.credentials",
    )
    plan = _plan({"source": "hf", "path": "hf", "store": _store(endpoint, "nothing-here")})
    missing = _refused(
        lambda: PlanDatasets({}, stores=stores).for_tenant("tenant-a").check(plan),
        FailedPrecondition,
        "dataset.store.s3.credentials",
    )
    # another tenant's name and a name nobody has read the same
    assert mine.replace("theirs", "X") == missing.replace("nothing-here", "X")
    plan = _plan({"source": "hf", "path": "hf", "store": _store(endpoint, "instance")})
    _refused(
        lambda: PlanDatasets({}, stores=stores).for_tenant("tenant-a").check(plan),
        FailedPrecondition,
        "dataset.store.s3.credentials",
    )


def test_a_wrong_credential_is_refused_by_the_server(stores, endpoint):
    plan = _plan({"source": "hf", "path": "hf", "store": _store(endpoint, "wrong")})
    msg = _refused(
        lambda: PlanDatasets({}, stores=stores).for_tenant("tenant-a").images(plan),
        PermissionDenied,
        "dataset.store.s3.credentials",
    )
    assert "InvalidAccessKeyId" in msg or "(403)" in msg  # HEAD answers carry no body


def test_only_the_operators_endpoints(stores, endpoint):
    other = endpoint.replace("127.0.0.1", "localhost")
    plan = _plan({"source": "hf", "path": "hf", "store": _store(other)})
    _refused(
        lambda: PlanDatasets({}, stores=stores).for_tenant("tenant-a").check(plan),
        FailedPrecondition,
        "dataset.store.s3.endpoint_url",
    )


def test_keys_stay_under_the_prefix(stores, endpoint):
    ds = PlanDatasets({}, stores=stores).for_tenant("tenant-a")
    for path in ("../../team-b/private.json", "/team-b/private.json"):
        plan = _plan(
            {"source": "coco", "path": path, "label_map": {"face": 0}, "store": _store(endpoint)},
            "detection",
        )
        _refused(lambda plan=plan: ds.check(plan), FortisError, "dataset.path")
    plan = _plan({"source": "coco", "path": "private.json", "store": _store(endpoint)}, "detection")
    msg = _refused(lambda: ds.check(plan), FortisError, "dataset.path")
    assert "not found under the S3 prefix" in msg
    plan = _plan(
        {"source": "webdataset", "path": "wds/s-{000..005}.tar", "store": _store(endpoint)}
    )
    msg = _refused(lambda: ds.check(plan), FortisError, "dataset.path:wds/s-002.tar")
    assert "not found under the S3 prefix" in msg


def test_operator_file_never_takes_an_inline_secret(tmp_path):
    (tmp_path / "s.yaml").write_text(
        "s3:\n  tenants:\n    t:\n      c:\n"
        "        access_key_id: AKIAEXAMPLE\n"
        "        secret_access_key: wJalrXUtnFEMI/K7MDENG\n"
    )
    with pytest.raises(ValueError) as e:
        load_config(tmp_path / "s.yaml")
    assert "AKIAEXAMPLE" not in str(e.value) and "wJalr" not in str(e.value)
    assert "s3.tenants.t.c.access_key_id" in str(e.value)


def test_sizes_are_checked_before_reading_and_logs_carry_no_secret(
    stores, endpoint, caplog: pytest.LogCaptureFixture
):
    import logging

    from fortis.services.common.errors import InvalidArgument
    from fortis.services.evaluation.plan_model import S3Location

    caplog.set_level(logging.DEBUG)
    loc = S3Location(bucket=BUCKET, prefix="team-a/sets", endpoint_url=endpoint, credentials="team")
    store = stores("tenant-a", loc)
    ref = store.locate(PurePosixPath("coco"), "ann.json", "dataset.path")
    assert store.size(ref) == len(store.read(ref, 1 << 20, "dataset.path", "file"))
    requests = store.requests
    with pytest.raises(InvalidArgument, match="larger than 10 bytes"):
        store.read(ref, 10, "dataset.path", "annotations file")
    assert store.requests == requests  # refused by the HEAD's size, nothing fetched
    plan = _plan({"source": "hf", "path": "hf", "store": _store(endpoint, "wrong")})
    with pytest.raises(PermissionDenied):
        PlanDatasets({}, stores=stores).for_tenant("tenant-a").images(plan)
    logged = "\n".join(r.getMessage() for r in caplog.records)
    for secret in ("S3RVER", "NOT-A-KEY", "NOT-THE-SECRET", "Signature="):
        assert secret not in logged
