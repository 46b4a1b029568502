"""Hostile targets and operator typos against the HTTP target adapters.

A model owner's server (or anything on the path) may answer anything; an operator may mistype
a profile. Each case here must end in a precise error within the configured time -- a
``TargetUnavailable`` / ``TargetResponseError`` the proxy records (never an exception it would
turn into INTERNAL), or an ``InvalidArgument`` at start-up naming the profile field -- and
never write a credential to the log. The servers are real sockets on 127.0.0.1.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fortis.adapters import http_json as hj
from fortis.adapters.http_client import HttpClient, HttpResponse
from fortis.adapters.http_json.backend import HttpJsonBackend, _aws_throttled
from fortis.adapters.kserve_v2.rest_transport import error_text
from fortis.adapters.target_errors import TargetResponseError, TargetUnavailable
from fortis.services.common import errors
from fortis.services.common.codec import image_msg
from structlog.testing import capture_logs

# ---------------------------------------------------------------------------------------------
# a raw HTTP server that plays one scripted answer per connection
# ---------------------------------------------------------------------------------------------


class RawServer:
    """Accepts connections on 127.0.0.1 and runs ``play(conn)`` for each in a thread."""

    def __init__(self, play: Any) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.play = play
        self.stop = threading.Event()
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/predict"

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(10)
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            head, _, rest = data.partition(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            while len(rest) < length:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                rest += chunk
            self.play(conn, self.stop)
        except OSError:
            pass
        finally:
            try:
                conn.close()
            except OSError:
                pass

    def close(self) -> None:
        self.stop.set()
        self.sock.close()
        for c in self.conns:
            try:
                c.close()
            except OSError:
                pass


@pytest.fixture
def raw_server() -> Iterator[Any]:
    made: list[RawServer] = []

    def start(play: Any) -> RawServer:
        s = RawServer(play)
        made.append(s)
        return s

    yield start
    for s in made:
        s.close()


def _drip_body(conn: socket.socket, stop: threading.Event) -> None:
    """Headers at once, then the body one byte every 0.2 s (each read well inside the
    timeout); gives up after 6 s so that a client without a total deadline ends too."""
    conn.sendall(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    )
    t_end = time.monotonic() + 6.0
    while time.monotonic() < t_end and not stop.is_set():
        conn.sendall(b" ")
        time.sleep(0.2)


def _drip_headers(conn: socket.socket, stop: threading.Event) -> None:
    """The status line, then one header byte every 0.2 s."""
    conn.sendall(b"HTTP/1.1 200 OK\r\n")
    t_end = time.monotonic() + 6.0
    while time.monotonic() < t_end and not stop.is_set():
        conn.sendall(b"X")
        time.sleep(0.2)


@pytest.mark.parametrize("play", [_drip_body, _drip_headers], ids=["body", "headers"])
def test_a_slow_drip_answer_ends_at_the_timeout(raw_server, play):
    """The timeout bounds the whole answer, not each read: a server sending one byte just
    inside the per-read timeout must not hold a call (and a proxy thread) for ever."""
    server = raw_server(play)
    client = HttpClient(timeout_s=1.0, label="drip")
    t0 = time.monotonic()
    with pytest.raises(TargetUnavailable) as caught:
        client.request("POST", server.url, {"Content-Type": "application/json"}, b"{}")
    elapsed = time.monotonic() - t0
    assert elapsed < 2.5, f"the call took {elapsed:.1f} s with a 1 s timeout"
    assert "within 1 s" in str(caught.value)
    client.close()


def test_an_answer_cut_short_of_its_length_is_a_lost_connection(raw_server):
    """A valid JSON prefix must not pass for the whole answer."""

    def play(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(b'HTTP/1.1 200 OK\r\nContent-Length: 500\r\n\r\n{"labels": []}')

    server = raw_server(play)
    client = HttpClient(timeout_s=2.0, label="cut")
    with pytest.raises(TargetUnavailable, match="IncompleteRead"):
        client.request("GET", server.url)
    client.close()


def test_a_reused_connection_gets_the_full_timeout_again(raw_server):
    """The deadline of one answer must not shorten the next request on the same pooled
    connection (its socket timeout is restored)."""

    def play(conn: socket.socket, stop: threading.Event) -> None:
        body = b'{"ok": true}'
        for _ in range(2):
            time.sleep(0.3)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk

    server = raw_server(play)
    client = HttpClient(timeout_s=1.0, label="reuse")
    for _ in range(2):
        assert client.request("GET", server.url).status == 200
    client.close()


# ---------------------------------------------------------------------------------------------
# deep JSON answers: a precise error, never RecursionError (INTERNAL through the proxy)
# ---------------------------------------------------------------------------------------------

DEEP = b'{"a":' * 200_000 + b"1" + b"}" * 200_000


def _png() -> Any:
    return image_msg("i0", np.full((8, 8, 3), 90, dtype=np.uint8))


def _profile(url: str, **request: Any) -> dict[str, Any]:
    return {
        "name": "hostile",
        "task": "classification",
        "labels": ["cat", "dog"],
        "request": {"url": url, "body": {"img": "${image_base64}"}, "timeout_s": 2, **request},
        "response": {"items": "labels", "label": "name", "score": "score"},
    }


def _answer(status: int, body: bytes, ctype: bytes = b"application/json") -> Any:
    def play(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(
            b"HTTP/1.1 %d X\r\nContent-Type: %s\r\nContent-Length: %d\r\n"
            b"Connection: close\r\n\r\n" % (status, ctype, len(body)) + body
        )

    return play


@pytest.mark.parametrize("status", [200, 400], ids=["answer", "aws-400"])
def test_a_deeply_nested_answer_is_a_response_error(raw_server, status):
    server = raw_server(_answer(status, DEEP))
    backend = HttpJsonBackend(hj.parse_profile(_profile(server.url)))
    try:
        with pytest.raises(errors.FortisError) as caught:
            backend.predict([_png()])
        if status == 200:
            assert isinstance(caught.value, TargetResponseError)
            assert "nested" in str(caught.value)
    finally:
        backend.close()


def test_aws_throttling_check_survives_deep_json():
    assert _aws_throttled(HttpResponse(400, {}, DEEP[:65536])) is False


def test_oip_error_text_survives_deep_json():
    text = error_text(b'{"error":' + b"[" * 100_000)
    assert text.startswith('{"error":[[[')


# ---------------------------------------------------------------------------------------------
# operator typos in a profile: InvalidArgument at start-up naming the field
# ---------------------------------------------------------------------------------------------


def _violations(data: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(errors.InvalidArgument) as caught:
        hj.parse_profile(data)
    return {v.field: v.description for v in caught.value.violations}


@pytest.mark.parametrize(
    "url, words",
    [
        ("http:/api.example.com/predict", "no host"),  # one slash: would go to localhost
        ("https:///predict", "no host"),
        ("http://127.0.0.1:99999/predict", "port"),  # out of range
        ("http://127.0.0.1:80a/predict", "port"),
        ("https://user:pw-0123456789@api.example.com/p", "user"),  # credentials belong in auth
    ],
)
def test_a_mistyped_request_url_is_refused_at_start_up(url, words):
    found = _violations(_profile(url))
    assert "request.url" in found, found
    assert words in found["request.url"]
    assert "pw-0123456789" not in json.dumps(found)


def test_a_url_from_the_environment_is_not_echoed_in_its_error(monkeypatch):
    """``${env:VAR}`` may hold a key in its query; the error names the setting as written."""
    monkeypatch.setenv("HOSTILE_URL", "htps://api.example.com/p?key=k3y-0123456789")
    found = _violations(_profile("${env:HOSTILE_URL}"))
    assert "request.url" in found
    assert "k3y-0123456789" not in json.dumps(found)
    assert "${env:HOSTILE_URL}" in found["request.url"]


@pytest.mark.parametrize(
    "key, value",
    [
        ("timeout_s", float("nan")),
        ("timeout_s", float("inf")),
        ("timeout_s", 1e300),
        ("max_response_bytes", float("inf")),
        ("max_response_bytes", float("nan")),
        ("max_concurrency", float("nan")),
        ("max_response_bytes", 10**12),  # a buffer of that size is reserved for each answer
    ],
)
def test_non_finite_or_absurd_numbers_are_refused_at_start_up(key, value):
    found = _violations(_profile("http://127.0.0.1:9/p", **{key: value}))
    assert f"request.{key}" in found, found


@pytest.mark.parametrize(
    "kind",
    [
        {"kind": "google_oauth"},
        {"kind": "azure_ad", "scope": "https://ml.azure.com/.default"},
    ],
)
def test_a_cloud_bearer_token_is_never_sent_over_plain_http(kind):
    """A Google or Entra ID token opens every API its identity may use: it crosses the network
    only over TLS (plain http only to a loopback stand-in), as managed endpoint_url requires."""
    data = _profile("http://api.example.com/predict", auth=kind)
    found = _violations(data)
    assert "request.url" in found and "https" in found["request.url"], found


def test_the_upload_urls_are_checked_at_start_up():
    data = _profile(
        "https://api.example.com/p",
        image="url",
        image_url={
            "serve": "upload",
            "upload_url": "htp://store/${name}",
            "public_url": "https://store.example.com/${name}",
        },
    )
    data["request"]["body"] = {"img": "${image_url}"}
    found = _violations(data)
    assert "request.image_url.upload_url" in found, found


@pytest.mark.parametrize(
    "request_part, field",
    [
        ({"method": "POST\r\nX-Injected: 1"}, "request.method"),
        ({"method": "PO ST"}, "request.method"),
        ({"headers": {"X-Model": "v1\r\nX-Injected: 1"}}, "request.headers.X-Model"),
        ({"headers": {"X Model": "v1"}}, "request.headers.X Model"),
        (
            {"auth": {"header": "X-Key\r\nX-Injected: 1", "secret": "env:HOME"}},
            "request.auth.header",
        ),
        (
            {"auth": {"header": "Authorization", "prefix": "Bearer\n", "secret": "env:HOME"}},
            "request.auth.prefix",
        ),
    ],
)
def test_a_method_or_header_http_cannot_send_is_refused_at_start_up(request_part, field):
    """http.client refuses these only when the first request is made (a ValueError: INTERNAL
    through the proxy); a profile naming one fails at start-up naming the field."""
    found = _violations(_profile("http://127.0.0.1:9/p", **request_part))
    assert field in found, found


# ---------------------------------------------------------------------------------------------
# a token endpoint that hangs
# ---------------------------------------------------------------------------------------------


def _start_backend_within(profile: Any, seconds: float) -> tuple[list[BaseException | None], float]:
    """Starts an HTTP/JSON back end (it fetches a credential at start-up) in a thread, waits at
    most ``seconds``; the outcome list is empty while it still waits, else [None] or [error]."""
    outcome: list[BaseException | None] = []

    def start() -> None:
        try:
            HttpJsonBackend(profile)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            outcome.append(exc)

    t0 = time.monotonic()
    th = threading.Thread(target=start, daemon=True)
    th.start()
    th.join(seconds)
    return outcome, t0


def _hang(conn: socket.socket, stop: threading.Event) -> None:
    stop.wait(30)


def test_a_hanging_google_token_endpoint_is_bounded_by_the_profile_timeout(
    raw_server, tmp_path: Path
):
    """google-auth waits 120 s for a token by default, under the signer's lock: every call of
    the target would queue behind it. The profile's timeout bounds the token request too."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    server = raw_server(_hang)
    key = (
        rsa.generate_private_key(public_exponent=65537, key_size=2048)
        .private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        .decode()
    )
    sa = tmp_path / "sa.json"
    sa.write_text(
        json.dumps(
            {
                "type": "service_account",
                "project_id": "p",
                "private_key_id": "k" * 40,
                "private_key": key,
                "client_email": "x@p.iam.gserviceaccount.com",
                "client_id": "1",
                "token_uri": f"http://127.0.0.1:{server.port}/token",
            }
        )
    )
    data = _profile(
        "https://127.0.0.1:9/p", auth={"kind": "google_oauth", "credentials": f"file:{sa}"}
    )
    data["request"]["timeout_s"] = 1
    profile = hj.parse_profile(data)
    outcome, t0 = _start_backend_within(profile, 6.0)
    assert outcome, f"start-up still waiting for a token after {time.monotonic() - t0:.1f} s"
    # no answer is not a refusal: Unavailable (retried), saying so
    assert isinstance(outcome[0], errors.Unavailable), outcome
    assert "did not answer" in str(outcome[0])


def test_a_hanging_sts_is_bounded_by_the_profile_timeout(raw_server, tmp_path: Path, monkeypatch):
    """botocore asks STS for web-identity credentials (IRSA) with 60 s timeouts and retries,
    under its refresh lock; the profile's timeout bounds each try (two in all), and no answer
    is Unavailable (retried), not refused credentials."""
    server = raw_server(_hang)
    token = tmp_path / "token"
    token.write_text("a-web-identity-token")
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_WEB_IDENTITY_TOKEN_FILE", str(token))
    monkeypatch.setenv("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/fortis")
    monkeypatch.setenv("AWS_ENDPOINT_URL_STS", f"http://127.0.0.1:{server.port}")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    data = _profile(
        "https://127.0.0.1:9/p",
        auth={"kind": "aws_sigv4", "service": "rekognition", "region": "eu-west-1"},
    )
    data["request"]["timeout_s"] = 1
    profile = hj.parse_profile(data)
    outcome, t0 = _start_backend_within(profile, 12.0)
    assert outcome, f"still waiting for STS after {time.monotonic() - t0:.1f} s"
    assert isinstance(outcome[0], errors.Unavailable), outcome
    assert "a-web-identity-token" not in str(outcome[0])


@pytest.mark.slow
def test_a_hanging_entra_id_authority_is_bounded_by_the_profile_timeout(raw_server, monkeypatch):
    """azure-core waits 300 s per read by default; the profile's timeout bounds each token
    request (azure-identity still retries a few times, each within it)."""
    server = raw_server(_hang)
    monkeypatch.setenv("HOSTILE_AZ_SECRET", "az-secret-0123456789")
    data = _profile(
        "https://127.0.0.1:9/p",
        auth={
            "kind": "azure_ad",
            "scope": "https://ml.azure.com/.default",
            "credential": "client_secret",
            "tenant_id": "tenant-1",
            "client_id": "client-1",
            "client_secret": "env:HOSTILE_AZ_SECRET",
            "authority": f"https://127.0.0.1:{server.port}",
        },
    )
    data["request"]["timeout_s"] = 1
    profile = hj.parse_profile(data)
    outcome, t0 = _start_backend_within(profile, 25.0)
    assert outcome, f"start-up still waiting for a token after {time.monotonic() - t0:.1f} s"
    assert isinstance(outcome[0], errors.FailedPrecondition), outcome
    assert "az-secret-0123456789" not in str(outcome[0])


def test_a_redirect_is_never_followed(raw_server):
    """A target answering 302 to the cloud metadata address (or anywhere) gets no second
    request: the adapter reports the status, the Location is not fetched."""
    seen: list[int] = []

    def second(conn: socket.socket, stop: threading.Event) -> None:
        seen.append(1)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")

    other = raw_server(second)

    def redirect(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(
            b"HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:%d/latest/meta-data/\r\n"
            b"Content-Length: 0\r\n\r\n" % other.port
        )

    server = raw_server(redirect)
    backend = HttpJsonBackend(hj.parse_profile(_profile(server.url)))
    try:
        with pytest.raises(errors.FortisError, match="HTTP 302"):
            backend.predict([_png()])
    finally:
        backend.close()
    assert seen == []


# ---------------------------------------------------------------------------------------------
# secrets in the start-up log line
# ---------------------------------------------------------------------------------------------


def test_the_start_up_log_line_never_holds_url_credentials(raw_server):
    """Even if a URL with userinfo got through, the logged endpoint has none."""
    server = raw_server(_answer(200, b"{}"))
    profile = hj.parse_profile(_profile(server.url))
    object.__setattr__(profile, "url", server.url.replace("http://", "http://u:pw-0123456789@"))
    with capture_logs() as logs:
        HttpJsonBackend(profile).close()
    assert "pw-0123456789" not in repr(logs)


# ---------------------------------------------------------------------------------------------
# token_env bearer tokens of the OIP and MLflow adapters
# ---------------------------------------------------------------------------------------------

TOKEN = "tok-" + "A1b2C3d4" * 5


def _echo_token(status: int, pad: int = 0) -> Any:
    """An error answer quoting the request's token after ``pad`` characters (255: the token
    straddles the 300th character, where a snippet is cut)."""
    body = json.dumps({"error": "x" * pad + f" Authorization: Bearer {TOKEN}"}).encode()
    return _answer(status, body)


@pytest.mark.parametrize("pad", [0, 255], ids=["whole", "straddling"])
@pytest.mark.parametrize("status", [404, 503])
@pytest.mark.parametrize(
    "make",
    [
        lambda port: __import__("fortis.adapters.kserve_v2", fromlist=["x"]).backend_from_url(
            f"kserve+http://127.0.0.1:{port}/m?token_env=HOSTILE_TOKEN&timeout=2"
        ),
        lambda port: __import__("fortis.adapters.mlflow_pyfunc", fromlist=["x"]).backend_from_url(
            f"mlflow+http://127.0.0.1:{port}?token_env=HOSTILE_TOKEN&timeout=2&num_classes=3"
        ),
    ],
    ids=["oip", "mlflow"],
)
def test_a_target_echoing_the_bearer_token_never_shows_it(
    raw_server, monkeypatch, make, status, pad
):
    monkeypatch.setenv("HOSTILE_TOKEN", TOKEN)
    server = raw_server(_echo_token(status, pad))
    backend = make(server.port)
    try:
        with pytest.raises(errors.FortisError) as caught:
            backend.info()
        text = str(caught.value)
        assert "Authorization" in text  # the error does quote the answer
        assert TOKEN[:8] not in text, text
    finally:
        backend.close()


@pytest.mark.parametrize(
    "url",
    [
        "kserve+http://127.0.0.1:9/m?token_env=HOSTILE_UNSET_TOKEN",
        "kserve+grpc://127.0.0.1:9/m?token_env=HOSTILE_UNSET_TOKEN",
        "mlflow+http://127.0.0.1:9?token_env=HOSTILE_UNSET_TOKEN&num_classes=3",
    ],
)
def test_a_token_env_that_is_not_set_is_refused_at_start_up(monkeypatch, url):
    """``token_env`` naming a variable that is not set would send ``Bearer `` (empty) on every
    call; like torchserve:// and bentoml://, it is an error naming the option at start-up."""
    from fortis.adapters import kserve_v2, mlflow_pyfunc

    monkeypatch.delenv("HOSTILE_UNSET_TOKEN", raising=False)
    make = (
        mlflow_pyfunc.backend_from_url if url.startswith("mlflow") else kserve_v2.backend_from_url
    )
    with pytest.raises(errors.InvalidArgument) as caught:
        make(url).close()
    assert "token_env" in str(caught.value) and "HOSTILE_UNSET_TOKEN" in str(caught.value)


def test_a_header_secret_straddling_the_snippet_cut_is_not_shown(raw_server, monkeypatch):
    """An HTTP/JSON error snippet is cut at 300 characters; the secret is scrubbed before the
    cut, so no prefix of it survives."""
    monkeypatch.setenv("HOSTILE_KEY", TOKEN)
    server = raw_server(_echo_token(400, 255))
    data = _profile(server.url, auth={"header": "X-Api-Key", "secret": "env:HOSTILE_KEY"})
    backend = HttpJsonBackend(hj.parse_profile(data))
    try:
        with pytest.raises(errors.FortisError) as caught:
            backend.predict([_png()])
        assert "x" * 40 in str(caught.value)
        assert TOKEN[:8] not in str(caught.value), str(caught.value)
    finally:
        backend.close()


@pytest.mark.parametrize(
    "url",
    [
        "kserve+http://127.0.0.1:9/m?token_env=HOSTILE_NL_TOKEN",
        "kserve+grpc://127.0.0.1:9/m?token_env=HOSTILE_NL_TOKEN",
        "mlflow+http://127.0.0.1:9?token_env=HOSTILE_NL_TOKEN&num_classes=3",
        "torchserve://127.0.0.1:9/m?token_env=HOSTILE_NL_TOKEN",
        "bentoml://127.0.0.1:9/classify?token_env=HOSTILE_NL_TOKEN",
    ],
)
def test_a_token_with_a_line_break_is_refused_at_start_up(monkeypatch, url):
    """A secret mounted into the environment often ends in a newline. http.client refuses the
    header at the first call with a ValueError quoting it -- the token in the proxy's error
    log. It is an error naming the option at start-up, and the token is never quoted."""
    from fortis.adapters import kserve_v2, mlflow_pyfunc
    from fortis.adapters import model_servers as ms

    monkeypatch.setenv("HOSTILE_NL_TOKEN", TOKEN + "\n")
    make = (
        mlflow_pyfunc.backend_from_url
        if url.startswith("mlflow")
        else kserve_v2.backend_from_url
        if url.startswith("kserve")
        else ms.backend_from_url
    )
    with pytest.raises(errors.InvalidArgument) as caught:
        make(url).close()
    assert "token_env" in str(caught.value)
    assert TOKEN[:8] not in str(caught.value)


def test_a_header_http_client_refuses_is_a_response_error_without_its_value(raw_server):
    server = raw_server(_answer(200, b"{}"))
    client = HttpClient(timeout_s=2.0, label="bad-header")
    with pytest.raises(TargetResponseError) as caught:
        client.request("GET", server.url, {"Authorization": f"Bearer {TOKEN}\n"})
    assert TOKEN[:8] not in str(caught.value)
    client.close()


def test_the_image_file_server_drops_a_client_that_sends_nothing():
    """The target (or anything that reaches the port) opening connections and sending
    nothing must not hold a server thread each for ever."""
    from fortis.adapters.http_json.image_server import ImageServer

    server = ImageServer("127.0.0.1", 0, "", idle_timeout_s=0.5)
    try:
        port = int(server.base.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
            t0 = time.monotonic()
            while conn.recv(1024):  # until the server gives up on the silent client
                pass
            assert time.monotonic() - t0 < 3.0
    finally:
        server.close()


@pytest.mark.parametrize(
    "url",
    [
        "azureml:ep?region=westeurope&key=env:A&key=file:/etc/hostname",
        "sagemaker:ep?region=eu-west-1&region=us-east-1",
    ],
)
def test_a_managed_endpoint_setting_given_twice_is_refused(url):
    """The last one would win silently: a typo'd duplicate names the wrong key or region."""
    from fortis.adapters.managed_endpoints import profile_for

    with pytest.raises(errors.InvalidArgument, match="given twice"):
        profile_for(url)


def test_a_200_answer_quoting_the_bearer_token_never_shows_it(raw_server, monkeypatch):
    """Not JSON, starting with the request's token: the malformed-JSON error quotes the
    answer's start, with the token scrubbed (OIP metadata, MLflow scoring)."""
    from fortis.adapters import kserve_v2, mlflow_pyfunc

    monkeypatch.setenv("HOSTILE_TOKEN", TOKEN)
    play = _answer(200, f"Bearer {TOKEN} <- your header".encode(), b"text/plain")
    oip = kserve_v2.backend_from_url(
        f"kserve+http://127.0.0.1:{raw_server(play).port}/m?token_env=HOSTILE_TOKEN&timeout=2"
    )
    mlflow = mlflow_pyfunc.backend_from_url(
        f"mlflow+http://127.0.0.1:{raw_server(play).port}?token_env=HOSTILE_TOKEN&timeout=2"
        "&num_classes=3"
    )
    try:
        with pytest.raises(TargetResponseError) as first:
            oip.predict([_png()])
        with pytest.raises(TargetResponseError) as second:
            mlflow.predict([_png()])
        for caught in (first, second):
            assert "Bearer" in str(caught.value)
            assert TOKEN[:8] not in str(caught.value), str(caught.value)
    finally:
        oip.close()
        mlflow.close()
