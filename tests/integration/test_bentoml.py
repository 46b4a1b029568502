"""The bentoml:// target against a real ``bentoml serve`` (BentoML 1.4.40 in its own venv,
.venv-bentoml, made by scripts/setup_bentoml.sh) of the tiny service in tests/fixtures/bentoml/:
a colour classifier (multipart image, or base64 in JSON) and a coloured-box detector whose
right answers are known by construction, and a second service limited to one request at a time
(``traffic={"max_concurrency": 1}``) whose real HTTP 429s the proxy retries with backoff.
"""

from __future__ import annotations

import os
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from fortis.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from fortis.services.common.codec import encode_png, image_msg
from google.rpc import code_pb2

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

FIXTURES = ROOT / "tests" / "fixtures" / "bentoml"
VENV = ROOT / os.environ.get("BENTOML_VENV", ".venv-bentoml")  # as the set-up script
LABELS = FIXTURES / "labels.txt"


def _serve(exe: str, service: str, work: Any) -> Any:
    port = free_port()
    env = clean_env()
    env.update(BENTOML_DO_NOT_TRACK="true", BENTOML_HOME=str(work / "home"), OMP_NUM_THREADS="1")
    cmd = [
        exe,
        "serve",
        f"service:{service}",
        "--working-dir",
        str(FIXTURES),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    return port, server_process(
        cmd, cwd=work, env=env, timeout_s=120, ready_urls=[f"http://127.0.0.1:{port}/readyz"]
    )


@pytest.fixture(scope="module")
def bento(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, int]]:
    """``bentoml serve`` of the Colours and the Throttled service, one each per module."""
    exe = str(require_venv(VENV, "setup_bentoml.sh", "bentoml", ".fortis-bentoml-installed"))
    colours_port, colours = _serve(exe, "Colours", tmp_path_factory.mktemp("bento-colours"))
    throttled_port, throttled = _serve(exe, "Throttled", tmp_path_factory.mktemp("bento-thr"))
    with colours, throttled:
        yield colours_port, throttled_port


@pytest.fixture(scope="module")
def plan_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The data root of the stack's plans: their manifests and images."""
    return tmp_path_factory.mktemp("bento-plan-data")


@pytest.fixture(scope="module")
def stack(
    bento: tuple[int, int], plan_data: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    port, throttled = bento
    base = f"bentoml://127.0.0.1:{port}"
    s = start_stack_with_data(
        tmp_path_factory.mktemp("bento-stack") / "state",
        plan_data,
        {
            "bento-classify": f"{base}/classify?labels={LABELS}&output=full_scores",
            "bento-json": f"{base}/classify_b64?labels={LABELS}&input=json&top_k=3",
            "bento-detect": f"{base}/detect?labels={LABELS}&task=detection",
            "bento-throttled": f"bentoml://127.0.0.1:{throttled}/classify?labels={LABELS}"
            "&concurrency=1",
            "bento-missing": f"{base}/no_such_endpoint?labels={LABELS}",
        },
    )
    yield s
    s.stop(0)


@pytest.mark.parametrize("target", ["bento-classify", "bento-json"])
def test_classifier_through_the_proxy(stack: Any, target: str) -> None:
    check_colour_classifier(stack.address, target, full=target == "bento-classify")


def test_detector_through_the_proxy(stack: Any) -> None:
    check_colour_detector(stack.address, "bento-detect", "green")


def test_whole_plans_against_bentoml(stack: Any, plan_data: Path, tmp_path: Path) -> None:
    """A classification plan against the colour classifier and a detection plan against the
    box detector, through all five services to ``bentoml serve``: both succeed, the report's clean
    accuracy is what the manifests' truth implies, and the ledger holds each image's clean
    and corrupted query and nothing else."""
    check_colour_plans(stack.address, plan_data, tmp_path, "bento-classify", "bento-detect")


def test_real_429_is_retried_with_backoff(stack: Any, bento: tuple[int, int]) -> None:
    """A neighbour's request holds the one-at-a-time service: BentoML answers ours 429, and
    the proxy retries it after a backoff until the service is free again."""
    _, port = bento
    body = encode_png(flat("red"))
    boundary = "neighbour"
    form = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="image"; '
            f'filename="a.png"\r\nContent-Type: image/png\r\n\r\n'
        ).encode()
        + body
        + f"\r\n--{boundary}--\r\n".encode()
    )
    statuses: list[int] = []

    def neighbour() -> None:
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/classify",
            data=form,
            method="POST",
            headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            statuses.append(r.status)

    with grpc.insecure_channel(stack.address) as ch:
        px = proxy_pb2_grpc.TargetProxyServiceStub(ch)
        px.GetTargetInfo(proxy_pb2.GetTargetInfoRequest(target="bento-throttled"), metadata=MD)
        t = threading.Thread(target=neighbour)
        t.start()
        time.sleep(0.1)  # the neighbour's request is in the service now
        sid, resp = predict(px, "bento-throttled", [image_msg("mine", flat("blue"))])
        t.join(10)
        assert statuses == [200]
        assert resp.predictions[0].classification.classes[0].name == "blue"
        rows = sorted(ledger(px, sid), key=lambda r: r.attempts)
        assert len(rows) >= 2, "the service was not busy: no 429 was met"
        assert rows[-1].status == code_pb2.OK
        assert {r.status for r in rows[:-1]} == {code_pb2.UNAVAILABLE}
        assert "HTTP 429" in rows[0].error


def test_unknown_endpoint_is_named(stack: Any) -> None:
    with grpc.insecure_channel(stack.address) as ch:
        px = proxy_pb2_grpc.TargetProxyServiceStub(ch)
        sid = session(px, "bento-missing")
        with pytest.raises(grpc.RpcError) as ei:
            px.Predict(
                proxy_pb2.PredictRequest(
                    session_id=sid, origin="x", images=[image_msg("a", flat("red"))]
                ),
                metadata=MD,
            )
        assert ei.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "HTTP 404" in ei.value.details() and "no_such_endpoint" in ei.value.details()
        _, resp = predict(px, "bento-classify", [image_msg("still", flat("white"))])
        assert resp.predictions[0].classification.classes[0].name == "white"
