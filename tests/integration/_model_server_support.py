"""Shared by the TorchServe, BentoML and Ray Serve adapter tests: the set-up check, starting a real
server as a subprocess on free loopback ports, small images whose answer is known, and the
classifier and detector checks through the proxy that the colour models of all three pass."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from fortis.common.v1 import common_pb2
from fortis.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from fortis.services.common.codec import encode_png, image_msg
from google.rpc import code_pb2

from tests.conftest import MD
from tests.integration._kserve_support import ledger, session

ROOT = Path(__file__).resolve().parents[2]

#: The colours the fixture models know, in class order (tests/fixtures/torchserve/colour_model.py
#: and tests/fixtures/bentoml/service.py list the same prototypes).
COLOURS = {
    "red": (255, 0, 0),
    "green": (0, 255, 0),
    "blue": (0, 0, 255),
    "yellow": (255, 255, 0),
    "cyan": (0, 255, 255),
    "magenta": (255, 0, 255),
    "black": (0, 0, 0),
    "white": (255, 255, 255),
}


def require_venv(
    venv: Path, script: str, binary: str, stamp: str, *, by_setup: bool = True
) -> Path:
    """The server's venv; the test is skipped, naming the script to run, only when its set-up
    script has not been run (scripts/setup.sh runs those of TorchServe and BentoML, so in CI
    they have been; scripts/setup_rayserve.sh is run by hand)."""
    exe = venv / "bin" / binary
    if not exe.exists() or not (venv / stamp).exists():
        by = "scripts/setup.sh does" if by_setup else "by hand; scripts/setup.sh does not"
        pytest.skip(f"{venv.name} is not set up: run scripts/{script} ({by})")
    return exe


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


@contextmanager
def server_process(
    cmd: Sequence[str],
    *,
    cwd: Path,
    env: dict[str, str],
    ready_urls: Sequence[str],
    timeout_s: float = 120,
    stop_leader_first_s: float = 0,
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``cmd`` until every URL of ``ready_urls`` answers 200; a server that exits or is
    not ready in time fails the test with its log's tail (the set-up was run, so it must
    start). Stopped with SIGTERM (its process group), then killed. With
    ``stop_leader_first_s``, ``cmd`` alone is sent SIGTERM first and given that long to shut
    its server down itself (Ray's actors run in process groups of their own, which only the
    driver's ``ray.shutdown()`` stops)."""
    log_path = cwd / "server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            list(cmd),
            cwd=cwd,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + timeout_s
        for url in ready_urls:
            while http_status(url) != 200:
                if proc.poll() is not None or time.monotonic() > deadline:
                    tail = log_path.read_text(errors="replace").splitlines()[-15:]
                    pytest.fail(f"{cmd[0]} did not start (exit {proc.poll()}): " + " | ".join(tail))
                time.sleep(0.25)
        yield proc
    finally:
        if stop_leader_first_s and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=stop_leader_first_s)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)


def clean_env() -> dict[str, str]:
    return {
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")
    }


def flat(colour: str, h: int = 20, w: int = 24) -> np.ndarray:
    return np.broadcast_to(np.array(COLOURS[colour], np.uint8), (h, w, 3)).copy()


def square(colour: str, box: tuple[int, int, int, int], h: int = 48, w: int = 64) -> np.ndarray:
    """A flat ``colour`` rectangle (x1, y1, x2, y2; x2, y2 exclusive) on black."""
    img = np.zeros((h, w, 3), np.uint8)
    x1, y1, x2, y2 = box
    img[y1:y2, x1:x2] = COLOURS[colour]
    return img


def predict(px: Any, target: str, imgs: list[common_pb2.Image]) -> tuple[str, Any]:
    """A new session on ``target`` and one clean Predict of ``imgs`` in it."""
    sid = session(px, target)
    return sid, px.Predict(
        proxy_pb2.PredictRequest(session_id=sid, origin="clean", images=imgs), metadata=MD
    )


def check_colour_classifier(address: str, target: str, *, full: bool) -> None:
    """Every flat colour (raw pixels, and one PNG) is its own class at the top, names and
    labels in the fixture's order, full scores summing to 1 or a top 3; one ledger row each."""
    names = list(COLOURS)
    imgs = [image_msg(f"flat-{c}", flat(c)) for c in names]
    imgs.append(common_pb2.Image(image_id="png-yellow", encoded=encode_png(flat("yellow"))))
    with grpc.insecure_channel(address) as ch:
        px = proxy_pb2_grpc.TargetProxyServiceStub(ch)
        info = px.GetTargetInfo(proxy_pb2.GetTargetInfoRequest(target=target), metadata=MD).info
        assert list(info.labels) == names
        assert info.output_kind == (
            common_pb2.OUTPUT_KIND_FULL_SCORES if full else common_pb2.OUTPUT_KIND_TOP_K_SCORES
        )
        sid, resp = predict(px, target, imgs)
        for img, pred in zip(imgs, resp.predictions, strict=True):
            assert pred.image_id == img.image_id
            want = img.image_id.split("-", 1)[1]
            classes = pred.classification.classes
            assert len(classes) == (len(names) if full else 3)
            assert (classes[0].name, classes[0].label) == (want, names.index(want))
            assert all(c.name == names[c.label] for c in classes)
            if full:
                assert sum(c.score for c in classes) == pytest.approx(1.0, abs=1e-5)
        rows = ledger(px, sid)
        assert len(rows) == len(imgs) and {r.status for r in rows} == {code_pb2.OK}


def check_colour_detector(address: str, target: str, colour: str) -> None:
    """A ``colour`` square is found to the pixel with its class; a black image has no box."""
    box = (11, 4, 37, 29)
    with grpc.insecure_channel(address) as ch:
        px = proxy_pb2_grpc.TargetProxyServiceStub(ch)
        info = px.GetTargetInfo(proxy_pb2.GetTargetInfoRequest(target=target), metadata=MD).info
        assert info.output_kind == common_pb2.OUTPUT_KIND_BOXES
        _, resp = predict(
            px,
            target,
            [image_msg("sq", square(colour, box)), image_msg("none", square("black", box))],
        )
        (b,) = resp.predictions[0].detection.boxes
        assert (b.name, b.label) == (colour, list(COLOURS).index(colour))
        assert (b.x_min, b.y_min, b.x_max, b.y_max) == pytest.approx(box)
        assert len(resp.predictions[1].detection.boxes) == 0
