"""The torchserve://, bentoml:// and rayserve:// adapter against a small local HTTP server that answers what
each test tells it to: throttling (429/503, Retry-After), refusals, and hostile answers (huge,
NaN, wrong types, deep nesting, boxes outside the image, labels outside the label set). Each
must become a precise error naming the field -- through the real proxy a FAILED_PRECONDITION or
a retried UNAVAILABLE, never INTERNAL -- and the proxy keeps serving. The real servers'
behaviour is tested in test_torchserve.py, test_bentoml.py and test_rayserve.py; this server only plays answers
they would not give on purpose.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import pytest
from fortis.adapters import model_servers as ms
from fortis.adapters.target_errors import TargetResponseError, TargetUnavailable
from fortis.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from fortis.services.common import errors
from fortis.services.common.codec import image_msg
from google.rpc import code_pb2
from structlog.testing import capture_logs

from tests.conftest import MD
from tests.integration._kserve_support import ledger, session, start_stack_with
from tests.integration._model_server_support import COLOURS, flat

SECRET = "s3cr3t-torchserve-key-0123456789"
LABELS_TEXT = "\n".join(COLOURS) + "\n"


class Scripted:
    """path -> list of (status, headers, body) played in turn (the last one repeats); every
    request is recorded (path, headers, body)."""

    def __init__(self) -> None:
        self.script: dict[str, list[tuple[int, dict[str, str], bytes]]] = {}
        self.seen: list[tuple[str, dict[str, str], bytes]] = []
        self.lock = threading.Lock()

    def play(self, path: str, *answers: tuple[int, dict[str, str], bytes | str]) -> None:
        with self.lock:
            self.script[path] = [
                (s, h, b.encode() if isinstance(b, str) else b) for s, h, b in answers
            ]

    def next(self, path: str) -> tuple[int, dict[str, str], bytes]:
        with self.lock:
            answers = self.script.get(path)
            if not answers:
                return 404, {}, b'{"code": 404, "message": "no such model"}'
            return answers.pop(0) if len(answers) > 1 else answers[0]


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, Scripted]]:
    scripted = Scripted()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _answer(self) -> None:
            n = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(n) if n else b""
            with scripted.lock:
                scripted.seen.append((self.path, dict(self.headers), body))
            if self.path in ("/ping", "/readyz", "/-/healthz"):
                status, headers, out = 200, {}, b'{"status": "Healthy"}'
            else:
                status, headers, out = scripted.next(self.path)
                if b"$AUTH" in out:  # echo the credentials, as a careless server might
                    out = out.replace(b"$AUTH", self.headers.get("Authorization", "").encode())
            self.send_response(status)
            for k, v in {"Content-Type": "application/json", **headers}.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        do_GET = do_POST = _answer

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    yield f"127.0.0.1:{httpd.server_address[1]}", scripted
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def labels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("labels") / "labels.txt"
    p.write_text(LABELS_TEXT)
    return p


def backend(
    server: tuple[str, Scripted],
    labels: Path,
    path: str,
    extra: str = "",
    scheme: str = "torchserve",
) -> ms.ModelServerBackend:
    return ms.backend_from_url(f"{scheme}://{server[0]}/{path}?labels={labels}{extra}")


def one(b: ms.ModelServerBackend, img: Any = None) -> Any:
    try:
        return b.predict([img if img is not None else image_msg("img-0", flat("red", 48, 64))])
    finally:
        b.close()


# -- hostile answers: a precise error naming the field ------------------------------------------
HOSTILE = [
    # (answer body, extra options, expected words in the error)
    ('{"red": NaN, "green": 0.1}', "", r"field 'red': must be a finite number, got nan"),
    ('{"red": Infinity}', "", r"field 'red': must be a finite number, got inf"),
    ('{"red": "0.9"}', "", r"field 'red': must be a number, got '0.9'"),
    ('{"red": true}', "", r"field 'red': must be a number, got True"),
    ('{"red": 1.5}', "", r"field 'red': score 1.5 is outside \[0, 1\]"),
    ('{"red": -0.2}', "", r"field 'red': score -0.2 is outside \[0, 1\]"),
    ('{"purple": 0.9}', "", r"field 'purple': label 'purple' is not in the target's label set"),
    (
        '[{"label": 7.0, "score": 0.3}]',
        "",
        r"field '\[0\]\.label': label must be a non-empty "
        r"string, got 7\.0",
    ),
    ('[{"label": "red"}]', "", r"field '\[0\]\.score': missing"),
    ('"just a string"', "", r"classification answer must be an object of label -> score"),
    ("[0.5, 0.5]", "", r"2 scores for 8 classes"),
    ("<html>oops</html>", "", r"not valid JSON \(JSONDecodeError\); it starts '<html>oops"),
    ("[" * 50 + "]" * 50, "", r"nested deeper than 16 levels"),
    ("[" * 100_000 + "]" * 100_000, "&max_answer_bytes=1000000", r"nested deeper than 16"),
    (
        '{"red": 0.5, "pad": "' + "x" * 5000 + '"}',
        "&max_answer_bytes=2048",
        r"answer larger than 2048 bytes",
    ),
    # detection (the image is 64x48)
    (
        '[{"red": [0, 0, 1000, 10], "score": 0.9}]',
        "&task=detection",
        r"field '\[0\]\.red': box \(0, 0, 1000, 10\) lies outside the 64x48 image",
    ),
    (
        '[{"red": [30, 0, 10, 10], "score": 0.9}]',
        "&task=detection",
        r"field '\[0\]\.red': box \(30, 0, 10, 10\) is inverted",
    ),
    (
        '[{"red": [0, 0, 10], "score": 0.9}]',
        "&task=detection",
        r"field '\[0\]\.red': a box must be a list of 4 numbers",
    ),
    (
        '[{"red": [0, NaN, 10, 10], "score": 0.9}]',
        "&task=detection",
        r"field '\[0\]\.red\[1\]': must be a finite number, got nan",
    ),
    (
        '[{"red": [0, 0, 10, 10], "score": NaN}]',
        "&task=detection",
        r"field '\[0\]\.score': must be a finite number",
    ),
    ('[{"red": [0, 0, 10, 10]}]', "&task=detection", r"field '\[0\]\.score': missing"),
    (
        '[{"red": [0, 0, 10, 10], "blue": [0, 0, 5, 5], "score": 0.5}]',
        "&task=detection",
        r"field '\[0\]': must hold one label -> box entry besides score",
    ),
    (
        '{"detections": [{"label": "red", "box": [0, 0, "10", 10], "score": 0.5}]}',
        "&task=detection",
        r"field 'detections\[0\]\.box\[2\]': must be a number, got '10'",
    ),
    (
        '[{"label": "red", "box": [10, 10, -5, 5], "score": 0.5}]',
        "&task=detection&box_format=xywh",
        r"negative box width/height",
    ),
    ('{"boxes": []}', "&task=detection", r"a detection answer must be a list"),
]


@pytest.mark.parametrize(
    ("answer", "extra", "expected"), HOSTILE, ids=[f"h{i}" for i in range(len(HOSTILE))]
)
def test_hostile_answer_is_a_precise_error(server, labels, answer, extra, expected) -> None:
    path = f"/predictions/hostile{HOSTILE.index((answer, extra, expected))}"
    server[1].play(path, (200, {}, answer))
    b = backend(server, labels, path.rsplit("/", 1)[1], extra)
    with pytest.raises(TargetResponseError, match=expected) as ei:
        one(b)
    assert "image 'img-0' (images[0])" in ei.value.message
    assert len(ei.value.message) < 600


def test_good_answers_of_every_shape(server, labels) -> None:
    server[1].play("/predictions/shapes", (200, {}, '[{"cyan": 0.2, "red": 0.7, "3": 0.1}]'))
    (pred,) = one(backend(server, labels, "shapes"))
    got = [(c.name, c.label, round(c.score, 3)) for c in pred.classification.classes]
    assert got == [("red", 0, 0.7), ("cyan", 4, 0.2), ("yellow", 3, 0.1)]
    server[1].play(
        "/predictions/boxes",
        (
            200,
            {},
            json.dumps(
                [[{"blue": [0, 0, 64.5, 48], "score": 0.9}, {"red": [1, 2, 3, 4], "score": 0.05}]]
            ),
        ),
    )
    (pred,) = one(backend(server, labels, "boxes", "&task=detection&min_score=0.1"))
    (b,) = pred.detection.boxes  # clipped to the image (half a pixel of rounding)
    assert (b.name, b.label, b.x_max, b.y_max) == ("blue", 2, 64.0, 48.0)


# -- statuses ---------------------------------------------------------------------------------
def test_throttling_is_unavailable_with_retry_after(server, labels) -> None:
    server[1].play("/predictions/busy", (429, {"Retry-After": "2"}, '{"message": "slow down"}'))
    with pytest.raises(TargetUnavailable, match="HTTP 429: .*slow down") as ei:
        one(backend(server, labels, "busy"))
    assert ei.value.retry_after_s == 2.0
    server[1].play("/predictions/down", (503, {}, '{"message": "Model busy"}'))
    with pytest.raises(TargetUnavailable, match="HTTP 503") as ei:
        one(backend(server, labels, "down"))
    assert ei.value.retry_after_s is None


def test_other_statuses(server, labels) -> None:
    server[1].play("/predictions/big", (413, {}, "too large"))
    with pytest.raises(errors.InvalidArgument) as ei:
        one(backend(server, labels, "big"))
    assert ei.value.violations[0].field == "images[0]"
    server[1].play("/bad", (400, {}, '{"error": "bad field"}'))
    with pytest.raises(TargetResponseError, match="HTTP 400: .*bad field"):
        one(backend(server, labels, "bad", scheme="bentoml"))


def test_the_token_never_appears(server, labels, monkeypatch) -> None:
    monkeypatch.setenv("TS_TEST_TOKEN", SECRET)
    server[1].play("/predictions/auth", (401, {}, '{"message": "bad key $AUTH"}'))
    b = backend(server, labels, "auth", "&token_env=TS_TEST_TOKEN")
    with pytest.raises(TargetResponseError) as ei:
        one(b)
    assert SECRET not in ei.value.message and "[redacted]" in ei.value.message
    assert "credentials refused; token from $TS_TEST_TOKEN" in ei.value.message
    assert server[1].seen[-1][1].get("Authorization") == f"Bearer {SECRET}"


def test_bentoml_requests(server, labels) -> None:
    """What the adapter sends: the image as a multipart file named by field=, or base64
    JSON."""
    server[1].play("/classify", (200, {}, '{"red": 1.0}'))
    one(backend(server, labels, "classify", "&field=photo", scheme="bentoml"))
    path, headers, body = server[1].seen[-1]
    assert path == "/classify" and headers["Content-Type"].startswith("multipart/form-data")
    assert b'name="photo"; filename="image.png"' in body and b"\x89PNG" in body
    one(backend(server, labels, "classify", "&input=json", scheme="bentoml"))
    doc = json.loads(server[1].seen[-1][2])
    assert list(doc) == ["image"] and doc["image"].startswith("iVBOR")  # base64 of a PNG


def test_rayserve_requests(server, labels) -> None:
    """What the adapter sends to a Ray Serve path: the image bytes with their type as the body
    (what ``await request.body()`` reads), base64 JSON under field=, or a multipart file."""
    server[1].play("/models/colours", (200, {}, '{"red": 1.0}'))
    one(backend(server, labels, "models/colours", scheme="rayserve"))
    path, headers, body = server[1].seen[-1]
    assert (path, headers["Content-Type"]) == ("/models/colours", "image/png")
    assert body.startswith(b"\x89PNG")
    one(backend(server, labels, "models/colours", "&input=json&field=img", scheme="rayserve"))
    doc = json.loads(server[1].seen[-1][2])
    assert list(doc) == ["img"] and doc["img"].startswith("iVBOR")
    one(backend(server, labels, "models/colours", "&input=multipart", scheme="rayserve"))
    assert b'name="image"; filename="image.png"' in server[1].seen[-1][2]
    server[1].play("/", (200, {}, '[{"label": "green", "score": 0.5}]'))
    (pred,) = one(ms.backend_from_url(f"rayserve://{server[0]}?labels={labels}"))
    assert server[1].seen[-1][0] == "/" and pred.classification.classes[0].name == "green"


def test_rayserve_route_check(server, labels) -> None:
    """GetTargetInfo reads Serve's /-/routes: a path no application's route prefix covers is
    named before any image is sent; a hostile routes answer is an error, not a crash."""
    scripted = server[1]
    scripted.play("/-/routes", (200, {}, '{"/colours": "colours", "/boxes/v1": "boxes"}'))
    for path in ("colours", "colours/raw", "boxes/v1/x"):
        b = backend(server, labels, path, scheme="rayserve")
        assert b.info().name == "/" + path
        b.close()
    for path in ("colours2", "boxes", "other"):
        b = backend(server, labels, path, scheme="rayserve")
        with pytest.raises(TargetResponseError, match=f"no Ray Serve application serves '/{path}'"):
            b.info()
        b.close()
    for answer, words in [
        ('["/colours"]', "not an object of route prefix -> application"),
        ("[" * 40 + "]" * 40, "nested deeper than 16 levels"),
        ("not json", "not valid JSON"),
    ]:
        scripted.play("/-/routes", (200, {}, answer))
        b = backend(server, labels, "colours", scheme="rayserve")
        with pytest.raises(TargetResponseError, match=words):
            b.info()
        b.close()
    scripted.play("/-/routes", (503, {}, "starting"))
    b = backend(server, labels, "colours", scheme="rayserve")
    with pytest.raises(TargetUnavailable, match="/-/routes answered HTTP 503"):
        b.info()
    b.close()
    scripted.play("/-/routes", (404, {}, "hidden by a gateway"))  # left to the first query
    b = backend(server, labels, "colours", scheme="rayserve")
    assert b.info().name == "/colours"
    b.close()


# -- through the proxy: retried, failed precisely, never INTERNAL, and still serving ----------
@pytest.fixture(scope="module")
def stack(server, labels, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    addr = server[0]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TS_PROXY_TOKEN", SECRET)
        s = start_stack_with(
            tmp_path_factory.mktemp("ms-hostile") / "state",
            {
                "flaky": f"torchserve://{addr}/flaky?labels={labels}",
                "nan": f"bentoml://{addr}/nan?labels={labels}",
                "down": f"torchserve://{addr}/down503?labels={labels}",
                "ray-nan": f"rayserve://{addr}/ray/nan?labels={labels}",
                "auth": f"torchserve://{addr}/auth2?labels={labels}&token_env=TS_PROXY_TOKEN",
            },
        )
        yield s
        s.stop(0)


def test_token_stays_out_of_errors_and_the_ledger(server, stack) -> None:
    # padded so that the echoed token straddles the adapter's 300-character cut: a token
    # redacted only after the cut would leave its first characters in the message
    pad = 300 - len(" Token failed: Bearer ") - 10
    server[1].play("/predictions/auth2", (400, {}, "x" * pad + " Token failed: $AUTH"))
    with grpc.insecure_channel(stack.address) as ch:
        px = proxy_pb2_grpc.TargetProxyServiceStub(ch)
        sid = session(px, "auth")
        with capture_logs() as logs, pytest.raises(grpc.RpcError) as ei:
            px.Predict(
                proxy_pb2.PredictRequest(
                    session_id=sid, origin="x", images=[image_msg("a", flat("red"))]
                ),
                metadata=MD,
            )
        rows = ledger(px, sid)
    assert server[1].seen[-1][1].get("Authorization") == f"Bearer {SECRET}"
    assert ei.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    (operator,) = [e["detail"] for e in logs if e.get("event") == "target_error"]
    assert "credentials refused; token from $TS_PROXY_TOKEN" in operator
    for text in [ei.value.details(), operator, *(r.error for r in rows)]:
        assert SECRET[:8] not in text


def test_through_the_proxy(server, stack) -> None:
    scripted = server[1]
    scripted.play(
        "/predictions/flaky",
        (429, {"Retry-After": "0.1"}, "busy"),
        (503, {}, "busy"),
        (200, {}, '{"green": 0.9, "red": 0.1}'),
    )
    scripted.play("/nan", (200, {}, '{"red": NaN}'))
    scripted.play("/predictions/down503", (503, {}, '{"message": "down"}'))
    with grpc.insecure_channel(stack.address) as ch:
        px = proxy_pb2_grpc.TargetProxyServiceStub(ch)
        sid = session(px, "flaky")
        resp = px.Predict(
            proxy_pb2.PredictRequest(
                session_id=sid, origin="x", images=[image_msg("g", flat("green"))]
            ),
            metadata=MD,
        )
        assert resp.predictions[0].classification.classes[0].name == "green"
        rows = sorted(ledger(px, sid), key=lambda r: r.attempts)
        assert [r.status for r in rows] == [code_pb2.UNAVAILABLE, code_pb2.UNAVAILABLE, code_pb2.OK]
        sid = session(px, "nan")
        with pytest.raises(grpc.RpcError) as ei:
            px.Predict(
                proxy_pb2.PredictRequest(
                    session_id=sid, origin="x", images=[image_msg("n", flat("red"))]
                ),
                metadata=MD,
            )
        assert ei.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "field 'red': must be a finite number, got nan" in ei.value.details()
        (row,) = ledger(px, sid)
        assert row.status == code_pb2.FAILED_PRECONDITION and "field 'red'" in row.error
        sid = session(px, "down")
        with pytest.raises(grpc.RpcError) as ei:
            px.Predict(
                proxy_pb2.PredictRequest(
                    session_id=sid, origin="x", images=[image_msg("d", flat("red"))]
                ),
                metadata=MD,
            )
        assert ei.value.code() == grpc.StatusCode.UNAVAILABLE and "HTTP 503" in ei.value.details()
        assert len(ledger(px, sid)) == 4  # the proxy's retry policy, spent
        scripted.play("/ray/nan", (200, {}, '{"detections": [], "red": NaN}'))
        sid = session(px, "ray-nan")
        with pytest.raises(grpc.RpcError) as ei:
            px.Predict(
                proxy_pb2.PredictRequest(
                    session_id=sid, origin="x", images=[image_msg("r", flat("red"))]
                ),
                metadata=MD,
            )
        assert ei.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "label 'detections'" in ei.value.details()
        sid = session(px, "flaky")  # ... and the proxy keeps serving
        resp = px.Predict(
            proxy_pb2.PredictRequest(
                session_id=sid, origin="x", images=[image_msg("g2", flat("green"))]
            ),
            metadata=MD,
        )
        assert len(resp.predictions) == 1
