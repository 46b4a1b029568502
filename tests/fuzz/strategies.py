"""Hypothesis strategies of hostile requests for every Fortis RPC that takes user data.

Bad input must get a precise, bounded status naming the field, never INTERNAL/UNKNOWN, and never
take a service down. The strategies mix hostile values (boundary ints 0, -1, 2^31, 2^63-1; NaN,
+-Inf, -0.0, 1e308; empty, huge, unicode and control-character strings; tensors with ``[]``,
negative, overflowing or mismatched shapes and unknown dtypes; PNG/JPEG headers declaring
100000x100000 or truncated; plans nested 100k deep, YAML aliases, ``severities: [[1]]``; Struct
params nested 90+ deep; page tokens "nan"/"inf"/2^70; unknown enum values) with valid-looking
ones, so a request gets past its first check as often as it is refused by it. Valid requests
whose images decode large (headers declaring 6000x6000, tensors whose data match a large shape)
reach the decoded-size budget rather than the field checks.

``RPCS`` names every case: the full method path, its streaming shape, the request (or, for
client-streaming methods, the list of requests) strategy and the response class.
``SERVED_RPCS`` are gRPC's health and reflection, which every Fortis server carries;
``auth_cases(idp, api_key)`` sends valid requests with fuzzed credentials (bearer tokens of
``tests/fuzz/idp.py``'s issuer, API keys). Used by ``tests/fuzz/test_fuzz_rpcs.py`` (a quick
derandomized run) and ``bench/fuzz.py`` (>= 10,000 cases). Pure test code: no server here.
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


_BIG_TENSORS: dict[tuple[int, tuple[int, ...]], common_pb2.Tensor] = {}


def big_tensor(dtype: int, shape: tuple[int, ...]) -> common_pb2.Tensor:
    """A tensor whose data match a large shape (zeros; made once and kept): it reaches the
    decoded-size budget and the decoder with real bytes, not a refused lie."""
    key = (dtype, shape)
    if key not in _BIG_TENSORS:
        n = int(np.prod(shape)) * _ITEMSIZE[dtype]
        _BIG_TENSORS[key] = common_pb2.Tensor(dtype=dtype, shape=list(shape), data=bytes(n))
    return _BIG_TENSORS[key]


#: Large tensors within one 16 MiB message: a 12 MiB float32 RGB image, a 2048 x 2048 x 3
#: uint8 image, a float64 batch of 28 x 28 images (6 MiB), a long float16 vector.
BIG_TENSOR_SHAPES = ((common_pb2.D_TYPE_FLOAT32, (1024, 1024, 3)),
                     (common_pb2.D_TYPE_UINT8, (2048, 2048, 3)),
                     (common_pb2.D_TYPE_FLOAT64, (1000, 28, 28, 1)),
                     (common_pb2.D_TYPE_FLOAT16, (4_000_000,)))


@st.composite
def tensors(draw: st.DrawFn) -> common_pb2.Tensor:
    """A tensor: valid 28x28x1 uint8, or a bad shape/dtype/data combination, or (rarely) a
    large one whose data match its shape."""
    kind = draw(st.integers(0, 5))
    if kind == 0:
        if draw(st.integers(0, 15)) == 0:
            return big_tensor(*draw(st.sampled_from(BIG_TENSOR_SHAPES)))
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


def png_header(width: int, height: int, *, truncated: bool = False, colour: int = 0,
               depth: int = 8) -> bytes:
    """A PNG whose IHDR declares ``width`` x ``height`` (its IDAT is a few bytes only)."""
    ihdr = _png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, depth, colour, 0, 0, 0))
    idat = _png_chunk(b"IDAT", zlib.compress(b"\x00" * 64))
    out = b"\x89PNG\r\n\x1a\n" + ihdr + idat + _png_chunk(b"IEND", b"")
    return out[: len(out) // 2] if truncated else out


def jpeg_header(width: int, height: int, components: int = 1) -> bytes:
    """A JPEG with an SOF0 frame declaring ``width`` x ``height`` and no scan data."""
    sof = b"\xff\xc0" + struct.pack(">HBHHB", 8 + 3 * components, 8, height, width,
                                     components) + \
        b"".join(bytes((i + 1, 0x11, 0)) for i in range(components))
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
#: (infra/serving/memory.py), refused from the headers alone.
LARGE_ENCODED = (png_header(6000, 6000), png_header(6000, 6000, colour=2),
                 png_header(6000, 6000, colour=6), jpeg_header(6000, 6000),
                 # 16-bit samples (2 bytes each: 288 MB alone, past the per-request budget),
                 # grey+alpha, palette (decoded as RGB), a CMYK JPEG, a 40 M-pixel strip
                 png_header(6000, 6000, colour=6, depth=16), png_header(6000, 6000, colour=4),
                 png_header(6000, 6000, colour=3), jpeg_header(6000, 6000, components=4),
                 jpeg_header(6000, 6000, components=3), png_header(40_000_000, 1),
                 png_header(6324, 6324, colour=2))


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

#: Surrogate names: built-ins (twins of a built-in target among them: fmnist-cnn, and the ports
#: mtcnn-surrogate and u2netp-surrogate, which a tenant without a white-box grant may not
#: name), other tasks' surrogates, a tenant's own name, names a surrogate may not have.
_SURROGATE_NAMES = ("fmnist-surrogate", "fmnist-mlp", "fmnist-cnn", "fmnist-cnn-at",
                    "mobilenet-v2", "efficientnet-lite0", "mtcnn-surrogate", "u2netp-surrogate",
                    "mine", "nope", "", "fmnist-cnn ", "FMNIST-CNN", "fmnist-cnn/../x", "*")


def surrogate_names() -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(_SURROGATE_NAMES), texts(huge=False),
                     st.sampled_from(_HUGE[:3]))


def ensembles() -> st.SearchStrategy[list[str]]:
    """Further surrogates of an ensemble: up to 12 (more than the bound of 8), repeats, the
    primary again, twins, hostile strings."""
    return st.one_of(st.lists(surrogate_names(), max_size=4),
                     st.lists(st.sampled_from(_SURROGATE_NAMES), min_size=8, max_size=12),
                     st.just(["fmnist-cnn"] * 9))


_MANY_LABELS = [f"c{i}" for i in range(100_001)]


@st.composite
def surrogate_models(draw: st.DrawFn) -> pt.SurrogateModel:
    """A tenant's surrogate definition: hostile sizes (a 100,000 x 100,000 input, 2^31
    classes), a blob id that is not one or names nothing, built-in names, label maps out of
    range, NaN normalisation, 100,001 labels."""
    m = pt.SurrogateModel(
        name=draw(st.one_of(st.sampled_from(("mine", "fmnist-cnn", "fmnist-surrogate", "", "a" * 200)),
                            texts(huge=False))),
        model=draw(_blob_ids), format=draw(enum_values(0, 1, 2)),
        height=draw(st.one_of(st.sampled_from((28, 0, -1, 1025, 100_000)), int32s)),
        width=draw(st.one_of(st.sampled_from((28, 0, 1_000_000)), int32s)),
        channels=draw(st.one_of(st.sampled_from((1, 3, 0, 2, 4)), int32s)),
        mean=draw(st.lists(floats, max_size=4)), std=draw(st.lists(floats, max_size=4)),
        target_classes=draw(st.one_of(st.sampled_from((10, 0, 2**31 - 1)), int32s)),
        task=draw(enum_values(0, 1, 2, 3)))
    if draw(st.integers(0, 20)) == 0:
        m.labels.extend(_MANY_LABELS)
    else:
        m.labels.extend(draw(st.lists(texts("shirt", huge=False), max_size=4)))
    for _ in range(draw(st.integers(0, 3))):
        m.label_map.add(surrogate_label=draw(int32s), target_label=draw(int32s))
    if draw(st.booleans()):
        o = m.outputs
        o.boxes = draw(int32s)
        o.scores = draw(int32s)
        o.mask_kind = draw(enum_values(0, 1, 2, 3))
    return m


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
        surrogate=draw(surrogate_names()), ensemble=draw(ensembles()),
        surrogate_models=draw(st.lists(surrogate_models(), max_size=2)))
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
        attack_id=draw(ids("square", "pgd", "fab", "mi_fgsm", "hsja", "pertknob", "fgsm")),
        task=draw(enum_values(0, 1, 2, 3)), output_kind=draw(enum_values(0, 1, 2, 3, 4, 5)),
        surrogate=draw(surrogate_names()), ensemble=draw(ensembles()))
    req.params.CopyFrom(draw(structs("epsilon", "norm", "ti_kernel", "max_queries",
                                     "property")))
    return draw(mutated(req, 2))


def _base_validate_surrogate() -> st.SearchStrategy[pt.ValidateAttackRequest]:
    """A valid transfer attack on a built-in surrogate (none of them a twin a tenant without
    a white-box grant may not name, unless the draw picks one), its ensemble mutated."""
    req = pt.ValidateAttackRequest(attack_id="pgd", task=common_pb2.TASK_TYPE_CLASSIFICATION,
                                   output_kind=common_pb2.OUTPUT_KIND_LABEL_ONLY,
                                   surrogate="fmnist-surrogate", ensemble=["fmnist-mlp"])
    req.params.update({"epsilon": 0.1, "norm": "linf"})
    return st.one_of(mutated(req, 2), st.builds(
        lambda s, e: _with_surrogates(req, s, e), surrogate_names(), ensembles()))


def _with_surrogates(base: pt.ValidateAttackRequest, surrogate: str, ensemble: list[str]
                     ) -> pt.ValidateAttackRequest:
    out = pt.ValidateAttackRequest()
    out.CopyFrom(base)
    out.surrogate = surrogate
    del out.ensemble[:]
    out.ensemble.extend(ensemble)
    return out


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
def _compute_large(draw: st.DrawFn) -> sc.ComputeRequest:
    """A metric's arrays as large as one message carries (tensors whose data match their
    shape), under the names the metrics read: the decoded-size budget and the decoder."""
    req = sc.ComputeRequest(metric=draw(st.sampled_from(("drr", "ndcg", "degradation_profile",
                                                         "canary.perturbation_cost"))))
    names = draw(st.lists(st.sampled_from(("perturbed_probs", "benign_class", "clean",
                                           "adversarial", "scores", "labels")),
                          min_size=1, max_size=2, unique=True))
    for name in names:
        req.arrays[name].CopyFrom(big_tensor(*draw(st.sampled_from(BIG_TENSOR_SHAPES))))
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
    for i in range(draw(st.sampled_from((0, 0, 1, 3, 8, 16)))):
        # example pictures whose headers declare large images: the renderer's decoded-size
        # budget (parts.examples), before any PNG is decoded
        pngs = st.one_of(st.sampled_from((*LARGE_ENCODED, *ENCODED)), st.binary(max_size=40))
        parts.examples.add(image_id=f"x{i}", setting=draw(texts("gaussian_noise", huge=False)),
                           kind=draw(enum_values(0, 1, 2, 3)), level=draw(int32s),
                           original_png=draw(pngs), perturbed_png=draw(pngs),
                           truth_mask_png=draw(st.one_of(st.just(b""), pngs)),
                           mask_classes=draw(st.lists(texts(huge=False), max_size=3)))
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
    #: Call metadata drawn for each case (None: the runner's own, a valid API key).
    metadata: st.SearchStrategy[tuple[tuple[str, str], ...]] | None = None
    #: Answers of a server-streaming call read before it is cancelled (health's Watch never
    #: ends by itself: its first answer is enough).
    max_items: int = 64
    #: False for the standard services every gRPC server may carry (health, reflection):
    #: their errors are gRPC's own, without Fortis's ErrorInfo; every other rule holds.
    fortis_errors: bool = True


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
    """Built from scratch, or a valid request (or stream) with hostile fields; for requests
    that carry images, also the valid request with large ones (the decoded-size budget)."""
    mut = _mutated_stream(base) if isinstance(base, list) else mutated(base)
    first = base[0] if isinstance(base, list) and base else base
    if isinstance(first, Message) and "images" in first.DESCRIPTOR.fields_by_name:
        return st.one_of(scratch, mut, _with_large_images(base))
    return st.one_of(scratch, mut)


def _put_images(msg: Message, images: list[common_pb2.Image]) -> None:
    field = msg.images  # type: ignore[attr-defined]
    del field[:]
    if msg.DESCRIPTOR.fields_by_name["images"].message_type.full_name.endswith("LabeledImage"):
        field.extend(pt.LabeledImage(image=img, labels=[0]) for img in images)
    else:
        field.extend(images)


@st.composite
def _with_large_images(draw: st.DrawFn, base: Any) -> Any:
    """``base`` (a request, or each message of a stream) whose images are replaced by ones
    that decode large: headers declaring 6000 x 6000 (up to 32 of them: 36 MB to 4.6 GB in
    all, each valid alone), a few small valid images beside them, or tensors whose data match
    a large shape; the request is otherwise valid, so the budget is what answers."""
    def one(msg: Message) -> Message:
        out = type(msg)()
        out.CopyFrom(msg)
        kind = draw(st.integers(0, 3))
        if kind == 0:
            imgs = draw(large_image_lists())
        elif kind == 1:
            imgs = draw(large_image_lists())[:draw(st.integers(1, 4))] + _valid_images(2)
        elif kind == 2:
            imgs = [common_pb2.Image(image_id=f"t{i}", tensor=big_tensor(*shape))
                    for i, shape in enumerate(draw(st.lists(
                        st.sampled_from(BIG_TENSOR_SHAPES[:2]), min_size=1, max_size=1)))]
        else:       # the same large header many times over: each alone fits, the sum not
            data = draw(st.sampled_from(LARGE_ENCODED[:4]))
            imgs = [common_pb2.Image(image_id=f"r{i}", encoded=data) for i in range(64)]
        _put_images(out, imgs)
        return out

    if isinstance(base, list):
        return [one(m) for m in base]
    return one(base)


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
    _case(_PT, "ValidateAttack", "uu", st.one_of(_either(_validate_attack(), _base_validate()),
                                                 _base_validate_surrogate()),
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
    # the caller's own usage today: an empty request, the tenant from the credentials alone
    _case(_PX, "GetTenantUsage", "uu", st.just(px.GetTenantUsageRequest()),
          px.GetTenantUsageResponse),
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
    _case(_SC, "Compute", "uu", st.one_of(_either(_compute(), _base_compute()),
                                          _compute_large()), sc.ComputeResponse),
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


# -- identity: API keys and bearer tokens -------------------------------------------------------
# A server with OpenID Connect (``--oidc-issuer``) reads ``authorization: Bearer <jwt>`` when a
# call has no API key. Every credential below must be refused UNAUTHENTICATED (or, when the
# identity provider cannot be reached, UNAVAILABLE), precisely and without quoting it, or
# accepted as exactly the tenant a valid token names; never INTERNAL.

_ASCII = st.characters(min_codepoint=0x20, max_codepoint=0x7E)


def _ascii(max_size: int) -> st.SearchStrategy[str]:
    """Printable ASCII: what gRPC lets a client put in a text metadata value at all."""
    return st.text(alphabet=_ASCII, max_size=max_size)


def _nested(open_: str, close: str, n: int) -> str:
    return open_ * n + close * n


def _malformed_jwts(idp: Any) -> list[str]:
    """Tokens shaped like JWTs that are not valid ones: wrong part counts, bad base64/JSON,
    headers that are not objects, deep nesting, huge numbers, NaN/Infinity, unknown or
    absurd kid/alg/crit, embedded keys (jwk/jku/x5u) that must be ignored."""
    from tests.fuzz.idp import b64
    head = b64(json.dumps({"alg": "RS256", "kid": "k-rsa"}))
    body = b64(json.dumps(idp.claims()))
    deep_obj = '{"a":' * 900 + "1" + "}" * 900
    huge_alg = '{"alg": 1' + "0" * 3000 + "}"
    nan_claims = '{"iss": NaN, "exp": Infinity}'
    out = ["", ".", "..", "...", "a", "a.b", "a.b.c", "a.b.c.d", f"{head}.{body}",
           f"{head}.{body}.", f"{head}..", f".{body}.", f"{head}.{body}.!!!!",
           f"{head}.{body}.{'A' * 342}", "!!!.###.$$$", "e30.e30.", "e30.e30.e30",
           f"{b64('[1]')}.{body}.", f"{b64('null')}.{body}.", f"{b64('1')}.{body}.",
           f"{b64(_nested('[', ']', 2000))}.{body}.", f"{head}.{b64(_nested('[', ']', 2000))}.",
           f"{b64(deep_obj)}.{body}.", f"{b64(huge_alg)}.{body}.", f"{head}.{b64(nan_claims)}.",
           f"{b64(bytes([0xff, 0xfe, 0x00]))}.{body}.", f"{head}.{b64(bytes([0xc3]))}.",
           head + "." + body + "." + "=" * 20, (head + ".") * 3]
    for header in ({"alg": "none"}, {"alg": "None"}, {"alg": "NONE"}, {"alg": ""},
                   {"alg": "HS256", "kid": "k-rsa"}, {"alg": "RS1"}, {"alg": ["RS256"]},
                   {"alg": None}, {"alg": "RS256", "kid": 5}, {"alg": "RS256", "kid": "k" * 300},
                   {"alg": "RS256", "kid": "../../etc/passwd"}, {"alg": "RS256", "kid": ""},
                   {"alg": "RS256", "crit": ["exp"]}, {"alg": "RS256", "crit": 5},
                   {"alg": "RS256", "b64": False, "crit": ["b64"]},
                   {"alg": "RS256", "kid": "k-rsa", "jwk": {"kty": "oct", "k": "AAAA"}},
                   {"alg": "RS256", "kid": "k-rsa", "jku": "http://127.0.0.1:1/keys"},
                   {"alg": "RS256", "kid": "k-rsa", "x5u": "file:///etc/passwd"},
                   {"alg": "ES256", "kid": "k-rsa"}, {"alg": "EdDSA", "kid": "k-rsa"}):
        out.append(f"{b64(json.dumps(header))}.{body}.")
        out.append(f"{b64(json.dumps(header))}.{body}.{b64(b'x' * 256)}")
    return out


def _signed_hostile(idp: Any) -> list[str]:
    """Tokens the issuer's own key signed whose claims are hostile (a broken or compromised
    IdP): non-numeric, NaN, infinite and 4000-digit times, odd audiences and issuers, tenant
    claims that are not tenant names (the internal service's ``*`` among them), a payload
    nested 900 deep, duplicate keys, lone surrogates; and valid tokens of other kinds
    (expired, not yet valid, wrong audience or issuer, another key, an EC key)."""
    def raw(field: str, text: str, **extra: Any) -> str:
        claims = idp.claims(**extra)
        claims[field] = "@@"
        return idp.raw_signed({}, json.dumps(claims).replace('"@@"', text))

    out = [raw("exp", v) for v in ("Infinity", "-Infinity", "NaN", "1e400", "1" + "0" * 4000,
                                   "1e300", "[1]", "{}", "true", '"1"', "null")]
    out += [raw("iat", v) for v in ("Infinity", "NaN", "1" + "0" * 400, '"x"')]
    out += [raw("nbf", v) for v in ("Infinity", "-Infinity", "NaN", "-1" + "0" * 400,
                                    "99999999999")]
    out += [raw("aud", v) for v in ("{}", "[]", "[1, 2]", '[["fortis"]]', "5", '"other"',
                                    '"' + "a" * 3000 + '"')]
    out += [raw("iss", v) for v in ("[1]", "5", '"http://127.0.0.1:1/other"', '""')]
    out += [raw("tenant", v) for v in ('"*"', '""', '"../x"', '"' + "t" * 65 + '"',
                                       '"tenant-a\\n"', '"\\ud800"', "5", '["tenant-a"]',
                                       '{"a": 1}', "null", '"tenant-b"', '"default"')]
    out += [raw("sub", v) for v in ('"' + "s" * 5000 + '"', '{"a": [1]}', "1e308")]
    claims = json.dumps(idp.claims())
    out += [idp.raw_signed({}, claims[:-1] + ', "x": ' + _nested("[", "]", 900) + "}"),
            idp.raw_signed({}, claims[:-1] + ', "x": ' + _nested("[", "]", 3000) + "}"),
            idp.raw_signed({}, claims[:-1] + ', "tenant": "tenant-b"}'),
            idp.raw_signed({}, "[1, 2]"), idp.raw_signed({}, '"x"'),
            idp.raw_signed({"kid": "zzz-unknown"}, claims), idp.raw_signed('{"alg":"RS256"}', claims),
            idp.raw_signed({"kid": "k-ec"}, claims)]
    now = int(__import__("time").time())
    out += [idp.token(exp=now - 3600), idp.token(nbf=now + 3600), idp.token(aud="other"),
            idp.token(iss=idp.issuer + "/"), idp.token(key=idp.stranger), idp.token("k-ec"),
            idp.token(tenant=None), idp.token(exp=None), idp.token(aud=None), idp.token(iss=None),
            idp.unsigned({"alg": "none", "kid": "k-rsa"}),
            idp.unsigned({"alg": "HS256", "kid": "k-rsa"}, hmac_key=idp.public_pem())]
    return out


def auth_metadata(idp: Any, api_key: str) -> st.SearchStrategy[tuple[tuple[str, str], ...]]:
    """Metadata of one call: an ``authorization`` value (valid tokens, tokens refused for each
    reason, malformed JWTs, garbage, 9 to 20 KB values, other schemes), sometimes an API key
    (valid, unknown, huge, empty) beside or instead of it, and a forged ``x-fortis-tenant``."""
    valid = [idp.token(), idp.token("k-ec"), idp.token(tenant="tenant-b"),
             idp.token(tenant="t-" + "x" * 62)]
    tokens = st.one_of(
        st.sampled_from(valid), st.sampled_from(_signed_hostile(idp)),
        st.sampled_from(_malformed_jwts(idp)), _ascii(60),
        st.sampled_from(("A" * 9000, "A" * 16_000, "A" * 16_385, "A" * 20_000,
                         "a." * 4000 + "a")),
        st.builds(lambda t, n: t + "." + "B" * n, st.sampled_from(valid),
                  st.sampled_from((10, 4000, 12_000))))
    schemes = st.sampled_from(("Bearer ", "bearer ", "BEARER ", "Bearer  ", "Basic ", "",
                               "Bearer", "Token ", "Bearer x ", "Bearer Bearer "))

    @st.composite
    def build(draw: st.DrawFn) -> tuple[tuple[str, str], ...]:
        md: list[tuple[str, str]] = []
        if draw(st.integers(0, 9)):
            md.append(("authorization", draw(schemes) + draw(tokens)))
            if draw(st.integers(0, 15)) == 0:      # a second authorization header
                md.append(("authorization", "Bearer " + draw(tokens)))
        if draw(st.integers(0, 4)) == 0:
            md.append(("x-api-key", draw(st.one_of(
                st.sampled_from((api_key, "", "x" * 9000, "fuzz-key-tenant-b", api_key + " ")),
                _ascii(40)))))
        if draw(st.integers(0, 5)) == 0:
            md.append(("x-fortis-tenant", draw(st.one_of(
                st.sampled_from(("tenant-b", "*", "default", "x" * 300)), _ascii(20)))))
        return tuple(md)

    return build()


#: Valid requests of a few RPCs of each service for the credential cases: the identity checks
#: run before any request is read, so the request stays valid (and a valid token's call runs).
_AUTH_REQUESTS: dict[str, tuple[str, str, str, Message, Any]] = {
    "EvaluationService.ListEvaluations": (_EV, "ListEvaluations", "uu",
                                          ev.ListEvaluationsRequest(page_size=5),
                                          ev.ListEvaluationsResponse),
    "EvaluationService.ValidatePlan": (_EV, "ValidatePlan", "uu",
                                       ev.ValidatePlanRequest(plan=PLAN_BASE),
                                       ev.ValidatePlanResponse),
    "EvaluationService.WatchEvaluation": (_EV, "WatchEvaluation", "us",
                                          ev.WatchEvaluationRequest(evaluation_id="ev-1"),
                                          ev.WatchEvaluationResponse),
    "UploadService.ListBlobs": (_UP, "ListBlobs", "uu", up.ListBlobsRequest(),
                                up.ListBlobsResponse),
    "TargetProxyService.GetTargetInfo": (_PX, "GetTargetInfo", "uu",
                                         px.GetTargetInfoRequest(target=FUZZ_TARGET),
                                         px.GetTargetInfoResponse),
    "PerturbationService.ValidateAttack": (_PT, "ValidateAttack", "uu", _base_validate(),
                                           pt.ValidateAttackResponse),
    "ScoringService.Compute": (_SC, "Compute", "uu", _base_compute(), sc.ComputeResponse),
    "ReportService.RenderReport": (_RP, "RenderReport", "uu", rp.RenderReportRequest(),
                                   rp.RenderReportResponse),
}
#: Names of the credential cases (``auth_cases``).
AUTH_RPC_NAMES = tuple(f"Auth.{name}" for name in _AUTH_REQUESTS)


def auth_cases(idp: Any, api_key: str) -> dict[str, RpcCase]:
    """The RPCs of ``_AUTH_REQUESTS``, each sent with ``auth_metadata`` of ``idp``'s tokens
    and tenant-a's ``api_key``."""
    md = auth_metadata(idp, api_key)
    return {f"Auth.{name}": RpcCase(f"/{svc}/{method}", shape, st.just(req), resp, md)
            for name, (svc, method, shape, req, resp) in _AUTH_REQUESTS.items()}


# -- what every Fortis server serves besides its contracts ----------------------------------------

def _served_cases() -> dict[str, RpcCase]:
    """gRPC health (Check, Watch) and server reflection, which every Fortis server registers:
    unknown service names, huge names, symbols that do not exist, bad file names."""
    from grpc_health.v1 import health_pb2
    from grpc_reflection.v1alpha import reflection_pb2 as rf

    names = texts("", "fortis.evaluation.v1.EvaluationService", "grpc.health.v1.Health")
    reflect = st.one_of(
        st.builds(rf.ServerReflectionRequest, host=texts("", huge=False),
                  list_services=texts("", "*", huge=False)),
        st.builds(rf.ServerReflectionRequest, file_by_filename=texts(
            "fortis/evaluation/v1/evaluation.proto", "google/protobuf/struct.proto")),
        st.builds(rf.ServerReflectionRequest, file_containing_symbol=texts(
            "fortis.evaluation.v1.EvaluationService", "fortis.common.v1.Tensor",
            "google.rpc.Status")),
        st.builds(rf.ServerReflectionRequest, all_extension_numbers_of_type=texts(
            "google.protobuf.Struct")),
        st.builds(rf.ServerReflectionRequest, file_containing_extension=st.builds(
            rf.ExtensionRequest, containing_type=texts("fortis.common.v1.Tensor"),
            extension_number=int32s)))
    health = st.builds(health_pb2.HealthCheckRequest, service=names)
    reflections = st.lists(reflect, max_size=4)
    return {
        "Health.Check": RpcCase("/grpc.health.v1.Health/Check", "uu", health,
                                health_pb2.HealthCheckResponse, fortis_errors=False),
        "Health.Watch": RpcCase("/grpc.health.v1.Health/Watch", "us", health,
                                health_pb2.HealthCheckResponse, max_items=1,
                                fortis_errors=False),
        "ServerReflection.ServerReflectionInfo": RpcCase(
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", "ss",
            reflections, rf.ServerReflectionResponse, fortis_errors=False),
        # v1 has v1alpha's messages under another package name: the same bytes on the wire
        "ServerReflection.v1.ServerReflectionInfo": RpcCase(
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", "ss",
            reflections, rf.ServerReflectionResponse, fortis_errors=False)}


#: Health and reflection, served by every Fortis server beside the contracts.
SERVED_RPCS: dict[str, RpcCase] = _served_cases()
