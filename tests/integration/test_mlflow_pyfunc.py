"""The MLflow pyfunc target (``mlflow+http://``) against REAL MLflow scoring servers:
MLflow 3.17.2 in its own venv (.venv-mlflow, scripts/setup_mlflow.sh), pyfunc models saved by
MLflow's own ``mlflow.pyfunc.save_model`` (tests/fixtures/mlflow/log_models.py: numpy colour
classifier, labeller and detector) and served by ``mlflow models serve --env-manager local``
on loopback, reached through the Fortis proxy with each request format (``inputs``,
``instances``, ``dataframe_split``). The right answers come from how the test drew each image.
Skipped, with the reason, when MLflow cannot be installed or started here.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from fortis.common.v1 import common_pb2
from fortis.core.answers import DetectionAnswers
from fortis.core.boxes import pair_iou
from fortis.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from fortis.services.common.codec import image_msg
from google.rpc import code_pb2

from tests.conftest import MD
from tests.integration._kserve_support import (
    ROOT,
    _http_status,
    free_port,
    ledger,
    session,
)
from tests.integration._plan_support import (
    DETECTION,
    check_accuracy,
    check_ledger,
    classification_manifest,
    detection_manifest,
    plan,
    run_plan,
    start_stack_with_data,
)

MLFLOW_VENV = ROOT / os.environ.get("MLFLOW_VENV", ".venv-mlflow")  # as setup_mlflow.sh
SETUP = ROOT / "scripts" / "setup_mlflow.sh"
LOG_MODELS = ROOT / "tests" / "fixtures" / "mlflow" / "log_models.py"
COLOURS = {0: (230, 20, 20), 1: (20, 230, 20), 2: (20, 20, 230)}
NAMES = ["red", "green", "blue"]
MODELS = ("classifier", "labeller", "detector", "detector-list")
SECRET = "mlflow-token-5f1d0c7e9a"


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)  # its own session: the server and its workers
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)


@pytest.fixture(scope="module")
def mlflow_ports(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, int]]:
    """One ``mlflow models serve`` per model, on free loopback ports."""
    setup = subprocess.run(
        ["bash", str(SETUP)], cwd=ROOT, capture_output=True, text=True, timeout=1500
    )
    if setup.returncode != 0 or not (MLFLOW_VENV / "bin" / "mlflow").exists():
        tail = [
            ln
            for ln in (setup.stderr + setup.stdout).splitlines()
            if not ln.startswith("WARNING: Location")
        ][-8:]
        pytest.skip(
            f"MLflow could not be installed by {SETUP.name} (exit {setup.returncode}): "
            + " | ".join(tail)
        )
    work = tmp_path_factory.mktemp("mlflow")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(
        PATH=f"{MLFLOW_VENV / 'bin'}:{env.get('PATH', '')}",
        PYTHONDONTWRITEBYTECODE="1",
        MLFLOW_TRACKING_URI=(work / "mlruns").as_uri(),
        OMP_NUM_THREADS="1",
    )
    logged = subprocess.run(
        [str(MLFLOW_VENV / "bin" / "python"), str(LOG_MODELS), str(work)],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert logged.returncode == 0, logged.stderr[-2000:]
    ports: dict[str, int] = {}
    procs: list[tuple[subprocess.Popen[bytes], Path]] = []
    try:
        for name in MODELS:
            ports[name] = port = free_port()
            log = work / f"{name}.log"
            with open(log, "wb") as fh:
                procs.append(
                    (
                        subprocess.Popen(
                            [
                                str(MLFLOW_VENV / "bin" / "mlflow"),
                                "models",
                                "serve",
                                "-m",
                                str(work / name),
                                "--env-manager",
                                "local",
                                "-h",
                                "127.0.0.1",
                                "-p",
                                str(port),
                                "-w",
                                "1",
                            ],
                            cwd=work,
                            env=env,
                            stdout=fh,
                            stderr=subprocess.STDOUT,
                            start_new_session=True,
                        ),
                        log,
                    )
                )
        deadline = time.monotonic() + 180
        for (proc, log), port in zip(procs, ports.values(), strict=True):
            while _http_status(f"http://127.0.0.1:{port}/ping") != 200:
                if proc.poll() is not None or time.monotonic() > deadline:
                    tail = log.read_text(errors="replace").splitlines()[-12:]
                    pytest.skip(
                        f"mlflow models serve did not start (exit {proc.poll()}): "
                        + " | ".join(tail)
                    )
                time.sleep(0.25)
        yield ports
    finally:
        for proc, _ in procs:
            _stop(proc)


def _targets(p: dict[str, int]) -> dict[str, str]:
    c, lab, d, dl = (f"mlflow+http://127.0.0.1:{p[m]}" for m in MODELS)
    return {
        "cls-inputs": f"{c}?labels=LABELS",
        "cls-instances": f"{c}/invocations?request=instances&resize=32x40&num_classes=3",
        "cls-labels": f"{lab}?output=labels&labels=LABELS",
        "det-df": f"{d}?request=dataframe_split&task=detection&labels=LABELS",
        # PNGs resized to 48x64 for the model: its pixel boxes are scaled back
        "det-df-resized": f"{d}?request=dataframe_split&task=detection&resize=48x64&labels=LABELS",
        # base64 files as "instances"; a list of per-image dicts back
        "det-list": f"{dl}?request=instances&input=bytes&task=detection&labels=LABELS",
        # hostile: the classifier fed files (its own error, HTTP 400), the detector's dict read
        # as classification scores, a token that must never be echoed
        "cls-fed-files": f"{c}?request=dataframe_split&token_env=FORTIS_TEST_MLFLOW_TOKEN",
        "det-as-cls": f"{d}?request=dataframe_split",
    }


@pytest.fixture(scope="module")
def plan_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The data root of the stack's plans: their manifests and images."""
    return tmp_path_factory.mktemp("mlflow-plan-data")


@pytest.fixture(scope="module")
def stack(mlflow_ports, plan_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    work = tmp_path_factory.mktemp("mlflow-stack")
    labels = work / "labels.txt"
    labels.write_text("\n".join(NAMES) + "\n", encoding="utf-8")
    os.environ["FORTIS_TEST_MLFLOW_TOKEN"] = SECRET
    targets = {k: v.replace("LABELS", str(labels)) for k, v in _targets(mlflow_ports).items()}
    s = start_stack_with_data(work / "state", plan_data, targets)
    try:
        yield s
    finally:
        s.stop(0)
        os.environ.pop("FORTIS_TEST_MLFLOW_TOKEN", None)


def _scenes(seed: int, n: int, many: bool) -> list[tuple[str, np.ndarray, list[Any]]]:
    """Grey noisy images; ``many``: 1-3 rectangles of distinct colours in separate thirds,
    else one rectangle. Truth: (class, pixel xyxy) of each."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        h, w = [(48, 72), (60, 90), (48, 72)][i % 3]
        img = rng.integers(80, 170, (h, w, 3), dtype=np.uint8)
        truth = []
        classes = rng.permutation(3)[: int(rng.integers(1, 4)) if many else 1].tolist()
        third = w // 3 if many else w
        for slot, c in enumerate(classes):
            bw, bh = int(rng.integers(6, third - 2)), int(rng.integers(6, h - 4))
            x0, y0 = slot * third + int(rng.integers(0, third - bw)), int(rng.integers(0, h - bh))
            img[y0 : y0 + bh, x0 : x0 + bw] = COLOURS[c]
            truth.append((c, (x0, y0, x0 + bw, y0 + bh)))
        out.append((f"s{seed}-{i}", img, truth))
    return out


def _predict(stack: Any, target: str, scenes: list[Any]) -> tuple[Any, str, Any]:
    px = proxy_pb2_grpc.TargetProxyServiceStub(grpc.insecure_channel(stack.address))
    sid = session(px, target)
    resp = px.Predict(
        proxy_pb2.PredictRequest(
            session_id=sid, origin="clean", images=[image_msg(name, img) for name, img, _ in scenes]
        ),
        metadata=MD,
    )
    return px, sid, resp


@pytest.mark.slow
@pytest.mark.parametrize("target", ["cls-inputs", "cls-instances", "cls-labels"])
def test_classification_through_the_proxy(stack, target):
    scenes = _scenes(7, 6, many=False)
    px, sid, resp = _predict(stack, target, scenes)
    info = px.GetTargetInfo(proxy_pb2.GetTargetInfoRequest(target=target), metadata=MD).info
    assert info.task_type == common_pb2.TASK_TYPE_CLASSIFICATION
    assert list(info.labels) == (NAMES if target != "cls-instances" else ["0", "1", "2"])
    for (name, _img, truth), pred in zip(scenes, resp.predictions, strict=True):
        ((c, (x0, y0, x1, y1)),) = truth
        top = pred.classification.classes[0]
        assert top.label == c, name
        if target == "cls-labels":
            assert info.output_kind == common_pb2.OUTPUT_KIND_LABEL_ONLY
            assert len(pred.classification.classes) == 1 and top.name == NAMES[c]
            continue
        assert info.output_kind == common_pb2.OUTPUT_KIND_FULL_SCORES
        assert len(pred.classification.classes) == 3
        scores = sorted((k.label, k.score) for k in pred.classification.classes)
        assert abs(sum(s for _, s in scores) - 1.0) < 1e-5
        if target == "cls-inputs":
            # the model's documented rule on the image as drawn: (area + 1) / (area + 3)
            area = (x1 - x0) * (y1 - y0)
            assert abs(scores[c][1] - (area + 1) / (area + 3)) < 1e-6, name
    st = px.GetSessionStats(proxy_pb2.GetSessionStatsRequest(session_id=sid), metadata=MD)
    assert (st.queries_ok, st.queries_failed) == (len(scenes), 0)
    assert {r.status for r in ledger(px, sid)} == {code_pb2.OK}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("target", "min_iou"), [("det-df", 0.999), ("det-df-resized", 0.75), ("det-list", 0.999)]
)
def test_detection_through_the_proxy(stack, target, min_iou):
    scenes = _scenes(11, 6, many=True)
    px, sid, resp = _predict(stack, target, scenes)
    info = px.GetTargetInfo(proxy_pb2.GetTargetInfoRequest(target=target), metadata=MD).info
    assert info.task_type == common_pb2.TASK_TYPE_DETECTION
    assert info.output_kind == common_pb2.OUTPUT_KIND_BOXES
    answers = DetectionAnswers.from_proto(resp.predictions)
    ends = np.cumsum(answers.counts)
    for i, (name, img, truth) in enumerate(scenes):
        rows = range(int(ends[i] - answers.counts[i]), int(ends[i]))
        got = {int(answers.labels[r]): answers.boxes[r].astype(np.float64) for r in rows}
        assert sorted(got) == sorted(c for c, _ in truth), name
        for c, box in truth:
            iou = float(pair_iou(np.asarray([box], np.float64), got[c][None, :])[0])
            assert iou >= min_iou, (name, c, iou)
            assert (
                0 <= got[c][0] < got[c][2] <= img.shape[1]
                and 0 <= got[c][1] < got[c][3] <= img.shape[0]
            )
        assert {b.name for b in resp.predictions[i].detection.boxes} == {NAMES[c] for c, _ in truth}
    st = px.GetSessionStats(proxy_pb2.GetSessionStatsRequest(session_id=sid), metadata=MD)
    assert (st.queries_ok, st.queries_failed) == (len(scenes), 0)


@pytest.mark.slow
def test_whole_plans_against_the_pyfunc_models(stack, plan_data, tmp_path):
    """A classification plan against the classifier (``inputs``) and a detection plan against
    the detector (``dataframe_split``), through all five services to the scoring servers:
    both succeed, the report's clean accuracy is what the manifests' truth implies, and the
    ledger holds each image's clean and corrupted query and nothing else. Two of six images
    are labelled with another colour than drawn; in two of five scenes the truth swaps the
    colours of two rectangles (or names a colour not drawn), so those cannot match."""
    cls = []
    for k, (name, img, ((c, _box),)) in enumerate(_scenes(21, 6, many=False)):
        label = c if k % 3 else (c + 1) % 3  # images 0 and 3 mislabelled
        cls.append((name, img, label, label == c))
    manifest = classification_manifest(
        plan_data, "mlflow-cls", [(i, img, lab) for i, img, lab, _ in cls]
    )
    run = run_plan(
        stack.address, plan("mlflow-cls", "cls-inputs", "classification", manifest), tmp_path / "c"
    )
    check_accuracy(run, [right for *_, right in cls])
    check_ledger(run, "cls-inputs", [i for i, *_ in cls])

    det = []
    for k, (name, img, truth) in enumerate(_scenes(23, 5, many=True)):
        objects = list(truth)
        if k in (1, 4) and len(objects) >= 2:
            (c0, b0), (c1, b1) = objects[:2]
            objects[:2] = [(c1, b0), (c0, b1)]
        elif k in (1, 4):
            objects = [((objects[0][0] + 1) % 3, objects[0][1])]
        det.append((name, img, objects, objects == truth))
    assert [right for *_, right in det] == [True, False, True, True, False]
    manifest = detection_manifest(
        plan_data, "mlflow-det", [(i, img, objs) for i, img, objs, _ in det]
    )
    run = run_plan(
        stack.address,
        plan("mlflow-det", "det-df", "detection", manifest, DETECTION),
        tmp_path / "d",
    )
    check_accuracy(run, [right for *_, right in det])
    check_ledger(run, "det-df", [i for i, *_ in det])


@pytest.mark.slow
def test_server_errors_and_unusable_answers_are_precise(stack, capfd):
    scenes = _scenes(3, 2, many=False)
    px = proxy_pb2_grpc.TargetProxyServiceStub(grpc.insecure_channel(stack.address))
    for target, words in (
        ("cls-fed-files", ("HTTP 400", "expected [N, H, W, 3] pixels")),
        ("det-as-cls", ("expected a list of 2 answers", "got dict")),
    ):
        sid = session(px, target)
        with pytest.raises(grpc.RpcError) as ei:
            px.Predict(
                proxy_pb2.PredictRequest(
                    session_id=sid,
                    origin="x",
                    images=[image_msg(name, img) for name, img, _ in scenes],
                ),
                metadata=MD,
            )
        details = ei.value.details()
        assert ei.value.code() == grpc.StatusCode.FAILED_PRECONDITION, details
        for w in words:
            assert w in details, (target, details)
        assert "Traceback" not in details and SECRET not in details
        rows = ledger(px, sid)
        assert len(rows) == len(scenes) and code_pb2.OK not in {r.status for r in rows}
        assert all(SECRET not in str(r) for r in rows)
    # the operator's log has the full errors (target_error lines), never the bearer token
    logged = "".join(capfd.readouterr())
    assert "target_error" in logged and "cls-fed-files" in logged
    assert SECRET not in logged
    # ... and the servers and the proxy keep serving
    _, _, resp = _predict(stack, "cls-inputs", scenes)
    assert [p.classification.classes[0].label for p in resp.predictions] == [
        t[0][0] for _, _, t in scenes
    ]
