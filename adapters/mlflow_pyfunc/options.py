"""What an ``mlflow+http(s)://HOST:PORT[/PATH]?options`` URL says (the options are listed in
the package docstring), parsed and checked before anything is contacted: a typo is an
``InvalidArgument`` on ``target`` naming the option."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from fortis.adapters.kserve_v2.options import (
    DETECTION_OPTIONS,
    DetectionFormat,
    bad_option,
    detection_format,
    number,
    positive_int,
)
from fortis.services.common import errors

SCHEMES = {"mlflow+http": "http", "mlflow+https": "https"}
REQUESTS = ("inputs", "instances", "dataframe_split")
DEFAULT_PATH = "/invocations"
DEFAULT_BATCH = 32
DEFAULT_TIMEOUT_S = 30.0
MAX_CLASSES = 1_000_000
_KIND = "mlflow"
_KNOWN = {
    "request",
    "input",
    "column",
    "resize",
    "layout",
    "dtype",
    "channels",
    "scale",
    "mean",
    "std",
    "task",
    "output",
    "labels",
    "num_classes",
    "batch",
    "timeout",
    "token_env",
    "rate",
    *DETECTION_OPTIONS,
}


@dataclass(frozen=True, kw_only=True)
class MlflowOptions:
    scheme: str  # "http" | "https"
    host: str
    port: int
    path: str = DEFAULT_PATH
    request: str = "inputs"  # REQUESTS
    input_kind: str = "tensor"  # "tensor" (pixel arrays) | "bytes" (base64 PNG/JPEG)
    column: str = "image"  # dataframe_split's column
    resize: tuple[int, int] | None = None
    layout: str = "nhwc"
    dtype: str = "UINT8"  # UINT8 (whole pixel values) | FP32 (scaled, normalised)
    channels: int = 3
    scale: float | None = None
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()
    task: str = "classification"  # "classification" | "detection"
    output: str = "probabilities"  # "probabilities" | "logits" | "labels"
    labels_path: str = ""
    num_classes: int = 0
    detection: DetectionFormat = DetectionFormat()
    batch: int = DEFAULT_BATCH
    timeout_s: float = DEFAULT_TIMEOUT_S
    token_env: str = ""

    @property
    def endpoint(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"


def _bad(option: str, message: str) -> errors.InvalidArgument:
    return bad_option(option, message, _KIND)


def _choice(q: dict[str, str], key: str, allowed: tuple[str, ...], upper: bool = False) -> str:
    value = q[key].upper() if upper else q[key].lower()
    if value not in allowed:
        raise _bad(key, f"'{q[key]}' is not one of {', '.join(allowed)}")
    return value


def parse_url(url: str) -> MlflowOptions:
    """Parse ``mlflow+http(s)://HOST:PORT[/PATH]?options``; ``InvalidArgument`` on ``target``
    naming the bad part."""
    parts = urlsplit(url)
    scheme = SCHEMES.get(parts.scheme)
    if scheme is None:
        raise errors.InvalidArgument(
            "target", f"'{url}' is not an mlflow+http:// or mlflow+https:// URL"
        )
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        raise errors.InvalidArgument("target", f"bad port in '{url}'") from None
    if not host:
        raise errors.InvalidArgument("target", f"no host in '{url}'")
    path = parts.path.rstrip("/") or DEFAULT_PATH
    if ".." in path.split("/"):
        raise errors.InvalidArgument("target", f"the path of '{url}' must not contain '..'")
    q: dict[str, str] = {}
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key not in _KNOWN:
            raise _bad(key, f"unknown option; known: {', '.join(sorted(_KNOWN))}")
        q[key] = value
    kw: dict[str, Any] = {
        "scheme": scheme,
        "host": host,
        "path": path,
        "port": port or (443 if scheme == "https" else 80),
    }
    if "request" in q:
        kw["request"] = _choice(q, "request", REQUESTS)
    kw["input_kind"] = "bytes" if kw.get("request") == "dataframe_split" else "tensor"
    if "input" in q:
        kw["input_kind"] = _choice(q, "input", ("tensor", "bytes"))
    if kw["input_kind"] == "tensor" and kw.get("request") == "dataframe_split":
        raise _bad(
            "input",
            "request=dataframe_split sends each image as a base64 file in a "
            "column (input=bytes); send pixel arrays with request=inputs or "
            "instances",
        )
    if "column" in q:
        if not q["column"]:
            raise _bad("column", "must not be empty")
        kw["column"] = q["column"]
    if "resize" in q:
        h, sep, w = q["resize"].lower().partition("x")
        kw["resize"] = (
            positive_int("resize", h, _KIND),
            positive_int("resize", w if sep else h, _KIND),
        )
        if kw["resize"][0] * kw["resize"][1] > 16384 * 16384:
            raise _bad("resize", f"{q['resize']} is too large")
    if "layout" in q:
        kw["layout"] = _choice(q, "layout", ("nhwc", "nchw"))
    if "dtype" in q:
        kw["dtype"] = _choice(q, "dtype", ("UINT8", "FP32"), upper=True)
    if "channels" in q:
        ch = positive_int("channels", q["channels"], _KIND)
        if ch not in (1, 3):
            raise _bad("channels", f"must be 1 or 3, got {ch}")
        kw["channels"] = ch
    if "scale" in q:
        kw["scale"] = number("scale", q["scale"], _KIND)
    for key in ("mean", "std"):
        if key in q:
            values = tuple(number(key, v, _KIND) for v in q[key].split(","))
            if len(values) not in (1, kw.get("channels", 3)):
                raise _bad(key, f"give 1 or {kw.get('channels', 3)} values, got {len(values)}")
            kw[key] = values
    if any(s == 0 for s in kw.get("std", ())):
        raise _bad("std", "must not be 0")
    if kw["input_kind"] == "bytes":
        for key in ("layout", "dtype", "channels", "scale", "mean", "std"):
            if key in q:
                raise _bad(key, "applies to input=tensor only (input=bytes sends the image file)")
    elif kw.get("dtype", "UINT8") == "UINT8" and any(k in q for k in ("scale", "mean", "std")):
        raise _bad(
            "dtype", "UINT8 sends the pixels as they are; scale, mean and std need dtype=FP32"
        )
    if "task" in q:
        kw["task"] = _choice(q, "task", ("classification", "detection"))
    task = kw.get("task", "classification")
    if "output" in q:
        if task != "classification":
            raise _bad("output", "applies to task=classification only")
        kw["output"] = _choice(q, "output", ("probabilities", "logits", "labels"))
    for key in DETECTION_OPTIONS:
        if key in q and task != "detection":
            raise _bad(key, f"applies to task=detection only (this target is task={task})")
    kw["detection"] = detection_format(q, _KIND)
    kw["labels_path"] = q.get("labels", "")
    if "num_classes" in q:
        kw["num_classes"] = positive_int("num_classes", q["num_classes"], _KIND)
        if kw["num_classes"] > MAX_CLASSES:
            raise _bad("num_classes", f"at most {MAX_CLASSES}")
    if "batch" in q:
        kw["batch"] = positive_int("batch", q["batch"], _KIND)
    if "timeout" in q:
        kw["timeout_s"] = number("timeout", q["timeout"], _KIND)
        if kw["timeout_s"] <= 0:
            raise _bad("timeout", "must be > 0")
    kw["token_env"] = q.get("token_env", "")
    return MlflowOptions(**kw)
