"""The upload API over real loopback gRPC (no plan reads the server's disk: images
and tenant models come in through a client-streaming upload RPC storing content-addressed
blobs per tenant, with size and pixel limits checked from the header before decoding,
referenced from plans by id; IEEE-P3 image source, IEEE-P4 a report that repeats the run).

- A classification evaluation on Fashion-MNIST images written as PNG files, uploaded with a
  manifest, gives the same clean accuracy (IEEE-M1) as the same images from the built-in
  source; the report's plan names the manifest blob.
- Tenant isolation: B can neither see, use, list nor delete A's blob; each answer is exactly
  the one an unknown id gets (NOT_FOUND, same message), even when B uploads the same bytes.
- Hostile uploads: oversize declared size, a size lie, a PNG declaring 100000x100000 (refused
  from the header: the server's RSS barely moves), non-image bytes as IMAGE, a chunk over
  1 MiB, the tenant quota (RESOURCE_EXHAUSTED + QuotaFailure), a cancelled upload, ids with a
  bad charset: each a precise status naming the field, nothing partial kept on disk.
- One test speaks the protos alone (raw stubs, no SDK).
"""

from __future__ import annotations

import json
import os
import struct
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from fortis.client import FortisClient
from fortis.client.errors import InvalidArgument
from fortis.evaluation.v1 import uploads_pb2 as pb
from fortis.evaluation.v1 import uploads_pb2_grpc
from fortis.server.app.stack import StackSettings, TargetConfig, start_stack
from fortis.services.common.codec import encode_png
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from tests.conftest import API_KEY, MD, OTHER_KEY, OTHER_MD

MiB = 1024 * 1024
_TESTS = "corruptions:\n  - {id: contrast, severities: [1]}\n"


def _png_header(width: int, height: int) -> bytes:
    """The first bytes of a PNG declaring ``width`` x ``height`` (8-bit grey), then an IDAT."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    chunk = b"IHDR" + ihdr
    idat = b"IDAT" + zlib.compress(b"\x00" * 4096)
    return (b"\x89PNG\r\n\x1a\n" + struct.pack(">I", len(ihdr)) + chunk
            + struct.pack(">I", zlib.crc32(chunk)) + struct.pack(">I", len(idat) - 4) + idat
            + struct.pack(">I", zlib.crc32(idat)))


def _requests(kind: int, data: bytes, size: int | None = None, chunk: int = MiB,
              **header: Any) -> Iterator[pb.UploadBlobRequest]:
    yield pb.UploadBlobRequest(header=pb.UploadHeader(
        kind=kind, size=len(data) if size is None else size, **header))
    for i in range(0, len(data), chunk):
        yield pb.UploadBlobRequest(chunk=data[i:i + chunk])


def _refusal(call: Any, *args: Any, **kwargs: Any) -> tuple[grpc.StatusCode, str, list[str], Any]:
    """(code, message, BadRequest fields, the status) of ``call(*args, **kwargs)``, refused."""
    with pytest.raises(grpc.RpcError) as e:
        call(*args, **kwargs)
    status = rpc_status.from_call(e.value)
    fields: list[str] = []
    if status is not None:
        for d in status.details:
            br = error_details_pb2.BadRequest()
            if d.Unpack(br):
                fields += [v.field for v in br.field_violations]
    return e.value.code(), e.value.details(), fields, status


def _files(stack: Any) -> list[str]:
    """Every file under the stack's blob folders (the index aside)."""
    root = Path(stack.settings.state_dir) / "blobs"
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                  if p.is_file() and not p.name.startswith("blobs.sqlite"))


def _rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


@pytest.fixture()
def stub(channel: grpc.Channel) -> uploads_pb2_grpc.UploadServiceStub:
    return uploads_pb2_grpc.UploadServiceStub(channel)


# ---------------------------------------------------------------------------------------------
# End to end: uploaded images evaluated like the built-in ones
# ---------------------------------------------------------------------------------------------

def test_uploaded_fashion_mnist_pngs_evaluate_like_the_builtin_source(stack, tmp_path):
    from fortis.adapters.torch_models.datasets import load_fashion_mnist

    n = 12
    x, y = load_fashion_mnist("test", limit=n)
    folder = tmp_path / "pngs"
    folder.mkdir()
    with FortisClient(stack.address, api_key=API_KEY) as fc:
        rows = []
        for i in range(n):
            path = folder / f"fm-{i}.png"
            path.write_bytes(encode_png(x[i]))
            blob = fc.upload(path, kind="image")
            assert (blob.kind, blob.width, blob.height, blob.media_type) == \
                ("image", 28, 28, "image/png")
            rows.append({"id": f"fm-{i}", "image": blob.blob_id, "labels": [int(y[i])]})
        manifest = fc.upload("\n".join(json.dumps(r) for r in rows).encode(), kind="manifest")
        plan = ("name: uploaded\nseed: 3\ntarget: {name: fmnist-cnn, task: classification}\n"
                f"dataset: {{source: uploads, manifest: '{manifest.blob_id}', limit: {n}}}\n"
                "correctness: {mode: top1}\ncorruptions:\n  - {id: contrast, severities: [1]}\n")
        builtin = plan.replace(f"{{source: uploads, manifest: '{manifest.blob_id}', "
                               f"limit: {n}}}", f"{{source: fashion-mnist, split: test, "
                                                f"limit: {n}}}")
        assert fc.validate(plan)["plan_name"] == "uploaded"
        ev = fc.wait(fc.submit(plan).evaluation_id, timeout_s=120)
        ref = fc.wait(fc.submit(builtin).evaluation_id, timeout_s=120)
        assert ev.state.value == "SUCCEEDED", ev.error
        assert ref.state.value == "SUCCEEDED", ref.error
        assert int(ev.summary["m"]) == n
        # PNG is lossless: the same pixels, the same answers, the same accuracy (IEEE-M1)
        assert ev.summary["accuracy"] == ref.summary["accuracy"]
        assert ev.summary["average_robustness_corr"] == ref.summary["average_robustness_corr"]
        report = fc.report(ev.evaluation_id)
        text = json.dumps(report)
        # the report's plan pins the data by content (IEEE-P4: repeatable)
        assert manifest.blob_id in text

        # uploading the same bytes again is idempotent
        again = fc.upload(folder / "fm-0.png", kind="image")
        assert again.blob_id == rows[0]["image"] and again.already_existed

        # a manifest naming a blob of the wrong kind fails naming the line and field
        bad = fc.upload(json.dumps({"id": "m", "image": manifest.blob_id, "labels": [1]})
                        .encode(), kind="manifest")
        # (refused when submitted: ValidatePlan checks what the run would read)
        with pytest.raises(InvalidArgument) as info:
            fc.submit(plan.replace(manifest.blob_id, bad.blob_id)
                      .replace(f"limit: {n}", "limit: 1"))
        assert info.value.violations[0].field == "dataset.manifest:1.image", info.value


def test_plan_validation_names_the_manifest_field(stack):
    with FortisClient(stack.address, api_key=API_KEY) as fc:
        for manifest in ("", "sha256:xyz", "../../etc/passwd", "SHA256:" + "A" * 64):
            plan = ("name: p\ntarget: {name: fmnist-cnn, task: classification}\n"
                    f"dataset: {{source: uploads, manifest: '{manifest}'}}\n{_TESTS}")
            with pytest.raises(InvalidArgument) as e:
                fc.validate(plan)
            assert [v.field for v in e.value.violations] == ["dataset.manifest"]


# ---------------------------------------------------------------------------------------------
# Tenant isolation
# ---------------------------------------------------------------------------------------------

def test_another_tenants_blob_is_exactly_an_unknown_one(stack, stub):
    png = encode_png(np.full((8, 8), 7, np.uint8))
    a = stub.UploadBlob(_requests(pb.BLOB_KIND_IMAGE, png), metadata=MD).blob
    unknown = "sha256:" + "0" * 64

    def answer(blob_id: str, md: Any) -> list[tuple[grpc.StatusCode, str]]:
        out = []
        for call in (lambda: stub.GetBlob(pb.GetBlobRequest(blob_id=blob_id), metadata=md),
                     lambda: stub.DeleteBlob(pb.DeleteBlobRequest(blob_id=blob_id), metadata=md)):
            code, msg, _, _ = _refusal(call)
            out.append((code, msg.replace(blob_id, "<id>")))
        return out

    assert answer(a.blob_id, OTHER_MD) == answer(unknown, OTHER_MD)
    assert answer(a.blob_id, OTHER_MD)[0][0] == grpc.StatusCode.NOT_FOUND
    assert stub.ListBlobs(pb.ListBlobsRequest(), metadata=OTHER_MD).blobs == []
    # B's plan cannot use A's blob: the same failure as an unknown id
    with FortisClient(stack.address, api_key=OTHER_KEY) as fb:
        failures = []
        for blob_id in (a.blob_id, unknown):
            manifest = fb.upload(json.dumps({"image": blob_id, "labels": [0]}).encode(),
                                 kind="manifest")
            plan = ("name: b\ntarget: {name: fmnist-cnn, task: classification}\n"
                    f"dataset: {{source: uploads, manifest: '{manifest.blob_id}', limit: 1}}\n"
                    f"{_TESTS}")
            # refused when submitted (ValidatePlan checks what the run would read)
            with pytest.raises(InvalidArgument) as info:
                fb.submit(plan)
            failures.append(str(info.value).replace(blob_id, "<id>"))
        assert failures[0] == failures[1] and "dataset.manifest:1.image" in failures[0]
        # the same bytes uploaded by B are B's own blob (same id), and A's stays A's
        b = fb.upload(png, kind="image")
        assert b.blob_id == a.blob_id and not b.already_existed
        fb.delete_blob(b.blob_id)
    assert stub.GetBlob(pb.GetBlobRequest(blob_id=a.blob_id), metadata=MD).blob.size == len(png)


# ---------------------------------------------------------------------------------------------
# Hostile uploads: precise refusals, nothing partial kept
# ---------------------------------------------------------------------------------------------

def test_declared_size_over_the_kinds_maximum(stack, stub):
    for kind, size in ((pb.BLOB_KIND_IMAGE, 32 * MiB + 1), (pb.BLOB_KIND_MANIFEST, 16 * MiB + 1),
                       (pb.BLOB_KIND_MODEL, 256 * MiB + 1), (pb.BLOB_KIND_IMAGE, 0)):
        code, _, fields, _ = _refusal(stub.UploadBlob,
            _requests(kind, b"", size=size), metadata=MD)
        assert (code, fields) == (grpc.StatusCode.INVALID_ARGUMENT, ["header.size"]), (kind, size)
    assert _files(stack) == []


def test_more_bytes_than_declared_and_fewer(stack, stub):
    png = encode_png(np.zeros((16, 16), np.uint8))
    code, _, fields, _ = _refusal(stub.UploadBlob,
        _requests(pb.BLOB_KIND_IMAGE, png + b"x" * 100, size=len(png)), metadata=MD)
    assert (code, fields) == (grpc.StatusCode.INVALID_ARGUMENT, ["chunk"])
    code, _, fields, _ = _refusal(stub.UploadBlob,
        _requests(pb.BLOB_KIND_IMAGE, png, size=len(png) + 1), metadata=MD)
    assert (code, fields) == (grpc.StatusCode.INVALID_ARGUMENT, ["header.size"])
    code, _, fields, _ = _refusal(stub.UploadBlob,
        _requests(pb.BLOB_KIND_IMAGE, png, expected_sha256="sha256:" + "1" * 64), metadata=MD)
    assert (code, fields) == (grpc.StatusCode.INVALID_ARGUMENT, ["header.expected_sha256"])
    assert _files(stack) == []


def test_png_declaring_100000_squared_is_refused_from_its_header(stack, stub):
    """The header arrives in the first chunk; the refusal comes before the other 7 MiB are
    read and nothing is ever decoded (a decode would need 10 GB): RSS barely moves."""
    head = _png_header(100_000, 100_000)
    data = head + b"\x00" * (8 * MiB - len(head))
    before = _rss_kb()
    t0 = time.perf_counter()
    code, msg, fields, _ = _refusal(stub.UploadBlob,
        _requests(pb.BLOB_KIND_IMAGE, data), metadata=MD)
    elapsed = time.perf_counter() - t0
    grown_mb = (_rss_kb() - before) / 1024
    assert (code, fields) == (grpc.StatusCode.INVALID_ARGUMENT, ["chunk"])
    assert "100000x100000" in msg and len(msg) < 1024
    assert grown_mb < 100, grown_mb          # a decode would allocate ~10,000 MB
    assert elapsed < 10
    assert _files(stack) == []


def test_non_image_bytes_as_an_image_and_a_bad_model(stack, stub):
    for kind, data in ((pb.BLOB_KIND_IMAGE, b"GIF89a" + b"\x00" * 100),
                       (pb.BLOB_KIND_IMAGE, b"\x89PNG\r\n\x1a\n"),     # header cut short
                       (pb.BLOB_KIND_IMAGE, os.urandom(3000)),
                       (pb.BLOB_KIND_MODEL, b"not a zip archive")):
        if kind == pb.BLOB_KIND_IMAGE and data[:2] in (b"\x89P", b"\xff\xd8"):
            data = b"x" + data                                    # random bytes may start so
        code, msg, fields, _ = _refusal(stub.UploadBlob,
            _requests(kind, data), metadata=MD)
        assert (code, fields) == (grpc.StatusCode.INVALID_ARGUMENT, ["chunk"]), data[:10]
        assert len(msg) < 1024
    code, _, fields, _ = _refusal(stub.UploadBlob,
        _requests(pb.BLOB_KIND_UNSPECIFIED, b"abc"), metadata=MD)
    assert (code, fields) == (grpc.StatusCode.INVALID_ARGUMENT, ["header.kind"])
    code, _, fields, _ = _refusal(stub.UploadBlob,
        iter([pb.UploadBlobRequest(chunk=b"abc")]), metadata=MD)
    assert (code, fields) == (grpc.StatusCode.INVALID_ARGUMENT, ["header"])
    assert _files(stack) == []


def test_a_chunk_over_one_mib_is_refused(stack, stub):
    data = b"{}\n" * (MiB // 3 + 1000)
    code, _, fields, _ = _refusal(stub.UploadBlob,
        _requests(pb.BLOB_KIND_MANIFEST, data, chunk=len(data)), metadata=MD)
    assert (code, fields) == (grpc.StatusCode.INVALID_ARGUMENT, ["chunk"])
    assert _files(stack) == []
    # the same bytes in 1 MiB chunks are fine
    ok = stub.UploadBlob(_requests(pb.BLOB_KIND_MANIFEST, data), metadata=MD).blob
    assert ok.size == len(data)


def test_the_tenant_quota(tmp_path, fmnist_target):
    quota = 3 * 1024
    s = start_stack(StackSettings(
        state_dir=tmp_path / "state", api_keys={API_KEY: "tenant-a", OTHER_KEY: "tenant-b"},
        targets=[TargetConfig.parse("fmnist-cnn=builtin:fmnist-cnn")],
        upload_quota_bytes=quota))
    try:
        with grpc.insecure_channel(s.address) as ch:
            stub = uploads_pb2_grpc.UploadServiceStub(ch)
            first = os.urandom(2 * 1024)
            stub.UploadBlob(_requests(pb.BLOB_KIND_MANIFEST, first), metadata=MD)
            code, msg, _, status = _refusal(stub.UploadBlob,
                _requests(pb.BLOB_KIND_MANIFEST, os.urandom(1025)), metadata=MD)
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
            qf = [q for d in status.details
                  for q in [error_details_pb2.QuotaFailure()] if d.Unpack(q)]
            assert qf and qf[0].violations[0].subject == "tenant:tenant-a"
            # the other tenant's quota is its own; what fits still fits
            stub.UploadBlob(_requests(pb.BLOB_KIND_MANIFEST, os.urandom(quota)), metadata=OTHER_MD)
            stub.UploadBlob(_requests(pb.BLOB_KIND_MANIFEST, os.urandom(1024)), metadata=MD)
            listed = stub.ListBlobs(pb.ListBlobsRequest(), metadata=MD)
            assert (listed.used_bytes, listed.quota_bytes) == (quota, quota)
    finally:
        s.stop(0)


def test_a_cancelled_upload_leaves_nothing(stack, channel, stub):
    sent = threading.Event()
    release = threading.Event()

    def slow() -> Iterator[pb.UploadBlobRequest]:
        yield pb.UploadBlobRequest(header=pb.UploadHeader(kind=pb.BLOB_KIND_MANIFEST,
                                                          size=4 * MiB))
        yield pb.UploadBlobRequest(chunk=b"a" * MiB)
        sent.set()
        release.wait(10)
        yield pb.UploadBlobRequest(chunk=b"a" * MiB)

    fut = stub.UploadBlob.future(slow(), metadata=MD)
    assert sent.wait(10)
    root = Path(stack.settings.state_dir) / "blobs" / "tenant-a"
    deadline = time.time() + 5
    while time.time() < deadline and not any(root.glob("*.part")):
        time.sleep(0.02)
    assert any(root.glob("*.part"))             # the upload was in progress on disk
    fut.cancel()
    release.set()
    with pytest.raises(grpc.FutureCancelledError):
        fut.result()
    deadline = time.time() + 5
    while time.time() < deadline and _files(stack):
        time.sleep(0.05)
    assert _files(stack) == []
    # the reservation was released too: the whole quota is free again
    assert stub.ListBlobs(pb.ListBlobsRequest(), metadata=MD).used_bytes == 0


@pytest.mark.parametrize("blob_id", ["sha256:" + "g" * 64, "sha256:" + "A" * 64, "sha256:abc",
                                     "../../ledger.sqlite", "sha256:" + "0" * 64 + "/x", "x" * 71])
def test_ids_with_a_bad_charset(stub, blob_id):
    for call in (lambda: stub.GetBlob(pb.GetBlobRequest(blob_id=blob_id), metadata=MD),
                 lambda: stub.DeleteBlob(pb.DeleteBlobRequest(blob_id=blob_id), metadata=MD)):
        code, msg, fields, _ = _refusal(call)
        assert (code, fields) == (grpc.StatusCode.INVALID_ARGUMENT, ["blob_id"])
        assert blob_id not in msg


# ---------------------------------------------------------------------------------------------
# From the protos alone
# ---------------------------------------------------------------------------------------------

def test_raw_stubs_upload_get_list_page_and_delete(stub):
    """Only the generated stubs of uploads.proto: the id is the SHA-256 of the content,
    pages use opaque tokens, a token is bound to its tenant, delete removes."""
    import hashlib

    ids = []
    for i in range(5):
        data = json.dumps({"n": i}).encode()
        resp = stub.UploadBlob(_requests(pb.BLOB_KIND_MANIFEST, data, media_type="application/x-ndjson"),
                               metadata=MD)
        assert resp.blob.blob_id == "sha256:" + hashlib.sha256(data).hexdigest()
        assert not resp.already_existed and resp.blob.media_type == "application/x-ndjson"
        ids.append(resp.blob.blob_id)
    got = stub.GetBlob(pb.GetBlobRequest(blob_id=ids[2]), metadata=MD).blob
    assert (got.kind, got.size, got.width) == (pb.BLOB_KIND_MANIFEST, len(b'{"n": 2}'), 0)
    seen, token = [], ""
    while True:
        page = stub.ListBlobs(pb.ListBlobsRequest(page_size=2, page_token=token), metadata=MD)
        assert len(page.blobs) <= 2
        seen += [b.blob_id for b in page.blobs]
        token = page.next_page_token
        if not token:
            break
        code, _, fields, _ = _refusal(stub.ListBlobs,
            pb.ListBlobsRequest(page_token=token), metadata=OTHER_MD)
        assert (code, fields) == (grpc.StatusCode.INVALID_ARGUMENT, ["page_token"])
    assert sorted(seen) == sorted(ids) and len(seen) == 5
    assert stub.ListBlobs(pb.ListBlobsRequest(kind=pb.BLOB_KIND_IMAGE), metadata=MD).blobs == []
    stub.DeleteBlob(pb.DeleteBlobRequest(blob_id=ids[0]), metadata=MD)
    code, _, _, _ = _refusal(lambda: stub.GetBlob(pb.GetBlobRequest(blob_id=ids[0]), metadata=MD))
    assert code == grpc.StatusCode.NOT_FOUND


# ---------------------------------------------------------------------------------------------
# neural_style with an uploaded model (IEEE-A6), resolved in the caller's tenant
# ---------------------------------------------------------------------------------------------

def test_neural_style_reads_the_callers_uploaded_model(stack, channel, tmp_path):
    import torch
    from fortis.core.tensors import tensor_to_array
    from fortis.perturbation.v1 import perturbation_pb2 as ppb
    from fortis.perturbation.v1 import perturbation_pb2_grpc
    from fortis.services.common.codec import image_msg
    from fortis.services.perturbation.styles import NEURAL_BLEND
    from google.protobuf import struct_pb2

    class Invert(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return 1.0 - x

    path = tmp_path / "invert.pt"
    torch.jit.save(torch.jit.script(Invert()), str(path))
    with FortisClient(stack.address, api_key=API_KEY) as fc:
        model = fc.upload(path, kind="model")
        image = fc.upload(encode_png(np.zeros((4, 4), np.uint8)), kind="image")
    assert model.kind == "model"
    pt = perturbation_pb2_grpc.PerturbationServiceStub(channel)
    img = np.arange(48, dtype=np.uint8).reshape(4, 4, 3) * 5

    def apply(blob_id: str, md: Any) -> Any:
        params = struct_pb2.Struct()
        params.update({"model": blob_id})
        return pt.ApplyPerturbation(ppb.ApplyPerturbationRequest(
            perturbation_id="neural_style", severity=5, images=[image_msg("a", img)],
            params=params), metadata=md)

    out = tensor_to_array(apply(model.blob_id, MD).images[0].tensor, "images[0]")
    blend = NEURAL_BLEND[4]     # severity 5's blend weight
    expected = np.rint(np.clip((1 - blend) * img / 255.0 + blend * (1 - img / 255.0), 0, 1)
                       * 255).astype(np.uint8)
    assert np.abs(out.astype(int) - expected.astype(int)).max() <= 1
    # another tenant, an unknown id and a blob of the wrong kind: refused naming params.model;
    # the foreign id and the unknown one get the same answer
    answers = []
    for blob_id, md in ((model.blob_id, OTHER_MD), ("sha256:" + "5" * 64, OTHER_MD),
                        (image.blob_id, MD)):
        code, msg, fields, _ = _refusal(apply, blob_id, md)
        assert (code, fields) == (grpc.StatusCode.INVALID_ARGUMENT, ["params.model"]), msg
        answers.append(msg.replace(blob_id, "<id>"))
    assert answers[0] == answers[1] and answers[2] != answers[0]


# ---------------------------------------------------------------------------------------------
# The CLI (a real subprocess): fortis upload-dataset, then the printed snippet as the dataset
# ---------------------------------------------------------------------------------------------

def test_cli_upload_dataset_prints_a_snippet_that_runs(stack, tmp_path):
    import subprocess
    import sys

    from fortis.adapters.torch_models.datasets import load_fashion_mnist

    n = 6
    x, y = load_fashion_mnist("test", limit=n, offset=20)
    folder = tmp_path / "classes"
    for i in range(n):
        d = folder / str(int(y[i]))
        d.mkdir(parents=True, exist_ok=True)
        (d / f"img{i}.png").write_bytes(encode_png(x[i]))
    base = [sys.executable, "-m", "fortis.server.cli"]
    opts = ["--address", stack.address, "--api-key", API_KEY]
    r = subprocess.run([*base, "upload-dataset", str(folder), *opts], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    snippet = [line for line in r.stdout.splitlines() if line.startswith("dataset:")]
    assert len(snippet) == 1 and f"limit: {n}" in snippet[0]
    r2 = subprocess.run([*base, "upload", str(folder / str(int(y[0])) / "img0.png"), "--json",
                         *opts], capture_output=True, text=True, timeout=120)
    assert r2.returncode == 0, r2.stderr
    assert json.loads(r2.stdout)["already_existed"] is True      # uploaded by upload-dataset
    plan = ("name: cli\ntarget: {name: fmnist-cnn, task: classification}\n"
            f"{snippet[0]}\ncorrectness: {{mode: top1}}\n{_TESTS}")
    with FortisClient(stack.address, api_key=API_KEY) as fc:
        ev = fc.wait(fc.submit(plan).evaluation_id, timeout_s=120)
        assert ev.state.value == "SUCCEEDED", ev.error
        assert int(ev.summary["m"]) == n
    bad = subprocess.run([*base, "upload", str(tmp_path / "nope.png"), *opts],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "not a file" in bad.stderr


@pytest.mark.slow
def test_cli_upload_dataset_archive_packs_a_folder_and_prints_a_snippet_that_runs(stack,
                                                                                  tmp_path):
    """``upload-dataset --archive``: the class folders packed into a tar as they are sent (the
    format recognised from the layout), and the printed dataset section runs as it is."""
    import subprocess
    import sys

    from fortis.adapters.torch_models.datasets import load_fashion_mnist

    n = 6
    x, y = load_fashion_mnist("test", limit=n, offset=40)
    folder = tmp_path / "classes"
    for i in range(n):
        d = folder / str(int(y[i]))
        d.mkdir(parents=True, exist_ok=True)
        (d / f"img{i}.png").write_bytes(encode_png(x[i]))
    base = [sys.executable, "-m", "fortis.server.cli"]
    opts = ["--address", stack.address, "--api-key", API_KEY]
    r = subprocess.run([*base, "upload-dataset", str(folder), "--archive", *opts],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    snippet = [line for line in r.stdout.splitlines() if line.startswith("dataset:")]
    assert len(snippet) == 1 and '"source": "folders"' in snippet[0], r.stdout
    label_map = ", ".join(f"{c}: {c}" for c in range(10))
    dataset = json.loads(snippet[0][len("dataset:"):])
    plan = ("name: cli-archive\ntarget: {name: fmnist-cnn, task: classification}\n"
            f"dataset: {{source: folders, path: {dataset['path']}, label_map: {{{label_map}}}, "
            f"store: {{upload: '{dataset['store']['upload']}'}}}}\n"
            f"correctness: {{mode: top1}}\n{_TESTS}")
    with FortisClient(stack.address, api_key=API_KEY) as fc:
        ev = fc.wait(fc.submit(plan).evaluation_id, timeout_s=120)
        assert ev.state.value == "SUCCEEDED", ev.error
        assert int(ev.summary["m"]) == n
        blob = fc.get_blob(dataset["store"]["upload"])
        assert blob.kind == "archive" and blob.media_type == "application/x-tar"
    # a tar made elsewhere: its kind told from the suffix
    import tarfile

    with tarfile.open(tmp_path / "shard.tar.gz", "w:gz") as tf:
        tf.add(folder, arcname="classes")
    r3 = subprocess.run([*base, "upload", str(tmp_path / "shard.tar.gz"), "--json", *opts],
                        capture_output=True, text=True, timeout=120)
    assert r3.returncode == 0, r3.stderr
    assert json.loads(r3.stdout)["kind"] == "archive"
    # a link in the folder is refused before anything is sent
    (folder / str(int(y[0])) / "link.png").symlink_to("/etc/passwd")
    bad = subprocess.run([*base, "upload-dataset", str(folder), "--archive", *opts],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "links and special files are refused" in bad.stderr
