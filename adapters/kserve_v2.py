"""Open Inference Protocol (KServe v2) target adapter, over gRPC and REST.

Reaches any server that speaks the Open Inference Protocol -- KServe, Triton, Seldon
MLServer, OpenVINO Model Server -- as a Fortis target (``TargetBackend`` of the proxy)::

    kserve+grpc://HOST:PORT/MODEL[?options]      gRPC (inference.GRPCInferenceService)
    kserve+http://HOST:PORT/MODEL[?options]      REST (/v2/models/MODEL/...)
    kserve+https://HOST[:PORT]/MODEL[?options]   REST over TLS

Options (every one optional; metadata means the model's ``/v2/models/MODEL`` / ModelMetadata
answer, read once and cached)::

    version=V                 model version (default: the server's choice)
    input=tensor|bytes        tensor: decoded, resized, normalised pixels (default);
                              bytes: the PNG/JPEG file as a BYTES element (models that decode)
    input_name=NAME           input tensor (default: metadata's first input, else "input")
    output_name=NAME          output tensor (default: the only output, else metadata's first)
    layout=nchw|nhwc          pixel layout (default: from the metadata shape, else nchw)
    dtype=FP32|FP16|UINT8     input datatype (default: metadata's, else FP32)
    channels=1|3              colour channels (default: from the metadata shape, else 3)
    resize=HxW                model input size (default: from the metadata shape, else each
                              image's own size; images of different sizes go in separate calls)
    scale=S                   pixel multiplier, e.g. 1/255 (default 1/255 for FP*, 1 for UINT8)
    mean=M[,M,M]&std=S[,S,S]  per-channel normalisation: x = (pixel * scale - mean) / std
    output=probabilities|logits   what the output holds; logits are turned into softmax scores
    labels=/path/labels.txt   class names, one a line (default: a "labels" parameter in the
                              metadata -- JSON list or one name a line -- else "0".."C-1")
    raw=1                     gRPC: raw_input_contents instead of typed contents; REST: the
                              binary tensor data extension (Triton) instead of a JSON data list
    batch=N                   most images per inference request (default 32, or the model's
                              fixed batch dimension)
    timeout=S                 seconds per request (default 30)
    token_env=VAR             send "Authorization: Bearer $VAR" (gRPC: authorization metadata)
    host=NAME                 Host header / gRPC authority (KServe ingress routing)
    tls=1                     gRPC over TLS (REST: use kserve+https)
    rate=R                    read by the proxy's rate limiter, ignored here

Preprocessing for ``input=tensor`` matches the built-in torch targets: an alpha channel is
dropped, the image is resized to HxW (``cv2.INTER_AREA`` when shrinking, ``INTER_LINEAR``
otherwise; no crop, aspect ratio not kept), grey is repeated to RGB or RGB turned to grey
(``COLOR_RGB2GRAY``) as the model needs, then scaled and normalised.

Answers are read from typed contents or ``raw_output_contents`` (gRPC), from the JSON ``data``
list or the binary data extension (REST). Errors: HTTP 429/503 (with Retry-After), 408, any
5xx, timeouts, refused connections and gRPC UNAVAILABLE / DEADLINE_EXCEEDED /
RESOURCE_EXHAUSTED become ``errors.Unavailable`` (retried by the proxy, honouring
``retry_after_s``); a reply the adapter cannot use (malformed JSON, missing output, wrong
shape or datatype, other HTTP 4xx or gRPC codes) becomes ``TargetResponseError`` naming what
was wrong, and an undecodable image ``InvalidArgument`` naming ``images[i]``.

Transport code (HTTP via ``http.client``, gRPC via the stubs generated into
``kserve_v2_protos`` by scripts/gen_kserve_protos.py); the encoding and decoding helpers
above the transports are pure functions of their arguments.
"""

from __future__ import annotations

import base64
import email.utils
import http.client
import json
import math
import os
import ssl
import struct
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qsl, quote, urlsplit

import cv2
import grpc
import numpy as np
from fortis.adapters.kserve_v2_protos import grpc_predict_v2_pb2 as pb
from fortis.adapters.kserve_v2_protos import grpc_predict_v2_pb2_grpc as pb_grpc
from fortis.common.v1 import common_pb2
from fortis.services.common import errors
from fortis.services.common.codec import classification_from_proba, decode_image, encode_png
from fortis.target.v1 import target_pb2

__all__ = [
    "KServeOptions",
    "KServeV2Backend",
    "MessageTooLarge",
    "ModelMeta",
    "OutTensor",
    "ResolvedInput",
    "TargetResponseError",
    "TargetUnavailable",
    "backend_from_url",
    "parse_url",
]

SCHEMES = {"kserve+grpc": "grpc", "kserve+http": "http", "kserve+https": "https"}
DEFAULT_BATCH = 32
DEFAULT_TIMEOUT_S = 30.0
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
#: Seconds before asking again for model metadata the server could not give.
METADATA_RETRY_S = 30.0
#: Numeric OIP datatypes and their little-endian numpy dtypes.
NUMPY_DTYPES: dict[str, str] = {
    "BOOL": "?", "UINT8": "<u1", "UINT16": "<u2", "UINT32": "<u4", "UINT64": "<u8",
    "INT8": "<i1", "INT16": "<i2", "INT32": "<i4", "INT64": "<i8",
    "FP16": "<f2", "FP32": "<f4", "FP64": "<f8",
}
#: gRPC typed-contents field of each datatype (FP16 has none: raw only).
CONTENTS_FIELD: dict[str, str] = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents",
    "INT32": "int_contents", "INT64": "int64_contents", "UINT8": "uint_contents",
    "UINT16": "uint_contents", "UINT32": "uint_contents", "UINT64": "uint64_contents",
    "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}
INPUT_DTYPES = ("FP32", "FP16", "UINT8")
_KNOWN_OPTIONS = {"version", "input", "input_name", "output_name", "layout", "dtype", "channels",
                  "resize", "scale", "mean", "std", "output", "labels", "raw", "batch", "timeout",
                  "token_env", "host", "tls", "rate"}
_RETRYABLE_GRPC = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                   grpc.StatusCode.RESOURCE_EXHAUSTED}


class TargetResponseError(errors.FortisError):
    """The server answered, but not with something the adapter can use (a bad status, a
    malformed body, a missing output, a wrong shape or datatype). Fails the call; the proxy
    records it for each image (ledger status ``TargetResponseError``)."""


class MessageTooLarge(TargetResponseError):
    """The server refused a request for its size (gRPC RESOURCE_EXHAUSTED "larger than max",
    HTTP 413); the adapter splits the batch and tries again."""


class TargetUnavailable(errors.Unavailable):
    """The server could not answer now (overloaded, down, timed out); the proxy retries,
    waiting ``retry_after_s`` when the server said how long."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


# -- options ---------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class KServeOptions:
    """What a ``kserve+...`` URL says (see the module docstring)."""

    transport: str                      # "grpc" | "http" | "https"
    host: str
    port: int
    model: str
    version: str = ""
    input_kind: str = "tensor"          # "tensor" | "bytes"
    input_name: str = ""
    output_name: str = ""
    layout: str = ""                    # "" (from metadata) | "nchw" | "nhwc"
    dtype: str = ""                     # "" (from metadata) | FP32 | FP16 | UINT8
    channels: int = 0                   # 0 = from metadata
    resize: tuple[int, int] | None = None
    scale: float | None = None
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()
    output: str = "probabilities"       # "probabilities" | "logits"
    labels_path: str = ""
    raw: bool = False
    batch: int = 0                      # 0 = default
    timeout_s: float = DEFAULT_TIMEOUT_S
    token_env: str = ""
    host_header: str = ""
    tls: bool = False

    @property
    def endpoint(self) -> str:
        return f"{self.transport}://{self.host}:{self.port}"


def _bad(option: str, message: str) -> errors.InvalidArgument:
    return errors.InvalidArgument("target", f"kserve option '{option}': {message}")


def _number(option: str, text: str) -> float:
    """A float, or a fraction such as ``1/255``."""
    try:
        num, sep, den = text.partition("/")
        value = float(num) / float(den) if sep else float(text)
    except (ValueError, ZeroDivisionError):
        raise _bad(option, f"'{text}' is not a number") from None
    if not math.isfinite(value):
        raise _bad(option, f"'{text}' is not finite")
    return value


def _positive_int(option: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise _bad(option, f"'{text}' is not an integer") from None
    if value < 1:
        raise _bad(option, f"must be >= 1, got {value}")
    return value


def _flag(option: str, text: str) -> bool:
    low = text.lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off", ""):
        return False
    raise _bad(option, f"'{text}' is not 1/0")


def parse_url(url: str) -> KServeOptions:
    """Parse ``kserve+grpc|http|https://HOST:PORT/MODEL?options``; ``InvalidArgument`` on
    ``target`` naming the bad part."""
    parts = urlsplit(url)
    transport = SCHEMES.get(parts.scheme)
    if transport is None:
        raise errors.InvalidArgument("target", f"'{url}' is not a kserve+grpc://, kserve+http:// "
                                               "or kserve+https:// URL")
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        raise errors.InvalidArgument("target", f"bad port in '{url}'") from None
    if not host:
        raise errors.InvalidArgument("target", f"no host in '{url}'")
    if port is None:
        if transport == "grpc":
            raise errors.InvalidArgument("target", f"no port in '{url}' (kserve+grpc://HOST:PORT/MODEL)")
        port = 443 if transport == "https" else 80
    model = parts.path.strip("/")
    if not model or "/" in model:
        raise errors.InvalidArgument("target", f"'{url}' must name one model: "
                                               f"{parts.scheme}://HOST:PORT/MODEL")
    q: dict[str, str] = {}
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key not in _KNOWN_OPTIONS:
            raise _bad(key, f"unknown option; known: {', '.join(sorted(_KNOWN_OPTIONS))}")
        q[key] = value
    kw: dict[str, Any] = {"transport": transport, "host": host, "port": port, "model": model,
                          "version": q.get("version", "")}
    if "input" in q:
        if q["input"] not in ("tensor", "bytes"):
            raise _bad("input", f"'{q['input']}' is not tensor or bytes")
        kw["input_kind"] = q["input"]
    kw["input_name"] = q.get("input_name", "")
    kw["output_name"] = q.get("output_name", "")
    if "layout" in q:
        layout = q["layout"].lower()
        if layout not in ("nchw", "nhwc"):
            raise _bad("layout", f"'{q['layout']}' is not nchw or nhwc")
        kw["layout"] = layout
    if "dtype" in q:
        dtype = q["dtype"].upper()
        if dtype not in INPUT_DTYPES:
            raise _bad("dtype", f"'{q['dtype']}' is not one of {', '.join(INPUT_DTYPES)}")
        kw["dtype"] = dtype
    if "channels" in q:
        ch = _positive_int("channels", q["channels"])
        if ch not in (1, 3):
            raise _bad("channels", f"must be 1 or 3, got {ch}")
        kw["channels"] = ch
    if "resize" in q:
        h, sep, w = q["resize"].lower().partition("x")
        kw["resize"] = (_positive_int("resize", h), _positive_int("resize", w if sep else h))
    if "scale" in q:
        kw["scale"] = _number("scale", q["scale"])
    for key in ("mean", "std"):
        if key in q:
            values = tuple(_number(key, v) for v in q[key].split(","))
            if len(values) not in (1, 3):
                raise _bad(key, f"give 1 or 3 values, got {len(values)}")
            kw[key] = values
    if any(s == 0 for s in kw.get("std", ())):
        raise _bad("std", "must not be 0")
    if "output" in q:
        if q["output"] not in ("probabilities", "logits"):
            raise _bad("output", f"'{q['output']}' is not probabilities or logits "
                                 "(the output tensor's name is output_name)")
        kw["output"] = q["output"]
    kw["labels_path"] = q.get("labels", "")
    kw["raw"] = _flag("raw", q.get("raw", "0"))
    kw["tls"] = _flag("tls", q.get("tls", "0"))
    if "batch" in q:
        kw["batch"] = _positive_int("batch", q["batch"])
    if "timeout" in q:
        kw["timeout_s"] = _number("timeout", q["timeout"])
        if kw["timeout_s"] <= 0:
            raise _bad("timeout", "must be > 0")
    kw["token_env"] = q.get("token_env", "")
    kw["host_header"] = q.get("host", "")
    opts = KServeOptions(**kw)
    if opts.input_kind == "bytes" and (opts.dtype or opts.layout or opts.mean or opts.std
                                       or opts.scale is not None or opts.channels):
        raise _bad("input", "input=bytes sends the image file; layout, dtype, channels, scale, "
                            "mean and std apply to input=tensor only")
    if opts.dtype == "UINT8" and (opts.mean or opts.std or opts.scale not in (None, 1.0)):
        raise _bad("dtype", "UINT8 input carries the pixels as they are; mean, std and scale "
                            "need FP32 or FP16")
    return opts


def read_labels(path: str) -> tuple[str, ...]:
    """Class names from a text file, one a line (blank trailing lines ignored)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise _bad("labels", f"cannot read '{path}': {exc}") from None
    names = parse_labels(text)
    if not names:
        raise _bad("labels", f"'{path}' holds no class names")
    return names


def parse_labels(value: Any) -> tuple[str, ...]:
    """Class names from a metadata value: a JSON list, a JSON-list string or one name a line."""
    if isinstance(value, list | tuple):
        return tuple(str(v) for v in value)
    text = str(value).strip()
    if text.startswith("["):
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
        if isinstance(parsed, list):
            return tuple(str(v) for v in parsed)
    return tuple(line.strip() for line in text.splitlines() if line.strip())


# -- model metadata --------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class TensorMeta:
    name: str
    datatype: str
    shape: tuple[int, ...]
    parameters: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class ModelMeta:
    """The model metadata of the Open Inference Protocol."""

    name: str
    versions: tuple[str, ...] = ()
    platform: str = ""
    inputs: tuple[TensorMeta, ...] = ()
    outputs: tuple[TensorMeta, ...] = ()
    parameters: Mapping[str, Any] = field(default_factory=dict)

    def labels(self, output_name: str = "") -> tuple[str, ...]:
        """Class names the server publishes -- a ``labels`` parameter of the output, else of
        the model, else of any output -- or ()."""
        for t in self.outputs:
            if (not output_name or t.name == output_name) and "labels" in t.parameters:
                return parse_labels(t.parameters["labels"])
        if "labels" in self.parameters:
            return parse_labels(self.parameters["labels"])
        for t in self.outputs:
            if "labels" in t.parameters:
                return parse_labels(t.parameters["labels"])
        return ()


def _tensor_meta_json(doc: Any, where: str) -> TensorMeta:
    if not isinstance(doc, dict) or not isinstance(doc.get("name"), str):
        raise TargetResponseError(f"model metadata: {where} is not a tensor description")
    shape = doc.get("shape") or []
    if not isinstance(shape, list) or not all(isinstance(s, int) for s in shape):
        raise TargetResponseError(f"model metadata: {where}.shape is not a list of integers")
    params = doc.get("parameters") or {}
    return TensorMeta(name=doc["name"], datatype=str(doc.get("datatype", "")),
                      shape=tuple(shape), parameters=params if isinstance(params, dict) else {})


def meta_from_json(body: bytes) -> ModelMeta:
    """ModelMeta of a REST ``GET /v2/models/MODEL`` answer."""
    doc = _json_body(body, "model metadata")
    if not isinstance(doc, dict) or not isinstance(doc.get("name"), str):
        raise TargetResponseError("model metadata: not a JSON object with a 'name'")
    params = doc.get("parameters") or {}
    return ModelMeta(
        name=doc["name"], versions=tuple(str(v) for v in doc.get("versions") or ()),
        platform=str(doc.get("platform") or ""),
        inputs=tuple(_tensor_meta_json(t, f"inputs[{i}]") for i, t in enumerate(doc.get("inputs") or ())),
        outputs=tuple(_tensor_meta_json(t, f"outputs[{i}]") for i, t in enumerate(doc.get("outputs") or ())),
        parameters=params if isinstance(params, dict) else {})


def _params_of(msg: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, p in msg.items():
        kind = p.WhichOneof("parameter_choice")
        if kind is not None:
            out[key] = getattr(p, kind)
    return out


def meta_from_proto(msg: pb.ModelMetadataResponse) -> ModelMeta:
    """ModelMeta of a gRPC ModelMetadata answer."""
    def tensor(t: Any) -> TensorMeta:
        return TensorMeta(name=t.name, datatype=t.datatype, shape=tuple(int(s) for s in t.shape),
                          parameters=_params_of(t.parameters))
    return ModelMeta(name=msg.name, versions=tuple(msg.versions), platform=msg.platform,
                     inputs=tuple(tensor(t) for t in msg.inputs),
                     outputs=tuple(tensor(t) for t in msg.outputs),
                     parameters=_params_of(msg.parameters))


@dataclass(frozen=True, kw_only=True)
class ResolvedInput:
    """The input tensor as it will be sent: options first, then metadata, then defaults."""

    name: str
    kind: str                   # "tensor" | "bytes"
    datatype: str               # FP32 | FP16 | UINT8 | BYTES
    layout: str                 # "nchw" | "nhwc" ("" for bytes)
    channels: int
    height: int                 # 0 = each image's own size
    width: int
    batch: int
    scale: float
    mean: tuple[float, ...]
    std: tuple[float, ...]


def resolve_input(opts: KServeOptions, meta: ModelMeta | None) -> ResolvedInput:
    """Fill what the URL left out from the model metadata (``meta`` may be None)."""
    first = meta.inputs[0] if meta and meta.inputs else None
    if meta and opts.input_name:
        first = next((t for t in meta.inputs if t.name == opts.input_name), first)
    name = opts.input_name or (first.name if first else "input")
    shape = first.shape if first and len(first.shape) == 4 else ()
    batch = opts.batch or DEFAULT_BATCH
    if shape and shape[0] > 0:
        batch = min(batch, shape[0])
    if opts.input_kind == "bytes":
        h, w = opts.resize or (0, 0)
        return ResolvedInput(name=name, kind="bytes", datatype="BYTES", layout="", channels=3,
                             height=h, width=w, batch=batch, scale=1.0, mean=(), std=())
    layout = opts.layout
    if not layout:
        if shape and shape[1] in (1, 3) and shape[3] not in (1, 3):
            layout = "nchw"
        elif shape and shape[3] in (1, 3):
            layout = "nhwc"
        else:
            layout = "nchw"
    if shape:
        dims = (shape[1], shape[2], shape[3]) if layout == "nchw" else (shape[3], shape[1], shape[2])
    else:
        dims = (-1, -1, -1)
    channels = opts.channels or (dims[0] if dims[0] in (1, 3) else 3)
    if opts.resize:
        h, w = opts.resize
    else:
        h, w = (dims[1], dims[2]) if dims[1] > 0 and dims[2] > 0 else (0, 0)
    datatype = opts.dtype
    if not datatype:
        datatype = first.datatype if first and first.datatype in INPUT_DTYPES else "FP32"
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()
    if datatype == "UINT8":
        scale = 1.0
    else:
        scale = opts.scale if opts.scale is not None else 1.0 / 255.0
        mean, std = opts.mean, opts.std
    for key, values in (("mean", mean), ("std", std)):
        if len(values) not in (0, 1, channels):
            raise _bad(key, f"{len(values)} values for a {channels}-channel input")
    return ResolvedInput(name=name, kind="tensor", datatype=datatype, layout=layout,
                         channels=channels, height=h, width=w, batch=batch, scale=scale,
                         mean=mean, std=std)


# -- encoding (pure) -------------------------------------------------------------------------
def fit_image(image: np.ndarray, height: int, width: int, channels: int) -> np.ndarray:
    """uint8 HxWxC (C in 1, 3, 4) -> uint8 height x width x channels (0 size = keep)."""
    img = image[:, :, :3] if image.shape[2] == 4 else image
    h, w = img.shape[:2]
    if height and width and (h, w) != (height, width):
        shrink = height <= h and width <= w
        img = cv2.resize(np.ascontiguousarray(img), (width, height),
                         interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR)
        if img.ndim == 2:
            img = img[:, :, None]
    if img.shape[2] != channels:
        if channels == 3:
            img = np.repeat(img, 3, axis=2)
        else:
            img = cv2.cvtColor(np.ascontiguousarray(img), cv2.COLOR_RGB2GRAY)[:, :, None]
    return np.ascontiguousarray(img)


def image_tensor(images: Sequence[np.ndarray], spec: ResolvedInput) -> np.ndarray:
    """A batch of uint8 HxWxC images as the model's input tensor (N first, then the layout)."""
    fitted = np.stack([fit_image(im, spec.height, spec.width, spec.channels) for im in images])
    if spec.datatype == "UINT8":
        x: np.ndarray = fitted
    else:
        xf = fitted.astype(np.float32) * np.float32(spec.scale)
        if spec.mean:
            xf -= np.asarray(spec.mean, dtype=np.float32)
        if spec.std:
            xf /= np.asarray(spec.std, dtype=np.float32)
        x = xf.astype(np.float16) if spec.datatype == "FP16" else xf
    if spec.layout == "nchw":
        x = x.transpose(0, 3, 1, 2)
    return np.ascontiguousarray(x)


@dataclass(frozen=True)
class InTensor:
    """An input tensor: a numeric array, or BYTES elements."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray | tuple[bytes, ...]


@dataclass(frozen=True)
class OutTensor:
    """An output tensor as answered."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray            # flat, in the datatype's dtype


def raw_bytes(t: InTensor) -> bytes:
    """Row-major little-endian bytes of a tensor (BYTES: 4-byte length + bytes per element)."""
    if isinstance(t.data, tuple):
        return b"".join(struct.pack("<I", len(b)) + b for b in t.data)
    return np.ascontiguousarray(t.data, dtype=NUMPY_DTYPES[t.datatype]).tobytes()


def split_raw_bytes_elements(data: bytes) -> list[bytes]:
    """Inverse of ``raw_bytes`` for a BYTES tensor."""
    out, pos = [], 0
    while pos < len(data):
        if pos + 4 > len(data):
            raise TargetResponseError("BYTES tensor: truncated element length")
        (n,) = struct.unpack_from("<I", data, pos)
        pos += 4
        if pos + n > len(data):
            raise TargetResponseError("BYTES tensor: element runs past the end of the data")
        out.append(data[pos:pos + n])
        pos += n
    return out


def infer_request_json(t: InTensor, *, output_name: str = "", binary: bool = False,
                       request_id: str = "") -> tuple[bytes, int | None]:
    """REST infer body, and the JSON header length when the binary extension is used."""
    tensor: dict[str, Any] = {"name": t.name, "shape": list(t.shape), "datatype": t.datatype}
    payload = b""
    if binary:
        payload = raw_bytes(t)
        tensor["parameters"] = {"binary_data_size": len(payload)}
    elif isinstance(t.data, tuple):
        tensor["data"] = [base64.b64encode(b).decode("ascii") for b in t.data]
        tensor["parameters"] = {"content_type": "base64"}
    else:
        tensor["data"] = t.data.ravel().tolist()
    doc: dict[str, Any] = {"inputs": [tensor]}
    if request_id:
        doc["id"] = request_id
    if output_name:
        doc["outputs"] = [{"name": output_name, "parameters": {"binary_data": binary}}]
    if binary:
        doc["parameters"] = {"binary_data_output": True}
    head = json.dumps(doc, separators=(",", ":")).encode()
    return (head + payload, len(head)) if binary else (head, None)


def infer_request_proto(t: InTensor, *, model: str, version: str = "", output_name: str = "",
                        raw: bool = False, request_id: str = "") -> pb.ModelInferRequest:
    """gRPC ModelInferRequest (typed contents, or raw_input_contents when ``raw`` or FP16)."""
    req = pb.ModelInferRequest(model_name=model, model_version=version, id=request_id)
    tensor = req.inputs.add(name=t.name, datatype=t.datatype, shape=list(t.shape))
    if raw or t.datatype not in CONTENTS_FIELD:
        req.raw_input_contents.append(raw_bytes(t))
    elif isinstance(t.data, tuple):
        tensor.contents.bytes_contents.extend(t.data)
    else:
        getattr(tensor.contents, CONTENTS_FIELD[t.datatype]).extend(t.data.ravel().tolist())
    if output_name:
        req.outputs.add(name=output_name)
    return req


# -- decoding (pure) -------------------------------------------------------------------------
def _json_body(body: bytes, what: str) -> Any:
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        snippet = body[:80].decode("utf-8", "replace")
        raise TargetResponseError(f"{what}: malformed JSON ({exc}): {snippet!r}") from None


def _check_shape(name: str, shape: Any) -> tuple[int, ...]:
    if not isinstance(shape, list | tuple) or not all(
            isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape):
        raise TargetResponseError(f"output '{name}': shape {shape!r} is not a list of "
                                  "non-negative integers")
    return tuple(int(s) for s in shape)


def _numeric(name: str, datatype: str) -> np.dtype:
    if datatype == "BYTES":
        raise TargetResponseError(f"output '{name}' has datatype BYTES; expected numeric scores")
    if datatype not in NUMPY_DTYPES:
        raise TargetResponseError(f"output '{name}' has unknown datatype '{datatype}'")
    return np.dtype(NUMPY_DTYPES[datatype])


def _from_raw(name: str, datatype: str, shape: tuple[int, ...], data: bytes) -> np.ndarray:
    dtype = _numeric(name, datatype)
    n = math.prod(shape)
    if len(data) != n * dtype.itemsize:
        raise TargetResponseError(f"output '{name}': {len(data)} raw bytes do not match shape "
                                  f"{list(shape)} of {datatype} ({n * dtype.itemsize} bytes)")
    return np.frombuffer(data, dtype=dtype)


def outputs_from_json(body: bytes, header_length: int | None = None) -> list[OutTensor]:
    """Output tensors of a REST infer answer (JSON ``data``, or the binary extension)."""
    head = body if header_length is None else body[:header_length]
    doc = _json_body(head, "inference answer")
    if not isinstance(doc, dict) or not isinstance(doc.get("outputs"), list):
        raise TargetResponseError("inference answer: no 'outputs' list in the JSON")
    pos = header_length or 0
    out: list[OutTensor] = []
    for i, o in enumerate(doc["outputs"]):
        if not isinstance(o, dict) or not isinstance(o.get("name"), str):
            raise TargetResponseError(f"inference answer: outputs[{i}] has no 'name'")
        name, datatype = o["name"], str(o.get("datatype", ""))
        shape = _check_shape(name, o.get("shape"))
        params = o.get("parameters") if isinstance(o.get("parameters"), dict) else {}
        size = params.get("binary_data_size") if params else None
        if size is not None:
            if header_length is None or not isinstance(size, int) or pos + size > len(body):
                raise TargetResponseError(f"output '{name}': binary_data_size {size!r} does not "
                                          f"fit the {len(body) - (header_length or 0)} bytes after "
                                          "the JSON header")
            data = _from_raw(name, datatype, shape, body[pos:pos + size])
            pos += size
        else:
            if "data" not in o:
                raise TargetResponseError(f"output '{name}' has no 'data'")
            dtype = _numeric(name, datatype)
            try:
                data = np.asarray(o["data"], dtype=np.float64).ravel()
            except (ValueError, TypeError):
                raise TargetResponseError(f"output '{name}': 'data' is not a list of numbers") from None
            if data.size != math.prod(shape):
                raise TargetResponseError(f"output '{name}': {data.size} values do not match "
                                          f"shape {list(shape)}")
            data = data.astype(dtype) if dtype.kind != "f" else data
        out.append(OutTensor(name, datatype, shape, data))
    return out


def outputs_from_proto(resp: pb.ModelInferResponse) -> list[OutTensor]:
    """Output tensors of a gRPC answer (typed contents or raw_output_contents)."""
    raw = list(resp.raw_output_contents)
    if raw and len(raw) != len(resp.outputs):
        raise TargetResponseError(f"inference answer: {len(raw)} raw_output_contents for "
                                  f"{len(resp.outputs)} outputs")
    out: list[OutTensor] = []
    for i, o in enumerate(resp.outputs):
        shape = tuple(int(s) for s in o.shape)
        if any(s < 0 for s in shape):
            raise TargetResponseError(f"output '{o.name}': negative dimension in {list(shape)}")
        if raw:
            data = _from_raw(o.name, o.datatype, shape, raw[i])
        else:
            dtype = _numeric(o.name, o.datatype)
            fname = CONTENTS_FIELD.get(o.datatype)
            values = getattr(o.contents, fname) if fname else ()
            if not values and math.prod(shape) > 0:
                raise TargetResponseError(f"output '{o.name}': no {fname or 'typed'} contents "
                                          "and no raw_output_contents")
            data = np.asarray(values, dtype=dtype)
            if data.size != math.prod(shape):
                raise TargetResponseError(f"output '{o.name}': {data.size} values do not match "
                                          f"shape {list(shape)}")
        out.append(OutTensor(o.name, o.datatype, shape, data))
    return out


def pick_output(outputs: Sequence[OutTensor], name: str, fallback: str = "") -> OutTensor:
    """The output named ``name`` (else the only one, else ``fallback``)."""
    names = [o.name for o in outputs]
    if not outputs:
        raise TargetResponseError("inference answer has no outputs")
    wanted = name or (outputs[0].name if len(outputs) == 1 else fallback)
    if not wanted:
        raise TargetResponseError(f"the answer has {len(outputs)} outputs {names}; choose one "
                                  "with output_name=NAME")
    for o in outputs:
        if o.name == wanted:
            return o
    raise TargetResponseError(f"no output '{wanted}' in the answer (outputs: {names})")


def scores_of(out: OutTensor, n_images: int) -> np.ndarray:
    """float64 N x C scores of an output answered for ``n_images`` images."""
    shape = out.shape
    ok = (len(shape) >= 2 and shape[0] == n_images) or (len(shape) == 1 and n_images == 1)
    if not ok or math.prod(shape) == 0:
        raise TargetResponseError(f"output '{out.name}' has shape {list(shape)} for "
                                  f"{n_images} image(s); expected [{n_images}, classes]")
    scores = np.asarray(out.data, dtype=np.float64).reshape(n_images, -1)
    if not np.all(np.isfinite(scores)):
        raise TargetResponseError(f"output '{out.name}' holds NaN or infinite values")
    return scores


def softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def to_probabilities(scores: np.ndarray, output: str, name: str = "output") -> np.ndarray:
    """Probabilities from ``probabilities`` (checked to be in [0, 1]) or ``logits`` scores."""
    if output == "logits":
        return softmax(scores)
    lo, hi = float(scores.min()), float(scores.max())
    if lo < -1e-4 or hi > 1 + 1e-4:
        raise TargetResponseError(f"output '{name}' should hold probabilities but ranges over "
                                  f"[{lo:.4g}, {hi:.4g}]; add output=logits for raw scores")
    return np.clip(scores, 0.0, 1.0)


def class_names(labels: Sequence[str], n_classes: int, where: str) -> Sequence[str]:
    if not labels:
        return [str(i) for i in range(n_classes)]
    if len(labels) != n_classes:
        raise TargetResponseError(f"the model answered {n_classes} scores but {where} "
                                  f"lists {len(labels)} class names")
    return labels


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (seconds or an HTTP date), or None."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
        return max(0.0, seconds) if math.isfinite(seconds) else None
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def error_text(body: bytes) -> str:
    """The server's error message (OIP ``{"error": "..."}``, else the body's start)."""
    try:
        doc = json.loads(body)
        if isinstance(doc, dict):
            for key in ("error", "detail", "message"):
                if key in doc:
                    return str(doc[key])[:300]
    except (ValueError, UnicodeDecodeError):
        pass
    return body[:300].decode("utf-8", "replace").strip()


# -- transports ------------------------------------------------------------------------------
class Transport(Protocol):
    endpoint: str

    def ready(self) -> bool: ...

    def metadata(self) -> ModelMeta: ...

    def infer(self, tensor: InTensor, output_name: str) -> list[OutTensor]: ...

    def close(self) -> None: ...


class HttpTransport:
    """OIP REST over ``http.client`` (one connection per request: safe across threads)."""

    def __init__(self, opts: KServeOptions) -> None:
        self.opts = opts
        self.endpoint = opts.endpoint
        base = f"/v2/models/{quote(opts.model, safe='')}"
        if opts.version:
            base += f"/versions/{quote(opts.version, safe='')}"
        self._base = base
        self._headers: dict[str, str] = {"Accept": "application/json"}
        if opts.host_header:
            self._headers["Host"] = opts.host_header
        if opts.token_env:
            self._headers["Authorization"] = f"Bearer {os.environ.get(opts.token_env, '')}"
        self._ssl = ssl.create_default_context() if opts.transport == "https" else None

    def _request(self, method: str, path: str, body: bytes | None = None,
                 headers: Mapping[str, str] | None = None) -> tuple[int, Mapping[str, str], bytes]:
        o = self.opts
        conn: http.client.HTTPConnection
        if self._ssl is not None:
            conn = http.client.HTTPSConnection(o.host, o.port, timeout=o.timeout_s, context=self._ssl)
        else:
            conn = http.client.HTTPConnection(o.host, o.port, timeout=o.timeout_s)
        try:
            conn.request(method, path, body=body, headers={**self._headers, **(headers or {})})
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
        except TimeoutError:
            raise TargetUnavailable(f"{self.endpoint}{path}: no answer within "
                                    f"{o.timeout_s:g} s") from None
        except (OSError, http.client.HTTPException) as exc:
            raise TargetUnavailable(f"{self.endpoint}{path}: {type(exc).__name__}: {exc}") from None
        finally:
            conn.close()

    def _check(self, path: str, status: int, headers: Mapping[str, str], body: bytes) -> None:
        if status == 200:
            return
        where = f"{self.endpoint}{path}"
        if status == 413:
            raise MessageTooLarge(f"{where}: HTTP 413: {error_text(body)}")
        if status in (408, 429) or status >= 500:
            raise TargetUnavailable(f"{where}: HTTP {status}: {error_text(body)}",
                                    parse_retry_after(headers.get("retry-after")))
        if status == 404:
            raise TargetResponseError(f"{where}: HTTP 404 (model '{self.opts.model}' not found?): "
                                      f"{error_text(body)}")
        raise TargetResponseError(f"{where}: HTTP {status}: {error_text(body)}")

    def ready(self) -> bool:
        path = f"{self._base}/ready"
        status, headers, body = self._request("GET", path)
        if status == 200:
            try:
                doc = json.loads(body) if body.strip() else {}
            except (ValueError, UnicodeDecodeError):
                doc = {}
            return not (isinstance(doc, dict) and doc.get("ready") is False)
        if status == 404 or status in (408, 429) or status >= 500:
            self._check(path, status, headers, body)    # not found / unavailable
        return False                                    # e.g. MLServer's 400: not ready yet

    def metadata(self) -> ModelMeta:
        status, headers, body = self._request("GET", self._base)
        self._check(self._base, status, headers, body)
        return meta_from_json(body)

    def infer(self, tensor: InTensor, output_name: str) -> list[OutTensor]:
        path = f"{self._base}/infer"
        body, header_len = infer_request_json(tensor, output_name=output_name, binary=self.opts.raw)
        headers = {"Content-Type": "application/json" if header_len is None
                   else "application/octet-stream"}
        if header_len is not None:
            headers["Inference-Header-Content-Length"] = str(header_len)
        status, rheaders, rbody = self._request("POST", path, body, headers)
        self._check(path, status, rheaders, rbody)
        hl = rheaders.get("inference-header-content-length")
        try:
            answer_header = int(hl) if hl is not None else None
        except ValueError:
            raise TargetResponseError(f"{self.endpoint}{path}: bad Inference-Header-Content-Length "
                                      f"{hl!r}") from None
        try:
            return outputs_from_json(rbody, answer_header)
        except TargetResponseError as exc:
            raise TargetResponseError(f"{self.endpoint}{path}: {exc.message}") from None

    def close(self) -> None:
        pass


class GrpcTransport:
    """OIP over gRPC with the generated ``GRPCInferenceService`` stub."""

    def __init__(self, opts: KServeOptions) -> None:
        self.opts = opts
        self.endpoint = opts.endpoint
        address = f"{opts.host}:{opts.port}"
        options: list[tuple[str, Any]] = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                                          ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)]
        if opts.host_header:
            options.append(("grpc.default_authority", opts.host_header))
        if opts.tls:
            self._channel = grpc.secure_channel(address, grpc.ssl_channel_credentials(), options)
        else:
            self._channel = grpc.insecure_channel(address, options)
        self._stub = pb_grpc.GRPCInferenceServiceStub(self._channel)
        self._metadata: tuple[tuple[str, str], ...] = ()
        if opts.token_env:
            self._metadata = (("authorization", f"Bearer {os.environ.get(opts.token_env, '')}"),)

    def _call(self, rpc: str, request: Any) -> Any:
        try:
            return getattr(self._stub, rpc)(request, timeout=self.opts.timeout_s,
                                            metadata=self._metadata)
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
            details = exc.details() if hasattr(exc, "details") else str(exc)
            where = f"{self.endpoint} {rpc}"
            if code == grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in str(details):
                raise MessageTooLarge(f"{where}: {code.name}: {details}") from None
            if code in _RETRYABLE_GRPC:
                retry = None
                trailing = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
                for key, value in trailing or ():
                    if key == "retry-after":
                        retry = parse_retry_after(str(value))
                raise TargetUnavailable(f"{where}: {code.name}: {details}", retry) from None
            raise TargetResponseError(f"{where}: {code.name}: {details}") from None

    def ready(self) -> bool:
        resp = self._call("ModelReady", pb.ModelReadyRequest(name=self.opts.model,
                                                             version=self.opts.version))
        return bool(resp.ready)

    def metadata(self) -> ModelMeta:
        return meta_from_proto(self._call("ModelMetadata", pb.ModelMetadataRequest(
            name=self.opts.model, version=self.opts.version)))

    def infer(self, tensor: InTensor, output_name: str) -> list[OutTensor]:
        req = infer_request_proto(tensor, model=self.opts.model, version=self.opts.version,
                                  output_name=output_name, raw=self.opts.raw)
        resp = self._call("ModelInfer", req)
        try:
            return outputs_from_proto(resp)
        except TargetResponseError as exc:
            raise TargetResponseError(f"{self.endpoint} ModelInfer: {exc.message}") from None

    def close(self) -> None:
        self._channel.close()


# -- the back end ----------------------------------------------------------------------------
class KServeV2Backend:
    """A Fortis ``TargetBackend`` over an Open Inference Protocol server."""

    def __init__(self, opts: KServeOptions, transport: Transport | None = None) -> None:
        self.opts = opts
        self.transport: Transport = transport or (
            GrpcTransport(opts) if opts.transport == "grpc" else HttpTransport(opts))
        self._labels = read_labels(opts.labels_path) if opts.labels_path else ()
        self._lock = threading.Lock()
        self._meta: ModelMeta | None = None
        self._meta_retry_at = 0.0           # monotonic time before which not to ask again
        self._batch_limit = 0               # learnt from "message too large" answers (0 = none)

    def close(self) -> None:
        self.transport.close()

    @property
    def learnt_batch_limit(self) -> int:
        """Images per call after the server refused a larger call as too big (0 = none yet)."""
        return self._batch_limit

    def _needs_metadata(self) -> bool:
        o = self.opts
        if not o.input_name or not o.labels_path:
            return True
        if o.input_kind == "bytes":
            return False
        return not (o.resize and o.layout and o.dtype and o.channels)

    def metadata(self) -> ModelMeta | None:
        """The model metadata, read once and kept. None while the server has none to give
        (asked again after ``METADATA_RETRY_S``); a server that is down raises
        ``Unavailable``, and is asked again on the next call."""
        with self._lock:
            if self._meta is None and time.monotonic() >= self._meta_retry_at:
                try:
                    self._meta = self.transport.metadata()
                except TargetResponseError:
                    self._meta_retry_at = time.monotonic() + METADATA_RETRY_S
            return self._meta

    def _spec(self) -> tuple[ResolvedInput, tuple[str, ...], str]:
        meta = self.metadata() if self._needs_metadata() else None
        spec = resolve_input(self.opts, meta)
        if self._labels:
            return spec, self._labels, f"labels file '{self.opts.labels_path}'"
        labels = meta.labels(self.opts.output_name) if meta else ()
        return spec, labels, "the model metadata"

    def _default_output(self) -> str:
        meta = self._meta
        return meta.outputs[0].name if meta and meta.outputs else ""

    def info(self) -> target_pb2.TargetInfo:
        if not self.transport.ready():
            raise TargetUnavailable(f"{self.transport.endpoint}: model '{self.opts.model}' "
                                    "is not ready")
        meta = self.metadata()
        spec = resolve_input(self.opts, meta)
        labels: Sequence[str] = self._labels or (meta.labels(self.opts.output_name) if meta else ())
        if not labels and meta and meta.outputs:
            out = next((t for t in meta.outputs if t.name == self.opts.output_name), meta.outputs[0])
            if len(out.shape) >= 2 and out.shape[-1] > 0:
                labels = [str(i) for i in range(out.shape[-1])]
        version = self.opts.version or (",".join(meta.versions) if meta else "")
        if meta and meta.platform:
            version = f"{meta.platform} {version}".strip()
        return target_pb2.TargetInfo(
            name=self.opts.model, task_type=common_pb2.TASK_TYPE_CLASSIFICATION,
            labels=list(labels), output_kind=common_pb2.OUTPUT_KIND_FULL_SCORES,
            input=target_pb2.InputSpec(height=spec.height, width=spec.width,
                                       channels=spec.channels, max_batch_size=spec.batch),
            version=version)

    def _inputs(self, images: Sequence[common_pb2.Image], spec: ResolvedInput
                ) -> list[np.ndarray | bytes]:
        out: list[np.ndarray | bytes] = []
        for i, img in enumerate(images):
            arr = decode_image(img, f"images[{i}]")      # InvalidArgument naming the image
            if spec.kind == "bytes":
                if spec.height and arr.shape[:2] != (spec.height, spec.width):
                    out.append(encode_png(fit_image(arr, spec.height, spec.width, 3)))
                elif img.WhichOneof("content") == "encoded":
                    out.append(img.encoded)
                else:
                    out.append(encode_png(arr))
            else:
                out.append(arr)
        return out

    def predict(self, images: Sequence[common_pb2.Image]) -> list[common_pb2.Prediction]:
        spec, labels, labels_from = self._spec()
        inputs = self._inputs(images, spec)
        limit = min(spec.batch, self._batch_limit or spec.batch)
        # Calls of at most `limit` images; without a fixed size, images of one size each.
        groups: list[list[int]] = []
        for i, x in enumerate(inputs):
            last = groups[-1] if groups else None
            if (last is not None and len(last) < limit
                    and (spec.height or _size(inputs[last[0]]) == _size(x))):
                last.append(i)
            else:
                groups.append([i])
        probas: list[np.ndarray] = []
        for group in groups:
            probas += list(self._infer(spec, [inputs[i] for i in group]))
        preds: list[common_pb2.Prediction] = []
        for img, p in zip(images, probas, strict=True):
            names = class_names(labels, len(p), labels_from)
            preds.append(common_pb2.Prediction(image_id=img.image_id, classification=(
                classification_from_proba(p, output="full_scores", top_k=len(names), names=names))))
        return preds

    def _infer(self, spec: ResolvedInput, items: list[np.ndarray | bytes]) -> np.ndarray:
        """N x C probabilities of one call; halves the call when the server says it is too
        large (and remembers the smaller batch for the next calls)."""
        if spec.kind == "bytes":
            data = tuple(bytes(x) for x in items if isinstance(x, bytes))
            tensor = InTensor(spec.name, "BYTES", (len(data),), data)
        else:
            arr = image_tensor([x for x in items if isinstance(x, np.ndarray)], spec)
            tensor = InTensor(spec.name, spec.datatype, tuple(arr.shape), arr)
        try:
            outputs = self.transport.infer(tensor, self.opts.output_name)
        except MessageTooLarge as exc:
            if len(items) == 1:
                raise TargetResponseError(f"the server refuses even a one-image request as too "
                                          f"large: {exc.message}") from None
            half = len(items) // 2
            with self._lock:
                self._batch_limit = min(self._batch_limit or half, half)
            return np.concatenate([self._infer(spec, items[:half]), self._infer(spec, items[half:])])
        out = pick_output(outputs, self.opts.output_name, self._default_output())
        return to_probabilities(scores_of(out, len(items)), self.opts.output, out.name)


def _size(x: np.ndarray | bytes) -> tuple[int, ...]:
    return tuple(x.shape[:2]) if isinstance(x, np.ndarray) else ()


def backend_from_url(url: str) -> KServeV2Backend:
    """The proxy back end of a ``kserve+grpc://`` / ``kserve+http(s)://`` URL (nothing is
    contacted until the first call)."""
    return KServeV2Backend(parse_url(url))
