"""The contract is language-neutral: a TargetService written in Node.js is tested by
Fortis through the proxy like any built-in target; a Node.js client drives an evaluation end to
end; `buf curl` (no Fortis code at all) talks to the services through reflection.

Real processes only: `node clients/node/target/server.js` as a subprocess, a real Fortis stack
on loopback, `node clients/node/client/fortis.js` and `buf curl` as subprocesses. The Node
packages are installed with `npm ci` on first use (clients/node, and the repository root for buf).
"""

from __future__ import annotations

import base64
import json
import re
import select
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from fortis.client import FortisClient, progress_of
from fortis.common.v1 import common_pb2
from fortis.infra.serving.server import error_from_rpc
from fortis.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from fortis.services.common import errors
from fortis.services.common.codec import image_msg

from tests.conftest import API_KEY, MD

ROOT = Path(__file__).resolve().parents[2]
NODE_DIR = ROOT / "clients" / "node"
TARGET_JS = NODE_DIR / "target" / "server.js"
CLIENT_JS = NODE_DIR / "client" / "fortis.js"
BUF = ROOT / "node_modules" / ".bin" / "buf"

PLAN = """
name: node-target-small
seed: 5
roles:
  tester: {name: "pytest", organisation: "Fortis CI"}
target: {name: node-target, task: classification}
dataset: {source: fashion-mnist, split: test, limit: 32}
correctness: {mode: top1}
corruptions:
  - {id: gaussian_noise, severities: [1, 3]}
  - {id: contrast, severities: [2]}
  - {id: brightness, severities: [4]}
"""
N_IMAGES = 32
N_SETTINGS = 4          # corruption settings: gaussian_noise@1, @3, contrast@2, brightness@4

# A query attack needs scores: the Node target returns full scores, so Square runs against it.
ATTACK_PLAN = PLAN + """attacks:
  - {id: square, params: {epsilon: 0.1, max_queries: 12}, limit: 6}
"""

BAD_PLAN = PLAN.replace("severities: [2]", "severities: [9]").replace(
    "id: brightness", "id: brightnes")


# -- fixtures ---------------------------------------------------------------------------------

def _npm_ci(folder: Path) -> None:
    """`npm ci` in folder unless its node_modules is already installed from the lock file."""
    marker = folder / "node_modules" / ".package-lock.json"
    lock = folder / "package-lock.json"
    if marker.is_file() and marker.stat().st_mtime >= lock.stat().st_mtime:
        return
    r = subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=folder, capture_output=True,
                       text=True, timeout=600)
    if r.returncode != 0:
        pytest.fail(f"npm ci in {folder} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")


@pytest.fixture(scope="module")
def node() -> str:
    """Path of node, with clients/node's packages installed."""
    node_bin, npm_bin = shutil.which("node"), shutil.which("npm")
    if not node_bin or not npm_bin:
        pytest.skip("Node.js and npm are needed for the Node client and target "
                    f"(node: {node_bin or 'missing'}, npm: {npm_bin or 'missing'})")
    _npm_ci(NODE_DIR)
    return node_bin


@pytest.fixture(scope="module")
def buf(node: str) -> Path:
    """buf from the repository root's npm tooling (package.json there)."""
    _npm_ci(ROOT)
    assert BUF.is_file(), f"{BUF} is missing after npm ci"
    return BUF


def _first_line(proc: subprocess.Popen, timeout: float) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    line = proc.stdout.readline() if ready else ""
    if not line:
        proc.kill()
        raise AssertionError(f"{proc.args} printed nothing in {timeout} s (exit {proc.poll()})")
    return line


class NodeTarget:
    def __init__(self, proc: subprocess.Popen, address: str, log: Path) -> None:
        self.proc, self.address, self.log = proc, address, log

    def calls(self) -> list[dict]:
        """Calls the Node target answered so far, from its --log-calls lines."""
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        return [json.loads(s) for s in lines if s.startswith("{")]

    def images_received(self) -> int:
        return sum(c["images"] for c in self.calls() if c["ok"])


@pytest.fixture()
def node_target(node: str, tmp_path: Path) -> Iterator[NodeTarget]:
    log = tmp_path / "node-target.log"
    with log.open("w") as err:
        proc = subprocess.Popen([node, str(TARGET_JS), "--address", "127.0.0.1:0", "--log-calls"],
                                stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        info = json.loads(_first_line(proc, 30))
        yield NodeTarget(proc, info["address"], log)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.fixture()
def node_stack(node_target: NodeTarget, tmp_path: Path) -> Iterator:
    """A real Fortis stack (all five services, auth on) whose only target is the Node one."""
    from fortis.server.app.stack import StackSettings, TargetConfig, start_stack

    s = start_stack(StackSettings(
        state_dir=tmp_path / "state", api_keys={API_KEY: "tenant-a"},
        targets=[TargetConfig.parse(f"node-target=grpc://{node_target.address}")],
        max_message_bytes=8 * 1024 * 1024))
    yield s
    s.stop(0)


# -- (1) a Node.js TargetService under test, through the proxy --------------------------------

def test_node_target_through_the_proxy(node_target, node_stack, tmp_path):
    ch = grpc.insecure_channel(node_stack.address)
    px = proxy_pb2_grpc.TargetProxyServiceStub(ch)
    # GetTargetInfo is forwarded to the Node target: its own label set, output kind, version
    info = px.GetTargetInfo(proxy_pb2.GetTargetInfoRequest(target="node-target"), metadata=MD).info
    assert info.name == "fmnist-linear-node" and len(info.labels) == 10
    assert info.labels[9] == "Ankle boot"
    assert info.task_type == common_pb2.TASK_TYPE_CLASSIFICATION
    assert info.output_kind == common_pb2.OUTPUT_KIND_FULL_SCORES
    assert (info.input.height, info.input.width, info.input.channels) == (28, 28, 1)
    assert info.version.startswith("node ")

    received0 = node_target.images_received()
    with FortisClient(node_stack.address, api_key=API_KEY) as fc:
        ev = fc.submit(PLAN)
        seen = []
        final = fc.wait(ev.evaluation_id, on_progress=seen.append)
        assert progress_of(final).state == "SUCCEEDED", final.error.message
        assert seen[-1].items_done == seen[-1].items_total == 1 + N_SETTINGS
        _, html = fc.write_report(ev.evaluation_id, tmp_path / "out")
        report = fc.report(ev.evaluation_id)
        eid = ev.evaluation_id
        clean = fc.session_stats(f"{eid}/clean")
        corr = fc.session_stats(f"{eid}/corruptions")

    assert report["target"]["name"] == "node-target"
    assert report["target"]["model_name"] == "fmnist-linear-node"
    assert report["target"]["labels_count"] == 10 and report["target"]["output_kind"] == "full_scores"
    m = report["metrics"]
    assert m["accuracy"]["m"] == N_IMAGES
    assert 0.5 <= m["accuracy"]["value"] <= 1.0          # a linear model: ~82% on the test split
    assert set(m["corruptions"]) == {"gaussian_noise", "contrast", "brightness"}
    assert set(m["corruptions"]["gaussian_noise"]) >= {"1", "3"}
    g = m["corruptions"]["gaussian_noise"]
    assert 0.0 <= g["3"]["robustness"] <= 1.0 and 0.0 <= g["1"]["robustness"] <= 1.0
    assert m["ranking"]["applicable"] is True           # full scores: NDCG/DRR apply
    assert "<html" in html.read_text().lower()

    # Query counts: the ledger (in the report and from GetSessionStats) equals the images sent,
    # and equals what the Node target itself says it received.
    sessions = report["ledger"]["sessions"]
    assert sessions == {f"{eid}/clean": N_IMAGES, f"{eid}/corruptions": N_IMAGES * N_SETTINGS}
    assert report["ledger"]["total_queries"] == N_IMAGES * (1 + N_SETTINGS)
    assert clean.queries_ok == N_IMAGES and clean.queries_failed == 0 and clean.calls_refused == 0
    assert len(clean.per_image) == N_IMAGES and all(q == 1 for q in clean.per_image.values())
    assert corr.queries_ok == N_IMAGES * N_SETTINGS and corr.queries_failed == 0
    assert sum(corr.per_image.values()) == N_IMAGES * N_SETTINGS
    assert corr.per_origin == {
        "gaussian_noise@1": N_IMAGES, "gaussian_noise@3": N_IMAGES,
        "contrast@2": N_IMAGES, "brightness@4": N_IMAGES}
    assert node_target.images_received() - received0 == N_IMAGES * (1 + N_SETTINGS)
    assert all(c["rpc"] == "Predict" for c in node_target.calls())
    ch.close()


def test_node_target_errors_and_raw_tensors_through_the_proxy(node_target, node_stack):
    """The Node target's INVALID_ARGUMENT (with a google.rpc.BadRequest naming the field) comes
    back through the proxy as Fortis's own; raw uint8 tensors work as well as PNG."""
    from fortis.adapters.torch_models.datasets import load_fashion_mnist

    x, y = load_fashion_mnist("test", limit=8)
    ch = grpc.insecure_channel(node_stack.address)
    px = proxy_pb2_grpc.TargetProxyServiceStub(ch)
    px.CreateSession(proxy_pb2.CreateSessionRequest(target="node-target", session_id="s-node"),
                     metadata=MD)
    png = px.Predict(proxy_pb2.PredictRequest(
        session_id="s-node", origin="clean", images=[image_msg(f"p{i}", im) for i, im in enumerate(x)]),
        metadata=MD)
    raw = px.Predict(proxy_pb2.PredictRequest(
        session_id="s-node", origin="clean",
        images=[image_msg(f"r{i}", im, raw=True) for i, im in enumerate(x)]), metadata=MD)
    top = [p.classification.classes[0].label for p in png.predictions]
    assert top == [p.classification.classes[0].label for p in raw.predictions]
    assert [p.image_id for p in raw.predictions] == [f"r{i}" for i in range(8)]
    scores = [c.score for c in png.predictions[0].classification.classes]
    assert len(scores) == 10 and abs(sum(scores) - 1) < 1e-4 and scores == sorted(scores, reverse=True)
    assert np.mean(np.array(top) == y) >= 0.5

    bad = common_pb2.Image(image_id="junk", encoded=b"not a png")
    with pytest.raises(grpc.RpcError) as ei:
        px.Predict(proxy_pb2.PredictRequest(session_id="s-node", origin="clean",
                                            images=[image_msg("ok", x[0]), bad]), metadata=MD)
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "images[1].encoded" in ei.value.details()
    with pytest.raises(grpc.RpcError) as ej:
        px.Predict(proxy_pb2.PredictRequest(session_id="s-node", origin="clean", images=[bad]),
                   metadata=MD)
    err = error_from_rpc(ej.value)          # the BadRequest detail, decoded
    assert isinstance(err, errors.InvalidArgument)
    assert err.violations[0].field == "images[0].encoded"
    assert "not a decodable PNG" in err.violations[0].description
    with FortisClient(node_stack.address, api_key=API_KEY) as fc:
        st = fc.session_stats("s-node")
    # 16 answered; the 3 images of the two refused calls are recorded as failed, not answered
    assert st.queries_ok == 16 and st.queries_failed == 3
    ch.close()


def test_node_target_predict_stream(node_target):
    """PredictStream straight to the Node target: one answer per batch, in order; a bad batch
    answers with its google.rpc.Status (BadRequest naming the field) and the stream goes on."""
    from fortis.adapters.torch_models.datasets import load_fashion_mnist
    from fortis.target.v1 import target_pb2, target_pb2_grpc
    from google.rpc import error_details_pb2

    x, _ = load_fashion_mnist("test", limit=4)
    req = target_pb2.PredictStreamRequest
    batches = [req(request_id="a", images=[image_msg("0", x[0]), image_msg("1", x[1])]),
               req(request_id="b", images=[common_pb2.Image(image_id="empty")]),
               req(request_id="c", images=[image_msg("3", x[3], raw=True)])]
    with grpc.insecure_channel(node_target.address) as ch:
        answers = list(target_pb2_grpc.TargetServiceStub(ch).PredictStream(iter(batches), timeout=30))
    assert [a.request_id for a in answers] == ["a", "b", "c"]
    assert [p.image_id for p in answers[0].predictions] == ["0", "1"] and not answers[0].HasField("error")
    assert answers[1].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0] and not answers[1].predictions
    br = error_details_pb2.BadRequest()
    assert answers[1].error.details[0].Unpack(br) and br.field_violations[0].field == "images[0]"
    assert len(answers[2].predictions[0].classification.classes) == 10
    assert [(c["rpc"], c["images"], c["ok"]) for c in node_target.calls()] == [
        ("PredictStream", 2, True), ("PredictStream", 1, False), ("PredictStream", 1, True)]


def test_query_attack_against_the_node_target(node_target, node_stack):
    """Square (score-based) runs through the proxy against the Node target's full scores;
    every query it makes is in the ledger and reached the Node target."""
    received0 = node_target.images_received()
    with FortisClient(node_stack.address, api_key=API_KEY) as fc:
        ev = fc.submit(ATTACK_PLAN)
        final = fc.wait(ev.evaluation_id)
        assert progress_of(final).state == "SUCCEEDED", final.error.message
        report = fc.report(ev.evaluation_id)
        sessions = report["ledger"]["sessions"]
        for sid, n in sessions.items():
            assert fc.session_stats(sid).queries_ok == n, sid
    sq = report["metrics"]["attacks"]["square"]
    assert sq["m"] == 6 and sq["query_budget"] == 12 and sq["median_queries"] <= 12
    attack_queries = sum(n for sid, n in sessions.items() if "/attack" in sid)
    assert 0 < attack_queries <= 6 * 12
    assert report["ledger"]["total_queries"] == sum(sessions.values())
    assert node_target.images_received() - received0 == report["ledger"]["total_queries"]


# -- (2) the Node.js client drives Fortis ------------------------------------------------------

def _client(node: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([node, str(CLIENT_JS), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def test_node_client_runs_a_plan(node, node_stack, tmp_path):
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN)
    out = tmp_path / "node-out"
    conn = ["--address", node_stack.address, "--api-key", API_KEY]
    r = _client(node, "run", str(plan), *conn, "--out", str(out))
    assert r.returncode == 0, r.stderr
    # progress lines from the WatchEvaluation stream, on stderr
    progress = re.findall(r"^\[(\w+)\] (\d+)/(\d+) items, (\d+) queries", r.stderr, re.M)
    stages = [p[0] for p in progress]
    assert "corruptions" in stages and stages[-1] == "done", r.stderr
    assert progress[-1][1:] == (str(1 + N_SETTINGS), str(1 + N_SETTINGS),
                                str(N_IMAGES * (1 + N_SETTINGS)))
    done = json.loads(r.stdout.strip().splitlines()[-1])
    assert done["state"] == "SUCCEEDED" and done["queries"] == N_IMAGES * (1 + N_SETTINGS)
    assert done["summary"]["m"] == N_IMAGES
    report = json.loads((out / "report.json").read_text())
    assert report["evaluation"]["id"] == done["evaluation_id"]
    assert report["metrics"]["accuracy"]["m"] == N_IMAGES
    assert report["plan_text"] == PLAN                       # the YAML went as-is
    html = (out / "report.html").read_text()
    assert html.lstrip().lower().startswith("<!doctype html") or "<html" in html.lower()
    assert done["evaluation_id"] in html

    # the same evaluation, seen from Python and from the Node client's other commands
    with FortisClient(node_stack.address, api_key=API_KEY) as fc:
        assert progress_of(fc.get(done["evaluation_id"])).state == "SUCCEEDED"
    g = _client(node, "get", done["evaluation_id"], *conn)
    assert g.returncode == 0 and json.loads(g.stdout)["state"] == "SUCCEEDED"
    t = _client(node, "targets", *conn)
    assert t.returncode == 0 and json.loads(t.stdout.splitlines()[0])["name"] == "node-target"

    # a bad plan: the server's INVALID_ARGUMENT, each field named, exit 2, nothing written
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD_PLAN)
    r = _client(node, "run", str(bad), *conn, "--out", str(tmp_path / "bad-out"))
    assert r.returncode == 2, r.stderr
    assert "INVALID_ARGUMENT" in r.stderr
    assert "corruptions[1].severities[0]: must be an integer in 1..5, got 9" in r.stderr
    assert "corruptions[2].id: unknown corruption 'brightnes'" in r.stderr
    assert not (tmp_path / "bad-out").exists()

    # a wrong API key: UNAUTHENTICATED, exit 1
    r = _client(node, "run", str(plan), "--address", node_stack.address, "--api-key", "wrong",
                "--out", str(tmp_path / "x"))
    assert r.returncode == 1 and "UNAUTHENTICATED" in r.stderr


# -- (3) buf curl, through reflection ----------------------------------------------------------

def test_buf_curl_lists_targets_through_reflection(buf, node_target, node_stack):
    url = f"http://{node_stack.address}/fortis.proxy.v1.TargetProxyService/ListTargets"
    base = [str(buf), "curl", "--protocol", "grpc", "--http2-prior-knowledge"]
    t0 = time.monotonic()
    r = subprocess.run([*base, "-H", f"x-api-key: {API_KEY}", url], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"targets": [{"name": "node-target"}]}
    assert time.monotonic() - t0 < 30
    # without the key: UNAUTHENTICATED (reflection itself needs none)
    r = subprocess.run([*base, url], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and json.loads(r.stderr)["code"] == "unauthenticated"
    # every Fortis service is discoverable
    r = subprocess.run([*base, "--list-methods", f"http://{node_stack.address}"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "fortis.evaluation.v1.EvaluationService/CreateEvaluation" in r.stdout.split()
    # and buf curl reaches the Node target straight from the protos (no reflection there)
    r = subprocess.run([*base, "--schema", str(ROOT / "protos"),
                        f"http://{node_target.address}/fortis.target.v1.TargetService/GetTargetInfo"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["info"]["outputKind"] == "OUTPUT_KIND_FULL_SCORES"


def test_buf_curl_reads_answers_built_in_their_wire_form(buf, node_stack, tmp_path):
    """ApplyPerturbation's answer is written as bytes by Fortis itself (infra/serving/wire.py,
    the pixels copied off the interpreter lock), not by protobuf: another runtime (buf's, in
    Go, the schema from reflection) reads the same images the Python stubs read, for a raw
    answer past the size where the lock-free copy starts and for a PNG one."""
    from fortis.perturbation.v1 import perturbation_pb2 as ppb
    from fortis.perturbation.v1 import perturbation_pb2_grpc as ppb_grpc

    img = np.random.default_rng(4).integers(0, 256, (200, 160, 3), dtype=np.uint8)  # 96 KB
    url = (f"http://{node_stack.address}/fortis.perturbation.v1.PerturbationService/"
           "ApplyPerturbation")
    base = [str(buf), "curl", "--protocol", "grpc", "--http2-prior-knowledge",
            "-H", f"x-api-key: {API_KEY}"]
    stub = ppb_grpc.PerturbationServiceStub(grpc.insecure_channel(node_stack.address))
    for encoding in ("IMAGE_ENCODING_UNSPECIFIED", "IMAGE_ENCODING_PNG"):
        body = {"perturbationId": "gaussian_noise", "severity": 3, "seed": 7,
                "responseEncoding": encoding,
                "images": [{"imageId": "bild-ä", "tensor": {
                    "dtype": "D_TYPE_UINT8", "shape": list(img.shape),
                    "data": base64.b64encode(img.tobytes()).decode()}}]}
        req_file = tmp_path / f"{encoding}.json"
        req_file.write_text(json.dumps(body))
        r = subprocess.run([*base, "-d", f"@{req_file}", url], capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0, r.stderr
        (got,) = json.loads(r.stdout)["images"]
        mine = stub.ApplyPerturbation(
            ppb.ApplyPerturbationRequest(
                perturbation_id="gaussian_noise", severity=3, seed=7,
                response_encoding=ppb.ImageEncoding.Value(encoding),
                images=[image_msg("bild-ä", img, raw=True)]),
            metadata=MD, timeout=120).images[0]
        assert got["imageId"] == mine.image_id == "bild-ä"
        if encoding == "IMAGE_ENCODING_PNG":
            assert base64.b64decode(got["encoded"]) == mine.encoded
        else:
            assert [int(x) for x in got["tensor"]["shape"]] == list(img.shape)
            data = base64.b64decode(got["tensor"]["data"])
            assert data == mine.tensor.data and len(data) == img.nbytes
            assert not np.array_equal(np.frombuffer(data, np.uint8).reshape(img.shape), img)
