"""HTTP/JSON vision APIs as Fortis targets, configured by a YAML profile, not coded.

    http-json:/path/to/profile.yaml        a profile file
    http-json:google-vision-labels         a profile shipped in ``adapters/profiles/``

A profile says how to send one image (base64 in a JSON template, the raw bytes, multipart form
data, or a URL the service fetches), how to authenticate (a header whose value comes from a
secret *reference*, ``env:VAR`` or ``file:/path``; never the secret itself), and where the
answer is in the JSON (JMESPath expressions) with declarative transforms: score scale, box
format, mask encoding and label mapping. ``adapters/profiles/README.md`` documents every key;
``adapters/profiles/*.yaml`` are worked examples for AWS Rekognition, Google Cloud Vision and
Azure Image Analysis 4.0.

Errors, as the proxy expects them (``fortis.services.target_proxy.proxy.TargetBackend``):

* HTTP 429, 408, 5xx, timeouts, refused connections -> ``errors.Unavailable`` with
  ``retry_after_s`` from a Retry-After header; the proxy retries with backoff and records the
  attempts in its ledger.
* An answer that does not fit the profile (not JSON, a missing ``items`` path, a box outside
  the image, a score outside 0-1 after scaling, a bad mask) -> ``TargetResponseError`` naming
  the problem and the image: a failed row in the ledger, never a crash.
* HTTP 400/413/415/422 -> ``errors.InvalidArgument`` on ``images``; other 4xx (401, 403, 404)
  -> ``HttpTargetError``. Neither is retried.

Missing numbers in an answer count as 0 (proto3 JSON, e.g. Google Cloud Vision, leaves out
zeros: a score of 0 or a box at x = 0 is absent), unless the profile says
``missing_numbers: error``.

Domain rule (DESIGN.md section 1): no gRPC here, only HTTP transport and pure transforms; the
transforms (``box_to_pixels``, ``polygon_to_box``, ``decode_coco_rle``, ``decode_png_mask``,
``scale_score``, ...) are plain functions, tested without a server.
"""

from __future__ import annotations

import base64
import binascii
import email.utils
import http.client
import json
import math
import os
import re
import secrets
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import CancelledError, ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import cv2
import jmespath
import numpy as np
import structlog
import yaml
from fortis.common.v1 import common_pb2
from fortis.services.common import errors
from fortis.services.common.codec import array_to_tensor, decode_image, encode_png
from fortis.target.v1 import target_pb2
from jmespath.exceptions import JMESPathError
from jmespath.parser import ParsedResult

log = structlog.get_logger("fortis.adapters.http_json")

#: Where profiles named without a path (``http-json:google-vision-labels``) are looked up.
PROFILES_DIR = Path(__file__).resolve().parent / "profiles"

TASKS: dict[str, common_pb2.TaskType] = {
    "classification": common_pb2.TASK_TYPE_CLASSIFICATION,
    "detection": common_pb2.TASK_TYPE_DETECTION,
    "segmentation": common_pb2.TASK_TYPE_SEGMENTATION,
}
CLASSIFICATION_OUTPUTS: dict[str, common_pb2.OutputKind] = {
    "top_k": common_pb2.OUTPUT_KIND_TOP_K_SCORES,
    "full_scores": common_pb2.OUTPUT_KIND_FULL_SCORES,
    "label_only": common_pb2.OUTPUT_KIND_LABEL_ONLY,
}
#: Box formats: four numbers (``keys`` names them, in this order) or a polygon of vertices.
BOX_FORMATS: dict[str, str] = {
    "normalized_ltwh": "left, top, width, height as fractions of the image (AWS Rekognition)",
    "normalized_xyxy": "x_min, y_min, x_max, y_max as fractions of the image",
    "pixel_xywh": "x, y, width, height in pixels (Azure Image Analysis)",
    "pixel_xyxy": "x_min, y_min, x_max, y_max in pixels",
    "normalized_polygon": "vertices as fractions of the image -> their bounding box (Google)",
    "pixel_polygon": "vertices in pixels -> their bounding box",
}
MASK_FORMATS = ("png_base64", "coco_rle")
MASK_KINDS = ("binary", "class_map")
IMAGE_MODES = ("base64", "binary", "multipart", "url")
SCORE_SCALES: dict[Any, float] = {1: 1.0, 100: 100.0, "0-1": 1.0, "0-100": 100.0}
#: Template placeholders and what they become.
PLACEHOLDERS: dict[str, str] = {
    "image_base64": "the image file, base64 (standard alphabet, padded)",
    "image_url": "a URL the service can fetch the image from (image: url)",
    "image_mime": "image/png or image/jpeg",
    "image_width": "image width, pixels (a number)",
    "image_height": "image height, pixels (a number)",
    "images": "the list of per_image templates, one per image of the request",
}
#: Header names that carry credentials: they belong under ``request.auth`` (a secret reference).
_SECRET_HEADER = re.compile(r"authorization|api[-_]?key|token|secret|subscription[-_]key|password",
                            re.IGNORECASE)
_PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_ENV_REF = re.compile(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_RETRYABLE_STATUS = {408, 425, 429}
_BAD_INPUT_STATUS = {400, 413, 415, 422}


class TargetResponseError(errors.FortisError):
    """The service answered, but not in the shape its profile declares (per query)."""


class HttpTargetError(errors.FortisError):
    """The service refused the request with an HTTP status that retrying will not fix."""


# ---------------------------------------------------------------------------------------------
# Pure transforms
# ---------------------------------------------------------------------------------------------

def scale_score(value: float, scale: float) -> float:
    """A service score on a 0-``scale`` range as a confidence in [0, 1].

    Raises ``ValueError`` when the result is outside [0, 1] (beyond rounding), which usually
    means the profile's ``score_scale`` is wrong."""
    if not math.isfinite(value):
        raise ValueError(f"score {value!r} is not a finite number")
    s = value / scale
    if s < -1e-6 or s > 1.0 + 1e-6:
        raise ValueError(f"score {value:g} is outside 0-{scale:g} (score_scale {scale:g})")
    return min(max(s, 0.0), 1.0)


def box_to_pixels(fmt: str, values: Sequence[float], width: int, height: int
                  ) -> tuple[float, float, float, float]:
    """Four numbers in box format ``fmt`` as pixel (x_min, y_min, x_max, y_max)."""
    if len(values) != 4:
        raise ValueError(f"a {fmt} box needs 4 numbers, got {len(values)}")
    a, b, c, d = (float(v) for v in values)
    if fmt == "normalized_ltwh":
        if c < 0 or d < 0:
            raise ValueError(f"negative box width/height ({c:g}, {d:g})")
        return a * width, b * height, (a + c) * width, (b + d) * height
    if fmt == "normalized_xyxy":
        return a * width, b * height, c * width, d * height
    if fmt == "pixel_xywh":
        if c < 0 or d < 0:
            raise ValueError(f"negative box width/height ({c:g}, {d:g})")
        return a, b, a + c, b + d
    if fmt == "pixel_xyxy":
        return a, b, c, d
    raise ValueError(f"unknown box format '{fmt}'")


def polygon_to_box(points: Sequence[tuple[float, float]], *, normalized: bool, width: int,
                   height: int) -> tuple[float, float, float, float]:
    """The pixel bounding box (x_min, y_min, x_max, y_max) of a polygon's vertices."""
    if not points:
        raise ValueError("a polygon needs at least one vertex")
    xs = [float(p[0]) for p in points]
    ys = [float(p[1]) for p in points]
    sx, sy = (width, height) if normalized else (1, 1)
    return min(xs) * sx, min(ys) * sy, max(xs) * sx, max(ys) * sy


def check_box(box: tuple[float, float, float, float], width: int, height: int, *,
              tolerance_px: float = 1.0) -> tuple[float, float, float, float]:
    """``box`` clipped to the image; ``ValueError`` when it lies outside (beyond the tolerance)
    or is inverted."""
    x0, y0, x1, y1 = box
    if not all(math.isfinite(v) for v in box):
        raise ValueError(f"box {box} has a non-finite coordinate")
    if x1 < x0 or y1 < y0:
        raise ValueError(f"box ({x0:g}, {y0:g}, {x1:g}, {y1:g}) is inverted (x_max < x_min or "
                         "y_max < y_min)")
    t = tolerance_px
    if x0 < -t or y0 < -t or x1 > width + t or y1 > height + t:
        raise ValueError(f"box ({x0:g}, {y0:g}, {x1:g}, {y1:g}) lies outside the {width}x{height} "
                         "image")
    return (min(max(x0, 0.0), width), min(max(y0, 0.0), height),
            min(max(x1, 0.0), width), min(max(y1, 0.0), height))


def coco_rle_counts(counts: str | bytes) -> list[int]:
    """Run lengths of a compressed COCO RLE string (the ``counts`` of pycocotools' encode)."""
    s = counts.decode("ascii") if isinstance(counts, bytes) else counts
    out: list[int] = []
    p = 0
    while p < len(s):
        x, k, more = 0, 0, True
        while more:
            if p >= len(s):
                raise ValueError("compressed RLE string ends in the middle of a number")
            c = ord(s[p]) - 48
            if c < 0 or c > 63:
                raise ValueError(f"character {s[p]!r} is not in the COCO RLE alphabet")
            x |= (c & 0x1F) << (5 * k)
            more = bool(c & 0x20)
            p += 1
            k += 1
            if not more and (c & 0x10):
                x |= -1 << (5 * k)
        if len(out) > 2:
            x += out[-2]
        out.append(x)
    return out


def decode_coco_rle(rle: Mapping[str, Any]) -> np.ndarray:
    """A COCO run-length encoding ``{"size": [h, w], "counts": [...] | "..."}`` as a bool HxW
    mask. Runs alternate 0, 1, 0, ... over the pixels in column-major (Fortran) order."""
    size = rle.get("size")
    if (not isinstance(size, list | tuple) or len(size) != 2
            or not all(isinstance(v, int | float) and v >= 0 for v in size)):
        raise ValueError(f"RLE 'size' must be [height, width], got {size!r}")
    h, w = int(size[0]), int(size[1])
    raw = rle.get("counts")
    if isinstance(raw, str | bytes):
        counts = coco_rle_counts(raw)
    elif isinstance(raw, list) and all(isinstance(v, int | float) for v in raw):
        counts = [int(v) for v in raw]
    else:
        raise ValueError("RLE 'counts' must be a list of run lengths or a compressed string")
    if any(c < 0 for c in counts):
        raise ValueError("RLE has a negative run length")
    if sum(counts) != h * w:
        raise ValueError(f"RLE runs cover {sum(counts)} pixels, the {h}x{w} size needs {h * w}")
    flat = np.repeat(np.arange(len(counts), dtype=np.uint8) % 2, counts).astype(bool)
    return flat.reshape((w, h)).T.copy()


def decode_png_mask(data: str) -> np.ndarray:
    """A base64 PNG (a ``data:`` URI prefix is allowed) as a 2-D integer array."""
    text = data.split(",", 1)[1] if data.startswith("data:") else data
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("mask is not valid base64") from None
    arr = cv2.imdecode(np.frombuffer(raw, dtype=np.uint8), cv2.IMREAD_UNCHANGED)
    if arr is None:
        raise ValueError(f"mask is not a decodable PNG ({len(raw)} bytes)")
    if arr.ndim == 3:
        if arr.shape[2] == 4:
            arr = arr[:, :, :3]
        if not all(np.array_equal(arr[:, :, 0], arr[:, :, c]) for c in range(1, arr.shape[2])):
            raise ValueError("mask PNG has colour channels that differ; expected a grey image")
        arr = arr[:, :, 0]
    return np.asarray(arr)


def compose_class_map(masks: Sequence[tuple[int, np.ndarray, float]], height: int, width: int,
                      background: int = 0) -> np.ndarray:
    """Per-object binary masks (label, mask, score) painted into one int32 class map; where
    masks overlap the higher score wins."""
    out = np.full((height, width), background, dtype=np.int32)
    for label, mask, _ in sorted(masks, key=lambda m: m[2]):
        out[np.asarray(mask).astype(bool)] = label
    return out


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    v = value.strip()
    try:
        return max(0.0, float(v))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(v)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def number(value: Any, *, what: str, missing_zero: bool = True) -> float:
    """A JSON value as a float: proto3 JSON leaves out zeros (absent -> 0 unless
    ``missing_zero`` is false), and writes 64-bit numbers and NaN/Infinity as strings."""
    if value is None:
        if missing_zero:
            return 0.0
        raise ValueError(f"{what} is missing")
    if isinstance(value, bool):
        raise ValueError(f"{what} is a boolean, expected a number")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    raise ValueError(f"{what} is {value!r}, expected a number")


def render_template(template: Any, values: Mapping[str, Any]) -> Any:
    """A JSON template with ``${name}`` placeholders filled. A string that is exactly one
    placeholder becomes the value itself (a number, a list); otherwise text is substituted."""
    if isinstance(template, dict):
        return {k: render_template(v, values) for k, v in template.items()}
    if isinstance(template, list):
        return [render_template(v, values) for v in template]
    if isinstance(template, str):
        m = _PLACEHOLDER.fullmatch(template)
        if m:
            return values[m.group(1)]
        return _PLACEHOLDER.sub(lambda mm: str(values[mm.group(1)]), template)
    return template


def placeholders_in(template: Any) -> set[str]:
    if isinstance(template, dict):
        return set().union(*(placeholders_in(v) for v in template.values())) if template else set()
    if isinstance(template, list):
        return set().union(*(placeholders_in(v) for v in template)) if template else set()
    if isinstance(template, str):
        return set(_PLACEHOLDER.findall(template))
    return set()


def expand_env(text: str, field_name: str) -> str:
    """``${env:NAME}`` / ``${env:NAME:-default}`` in a non-secret setting (the endpoint URL)."""
    def sub(m: re.Match[str]) -> str:
        value = os.environ.get(m.group(1))
        if value:
            return value
        if m.group(2) is not None:
            return m.group(2)
        raise errors.InvalidArgument(field_name, f"environment variable {m.group(1)} is not set "
                                                 "and the setting gives no default")
    return _ENV_REF.sub(sub, text)


# ---------------------------------------------------------------------------------------------
# Profile
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SecretRef:
    """A reference to a secret: ``env:VAR`` or ``file:/path``. Resolved on every request (so a
    rotated file is picked up); the value never appears in reprs, errors or logs."""

    ref: str

    def resolve(self) -> str:
        kind, _, where = self.ref.partition(":")
        if kind == "env":
            value = os.environ.get(where)
            if not value:
                raise errors.FailedPrecondition(f"secret {self.ref}: environment variable is not set")
        else:
            try:
                value = Path(where).read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise errors.FailedPrecondition(
                    f"secret {self.ref}: cannot read the file ({exc.strerror})") from None
            if not value:
                raise errors.FailedPrecondition(f"secret {self.ref}: the file is empty")
        if "\r" in value or "\n" in value:
            raise errors.FailedPrecondition(f"secret {self.ref}: contains a line break")
        return value


@dataclass(frozen=True, kw_only=True)
class AuthSpec:
    header: str
    secret: SecretRef
    prefix: str = ""


@dataclass(frozen=True, kw_only=True)
class ImageUrlSpec:
    """``image: url``: how the service gets a URL for the image."""

    serve: str = "local"                # local: a tiny HTTP file server of the adapter's own
    host: str = "127.0.0.1"
    port: int = 0
    public_base: str = ""               # URL prefix the service uses (default http://host:port)
    upload_url: str = ""                # serve: upload -- PUT the image here (${name} = file name)
    upload_method: str = "PUT"
    upload_auth: AuthSpec | None = None
    public_url: str = ""                # ... and the URL the service fetches it from


@dataclass(frozen=True, kw_only=True)
class BoxSpec:
    path: ParsedResult
    path_text: str
    format: str
    keys: tuple[str, ...] = ()
    tolerance_px: float = 1.0


@dataclass(frozen=True, kw_only=True)
class MaskSpec:
    path: ParsedResult
    path_text: str
    format: str
    kind: str = "binary"


@dataclass(frozen=True, kw_only=True)
class Profile:
    """A parsed, validated profile (see ``adapters/profiles/README.md``)."""

    name: str
    source: str
    task: str
    labels: tuple[str, ...] = ()
    label_map: Mapping[str, str] = field(default_factory=dict)
    label_index: Mapping[str, int] = field(default_factory=dict)   # matching key -> index
    label_match: str = "case_insensitive"
    unknown_labels: str = "keep"
    output: str = "top_k"
    top_k: int = 0
    version: str = ""
    description: str = ""
    # request
    url: str = ""
    method: str = "POST"
    headers: Mapping[str, str] = field(default_factory=dict)
    auth: AuthSpec | None = None
    image: str = "base64"
    body: Any = None
    per_image: Any = None
    multipart_file_field: str = "image"
    multipart_filename: str = "image"
    multipart_fields: Mapping[str, str] = field(default_factory=dict)
    image_url: ImageUrlSpec = field(default_factory=ImageUrlSpec)
    timeout_s: float = 30.0
    max_concurrency: int = 4
    images_per_request: int = 1
    max_response_bytes: int = 32 * 1024 * 1024
    # response
    results: ParsedResult | None = None
    results_text: str = ""
    error: ParsedResult | None = None
    items: ParsedResult | None = None
    items_text: str = ""
    missing_items: str = "error"
    instances: ParsedResult | None = None
    label: ParsedResult | None = None
    label_text: str = ""
    label_index_base: int = 0
    score: ParsedResult | None = None
    score_text: str = ""
    score_scale: float = 1.0
    missing_numbers: str = "zero"
    min_score: float = 0.0
    box: BoxSpec | None = None
    mask: MaskSpec | None = None
    background: int = 0

    def label_of(self, raw: Any) -> tuple[int, str] | None:
        """(label index, name) of a service label; index -1 for names outside the label set.
        None when unknown labels are dropped."""
        if isinstance(raw, bool):
            raise ValueError(f"label is a boolean ({raw})")
        if isinstance(raw, int | float) and float(raw).is_integer():
            idx = int(raw) - self.label_index_base
            if 0 <= idx < len(self.labels):
                return idx, self.labels[idx]
            return None if self.unknown_labels == "drop" else (-1, str(int(raw)))
        if not isinstance(raw, str) or not raw:
            raise ValueError(f"label is {raw!r}, expected a name or a class index")
        fold = self.label_match == "case_insensitive"
        mapped = self.label_map.get(raw.casefold() if fold else raw, raw)
        key = mapped.casefold() if fold else mapped
        idx = self.label_index.get(key, -1)
        if idx >= 0:
            return idx, self.labels[idx]
        return None if self.unknown_labels == "drop" else (-1, raw)


class _Reader:
    """Reads one mapping of the profile, collecting violations with dotted field names."""

    def __init__(self, data: Any, prefix: str, problems: list[errors.FieldViolation]) -> None:
        self.prefix = prefix
        self.problems = problems
        if data is None:
            data = {}
        if not isinstance(data, dict):
            self.bad("", f"must be a mapping, got {type(data).__name__}")
            data = {}
        self.data: dict[str, Any] = data
        self.used: set[str] = set()

    def name(self, key: str) -> str:
        return f"{self.prefix}.{key}" if self.prefix and key else (key or self.prefix or "profile")

    def bad(self, key: str, msg: str) -> None:
        self.problems.append(errors.FieldViolation(self.name(key), msg))

    def get(self, key: str, default: Any = None) -> Any:
        self.used.add(key)
        return self.data.get(key, default)

    def string(self, key: str, default: str = "", *, required: bool = False,
               choices: Sequence[str] = ()) -> str:
        v = self.get(key)
        if v is None:
            if required:
                self.bad(key, "required")
            return default
        if not isinstance(v, str | int | float) or isinstance(v, bool):
            self.bad(key, f"must be a string, got {type(v).__name__}")
            return default
        s = str(v)
        if choices and s not in choices:
            self.bad(key, f"'{s}' is not one of {', '.join(choices)}")
            return default
        return s

    def num(self, key: str, default: float, *, lo: float | None = None,
            hi: float | None = None, integer: bool = False) -> float:
        v = self.get(key)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, int | float) or (integer and not float(v).is_integer()):
            self.bad(key, f"must be {'an integer' if integer else 'a number'}, got {v!r}")
            return default
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            self.bad(key, f"{v} is outside {lo if lo is not None else '-inf'}..{hi if hi is not None else 'inf'}")
            return default
        return float(v)

    def expr(self, key: str, *, required: bool = False) -> tuple[ParsedResult | None, str]:
        text = self.string(key, required=required)
        if not text:
            return None, ""
        try:
            return jmespath.compile(text), text
        except JMESPathError as exc:
            self.bad(key, f"not a valid JMESPath expression '{text}': {exc}")
            return None, text

    def mapping(self, key: str) -> dict[str, str]:
        v = self.get(key)
        if v is None:
            return {}
        if not isinstance(v, dict):
            self.bad(key, "must be a mapping")
            return {}
        return {str(k): str(x) for k, x in v.items()}

    def sub(self, key: str) -> _Reader:
        return _Reader(self.get(key), self.name(key), self.problems)

    def finish(self) -> None:
        for k in sorted(set(self.data) - self.used):
            self.bad(str(k), "unknown setting (a typo?)")


def _secret_ref(r: _Reader, key: str) -> SecretRef | None:
    ref = r.string(key, required=True)
    if not ref:
        return None
    kind, sep, where = ref.partition(":")
    if not sep or kind not in ("env", "file") or not where:
        # Never echo the value: it may be the secret itself pasted inline.
        r.bad(key, "must be a secret reference 'env:VAR_NAME' or 'file:/path'; secrets are "
                   "never written in a profile")
        return None
    if kind == "env" and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", where):
        r.bad(key, f"'{where}' is not an environment variable name")
        return None
    return SecretRef(ref)


def _auth(r: _Reader) -> AuthSpec | None:
    if not r.data:
        r.finish()
        return None
    header = r.string("header", required=True)
    ref = _secret_ref(r, "secret")
    prefix = r.string("prefix")
    r.finish()
    if not header or ref is None:
        return None
    return AuthSpec(header=header, secret=ref, prefix=prefix)


def _read_labels_file(path: Path) -> list[str]:
    """Class names, index = label id: a YAML list (.yaml/.yml) or one name a line."""
    text = path.read_text(encoding="utf-8")
    if path.suffix in (".yaml", ".yml"):
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ValueError(f"not valid YAML: {exc}") from None
        if not isinstance(data, list) or not all(isinstance(x, str | int) for x in data):
            raise ValueError("must be a YAML list of class names")
        return [str(x) for x in data]
    return [ln.strip() for ln in text.splitlines() if ln.strip()]


def load_profile(path: str | Path) -> Profile:
    """Read and validate a profile file; ``InvalidArgument`` names every problem."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise errors.InvalidArgument("target", f"cannot read http-json profile '{p}': "
                                               f"{exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise errors.InvalidArgument("target", f"http-json profile '{p}' is not valid YAML: "
                                               f"{exc}") from None
    return parse_profile(data, source=str(p), base_dir=p.parent)


def parse_profile(data: Any, *, source: str = "<profile>", base_dir: Path | None = None
                  ) -> Profile:
    """A ``Profile`` from the mapping of a YAML profile (see ``adapters/profiles/README.md``)."""
    if not isinstance(data, dict):
        raise errors.InvalidArgument("profile", f"must be a mapping (name, task, request, "
                                                f"response, ...), got {type(data).__name__} "
                                                f"[profile {source}]")
    problems: list[errors.FieldViolation] = []
    top = _Reader(data, "", problems)
    name = top.string("name", required=True)
    task = top.string("task", required=True, choices=tuple(TASKS))
    output = top.string("output", "top_k", choices=tuple(CLASSIFICATION_OUTPUTS))
    top_k = int(top.num("top_k", 0, lo=0, integer=True))
    labels_raw = top.get("labels")
    labels_file = top.string("labels_file")
    labels: list[str] = []
    if labels_raw is not None and labels_file:
        top.bad("labels", "give labels or labels_file, not both")
    elif labels_raw is not None:
        if not isinstance(labels_raw, list) or not all(isinstance(x, str | int) for x in labels_raw):
            top.bad("labels", "must be a list of class names")
        else:
            labels = [str(x) for x in labels_raw]
    elif labels_file:
        lf = Path(labels_file)
        if not lf.is_absolute() and base_dir is not None:
            lf = base_dir / lf
        try:
            labels = _read_labels_file(lf)
        except OSError as exc:
            top.bad("labels_file", f"cannot read '{lf}': {exc.strerror}")
        except ValueError as exc:
            top.bad("labels_file", f"'{lf}': {exc}")
    label_map = top.mapping("label_map")
    label_match = top.string("label_match", "case_insensitive", choices=("exact", "case_insensitive"))
    unknown_labels = top.string("unknown_labels", "keep", choices=("keep", "drop"))
    version = top.string("version")
    description = top.string("description")
    if label_map and labels:
        known = {x.casefold() if label_match == "case_insensitive" else x for x in labels}
        for k, v in label_map.items():
            if (v.casefold() if label_match == "case_insensitive" else v) not in known:
                top.bad(f"label_map.{k}", f"maps to '{v}', which is not in labels")

    # -- request ------------------------------------------------------------------------------
    rq = top.sub("request")
    url = rq.string("url", required=True)
    if url:
        try:
            url = expand_env(url, "request.url")
        except errors.InvalidArgument as exc:
            problems.extend(exc.violations)
            url = ""
        if url and urlsplit(url).scheme not in ("http", "https"):
            rq.bad("url", f"'{url}' is not an http:// or https:// URL")
    method = rq.string("method", "POST").upper()
    headers = rq.mapping("headers")
    for h in headers:
        if _SECRET_HEADER.search(h):
            rq.bad(f"headers.{h}", "looks like a credential: put it under request.auth as a "
                                   "secret reference (env:VAR or file:/path)")
    auth = _auth(rq.sub("auth"))
    image = rq.string("image", "base64", choices=IMAGE_MODES)
    body = rq.get("body")
    per_image = rq.get("per_image")
    mp = rq.sub("multipart")
    mp_file = mp.string("file_field", "image")
    mp_name = mp.string("filename", "image")
    mp_fields = mp.mapping("fields")
    mp.finish()
    iu = rq.sub("image_url")
    serve = iu.string("serve", "local", choices=("local", "upload"))
    image_url = ImageUrlSpec(
        serve=serve, host=iu.string("host", "127.0.0.1"),
        port=int(iu.num("port", 0, lo=0, hi=65535, integer=True)),
        public_base=iu.string("public_base").rstrip("/"),
        upload_url=iu.string("upload_url", required=(serve == "upload")),
        upload_method=iu.string("upload_method", "PUT").upper(),
        upload_auth=_auth(iu.sub("upload_auth")),
        public_url=iu.string("public_url", required=(serve == "upload")))
    iu.finish()
    timeout_s = rq.num("timeout_s", 30.0, lo=0.001)
    max_concurrency = int(rq.num("max_concurrency", 4, lo=1, hi=256, integer=True))
    per_request = int(rq.num("images_per_request", 1, lo=1, hi=1024, integer=True))
    max_bytes = int(rq.num("max_response_bytes", 32 * 1024 * 1024, lo=1024, integer=True))
    rq.finish()
    # templates
    used = placeholders_in(body) | placeholders_in(per_image)
    for ph in sorted(used - set(PLACEHOLDERS)):
        rq.bad("body", f"unknown placeholder ${{{ph}}}; known: "
                       f"{', '.join('${' + k + '}' for k in PLACEHOLDERS)}")
    if image in ("base64", "url"):
        needed = "image_base64" if image == "base64" else "image_url"
        if body is None:
            rq.bad("body", f"required for image: {image} (a JSON template with ${{{needed}}})")
        elif needed not in used:
            rq.bad("body", f"image: {image} needs ${{{needed}}} in body or per_image")
        if per_image is not None and "images" not in placeholders_in(body):
            rq.bad("body", "per_image is given, so body must place it with \"${images}\"")
        if per_image is None and per_request > 1:
            rq.bad("per_image", "images_per_request > 1 needs a per_image template placed in "
                                "body with \"${images}\"")
        if "images" in placeholders_in(per_image):
            rq.bad("per_image", "${images} belongs in body, not in per_image")
    elif body is not None or per_image is not None:
        rq.bad("body", f"image: {image} sends no JSON body; remove body/per_image")
    for key, tmpl in (("body", body), ("per_image", per_image)):
        try:
            json.dumps(tmpl)
        except (TypeError, ValueError) as exc:
            rq.bad(key, f"is not plain JSON ({exc}); quote YAML dates and times")
    if image == "binary" and per_request > 1:
        rq.bad("images_per_request", "image: binary sends one image per request")

    # -- response -----------------------------------------------------------------------------
    rs = top.sub("response")
    results, results_text = rs.expr("results")
    error_expr, _ = rs.expr("error")
    if per_request > 1 and results is None:
        rs.bad("results", "images_per_request > 1 needs a results path (one answer per image)")
    seg_class_map = False
    mask: MaskSpec | None = None
    mk = rs.sub("mask")
    if mk.data:
        mpath, mtext = mk.expr("path", required=True)
        mfmt = mk.string("format", required=True, choices=MASK_FORMATS)
        mkind = mk.string("kind", "binary", choices=MASK_KINDS)
        if mpath is not None and mfmt:
            mask = MaskSpec(path=mpath, path_text=mtext, format=mfmt, kind=mkind)
        seg_class_map = mkind == "class_map"
    mk.finish()
    items, items_text = rs.expr("items", required=not seg_class_map)
    missing_items = rs.string("missing_items", "error", choices=("error", "empty"))
    instances, _ = rs.expr("instances")
    label, label_text = rs.expr("label", required=not seg_class_map)
    label_base = int(rs.num("label_index_base", 0, lo=0, integer=True))
    score, score_text = rs.expr("score")
    raw_scale = rs.get("score_scale", 1)
    if raw_scale not in SCORE_SCALES:
        rs.bad("score_scale", f"{raw_scale!r} is not one of 1, 100, '0-1', '0-100'")
        raw_scale = 1
    missing_numbers = rs.string("missing_numbers", "zero", choices=("zero", "error"))
    min_score = rs.num("min_score", 0.0, lo=0.0, hi=1.0)
    background = int(rs.num("background", 0, integer=True))
    box: BoxSpec | None = None
    bx = rs.sub("box")
    if bx.data:
        bpath, btext = bx.expr("path", required=True)
        bfmt = bx.string("format", required=True, choices=tuple(BOX_FORMATS))
        keys_raw = bx.get("keys")
        keys: tuple[str, ...] = ()
        if keys_raw is not None:
            if not isinstance(keys_raw, list) or not all(isinstance(k, str) for k in keys_raw):
                bx.bad("keys", "must be a list of key names")
            else:
                keys = tuple(keys_raw)
                want = 2 if bfmt.endswith("polygon") else 4
                if len(keys) != want:
                    bx.bad("keys", f"{bfmt} needs {want} keys, got {len(keys)}")
        tol = bx.num("tolerance_px", 1.0, lo=0.0)
        if bpath is not None and bfmt:
            box = BoxSpec(path=bpath, path_text=btext, format=bfmt, keys=keys, tolerance_px=tol)
    bx.finish()
    rs.finish()
    if task == "detection" and box is None:
        problems.append(errors.FieldViolation("response.box", "required for task: detection"))
    if task == "segmentation" and mask is None:
        problems.append(errors.FieldViolation("response.mask", "required for task: segmentation"))
    if task != "segmentation" and mask is not None:
        problems.append(errors.FieldViolation("response.mask", "only used by task: segmentation"))
    if task == "classification" and output != "label_only" and score is None:
        problems.append(errors.FieldViolation("response.score",
                                              f"output: {output} needs a score path (or use "
                                              "output: label_only)"))
    if task == "classification" and output == "full_scores" and not labels:
        problems.append(errors.FieldViolation("labels", "output: full_scores needs the label set"))
    top.finish()
    if problems:
        raise errors.InvalidArgument.from_violations(
            [errors.FieldViolation(v.field, f"{v.description} [profile {source}]") for v in problems])
    if label_match == "case_insensitive":     # looked up by the folded service name
        label_map = {k.casefold(): v for k, v in label_map.items()}
    label_index: dict[str, int] = {}
    for i, lab in enumerate(labels):
        label_index.setdefault(lab.casefold() if label_match == "case_insensitive" else lab, i)
    return Profile(
        name=name, source=source, task=task, labels=tuple(labels), label_map=label_map,
        label_index=label_index,
        label_match=label_match, unknown_labels=unknown_labels, output=output, top_k=top_k,
        version=version, description=description, url=url, method=method, headers=headers,
        auth=auth, image=image, body=body, per_image=per_image, multipart_file_field=mp_file,
        multipart_filename=mp_name, multipart_fields=mp_fields, image_url=image_url,
        timeout_s=timeout_s, max_concurrency=max_concurrency, images_per_request=per_request,
        max_response_bytes=max_bytes, results=results, results_text=results_text,
        error=error_expr, items=items, items_text=items_text, missing_items=missing_items,
        instances=instances, label=label, label_text=label_text, label_index_base=label_base,
        score=score, score_text=score_text, score_scale=SCORE_SCALES[raw_scale],
        missing_numbers=missing_numbers, min_score=min_score, box=box, mask=mask,
        background=background)


# ---------------------------------------------------------------------------------------------
# Answers -> predictions (pure)
# ---------------------------------------------------------------------------------------------

def _box_of(spec: BoxSpec, item: Any, width: int, height: int, missing_zero: bool
            ) -> tuple[float, float, float, float]:
    raw = spec.path.search(item)
    if raw is None:
        raise ValueError(f"no box at '{spec.path_text}'")
    if spec.format.endswith("polygon"):
        if not isinstance(raw, list) or not raw:
            raise ValueError(f"box '{spec.path_text}' is {raw!r}, expected a list of vertices")
        points: list[tuple[float, float]] = []
        if spec.keys:
            kx, ky = spec.keys
            for i, v in enumerate(raw):
                if not isinstance(v, dict):
                    raise ValueError(f"vertex {i} is {v!r}, expected an object with {kx}/{ky}")
                points.append((number(v.get(kx), what=f"vertex {i} '{kx}'", missing_zero=missing_zero),
                               number(v.get(ky), what=f"vertex {i} '{ky}'", missing_zero=missing_zero)))
        elif all(isinstance(v, list) and len(v) == 2 for v in raw):
            points = [(number(v[0], what="vertex x"), number(v[1], what="vertex y")) for v in raw]
        elif len(raw) % 2 == 0 and all(isinstance(v, int | float) for v in raw):
            points = [(float(raw[i]), float(raw[i + 1])) for i in range(0, len(raw), 2)]
        else:
            raise ValueError(f"box '{spec.path_text}' is not a list of vertices")
        return polygon_to_box(points, normalized=spec.format.startswith("normalized"),
                              width=width, height=height)
    if spec.keys:
        if not isinstance(raw, dict):
            raise ValueError(f"box '{spec.path_text}' is {raw!r}, expected an object with "
                             f"{', '.join(spec.keys)}")
        values = [number(raw.get(k), what=f"box '{k}'", missing_zero=missing_zero)
                  for k in spec.keys]
    elif isinstance(raw, list) and len(raw) == 4:
        values = [number(v, what="box coordinate", missing_zero=False) for v in raw]
    else:
        raise ValueError(f"box '{spec.path_text}' is {raw!r}, expected 4 numbers (or set box.keys)")
    return box_to_pixels(spec.format, values, width, height)


def _mask_of(spec: MaskSpec, doc: Any) -> np.ndarray:
    raw = spec.path.search(doc)
    if raw is None:
        raise ValueError(f"no mask at '{spec.path_text}'")
    if spec.format == "coco_rle":
        if not isinstance(raw, dict):
            raise ValueError(f"mask '{spec.path_text}' is not a COCO RLE object (size, counts)")
        return decode_coco_rle(raw)
    if not isinstance(raw, str):
        raise ValueError(f"mask '{spec.path_text}' is not a base64 PNG string")
    return decode_png_mask(raw)


def _items_of(p: Profile, doc: Any) -> list[Any]:
    assert p.items is not None
    raw = p.items.search(doc)
    if raw is None:
        if p.missing_items == "empty":
            return []
        keys = f"; the answer has keys {sorted(doc)[:12]}" if isinstance(doc, dict) else ""
        raise ValueError(f"items path '{p.items_text}' not found in the answer{keys}")
    if not isinstance(raw, list):
        raise ValueError(f"items path '{p.items_text}' gave {type(raw).__name__}, expected a list")
    if p.instances is None:
        return raw
    out: list[Any] = []
    for item in raw:
        inst = p.instances.search(item) or []
        if not isinstance(inst, list):
            raise ValueError("instances path did not give a list")
        for x in inst:
            ctx = dict(x) if isinstance(x, dict) else {"value": x}
            ctx["parent"] = item
            out.append(ctx)
    return out


def _score_of(p: Profile, item: Any, i: int) -> float | None:
    if p.score is None:
        return None
    raw = p.score.search(item)
    v = number(raw, what=f"item {i} score '{p.score_text}'",
               missing_zero=p.missing_numbers == "zero")
    try:
        return scale_score(v, p.score_scale)
    except ValueError as exc:
        raise ValueError(f"item {i}: {exc}; is score_scale right?") from None


def _label_of(p: Profile, item: Any, i: int) -> tuple[int, str] | None:
    assert p.label is not None
    raw = p.label.search(item)
    if raw is None:
        raise ValueError(f"item {i} has no label at '{p.label_text}'")
    try:
        return p.label_of(raw)
    except ValueError as exc:
        raise ValueError(f"item {i}: {exc}") from None


def prediction_from_answer(p: Profile, doc: Any, width: int, height: int
                           ) -> common_pb2.Prediction:
    """The Prediction for one image from its part of the service's JSON answer.

    ``ValueError`` names what does not fit the profile."""
    if p.error is not None:
        err = p.error.search(doc)
        if err not in (None, "", {}, [], 0):
            text = err if isinstance(err, str) else json.dumps(err)[:300]
            raise ValueError(f"the service reported an error: {text}")
    missing_zero = p.missing_numbers == "zero"
    if p.task == "segmentation" and p.mask is not None and p.mask.kind == "class_map":
        m = _mask_of(p.mask, doc)
        if m.shape != (height, width):
            raise ValueError(f"class map is {m.shape[1]}x{m.shape[0]}, the image is {width}x{height}")
        return common_pb2.Prediction(segmentation=common_pb2.Segmentation(
            class_map=array_to_tensor(m.astype(np.int32))))
    items = _items_of(p, doc)
    if p.task == "classification":
        best: dict[tuple[int, str], float | None] = {}
        for i, item in enumerate(items):
            lab = _label_of(p, item, i)
            s = _score_of(p, item, i)
            if lab is None or (s is not None and s < p.min_score):
                continue
            prev = best.get(lab)
            if lab not in best or (s is not None and (prev is None or s > prev)):
                best[lab] = s
        if p.output == "full_scores":
            for idx, name in enumerate(p.labels):
                best.setdefault((idx, name), 0.0)
        ranked = list(best.items())
        if p.score is not None:
            ranked.sort(key=lambda kv: -(kv[1] or 0.0))
        if p.output == "label_only":
            ranked = [(k, None) for k, _ in ranked[:1]]
        elif p.output == "top_k" and p.top_k:
            ranked = ranked[:p.top_k]
        classes = []
        for (idx, name), s in ranked:
            c = common_pb2.ClassScore(label=idx, name=name)
            if s is not None:
                c.score = s
            classes.append(c)
        return common_pb2.Prediction(classification=common_pb2.Classification(classes=classes))
    if p.task == "detection":
        assert p.box is not None
        boxes = []
        for i, item in enumerate(items):
            lab = _label_of(p, item, i)
            s = _score_of(p, item, i)
            if lab is None or (s is not None and s < p.min_score):
                continue
            try:
                raw_box = _box_of(p.box, item, width, height, missing_zero)
                x0, y0, x1, y1 = check_box(raw_box, width, height, tolerance_px=p.box.tolerance_px)
            except ValueError as exc:
                raise ValueError(f"item {i} ({lab[1]}): {exc} (box format {p.box.format})") from None
            boxes.append(common_pb2.BoundingBox(x_min=x0, y_min=y0, x_max=x1, y_max=y1,
                                                label=lab[0], name=lab[1],
                                                score=1.0 if s is None else s))
        return common_pb2.Prediction(detection=common_pb2.Detection(boxes=boxes))
    assert p.mask is not None
    masks: list[tuple[int, np.ndarray, float]] = []
    for i, item in enumerate(items):
        lab = _label_of(p, item, i)
        s = _score_of(p, item, i)
        if lab is None or (s is not None and s < p.min_score):
            continue
        try:
            m = _mask_of(p.mask, item)
        except ValueError as exc:
            raise ValueError(f"item {i} ({lab[1]}): {exc}") from None
        if m.shape != (height, width):
            raise ValueError(f"item {i} ({lab[1]}): mask is {m.shape[1]}x{m.shape[0]}, the image "
                             f"is {width}x{height}")
        masks.append((lab[0], m > 0, 1.0 if s is None else s))
    cmap = compose_class_map(masks, height, width, p.background)
    return common_pb2.Prediction(segmentation=common_pb2.Segmentation(class_map=array_to_tensor(cmap)))


# ---------------------------------------------------------------------------------------------
# Transport
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class HttpResponse:
    status: int
    headers: Mapping[str, str]
    body: bytes


class HttpClient:
    """Keep-alive HTTP/1.1 client: one connection per (thread, host). Honours HTTPS_PROXY /
    HTTP_PROXY / NO_PROXY. Transport failures -> ``errors.Unavailable``."""

    def __init__(self, *, timeout_s: float, max_response_bytes: int, label: str) -> None:
        self.timeout_s = timeout_s
        self.max_response_bytes = max_response_bytes
        self.label = label
        self._local = threading.local()
        self._all: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            conns, self._all = self._all, []
        for c in conns:
            try:
                c.close()
            except OSError:
                pass

    def _connection(self, scheme: str, host: str, port: int, fresh: bool
                    ) -> tuple[http.client.HTTPConnection, bool, bool]:
        """(connection, reused?, through a plain HTTP proxy, i.e. absolute request URLs?)."""
        pool: dict[tuple[str, str, int], tuple[http.client.HTTPConnection, bool]] | None = getattr(
            self._local, "pool", None)
        if pool is None:
            pool = {}
            self._local.pool = pool
        key = (scheme, host, port)
        if key in pool:
            if not fresh:
                conn, plain = pool[key]
                return conn, True, plain
            pool.pop(key)[0].close()
        proxy = urllib.request.getproxies().get(scheme)
        if proxy and urllib.request.proxy_bypass(host):
            proxy = None
        plain_proxy = False
        conn_new: http.client.HTTPConnection
        if proxy:
            pu = urlsplit(proxy if "://" in proxy else "http://" + proxy)
            phost, pport = pu.hostname or "", pu.port or 8080
            if scheme == "https":
                conn_new = http.client.HTTPSConnection(phost, pport, timeout=self.timeout_s)
                conn_new.set_tunnel(host, port)
            else:
                conn_new = http.client.HTTPConnection(phost, pport, timeout=self.timeout_s)
                plain_proxy = True
        elif scheme == "https":
            conn_new = http.client.HTTPSConnection(host, port, timeout=self.timeout_s)
        else:
            conn_new = http.client.HTTPConnection(host, port, timeout=self.timeout_s)
        pool[key] = (conn_new, plain_proxy)
        with self._lock:
            self._all.append(conn_new)
        return conn_new, False, plain_proxy

    def request(self, method: str, url: str, headers: Mapping[str, str], body: bytes | None
                ) -> HttpResponse:
        parts = urlsplit(url)
        scheme = parts.scheme
        host = parts.hostname or ""
        port = parts.port or (443 if scheme == "https" else 80)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        fresh = False
        for _ in range(2):
            conn, reused, plain_proxy = self._connection(scheme, host, port, fresh)
            try:
                conn.request(method, url if plain_proxy else target, body=body, headers=dict(headers))
                resp = conn.getresponse()
                data = resp.read(self.max_response_bytes + 1)
                if len(data) > self.max_response_bytes:
                    conn.close()
                    raise TargetResponseError(f"{self.label}: answer larger than "
                                              f"{self.max_response_bytes} bytes")
                hdrs = {k.lower(): v for k, v in resp.getheaders()}
                if resp.will_close:
                    conn.close()
                return HttpResponse(resp.status, hdrs, data)
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as exc:
                conn.close()
                if reused:          # a stale keep-alive connection: once more on a new one
                    fresh = True
                    continue
                raise errors.Unavailable(f"{self.label}: connection lost ({type(exc).__name__})") from None
            except TimeoutError:
                conn.close()
                raise errors.Unavailable(f"{self.label}: no answer within {self.timeout_s:g} s") from None
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                raise errors.Unavailable(f"{self.label}: {type(exc).__name__}: "
                                         f"{getattr(exc, 'strerror', None) or exc}") from None
        raise errors.Unavailable(f"{self.label}: connection lost twice")


class _ImageServer:
    """A tiny HTTP file server on loopback (image: url, serve: local): each image is served
    under an unguessable name for the duration of its request, then forgotten."""

    def __init__(self, host: str, port: int, public_base: str) -> None:
        images: dict[str, tuple[bytes, str]] = {}
        self._images = images

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                entry = images.get(self.path.rsplit("/", 1)[-1])
                if entry is None:
                    self.send_error(404)
                    return
                data, mime = entry
                self.send_response(200)
                self.send_header("Content-Type", mime)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        bound_host, bound_port = self._server.server_address[:2]
        if isinstance(bound_host, bytes):
            bound_host = bound_host.decode()
        self.base = public_base or f"http://{bound_host}:{bound_port}"
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="http-json-image-server", daemon=True)
        self._thread.start()

    def put(self, data: bytes, mime: str) -> tuple[str, str]:
        name = secrets.token_urlsafe(18) + (".png" if mime == "image/png" else ".jpg")
        self._images[name] = (data, mime)
        return name, f"{self.base}/images/{name}"

    def remove(self, name: str) -> None:
        self._images.pop(name, None)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@dataclass(frozen=True)
class _Img:
    index: int
    image_id: str
    data: bytes
    mime: str
    width: int
    height: int


def _mime_of(data: bytes) -> str:
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return "image/png"
    if data[:3] == b"\xff\xd8\xff":
        return "image/jpeg"
    return "application/octet-stream"


def _multipart(fields: Mapping[str, str], file_field: str, files: Sequence[tuple[str, bytes, str]]
               ) -> tuple[bytes, str]:
    boundary = "fortis-" + uuid.uuid4().hex
    out = bytearray()
    for k, v in fields.items():
        out += (f"--{boundary}\r\nContent-Disposition: form-data; name=\"{quote(k)}\"\r\n\r\n"
                f"{v}\r\n").encode()
    for filename, data, mime in files:
        out += (f"--{boundary}\r\nContent-Disposition: form-data; name=\"{quote(file_field)}\"; "
                f"filename=\"{quote(filename)}\"\r\nContent-Type: {mime}\r\n\r\n").encode()
        out += data + b"\r\n"
    out += f"--{boundary}--\r\n".encode()
    return bytes(out), f"multipart/form-data; boundary={boundary}"


class HttpJsonBackend:
    """A ``TargetBackend`` for one HTTP/JSON vision API described by a ``Profile``."""

    def __init__(self, profile: Profile, *,
                 client_factory: Callable[..., HttpClient] = HttpClient) -> None:
        self.profile = profile
        p = profile
        self._label = f"http-json target '{p.name}'"
        if p.auth is not None:
            p.auth.secret.resolve()         # fail at start-up, not on the first query
        if p.image_url.upload_auth is not None:
            p.image_url.upload_auth.secret.resolve()
        self._client = client_factory(timeout_s=p.timeout_s,
                                      max_response_bytes=p.max_response_bytes, label=self._label)
        self._pool = ThreadPoolExecutor(max_workers=p.max_concurrency,
                                        thread_name_prefix=f"http-json-{p.name}")
        # At most max_concurrency requests in flight, over all proxy calls together.
        self._in_flight = threading.BoundedSemaphore(p.max_concurrency)
        self._image_server: _ImageServer | None = None
        self._server_lock = threading.Lock()
        self._closed = False
        parts = urlsplit(p.url)
        log.info("http-json target ready", profile=p.name, source=p.source, task=p.task,
                 endpoint=f"{parts.scheme}://{parts.netloc}{parts.path}", image=p.image,
                 auth_header=p.auth.header if p.auth else "", auth_secret=p.auth.secret.ref if p.auth else "",
                 max_concurrency=p.max_concurrency, images_per_request=p.images_per_request)

    # -- TargetBackend ----------------------------------------------------------------------
    def info(self) -> target_pb2.TargetInfo:
        p = self.profile
        if p.task == "classification":
            kind = CLASSIFICATION_OUTPUTS[p.output]
        elif p.task == "detection":
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
        prepared = [self._prepare(i, img) for i, img in enumerate(images)]
        n = self.profile.images_per_request
        groups = [prepared[k:k + n] for k in range(0, len(prepared), n)]
        if len(groups) == 1:
            return self._call(groups[0])
        futures = [self._pool.submit(self._call, g) for g in groups]
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
            # A failure that retrying cannot fix wins over one the proxy should retry.
            hard = [e for e in failures if not isinstance(e, errors.Unavailable)]
            if hard:
                raise hard[0]
            wait = max((getattr(e, "retry_after_s", None) or 0.0) for e in failures)
            first = failures[0]
            if wait:
                first.retry_after_s = wait  # type: ignore[attr-defined]
            raise first
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
    def _prepare(self, i: int, img: common_pb2.Image) -> _Img:
        arr = decode_image(img, f"images[{i}]")     # validates; InvalidArgument names the field
        h, w = int(arr.shape[0]), int(arr.shape[1])
        data = img.encoded if img.WhichOneof("content") == "encoded" else encode_png(arr)
        return _Img(index=i, image_id=img.image_id, data=data, mime=_mime_of(data), width=w, height=h)

    def _redact(self, text: str) -> str:
        for a in (self.profile.auth, self.profile.image_url.upload_auth):
            if a is None:
                continue
            try:
                secret = a.secret.resolve()
            except errors.FortisError:
                continue
            if len(secret) >= 4:
                text = text.replace(secret, "[secret]")
        return text

    def _auth_headers(self, auth: AuthSpec | None) -> dict[str, str]:
        if auth is None:
            return {}
        return {auth.header: auth.prefix + auth.secret.resolve()}

    def _image_values(self, img: _Img, url: str) -> dict[str, Any]:
        return {"image_base64": base64.b64encode(img.data).decode("ascii") if self.profile.image == "base64" else "",
                "image_url": url, "image_mime": img.mime, "image_width": img.width,
                "image_height": img.height}

    def _image_urls(self, group: Sequence[_Img]) -> tuple[list[str], list[str]]:
        """URLs for image: url, and the local names to forget afterwards."""
        spec = self.profile.image_url
        urls: list[str] = []
        names: list[str] = []
        if spec.serve == "local":
            with self._server_lock:
                if self._image_server is None:
                    try:
                        self._image_server = _ImageServer(spec.host, spec.port, spec.public_base)
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
            name = secrets.token_urlsafe(18) + (".png" if img.mime == "image/png" else ".jpg")
            up = spec.upload_url.replace("${name}", name)
            headers = {"Content-Type": img.mime, **self._auth_headers(spec.upload_auth)}
            with self._in_flight:
                resp = self._client.request(spec.upload_method, up, headers, img.data)
            if resp.status >= 300:
                self._raise_for_status(resp, group, what="image upload")
            urls.append(spec.public_url.replace("${name}", name))
        return urls, names

    def _build(self, group: Sequence[_Img], urls: Sequence[str]) -> tuple[bytes | None, dict[str, str]]:
        p = self.profile
        headers: dict[str, str] = {"Accept": "application/json", "User-Agent": "fortis-http-json/1"}
        headers.update(p.headers)
        if p.image == "binary":
            headers.setdefault("Content-Type", group[0].mime)
            return group[0].data, headers
        if p.image == "multipart":
            files = [(f"{p.multipart_filename}-{k}{'.png' if g.mime == 'image/png' else '.jpg'}",
                      g.data, g.mime) for k, g in enumerate(group)]
            body, ctype = _multipart(p.multipart_fields, p.multipart_file_field, files)
            headers["Content-Type"] = ctype
            return body, headers
        per = [self._image_values(g, urls[k] if urls else "") for k, g in enumerate(group)]
        values: dict[str, Any] = dict(per[0]) if len(group) == 1 else {}
        if p.per_image is not None:
            values["images"] = [render_template(p.per_image, v) for v in per]
        try:
            doc = render_template(p.body, values)
        except KeyError as exc:
            raise errors.FailedPrecondition(f"{self._label}: placeholder {exc} cannot be used in "
                                            "body when a request carries several images") from None
        headers.setdefault("Content-Type", "application/json")
        return json.dumps(doc, separators=(",", ":")).encode("utf-8"), headers

    def _raise_for_status(self, resp: HttpResponse, group: Sequence[_Img], *, what: str) -> None:
        ids = ", ".join(f"'{g.image_id}'" for g in group)
        snippet = self._redact(resp.body[:300].decode("utf-8", "replace")).strip()
        msg = f"{self._label}: {what} for image {ids} got HTTP {resp.status}" + (
            f": {snippet}" if snippet else "")
        if resp.status in _RETRYABLE_STATUS or resp.status >= 500:
            exc = errors.Unavailable(msg)
            exc.retry_after_s = parse_retry_after(resp.headers.get("retry-after"))  # type: ignore[attr-defined]
            log.warning("http-json target unavailable", profile=self.profile.name,
                        status=resp.status, retry_after_s=exc.retry_after_s, images=len(group))  # type: ignore[attr-defined]
            raise exc
        log.warning("http-json target refused a request", profile=self.profile.name,
                    status=resp.status, images=len(group))
        if resp.status in _BAD_INPUT_STATUS:
            field_name = f"images[{group[0].index}]" if len(group) == 1 else "images"
            raise errors.InvalidArgument(field_name, msg)
        raise HttpTargetError(msg)

    def _call(self, group: Sequence[_Img]) -> list[common_pb2.Prediction]:
        p = self.profile
        names: list[str] = []
        urls: list[str] = []
        try:
            if p.image == "url":
                urls, names = self._image_urls(group)
            body, headers = self._build(group, urls)
            headers.update(self._auth_headers(p.auth))
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

    def _fail(self, group: Sequence[_Img], problem: str) -> TargetResponseError:
        ids = ", ".join(f"'{g.image_id}'" for g in group)
        msg = self._redact(f"{self._label}: answer for image {ids} does not fit profile "
                           f"'{self.profile.name}': {problem}")
        log.warning("http-json answer rejected", profile=self.profile.name, problem=self._redact(problem))
        return TargetResponseError(msg)

    def _parse(self, resp: HttpResponse, group: Sequence[_Img]) -> list[common_pb2.Prediction]:
        p = self.profile
        try:
            doc = json.loads(resp.body)
        except (ValueError, UnicodeDecodeError) as exc:
            start = resp.body[:60].decode("utf-8", "replace")
            raise self._fail(group, f"not valid JSON ({exc}); it starts {start!r}") from None
        if p.results is not None:
            parts = p.results.search(doc)
            if not isinstance(parts, list):
                keys = f"; the answer has keys {sorted(doc)[:12]}" if isinstance(doc, dict) else ""
                raise self._fail(group, f"results path '{p.results_text}' "
                                        f"{'not found' if parts is None else 'is not a list'}{keys}")
            if len(parts) != len(group):
                raise self._fail(group, f"results path '{p.results_text}' gave {len(parts)} answers "
                                        f"for {len(group)} images")
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


def profile_path(spec: str) -> Path:
    """The profile file a ``http-json:`` URL names: a path, or the name of a shipped profile."""
    candidate = Path(spec).expanduser()
    if candidate.suffix in (".yaml", ".yml") or "/" in spec or candidate.exists():
        return candidate
    return PROFILES_DIR / f"{spec}.yaml"


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
