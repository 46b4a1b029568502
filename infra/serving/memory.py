"""Memory as a budget: what a request will take once decoded, known before anything is
decoded, and held against per-request and per-tenant in-flight limits.

Checking each image against the pixel limit alone let one request of sixteen small PNGs
declaring 6000x6000 grey pixels (a 547 KiB message) grow a server by 3 GiB, and sixteen such
calls of one tenant could take the machine down for every tenant. So every request's decoded
size -- the sum over its images of width x height x channels x bytes per sample read from the
PNG/JPEG header, and over its tensors of their shape's elements x the dtype's size -- is
computed from the message alone (no pixel decoded) and:

* refused past :data:`~fortis.services.common.limits.MAX_REQUEST_DECODED_BYTES` (one request);
* held in the tenant's in-flight budget
  (:data:`~fortis.services.common.limits.MAX_TENANT_DECODED_BYTES`) until the call ends --
  answered, failed or cancelled -- and refused when the tenant's calls in progress already
  hold too much;
* compared, for the RPCs whose answer carries images (perturbed images, adversarials), with
  the largest response message before the work starts: the work is not done when its answer
  could never be sent.

Each refusal is RESOURCE_EXHAUSTED with a google.rpc.QuotaFailure whose subject names the
field (``images``, ``images[3]``, ``arrays.x``, ``parts.examples``), raised before the
servicer sees the request, so nothing else in the service is affected.

Calls between Fortis's own services (the internal key acting for a tenant) are held to the
per-request and response limits but not counted in the tenant's in-flight budget: the
evaluation workers that make them are bounded already, and counting them would let a
tenant's own direct calls stall its evaluations (the same rule as the calls-per-tenant slots).

Bidirectional streams answer each message in band: their servicers hold each message with
:func:`holding` (refusals become that message's error; the stream goes on).

Pure code: protobuf messages, no gRPC.
"""

from __future__ import annotations

import contextlib
import contextvars
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final

from fortis.services.common import limits
from fortis.services.common.codec import MAX_PIXELS, image_header_size
from fortis.services.common.errors import QuotaExceeded, QuotaViolation
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

__all__ = ["CallHold", "MemoryBudget", "MemoryLimits", "Sized", "check_answer", "decoded_sizes",
           "holding", "image_bytes", "response_bytes"]

_IMAGE: Final = "fortis.common.v1.Image"
_TENSOR: Final = "fortis.common.v1.Tensor"
_UPLOAD: Final = "fortis.evaluation.v1.UploadBlobRequest"
#: Bytes per element of each DType enum value (unknown dtypes size 0: the codec refuses them).
_DTYPE_BYTES: Final = {1: 1, 2: 4, 3: 8, 4: 2, 5: 4, 6: 8, 7: 1}
#: Channels a PNG's colour type decodes to (grey, RGB, palette -> RGB, grey+alpha, RGBA).
_PNG_CHANNELS: Final = {0: 1, 2: 3, 3: 3, 4: 2, 6: 4}
#: Fields of encoded pictures that are plain ``bytes`` (the report's example PNGs).
_PNG_SUFFIX: Final = "_png"


#: Requests at least this large (bytes, as received) are checked against their tenant's
#: in-flight limit before they are parsed (:meth:`MemoryBudget.check_carried`).
CARRIED_CHECK_MIN_BYTES: Final = 1024 * 1024


@dataclass(frozen=True)
class MemoryLimits:
    """The limits one server applies (``fortis serve --max-request-decoded-bytes``,
    ``--max-tenant-decoded-bytes``; the response limit is the message limit,
    ``--max-message-bytes``). 0 turns a limit off."""

    max_request_bytes: int = limits.MAX_REQUEST_DECODED_BYTES
    max_tenant_bytes: int = limits.MAX_TENANT_DECODED_BYTES
    max_response_bytes: int = limits.MAX_MESSAGE_BYTES

    def __post_init__(self) -> None:
        for name in ("max_request_bytes", "max_tenant_bytes", "max_response_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a whole number of bytes >= 0 (0: no limit)")


@dataclass(frozen=True)
class Sized:
    """One image or tensor of a request: its field as the caller wrote it, and its decoded
    bytes (``top`` the request's field that holds it: ``images``, ``arrays``)."""

    field: str
    top: str
    bytes: int
    #: An image's (height, width, channels); None for other tensors.
    hwc: tuple[int, int, int] | None = None


def image_bytes(data: bytes) -> tuple[int, int, int, int] | None:
    """(height, width, channels, bytes per sample) a PNG or JPEG declares in its header, read
    without decoding a pixel; None when it is neither, or declares an image the codec refuses
    on its own (empty, past the pixel limit): that refusal names the field already."""
    size = image_header_size(data)
    if size is None:
        return None
    w, h = size
    if w <= 0 or h <= 0 or w * h > MAX_PIXELS:
        return None
    if data[:4] == b"\x89PNG":
        depth = data[24] if len(data) > 25 else 8
        return h, w, _PNG_CHANNELS.get(data[25] if len(data) > 25 else 0, 4), \
            2 if depth == 16 else 1
    return h, w, _jpeg_components(data), 1


def _jpeg_components(data: bytes) -> int:
    """Components of a JPEG's first frame (1 grey, 3 colour, 4 CMYK); 3 when unreadable."""
    i, n = 2, len(data)
    while i + 3 < n:
        marker = data[i + 1]
        if data[i] != 0xFF:
            break
        if marker == 0xFF:
            i += 1
            continue
        if marker in (0x01, 0xD8, 0xD9) or 0xD0 <= marker <= 0xD7:
            i += 2
            continue
        length = int.from_bytes(data[i + 2:i + 4], "big")
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            return data[i + 9] if i + 9 < n and data[i + 9] in (1, 3, 4) else 3
        i += 2 + max(length, 2)
    return 3


def _tensor_bytes(t: Message) -> int:
    """Elements x dtype size a Tensor declares; 0 when the codec will refuse it anyway (no
    shape, a dimension <= 0, an unknown dtype, data not matching the shape)."""
    item = _DTYPE_BYTES.get(t.dtype, 0)         # type: ignore[attr-defined]
    shape = list(t.shape)                       # type: ignore[attr-defined]
    if not item or not shape or len(shape) > limits.MAX_TENSOR_DIMS or any(s <= 0 for s in shape):
        return 0
    n = 1
    for s in shape:
        n *= s
    return n * item if n * item == len(t.data) else 0   # type: ignore[attr-defined]


def _image(img: Message, field: str, top: str) -> Sized | None:
    kind = img.WhichOneof("content")
    if kind == "encoded":
        dims = image_bytes(img.encoded)         # type: ignore[attr-defined]
        if dims is None:
            return None
        h, w, c, b = dims
        return Sized(field, top, h * w * c * b, (h, w, c))
    if kind == "tensor":
        t = img.tensor                          # type: ignore[attr-defined]
        n = _tensor_bytes(t)
        if not n:
            return None
        shape = list(t.shape)
        hwc = (shape[0], shape[1], shape[2] if len(shape) == 3 else 1) \
            if len(shape) in (2, 3) else None
        return Sized(field, top, n, hwc)
    return None


_REACH: dict[str, bool] = {}


def _reaches(md: Descriptor) -> bool:
    """Whether a message of type ``md`` can hold an image, a tensor or a ``*_png`` field
    (cached: only those branches of a request are walked, so a message of a million scores
    costs nothing here)."""
    name = md.full_name
    if name in _REACH:
        return _REACH[name]
    _REACH[name] = False                        # recursive types: assume no while looking
    found = name in (_IMAGE, _TENSOR) or any(
        (f.type == FieldDescriptor.TYPE_BYTES and f.name.endswith(_PNG_SUFFIX))
        or (f.message_type is not None and not f.message_type.full_name.startswith("google.")
            and _reaches(f.message_type))
        for f in md.fields)
    _REACH[name] = found
    return found


def decoded_sizes(msg: Message) -> list[Sized]:
    """Every image and tensor of a request with its decoded size, from headers and shapes
    alone. Iterative (a deeply nested message must not exhaust the stack)."""
    out: list[Sized] = []
    if not isinstance(msg, Message):
        return out                  # raw bytes of a handler without a deserializer
    if msg.DESCRIPTOR.full_name == _UPLOAD:
        # An upload's chunk is held while it is hashed and written (its image is checked
        # from its header by the blob store, and decoded only by a later request).
        chunk = msg.chunk if msg.WhichOneof("part") == "chunk" else b""  # type: ignore[attr-defined]
        return [Sized("chunk", "chunk", len(chunk))] if chunk else []
    if not _reaches(msg.DESCRIPTOR):
        return out
    stack: list[tuple[Message, str, str]] = [(msg, "", "")]
    while stack:
        node, prefix, top = stack.pop()
        for fd, value in node.ListFields():
            path = f"{prefix}{fd.name}"
            here_top = top or fd.name
            if fd.type == FieldDescriptor.TYPE_BYTES:
                if fd.name.endswith(_PNG_SUFFIX) and not fd.is_repeated:
                    dims = image_bytes(value)
                    if dims is not None:
                        h, w, c, b = dims
                        out.append(Sized(path, top_of(path, top), h * w * c * b, (h, w, c)))
                continue
            sub = fd.message_type
            if sub is None or sub.full_name.startswith("google.") or not _reaches(sub):
                continue
            if sub.GetOptions().map_entry:
                for key in value:
                    _visit(value[key], f"{path}.{str(key)[:limits.MAX_ECHO_CHARS]}", here_top,
                           stack, out)
            elif fd.is_repeated:
                for i, item in enumerate(value):
                    _visit(item, f"{path}[{i}]", here_top, stack, out)
            else:
                _visit(value, path, here_top, stack, out)
    return out


def top_of(path: str, top: str) -> str:
    """The field a refusal of the whole request names: the request's own field, or for the
    report's nested parts the list that holds the pictures (``parts.examples``)."""
    head = path.split("[", 1)[0]
    return head if "." in head else (top or head)


def _visit(value: Message, path: str, top: str, stack: list[tuple[Message, str, str]],
           out: list[Sized]) -> None:
    name = value.DESCRIPTOR.full_name
    if name == _IMAGE:
        s = _image(value, path, top)
        if s is not None:
            out.append(s)
    elif name == _TENSOR:
        n = _tensor_bytes(value)
        if n:
            out.append(Sized(path, top, n))
    else:
        stack.append((value, f"{path}.", top))


# -- responses -------------------------------------------------------------------------------

#: Bytes of one image in an answer besides its pixels (id, shape, framing).
_ANSWER_OVERHEAD: Final = 512


def _images_out(sizes: list[Sized]) -> list[tuple[str, int]]:
    return [(s.top, s.bytes + _ANSWER_OVERHEAD) for s in sizes if s.hwc is not None]


def _one_message(sizes: list[Sized]) -> list[tuple[str, int]]:
    """Every image comes back in one message (uint8, its declared size: raw tensors, or PNG
    which stores the same pixels)."""
    out = _images_out(sizes)
    return [(out[0][0], sum(b for _, b in out))] if out else []


def _per_image_attack(sizes: list[Sized]) -> list[tuple[str, int]]:
    """One message per attacked image: the adversarial as uint8 and as float32 (5 bytes a
    sample); each image's message must fit, and the largest names its field."""
    out = []
    for s in sizes:
        if s.hwc is not None and s.field.endswith(".image"):
            h, w, c = s.hwc
            out.append((s.field, 5 * h * w * c + _ANSWER_OVERHEAD))
    return [max(out, key=lambda fb: fb[1])] if out else []


#: Methods whose answer carries images, and the largest answer message they would send.
RESPONSES: Final[dict[str, Callable[[list[Sized]], list[tuple[str, int]]]]] = {
    "/fortis.perturbation.v1.PerturbationService/ApplyPerturbation": _one_message,
    "/fortis.perturbation.v1.PerturbationService/ApplyPerturbationStream": _one_message,
    "/fortis.perturbation.v1.PerturbationService/RunAttack": _per_image_attack,
}


def response_bytes(method: str, sizes: list[Sized]) -> list[tuple[str, int]]:
    """(field, bytes) of the largest answer message ``method`` would send for a request of
    these images; empty when its answers carry no images."""
    estimate = RESPONSES.get(method)
    return estimate(sizes) if estimate is not None else []


# -- the budget ------------------------------------------------------------------------------


def _mib(n: int) -> str:
    return f"{n:,} bytes ({n / 2**20:,.1f} MiB)"


class MemoryBudget:
    """Per-tenant decoded bytes in flight on one server, against :class:`MemoryLimits`.

    :meth:`admit` checks one request (per-request, response and tenant limits) and holds its
    bytes until the returned release is called; tenants with nothing held are forgotten.
    Never waits: a request past a limit is refused at once, holding no thread. Thread-safe."""

    def __init__(self, settings: MemoryLimits | None = None) -> None:
        self.settings = settings or MemoryLimits()
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()

    def held(self, tenant: str) -> int:
        with self._lock:
            return self._held.get(tenant, 0)

    def check(self, method: str, msg: Message) -> int:
        """The request's decoded bytes, after the per-request and response limits
        (QuotaExceeded naming the field when past one)."""
        sizes = decoded_sizes(msg)
        total = sum(s.bytes for s in sizes)
        cfg = self.settings
        if cfg.max_request_bytes and total > cfg.max_request_bytes:
            alone = [s for s in sizes if s.bytes > cfg.max_request_bytes]
            if alone:
                s = min(alone, key=lambda x: _natural(x.field))     # the first, as sent
                raise QuotaExceeded([QuotaViolation(
                    s.field, f"declares {_mib(s.bytes)} once decoded; at most "
                    f"{_mib(cfg.max_request_bytes)} per request (--max-request-decoded-bytes)")])
            tops: dict[str, int] = {}
            for s in sizes:
                tops[s.top] = tops.get(s.top, 0) + s.bytes
            field = max(tops, key=lambda k: tops[k])
            raise QuotaExceeded([QuotaViolation(
                field, f"{len(sizes)} images and arrays declare {_mib(total)} once decoded "
                f"(from their headers and shapes); at most {_mib(cfg.max_request_bytes)} per "
                "request (--max-request-decoded-bytes): send fewer or smaller in each")])
        if cfg.max_response_bytes:
            for field, n in response_bytes(method, sizes):
                if n > cfg.max_response_bytes:
                    raise QuotaExceeded([QuotaViolation(
                        field, f"the answer would be {_mib(n)}, more than the largest message "
                        f"of {_mib(cfg.max_response_bytes)} (--max-message-bytes); nothing was "
                        "done: send fewer or smaller images in each request")])
        return total

    def admit(self, tenant: str, method: str, msg: Message, *, counted: bool = True
              ) -> Callable[[], None]:
        """Check ``msg`` and hold its bytes for ``tenant`` (``counted`` False: checked, not
        held -- calls between Fortis's services); returns the release (call it once)."""
        n = self.check(method, msg)
        if not counted or not n:
            return _nothing
        limit = self.settings.max_tenant_bytes
        with self._lock:
            held = self._held.get(tenant, 0)
            if limit and held + n > limit:
                field = _field_of(msg)
                raise QuotaExceeded([QuotaViolation(
                    field, f"declares {_mib(n)} once decoded while this tenant's calls in "
                    f"progress hold {_mib(held)}; at most {_mib(limit)} in flight per tenant "
                    "(--max-tenant-decoded-bytes): retry when one has finished")])
            self._held[tenant] = held + n
        return _Release(self, tenant, n)

    def check_carried(self, tenant: str, n: int) -> None:
        """Before a request of ``n`` bytes is parsed: refused when ``tenant``'s calls in
        progress already hold something, and more than the tenant limit less ``n``. The
        request's own bytes are memory its call holds too, and images decode to about as
        many bytes as carry them or more, so a request of images would be refused once
        parsed; refused here, its bytes are never copied into a message (a client that
        retries a refused 64 MiB request at once otherwise has the server parse it again
        each time, holding the interpreter lock every other call needs). Requests under
        ``CARRIED_CHECK_MIN_BYTES`` are parsed first, whatever the tenant holds."""
        limit = self.settings.max_tenant_bytes
        if not limit or n < CARRIED_CHECK_MIN_BYTES:
            return
        with self._lock:
            held = self._held.get(tenant, 0)
        # a tenant holding nothing gets its request parsed: the refusal then names the field
        if held and held + n > limit:
            raise QuotaExceeded([QuotaViolation(
                "request", f"carries {_mib(n)} while this tenant's calls in progress hold "
                f"{_mib(held)}; at most {_mib(limit)} in flight per tenant "
                "(--max-tenant-decoded-bytes): retry when one has finished")])

    def _give_back(self, tenant: str, n: int) -> None:
        with self._lock:
            left = self._held.get(tenant, 0) - n
            if left > 0:
                self._held[tenant] = left
            else:
                self._held.pop(tenant, None)


def _natural(field: str) -> tuple[Any, ...]:
    """Sort key of a field path in the order a caller wrote it (``images[2]`` before
    ``images[10]``)."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", field))


def _nothing() -> None:
    return None


def _field_of(msg: Message) -> str:
    sizes = decoded_sizes(msg)
    return sizes[0].top if sizes else "request"


class _Release:
    """Gives a hold back once, however many times it is called (the handler's end and the
    RPC's termination both call it)."""

    def __init__(self, budget: MemoryBudget, tenant: str, n: int) -> None:
        self._budget, self._tenant, self._n = budget, tenant, n
        self._lock = threading.Lock()

    def __call__(self) -> None:
        with self._lock:
            n, self._n = self._n, 0
        if n:
            self._budget._give_back(self._tenant, n)


class CallHold:
    """What one call holds: the server's interceptor makes one per call, installs it for the
    servicer (:func:`holding`) and closes it when the call terminates, so a cancelled stream
    whose handler never resumes gives everything back."""

    def __init__(self, budget: MemoryBudget, tenant: str, method: str, counted: bool) -> None:
        self.budget, self.tenant, self.method, self.counted = budget, tenant, method, counted
        self._releases: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        self._closed = False

    def check_carried(self, n: int) -> None:
        """A request of ``n`` bytes, before it is parsed (:meth:`MemoryBudget.check_carried`);
        calls between Fortis's services are not counted."""
        if self.counted:
            self.budget.check_carried(self.tenant, n)

    def hold(self, msg: Message) -> Callable[[], None]:
        release = self.budget.admit(self.tenant, self.method, msg, counted=self.counted)
        with self._lock:
            if self._closed:
                release()
                return _nothing
            self._releases.append(release)
        return release

    def close(self) -> None:
        with self._lock:
            self._closed = True
            releases, self._releases = self._releases, []
        for r in releases:
            r()


current_hold: contextvars.ContextVar[CallHold | None] = contextvars.ContextVar(
    "fortis_memory_hold", default=None)


@contextlib.contextmanager
def holding(msg: Message) -> Iterator[None]:
    """Hold one message of a bidirectional stream while it is worked on (QuotaExceeded, for
    the servicer to answer in band, when past a limit). No budget installed (a servicer
    called directly, not through a server): nothing is checked."""
    hold = current_hold.get()
    if hold is None:
        yield
        return
    release = hold.hold(msg)
    try:
        yield
    finally:
        release()


def check_answer(msg: Message, bytes_per_pixel: int) -> None:
    """Refuse, before any work, a request whose answer would carry ``bytes_per_pixel`` for
    every pixel of its images (a segmentation target's class maps and probabilities) and so
    be past the largest message: QuotaExceeded naming ``images``. Only the servicer knows the
    answer's form (the target's task); no budget installed: nothing is checked."""
    hold = current_hold.get()
    limit = hold.budget.settings.max_response_bytes if hold is not None else 0
    if not limit or bytes_per_pixel <= 0:
        return
    sizes = [s for s in decoded_sizes(msg) if s.hwc is not None]
    n = sum(h * w * bytes_per_pixel + _ANSWER_OVERHEAD
            for h, w, _ in (s.hwc for s in sizes if s.hwc is not None))
    if n > limit:
        raise QuotaExceeded([QuotaViolation(
            sizes[0].top, f"the answer would be about {_mib(n)} ({bytes_per_pixel} bytes a "
            f"pixel), more than the largest message of {_mib(limit)} (--max-message-bytes); "
            "nothing was sent: send fewer or smaller images in each request")])


def stream_holding(hold: CallHold, requests: Iterator[Any]) -> Iterator[Any]:
    """A client stream's messages, each held from when it is read until the next one is
    (uploads: the chunk being written), refusing one past a limit."""
    release: Callable[[], None] = _nothing
    try:
        for msg in requests:
            release()
            release = hold.hold(msg) if isinstance(msg, Message) else _nothing
            yield msg
    finally:
        release()
