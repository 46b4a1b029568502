"""The S3 dataset store (adapters/s3_store.py) against a hostile S3 endpoint: a local stand-in
HTTP server on 127.0.0.1 written here, because no real S3 server misbehaves on request. It
speaks just enough S3 (path-style HEAD and GET) to lie: a body longer than HEAD said, a body
that trickles, redirects to another host, error codes that echo the caller's access key, and
it records every request it gets, so a test sees what the server was sent (its credentials
are whatever botocore signs with; nothing here verifies signatures, which is not what these
tests are about). Each misbehaviour ends in a precise error naming the plan field, in
bounded time, with no request sent anywhere the operator did not list and no key in a
message.
"""

from __future__ import annotations

import io
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import PurePosixPath
from typing import Any

import pytest
from fortis.adapters import s3_store
from fortis.adapters.http_json.auth import SecretRef
from fortis.adapters.s3_store import S3Credential, S3Stores
from fortis.services.common.errors import FailedPrecondition, FortisError, InvalidArgument
from fortis.services.evaluation.datasets import PlanDatasets
from fortis.services.evaluation.plan_model import S3Location

from tests.unit.test_dataset_streams import _plan

ACCESS = "AKIDHOSTILETEST01"
SECRET = "hostile-test-secret-x9"
TOKEN = "hostile-session-token-x9"

#: path -> handler(request) -> None; each writes its own answer
Route = Callable[[BaseHTTPRequestHandler], None]


class _Server:
    def __init__(self) -> None:
        self.routes: dict[str, Route] = {}
        self.seen: list[tuple[str, str, dict[str, str]]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_: Any) -> None:
                pass

            def _any(self) -> None:
                outer.seen.append((self.command, self.path, dict(self.headers)))
                route = outer.routes.get(self.path.split("?")[0])
                if route is None:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                try:
                    route(self)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            do_GET = do_HEAD = _any

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture()
def hostile() -> Iterator[_Server]:
    s = _Server()
    yield s
    s.close()


@pytest.fixture()
def other() -> Iterator[_Server]:
    s = _Server()
    yield s
    s.close()


def _stores(url: str) -> S3Stores:
    return S3Stores(
        {
            "tenant-a": {
                "team": S3Credential(
                    access_key_id=SecretRef("env:HOSTILE_KEY"),
                    secret_access_key=SecretRef("env:HOSTILE_SECRET"),
                    session_token=SecretRef("env:HOSTILE_TOKEN"),
                    endpoints=(url,),
                )
            }
        }
    )


@pytest.fixture(autouse=True)
def _secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOSTILE_KEY", ACCESS)
    monkeypatch.setenv("HOSTILE_SECRET", SECRET)
    monkeypatch.setenv("HOSTILE_TOKEN", TOKEN)


def _loc(url: str, credentials: str = "team") -> S3Location:
    return S3Location(bucket="data", prefix="p", endpoint_url=url, credentials=credentials)


def _no_secret(msg: str) -> None:
    for s in (ACCESS, SECRET, TOKEN):
        assert s not in msg, msg


def _head(size: int, *, status: int = 200) -> Route:
    def route(h: BaseHTTPRequestHandler) -> None:
        h.send_response(status)
        h.send_header("Content-Length", str(size))
        h.end_headers()

    return route


def _tar_member(name: str, data: bytes = b"") -> bytes:
    ti = tarfile.TarInfo(name)
    ti.size = len(data)
    buf = io.BytesIO()
    buf.write(ti.tobuf(format=tarfile.USTAR_FORMAT))
    buf.write(data + b"\0" * (-len(data) % 512))
    return buf.getvalue()


def test_instance_credentials_never_go_to_a_plans_endpoint(hostile, monkeypatch):
    """With instance credentials lent, a plan could name any endpoint: the server signed
    requests to the plan's host with its own role, the session token in plain sight."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_SESSION_TOKEN", TOKEN)
    hostile.routes["/data/p/a.json"] = _head(2)
    stores = S3Stores({}, instance_credentials=True)
    with pytest.raises(FailedPrecondition) as e:
        stores("tenant-a", _loc(hostile.url, "instance")).locate(
            PurePosixPath(), "a.json", "dataset.path"
        )
    assert "dataset.store.s3.endpoint_url" in e.value.message
    _no_secret(e.value.message)
    assert hostile.seen == []
    # an endpoint the operator listed for them is used
    listed = S3Stores({}, instance_credentials=True, instance_endpoints=(hostile.url + "/",))
    listed("tenant-a", _loc(hostile.url, "instance")).locate(
        PurePosixPath(), "a.json", "dataset.path"
    )
    assert [m for m, _, _ in hostile.seen] == ["HEAD"]


def test_a_body_longer_than_head_said_is_refused(hostile):
    """HEAD says 10 KiB; the GET's body, with no length, goes on (here 20 MB of tar headers of
    one sample, then the connection closes; it could go on for ever): read against the size
    HEAD gave, not until the stream budget of gigabytes."""
    size = 10 * 1024
    start = _tar_member("a.png", b"\x89PNG") + _tar_member("a.cls", b"1")

    def endless(h: BaseHTTPRequestHandler) -> None:
        if h.command == "HEAD":
            return _head(size)(h)
        h.send_response(200)
        h.send_header("Connection", "close")  # no length: the body ends when the server says
        h.end_headers()
        h.wfile.write(start)
        block = b"".join(_tar_member(f"a.t{k}") for k in range(2000))
        for _ in range(20):
            h.wfile.write(block)
        h.close_connection = True

    hostile.routes["/data/p/w/s.tar"] = endless
    plan = _plan(
        {
            "source": "webdataset",
            "path": "w/s.tar",
            "store": {
                "s3": {
                    "bucket": "data",
                    "prefix": "p",
                    "endpoint_url": hostile.url,
                    "credentials": "team",
                }
            },
        }
    )
    t = time.monotonic()
    with pytest.raises(InvalidArgument) as e:
        PlanDatasets({}, stores=_stores(hostile.url)).for_tenant("tenant-a").check(plan)
    assert e.value.violations[0].field == "dataset.path:w/s.tar", e.value.message
    assert f"more than the object's {size} bytes" in e.value.message, e.value.message
    assert time.monotonic() - t < 5
    _no_secret(e.value.message)


def test_a_trickling_body_is_cut_off(hostile, monkeypatch):
    """One byte every 50 ms never trips botocore's per-read timeout: the average rate does."""
    monkeypatch.setattr(s3_store, "STREAM_GRACE_S", 0.5)
    monkeypatch.setattr(s3_store, "MIN_STREAM_RATE", 1000)
    size = 1000

    def trickle(h: BaseHTTPRequestHandler) -> None:
        if h.command == "HEAD":
            return _head(size)(h)
        h.send_response(200)
        h.send_header("Content-Length", str(size))
        h.end_headers()
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            h.wfile.write(b"{")
            h.wfile.flush()
            time.sleep(0.05)
        h.close_connection = True

    hostile.routes["/data/p/ann.json"] = trickle
    store = _stores(hostile.url)("tenant-a", _loc(hostile.url))
    ref = store.locate(PurePosixPath(), "ann.json", "dataset.path")
    t = time.monotonic()
    with pytest.raises(FortisError) as e:
        store.read(ref, 1 << 20, "dataset.path", "annotations file")
    assert "too slowly" in e.value.message and "dataset.path" in e.value.message, e.value.message
    assert time.monotonic() - t < 4
    _no_secret(e.value.message)


@pytest.mark.parametrize("status", [301, 302, 307])
def test_redirects_are_not_followed_to_another_host(hostile, other, status):
    """A redirect (with the region header botocore's S3 redirector reads) must not send the
    signed request, or any request, to a host the operator did not list."""
    other.routes["/data/p/a.json"] = _head(2)

    def redirect(h: BaseHTTPRequestHandler) -> None:
        h.send_response(status)
        h.send_header("Location", f"{other.url}{h.path}")
        h.send_header("x-amz-bucket-region", "eu-west-1")
        h.send_header("Content-Length", "0")
        h.end_headers()

    hostile.routes["/data/p/a.json"] = redirect
    store = _stores(hostile.url)("tenant-a", _loc(hostile.url))
    with pytest.raises(FortisError) as e:
        store.locate(PurePosixPath(), "a.json", "dataset.path")
    assert other.seen == []
    assert "dataset" in e.value.message
    _no_secret(e.value.message)


def test_error_codes_that_echo_the_access_key_are_not_repeated(hostile):
    """The error Code of an S3 answer is the server's text: one that echoes the request's
    access key id must not carry it into the tenant's message."""

    def echo(h: BaseHTTPRequestHandler) -> None:
        auth = h.headers.get("Authorization", "")
        key = auth.split("Credential=")[1].split("/")[0] if "Credential=" in auth else "?"
        body = f"<Error><Code>{key}</Code><Message>{key}</Message></Error>".encode()
        h.send_response(400)
        h.send_header("Content-Type", "application/xml")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    hostile.routes["/data/p/a.json"] = lambda h: _head(20)(h) if h.command == "HEAD" else echo(h)
    store = _stores(hostile.url)("tenant-a", _loc(hostile.url))
    ref = store.locate(PurePosixPath(), "a.json", "dataset.path")
    with pytest.raises(FortisError) as e:
        store.read(ref, 100, "dataset.path", "file")
    assert any("Credential=" + ACCESS in h.get("Authorization", "") for _, _, h in hostile.seen)
    _no_secret(e.value.message)
    assert "400" in e.value.message, e.value.message


def test_unresolvable_credentials_do_not_name_the_operators_secret_source(hostile, monkeypatch):
    monkeypatch.delenv("HOSTILE_TOKEN")
    with pytest.raises(FailedPrecondition) as e:
        _stores(hostile.url)("tenant-a", _loc(hostile.url))
    assert "dataset.store.s3.credentials" in e.value.message
    assert "HOSTILE_TOKEN" not in e.value.message, e.value.message


def _listing(keys: list[str], token: int | None) -> bytes:
    items = "".join(f"<Contents><Key>{k}</Key><Size>1</Size></Contents>" for k in keys)
    more = (
        f"<IsTruncated>true</IsTruncated><NextContinuationToken>t{token}</NextContinuationToken>"
        if token is not None
        else "<IsTruncated>false</IsTruncated>"
    )
    return (
        '<?xml version="1.0" encoding="UTF-8"?><ListBucketResult '
        'xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>data</Name>'
        f"<KeyCount>{len(keys)}</KeyCount>{more}{items}</ListBucketResult>"
    ).encode()


def _xml_route(pages: Callable[[int], bytes]) -> Route:
    count = [0]

    def route(h: BaseHTTPRequestHandler) -> None:
        count[0] += 1
        body = pages(count[0])
        h.send_response(200)
        h.send_header("Content-Type", "application/xml")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    return route


def test_endless_empty_listing_pages_are_refused(hostile):
    """Truncated pages with no keys, each with a new token: every page is a request, and the
    old bound was a million of them (here the server gives up after 300)."""
    hostile.routes["/data"] = _xml_route(
        lambda n: _listing([], n) if n < 300 else b"<Error><Code>SlowDown</Code></Error>"
    )
    plan = _plan(
        {
            "source": "folders",
            "path": "pets",
            "store": {
                "s3": {
                    "bucket": "data",
                    "prefix": "p",
                    "endpoint_url": hostile.url,
                    "credentials": "team",
                }
            },
        }
    )
    with pytest.raises(InvalidArgument) as e:
        PlanDatasets({}, stores=_stores(hostile.url)).for_tenant("tenant-a").check(plan)
    assert "empty page" in e.value.message, e.value.message
    assert len(hostile.seen) < 5


def test_listed_keys_outside_the_folder_are_refused(hostile):
    """A listing is the server's word: a key that does not start with the folder asked for
    (here another tenant's prefix) must not be cut into a name inside it."""
    hostile.routes["/data"] = _xml_route(
        lambda n: _listing(["p/pets/cat/1.png", "other-tenant/secret/cat/2.png"], None)
    )
    plan = _plan(
        {
            "source": "folders",
            "path": "pets",
            "store": {
                "s3": {
                    "bucket": "data",
                    "prefix": "p",
                    "endpoint_url": hostile.url,
                    "credentials": "team",
                }
            },
        }
    )
    with pytest.raises(InvalidArgument) as e:
        PlanDatasets({}, stores=_stores(hostile.url)).for_tenant("tenant-a").check(plan)
    assert "outside the folder" in e.value.message, e.value.message
    assert not any("other-tenant" in p for _, p, _ in hostile.seen)


@pytest.mark.parametrize(
    "variant",
    [
        "http://user:pw@{host}",
        "HTTP://{host}",
        "http://{host}/elsewhere",
        "http://{host}./",
        "http://[::ffff:127.0.0.1]:{port}",
        "http://127.0.0.1.:{port}",
        "http://0x7f000001:{port}",
        "http://127.1:{port}",
        "https://{host}",
    ],
)
def test_endpoint_spellings_outside_the_operators_list_send_nothing(hostile, variant):
    """Spellings of the listed endpoint (user information, case, a path, a trailing dot,
    other spellings of the same address) are refused by the plan's check or by the
    credential's list: no request reaches any server, the listed one included."""
    host = hostile.url.removeprefix("http://")
    url = variant.format(host=host, port=host.rsplit(":", 1)[1])
    store = {"s3": {"bucket": "data", "prefix": "p", "endpoint_url": url, "credentials": "team"}}
    with pytest.raises(FortisError) as e:
        plan = _plan({"source": "hf", "path": "hf", "store": store})
        PlanDatasets({}, stores=_stores(hostile.url)).for_tenant("tenant-a").check(plan)
    assert "dataset.store.s3" in e.value.message or any(
        v.field.startswith("dataset.store.s3") for v in getattr(e.value, "violations", [])
    ), e.value.message
    assert hostile.seen == []
    _no_secret(e.value.message)
