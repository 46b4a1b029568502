"""OIP over REST (``/v2/models/MODEL[/versions/V]/...``), sent through the shared HTTP client
(``fortis.adapters.http_client``: pooled keep-alive connections, proxies, TLS, timeouts).

HTTP 413 -> ``MessageTooLarge``; 408, 425, 429 and 5xx -> ``TargetUnavailable`` carrying the
Retry-After; any other status -> ``TargetResponseError`` with the server's error message.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Mapping, Sequence
from urllib.parse import quote

from fortis.adapters.http_client import HttpClient, HttpResponse
from fortis.adapters.kserve_v2.codec import (
    InTensor,
    OutTensor,
    infer_request_json,
    outputs_from_json,
)
from fortis.adapters.kserve_v2.metadata import ModelMeta, meta_from_json
from fortis.adapters.kserve_v2.options import KServeOptions, bearer_token, scrub
from fortis.adapters.kserve_v2.transport import MAX_MESSAGE_BYTES, MessageTooLarge
from fortis.adapters.target_errors import TargetResponseError


def error_text(body: bytes, secrets: Sequence[str] = ()) -> str:
    """The server's error message (OIP ``{"error": "..."}``, else the body's start), each of
    ``secrets`` (the bearer token a server may echo) scrubbed before the text is cut, so that
    no prefix of one survives the cut."""
    try:
        doc = json.loads(body)
        if isinstance(doc, dict):
            for key in ("error", "detail", "message"):
                if key in doc:
                    return scrub(str(doc[key])[:65536], secrets)[:300]
    except (ValueError, UnicodeDecodeError, RecursionError):    # RecursionError: too deep
        pass
    return scrub(body[:65536].decode("utf-8", "replace"), secrets).strip()[:300]


class HttpTransport:
    """OIP REST over the shared, thread-safe HTTP client."""

    def __init__(self, opts: KServeOptions) -> None:
        self.opts = opts
        self.endpoint = opts.endpoint
        base = f"/v2/models/{quote(opts.model, safe='')}"
        if opts.version:
            base += f"/versions/{quote(opts.version, safe='')}"
        self._base = base
        host = f"[{opts.host}]" if ":" in opts.host else opts.host
        self._url = f"{'https' if opts.transport == 'https' else 'http'}://{host}:{opts.port}"
        self._headers: dict[str, str] = {"Accept": "application/json"}
        if opts.host_header:
            self._headers["Host"] = opts.host_header
        self._token = bearer_token(opts.token_env, "kserve")
        if self._token:
            self._headers["Authorization"] = f"Bearer {self._token}"
        self._client = HttpClient(
            timeout_s=opts.timeout_s, label=self.endpoint, max_response_bytes=MAX_MESSAGE_BYTES,
            ssl_context=ssl.create_default_context() if opts.transport == "https" else None)

    def _request(self, method: str, path: str, body: bytes | None = None,
                 headers: Mapping[str, str] | None = None) -> HttpResponse:
        return self._client.request(method, self._url + path, {**self._headers, **(headers or {})},
                                    body, label=f"{self.endpoint}{path}")

    def _check(self, path: str, resp: HttpResponse) -> None:
        if resp.status == 200:
            return
        where = f"{self.endpoint}{path}"
        if resp.status == 413:
            raise MessageTooLarge(f"{where}: HTTP 413: {error_text(resp.body, (self._token,))}")
        if resp.retryable:
            raise resp.unavailable(f"{where}: HTTP {resp.status}: {error_text(resp.body, (self._token,))}")
        if resp.status == 404:
            raise TargetResponseError(f"{where}: HTTP 404 (model '{self.opts.model}' not found?): "
                                      f"{error_text(resp.body, (self._token,))}")
        raise TargetResponseError(f"{where}: HTTP {resp.status}: {error_text(resp.body, (self._token,))}")

    def ready(self) -> bool:
        path = f"{self._base}/ready"
        resp = self._request("GET", path)
        if resp.status == 200:
            try:
                doc = json.loads(resp.body) if resp.body.strip() else {}
            except (ValueError, UnicodeDecodeError, RecursionError):
                doc = {}
            return not (isinstance(doc, dict) and doc.get("ready") is False)
        if resp.status == 404 or resp.retryable:
            self._check(path, resp)                     # not found / unavailable
        return False                                    # e.g. MLServer's 400: not ready yet

    def metadata(self) -> ModelMeta:
        resp = self._request("GET", self._base)
        self._check(self._base, resp)
        try:
            return meta_from_json(resp.body)
        except TargetResponseError as exc:    # it may quote the answer, an echoed token too
            raise TargetResponseError(scrub(exc.message, (self._token,))) from None

    def infer(self, tensor: InTensor, output_name: str) -> list[OutTensor]:
        path = f"{self._base}/infer"
        body, header_len = infer_request_json(tensor, output_name=output_name, binary=self.opts.raw)
        headers = {"Content-Type": "application/json" if header_len is None
                   else "application/octet-stream"}
        if header_len is not None:
            headers["Inference-Header-Content-Length"] = str(header_len)
        resp = self._request("POST", path, body, headers)
        self._check(path, resp)
        hl = resp.headers.get("inference-header-content-length")
        try:
            answer_header = int(hl) if hl is not None else None
        except ValueError:
            raise TargetResponseError(f"{self.endpoint}{path}: bad Inference-Header-Content-Length "
                                      f"{hl!r}") from None
        try:
            return outputs_from_json(resp.body, answer_header)
        except TargetResponseError as exc:
            raise TargetResponseError(
                f"{self.endpoint}{path}: {scrub(exc.message, (self._token,))}") from None

    def close(self) -> None:
        self._client.close()
