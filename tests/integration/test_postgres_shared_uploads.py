"""End to end: with ``database_url`` the uploads and the adversarial artifacts live in
the shared PostgreSQL, so processes that share no disk (pods: the evaluation service, a
separate perturbation service, worker Job pods each with their own empty state folder) run an
evaluation whose dataset is ``source: uploads`` (SPEC IEEE-P3 image source, IEEE-P4: the plan
names its data by content id), whose corruptions include ``neural_style`` with an uploaded
TorchScript model (IEEE-A6) and which has a transfer attack (fgsm on a surrogate), and the
adversarial examples of every chunk (CAN-9: uint8 as sent and float) land in the store
whichever worker ran it.

The images are photos (scikit-image's, 224x224 RGB) and the models ImageNet MobileNetV2 (the
target, and the surrogate of the white-box transfer attack): uploaded images are decoded as
RGB, and the Fashion-MNIST surrogate takes grey 28x28x1 images only, so an uploaded
Fashion-MNIST dataset cannot be attacked with it (the surrogate refuses, naming ``images``).
The labels are the target's own clean answers.

Everything is real: PostgreSQL (``tests/infra/postgres.py``), the gRPC stacks on loopback,
two ``fortis worker`` processes started by the evaluation service's process executor, each
with ``JOB_COMPLETION_INDEX`` and ``--state-dir <tmp>/worker-<index>`` (the pod's own
emptyDir), and the perturbation service as its own stack with its own state folder.

- The evaluation succeeds; the workers ran its items; the results equal the same plan run by
  one embedded SQLite stack on the same uploaded bytes (same blob ids), metrics and
  adversarial arrays alike.
- No process kept an upload or an artifact on its disk: no ``blobs`` or ``artifacts`` folder
  anywhere, the workers' folders hold no file; only the perturbation service's cache holds the
  model it materialised (checked by SHA-256).
- ``fortis artifacts export`` gets the artifacts out of the database.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa
from fortis.client import FortisClient, progress_of
from fortis.infra.storage import sqldb
from fortis.server.app.stack import StackSettings, TargetConfig, start_stack
from fortis.services.common.codec import encode_png

from tests.conftest import API_KEY
from tests.storage.conftest import migrate

N, BATCH = 16, 4
INTERNAL = "internal-test-key"
PLAN = """
name: shared-uploads
seed: 5
target: {{name: mobilenet-v2, task: classification}}
dataset: {{source: uploads, manifest: '{manifest}', limit: {n}}}
correctness: {{mode: top1}}
corruptions:
  - {{id: neural_style, severities: [5], params: {{model: '{model}'}}}}
  - {{id: contrast, severities: [3]}}
attacks:
  - {{id: fgsm, surrogate: mobilenet-v2, params: {{epsilon: 0.02}}}}
execution: {{batch_size: {batch}}}
"""


def _invert_model(path: Path) -> bytes:
    import torch

    class Invert(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return 1.0 - x

    torch.jit.save(torch.jit.script(Invert()), str(path))
    return path.read_bytes()


def _photos() -> tuple[np.ndarray, np.ndarray]:
    """N 224x224 RGB photos (four scikit-image photos, four views of each) and the target's
    clean answers as their labels."""
    import cv2
    from fortis.adapters.builtin import load_model
    from fortis.adapters.plan_sources import named_image

    out = []
    for name in ("astronaut", "chelsea", "coffee", "rocket"):
        img = named_image(name)
        h, w = img.shape[:2]
        views = [img, img[:, ::-1], img[h // 6:h * 5 // 6, w // 6:w * 5 // 6],
                 img[:h * 3 // 4, :w * 3 // 4]]
        out += [cv2.resize(np.ascontiguousarray(v), (224, 224), interpolation=cv2.INTER_AREA)
                for v in views]
    x = np.stack(out[:N])
    return x, np.asarray(load_model("mobilenet-v2").predict(x))


def _upload(address: str, tmp: Path) -> tuple[str, bytes, list[str]]:
    """The photos, their manifest and the style model, uploaded: the plan, the model's bytes
    and the image ids."""
    x, y = _photos()
    model = _invert_model(tmp / "invert.pt")
    rows, ids = [], []
    with FortisClient(address, api_key=API_KEY) as fc:
        for i in range(N):
            blob = fc.upload(encode_png(x[i]), kind="image")
            rows.append({"id": f"ph-{i:02d}", "image": blob.blob_id, "labels": [int(y[i])]})
            ids.append(f"ph-{i:02d}")
        manifest = fc.upload("\n".join(json.dumps(r) for r in rows).encode(), kind="manifest")
        model_blob = fc.upload(model, kind="model")
    return PLAN.format(manifest=manifest.blob_id, model=model_blob.blob_id, n=N,
                       batch=BATCH), model, ids


def _artifacts(store: Any, evaluation_id: str) -> dict[str, dict[str, np.ndarray]]:
    view = store.for_tenant("tenant-a")
    out = {}
    for a in view.artifacts(evaluation_id):
        npz = np.load(io.BytesIO(view.artifact(evaluation_id, a.name)), allow_pickle=False)
        out[a.name] = {k: npz[k] for k in npz.files}
    return out


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@pytest.fixture(scope="module")
def reference(tmp_path_factory: Any) -> tuple[dict, dict[str, dict[str, np.ndarray]]]:
    """The same plan on one embedded SQLite stack (uploads in its own state folder)."""
    tmp = tmp_path_factory.mktemp("reference")
    stack = start_stack(StackSettings(
        state_dir=tmp / "state", api_keys={API_KEY: "tenant-a"},
        whitebox_grants={"tenant-a": frozenset({"*"})},  # mobilenet-v2 is its own twin
        targets=[TargetConfig.parse("mobilenet-v2=builtin:mobilenet-v2")]))
    try:
        plan, _, _ = _upload(stack.address, tmp)
        with FortisClient(stack.address, api_key=API_KEY) as fc:
            fc.submit(plan, evaluation_id="ev-pods")
            final = fc.wait("ev-pods", timeout_s=600)
            assert progress_of(final).state == "SUCCEEDED", progress_of(final)
            report = fc.report("ev-pods")
        return report, _artifacts(stack.manager.store, "ev-pods")
    finally:
        stack.stop(0)


def test_workers_without_a_shared_disk_run_an_uploaded_dataset(
        tmp_path: Path, postgres_url: str, reference: tuple[dict, dict]) -> None:
    from fortis.services.evaluation.executors import ProcessExecutor, ProcessSettings

    migrate(postgres_url)
    common: dict[str, Any] = {"api_keys": {API_KEY: "tenant-a"}, "internal_key": INTERNAL,
                              "whitebox_grants": {"tenant-a": frozenset({"*"})},
                              "database_url": postgres_url}
    # the evaluation service (with the proxy, scoring and report) and, apart, the
    # perturbation service: two "pods", each with its own state folder
    stack = start_stack(StackSettings(
        state_dir=tmp_path / "evaluation-pod",
        targets=[TargetConfig.parse("mobilenet-v2=builtin:mobilenet-v2")], **common))
    perturbation = None
    try:
        perturbation = start_stack(StackSettings(
            state_dir=tmp_path / "perturbation-pod", only="perturbation",
            proxy_address=stack.address, **common))
        # worker "pods": `fortis worker` with its own empty state folder per index
        stack.manager.executor = ProcessExecutor(ProcessSettings(
            command=["/bin/sh", "-c", 'exec "$0" -m fortis.server.cli worker --lease 30 '
                     '--state-dir "$WORKER_ROOT/worker-$JOB_COMPLETION_INDEX"', sys.executable],
            shards=2, env={"FORTIS_DATABASE_URL": postgres_url, "FORTIS_INTERNAL_KEY": INTERNAL,
                           "WORKER_ROOT": str(tmp_path), "FORTIS_LOG_LEVEL": "warning"}),
            lambda: {"FORTIS_PROXY_ADDRESS": stack.address,
                     "FORTIS_PERTURBATION_ADDRESS": perturbation.address})
        plan, model, ids = _upload(stack.address, tmp_path)
        with FortisClient(stack.address, api_key=API_KEY) as fc:
            fc.submit(plan, evaluation_id="ev-pods")
            final = fc.wait("ev-pods", timeout_s=600)
            assert progress_of(final).state == "SUCCEEDED", progress_of(final)
            report = fc.report("ev-pods")
        stored = _artifacts(stack.manager.store, "ev-pods")
    finally:
        if perturbation is not None:
            perturbation.stop(0)
        stack.stop(0)

    # the workers ran every item (none was left to the evaluation service)
    engine = sqldb.create_engine(postgres_url)
    try:
        with engine.connect() as c:
            owners = dict(c.execute(sa.text(
                "SELECT lease_owner, COUNT(*) FROM items WHERE evaluation_id='ev-pods' AND"
                " done GROUP BY lease_owner")).all())
            chunk_rows = c.execute(sa.text("SELECT COUNT(*) FROM blob_chunks")).scalar_one()
    finally:
        engine.dispose()
    items = N // BATCH * 4           # clean, neural_style, contrast, fgsm
    print(json.dumps({"items_by_worker": owners}))
    assert sum(owners.values()) == items and "" not in owners, owners
    assert len(owners) == 2, owners                        # both worker pods ran items
    assert chunk_rows == N + 2                              # images, manifest, model: in PG

    # the same results as the embedded SQLite run on the same bytes
    ref_report, ref_artifacts = reference
    assert report["metrics"] == ref_report["metrics"]
    assert report["metrics"]["corruptions"]["neural_style"]["5"]["m"] == N
    assert report["metrics"]["attacks"]["fgsm"]["m"] == N

    # every fgsm chunk's adversarials in the store: ids in order, uint8 and float arrays
    names = [f"adversarial/fgsm-{c:05d}.npz" for c in range(N // BATCH)]
    assert sorted(stored) == names == sorted(ref_artifacts)
    assert [i for n in names for i in stored[n]["image_ids"]] == ids
    for n in names:
        a, r = stored[n], ref_artifacts[n]
        assert a["adversarial_uint8"].dtype == np.uint8
        assert a["adversarial_float"].shape == a["adversarial_uint8"].shape
        np.testing.assert_array_equal(a["adversarial_uint8"], r["adversarial_uint8"])
        np.testing.assert_array_equal(a["adversarial_float"], r["adversarial_float"])

    # no process kept an upload or an artifact on its disk
    for folder in ("blobs", "artifacts"):
        assert not list(tmp_path.rglob(folder)), folder
    for index in (0, 1):
        worker = tmp_path / f"worker-{index}"
        assert not worker.exists() or _files(worker) == [], _files(worker)
    cache = _files(tmp_path / "perturbation-pod")
    model_hex = hashlib.sha256(model).hexdigest()
    assert cache == [f"blob-cache/tenant-a/{model_hex}"], cache
    assert (tmp_path / "perturbation-pod" / cache[0]).read_bytes() == model

    # the operator gets them out of the database
    out = tmp_path / "export"
    r = subprocess.run([sys.executable, "-m", "fortis.server.cli", "artifacts", "export", "ev-pods",
                        "--tenant", "tenant-a", "--out", str(out)], capture_output=True,
                       text=True, timeout=120,
                       env={**os.environ, "FORTIS_DATABASE_URL": postgres_url})
    assert r.returncode == 0, r.stderr
    assert sorted(f["name"] for f in json.loads(r.stdout)["files"]) == names
    exported = np.load(out / names[-1], allow_pickle=False)
    np.testing.assert_array_equal(exported["adversarial_float"],
                                  stored[names[-1]]["adversarial_float"])
