"""The ``TargetBackend`` of an HTTP/JSON vision API: prepares the images, builds and sends
the requests a profile describes (several at once when a call holds more images than one
request takes), and turns statuses and answers into predictions or the errors the proxy
expects (see the package docstring).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import CancelledError, ThreadPoolExecutor
from urllib.parse import urlsplit

import structlog
from fortis.adapters.http_client import HttpClient, HttpResponse
from fortis.adapters.http_json.auth import AuthSpec, auth_headers, redact
from fortis.adapters.http_json.cloud_auth import CloudAuthSpec, Signer
from fortis.adapters.http_json.image_server import ImageServer
from fortis.adapters.http_json.profile import (
    CLASSIFICATION_OUTPUTS,
    TASKS,
    Profile,
    load_profile,
    profile_path,
)
from fortis.adapters.http_json.request import (
    PreparedImage,
    build_request,
    image_file_name,
    prepare_image,
)
from fortis.adapters.http_json.response import prediction_from_answer
from fortis.adapters.target_errors import TargetResponseError, raise_first_failure
from fortis.common.v1 import common_pb2
from fortis.core.task import Task
from fortis.infra.serving import tracing
from fortis.services.common import errors
from fortis.target.v1 import target_pb2

log = structlog.get_logger("fortis.adapters.http_json")

_BAD_INPUT_STATUS = {400, 413, 415, 422}


#: AWS error types that mean "slow down": AWS answers them with HTTP 400, not 429.
_AWS_THROTTLING = frozenset({"ThrottlingException", "Throttling", "ThrottledException",
                             "TooManyRequestsException", "ProvisionedThroughputExceededException",
                             "RequestLimitExceeded", "SlowDown"})


def _aws_throttled(resp: HttpResponse) -> bool:
    """An AWS throttling answer: HTTP 400 whose error type (the ``x-amzn-ErrorType`` header
    or the JSON ``__type``, both possibly ``prefix#Name:suffix``) is a throttling one."""
    if resp.status != 400:
        return False
    kind = resp.headers.get("x-amzn-errortype", "")
    if not kind and resp.body[:1] == b"{" and len(resp.body) <= 65536:
        try:
            doc = json.loads(resp.body)
        except (ValueError, RecursionError):     # RecursionError: nested too deeply
            doc = None
        if isinstance(doc, dict) and isinstance(doc.get("__type"), str):
            kind = doc["__type"]
    return kind.split(":")[0].rsplit("#", 1)[-1] in _AWS_THROTTLING


def _endpoint(url: str) -> str:
    """The URL as logged: scheme, host, port and path -- never its query (it may hold a key)
    nor any userinfo (it may hold a password)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        port = ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


class HttpTargetError(errors.FortisError):
    """The service refused the request with an HTTP status that retrying will not fix."""


class HttpJsonBackend:
    """A ``TargetBackend`` for one HTTP/JSON vision API described by a ``Profile``."""

    def __init__(self, profile: Profile, *,
                 client_factory: Callable[..., HttpClient] = HttpClient) -> None:
        self.profile = profile
        p = profile
        self._label = f"http-json target '{p.name}'"
        self._signer: Signer | None = None
        if isinstance(p.auth, CloudAuthSpec):
            self._signer = p.auth.signer(p.name, timeout_s=p.timeout_s)
            self._signer.check()            # fail at start-up, not on the first query
        elif p.auth is not None:
            p.auth.secret.resolve()         # fail at start-up, not on the first query
        if p.image_url.upload_auth is not None:
            p.image_url.upload_auth.secret.resolve()
        self._client = client_factory(timeout_s=p.timeout_s,
                                      max_response_bytes=p.max_response_bytes, label=self._label)
        self._pool = ThreadPoolExecutor(max_workers=p.max_concurrency,
                                        thread_name_prefix=f"http-json-{p.name}")
        # At most max_concurrency requests in flight, over all proxy calls together.
        self._in_flight = threading.BoundedSemaphore(p.max_concurrency)
        self._image_server: ImageServer | None = None
        self._server_lock = threading.Lock()
        self._closed = False
        log.info("http-json target ready", profile=p.name, source=p.source, task=p.task,
                 endpoint=_endpoint(p.url), image=p.image,
                 **(p.auth.describe() if isinstance(p.auth, CloudAuthSpec) else {
                     "auth_header": p.auth.header if p.auth else "",
                     "auth_secret": p.auth.secret.ref if p.auth else ""}),
                 max_concurrency=p.max_concurrency, images_per_request=p.images_per_request)

    # -- TargetBackend ----------------------------------------------------------------------
    def info(self) -> target_pb2.TargetInfo:
        p = self.profile
        if p.task == Task.CLASSIFICATION:
            kind = CLASSIFICATION_OUTPUTS[p.output]
        elif p.task == Task.DETECTION:
            kind = common_pb2.OUTPUT_KIND_BOXES
        else:
            kind = common_pb2.OUTPUT_KIND_MASKS
        return target_pb2.TargetInfo(
            name=p.name, task_type=TASKS[p.task], labels=list(p.labels), output_kind=kind,
            top_k=p.top_k if p.output == "top_k" else 0,
            input=target_pb2.InputSpec(height=0, width=0, channels=3,
                                       max_batch_size=p.images_per_request * p.max_concurrency),
            version=p.version or f"http-json:{p.name}")

    def predict(self, images: Sequence[common_pb2.Image]) -> list[common_pb2.Prediction]:
        if self._closed:
            raise errors.Unavailable(f"{self._label} is closed")
        prepared = [prepare_image(i, img) for i, img in enumerate(images)]
        n = self.profile.images_per_request
        groups = [prepared[k:k + n] for k in range(0, len(prepared), n)]
        if len(groups) == 1:
            return self._call(groups[0])
        call = tracing.in_context(self._call)     # the pool's threads: the caller's trace
        futures = [self._pool.submit(call, g) for g in groups]
        out: list[common_pb2.Prediction] = []
        failures: list[errors.FortisError] = []
        for f in futures:
            try:
                out += f.result()
            except CancelledError:
                continue
            except errors.FortisError as exc:
                failures.append(exc)
                for other in futures:
                    other.cancel()          # no point sending the rest: the call has failed
        if failures:
            raise_first_failure(failures)
        return out

    def close(self) -> None:
        self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._client.close()
        with self._server_lock:
            if self._image_server is not None:
                self._image_server.close()
                self._image_server = None

    # -- internals ----------------------------------------------------------------------------
    def _redact(self, text: str) -> str:
        header_auth = self.profile.auth if isinstance(self.profile.auth, AuthSpec) else None
        return redact(text, (header_auth, self.profile.image_url.upload_auth),
                      self._signer.secret_values() if self._signer is not None else ())

    def _image_urls(self, group: Sequence[PreparedImage]) -> tuple[list[str], list[str]]:
        """URLs for image: url, and the local names to forget afterwards."""
        spec = self.profile.image_url
        urls: list[str] = []
        names: list[str] = []
        if spec.serve == "local":
            with self._server_lock:
                if self._image_server is None:
                    try:
                        self._image_server = ImageServer(spec.host, spec.port, spec.public_base)
                    except OSError as exc:
                        raise errors.FailedPrecondition(
                            f"{self._label}: cannot start the image file server on "
                            f"{spec.host}:{spec.port}: {exc.strerror}") from None
                server = self._image_server
            for img in group:
                name, url = server.put(img.data, img.mime)
                names.append(name)
                urls.append(url)
            return urls, names
        for img in group:
            name = image_file_name(img)
            up = spec.upload_url.replace("${name}", name)
            headers = {"Content-Type": img.mime, **auth_headers(spec.upload_auth)}
            with self._in_flight:
                resp = self._client.request(spec.upload_method, up, headers, img.data)
            if resp.status >= 300:
                self._raise_for_status(resp, group, what="image upload")
            urls.append(spec.public_url.replace("${name}", name))
        return urls, names

    def _raise_for_status(self, resp: HttpResponse, group: Sequence[PreparedImage], *,
                          what: str) -> None:
        ids = ", ".join(f"'{g.image_id}'" for g in group)
        # scrubbed before it is cut, so that no prefix of a secret survives the cut
        snippet = self._redact(resp.body[:65536].decode("utf-8", "replace")).strip()[:300]
        msg = f"{self._label}: {what} for image {ids} got HTTP {resp.status}" + (
            f": {snippet}" if snippet else "")
        if resp.retryable or _aws_throttled(resp):
            exc = resp.unavailable(msg)
            log.warning("http-json target unavailable", profile=self.profile.name,
                        status=resp.status, retry_after_s=exc.retry_after_s, images=len(group))
            raise exc
        log.warning("http-json target refused a request", profile=self.profile.name,
                    status=resp.status, images=len(group))
        if resp.status in _BAD_INPUT_STATUS:
            field_name = f"images[{group[0].index}]" if len(group) == 1 else "images"
            raise errors.InvalidArgument(field_name, msg)
        raise HttpTargetError(msg)

    def _call(self, group: Sequence[PreparedImage]) -> list[common_pb2.Prediction]:
        p = self.profile
        names: list[str] = []
        urls: list[str] = []
        try:
            if p.image == "url":
                urls, names = self._image_urls(group)
            body, headers = build_request(p, group, urls, self._label)
            if self._signer is not None:
                headers.update(self._signer.sign(p.method, p.url, headers, body))
            else:
                headers.update(auth_headers(p.auth if isinstance(p.auth, AuthSpec) else None))
            t0 = time.perf_counter()
            with self._in_flight:
                resp = self._client.request(p.method, p.url, headers, body)
            log.debug("http-json call", profile=p.name, status=resp.status, images=len(group),
                      ms=round((time.perf_counter() - t0) * 1000, 1))
        finally:
            if names and self._image_server is not None:
                for name in names:
                    self._image_server.remove(name)
        if resp.status >= 300:
            self._raise_for_status(resp, group, what="request")
        return self._parse(resp, group)

    def _fail(self, group: Sequence[PreparedImage], problem: str) -> TargetResponseError:
        ids = ", ".join(f"'{g.image_id}'" for g in group)
        msg = self._redact(f"{self._label}: answer for image {ids} does not fit profile "
                           f"'{self.profile.name}': {problem}")
        log.warning("http-json answer rejected", profile=self.profile.name,
                    problem=self._redact(problem))
        return TargetResponseError(msg)

    def _parse(self, resp: HttpResponse, group: Sequence[PreparedImage]
               ) -> list[common_pb2.Prediction]:
        p = self.profile
        try:
            doc = json.loads(resp.body)
        except RecursionError:      # deeper than the interpreter's stack: hostile or broken
            raise self._fail(group, "JSON nested too deeply") from None
        except (ValueError, UnicodeDecodeError) as exc:
            start = self._redact(resp.body[:65536].decode("utf-8", "replace"))[:60]
            raise self._fail(group, f"not valid JSON ({exc}); it starts {start!r}") from None
        if p.results is not None:
            parts = p.results.search(doc)
            if not isinstance(parts, list):
                keys = f"; the answer has keys {sorted(doc)[:12]}" if isinstance(doc, dict) else ""
                found = "not found" if parts is None else "is not a list"
                raise self._fail(group, f"results path '{p.results_text}' {found}{keys}")
            if len(parts) != len(group):
                raise self._fail(group, f"results path '{p.results_text}' gave {len(parts)} "
                                        f"answers for {len(group)} images")
        else:
            parts = [doc]
        out = []
        for g, part in zip(group, parts, strict=True):
            try:
                out.append(prediction_from_answer(p, part, g.width, g.height))
            except ValueError as exc:
                raise self._fail([g], str(exc)) from None
            except Exception as exc:  # noqa: BLE001 - an odd answer is a failed query, not a crash
                raise self._fail([g], f"unexpected answer ({type(exc).__name__}: {exc})") from None
        return out


def backend_from_url(url: str) -> HttpJsonBackend:
    """``http-json:/path/to/profile.yaml[?...]`` or ``http-json:SHIPPED_PROFILE_NAME``."""
    _, sep, rest = url.partition(":")
    spec = rest.split("?", 1)[0]
    if spec.startswith("//"):
        spec = spec[2:]
    if not sep or not spec:
        raise errors.InvalidArgument("target", f"'{url}' does not name a profile: use "
                                               "http-json:/path/to/profile.yaml")
    return HttpJsonBackend(load_profile(profile_path(spec)))
