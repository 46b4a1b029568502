"""What a ``torchserve://``, ``bentoml://`` or ``rayserve://`` target URL says, parsed and checked before anything
is contacted, so that a typo is an ``InvalidArgument`` on ``target`` naming the option rather
than a failure at the first query (the options are listed in the package docstring).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from fortis.core.task import Task
from fortis.services.common import errors

#: scheme -> (server kind, transport)
SCHEMES: dict[str, tuple[str, str]] = {
    "torchserve": ("torchserve", "http"),
    "torchserve+http": ("torchserve", "http"),
    "torchserve+https": ("torchserve", "https"),
    "bentoml": ("bentoml", "http"),
    "bentoml+http": ("bentoml", "http"),
    "bentoml+https": ("bentoml", "https"),
    "rayserve": ("rayserve", "http"),
    "rayserve+http": ("rayserve", "http"),
    "rayserve+https": ("rayserve", "https"),
}
#: Plain-HTTP port when the URL gives none (Ray Serve's proxy listens on 8000 by default).
DEFAULT_PORTS = {"torchserve": 8080, "bentoml": 3000, "rayserve": 8000}
#: How the image is sent, per server (the first is the default).
INPUTS = {"bentoml": ("multipart", "json"), "rayserve": ("raw", "json", "multipart")}
OUTPUTS = ("top_k", "full_scores", "label_only")
BOX_FORMATS = ("xyxy", "xywh")
DEFAULT_TIMEOUT_S = 30.0
DEFAULT_CONCURRENCY = 4
#: TorchServe's stock image_classifier answers its 5 best classes.
DEFAULT_TOP_K = 5
#: An answer for one image larger than this is refused before it is parsed.
DEFAULT_MAX_ANSWER_BYTES = 8 * 1024 * 1024
#: A label set larger than this is not a label set (a labels file is read whole).
MAX_LABELS = 100_000
MAX_LABELS_FILE_BYTES = 16 * 1024 * 1024

_COMMON = {
    "task",
    "labels",
    "output",
    "top_k",
    "min_score",
    "box_format",
    "timeout",
    "concurrency",
    "token_env",
    "max_answer_bytes",
    "rate",
}
_KNOWN = {
    "torchserve": _COMMON | {"version"},
    "bentoml": _COMMON | {"input", "field"},
    "rayserve": _COMMON | {"input", "field"},
}


@dataclass(frozen=True, kw_only=True)
class ServerOptions:
    """What a ``torchserve://`` / ``bentoml://`` / ``rayserve://`` URL says (see the package
    docstring)."""

    server: str  # "torchserve" | "bentoml" | "rayserve"
    transport: str  # "http" | "https"
    host: str
    port: int
    path: str  # TorchServe: the model name; BentoML: the endpoint; Ray Serve: the HTTP path
    version: str = ""
    task: Task = Task.CLASSIFICATION
    labels_path: str = ""
    output: str = "top_k"
    top_k: int = DEFAULT_TOP_K
    min_score: float = 0.0
    box_format: str = "xyxy"
    timeout_s: float = DEFAULT_TIMEOUT_S
    concurrency: int = DEFAULT_CONCURRENCY
    token_env: str = ""
    max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES
    input: str = "multipart"  # BentoML: "multipart" | "json"; Ray Serve: also "raw" (default)
    field: str = "image"  # BentoML: the endpoint's image parameter; JSON/form field otherwise

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.transport}://{host}:{self.port}"

    @property
    def name(self) -> str:
        """The model (TorchServe), endpoint (BentoML) or path (Ray Serve) the URL names, for
        messages."""
        if self.server == "rayserve":
            return "/" + self.path
        return self.path + (f"/{self.version}" if self.version else "")


def bad_option(server: str, option: str, message: str) -> errors.InvalidArgument:
    return errors.InvalidArgument("target", f"{server} option '{option}': {message}")


def _int(server: str, option: str, text: str, low: int, high: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise bad_option(server, option, f"'{text[:40]}' is not an integer") from None
    if not low <= value <= high:
        raise bad_option(server, option, f"must be {low}..{high}, got {value}")
    return value


def _float(server: str, option: str, text: str, low: float, high: float) -> float:
    try:
        value = float(text)
    except ValueError:
        raise bad_option(server, option, f"'{text[:40]}' is not a number") from None
    if not math.isfinite(value) or not low <= value <= high:
        raise bad_option(server, option, f"must be a number in {low:g}..{high:g}, got {text[:40]}")
    return value


def parse_url(url: str) -> ServerOptions:
    """Parse a ``torchserve[+https]://HOST:PORT/MODEL[/VERSION]?options``,
    ``bentoml[+https]://HOST:PORT/ENDPOINT?options`` or ``rayserve[+https]://HOST:PORT/PATH?options``
    URL; ``InvalidArgument`` on ``target`` naming the bad part."""
    parts = urlsplit(url)
    kind = SCHEMES.get(parts.scheme)
    if kind is None:
        raise errors.InvalidArgument(
            "target", f"'{url[:200]}' is not a torchserve://, bentoml:// or rayserve:// URL"
        )
    server, transport = kind
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        raise errors.InvalidArgument("target", f"bad port in '{url[:200]}'") from None
    if not host:
        raise errors.InvalidArgument("target", f"no host in '{url[:200]}'")
    if port is None:
        port = 443 if transport == "https" else DEFAULT_PORTS[server]
    segments = [unquote(s) for s in parts.path.strip("/").split("/") if s]
    if any(s in (".", "..") or "/" in s or "\\" in s for s in segments):
        raise errors.InvalidArgument(
            "target", f"'{url[:200]}': the path may not hold '.', '..' or encoded slashes"
        )
    kw: dict[str, Any] = {"server": server, "transport": transport, "host": host, "port": port}
    if server == "torchserve":
        if len(segments) not in (1, 2):
            raise errors.InvalidArgument(
                "target",
                f"'{url[:200]}' must name one model: {parts.scheme}://HOST:PORT/MODEL[/VERSION]",
            )
        kw["path"] = segments[0]
        kw["version"] = segments[1] if len(segments) == 2 else ""
    elif server == "rayserve":
        # The application's route prefix and any path below it; none is the route "/" (what
        # serve.run uses when no route_prefix is given).
        if len(segments) > 16 or len(parts.path) > 1024:
            raise errors.InvalidArgument("target", f"'{url[:200]}': the path is too long")
        kw["path"] = "/".join(segments)
    else:
        if len(segments) != 1:
            raise errors.InvalidArgument(
                "target",
                f"'{url[:200]}' must name one endpoint: {parts.scheme}://HOST:PORT/ENDPOINT",
            )
        kw["path"] = segments[0]
    q: dict[str, str] = {}
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key not in _KNOWN[server]:
            raise bad_option(
                server, key[:40], "unknown option; known: " + ", ".join(sorted(_KNOWN[server]))
            )
        if key in q:
            raise bad_option(server, key, "given twice")
        q[key] = value
    if "version" in q:
        if kw["version"]:
            raise bad_option(server, "version", "the URL path already names a version")
        kw["version"] = q["version"]
    if "task" in q:
        if q["task"] not in ("classification", "detection"):
            raise bad_option(
                server, "task", f"'{q['task'][:40]}' is not classification or detection"
            )
        kw["task"] = Task.CLASSIFICATION if q["task"] == "classification" else Task.DETECTION
    kw["labels_path"] = q.get("labels", "")
    if "output" in q:
        if q["output"] not in OUTPUTS:
            raise bad_option(
                server, "output", f"'{q['output'][:40]}' is not one of {', '.join(OUTPUTS)}"
            )
        kw["output"] = q["output"]
    if "top_k" in q:
        kw["top_k"] = _int(server, "top_k", q["top_k"], 1, MAX_LABELS)
    if "min_score" in q:
        kw["min_score"] = _float(server, "min_score", q["min_score"], 0.0, 1.0)
    if "box_format" in q:
        if q["box_format"] not in BOX_FORMATS:
            raise bad_option(
                server,
                "box_format",
                f"'{q['box_format'][:40]}' is not one of {', '.join(BOX_FORMATS)}",
            )
        kw["box_format"] = q["box_format"]
    if "timeout" in q:
        kw["timeout_s"] = _float(server, "timeout", q["timeout"], 0.001, 3600.0)
    if "concurrency" in q:
        kw["concurrency"] = _int(server, "concurrency", q["concurrency"], 1, 64)
    if "max_answer_bytes" in q:
        kw["max_answer_bytes"] = _int(
            server, "max_answer_bytes", q["max_answer_bytes"], 1024, 256 * 1024 * 1024
        )
    kw["token_env"] = q.get("token_env", "")
    if server in INPUTS:
        kw["input"] = q.get("input", INPUTS[server][0])
        if kw["input"] not in INPUTS[server]:
            raise bad_option(
                server, "input", f"'{q['input'][:40]}' is not one of {', '.join(INPUTS[server])}"
            )
    if "field" in q:
        if not q["field"] or not q["field"].isidentifier():
            raise bad_option(server, "field", f"'{q['field'][:40]}' is not a parameter name")
        kw["field"] = q["field"]
    opts = ServerOptions(**kw)
    if opts.task == Task.DETECTION and "output" in q:
        raise bad_option(server, "output", "applies to task=classification only")
    if opts.output == "full_scores" and not opts.labels_path:
        raise bad_option(server, "output", "full_scores needs the label set: labels=FILE")
    return opts


def read_labels(server: str, path: str) -> tuple[str, ...]:
    """The target's label set from ``path``: one name a line, a JSON list, or a JSON object
    of class index -> name (TorchServe's ``index_to_name.json``, whose values may also be
    ``[wordnet_id, name]`` lists, of which the name is used, as TorchServe does)."""
    p = Path(path)
    try:
        if not p.is_file():
            raise bad_option(server, "labels", f"'{path[:200]}' is not a file")
        if p.stat().st_size > MAX_LABELS_FILE_BYTES:
            raise bad_option(
                server, "labels", f"'{path[:200]}' is larger than {MAX_LABELS_FILE_BYTES} bytes"
            )
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise bad_option(
            server, "labels", f"cannot read '{path[:200]}': {getattr(exc, 'strerror', None) or exc}"
        ) from None
    names = parse_labels(server, text, path)
    if not names:
        raise bad_option(server, "labels", f"'{path[:200]}' holds no class names")
    if len(names) > MAX_LABELS:
        raise bad_option(
            server, "labels", f"'{path[:200]}' holds {len(names)} names; at most {MAX_LABELS}"
        )
    dupes = sorted({n for n in names if names.count(n) > 1}) if len(names) < 5000 else []
    if dupes or len(set(names)) != len(names):
        raise bad_option(
            server,
            "labels",
            f"'{path[:200]}' names a class twice: {', '.join(dupes[:5]) or '(several)'}",
        )
    return names


def parse_labels(server: str, text: str, path: str) -> tuple[str, ...]:
    stripped = text.strip()
    if not stripped.startswith(("[", "{")):
        return tuple(line.strip() for line in text.splitlines() if line.strip())
    try:
        doc = json.loads(stripped)
    except (ValueError, RecursionError):
        raise bad_option(server, "labels", f"'{path[:200]}' is not valid JSON") from None
    if isinstance(doc, list):
        if not all(isinstance(v, str) and v for v in doc):
            raise bad_option(
                server,
                "labels",
                f"'{path[:200]}': a JSON list of names must hold non-empty strings only",
            )
        return tuple(doc)
    if not isinstance(doc, dict):
        raise bad_option(
            server,
            "labels",
            f"'{path[:200]}' is neither a list of names nor an object of index -> name",
        )
    by_index: dict[int, str] = {}
    for key, value in doc.items():
        if not (isinstance(key, str) and key.isdigit() and len(key) <= 6):
            raise bad_option(
                server, "labels", f"'{path[:200]}': key '{str(key)[:40]}' is not a class index"
            )
        if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            value = value[-1]
        if not isinstance(value, str) or not value:
            raise bad_option(server, "labels", f"'{path[:200]}': class {key} has no name")
        by_index[int(key)] = value
    if sorted(by_index) != list(range(len(by_index))):
        raise bad_option(
            server, "labels", f"'{path[:200]}': class indices must be 0..N-1 without gaps"
        )
    return tuple(by_index[i] for i in range(len(by_index)))
