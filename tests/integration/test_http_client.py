"""The shared HTTP client of the HTTP target adapters (``fortis.adapters.http_client``).

``parse_retry_after`` on its edge cases, and ``HttpClient`` against a real HTTP/1.1 server on
127.0.0.1 (``http.server`` in a thread): keep-alive pooling across threads, a stale pooled
connection retried once, statuses returned with their retry semantics, timeouts, refused
connections, the response size limit, and HTTP proxies (used, bypassed by NO_PROXY and for
loopback).
"""

from __future__ import annotations

import email.utils
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from fortis.adapters import http_json, kserve_v2
from fortis.adapters.http_client import HttpClient, HttpResponse, parse_retry_after
from fortis.adapters.target_errors import TargetResponseError, TargetUnavailable
from fortis.services.common import errors

from tests.integration._kserve_support import free_port

# ---------------------------------------------------------------------------------------------
# parse_retry_after
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value, expected", [
    ("3", 3.0), (" 0.5 ", 0.5), ("0", 0.0), ("120", 120.0),
    (None, None), ("", None), ("   ", None), ("soon", None),
    ("-1", None), ("-0.5", None), ("+3", None),            # a sign is not delta-seconds
    ("inf", None), ("Infinity", None), ("-inf", None), ("nan", None), ("NaN", None),
    ("1e3", None), ("0x10", None), ("1_000", None),        # float() would take these
    ("9" * 400, None),                                     # overflows to inf
])
def test_retry_after_delta_seconds(value, expected):
    assert parse_retry_after(value) == expected


def test_retry_after_http_dates():
    now = time.time()
    assert parse_retry_after(email.utils.formatdate(now + 10, usegmt=True), now=now) == (
        pytest.approx(10, abs=1.5))
    assert parse_retry_after(email.utils.formatdate(now - 100, usegmt=True), now=now) == 0.0
    assert parse_retry_after("Thu, 01 Jan 1970 00:01:40 GMT", now=90.0) == pytest.approx(10.0)
    assert parse_retry_after("Thu, 01 Jan 1970 00:01:40 -0000", now=90.0) == pytest.approx(10.0)
    assert parse_retry_after("Thu, 01 Jan 1970 00:01:40 +0100", now=0.0) == 0.0   # in the past
    assert parse_retry_after("Thu, 32 Foo 1970 00:01:40 GMT") is None
    assert parse_retry_after("Mon, 01 Jan 99999999 00:00:00 GMT") is None


def test_both_adapters_use_the_one_parser_and_errors():
    assert http_json.parse_retry_after is kserve_v2.parse_retry_after is parse_retry_after
    assert http_json.TargetResponseError is kserve_v2.TargetResponseError is TargetResponseError
    assert issubclass(TargetUnavailable, errors.Unavailable)
    assert issubclass(kserve_v2.MessageTooLarge, TargetResponseError)


def test_response_retry_semantics():
    for status in (408, 425, 429, 500, 502, 503, 504):
        assert HttpResponse(status, {}, b"").retryable, status
    for status in (200, 301, 400, 401, 403, 404, 413, 422):
        assert not HttpResponse(status, {}, b"").retryable, status
    exc = HttpResponse(429, {"retry-after": "2"}, b"").unavailable("busy")
    assert isinstance(exc, errors.Unavailable) and exc.retry_after_s == 2.0
    assert HttpResponse(503, {"retry-after": "nan"}, b"").unavailable("x").retry_after_s is None


# ---------------------------------------------------------------------------------------------
# HttpClient against a loopback server
# ---------------------------------------------------------------------------------------------

class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
        pass

    def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def _handle(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0) or 0))
        with self.server.lock:
            self.server.seen.append((self.command, self.path, self.client_address[1],
                                     self.headers.get("X-Test", ""), body))
        path = self.path.split("?", 1)[0]
        if path.endswith("/busy"):
            self._send(429, b"slow down", {"Retry-After": "7"})
        elif path.endswith("/slow"):
            time.sleep(1.0)
            self._send(200, b"late")
        elif path.endswith("/big"):
            self._send(200, b"x" * 5000)
        elif path.endswith("/close"):
            self._send(200, b"bye", {"Connection": "close"})
            self.close_connection = True
        else:
            self._send(200, b"ok:" + self.path.encode())

    do_GET = do_POST = _handle  # noqa: N815 - http.server's naming


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.lock = threading.Lock()
        self.seen: list[tuple[str, str, int, str, bytes]] = []

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass        # a client that timed out closed the socket

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture
def server() -> Iterator[_Server]:
    srv = _Server()
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _client(**kw: Any) -> HttpClient:
    return HttpClient(**{"timeout_s": 5.0, "label": "test target", **kw})


def test_keep_alive_reuses_one_connection(server):
    c = _client()
    try:
        for i in range(3):
            r = c.request("POST", f"{server.base}/a?i={i}", {"X-Test": "h"}, b"body")
            assert (r.status, r.body) == (200, f"ok:/a?i={i}".encode())
        ports = {s[2] for s in server.seen}
        assert len(ports) == 1                                  # one pooled connection
        assert [s[3] for s in server.seen] == ["h"] * 3 and server.seen[0][4] == b"body"
    finally:
        c.close()


def test_pool_is_shared_safely_by_threads(server):
    c = _client()
    try:
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda i: c.request("GET", f"{server.base}/t{i}").body,
                                    range(64)))
        assert answers == [f"ok:/t{i}".encode() for i in range(64)]
        assert len({s[2] for s in server.seen}) <= 8            # connections were reused
    finally:
        c.close()


def test_stale_pooled_connection_is_retried_once_on_a_new_one(server):
    c = _client()
    try:
        assert c.request("GET", f"{server.base}/x").status == 200
        # the server drops the idle keep-alive connection behind the client's back
        for conns in c._idle.values():
            for p in conns:
                assert p.conn.sock is not None
                p.conn.sock.shutdown(2)
        assert c.request("GET", f"{server.base}/y").body == b"ok:/y"
        assert len({s[2] for s in server.seen}) == 2
    finally:
        c.close()


def test_connection_close_is_honoured(server):
    c = _client()
    try:
        assert c.request("GET", f"{server.base}/close").body == b"bye"
        assert not any(c._idle.values())                        # not put back in the pool
        assert c.request("GET", f"{server.base}/z").status == 200
    finally:
        c.close()


def test_statuses_are_returned_with_retry_after(server):
    c = _client()
    try:
        r = c.request("GET", f"{server.base}/busy")
        assert (r.status, r.body, r.retryable, r.retry_after_s) == (429, b"slow down", True, 7.0)
        assert r.headers["retry-after"] == "7"                  # names lower-cased
    finally:
        c.close()


def test_timeout_refused_and_oversized_answers(server):
    slow = _client(timeout_s=0.2, label="slow target")
    with pytest.raises(TargetUnavailable, match="slow target: no answer within 0.2 s"):
        slow.request("GET", f"{server.base}/slow")
    slow.close()
    c = _client()
    with pytest.raises(TargetUnavailable, match="ConnectionRefusedError") as ei:
        c.request("GET", f"http://127.0.0.1:{free_port()}/", label="closed port")
    assert str(ei.value).startswith("closed port: ") and ei.value.retry_after_s is None
    small = _client(max_response_bytes=1024)
    with pytest.raises(TargetResponseError, match="answer larger than 1024 bytes"):
        small.request("GET", f"{server.base}/big")
    assert small.request("GET", f"{server.base}/ok").status == 200      # keeps working
    with pytest.raises(ValueError, match="not an http"):
        c.request("GET", "ftp://127.0.0.1/x")
    c.close()
    small.close()


def test_http_proxy_is_used_unless_bypassed(server, monkeypatch):
    """A plain HTTP proxy gets the absolute URL; NO_PROXY and loopback targets go direct."""
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "no_proxy", "NO_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("http_proxy", server.base)
    c = _client()
    try:
        r = c.request("GET", "http://192.0.2.1:8080/v2/m?x=1")       # TEST-NET-1: unroutable
        assert r.body == b"ok:http://192.0.2.1:8080/v2/m?x=1"        # the proxy saw the URL
        assert c.request("GET", f"{server.base}/direct").body == b"ok:/direct"   # loopback
        assert c.request("GET", f"http://localhost:{server.server_address[1]}/lh").body == b"ok:/lh"
        monkeypatch.setenv("no_proxy", "192.0.2.1")
        with pytest.raises(TargetUnavailable):                          # direct: unreachable
            _client(timeout_s=0.3).request("GET", "http://192.0.2.1:8080/v2/m")
    finally:
        c.close()
