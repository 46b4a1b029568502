"""Profiles: the YAML that describes one HTTP/JSON vision API, parsed and validated up front.

``parse_profile`` reads every setting (``adapters/profiles/README.md`` documents them),
collects every problem with its dotted field name and raises them together as one
``InvalidArgument``, so a profile author fixes a profile in one round; the resulting
``Profile`` holds compiled JMESPath expressions, ready for ``response.prediction_from_answer``
and ``request.build_request``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jmespath
import yaml
from fortis.adapters.http_json import urls
from fortis.adapters.http_json.auth import AuthSpec, SecretRef
from fortis.adapters.http_json.cloud_auth import (
    CLOUD_AUTH_KINDS,
    CloudAuthSpec,
    parse_cloud_auth,
)
from fortis.adapters.http_json.templates import PLACEHOLDERS, placeholders_in
from fortis.core.strategy import OUTPUT_KINDS, TASK_TYPES
from fortis.core.task import Task
from fortis.services.common import errors
from jmespath.exceptions import JMESPathError
from jmespath.parser import ParsedResult

#: Where profiles named without a path (``http-json:google-vision-labels``) are looked up.
PROFILES_DIR = Path(__file__).resolve().parents[1] / "profiles"

TASKS = TASK_TYPES
#: What a classification profile's ``output`` may say (top-k first: what cloud APIs give).
CLASSIFICATION_OUTPUTS = {k: OUTPUT_KINDS[k] for k in ("top_k", "full_scores", "label_only")}
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
#: Header names that carry credentials: they belong under ``request.auth`` (a secret reference).
_SECRET_HEADER = re.compile(r"authorization|api[-_]?key|token|secret|subscription[-_]key|password",
                            re.IGNORECASE)


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
    task: Task
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
    auth: AuthSpec | CloudAuthSpec | None = None
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
        if (isinstance(v, bool) or not isinstance(v, int | float)
                or not math.isfinite(v) or (integer and not float(v).is_integer())):
            self.bad(key, f"must be {'an integer' if integer else 'a number'}, got {v!r}")
            return default
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            low = lo if lo is not None else "-inf"
            high = hi if hi is not None else "inf"
            self.bad(key, f"{v} is outside {low}..{high}")
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
    for key, problem in (("header", urls.token_problem(header, "header name") if header else ""),
                         ("prefix", urls.value_problem(prefix))):
        if problem:
            r.bad(key, problem)
    r.finish()
    if not header or ref is None:
        return None
    return AuthSpec(header=header, secret=ref, prefix=prefix)


def _request_auth(r: _Reader, problems: list[errors.FieldViolation]
                  ) -> AuthSpec | CloudAuthSpec | None:
    """``request.auth``: a header from a secret (``kind: header``, the default) or a cloud
    kind whose credentials the vendor's library finds and signs with (cloud_auth.py)."""
    kinds = ("header", *CLOUD_AUTH_KINDS)
    raw_kind = r.data.get("kind", "header") if r.data else ""
    kind = r.string("kind", "header", choices=kinds) if r.data else ""
    if raw_kind not in ("", *kinds):
        r.used.update(r.data)          # the kind decides what the rest means: not checked
        r.finish()
        return None
    if kind in ("", "header"):
        return _auth(r)
    spec = parse_cloud_auth(kind, r, problems, _secret_ref)
    r.finish()
    return spec


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
    """A ``Profile`` from the mapping of a YAML profile (see ``adapters/profiles/README.md``).

    Each section is read by its own step, in the order of the file (the top level, then
    ``request``, then ``response``, then what the task needs across them), all into one
    list of problems, so their order in the error is the same as the settings'."""
    if not isinstance(data, dict):
        raise errors.InvalidArgument("profile", f"must be a mapping (name, task, request, "
                                                f"response, ...), got {type(data).__name__} "
                                                f"[profile {source}]")
    problems: list[errors.FieldViolation] = []
    top = _Reader(data, "", problems)
    head = _top_level(top, base_dir)
    request = _request(top.sub("request"), problems)
    response = _response(top.sub("response"), request["images_per_request"])
    _check_task_needs(head, response, problems)
    top.finish()
    if problems:
        raise errors.InvalidArgument.from_violations(
            [errors.FieldViolation(v.field, f"{v.description} [profile {source}]")
             for v in problems])
    assert head["task"] is not None         # a missing or unknown task is one of the problems
    labels: list[str] = head.pop("labels")
    label_map: dict[str, str] = head.pop("label_map")
    label_match = head["label_match"]
    if label_match == "case_insensitive":     # looked up by the folded service name
        label_map = {k.casefold(): v for k, v in label_map.items()}
    label_index: dict[str, int] = {}
    for i, lab in enumerate(labels):
        label_index.setdefault(lab.casefold() if label_match == "case_insensitive" else lab, i)
    return Profile(source=source, labels=tuple(labels), label_map=label_map,
                   label_index=label_index, **head, **request, **response)


def _top_level(top: _Reader, base_dir: Path | None) -> dict[str, Any]:
    """The profile's own settings: name, task, classification output and the label set."""
    name = top.string("name", required=True)
    task_name = top.string("task", required=True, choices=tuple(TASKS))
    task = Task(task_name) if task_name else None     # None: missing or unknown, a problem
    output = top.string("output", "top_k", choices=tuple(CLASSIFICATION_OUTPUTS))
    top_k = int(top.num("top_k", 0, lo=0, integer=True))
    labels = _labels(top, base_dir)
    label_map = top.mapping("label_map")
    label_match = top.string("label_match", "case_insensitive",
                             choices=("exact", "case_insensitive"))
    unknown_labels = top.string("unknown_labels", "keep", choices=("keep", "drop"))
    version = top.string("version")
    description = top.string("description")
    if label_map and labels:
        known = {x.casefold() if label_match == "case_insensitive" else x for x in labels}
        for k, v in label_map.items():
            if (v.casefold() if label_match == "case_insensitive" else v) not in known:
                top.bad(f"label_map.{k}", f"maps to '{v}', which is not in labels")
    return {"name": name, "task": task, "output": output, "top_k": top_k, "labels": labels,
            "label_map": label_map, "label_match": label_match,
            "unknown_labels": unknown_labels, "version": version, "description": description}


def _labels(top: _Reader, base_dir: Path | None) -> list[str]:
    """The class names, from ``labels`` or from ``labels_file`` (relative to the profile)."""
    labels_raw = top.get("labels")
    labels_file = top.string("labels_file")
    labels: list[str] = []
    if labels_raw is not None and labels_file:
        top.bad("labels", "give labels or labels_file, not both")
    elif labels_raw is not None:
        if (not isinstance(labels_raw, list)
                or not all(isinstance(x, str | int) for x in labels_raw)):
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
    return labels


def _request(rq: _Reader, problems: list[errors.FieldViolation]) -> dict[str, Any]:
    """``request``: where and how each image is sent, and its body templates checked."""
    url = urls.request_url(rq, problems)
    method = rq.string("method", "POST").upper()
    if urls.token_problem(method, "method"):
        rq.bad("method", urls.token_problem(method, "method"))
    headers = rq.mapping("headers")
    for h, value in headers.items():
        if urls.token_problem(h, "header name") or urls.value_problem(value):
            rq.bad(f"headers.{h}", urls.token_problem(h, "header name") or urls.value_problem(value))
        elif _SECRET_HEADER.search(h):
            rq.bad(f"headers.{h}", "looks like a credential: put it under request.auth as a "
                                   "secret reference (env:VAR or file:/path)")
    auth = _request_auth(rq.sub("auth"), problems)
    image = rq.string("image", "base64", choices=IMAGE_MODES)
    body = rq.get("body")
    per_image = rq.get("per_image")
    mp = rq.sub("multipart")
    mp_file = mp.string("file_field", "image")
    mp_name = mp.string("filename", "image")
    mp_fields = mp.mapping("fields")
    mp.finish()
    image_url = _image_url(rq.sub("image_url"))
    timeout_s = rq.num("timeout_s", 30.0, lo=0.001, hi=3600.0)
    max_concurrency = int(rq.num("max_concurrency", 4, lo=1, hi=256, integer=True))
    per_request = int(rq.num("images_per_request", 1, lo=1, hi=1024, integer=True))
    max_bytes = int(rq.num("max_response_bytes", 32 * 1024 * 1024, lo=1024, hi=2**28,
                           integer=True))
    rq.finish()
    if isinstance(auth, CloudAuthSpec) and url and urls.plain_http_off_host(url):
        rq.bad("url", f"plain http to a host that is not loopback with auth kind '{auth.kind}'"
                      "; use https:// (the credentials would cross the network unencrypted)")
    _check_templates(rq, image, body, per_image, per_request)
    return {"url": url, "method": method, "headers": headers, "auth": auth, "image": image,
            "body": body, "per_image": per_image, "multipart_file_field": mp_file,
            "multipart_filename": mp_name, "multipart_fields": mp_fields,
            "image_url": image_url, "timeout_s": timeout_s, "max_concurrency": max_concurrency,
            "images_per_request": per_request, "max_response_bytes": max_bytes}


def _image_url(iu: _Reader) -> ImageUrlSpec:
    """``request.image_url``: how an ``image: url`` service gets the image's address."""
    serve = iu.string("serve", "local", choices=("local", "upload"))
    image_url = ImageUrlSpec(
        serve=serve, host=iu.string("host", "127.0.0.1"),
        port=int(iu.num("port", 0, lo=0, hi=65535, integer=True)),
        public_base=iu.string("public_base").rstrip("/"),
        upload_url=iu.string("upload_url", required=(serve == "upload")),
        upload_method=iu.string("upload_method", "PUT").upper(),
        upload_auth=_auth(iu.sub("upload_auth")),
        public_url=iu.string("public_url", required=(serve == "upload")))
    if urls.token_problem(image_url.upload_method, "method"):
        iu.bad("upload_method", urls.token_problem(image_url.upload_method, "method"))
    for key in ("upload_url", "public_url", "public_base"):
        if getattr(image_url, key) and urls.url_problem(getattr(image_url, key)):
            iu.bad(key, urls.url_problem(getattr(image_url, key)))
    iu.finish()
    return image_url


def _check_templates(rq: _Reader, image: str, body: Any, per_image: Any,
                     per_request: int) -> None:
    """The body templates: known placeholders, the image placed where the image mode needs
    it, and plain JSON."""
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


def _response(rs: _Reader, per_request: int) -> dict[str, Any]:
    """``response``: where the answer holds each prediction, its label, score, box or mask."""
    results, results_text = rs.expr("results")
    error_expr, _ = rs.expr("error")
    if per_request > 1 and results is None:
        rs.bad("results", "images_per_request > 1 needs a results path (one answer per image)")
    mask, seg_class_map = _mask(rs.sub("mask"))
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
    box = _box(rs.sub("box"))
    rs.finish()
    return {"results": results, "results_text": results_text, "error": error_expr,
            "items": items, "items_text": items_text, "missing_items": missing_items,
            "instances": instances, "label": label, "label_text": label_text,
            "label_index_base": label_base, "score": score, "score_text": score_text,
            "score_scale": SCORE_SCALES[raw_scale], "missing_numbers": missing_numbers,
            "min_score": min_score, "box": box, "mask": mask, "background": background}


def _mask(mk: _Reader) -> tuple[MaskSpec | None, bool]:
    """``response.mask`` (segmentation), and whether it is a class map: a class map alone
    answers, so items and label are not required then."""
    seg_class_map = False
    mask: MaskSpec | None = None
    if mk.data:
        mpath, mtext = mk.expr("path", required=True)
        mfmt = mk.string("format", required=True, choices=MASK_FORMATS)
        mkind = mk.string("kind", "binary", choices=MASK_KINDS)
        if mpath is not None and mfmt:
            mask = MaskSpec(path=mpath, path_text=mtext, format=mfmt, kind=mkind)
        seg_class_map = mkind == "class_map"
    mk.finish()
    return mask, seg_class_map


def _box(bx: _Reader) -> BoxSpec | None:
    """``response.box`` (detection): its path, format and the names of its numbers."""
    box: BoxSpec | None = None
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
    return box


def _check_task_needs(head: dict[str, Any], response: dict[str, Any],
                      problems: list[errors.FieldViolation]) -> None:
    """What the task needs across sections: a box for detection, a mask for segmentation
    (and only then), scores and the label set for the classification outputs that carry them."""
    task, output = head["task"], head["output"]
    if task == Task.DETECTION and response["box"] is None:
        problems.append(errors.FieldViolation("response.box", "required for task: detection"))
    if task == Task.SEGMENTATION and response["mask"] is None:
        problems.append(errors.FieldViolation("response.mask", "required for task: segmentation"))
    if task != Task.SEGMENTATION and response["mask"] is not None:
        problems.append(errors.FieldViolation("response.mask", "only used by task: segmentation"))
    if task == Task.CLASSIFICATION and output != "label_only" and response["score"] is None:
        problems.append(errors.FieldViolation("response.score",
                                              f"output: {output} needs a score path (or use "
                                              "output: label_only)"))
    if task == Task.CLASSIFICATION and output == "full_scores" and not head["labels"]:
        problems.append(errors.FieldViolation("labels", "output: full_scores needs the label set"))


def profile_path(spec: str) -> Path:
    """The profile file a ``http-json:`` URL names: a path, or the name of a shipped profile."""
    candidate = Path(spec).expanduser()
    if candidate.suffix in (".yaml", ".yml") or "/" in spec or candidate.exists():
        return candidate
    return PROFILES_DIR / f"{spec}.yaml"
