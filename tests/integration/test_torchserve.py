"""The torchserve:// target against a real TorchServe 0.12.0 (its own venv, .venv-torchserve,
made by scripts/setup_torchserve.sh; the Java frontend on loopback ports) serving two tiny
models archived here with torch-model-archiver: a colour classifier answering as the stock
image_classifier does ({name: probability}, top 5, names from index_to_name.json through
TorchServe's own map_class_to_label) and a box detector answering as the stock object_detector
does ([{name: [x1, y1, x2, y2], "score": s}]). The right answers are known by construction
(flat colours; a coloured square on black). Reached through the proxy, so the ledger counts
every image.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from fortis.adapters import model_servers as ms
from fortis.adapters.target_errors import TargetResponseError
from fortis.common.v1 import common_pb2
from fortis.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from fortis.services.common.codec import encode_png, image_msg
from google.rpc import code_pb2

from tests.conftest import MD
from tests.integration._kserve_support import free_port, ledger, session
from tests.integration._model_server_support import (
    COLOURS,
    ROOT,
    clean_env,
    flat,
    require_venv,
    server_process,
    square,
)
from tests.integration._plan_support import check_colour_plans, start_stack_with_data

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

FIXTURES = ROOT / "tests" / "fixtures" / "torchserve"
VENV = ROOT / os.environ.get("TORCHSERVE_VENV", ".venv-torchserve")  # as the set-up script
LABELS = FIXTURES / "index_to_name.json"
KEY_ENV = "TS_INFERENCE_KEY"
AUTH = f"token_env={KEY_ENV}"


def _archive(work: Path, python: Path) -> Path:
    """Save the colour model's weights and archive the two models (.mar) into a model store."""
    store = work / "store"
    store.mkdir()
    weights = work / "colours.pt"
    subprocess.run(
        [
            str(python),
            "-c",
            "import sys, torch; sys.path.insert(0, sys.argv[1]); "
            "from colour_model import ColourNet; "
            "torch.save(ColourNet().state_dict(), sys.argv[2])",
            str(FIXTURES),
            str(weights),
        ],
        check=True,
        timeout=120,
    )
    for name, handler in (("colours", "classifier_handler.py"), ("boxes", "detector_handler.py")):
        subprocess.run(
            [
                str(python.parent / "torch-model-archiver"),
                "--model-name",
                name,
                "--version",
                "1.0",
                "--model-file",
                str(FIXTURES / "colour_model.py"),
                "--serialized-file",
                str(weights),
                "--handler",
                str(FIXTURES / handler),
                "--extra-files",
                str(LABELS),
                "--export-path",
                str(store),
            ],
            check=True,
            timeout=120,
        )
    return store


@pytest.fixture(scope="module")
def torchserve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """TorchServe on free loopback ports, one per test module, with its default token
    authorization: the inference key it writes to key_file.json is put in $TS_INFERENCE_KEY
    (the targets' token_env) for the module. Yields host:port of its inference API."""
    exe = require_venv(VENV, "setup_torchserve.sh", "torchserve", ".fortis-torchserve-installed")
    work = tmp_path_factory.mktemp("torchserve")
    store = _archive(work, VENV / "bin" / "python")
    ports = [free_port() for _ in range(5)]
    while len(set(ports)) < 5:
        ports = [free_port() for _ in range(5)]
    inference, management, metrics, grpc_inf, grpc_mgmt = ports
    (work / "config.properties").write_text(
        "\n".join(
            [
                f"inference_address=http://127.0.0.1:{inference}",
                f"management_address=http://127.0.0.1:{management}",
                f"metrics_address=http://127.0.0.1:{metrics}",
                f"grpc_inference_port={grpc_inf}",
                f"grpc_management_port={grpc_mgmt}",
                "default_workers_per_model=1",
                "install_py_dep_per_model=false",
                "vmargs=-Xmx256m -XX:+UseSerialGC",
                "",
            ]
        )
    )
    env = clean_env()
    env.update(
        PATH=f"{VENV / 'bin'}:{env.get('PATH', '')}",
        OMP_NUM_THREADS="1",
        LOG_LOCATION=str(work / "logs"),
        METRICS_LOCATION=str(work / "logs"),
    )
    cmd = [
        str(exe),
        "--start",
        "--foreground",
        "--ncs",
        "--ts-config",
        str(work / "config.properties"),
        "--model-store",
        str(store),
        "--models",
        "colours=colours.mar",
        "boxes=boxes.mar",
    ]
    base = f"http://127.0.0.1:{inference}"
    with server_process(
        cmd,
        cwd=work,
        env=env,
        timeout_s=180,
        ready_urls=[],
    ) as proc:
        keys = _keys(work / "key_file.json")
        _wait_for_ping(f"{base}/ping", keys["inference"], proc)
        _wait_for_workers(
            f"http://127.0.0.1:{management}", keys["management"], ("colours", "boxes")
        )
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(KEY_ENV, keys["inference"])
            yield f"127.0.0.1:{inference}"


def _keys(path: Path) -> dict[str, str]:
    """TorchServe's generated keys (key_file.json: {"inference": {"key": ...}, ...})."""
    deadline = time.monotonic() + 120
    while True:  # written by the frontend as it starts: wait for a whole file
        try:
            doc = json.loads(path.read_text())
            break
        except (OSError, ValueError):
            assert time.monotonic() < deadline, "TorchServe wrote no key_file.json"
            time.sleep(0.1)
    return {kind: doc[kind]["key"] for kind in ("inference", "management")}


def _wait_for_ping(url: str, key: str, proc: Any) -> None:
    deadline = time.monotonic() + 120
    while True:
        req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"})
        try:
            with urllib.request.urlopen(req, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        assert proc.poll() is None, f"TorchServe exited ({proc.returncode})"
        assert time.monotonic() < deadline, "TorchServe did not answer /ping"
        time.sleep(0.25)


def _wait_for_workers(mgmt: str, key: str, models: tuple[str, ...]) -> None:
    deadline = time.monotonic() + 60
    for m in models:
        while True:
            req = urllib.request.Request(
                f"{mgmt}/models/{m}", headers={"Authorization": f"Bearer {key}"}
            )
            with urllib.request.urlopen(req, timeout=5) as r:
                doc = json.loads(r.read())
            workers = doc[0].get("workers", []) if doc else []
            if workers and all(w.get("status") == "READY" for w in workers):
                break
            assert time.monotonic() < deadline, f"TorchServe model {m} has no ready worker: {doc}"
            time.sleep(0.25)


@pytest.fixture(scope="module")
def plan_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The data root of the stack's plans: their manifests and images."""
    return tmp_path_factory.mktemp("torchserve-plan-data")


@pytest.fixture(scope="module")
def stack(
    torchserve: str, plan_data: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    work = tmp_path_factory.mktemp("torchserve-stack")
    s = start_stack_with_data(
        work / "state",
        plan_data,
        {
            "ts-colours": f"torchserve://{torchserve}/colours?labels={LABELS}&{AUTH}",
            "ts-colours-v1": f"torchserve://{torchserve}/colours/1.0?labels={LABELS}"
            f"&output=label_only&{AUTH}",
            "ts-boxes": f"torchserve://{torchserve}/boxes?task=detection&labels={LABELS}&{AUTH}",
            "ts-missing": f"torchserve://{torchserve}/no-such-model?labels={LABELS}&{AUTH}",
        },
    )
    yield s
    s.stop(0)


def _predict(px: Any, target: str, imgs: list[common_pb2.Image]) -> tuple[str, Any]:
    sid = session(px, target)
    return sid, px.Predict(
        proxy_pb2.PredictRequest(session_id=sid, origin="clean", images=imgs), metadata=MD
    )


def test_classifier_through_the_proxy(stack: Any) -> None:
    names = list(COLOURS)
    imgs = [image_msg(f"flat-{c}", flat(c)) for c in names]
    imgs.append(common_pb2.Image(image_id="png-red", encoded=encode_png(flat("red", 31, 17))))
    with grpc.insecure_channel(stack.address) as ch:
        px = proxy_pb2_grpc.TargetProxyServiceStub(ch)
        info = px.GetTargetInfo(
            proxy_pb2.GetTargetInfoRequest(target="ts-colours"), metadata=MD
        ).info
        assert list(info.labels) == names
        assert info.task_type == common_pb2.TASK_TYPE_CLASSIFICATION
        assert (info.output_kind, info.top_k) == (common_pb2.OUTPUT_KIND_TOP_K_SCORES, 5)
        sid, resp = _predict(px, "ts-colours", imgs)
        assert [p.image_id for p in resp.predictions] == [i.image_id for i in imgs]
        for img, pred in zip(imgs, resp.predictions, strict=True):
            want = img.image_id.split("-", 1)[1]
            classes = pred.classification.classes
            assert len(classes) == 5  # image_classifier's top 5
            assert (classes[0].name, classes[0].label) == (want, names.index(want))
            assert all(c.name == names[c.label] for c in classes)
            assert [c.score for c in classes] == sorted((c.score for c in classes), reverse=True)
            assert 0.5 < classes[0].score <= 1.0
        rows = ledger(px, sid)
        assert len(rows) == len(imgs) and {r.status for r in rows} == {code_pb2.OK}
        # a versioned URL and a label-only answer
        _, resp = _predict(px, "ts-colours-v1", [image_msg("b", flat("blue"))])
        (only,) = resp.predictions[0].classification.classes
        assert (only.name, only.label) == ("blue", names.index("blue"))


def test_detector_through_the_proxy(stack: Any) -> None:
    cases = {"sq-magenta": ("magenta", (5, 7, 30, 40)), "sq-cyan": ("cyan", (40, 2, 64, 12))}
    with grpc.insecure_channel(stack.address) as ch:
        px = proxy_pb2_grpc.TargetProxyServiceStub(ch)
        info = px.GetTargetInfo(proxy_pb2.GetTargetInfoRequest(target="ts-boxes"), metadata=MD).info
        assert info.task_type == common_pb2.TASK_TYPE_DETECTION
        assert info.output_kind == common_pb2.OUTPUT_KIND_BOXES
        imgs = [image_msg(k, square(c, box)) for k, (c, box) in cases.items()]
        imgs.append(image_msg("empty", square("black", (0, 0, 1, 1))))
        sid, resp = _predict(px, "ts-boxes", imgs)
        by_id = {p.image_id: p for p in resp.predictions}
        for key, (colour, box) in cases.items():
            (b,) = by_id[key].detection.boxes
            assert (b.name, b.label) == (colour, list(COLOURS).index(colour))
            assert (b.x_min, b.y_min, b.x_max, b.y_max) == pytest.approx(box)
            assert 0.5 < b.score <= 1.0
        assert len(by_id["empty"].detection.boxes) == 0
        assert len(ledger(px, sid)) == 3


def test_whole_plans_against_torchserve(stack: Any, plan_data: Path, tmp_path: Path) -> None:
    """A classification plan against the colour classifier and a detection plan against the
    box detector, through all five services to TorchServe (its token authorization on):
    both succeed, the report's clean accuracy is what the manifests' truth implies, and the
    ledger holds each image's clean and corrupted query and nothing else; the inference key
    is in neither the report nor the ledger."""
    key = os.environ[KEY_ENV]
    check_colour_plans(stack.address, plan_data, tmp_path, "ts-colours", "ts-boxes", [key])


def test_server_errors_are_precise(stack: Any, torchserve: str) -> None:
    with grpc.insecure_channel(stack.address) as ch:
        px = proxy_pb2_grpc.TargetProxyServiceStub(ch)
        # an unknown model: TorchServe's 404, not retried, named
        sid = session(px, "ts-missing")
        with pytest.raises(grpc.RpcError) as ei:
            px.Predict(
                proxy_pb2.PredictRequest(
                    session_id=sid, origin="x", images=[image_msg("a", flat("red"))]
                ),
                metadata=MD,
            )
        assert ei.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "HTTP 404" in ei.value.details() and "no-such-model" in ei.value.details()
        assert {r.status for r in ledger(px, sid)} == {code_pb2.FAILED_PRECONDITION}
        # the proxy and TorchServe keep serving
        _, resp = _predict(px, "ts-colours", [image_msg("again", flat("green"))])
        assert resp.predictions[0].classification.classes[0].name == "green"
    # the real answer without a label set: names cannot be numbered, and the error says so
    backend = ms.backend_from_url(f"torchserve://{torchserve}/colours?{AUTH}")
    try:
        with pytest.raises(TargetResponseError, match=r"field '(red|green)'.*give labels=FILE"):
            backend.predict([image_msg("x", flat("red"))])
    finally:
        backend.close()


def test_token_authorization(torchserve: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """TorchServe's own token check: without the key, or with a wrong one, it refuses; the
    error names the variable, never the key."""

    key = os.environ[KEY_ENV]
    img = image_msg("x", flat("red"))
    no_key = ms.backend_from_url(f"torchserve://{torchserve}/colours?labels={LABELS}")
    try:
        with pytest.raises(
            TargetResponseError,
            match=r"HTTP 400.*credentials refused; see "
            r"token_env\)",
        ):
            no_key.predict([img])
    finally:
        no_key.close()
    monkeypatch.setenv("TS_WRONG_KEY", "wrong-" + key[::-1])
    wrong = ms.backend_from_url(
        f"torchserve://{torchserve}/colours?labels={LABELS}&token_env=TS_WRONG_KEY"
    )
    try:
        with pytest.raises(TargetResponseError) as ei:
            wrong.predict([img])
    finally:
        wrong.close()
    assert "credentials refused; token from $TS_WRONG_KEY" in ei.value.message, ei.value.message
    assert key not in ei.value.message and key[::-1] not in ei.value.message
