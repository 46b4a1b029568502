"""What a ``kserve+grpc|http|https://HOST:PORT/MODEL?options`` URL says (the options are listed
in the package docstring), parsed and checked before anything is contacted, so a typo is an
``InvalidArgument`` on ``target`` naming the option rather than a failure at the first query.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from fortis.services.common import errors

SCHEMES = {"kserve+grpc": "grpc", "kserve+http": "http", "kserve+https": "https"}
DEFAULT_BATCH = 32
DEFAULT_TIMEOUT_S = 30.0
INPUT_DTYPES = ("FP32", "FP16", "UINT8")
_KNOWN_OPTIONS = {"version", "input", "input_name", "output_name", "layout", "dtype", "channels",
                  "resize", "scale", "mean", "std", "output", "labels", "raw", "batch", "timeout",
                  "token_env", "host", "tls", "rate",
                  # detection and segmentation answers (fortis.adapters.kserve_v2.tasks)
                  "task", "boxes_output", "scores_output", "classes_output", "count_output",
                  "box_format", "box_coords", "label_offset", "min_score", "mask_layout",
                  "mask_threshold"}
TASKS = ("classification", "detection", "segmentation")
BOX_ORDERS = ("xyxy", "xywh", "cxcywh", "yxyx")


@dataclass(frozen=True, kw_only=True)
class DetectionFormat:
    """How a detector's outputs are laid out (``tasks.decode_detections``): the output names
    (``""``: the usual names, see ``tasks.DETECTION_OUTPUTS``), the box format, and what to
    drop. Shared by every adapter that reads detection tensors (OIP, MLflow)."""

    boxes_output: str = ""
    scores_output: str = ""
    classes_output: str = ""
    count_output: str = ""
    box_format: str = "xyxy"            # BOX_ORDERS
    box_normalised: bool = False        # box_coords=normalised: fractions of the image size
    label_offset: int = 0               # subtracted from answered class ids (TF OD API: 1)
    min_score: float = 0.0              # detections scored below are dropped


DETECTION_OPTIONS = ("boxes_output", "scores_output", "classes_output", "count_output",
                     "box_format", "box_coords", "label_offset", "min_score")


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
    task: str = "classification"        # "classification" | "detection" | "segmentation"
    detection: DetectionFormat = DetectionFormat()
    mask_layout: str = "chw"            # score maps [N, C, H, W] ("chw") or [N, H, W, C]
    mask_threshold: float = 0.5         # one-channel float masks: foreground above this

    @property
    def endpoint(self) -> str:
        return f"{self.transport}://{self.host}:{self.port}"


def bad_option(option: str, message: str, kind: str = "kserve") -> errors.InvalidArgument:
    """``InvalidArgument`` on ``target`` naming the option (``kind``: the scheme family whose
    URL it is, as the user wrote it)."""
    return errors.InvalidArgument("target", f"{kind} option '{option}': {message}")


def number(option: str, text: str, kind: str = "kserve") -> float:
    """A float, or a fraction such as ``1/255``."""
    try:
        num, sep, den = text.partition("/")
        value = float(num) / float(den) if sep else float(text)
    except (ValueError, ZeroDivisionError):
        raise bad_option(option, f"'{text}' is not a number", kind) from None
    if not math.isfinite(value):
        raise bad_option(option, f"'{text}' is not finite", kind)
    return value


def positive_int(option: str, text: str, kind: str = "kserve") -> int:
    try:
        value = int(text)
    except ValueError:
        raise bad_option(option, f"'{text}' is not an integer", kind) from None
    if value < 1:
        raise bad_option(option, f"must be >= 1, got {value}", kind)
    return value


def _flag(option: str, text: str) -> bool:
    low = text.lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off", ""):
        return False
    raise bad_option(option, f"'{text}' is not 1/0")



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
            raise errors.InvalidArgument("target",
                                         f"no port in '{url}' (kserve+grpc://HOST:PORT/MODEL)")
        port = 443 if transport == "https" else 80
    model = parts.path.strip("/")
    if not model or "/" in model:
        raise errors.InvalidArgument("target", f"'{url}' must name one model: "
                                               f"{parts.scheme}://HOST:PORT/MODEL")
    q: dict[str, str] = {}
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key not in _KNOWN_OPTIONS:
            raise bad_option(key, f"unknown option; known: {', '.join(sorted(_KNOWN_OPTIONS))}")
        q[key] = value
    kw: dict[str, Any] = {"transport": transport, "host": host, "port": port, "model": model,
                          "version": q.get("version", "")}
    if "input" in q:
        if q["input"] not in ("tensor", "bytes"):
            raise bad_option("input", f"'{q['input']}' is not tensor or bytes")
        kw["input_kind"] = q["input"]
    kw["input_name"] = q.get("input_name", "")
    kw["output_name"] = q.get("output_name", "")
    if "layout" in q:
        layout = q["layout"].lower()
        if layout not in ("nchw", "nhwc"):
            raise bad_option("layout", f"'{q['layout']}' is not nchw or nhwc")
        kw["layout"] = layout
    if "dtype" in q:
        dtype = q["dtype"].upper()
        if dtype not in INPUT_DTYPES:
            raise bad_option("dtype", f"'{q['dtype']}' is not one of {', '.join(INPUT_DTYPES)}")
        kw["dtype"] = dtype
    if "channels" in q:
        ch = positive_int("channels", q["channels"])
        if ch not in (1, 3):
            raise bad_option("channels", f"must be 1 or 3, got {ch}")
        kw["channels"] = ch
    if "resize" in q:
        h, sep, w = q["resize"].lower().partition("x")
        kw["resize"] = (positive_int("resize", h), positive_int("resize", w if sep else h))
    if "scale" in q:
        kw["scale"] = number("scale", q["scale"])
    for key in ("mean", "std"):
        if key in q:
            values = tuple(number(key, v) for v in q[key].split(","))
            if len(values) not in (1, 3):
                raise bad_option(key, f"give 1 or 3 values, got {len(values)}")
            kw[key] = values
    if any(s == 0 for s in kw.get("std", ())):
        raise bad_option("std", "must not be 0")
    if "output" in q:
        if q["output"] not in ("probabilities", "logits"):
            raise bad_option("output", f"'{q['output']}' is not probabilities or logits "
                                       "(the output tensor's name is output_name)")
        kw["output"] = q["output"]
    kw["labels_path"] = q.get("labels", "")
    kw["raw"] = _flag("raw", q.get("raw", "0"))
    kw["tls"] = _flag("tls", q.get("tls", "0"))
    if "batch" in q:
        kw["batch"] = positive_int("batch", q["batch"])
    if "timeout" in q:
        kw["timeout_s"] = number("timeout", q["timeout"])
        if kw["timeout_s"] <= 0:
            raise bad_option("timeout", "must be > 0")
    kw["token_env"] = q.get("token_env", "")
    kw["host_header"] = q.get("host", "")
    kw.update(_task_options(q))
    opts = KServeOptions(**kw)
    if opts.input_kind == "bytes" and (opts.dtype or opts.layout or opts.mean or opts.std
                                       or opts.scale is not None or opts.channels):
        raise bad_option("input", "input=bytes sends the image file; layout, dtype, channels, "
                                  "scale, mean and std apply to input=tensor only")
    if opts.dtype == "UINT8" and (opts.mean or opts.std or opts.scale not in (None, 1.0)):
        raise bad_option("dtype", "UINT8 input carries the pixels as they are; mean, std and "
                                  "scale need FP32 or FP16")
    return opts


def _unit_interval(option: str, text: str, kind: str = "kserve") -> float:
    value = number(option, text, kind)
    if not 0.0 <= value <= 1.0:
        raise bad_option(option, f"must be in [0, 1], got {value:g}", kind)
    return value


def detection_format(q: dict[str, str], kind: str = "kserve") -> DetectionFormat:
    """The ``DETECTION_OPTIONS`` of a target URL's query."""
    kw: dict[str, Any] = {key: q.get(key, "") for key in
                          ("boxes_output", "scores_output", "classes_output", "count_output")}
    if "box_format" in q:
        fmt = q["box_format"].lower()
        if fmt.endswith("n") and fmt[:-1] in BOX_ORDERS:
            raise bad_option("box_format", f"give '{fmt[:-1]}' with box_coords=normalised", kind)
        if fmt not in BOX_ORDERS:
            raise bad_option("box_format", f"'{q['box_format']}' is not one of "
                                           f"{', '.join(BOX_ORDERS)}", kind)
        kw["box_format"] = fmt
    if "box_coords" in q:
        coords = q["box_coords"].lower()
        if coords not in ("pixel", "normalised", "normalized"):
            raise bad_option("box_coords", f"'{q['box_coords']}' is not pixel or normalised", kind)
        kw["box_normalised"] = coords != "pixel"
    if "label_offset" in q:
        try:
            kw["label_offset"] = int(q["label_offset"])
        except ValueError:
            raise bad_option("label_offset", f"'{q['label_offset']}' is not an integer",
                             kind) from None
        if abs(kw["label_offset"]) > 1_000_000:
            raise bad_option("label_offset", f"{kw['label_offset']} is out of range", kind)
    if "min_score" in q:
        kw["min_score"] = _unit_interval("min_score", q["min_score"], kind)
    return DetectionFormat(**kw)


def _task_options(q: dict[str, str]) -> dict[str, Any]:
    """The options of detection and segmentation answers; each is refused for another task,
    so a forgotten ``task=`` is named rather than ignored."""
    kw: dict[str, Any] = {}
    task = q.get("task", "classification")
    if task not in TASKS:
        raise bad_option("task", f"'{task}' is not one of {', '.join(TASKS)}")
    kw["task"] = task
    per_task = {"detection": DETECTION_OPTIONS, "segmentation": ("mask_layout", "mask_threshold")}
    for owner, keys in per_task.items():
        for key in keys:
            if key in q and task != owner:
                raise bad_option(key, f"applies to task={owner} only (this target is "
                                      f"task={task})")
    if task == "detection" and "output_name" in q:
        raise bad_option("output_name", "task=detection reads several outputs: name them with "
                                        "boxes_output, scores_output, classes_output and "
                                        "count_output")
    if task != "classification" and "output" in q:
        raise bad_option("output", "probabilities|logits applies to task=classification; a "
                                   "segmentation score map is argmaxed whatever it holds")
    kw["detection"] = detection_format(q)
    if "mask_layout" in q:
        layout = q["mask_layout"].lower()
        if layout not in ("chw", "hwc"):
            raise bad_option("mask_layout", f"'{q['mask_layout']}' is not chw or hwc")
        kw["mask_layout"] = layout
    if "mask_threshold" in q:
        kw["mask_threshold"] = _unit_interval("mask_threshold", q["mask_threshold"])
    return kw


def read_labels(path: str) -> tuple[str, ...]:
    """Class names from a text file, one a line (blank trailing lines ignored)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise bad_option("labels", f"cannot read '{path}': {exc}") from None
    names = parse_labels(text)
    if not names:
        raise bad_option("labels", f"'{path}' holds no class names")
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


def bearer_token(token_env: str, kind: str) -> str:
    """The token ``token_env`` names ("" without one); a variable that is not set is an error
    naming the option at start-up, not ``Bearer `` (empty) sent on every call."""
    if not token_env:
        return ""
    token = os.environ.get(token_env, "")
    if not token:
        raise bad_option("token_env", f"the environment variable {token_env} is not set", kind)
    if any(c < " " or c == "\x7f" for c in token):
        # never quoted; a mounted secret often ends in a newline, which no header can carry
        raise bad_option("token_env", f"the environment variable {token_env} holds a line "
                                      "break or control character", kind)
    return token


def scrub(text: str, secrets: Sequence[str]) -> str:
    """``text`` with each of ``secrets`` (a bearer token a server may echo) replaced."""
    for secret in secrets:
        if len(secret) >= 4:
            text = text.replace(secret, "[redacted]")
    return text
