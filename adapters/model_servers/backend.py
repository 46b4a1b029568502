"""``ModelServerBackend``: the proxy's ``TargetBackend`` over a model server that takes one
encoded image per HTTP request and answers JSON -- TorchServe's inference API and a BentoML
service's ``@bentoml.api`` endpoint.

One request per image (both servers batch on their side, if configured to), at most
``concurrency`` in flight over all proxy calls together; statuses become the errors the proxy
expects (see the package docstring) and answers are read by ``answers``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import ssl
import threading
from collections.abc import Sequence
from concurrent.futures import CancelledError, ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import quote

import structlog
from fortis.adapters.http_client import HttpClient, HttpResponse
from fortis.adapters.model_servers import answers
from fortis.adapters.model_servers.options import ServerOptions, parse_url, read_labels
from fortis.adapters.target_errors import (
    TargetResponseError,
    TargetUnavailable,
    raise_first_failure,
)
from fortis.common.v1 import common_pb2
from fortis.core.strategy import OUTPUT_KINDS, TASK_TYPES
from fortis.core.task import Task
from fortis.services.common import errors
from fortis.services.common.codec import check_image_header, decode_image, encode_png
from fortis.target.v1 import target_pb2

log = structlog.get_logger("fortis.adapters.model_servers")

#: What ``GetTargetInfo`` asks to see that the server is up (Ray Serve: its HTTP proxy's own
#: health check, which is up before any application is).
_HEALTH = {"torchserve": "/ping", "bentoml": "/readyz", "rayserve": "/-/healthz"}
#: Statuses that mean this one image was refused (too large, unsupported, invalid).
_BAD_IMAGE_STATUS = {413, 415, 422}
_MIME = {b"\x89PNG": "image/png", b"\xff\xd8": "image/jpeg"}


@dataclass(frozen=True)
class _Image:
    index: int
    image_id: str
    data: bytes
    mime: str
    width: int
    height: int


def _prepare(i: int, img: common_pb2.Image) -> _Image:
    """The encoded bytes to send and the image's size; an image already encoded is sent as
    it came (its size read from the header alone), a raw tensor as a lossless PNG."""
    field = f"images[{i}]"
    if img.WhichOneof("content") == "encoded":
        w, h = check_image_header(img.encoded, f"{field}.encoded")
        data = bytes(img.encoded)
    else:
        arr = decode_image(img, field)
        h, w = arr.shape[:2]
        data = encode_png(arr)
    mime = next((m for magic, m in _MIME.items() if data.startswith(magic)), "image/png")
    return _Image(i, img.image_id, data, mime, int(w), int(h))


class ModelServerBackend:
    """A Fortis ``TargetBackend`` over TorchServe or a BentoML service (one URL)."""

    def __init__(self, opts: ServerOptions) -> None:
        self.opts = opts
        self._label = f"{opts.server} target '{opts.name}'"
        labels = read_labels(opts.server, opts.labels_path) if opts.labels_path else ()
        self.spec = answers.AnswerSpec(
            task=opts.task,
            labels=labels,
            output=opts.output,
            top_k=opts.top_k,
            min_score=opts.min_score,
            box_format=opts.box_format,
            labels_from=f"labels file '{opts.labels_path}'" if labels else "",
        )
        if opts.token_env and not os.environ.get(opts.token_env):
            raise errors.InvalidArgument(
                "target",
                f"{opts.server} option 'token_env': the "
                f"environment variable {opts.token_env} is "
                "not set",
            )
        if opts.token_env and any(c < " " or c == "\x7f" for c in os.environ[opts.token_env]):
            # never quoted; a mounted secret often ends in a newline, which no header can carry
            raise errors.InvalidArgument(
                "target",
                f"{opts.server} option 'token_env': the environment variable {opts.token_env} "
                "holds a line break or control character",
            )
        self._client = HttpClient(
            timeout_s=opts.timeout_s,
            label=self._label,
            max_response_bytes=opts.max_answer_bytes,
            ssl_context=ssl.create_default_context() if opts.transport == "https" else None,
        )
        self._pool = ThreadPoolExecutor(
            max_workers=opts.concurrency, thread_name_prefix=f"{opts.server}-{opts.path}"
        )
        self._in_flight = threading.BoundedSemaphore(opts.concurrency)
        self._closed = False
        if opts.server == "torchserve":
            path = f"/predictions/{quote(opts.path, safe='')}"
            if opts.version:
                path += f"/{quote(opts.version, safe='')}"
        elif opts.server == "rayserve":
            path = "/" + "/".join(quote(s, safe="") for s in opts.path.split("/") if s)
        else:
            path = f"/{quote(opts.path, safe='')}"
        self._path = path
        self._url = opts.base_url + path

    # -- TargetBackend ----------------------------------------------------------------------
    def info(self) -> target_pb2.TargetInfo:
        o = self.opts
        health = _HEALTH[o.server]
        resp = self._request("GET", health, None, {})
        if resp.status != 200:
            msg = f"{self._label}: {health} answered HTTP {resp.status}: {self._snippet(resp)}"
            raise resp.unavailable(msg) if resp.retryable else TargetUnavailable(msg)
        if o.server == "rayserve":
            self._check_route()
        if o.task == Task.DETECTION:
            kind = OUTPUT_KINDS["boxes"]
        else:
            kind = OUTPUT_KINDS[o.output]
        return target_pb2.TargetInfo(
            name=o.name,
            task_type=TASK_TYPES[o.task],
            labels=list(self.spec.labels),
            output_kind=kind,
            top_k=o.top_k if o.output == "top_k" else 0,
            input=target_pb2.InputSpec(height=0, width=0, channels=3, max_batch_size=o.concurrency),
            version=f"{o.server}:{o.name}",
        )

    def predict(self, images: Sequence[common_pb2.Image]) -> list[common_pb2.Prediction]:
        if self._closed:
            raise errors.Unavailable(f"{self._label} is closed")
        prepared = [_prepare(i, img) for i, img in enumerate(images)]
        if len(prepared) == 1:
            return [self._call(prepared[0])]
        futures = [self._pool.submit(self._call, p) for p in prepared]
        out: list[common_pb2.Prediction] = []
        failures: list[errors.FortisError] = []
        for f in futures:
            try:
                out.append(f.result())
            except CancelledError:
                continue
            except errors.FortisError as exc:
                failures.append(exc)
                for other in futures:
                    other.cancel()  # the call has failed: no point sending the rest
        if failures:
            raise_first_failure(failures)
        return out

    def close(self) -> None:
        self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._client.close()

    # -- internals ----------------------------------------------------------------------------
    def _headers(self) -> dict[str, str]:
        h = {"Accept": "application/json"}
        if self.opts.token_env:
            h["Authorization"] = f"Bearer {os.environ.get(self.opts.token_env, '')}"
        return h

    def _redact(self, text: str) -> str:
        token = os.environ.get(self.opts.token_env, "") if self.opts.token_env else ""
        return text.replace(token, "[redacted]") if token else text

    def _snippet(self, resp: HttpResponse) -> str:
        """The start of an error body, on one line, without the token."""
        # Redacted before it is cut, so that no prefix of the token survives the cut.
        text = self._redact(resp.body[:65536].decode("utf-8", "replace"))
        return " ".join(text.split())[:300]

    def _request(
        self, method: str, path: str, body: bytes | None, extra: dict[str, str], what: str = ""
    ) -> HttpResponse:
        url = self.opts.base_url + path
        with self._in_flight:
            return self._client.request(
                method,
                url,
                {**self._headers(), **extra},
                body,
                label=f"{self._label} ({path}){what}",
            )

    def _check_route(self) -> None:
        """Ray Serve's proxy lists its applications' route prefixes at ``/-/routes``; a path no
        prefix covers is named here, before any image is sent. A gateway that hides the list
        (404) leaves the check to the first query."""
        resp = self._request("GET", "/-/routes", None, {})
        if resp.status == 404:
            return
        if resp.status != 200:
            msg = f"{self._label}: /-/routes answered HTTP {resp.status}: {self._snippet(resp)}"
            raise resp.unavailable(msg) if resp.retryable else TargetUnavailable(msg)
        try:
            routes = answers.parse_json(resp.body)
        except answers.BadAnswer as exc:
            raise TargetResponseError(f"{self._label}: /-/routes: {exc}") from None
        if not isinstance(routes, dict) or not all(isinstance(r, str) for r in routes):
            raise TargetResponseError(
                f"{self._label}: /-/routes is not an object of route prefix -> application"
            )
        if not any(_covers(prefix, self._path) for prefix in routes):
            known = ", ".join(sorted(routes)[:10]) or "none"
            raise TargetResponseError(
                f"{self._label}: no Ray Serve application serves '{self._path}' "
                f"(route prefixes: {known[:300]})"
            )

    def _body(self, img: _Image) -> tuple[bytes, dict[str, str]]:
        o = self.opts
        if o.server == "torchserve":
            return img.data, {"Content-Type": "application/octet-stream"}
        if o.input == "raw":  # Ray Serve: the body is what the deployment reads
            return img.data, {"Content-Type": img.mime}
        if o.input == "json":
            doc = {o.field: base64.b64encode(img.data).decode("ascii")}
            return json.dumps(doc).encode(), {"Content-Type": "application/json"}
        # From the image itself, so that the same image is the same request (no randomness).
        boundary = f"fortis-{hashlib.sha256(img.data).hexdigest()[:32]}"
        ext = "jpg" if img.mime == "image/jpeg" else "png"
        head = (
            f'--{boundary}\r\nContent-Disposition: form-data; name="{o.field}"; '
            f'filename="image.{ext}"\r\nContent-Type: {img.mime}\r\n\r\n'
        ).encode()
        body = head + img.data + f"\r\n--{boundary}--\r\n".encode()
        return body, {"Content-Type": f"multipart/form-data; boundary={boundary}"}

    def _call(self, img: _Image) -> common_pb2.Prediction:
        body, headers = self._body(img)
        resp = self._request(
            "POST", self._path, body, headers, f" for image '{img.image_id}' (images[{img.index}])"
        )
        if resp.status != 200:
            self._raise_for_status(resp, img)
        try:
            doc = answers.parse_json(resp.body)
            pred = answers.prediction(self.spec, doc, img.width, img.height)
        except answers.BadAnswer as exc:
            log.warning(
                "model server answer rejected",
                server=self.opts.server,
                target=self.opts.name,
                field=exc.field,
            )
            raise TargetResponseError(
                self._redact(
                    f"{self._label}: answer for image '{img.image_id}' (images[{img.index}]): {exc}"
                )
            ) from None
        pred.image_id = img.image_id
        return pred

    def _raise_for_status(self, resp: HttpResponse, img: _Image) -> None:
        msg = f"{self._label}: request for image '{img.image_id}' got HTTP {resp.status}" + (
            f": {s}" if (s := self._snippet(resp)) else ""
        )
        if resp.retryable:
            exc = resp.unavailable(msg)
            log.warning(
                "model server unavailable",
                server=self.opts.server,
                target=self.opts.name,
                status=resp.status,
                retry_after_s=exc.retry_after_s,
            )
            raise exc
        if resp.status in _BAD_IMAGE_STATUS:
            raise errors.InvalidArgument(f"images[{img.index}]", msg)
        # TorchServe answers a missing or wrong key with 400 "Token Authorization failed".
        if resp.status in (401, 403) or (resp.status == 400 and b"token" in resp.body.lower()):
            raise TargetResponseError(
                f"{msg} (credentials refused"
                + (
                    f"; token from ${self.opts.token_env})"
                    if self.opts.token_env
                    else "; see token_env)"
                )
            )
        if resp.status == 404:
            what = {"torchserve": "model", "bentoml": "endpoint"}.get(self.opts.server, "path")
            raise TargetResponseError(f"{msg} ({what} '{self.opts.name}' not found?)")
        raise TargetResponseError(msg)


def _covers(prefix: str, path: str) -> bool:
    """Whether Ray Serve routes ``path`` to the application at route ``prefix`` (a prefix
    matches whole path segments)."""
    prefix = prefix.rstrip("/")
    return not prefix or path == prefix or path.startswith(prefix + "/")


def backend_from_url(url: str) -> ModelServerBackend:
    """The proxy back end of a ``torchserve[+https]://`` or ``bentoml[+https]://`` URL
    (nothing is contacted until the first call)."""
    return ModelServerBackend(parse_url(url))
