"""Evaluation artifacts in the evaluation store, on SQLite and on PostgreSQL, the same
assertions (workers on pods with no shared disk write the adversarial examples of their attack
items into the one shared store; SPEC CAN-9: adversarial examples kept as float arrays as well
as the images sent).

- put/list/get, content larger than one stored part, per tenant (another tenant's view sees
  nothing of it), names checked (no path can be built from one that leaves its folder);
- idempotent: the same bytes again write nothing; other bytes replace;
- two processes saving the same artifact at once leave one consistent artifact;
- ``RunContext.save_adversarials`` writes the npz (image_ids, adversarial_uint8,
  adversarial_float) into the store, its attack name made safe;
- ``fortis artifacts list|export`` (real subprocesses) on both back ends, and its refusals.
"""

from __future__ import annotations

import hashlib
import io
import json
import multiprocessing as mp
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fortis.services.common import errors
from fortis.services.evaluation.store import ARTIFACT_PART_BYTES, check_artifact_name

from tests.storage.conftest import Backend
from tests.storage.test_evaluation_store import open_store


@pytest.fixture()
def store(backend: Backend) -> Any:
    s = open_store(backend)
    yield s
    s.close()


def test_put_list_get_per_tenant(store: Any) -> None:
    a, b = store.for_tenant("tenant-a"), store.for_tenant("tenant-b")
    small = b"small artifact"
    big = os.urandom(2 * ARTIFACT_PART_BYTES + 1234)            # three stored parts
    ia = a.put_artifact("ev-1", "adversarial/fgsm-00000.npz", small)
    a.put_artifact("ev-1", "adversarial/fgsm-00001.npz", big)
    a.put_artifact("ev-2", "adversarial/fgsm-00000.npz", b"other evaluation")
    assert (ia.name, ia.size, ia.sha256) == ("adversarial/fgsm-00000.npz", len(small),
                                             hashlib.sha256(small).hexdigest())
    assert [(i.name, i.size) for i in a.artifacts("ev-1")] == [
        ("adversarial/fgsm-00000.npz", len(small)), ("adversarial/fgsm-00001.npz", len(big))]
    assert a.artifact("ev-1", "adversarial/fgsm-00001.npz") == big
    assert a.artifact("ev-1", "adversarial/nothing.npz") is None
    # another tenant: nothing of A's, even by the same evaluation id and name
    assert b.artifacts("ev-1") == [] and b.artifact("ev-1", "adversarial/fgsm-00000.npz") is None
    b.put_artifact("ev-1", "adversarial/fgsm-00000.npz", b"b's own")
    assert a.artifact("ev-1", "adversarial/fgsm-00000.npz") == small
    assert b.artifact("ev-1", "adversarial/fgsm-00000.npz") == b"b's own"
    with pytest.raises(RuntimeError):                           # never without a tenant
        store.artifacts("ev-1")


def test_the_same_bytes_again_write_nothing_other_bytes_replace(store: Any) -> None:
    a = store.for_tenant("tenant-a")
    first = a.put_artifact("ev-1", "adversarial/x-00000.npz", b"v1" * 1000)
    again = a.put_artifact("ev-1", "adversarial/x-00000.npz", b"v1" * 1000)
    assert again == first                                      # same row, same time
    big = os.urandom(ARTIFACT_PART_BYTES + 10)
    replaced = a.put_artifact("ev-1", "adversarial/x-00000.npz", big)
    assert replaced.sha256 == hashlib.sha256(big).hexdigest()
    assert a.artifact("ev-1", "adversarial/x-00000.npz") == big
    shorter = a.put_artifact("ev-1", "adversarial/x-00000.npz", b"short")   # fewer parts
    assert a.artifact("ev-1", "adversarial/x-00000.npz") == b"short" and shorter.size == 5
    assert len(a.artifacts("ev-1")) == 1


@pytest.mark.parametrize("name", ["", "../x.npz", "/etc/passwd", "a//b", ".hidden",
                                  "a/../b", "a/./b", "a\\b", "é.npz", "a b", "x" * 201,
                                  "a/" * 9 + "b", "a\x00b"])
def test_unsafe_names_are_refused(store: Any, name: str) -> None:
    with pytest.raises(errors.InvalidArgument) as e:
        store.for_tenant("t").put_artifact("ev-1", name, b"data")
    assert e.value.violations[0].field == "name"
    if len(name) > 20:
        assert name not in e.value.message                     # never echoed
    assert store.for_tenant("t").artifacts("ev-1") == []


def test_safe_names_are_kept() -> None:
    for name in ("adversarial/fgsm-00000.npz", "a", "_.._evil_name-00001.npz", "x" * 200):
        assert check_artifact_name(name) == name


def _save(backend: Backend, data: bytes, barrier: Any, out: Any) -> None:
    s = open_store(backend)
    try:
        barrier.wait(30)
        for _ in range(5):
            s.for_tenant("tenant-a").put_artifact("ev-1", "adversarial/a-00000.npz", data)
        out.put("ok")
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        out.put(f"{type(exc).__name__}: {exc}")
    finally:
        s.close()


def test_two_processes_save_the_same_artifact_at_once(store: Any, backend: Backend) -> None:
    """Two workers that both ran a chunk (a lease ran out) save it at once: one artifact,
    whole and consistent, whichever wrote last."""
    datas = [os.urandom(ARTIFACT_PART_BYTES + 100), os.urandom(ARTIFACT_PART_BYTES + 100)]
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_save, args=(backend, d, barrier, out)) for d in datas]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(60)
    assert results == ["ok", "ok"]
    a = store.for_tenant("tenant-a")
    (info,) = a.artifacts("ev-1")
    assert a.artifact("ev-1", info.name) in datas               # checked against its SHA-256


def test_save_adversarials_writes_the_npz_into_the_store(store: Any) -> None:
    from types import SimpleNamespace

    from fortis.services.evaluation.stages.base import RunContext

    a = store.for_tenant("tenant-a")
    ctx = SimpleNamespace(store=a, evaluation_id="ev-1")
    u8 = [np.full((4, 4, 3), i, np.uint8) for i in range(3)]
    f32 = [x.astype(np.float32) / 255 for x in u8]
    name = RunContext.save_adversarials(ctx, "fgsm", 2, ["i0", "i1", "i2"], u8, f32)  # type: ignore[arg-type]
    assert name == "adversarial/fgsm-00002.npz"
    npz = np.load(io.BytesIO(a.artifact("ev-1", name)), allow_pickle=False)
    assert sorted(npz.files) == ["adversarial_float", "adversarial_uint8", "image_ids"]
    assert list(npz["image_ids"]) == ["i0", "i1", "i2"]
    np.testing.assert_array_equal(npz["adversarial_uint8"], np.stack(u8))
    np.testing.assert_array_equal(npz["adversarial_float"], np.stack(f32))
    # a retried item saves the same chunk again: one artifact
    RunContext.save_adversarials(ctx, "fgsm", 2, ["i0", "i1", "i2"], u8, f32)  # type: ignore[arg-type]
    assert [i.name for i in a.artifacts("ev-1")] == [name]
    # an attack name that looks like a path is made safe; nothing else is written
    evil = RunContext.save_adversarials(ctx, "../../evil name", 0, ["i0"], u8[:1], f32[:1])  # type: ignore[arg-type]
    assert evil == "adversarial/_.._evil_name-00000.npz"
    assert store.for_tenant("tenant-b").artifacts("ev-1") == []


# -- fortis artifacts list|export (real processes) ------------------------------------------

def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fortis.server.cli", "artifacts", *args],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def _where(backend: Backend) -> list[str]:
    return ["--state-dir", str(backend.dir)] if backend.kind == "sqlite" else \
        ["--database-url", backend.url]


def test_cli_lists_and_exports(store: Any, backend: Backend, tmp_path: Path) -> None:
    a = store.for_tenant("tenant-a")
    a.insert(evaluation_id="ev-1", tenant="tenant-a", plan_text="p", plan_name="p")
    blobs = {"adversarial/fgsm-00000.npz": os.urandom(1000),
             "adversarial/fgsm-00001.npz": os.urandom(ARTIFACT_PART_BYTES + 7)}
    for name, data in blobs.items():
        a.put_artifact("ev-1", name, data)
    store.for_tenant("tenant-b").insert(evaluation_id="ev-1", tenant="tenant-b",
                                        plan_text="p", plan_name="p")
    r = _cli("list", "ev-1", "--tenant", "tenant-a", *_where(backend))
    assert r.returncode == 0, r.stderr
    listed = json.loads(r.stdout)
    assert (listed["evaluation_id"], listed["tenant"]) == ("ev-1", "tenant-a")
    assert [(x["name"], x["size"], x["sha256"]) for x in listed["artifacts"]] == [
        (n, len(d), hashlib.sha256(d).hexdigest()) for n, d in sorted(blobs.items())]
    out = tmp_path / "out"
    r = _cli("export", "ev-1", "--tenant", "tenant-a", "--out", str(out), *_where(backend))
    assert r.returncode == 0, r.stderr
    done = json.loads(r.stdout)
    assert done["bytes"] == sum(len(d) for d in blobs.values()) and len(done["files"]) == 2
    for name, data in blobs.items():
        assert (out / name).read_bytes() == data
    # another tenant's view of the same evaluation id: its own, empty
    r = _cli("list", "ev-1", "--tenant", "tenant-b", *_where(backend))
    assert r.returncode == 0 and json.loads(r.stdout)["artifacts"] == []
    # an evaluation the tenant does not have: exit 2 naming the evaluation
    r = _cli("list", "ev-9", "--tenant", "tenant-a", *_where(backend))
    assert r.returncode == 2 and "evaluation_id" in r.stderr and "Traceback" not in r.stderr
    # --out that is a file: exit 2 naming it
    (tmp_path / "file").write_text("x")
    r = _cli("export", "ev-1", "--tenant", "tenant-a", "--out", str(tmp_path / "file"),
             *_where(backend))
    assert r.returncode == 2 and "out" in r.stderr


def test_cli_refusals_name_the_setting(tmp_path: Path, postgres_url: str) -> None:
    r = _cli("list", "ev-1", "--tenant", "t", "--state-dir", str(tmp_path / "none"),
             env={"FORTIS_DATABASE_URL": ""})
    assert r.returncode == 2 and "state_dir" in r.stderr and "Traceback" not in r.stderr
    r = _cli("list", "ev-1", "--tenant", "t", "--database-url", "mysql://u:secret@h/db")
    assert r.returncode == 2 and "database_url" in r.stderr and "secret" not in r.stderr
    r = _cli("list", "ev-1", "--tenant", "t", "--database-url", postgres_url)   # not migrated
    assert r.returncode == 2 and "fortis db upgrade" in r.stderr
    r = _cli("list", "ev-1", "--state-dir", str(tmp_path))      # no tenant
    assert r.returncode == 2 and "tenant" in r.stderr
    r = _cli("list", "ev-1", "--tenant", "t", "--state-dir", str(tmp_path),
             "--database-url", postgres_url)
    assert r.returncode == 2 and "database_url" in r.stderr and "state_dir" in r.stderr
