"""Hypothesis strategies of hostile requests for every Fortis RPC that takes user data.

Issue 9 (finding 8, "One error mapping", and the "Done when" fuzz bullet): bad input must get a
precise, bounded status naming the field, never INTERNAL/UNKNOWN, and never take a service
down. The strategies mix hostile values (boundary ints 0, -1, 2^31, 2^63-1; NaN, +-Inf, -0.0,
1e308; empty, huge, unicode and control-character strings; tensors with ``[]``, negative,
overflowing or mismatched shapes and unknown dtypes; PNG/JPEG headers declaring 100000x100000
or truncated; plans nested 100k deep, YAML aliases, ``severities: [[1]]``; Struct params nested
90+ deep; page tokens "nan"/"inf"/2^70; unknown enum values) with valid-looking ones, so a
request gets past its first check as often as it is refused by it.

``RPCS`` names every case: the full method path, its streaming shape, the request (or, for
client-streaming methods, the list of requests) strategy and the response class. Used by
``tests/fuzz/test_fuzz_rpcs.py`` (a quick derandomized run) and ``bench/fuzz.py`` (>= 10,000
cases). Pure test code: no server here.
"""

from __future__ import annotations

import base64
import copy
import json
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import yaml
from fortis.common.v1 import common_pb2
from fortis.evaluation.v1 import evaluation_pb2 as ev
from fortis.evaluation.v1 import uploads_pb2 as up
from fortis.perturbation.v1 import perturbation_pb2 as pt
from fortis.proxy.v1 import proxy_pb2 as px
from fortis.report.v1 import report_pb2 as rp
from fortis.scoring.v1 import scoring_pb2 as sc
from fortis.target.v1 import target_pb2 as tg
from google.protobuf import descriptor, struct_pb2
from google.protobuf.message import Message
from hypothesis import strategies as st

#: Session the harness creates before fuzzing (so Predict & co. reach past the session lookup).
FUZZ_SESSION = "fuzz-session"
#: Target every stack under fuzz serves (the Fashion-MNIST CNN, 28x28x1).
FUZZ_TARGET = "fmnist-cnn"

# -- scalars ----------------------------------------------------------------------------------

BOUNDARY_INTS = (0, 1, -1, 2, 5, 31, 2**31 - 1, 2**31, -(2**31), 2**32, 2**53 + 1,
                 2**62 + 1, 2**63 - 1, -(2**63))
BOUNDARY_FLOATS = (0.0, -0.0, 1.0, -1.0, 0.5, 1e-308, 5e-324, 1e308, -1e308,
                   float("nan"), float("inf"), float("-inf"), 2.0**63, 3.4e38)


def ints(lo: int = -(2**63), hi: int = 2**63 - 1) -> st.SearchStrategy[int]:
    """Boundary and random ints within a field's wire range [lo, hi]."""
    picks = [v for v in BOUNDARY_INTS if lo <= v <= hi]
    return st.one_of(st.sampled_from(picks), st.integers(min_value=max(lo, -1000),
                                                          max_value=min(hi, 1000)),
                     st.integers(min_value=lo, max_value=hi))


int32s = ints(-(2**31), 2**31 - 1)
int64s = ints()
uint64s = ints(0, 2**64 - 1)
floats = st.one_of(st.sampled_from(BOUNDARY_FLOATS),
                   st.floats(allow_nan=True, allow_infinity=True))


def enum_values(*known: int) -> st.SearchStrategy[int]:
    """A known enum value or an unknown one (proto3 enums are open)."""
    return st.one_of(st.sampled_from(known or (0,)), st.sampled_from((99, -1, 2**31 - 1, -(2**31))),
                     st.integers(-(2**31), 2**31 - 1))


_HUGE = ("A" * 1_000_000, "\u00e9" * 300_000, "x" * 70_000, "/" * 5000, "../" * 2000)
_SPECIAL = ("", " ", ".", "..", "../../etc/passwd", "/etc/passwd", "a/b", "a//b", "\x00",
            "\x00abc", "\n", "\r\n", "\x1b[31m", "\u202e", "\ud7ff", "\U0001f4a9" * 10, "nan",
            "inf", "-1", "null", "{}", "[]", "%s%n", "'; DROP TABLE x; --", "${HOME}",
            "tenant-b", "*", FUZZ_SESSION, FUZZ_TARGET)


def texts(*valid: str, huge: bool = True) -> st.SearchStrategy[str]:
    """A string field: ``valid`` examples, specials (empty, traversal, control characters,
    unicode), random unicode, and (``huge``) strings of 70 KB to 1 MB."""
    parts: list[st.SearchStrategy[str]] = [st.sampled_from(_SPECIAL), st.text(max_size=40),
                                           st.text(alphabet=st.characters(max_codepoint=0x1f),
                                                   max_size=20)]
    if valid:
        parts.insert(0, st.sampled_from(valid))
    if huge:
        parts.append(st.sampled_from(_HUGE))
    return st.one_of(*parts)


def ids(*valid: str) -> st.SearchStrategy[str]:
    return texts(*valid)


def page_tokens() -> st.SearchStrategy[str]:
    def b64(doc: Any) -> str:
        return base64.urlsafe_b64encode(json.dumps(doc).encode()).decode().rstrip("=")
    forged = [b64({"k": k, "o": o}) for k in ("evaluations", "targets", "metrics", "perturbations",
                                               "attacks", "ledger", "x")
              for o in (2**70, -1, 1e308, "nan", None, [1], 2**63, 1.5, True)]
    forged += [b64([1, 2]), b64("s"), b64({"k": "evaluations"}), "nan", "inf", "-inf",
               str(2**70), "0", "-1", "====", "\x00", "A" * 600]
    return st.one_of(st.just(""), st.sampled_from(forged), texts(huge=False),
                     st.binary(max_size=40).map(lambda b: base64.urlsafe_b64encode(b).decode()))


# -- tensors and images -----------------------------------------------------------------------

_DTYPES = (common_pb2.D_TYPE_UINT8, common_pb2.D_TYPE_INT32, common_pb2.D_TYPE_INT64,
           common_pb2.D_TYPE_FLOAT16, common_pb2.D_TYPE_FLOAT32, common_pb2.D_TYPE_FLOAT64,
           common_pb2.D_TYPE_BOOL)
_BAD_SHAPES = ([], [0], [2**62 + 1, 4], [-1, 28, 28], [28, -28, 1], [2**31, 2**31, 3],
               [1] * 40, [0, 0, 0], [28, 28, 1, 1, 1], [2**63 - 1], [3, 3, 1000000],
               [28, 28, 1], [28, 28, 3], [28, 28], [1, 28, 28, 1], [4, 4, 1])
_ITEMSIZE = {common_pb2.D_TYPE_UINT8: 1, common_pb2.D_TYPE_BOOL: 1, common_pb2.D_TYPE_FLOAT16: 2,
             common_pb2.D_TYPE_INT32: 4, common_pb2.D_TYPE_FLOAT32: 4,
             common_pb2.D_TYPE_INT64: 8, common_pb2.D_TYPE_FLOAT64: 8}


def _valid_image_tensor(seed: int, h: int = 28, w: int = 28, c: int = 1) -> common_pb2.Tensor:
    data = bytes((seed * 31 + i * 7) % 256 for i in range(h * w * c))
    return common_pb2.Tensor(dtype=common_pb2.D_TYPE_UINT8, shape=[h, w, c], data=data)


@st.composite
def tensors(draw: st.DrawFn) -> common_pb2.Tensor:
    """A tensor: valid 28x28x1 uint8, or a bad shape/dtype/data combination."""
    kind = draw(st.integers(0, 5))
    if kind == 0:
        return _valid_image_tensor(draw(st.integers(0, 255)))
    dtype = draw(enum_values(*_DTYPES))
    shape = draw(st.one_of(st.sampled_from(_BAD_SHAPES),
                           st.lists(int64s, max_size=6)))
    if kind == 1:       # data consistent with a small shape, floats may be NaN/Inf
        small = [max(0, min(abs(d), 8)) for d in shape][:4]
        n = 1
        for d in small:
            n *= d
        if dtype in (common_pb2.D_TYPE_FLOAT32, common_pb2.D_TYPE_FLOAT64):
            vals = draw(st.lists(floats, min_size=n, max_size=n))
            np_type = np.float32 if dtype == common_pb2.D_TYPE_FLOAT32 else np.float64
            with np.errstate(over="ignore"):
                data = np.asarray(vals, dtype=np.float64).astype(np_type).tobytes()
        else:
            data = draw(st.binary(min_size=n * _ITEMSIZE.get(dtype, 1),
                                  max_size=n * _ITEMSIZE.get(dtype, 1)))
        return common_pb2.Tensor(dtype=dtype, shape=small, data=data)
    data = draw(st.one_of(st.binary(max_size=64), st.sampled_from((b"", b"\x00" * 784,
                                                                    b"\xff" * 785))))
    return common_pb2.Tensor(dtype=dtype, shape=shape, data=data)


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png_header(width: int, height: int, *, truncated: bool = False, colour: int = 0) -> bytes:
    """A PNG whose IHDR declares ``width`` x ``height`` (its IDAT is a few bytes only)."""
    ihdr = _png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, colour, 0, 0, 0))
    idat = _png_chunk(b"IDAT", zlib.compress(b"\x00" * 64))
    out = b"\x89PNG\r\n\x1a\n" + ihdr + idat + _png_chunk(b"IEND", b"")
    return out[: len(out) // 2] if truncated else out


def jpeg_header(width: int, height: int) -> bytes:
    """A JPEG with an SOF0 frame declaring ``width`` x ``height`` and no scan data."""
    sof = b"\xff\xc0" + struct.pack(">HBHHB", 11, 8, height, width, 1) + b"\x01\x11\x00"
    return b"\xff\xd8" + b"\xff\xe0\x00\x10JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00" + sof + \
        b"\xff\xd9"


def _small_png() -> bytes:
    raw = b"".join(b"\x00" + bytes(range(28)) for _ in range(28))
    ihdr = _png_chunk(b"IHDR", struct.pack(">IIBBBBB", 28, 28, 8, 0, 0, 0, 0))
    return b"\x89PNG\r\n\x1a\n" + ihdr + _png_chunk(b"IDAT", zlib.compress(raw)) + \
        _png_chunk(b"IEND", b"")


SMALL_PNG = _small_png()
ENCODED = (png_header(100000, 100000), png_header(20000, 20000), png_header(0, 0),
           png_header(2**31 - 1, 1), png_header(28, 28, truncated=True),
           png_header(28, 28, colour=6), jpeg_header(65500, 65500), jpeg_header(0, 0),
           jpeg_header(65535, 65535), SMALL_PNG, SMALL_PNG[:40], b"\x89PNG\r\n\x1a\n",
           b"\xff\xd8\xff", b"GIF89a" + b"\x00" * 20, b"", b"\x00" * 100, b"BM" + b"\xff" * 60)
#: Headers within the pixel limit that decode large (36 MB grey, 108 MB RGB, 144 MB RGBA):
#: a few of them pass each image's check but not the request's decoded-size budget
#: (services/common/memory.py), refused from the headers alone.
LARGE_ENCODED = (png_header(6000, 6000), png_header(6000, 6000, colour=2),
                 png_header(6000, 6000, colour=6), jpeg_header(6000, 6000))


@st.composite
def images(draw: st.DrawFn) -> common_pb2.Image:
    image_id = draw(st.one_of(st.sampled_from(("img-0", "img-1", "a")), texts()))
    img = common_pb2.Image(image_id=image_id)
    kind = draw(st.integers(0, 3))
    if kind == 0:
        img.encoded = draw(st.one_of(st.sampled_from(ENCODED), st.binary(max_size=80)))
    elif kind == 1:
        img.tensor.CopyFrom(draw(tensors()))
    elif kind == 2:
        img.tensor.CopyFrom(_valid_image_tensor(draw(st.integers(0, 255))))
    return img                                     # kind 3: no content at all


@st.composite
def large_image_lists(draw: st.DrawFn) -> list[common_pb2.Image]:
    """Up to 32 images whose headers declare large (each valid alone), as the memory
    amplification was sent: many small messages decoding to gigabytes."""
    data = draw(st.sampled_from(LARGE_ENCODED))
    return [common_pb2.Image(image_id=f"big-{i}", encoded=data)
            for i in range(draw(st.integers(1, 32)))]


def image_lists(max_size: int = 4) -> st.SearchStrategy[list[common_pb2.Image]]:
    return st.one_of(st.lists(images(), max_size=max_size), large_image_lists())


# -- structured documents ---------------------------------------------------------------------


def nested_struct(depth: int) -> struct_pb2.Struct:
    """A Struct nested ``depth`` levels deep ({"a": {"a": ...}})."""
    inner = struct_pb2.Struct()
    inner["x"] = 1.0
    for _ in range(depth - 1):
        outer = struct_pb2.Struct()
        outer.fields["a"].struct_value.CopyFrom(inner)
        inner = outer
    return inner


_STRUCT_VALUES = st.one_of(floats, st.booleans(), texts(huge=False), st.none(),
                           st.lists(floats, max_size=4), st.lists(st.lists(floats, max_size=2),
                                                                  max_size=2))


@st.composite
def structs(draw: st.DrawFn, *keys: str) -> struct_pb2.Struct:
    """Params: random values (NaN, huge strings, lists of lists) for known and random keys,
    or a Struct nested 30 to 120 deep."""
    if draw(st.integers(0, 9)) == 0:
        s = struct_pb2.Struct()
        s.fields[draw(st.sampled_from(keys or ("x",)))].struct_value.CopyFrom(
            nested_struct(draw(st.sampled_from((30, 60, 90, 95, 120)))))
        return s
    s = struct_pb2.Struct()
    names = draw(st.lists(st.one_of(st.sampled_from(keys or ("x",)), texts(huge=False)),
                          max_size=4))
    for name in names:
        value = draw(_STRUCT_VALUES)
        if isinstance(value, float) and value != value:      # NaN survives Struct as a number
            s.fields[name].number_value = value
        else:
            s.update({name: value})
    return s


PLAN_BASE = f"""
name: fuzz
seed: 5
target: {{name: {FUZZ_TARGET}, task: classification}}
dataset: {{source: fashion-mnist, split: test, limit: 8}}
corruptions: [{{id: gaussian_noise, severities: [1]}}]
execution: {{batch_size: 8}}
"""
_PLAN_FIELDS = ("name", "seed", "target", "dataset", "corruptions", "attacks", "degradation",
                "execution", "correctness", "limit", "severities", "id", "params", "source",
                "path", "split", "batch_size", "epsilon", "max_queries", "levels")


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


def _laughs(levels: int) -> str:
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels):
        prev, cur = chr(ord("a") + i - 1), chr(ord("a") + i)
        lines.append(f"{cur}: &{cur} [" + ",".join([f"*{prev}"] * 9) + "]")
    return "\n".join(lines) + "\n"


HOSTILE_PLANS = (
    _deep(100_000), "a: " + _deep(100_000), "{" + '"a":{' * 50_000 + "}" * 50_001, "- " * 20_000 + "x",
    _laughs(9), "a: &a [1]\nb: *a\n", PLAN_BASE.replace("severities: [1]", "severities: [[1]]"),
    PLAN_BASE.replace("severities: [1]", "severities: [.nan, .inf, -1, 9999999999999999999]"),
    PLAN_BASE.replace("limit: 8", "limit: 99999999999999999999999"),
    PLAN_BASE.replace("limit: 8", "limit: .nan"), PLAN_BASE.replace("seed: 5", "seed: -1"),
    PLAN_BASE.replace("seed: 5", "seed: 1e308"), PLAN_BASE.replace("fuzz", "x" * 100_000),
    PLAN_BASE + "attacks: [{id: square, params: {epsilon: .nan, max_queries: 1e18}}]\n",
    PLAN_BASE + "attacks: [{id: square, params: {epsilon: [[1]], max_queries: {a: 1}}}]\n",
    PLAN_BASE + "degradation: [{id: global_blur, levels: [[1], -5, 1e9]}]\n",
    PLAN_BASE.replace("source: fashion-mnist", "source: manifest, path: /etc/passwd"),
    PLAN_BASE.replace("source: fashion-mnist", "source: manifest, path: ../../x"),
    "!!python/object/apply:os.system ['true']", "x: !!binary AAAA", "%YAML 9.9\n---\na: 1",
    "\x00\x01\x02", "\ufeff{}", "[]", "null", "42", '"just a string"', "{", "a: [", "\t: :",
    '{"name": "fuzz", "target": 1e400}', '{"seed": NaN}', "---\na: 1\n---\nb: 2\n",
)


@st.composite
def plan_texts(draw: st.DrawFn) -> str:
    kind = draw(st.integers(0, 4))
    if kind == 0:
        return draw(st.sampled_from(HOSTILE_PLANS))
    if kind == 1:                        # one field of the base plan replaced by a hostile value
        field = draw(st.sampled_from(_PLAN_FIELDS))
        value = draw(st.one_of(st.sampled_from(("[[1]]", ".nan", "-.inf", "-1", "2147483648",
                                                "9223372036854775807", "''", "{}", "[]", "~",
                                                "*x", "&x 1", "!!str 1", "0x7fffffff",
                                                "1e308", "'" + "z" * 5000 + "'")),
                               texts(huge=False).map(json.dumps)))
        return PLAN_BASE + f"\n{field}: {value}\n"
    if kind == 2:
        return json.dumps(draw(st.recursive(
            st.one_of(st.none(), st.booleans(), floats, st.integers(), st.text(max_size=10)),
            lambda c: st.one_of(st.lists(c, max_size=3),
                                st.dictionaries(st.sampled_from(_PLAN_FIELDS), c, max_size=4)),
            max_leaves=20)), allow_nan=True)
    if kind == 3:
        return draw(texts())
    base = PLAN_BASE
    cut = draw(st.integers(0, len(base)))
    return base[:cut] + draw(st.text(max_size=20)) + base[cut:]


# -- mutations of valid requests --------------------------------------------------------------
# A valid request with one to three fields replaced by hostile values reaches the checks deep in
# a service (a bad value behind valid ones), where requests built from scratch are refused by
# the first check.

_FD = descriptor.FieldDescriptor
_SCALAR: dict[int, st.SearchStrategy[Any]] = {
    _FD.TYPE_INT32: int32s, _FD.TYPE_SINT32: int32s, _FD.TYPE_SFIXED32: int32s,
    _FD.TYPE_INT64: int64s, _FD.TYPE_SINT64: int64s, _FD.TYPE_SFIXED64: int64s,
    _FD.TYPE_UINT32: ints(0, 2**32 - 1), _FD.TYPE_FIXED32: ints(0, 2**32 - 1),
    _FD.TYPE_UINT64: uint64s, _FD.TYPE_FIXED64: uint64s,
    _FD.TYPE_DOUBLE: floats, _FD.TYPE_FLOAT: floats, _FD.TYPE_BOOL: st.booleans(),
    _FD.TYPE_STRING: texts(), _FD.TYPE_BYTES: st.one_of(st.sampled_from(ENCODED),
                                                        st.binary(max_size=64)),
}


def _hostile_scalar(draw: st.DrawFn, fd: Any) -> Any:
    if fd.type == _FD.TYPE_ENUM:
        return draw(enum_values(*[v.number for v in fd.enum_type.values]))
    return draw(_SCALAR[fd.type])


def _special_message(draw: st.DrawFn, fd: Any) -> Message | None:
    name = fd.message_type.full_name
    if name == "fortis.common.v1.Tensor":
        return draw(tensors())
    if name == "fortis.common.v1.Image":
        return draw(images())
    if name == "google.protobuf.Struct":
        return draw(structs("epsilon", "max_queries", "sigma", "k", "chain_length"))
    return None


def _mutate(draw: st.DrawFn, msg: Message, depth: int = 0) -> None:
    """Replace one field somewhere in ``msg`` (preferring fields that are set) by a hostile
    value: an out-of-range number, an unknown enum, a hostile string or bytes, a bad tensor
    or image, a deep Struct, a cleared or an extra element."""
    fields = list(msg.DESCRIPTOR.fields)
    if not fields:
        return
    set_fields = [fd for fd, _ in msg.ListFields()]
    fd = draw(st.sampled_from(set_fields if set_fields and draw(st.integers(0, 3)) else fields))
    name = fd.name
    if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
        container = getattr(msg, name)
        key_fd = fd.message_type.fields_by_name["key"]
        value_fd = fd.message_type.fields_by_name["value"]
        key = draw(texts(*list(container.keys()), huge=False)) if key_fd.type == _FD.TYPE_STRING \
            else _hostile_scalar(draw, key_fd)
        if value_fd.message_type is not None:
            special = _special_message(draw, value_fd)
            target = container[key]
            if special is not None:
                target.CopyFrom(special)
            elif depth < 6:
                _mutate(draw, target, depth + 1)
        else:
            container[key] = _hostile_scalar(draw, value_fd)
        return
    repeated = fd.label == _FD.LABEL_REPEATED
    if fd.message_type is not None:
        special = _special_message(draw, fd)
        action = draw(st.integers(0, 4))
        if action == 0:
            msg.ClearField(name)
            return
        if repeated:
            container = getattr(msg, name)
            if action == 1 or not len(container):
                item = container.add()
                if special is not None:
                    item.CopyFrom(special)
                return
            item = container[draw(st.integers(0, len(container) - 1))]
        else:
            item = getattr(msg, name)
        if special is not None and action in (1, 2):
            item.CopyFrom(special)
        elif depth < 6:
            _mutate(draw, item, depth + 1)
        return
    if repeated:
        container = getattr(msg, name)
        if draw(st.booleans()) and len(container):
            container[draw(st.integers(0, len(container) - 1))] = _hostile_scalar(draw, fd)
        else:
            container.extend([_hostile_scalar(draw, fd) for _ in range(draw(st.integers(0, 3)))])
        return
    value = _hostile_scalar(draw, fd)
    try:
        setattr(msg, name, value)
    except (ValueError, TypeError):      # a float field refuses nothing; an int field may
        setattr(msg, name, 0)


@st.composite
def mutated(draw: st.DrawFn, base: Message, most: int = 3) -> Any:
    """``base`` with one to ``most`` hostile field replacements."""
    msg = type(base)()
    msg.CopyFrom(base)
    for _ in range(draw(st.integers(1, most))):
        _mutate(draw, msg)
    return msg


def _plan_doc() -> dict[str, Any]:
    return {"name": "fuzz", "seed": 5, "target": {"name": FUZZ_TARGET, "task": "classification"},
            "dataset": {"source": "fashion-mnist", "split": "test", "limit": 8},
            "corruptions": [{"id": "gaussian_noise", "severities": [1]}],
            "attacks": [{"id": "square", "params": {"epsilon": 0.05, "max_queries": 4},
                         "limit": 2}],
            "degradation": [{"id": "global_blur", "levels": [1, 2]}],
            "execution": {"batch_size": 8}}


_PLAN_VALUES = st.one_of(st.sampled_from((None, [], {}, [[1]], [1, [2]], {"a": {"b": 1}}, True,
                                          -1, 0, 2**31, 2**63 - 1, 2**70, 1e308, -0.0, "",
                                          "x" * 5000, "../../etc/passwd", "/etc/passwd"))
                         , floats, st.integers(), texts(huge=False))


@st.composite
def mutated_plans(draw: st.DrawFn) -> str:
    """The valid plan of ``_plan_doc`` with one to three values (at any depth) replaced, as
    YAML or JSON text."""
    doc = _plan_doc()
    for _ in range(draw(st.integers(1, 3))):
        node: Any = doc
        while True:
            keys = list(node) if isinstance(node, dict) else list(range(len(node)))
            if not keys:
                break
            key = draw(st.sampled_from(keys))
            child = node[key]
            if isinstance(child, dict | list) and child and draw(st.integers(0, 2)):
                node = child
                continue
            if isinstance(node, dict) and draw(st.integers(0, 4)) == 0:
                key = draw(st.sampled_from(_PLAN_FIELDS))
            node[key] = copy.deepcopy(draw(_PLAN_VALUES))      # sampled values are shared
            break
    if draw(st.booleans()):
        return json.dumps(doc, allow_nan=True)
    return yaml.safe_dump(doc, allow_unicode=True)


def _valid_images(n: int = 1) -> list[common_pb2.Image]:
    return [common_pb2.Image(image_id=f"img-{i}", tensor=_valid_image_tensor(i))
            for i in range(n)]


def _base_apply(cls: Any) -> Any:
    req = cls(perturbation_id="gaussian_noise", severity=1, seed=1, images=_valid_images(2))
    if cls is pt.ApplyPerturbationStreamRequest:
        req.request_id = "r1"
    return req


def _base_attack() -> pt.RunAttackRequest:
    req = pt.RunAttackRequest(attack_id="square", seed=1, proxy_session_id=FUZZ_SESSION,
                              origin="fuzz",
                              images=[pt.LabeledImage(image=img, labels=[0])
                                      for img in _valid_images(1)])
    req.params.update({"epsilon": 0.05, "max_queries": 4})
    return req


def _base_compute() -> sc.ComputeRequest:
    req = sc.ComputeRequest(metric="drr")
    probs = np.full((4, 3), 1 / 3, np.float64)
    req.arrays["perturbed_probs"].CopyFrom(common_pb2.Tensor(
        dtype=common_pb2.D_TYPE_FLOAT64, shape=[4, 3], data=probs.tobytes()))
    req.arrays["benign_class"].CopyFrom(common_pb2.Tensor(
        dtype=common_pb2.D_TYPE_INT64, shape=[4], data=np.zeros(4, np.int64).tobytes()))
    return req


def _base_score() -> list[sc.ScoreEvaluationRequest]:
    setup = sc.ScoringSetup(image_ids=["a", "b"], classification=sc.ClassificationTruth(
        labels=[sc.LabelSet(labels=[1]), sc.LabelSet(labels=[2])]),
        correctness=sc.CorrectnessRule(mode=sc.CORRECTNESS_MODE_TOP1))
    clean = sc.SettingAnswers(kind=sc.SETTING_KIND_CLEAN, name="clean")
    clean.classification.labels.CopyFrom(common_pb2.Tensor(
        dtype=common_pb2.D_TYPE_INT64, shape=[2, 1], data=np.array([[1], [0]], np.int64).tobytes()))
    return [sc.ScoreEvaluationRequest(setup=setup), sc.ScoreEvaluationRequest(setting=clean)]


@st.composite
def _mutated_stream(draw: st.DrawFn, base: list[Any]) -> list[Any]:
    out = list(base)
    i = draw(st.integers(0, len(out) - 1))
    out[i] = draw(mutated(out[i]))
    return out


def _base_report() -> Any:
    from tests.unit.report_parts import make_parts
    return rp.RenderReportRequest(parts=make_parts())


# -- requests per RPC ---------------------------------------------------------------------------

_PERTURBATIONS = ("gaussian_noise", "brightness", "rotation", "occlusion", "neural_style",
                  "global_blur", "per_brightness", "model_gradient_descent", "jpeg_compression")
_ATTACKS = ("fgsm", "pgd", "square", "hsja", "pertknob")
_METRICS = ("ieee.classification", "ieee.detection", "ieee.segmentation", "ndcg", "drr",
            "degradation_profile", "canary.model_capability", "twoway", "irt",
            "pertknob.robustness")
_ATTACK_PARAMS = ("epsilon", "max_queries", "steps", "step_size", "property", "p_init",
                  "max_iter", "norm", "targeted")
_METRIC_PARAMS = ("chain_length", "burn_in", "k", "gamma", "thresholds", "seed", "levels")


@st.composite
def _apply(draw: st.DrawFn, cls: Any) -> Any:
    req = cls(perturbation_id=draw(ids(*_PERTURBATIONS)), severity=draw(int32s),
              seed=draw(uint64s), images=draw(image_lists()), epsilon=draw(floats),
              surrogate=draw(texts("", "fmnist-surrogate")),
              labels=draw(st.lists(int32s, max_size=5)),
              response_encoding=draw(enum_values(0, 1)))
    req.params.CopyFrom(draw(structs("sigma", "level", "model_path", "angle")))
    if cls is pt.ApplyPerturbationStreamRequest:
        req.request_id = draw(texts("r1"))
    return req


@st.composite
def _run_attack(draw: st.DrawFn) -> pt.RunAttackRequest:
    req = pt.RunAttackRequest(
        attack_id=draw(ids(*_ATTACKS)), seed=draw(uint64s),
        images=[pt.LabeledImage(image=img, labels=draw(st.lists(int32s, max_size=3)))
                for img in draw(image_lists(3))],
        proxy_session_id=draw(texts(FUZZ_SESSION, "")), origin=draw(texts("", "fuzz")),
        surrogate=draw(texts("", "fmnist-surrogate")))
    p = draw(structs(*_ATTACK_PARAMS))
    if draw(st.booleans()):      # small budgets keep a valid attack quick
        p["max_queries"] = float(draw(st.sampled_from((1, 2, 4))))
        p["epsilon"] = draw(floats)
    req.params.CopyFrom(p)
    return req


def _base_validate() -> pt.ValidateAttackRequest:
    req = pt.ValidateAttackRequest(attack_id="pgd", task=common_pb2.TASK_TYPE_CLASSIFICATION,
                                   output_kind=common_pb2.OUTPUT_KIND_LABEL_ONLY)
    req.params.update({"epsilon": 0.1, "norm": "linf"})
    return req


@st.composite
def _validate_attack(draw: st.DrawFn) -> pt.ValidateAttackRequest:
    req = pt.ValidateAttackRequest(
        attack_id=draw(ids("square", "pgd", "fab", "mi_fgsm", "hsja", "pertknob")),
        task=draw(enum_values(0, 1, 2, 3)), output_kind=draw(enum_values(0, 1, 2, 3, 4, 5)))
    req.params.CopyFrom(draw(structs("epsilon", "norm", "ti_kernel", "max_queries",
                                     "property")))
    return draw(mutated(req, 2))


@st.composite
def _compute(draw: st.DrawFn) -> sc.ComputeRequest:
    req = sc.ComputeRequest(metric=draw(ids(*_METRICS)))
    for name in draw(st.lists(st.one_of(st.sampled_from(("labels", "scores", "truth", "correct",
                                                         "ranks", "responses", "values")),
                                        texts(huge=False)), max_size=3)):
        req.arrays[name].CopyFrom(draw(tensors()))
    req.params.CopyFrom(draw(structs(*_METRIC_PARAMS)))
    return req


@st.composite
def _score_setup(draw: st.DrawFn) -> sc.ScoreEvaluationRequest:
    setup = sc.ScoringSetup(image_ids=draw(st.lists(texts("img-0", "img-1", huge=False),
                                                    max_size=4)))
    which = draw(st.integers(0, 3))
    if which == 0:
        setup.classification.labels.extend(
            [sc.LabelSet(labels=draw(st.lists(int32s, max_size=3)))
             for _ in range(draw(st.integers(0, 4)))])
    elif which == 1:
        setup.detection.images.add(boxes=draw(tensors()), labels=draw(st.lists(int32s, max_size=3)),
                                   box_format=draw(enum_values(0, 1, 2, 3)),
                                   label_base=draw(int32s), width=draw(int32s),
                                   height=draw(int32s))
    elif which == 2:
        setup.segmentation.class_maps.CopyFrom(draw(tensors()))
    crit = draw(st.integers(0, 3))
    if crit == 0:
        setup.correctness.CopyFrom(sc.CorrectnessRule(mode=draw(enum_values(0, 1, 2, 3)),
                                                      k=draw(int32s), threshold=draw(floats)))
    elif crit == 1:
        setup.detection_criterion.CopyFrom(sc.DetectionCriterion(
            mode=draw(enum_values(0, 1, 2)), k=draw(int32s), iou_threshold=draw(floats),
            aggregate=draw(enum_values(0, 1, 2)), q=draw(int32s)))
    elif crit == 2:
        setup.segmentation_criterion.CopyFrom(sc.SegmentationCriterion(
            classes=draw(st.lists(int32s, max_size=3)), miou_threshold=draw(floats),
            all_absent=draw(enum_values(0, 1, 2))))
    setup.ranking.CopyFrom(sc.RankingOptions(enabled=draw(st.booleans()),
                                             num_classes=draw(int32s)))
    return sc.ScoreEvaluationRequest(setup=setup)


@st.composite
def _score_setting(draw: st.DrawFn) -> sc.ScoreEvaluationRequest:
    s = sc.SettingAnswers(kind=draw(enum_values(0, 1, 2, 3, 4, 5)), name=draw(texts("clean")),
                          level=draw(int32s), image_index=draw(st.lists(int32s, max_size=4)),
                          errors=draw(st.lists(texts(huge=False), max_size=2)))
    which = draw(st.integers(0, 2))
    if which == 0:
        s.classification.labels.CopyFrom(draw(tensors()))
        s.classification.scores.CopyFrom(draw(tensors()))
    elif which == 1:
        s.detection.boxes.CopyFrom(draw(tensors()))
        s.detection.counts.CopyFrom(draw(tensors()))
    else:
        s.segmentation.class_maps.CopyFrom(draw(tensors()))
    if draw(st.booleans()):
        s.query_attack.CopyFrom(sc.QueryAttackOutcomes(
            success=draw(st.lists(st.booleans(), max_size=4)),
            queries=draw(st.lists(int64s, max_size=4)), query_budget=draw(int64s)))
    if draw(st.booleans()):
        s.sizes.CopyFrom(sc.PerturbationSizes(linf=draw(st.lists(floats, max_size=4)),
                                              l2=draw(st.lists(floats, max_size=4))))
    return sc.ScoreEvaluationRequest(setting=s)


@st.composite
def _score_stream(draw: st.DrawFn) -> list[sc.ScoreEvaluationRequest]:
    head = draw(st.lists(_score_setup(), min_size=0, max_size=2))
    return head + draw(st.lists(_score_setting(), max_size=3))


@st.composite
def _report(draw: st.DrawFn) -> rp.RenderReportRequest:
    parts = rp.ReportParts(plan_text=draw(texts("name: x")))
    parts.target.CopyFrom(rp.TargetReport(
        name=draw(texts("t")), model_name=draw(texts(huge=False)), task=draw(enum_values(0, 1, 2, 3)),
        output_kind=draw(enum_values(0, 1, 2, 3)), top_k=draw(int32s),
        labels_count=draw(int32s), input_height=draw(int32s)))
    parts.environment.seed = draw(uint64s)
    for _ in range(draw(st.integers(0, 3))):
        t = parts.tests.add(name=draw(texts("gaussian_noise", huge=False)),
                            kind=draw(enum_values(0, 1, 2, 3, 4, 5, 6)),
                            perturbation_id=draw(texts(*_PERTURBATIONS, huge=False)),
                            levels=draw(st.lists(int32s, max_size=4)), images=draw(int64s))
        if draw(st.booleans()):
            t.epsilon = draw(floats)
            t.query_budget = draw(int64s)
    ieee = parts.metrics.ieee
    ieee.m = draw(int64s)
    ieee.accuracy.value = draw(floats)
    ieee.accuracy.m = draw(int64s)
    for _ in range(draw(st.integers(0, 2))):
        c = ieee.corruptions.add(name=draw(texts("gaussian_noise", huge=False)),
                                 mean_robustness=draw(floats))
        c.severities.add(severity=draw(int32s)).robustness.value = draw(floats)
    parts.ledger.total_queries = draw(int64s)
    parts.ledger.sessions[draw(texts("s", huge=False))] = draw(int64s)
    parts.evaluation.evaluation_id = draw(texts("ev-1"))
    parts.evaluation.images = draw(int64s)
    parts.evaluation.dataset.limit = draw(int64s)
    return rp.RenderReportRequest(parts=parts)


@st.composite
def _predict(draw: st.DrawFn, cls: Any) -> Any:
    req = cls(session_id=draw(ids(FUZZ_SESSION, "")), origin=draw(texts("", "fuzz")),
              images=draw(image_lists()))
    if cls is px.PredictStreamRequest:
        req.request_id = draw(texts("r1"))
    return req


def _stream_of(one: st.SearchStrategy[Any], max_size: int = 3) -> st.SearchStrategy[list[Any]]:
    return st.lists(one, min_size=0, max_size=max_size)


@dataclass(frozen=True)
class RpcCase:
    """One RPC under fuzz: ``path`` (/package.Service/Method), ``streaming`` ("uu", "us",
    "su", "ss": unary/stream request, unary/stream response), the request strategy (a list of
    requests for client-streaming) and the response class."""

    path: str
    streaming: str
    requests: st.SearchStrategy[Any]
    response: Callable[..., Any]


def _case(service: str, method: str, streaming: str, requests: st.SearchStrategy[Any],
          response: Any) -> tuple[str, RpcCase]:
    return f"{service.rsplit('.', 1)[-1]}.{method}", RpcCase(
        f"/{service}/{method}", streaming, requests, response)


_EV = "fortis.evaluation.v1.EvaluationService"
_PT = "fortis.perturbation.v1.PerturbationService"
_PX = "fortis.proxy.v1.TargetProxyService"
_SC = "fortis.scoring.v1.ScoringService"
_RP = "fortis.report.v1.ReportService"
_TG = "fortis.target.v1.TargetService"

_ev_ids = ids("ev-1", "fuzz-eval")

def _either(scratch: st.SearchStrategy[Any], base: Any) -> st.SearchStrategy[Any]:
    """Half built from scratch, half a valid request (or stream) with hostile fields."""
    mut = _mutated_stream(base) if isinstance(base, list) else mutated(base)
    return st.one_of(scratch, mut)


def _plans(cls: Any, **kw: Any) -> st.SearchStrategy[Any]:
    return st.builds(cls, plan=st.one_of(plan_texts(), mutated_plans()),
                     format=enum_values(0, 1, 2), **kw)


_UP = "fortis.evaluation.v1.UploadService"
_blob_ids = ids("sha256:" + "0" * 64, "sha256:" + "f" * 64)


@st.composite
def _upload_stream(draw: st.DrawFn) -> list[up.UploadBlobRequest]:
    """A header (any kind, hostile sizes/sha256/media type, or none at all) and chunks: image
    header bombs, truncated PNGs, bytes past the declared size, a chunk over 1 MiB."""
    out: list[up.UploadBlobRequest] = []
    if draw(st.integers(0, 4)):
        out.append(up.UploadBlobRequest(header=up.UploadHeader(
            kind=draw(enum_values(0, 1, 2, 3)), size=draw(int64s),
            media_type=draw(texts("", "image/png", huge=False)),
            expected_sha256=draw(texts("", "0" * 64, huge=False)))))
    bodies = st.one_of(st.sampled_from((*ENCODED, SMALL_PNG, b"", b"x" * (1024 * 1024 + 1))),
                       st.binary(max_size=64))
    out += [up.UploadBlobRequest(chunk=b) for b in draw(st.lists(bodies, max_size=3))]
    if draw(st.booleans()) and out:      # a second header mid-stream
        out.append(out[0])
    return out


_VALID_UPLOAD = [up.UploadBlobRequest(header=up.UploadHeader(
    kind=up.BLOB_KIND_IMAGE, size=len(SMALL_PNG), media_type="image/png")),
    up.UploadBlobRequest(chunk=SMALL_PNG)]


#: Every RPC of the stack that takes user data, by "Service.Method".
RPCS: dict[str, RpcCase] = dict([
    _case(_EV, "ValidatePlan", "uu", _plans(ev.ValidatePlanRequest), ev.ValidatePlanResponse),
    _case(_EV, "CreateEvaluation", "uu", _plans(ev.CreateEvaluationRequest, evaluation_id=_ev_ids),
          ev.CreateEvaluationResponse),
    _case(_EV, "GetEvaluation", "uu", st.builds(ev.GetEvaluationRequest, evaluation_id=_ev_ids),
          ev.GetEvaluationResponse),
    _case(_EV, "ListEvaluations", "uu", st.builds(ev.ListEvaluationsRequest, page_size=int32s,
                                                  page_token=page_tokens()),
          ev.ListEvaluationsResponse),
    _case(_EV, "CancelEvaluation", "uu", st.builds(ev.CancelEvaluationRequest,
                                                   evaluation_id=_ev_ids),
          ev.CancelEvaluationResponse),
    _case(_EV, "WatchEvaluation", "us", st.builds(ev.WatchEvaluationRequest,
                                                  evaluation_id=_ev_ids),
          ev.WatchEvaluationResponse),
    _case(_EV, "GetEvaluationReport", "uu", st.builds(ev.GetEvaluationReportRequest,
                                                      evaluation_id=_ev_ids),
          ev.GetEvaluationReportResponse),
    _case(_UP, "UploadBlob", "su", _either(_upload_stream(), _VALID_UPLOAD),
          up.UploadBlobResponse),
    _case(_UP, "GetBlob", "uu", st.builds(up.GetBlobRequest, blob_id=_blob_ids),
          up.GetBlobResponse),
    _case(_UP, "ListBlobs", "uu", st.builds(up.ListBlobsRequest, page_size=int32s,
                                            page_token=page_tokens(),
                                            kind=enum_values(0, 1, 2, 3)),
          up.ListBlobsResponse),
    _case(_UP, "DeleteBlob", "uu", st.builds(up.DeleteBlobRequest, blob_id=_blob_ids),
          up.DeleteBlobResponse),
    _case(_PT, "ListPerturbations", "uu", st.builds(pt.ListPerturbationsRequest,
                                                    kind=enum_values(0, 1, 5, 6, 7),
                                                    page_size=int32s, page_token=page_tokens()),
          pt.ListPerturbationsResponse),
    _case(_PT, "ListAttacks", "uu", st.builds(pt.ListAttacksRequest, kind=enum_values(0, 1, 2, 3),
                                              page_size=int32s, page_token=page_tokens()),
          pt.ListAttacksResponse),
    _case(_PT, "ApplyPerturbation", "uu",
          _either(_apply(pt.ApplyPerturbationRequest), _base_apply(pt.ApplyPerturbationRequest)),
          pt.ApplyPerturbationResponse),
    _case(_PT, "ApplyPerturbationStream", "ss",
          _either(_stream_of(_apply(pt.ApplyPerturbationStreamRequest)),
                  [_base_apply(pt.ApplyPerturbationStreamRequest)] * 2),
          pt.ApplyPerturbationStreamResponse),
    _case(_PT, "RunAttack", "us", _either(_run_attack(), _base_attack()), pt.RunAttackResponse),
    _case(_PT, "ValidateAttack", "uu", _either(_validate_attack(), _base_validate()),
          pt.ValidateAttackResponse),
    _case(_PX, "ListTargets", "uu", st.builds(px.ListTargetsRequest, page_size=int32s,
                                              page_token=page_tokens()),
          px.ListTargetsResponse),
    _case(_PX, "GetTargetInfo", "uu", st.builds(px.GetTargetInfoRequest,
                                                target=ids(FUZZ_TARGET)),
          px.GetTargetInfoResponse),
    # internal-key only: a tenant's call, whatever it sends, is PERMISSION_DENIED
    _case(_PX, "GetBuiltinTargets", "uu", st.just(px.GetBuiltinTargetsRequest()),
          px.GetBuiltinTargetsResponse),
    _case(_PX, "CreateSession", "uu", st.builds(
        px.CreateSessionRequest, target=ids(FUZZ_TARGET), session_id=ids("fuzz-s2", ""),
        query_budget=int64s, per_image_budget=int64s, description=texts("")),
          px.CreateSessionResponse),
    _case(_PX, "GetSession", "uu", st.builds(px.GetSessionRequest,
                                             session_id=ids(FUZZ_SESSION)),
          px.GetSessionResponse),
    _case(_PX, "Predict", "uu",
          _either(_predict(px.PredictRequest),
                  px.PredictRequest(session_id=FUZZ_SESSION, images=_valid_images(2))),
          px.PredictResponse),
    _case(_PX, "PredictStream", "ss",
          _either(_stream_of(_predict(px.PredictStreamRequest)),
                  [px.PredictStreamRequest(request_id="r1", session_id=FUZZ_SESSION,
                                           images=_valid_images(2))] * 2),
          px.PredictStreamResponse),
    _case(_PX, "GetSessionStats", "uu", st.builds(px.GetSessionStatsRequest,
                                                  session_id=ids(FUZZ_SESSION)),
          px.GetSessionStatsResponse),
    _case(_PX, "ListLedgerEntries", "uu", st.builds(
        px.ListLedgerEntriesRequest, session_id=ids(FUZZ_SESSION), page_size=int32s,
        page_token=page_tokens()), px.ListLedgerEntriesResponse),
    _case(_SC, "ScoreEvaluation", "su", _either(_score_stream(), _base_score()),
          sc.ScoreEvaluationResponse),
    _case(_SC, "ListMetrics", "uu", st.builds(sc.ListMetricsRequest, page_size=int32s,
                                              page_token=page_tokens()),
          sc.ListMetricsResponse),
    _case(_SC, "Compute", "uu", _either(_compute(), _base_compute()), sc.ComputeResponse),
    _case(_RP, "RenderReport", "uu", _either(_report(), _base_report()),
          rp.RenderReportResponse),
])

#: The built-in TargetService adapter (served on its own port only when asked).
TARGET_RPCS: dict[str, RpcCase] = dict([
    _case(_TG, "GetTargetInfo", "uu", st.just(tg.GetTargetInfoRequest()),
          tg.GetTargetInfoResponse),
    _case(_TG, "Predict", "uu",
          _either(st.builds(tg.PredictRequest, images=image_lists()),
                  tg.PredictRequest(images=_valid_images(2))),
          tg.PredictResponse),
    _case(_TG, "PredictStream", "ss", _stream_of(st.builds(
        tg.PredictStreamRequest, request_id=texts("r1"), images=image_lists())),
          tg.PredictStreamResponse),
])
