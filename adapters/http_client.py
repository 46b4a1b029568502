"""The one HTTP client of every HTTP target adapter (HTTP/JSON profiles, Open Inference Protocol
REST), so that they pool connections, honour proxies, time out and report failures alike.

* A pool of keep-alive HTTP/1.1 connections per (scheme, host, port), shared by all threads:
  a request borrows an idle connection or opens one, and gives it back when the answer has
  been read. A reused connection the server has meanwhile closed is retried once on a fresh
  one (the request never reached the server).
* ``HTTPS_PROXY`` / ``HTTP_PROXY`` / ``NO_PROXY`` are honoured (HTTPS through a CONNECT tunnel,
  HTTP with absolute request URLs); loopback hosts never go through a proxy, which could not
  reach them. HTTPS uses the given ``ssl.SSLContext`` (default: system trust store).
* ``timeout_s`` bounds each connect and send, and the whole answer (status line, headers
  and body together), so a server dripping bytes cannot hold a call longer; an answer cut
  short of its Content-Length is a lost connection, not a shorter answer.
* Failures of the transport -- refused or lost connections, timeouts, DNS errors -- raise
  ``TargetUnavailable`` (retried by the proxy); an answer larger than ``max_response_bytes``
  raises ``TargetResponseError``. Any HTTP status is returned as an ``HttpResponse``: the
  adapter decides what a 4xx means, while ``HttpResponse.retryable`` and
  ``HttpResponse.unavailable`` say the same for every adapter which statuses are worth
  retrying (408, 425, 429, 5xx) and how long the server asked to wait (``Retry-After``).

No gRPC and nothing adapter-specific here; ``parse_retry_after`` is a pure function.
"""

from __future__ import annotations

import email.utils
import http.client
import io
import ipaddress
import math
import re
import socket
import ssl
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC
from typing import Any
from urllib.parse import urlsplit

from fortis.adapters.target_errors import TargetResponseError, TargetUnavailable
from fortis.infra.serving import tracing
from opentelemetry.trace import SpanKind

__all__ = [
    "DEFAULT_MAX_RESPONSE_BYTES",
    "RETRYABLE_STATUS",
    "HttpClient",
    "HttpResponse",
    "parse_retry_after",
]

DEFAULT_MAX_RESPONSE_BYTES = 64 * 1024 * 1024
#: Statuses that say "not now" rather than "never": with any 5xx, retried by the proxy.
RETRYABLE_STATUS = frozenset({408, 425, 429})
#: Idle keep-alive connections kept per (scheme, host, port); more are closed when returned.
MAX_IDLE_PER_HOST = 16
#: delta-seconds (RFC 9110 says digits; a fraction is accepted, a sign or exponent is not).
_DELTA_SECONDS = re.compile(r"\d+(?:\.\d+)?")
#: Errors of a reused keep-alive connection that the server closed while it sat idle.
_STALE = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError,
          ConnectionAbortedError)


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header: delta-seconds or an HTTP date (a date in
    the past means 0). None when absent or unusable -- not a number or date, negative,
    infinite or NaN -- so that a broken header never makes the proxy wait forever or not at
    all by accident; the proxy then falls back on its own backoff."""
    if not value:
        return None
    v = value.strip()
    if _DELTA_SECONDS.fullmatch(v):
        seconds = float(v)
        return seconds if math.isfinite(seconds) else None
    try:
        when = email.utils.parsedate_to_datetime(v)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when is None:
        return None
    if when.tzinfo is None:             # "-0000": UTC by RFC 5322, naive by email.utils
        when = when.replace(tzinfo=UTC)
    wait = when.timestamp() - (time.time() if now is None else now)
    return max(0.0, wait) if math.isfinite(wait) else None


@dataclass(frozen=True)
class HttpResponse:
    """An answer as read: status, headers with lower-cased names, and the body."""

    status: int
    headers: Mapping[str, str]
    body: bytes

    @property
    def retryable(self) -> bool:
        """Whether the status says "try again later" (408, 425, 429, any 5xx)."""
        return self.status in RETRYABLE_STATUS or self.status >= 500

    @property
    def retry_after_s(self) -> float | None:
        return parse_retry_after(self.headers.get("retry-after"))

    def unavailable(self, message: str) -> TargetUnavailable:
        """The error to raise for a retryable status, carrying the server's Retry-After."""
        return TargetUnavailable(message, self.retry_after_s)


class _Unsendable(Exception):
    """http.client refused to send the request as given (no network error)."""


@dataclass
class _Pooled:
    conn: http.client.HTTPConnection
    plain_proxy: bool       # through a plain HTTP proxy: the request line carries the full URL


class HttpClient:
    """Pooled, thread-safe keep-alive HTTP/1.1 client (see the module docstring).

    ``label`` starts every error message (e.g. ``http-json target 'aws'``); a request may
    name its own (e.g. the endpoint and path it called)."""

    def __init__(self, *, timeout_s: float, label: str,
                 max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
                 ssl_context: ssl.SSLContext | None = None,
                 max_idle_per_host: int = MAX_IDLE_PER_HOST) -> None:
        self.timeout_s = timeout_s
        self.label = label
        self.max_response_bytes = max_response_bytes
        self.max_idle_per_host = max_idle_per_host
        self._ssl = ssl_context
        self._idle: dict[tuple[str, str, int], list[_Pooled]] = {}
        self._lock = threading.Lock()
        self._closed = False

    def close(self) -> None:
        """Close the idle connections; connections in use close when their answer is read."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, {}
        for pooled in (p for conns in idle.values() for p in conns):
            _quiet_close(pooled.conn)

    def request(self, method: str, url: str, headers: Mapping[str, str] | None = None,
                body: bytes | None = None, *, label: str | None = None) -> HttpResponse:
        """Send one request and read its answer (any status). ``TargetUnavailable`` when the
        transport fails, ``TargetResponseError`` when the answer exceeds the size limit."""
        where = label or self.label
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https"):
            raise ValueError(f"not an http(s) URL: {url!r}")
        host = parts.hostname or ""
        port = parts.port or (443 if scheme == "https" else 80)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        # host and port only: a URL's path or query may hold a key
        with tracing.span(f"HTTP {method}", {"http.request.method": method,
                                             "server.address": host, "server.port": port},
                          kind=SpanKind.CLIENT) as span:
            sent = dict(headers or {})
            given = {k.lower() for k in sent}
            sent.update((k, v) for k, v in tracing.headers() if k not in given)
            resp = self._send(method, url, target, (scheme, host, port), sent, body, where)
            span.set_attribute("http.response.status_code", resp.status)
            return resp

    def _send(self, method: str, url: str, target: str, key: tuple[str, str, int],
              headers: dict[str, str], body: bytes | None, where: str) -> HttpResponse:
        fresh = False
        while True:
            pooled, reused = self._acquire(key, fresh)
            conn = pooled.conn
            # the timeout bounds the whole answer, not each read: a server dripping a byte
            # just inside the per-read timeout would otherwise hold the call for ever
            conn.response_class = _response_until(  # type: ignore[assignment]
                time.monotonic() + self.timeout_s)
            try:
                try:
                    conn.request(method, url if pooled.plain_proxy else target, body=body,
                                 headers=headers)
                except ValueError:
                    # a method or header http.client refuses; its message quotes the header
                    # value, which may be a token
                    raise _Unsendable from None
                resp = conn.getresponse()
                data = resp.read(self.max_response_bytes + 1)
                if len(data) <= self.max_response_bytes and resp.length:
                    # EOF before Content-Length: http.client returns the part silently
                    raise http.client.IncompleteRead(data, resp.length)
            except _STALE as exc:
                _quiet_close(conn)
                if reused and not fresh:    # a stale keep-alive connection: once more, anew
                    fresh = True
                    continue
                raise TargetUnavailable(f"{where}: connection lost ({type(exc).__name__})"
                                        ) from None
            except TimeoutError:
                _quiet_close(conn)
                raise TargetUnavailable(f"{where}: no answer within {self.timeout_s:g} s") from None
            except _Unsendable:
                _quiet_close(conn)
                raise TargetResponseError(f"{where}: the request cannot be sent (a method or "
                                          "header value with a line break or control "
                                          "character)") from None
            except (OSError, http.client.HTTPException) as exc:
                _quiet_close(conn)
                raise TargetUnavailable(f"{where}: {type(exc).__name__}: "
                                        f"{getattr(exc, 'strerror', None) or exc}") from None
            if len(data) > self.max_response_bytes:
                _quiet_close(conn)
                raise TargetResponseError(f"{where}: answer larger than "
                                          f"{self.max_response_bytes} bytes")
            if resp.will_close or conn.sock is None:
                _quiet_close(conn)
            else:
                conn.sock.settimeout(self.timeout_s)    # the next request's own timeout
                self._release(key, pooled)
            return HttpResponse(resp.status, {k.lower(): v for k, v in resp.getheaders()}, data)

    # -- pool -------------------------------------------------------------------------------
    def _acquire(self, key: tuple[str, str, int], fresh: bool) -> tuple[_Pooled, bool]:
        """(connection, reused?): an idle one unless ``fresh``, else a new one."""
        if not fresh:
            with self._lock:
                idle = self._idle.get(key)
                if idle:
                    return idle.pop(), True
        return self._open(*key), False

    def _release(self, key: tuple[str, str, int], pooled: _Pooled) -> None:
        with self._lock:
            idle = self._idle.setdefault(key, [])
            if not self._closed and len(idle) < self.max_idle_per_host:
                idle.append(pooled)
                return
        _quiet_close(pooled.conn)

    def _open(self, scheme: str, host: str, port: int) -> _Pooled:
        proxy = None if _is_loopback(host) else urllib.request.getproxies().get(scheme)
        if proxy and urllib.request.proxy_bypass(host):
            proxy = None
        if not proxy:
            if scheme == "https":
                return _Pooled(http.client.HTTPSConnection(
                    host, port, timeout=self.timeout_s, context=self._ssl), False)
            return _Pooled(http.client.HTTPConnection(host, port, timeout=self.timeout_s), False)
        pu = urlsplit(proxy if "://" in proxy else "http://" + proxy)
        phost, pport = pu.hostname or "", pu.port or 8080
        if scheme == "https":           # TLS to the target through a CONNECT tunnel
            conn = http.client.HTTPSConnection(phost, pport, timeout=self.timeout_s,
                                               context=self._ssl)
            conn.set_tunnel(host, port)
            return _Pooled(conn, False)
        return _Pooled(http.client.HTTPConnection(phost, pport, timeout=self.timeout_s), True)


class _DeadlineReader(io.RawIOBase):
    """A socket's bytes, each read given only the time left until ``deadline``. Reads go
    through the socket's own ``makefile`` object, which keeps the socket open while the
    answer is read after the connection was closed (``Connection: close``)."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        super().__init__()
        self._sock = sock
        self._raw = sock.makefile("rb", buffering=0)
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("answer not complete in time")
        self._sock.settimeout(left)
        n = self._raw.readinto(b)
        return 0 if n is None else n    # None: a non-blocking socket only (ours block)

    def close(self) -> None:
        self._raw.close()
        super().close()


class _DeadlineSocket:
    """What ``http.client.HTTPResponse`` reads from: only ``makefile`` is used."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock = sock
        self._deadline = deadline

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(_DeadlineReader(self._sock, self._deadline))


def _response_until(deadline: float) -> Callable[..., http.client.HTTPResponse]:
    """An ``HTTPConnection.response_class`` whose status line, headers and body must all
    arrive before ``deadline`` (a CONNECT tunnel's answer included)."""

    def make(sock: socket.socket, *args: Any, **kwargs: Any) -> http.client.HTTPResponse:
        return http.client.HTTPResponse(_DeadlineSocket(sock, deadline),  # type: ignore[arg-type]
                                        *args, **kwargs)

    return make


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _quiet_close(conn: http.client.HTTPConnection) -> None:
    try:
        conn.close()
    except OSError:
        pass
