"""The rayserve:// target against a real Ray Serve (Ray 2.60.0 in its own venv, .venv-rayserve,
made by scripts/setup_rayserve.sh): ``serve.run`` of the deployments in tests/fixtures/rayserve/
on a local two-CPU Ray cluster, queried over Serve's HTTP proxy. A colour classifier (raw image
bytes, or base64 in JSON) and a coloured-box detector whose right answers are known by
construction, at paths below one application at route ``/``, and a second application that
takes one request at a time with one queued, whose real backpressure 503s the proxy retries.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from fortis.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from fortis.services.common.codec import encode_png, image_msg
from google.rpc import code_pb2
from structlog.testing import capture_logs

from tests.conftest import MD
from tests.integration._kserve_support import free_port, ledger, session
from tests.integration._model_server_support import (
    ROOT,
    check_colour_classifier,
    check_colour_detector,
    clean_env,
    flat,
    predict,
    require_venv,
    server_process,
)
from tests.integration._plan_support import check_colour_plans, start_stack_with_data

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

FIXTURES = ROOT / "tests" / "fixtures" / "rayserve"
VENV = ROOT / os.environ.get("RAYSERVE_VENV", ".venv-rayserve")  # as the set-up script
LABELS = FIXTURES / "labels.txt"
ROUTES = {"/", "/throttled"}  # what serve_apps.py deploys


def _routes(port: int) -> dict[str, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/routes", timeout=2) as r:
            return dict(json.loads(r.read()))
    except (OSError, ValueError):
        return {}


@pytest.fixture(scope="module")
def ray_serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """``serve.run`` of the fixture applications, once per module; the port of Serve's proxy."""
    require_venv(VENV, "setup_rayserve.sh", "serve", ".fortis-rayserve-installed")
    work = tmp_path_factory.mktemp("rayserve")
    port = free_port()
    env = clean_env()
    env.pop("RAY_ADDRESS", None)  # a cluster of its own, never one the machine already runs
    # Ray writes its cluster token under $HOME/.ray: the test's, not the user's.
    env.update(HOME=str(work), OMP_NUM_THREADS="1", RAY_USAGE_STATS_ENABLED="0")
    cmd = [str(VENV / "bin" / "python"), str(FIXTURES / "serve_apps.py"), str(port)]
    started = time.monotonic()
    with server_process(
        cmd,
        cwd=work,
        env=env,
        timeout_s=150,
        stop_leader_first_s=30,
        ready_urls=[f"http://127.0.0.1:{port}/-/healthz"],
    ) as proc:
        # The proxy is healthy before the applications are deployed.
        while set(_routes(port)) != ROUTES:
            if proc.poll() is not None or time.monotonic() - started > 150:
                tail = (work / "server.log").read_text(errors="replace").splitlines()[-15:]
                pytest.fail("Ray Serve applications did not deploy: " + " | ".join(tail))
            time.sleep(0.25)
        yield port


@pytest.fixture(scope="module")
def plan_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The data root of the stack's plans: their manifests and images."""
    return tmp_path_factory.mktemp("rayserve-plan-data")


@pytest.fixture(scope="module")
def stack(
    ray_serve: int, plan_data: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    base = f"rayserve://127.0.0.1:{ray_serve}"
    s = start_stack_with_data(
        tmp_path_factory.mktemp("rayserve-stack") / "state",
        plan_data,
        {
            "ray-raw": f"{base}/colours/raw?labels={LABELS}&output=full_scores",
            "ray-json": f"{base}/colours/b64?labels={LABELS}&input=json&top_k=3",
            "ray-detect": f"{base}/boxes?labels={LABELS}&task=detection",
            "ray-throttled": f"{base}/throttled?labels={LABELS}&concurrency=1",
            "ray-missing": f"{base}/no/such/path?labels={LABELS}",
        },
    )
    yield s
    s.stop(0)


@pytest.mark.parametrize("target", ["ray-raw", "ray-json"])
def test_classifier_through_the_proxy(stack: Any, target: str) -> None:
    check_colour_classifier(stack.address, target, full=target == "ray-raw")


def test_detector_through_the_proxy(stack: Any) -> None:
    check_colour_detector(stack.address, "ray-detect", "magenta")


def test_whole_plans_against_rayserve(stack: Any, plan_data: Path, tmp_path: Path) -> None:
    """A classification plan against the colour classifier and a detection plan against the
    box detector, through all five services to Ray Serve: both succeed, the report's clean
    accuracy is what the manifests' truth implies, and the ledger holds each image's clean
    and corrupted query and nothing else."""
    check_colour_plans(stack.address, plan_data, tmp_path, "ray-raw", "ray-detect")


def _post(port: int, path: str, body: bytes, headers: dict[str, str], out: list[int]) -> None:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=body, method="POST", headers=headers
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            out.append(r.status)
    except urllib.error.HTTPError as exc:
        out.append(exc.code)


def _wait(cond: Any, what: str, timeout_s: float = 15) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.01)


def test_real_backpressure_is_retried(
    stack: Any, ray_serve: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Two neighbours fill the one-at-a-time application (one holding its slot, one queued):
    Ray Serve's proxy drops our request with 503, the Fortis proxy retries it with backoff,
    and once the slot is released a retry gets through."""
    hold = tmp_path_factory.mktemp("hold") / "hold"
    hold.touch()
    body = encode_png(flat("red"))
    first: list[int] = []
    second: list[int] = []
    probe: list[int] = []
    n1 = threading.Thread(
        target=_post, args=(ray_serve, "/throttled", body, {"x-hold": str(hold)}, first)
    )
    n1.start()
    _wait(lambda: os.path.exists(f"{hold}.started"), "the first neighbour to hold the slot")
    n2 = threading.Thread(target=_post, args=(ray_serve, "/throttled", body, {}, second))
    n2.start()
    # The queue is full once a third request is dropped (one that was queued instead would
    # wait for the release, so it is sent in the background too).
    deadline = time.monotonic() + 15
    while not probe or probe[-1] != 503:
        assert time.monotonic() < deadline, f"the application never filled: {probe}"
        t = threading.Thread(target=_post, args=(ray_serve, "/throttled", body, {}, probe))
        t.start()
        t.join(0.5)
    result: list[Any] = []
    with grpc.insecure_channel(stack.address) as ch:
        px = proxy_pb2_grpc.TargetProxyServiceStub(ch)
        px.GetTargetInfo(proxy_pb2.GetTargetInfoRequest(target="ray-throttled"), metadata=MD)
        sid = session(px, "ray-throttled")
        mine = threading.Thread(
            target=lambda: result.append(
                px.Predict(
                    proxy_pb2.PredictRequest(
                        session_id=sid, origin="clean", images=[image_msg("mine", flat("blue"))]
                    ),
                    metadata=MD,
                )
            )
        )
        mine.start()
        try:
            _wait(lambda: len(ledger(px, sid)) >= 1, "the first attempt's ledger row")
        finally:
            hold.unlink()  # the neighbour lets go of the slot
        mine.join(30)
        n1.join(30)
        n2.join(30)
        assert first == [200] and set(second + probe) <= {200, 503}
        (resp,) = result
        assert resp.predictions[0].classification.classes[0].name == "blue"
        rows = sorted(ledger(px, sid), key=lambda r: r.attempts)
        assert len(rows) >= 2
        assert rows[-1].status == code_pb2.OK
        assert {r.status for r in rows[:-1]} == {code_pb2.UNAVAILABLE}
        assert "HTTP 503" in rows[0].error and "backpressure" in rows[0].error


def test_unknown_path_is_named(stack: Any) -> None:
    with grpc.insecure_channel(stack.address) as ch:
        px = proxy_pb2_grpc.TargetProxyServiceStub(ch)
        sid = session(px, "ray-missing")
        with capture_logs() as logs, pytest.raises(grpc.RpcError) as ei:
            px.Predict(
                proxy_pb2.PredictRequest(
                    session_id=sid, origin="x", images=[image_msg("a", flat("red"))]
                ),
                metadata=MD,
            )
        assert ei.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "HTTP 404" in ei.value.details() and "not found?" in ei.value.details()
        # The operator's log names the path (the caller's message has paths redacted).
        (operator,) = [e["detail"] for e in logs if e.get("event") == "target_error"]
        assert "rayserve target '/no/such/path'" in operator and "HTTP 404" in operator
        _, resp = predict(px, "ray-raw", [image_msg("still", flat("white"))])
        assert resp.predictions[0].classification.classes[0].name == "white"
