"""Checks of the URLs a profile names, so that a typo is an error at start-up naming the
setting, not a request to the wrong place at the first query (a URL missing its host,
``http:/api...``, would go to this machine)."""

from __future__ import annotations

import ipaddress
import re
from typing import Any
from urllib.parse import urlsplit

from fortis.adapters.http_json.templates import expand_env
from fortis.services.common import errors


def request_url(rq: Any, problems: list[errors.FieldViolation]) -> str:
    """``request.url`` read by profile.py's reader ``rq``, its ``${env:VAR}`` expanded: an
    http:// or https:// URL, or "" with the problem recorded on ``request.url``."""
    written = rq.string("url", required=True)
    url = written
    if url:
        try:
            url = expand_env(url, "request.url")
        except errors.InvalidArgument as exc:
            problems.extend(exc.violations)
            return ""
        problem = url_problem(url, written)
        if problem:
            rq.bad("url", problem)
            return ""
    return url


def url_problem(url: str, written: str = "") -> str:
    """What is wrong with ``url`` as a target address ("" when nothing): it must be http(s),
    name a host and a valid port, and carry no userinfo. A problem quotes the setting as
    ``written`` when it came from the environment (``${env:VAR}``), whose value may carry a
    key in its query, and never quotes userinfo (it may hold a password)."""
    shown = (written if "${" in written else url)[:200]
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        return f"'{shown}' is not an http:// or https:// URL"
    if "@" in parts.netloc:
        return (
            "has a user name or password before the host; put credentials under "
            "request.auth as a secret reference"
        )
    if not parts.hostname:
        return f"'{shown}' has no host (is a '/' missing after '{parts.scheme}:'?)"
    try:
        parts.port  # noqa: B018 - urlsplit checks the port when it is read
    except ValueError:
        return f"'{shown}' has a port that is not a number in 0..65535"
    return ""


def plain_http_off_host(url: str) -> bool:
    """Whether ``url`` is plain http to a host that is not loopback."""
    parts = urlsplit(url)
    if parts.scheme != "http":
        return False
    host = parts.hostname or ""
    try:
        return not (host == "localhost" or ipaddress.ip_address(host).is_loopback)
    except ValueError:
        return True


#: An HTTP method or header name (RFC 9110 "token").
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def token_problem(text: str, what: str) -> str:
    """What is wrong with ``text`` as an HTTP method or header name ("" when nothing):
    http.client would refuse it only when the first request is sent."""
    if _TOKEN.fullmatch(text):
        return ""
    return f"{text[:60]!r} is not a valid HTTP {what} (no spaces, line breaks or separators)"


def value_problem(text: str) -> str:
    """What is wrong with ``text`` as (part of) a header value ("" when nothing); the value
    itself is not quoted."""
    return "holds a line break or control character" if _CONTROL.search(text) else ""
