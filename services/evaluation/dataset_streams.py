"""Datasets kept as streams of samples (IEEE-P3): WebDataset tar shards and Hugging Face
``save_to_disk`` folders, read from a :class:`~.dataset_store.DataStore` (the data root or an
S3 prefix) for classification and detection plans. Domain code.

WebDataset (``dataset: {source: webdataset, path: "shards/val-{000..009}.tar"}``)
    ``path`` names the shards, relative to the store, with brace patterns (``{000..009}``
    zero-padded ranges, ``{a,b}`` alternatives; at most :data:`MAX_SHARDS` names). Each shard
    is read as a stream with :mod:`tarfile` -- never extracted, never seeked -- and stops
    being read once the selected samples (``offset``/``limit``) are complete. Members are
    grouped into samples by key (the member path up to the first dot of its file name, as
    WebDataset does); a sample is its image (``.jpg``, ``.jpeg``, ``.png``) plus its label:
    classification ``.cls`` (an integer as text) or ``.json`` ``{"label": N or "name"}``;
    detection ``.json`` ``{"boxes": [[...], ...], "labels": [...], "box_format": "xyxy"}``
    (``box_format`` defaults to the plan's ``dataset.box_format``). Links, devices, FIFOs,
    absolute member names and names with ``..`` are refused with an error naming the shard and
    the member (a tar is not trusted to say where things go, even though nothing is written);
    each member is bounded by :data:`MAX_MEMBER_BYTES`, a shard's member count by
    :data:`MAX_SHARD_MEMBERS` and the bytes streamed by :data:`MAX_STREAM_BYTES`.
Hugging Face (``source: hf``) and class folders (``source: folders``)
    ``dataset_hf.py``, ``dataset_folders.py``; ``dataset_sources.py`` picks the reader.

Labels (IEEE-P6): a label given by name (a ``ClassLabel``'s name, a WebDataset ``.json``
name) is mapped through ``dataset.label_map``; integers are kept, or mapped when the map
names them. Once a map is given every class used must be in it, as for COCO and VOC.
"""

from __future__ import annotations

import json
import re
import tarfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

import numpy as np
from fortis.core.task import BOX_FORMATS, Task
from fortis.services.common.errors import InvalidArgument
from fortis.services.common.paths import relative_path
from fortis.services.evaluation.dataset_files import MAX_ID_CHARS, MAX_IMAGE_BYTES, decode, utf8
from fortis.services.evaluation.dataset_files import short as _short
from fortis.services.evaluation.dataset_formats import MAX_OBJECTS_PER_IMAGE, _label
from fortis.services.evaluation.dataset_store import DataStore
from fortis.services.evaluation.plan import Plan
from fortis.services.evaluation.plan_model import UploadLocation

__all__ = [
    "MAX_MEMBER_BYTES",
    "MAX_SHARDS",
    "MAX_SHARD_MEMBERS",
    "MAX_STREAM_BYTES",
    "Sample",
    "expand_braces",
    "read_webdataset",
]

#: Shard names one pattern may expand to.
MAX_SHARDS = 1000
#: Largest tar member read or skipped, bytes (an image, a label file).
MAX_MEMBER_BYTES = MAX_IMAGE_BYTES
#: Members (headers) of one shard.
MAX_SHARD_MEMBERS = 1_000_000
#: Bytes streamed through tar members over all shards of one read (what skipping costs too).
MAX_STREAM_BYTES = 8 * 1024**3
#: Largest label (.cls / .json) member, bytes.
MAX_LABEL_BYTES = 1024 * 1024
#: Largest tar extended header (a pax record set, a GNU long name), and the pax records kept
#: across members by global headers, bytes: tarfile reads such a header whole into memory, so
#: its declared size (up to 8 GiB, or any size in base-256) must be refused before it is read.
MAX_TAR_HEADER_BYTES = 64 * 1024
#: Extended headers chained before one member (tarfile follows each one recursively).
MAX_TAR_HEADER_CHAIN = 8
_IMAGE_EXTS = ("jpg", "jpeg", "png")


@dataclass(frozen=True)
class Sample:
    """One image: id, RGB pixels (None when only checked), classification labels (mapped),
    detection truth ``{boxes, labels, box_format, label_base, image_size}`` or None."""

    id: str
    image: np.ndarray | None
    labels: tuple[int, ...] = ()
    truth: dict[str, Any] | None = None


# -- shared ----------------------------------------------------------------------------------


def _finite(v: Any, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not np.isfinite(v):
        raise InvalidArgument(where, f"must be a finite number, got {_short(v)}")
    return float(v)


def _boxes(raw: Any, where: str) -> list[list[float]]:
    if not isinstance(raw, list | tuple):
        raise InvalidArgument(where, "a list of boxes (4 numbers each) is needed")
    if len(raw) > MAX_OBJECTS_PER_IMAGE:
        raise InvalidArgument(where, f"more than {MAX_OBJECTS_PER_IMAGE} objects")
    out = []
    for k, b in enumerate(raw):
        if not isinstance(b, list | tuple) or len(b) != 4:
            raise InvalidArgument(f"{where}[{k}]", "a box is 4 numbers")
        out.append([_finite(x, f"{where}[{k}][{n}]") for n, x in enumerate(b)])
    return out


def _class(lm: Mapping[int | str, int], v: Any, names: list[str] | None, where: str) -> int:
    """A dataset class (an integer, or a name) as the service's label (IEEE-P6)."""
    if isinstance(v, str):
        return _label(lm, None, v[:256], where)
    if isinstance(v, bool) or not isinstance(v, int):
        raise InvalidArgument(where, f"a class number or name is needed, got {_short(v)}")
    name = names[v] if names is not None and 0 <= v < len(names) else str(v)
    if not lm:
        return v
    return _label(lm, v, name, where)


def _truth(
    boxes: list[list[float]], labels: list[int], fmt: str, img: np.ndarray | None
) -> dict[str, Any]:
    size = [int(img.shape[1]), int(img.shape[0])] if img is not None else [0, 0]
    return {
        "boxes": boxes,
        "labels": labels,
        "box_format": fmt,
        "label_base": 0,
        "image_size": size,
    }


def _unique(samples: list[Sample], field: str) -> list[Sample]:
    if len({s.id for s in samples}) != len(samples):
        raise InvalidArgument(field, "sample keys repeat: image ids must be unique")
    return samples


# -- WebDataset --------------------------------------------------------------------------------


_BRACE = re.compile(r"\{([^{}]*)\}")


def expand_braces(pattern: str, field: str) -> list[str]:
    """The names a shard pattern stands for: ``{000..009}`` (zero-padded when the bounds
    are), ``{a,b}``; at most :data:`MAX_SHARDS`, counted before anything is expanded."""
    parts: list[list[str]] = []
    pos = 0
    count = 1
    for m in _BRACE.finditer(pattern):
        parts.append([pattern[pos : m.start()]])
        body = m.group(1)
        r = re.fullmatch(r"(\d{1,9})\.\.(\d{1,9})", body)
        if r:
            lo, hi = int(r.group(1)), int(r.group(2))
            if hi < lo:
                raise InvalidArgument(field, f"the range {{{body}}} runs backwards")
            n = hi - lo + 1
            width = len(r.group(1)) if r.group(1).startswith("0") else 0
            choices: Any = (lo, hi, width)
        else:
            opts = body.split(",")
            if len(opts) < 2 or not all(opts):
                raise InvalidArgument(
                    field,
                    f"{{{_short(body, 30)}}} is neither a range "
                    "{000..009} nor alternatives {a,b}",
                )
            n = len(opts)
            choices = opts
        count *= n
        if count > MAX_SHARDS:
            raise InvalidArgument(field, f"the pattern names more than {MAX_SHARDS} shards")
        if isinstance(choices, tuple):
            lo, hi, width = choices
            parts.append([str(i).zfill(width) for i in range(lo, hi + 1)])
        else:
            parts.append(choices)
        pos = m.end()
    parts.append([pattern[pos:]])
    if (
        "{" in pattern[pos:]
        or "}" in pattern[pos:]
        or any("{" in p[0] or "}" in p[0] for p in parts[:-1:2])
    ):
        raise InvalidArgument(field, "unbalanced or nested braces in the shard pattern")
    names = [""]
    for options in parts:
        names = [a + b for a in names for b in options]
    return names


class _TarRefused(tarfile.TarError):
    """A header refused before tarfile reads what it declares (the message says why)."""


_EXTENDED = (
    tarfile.GNUTYPE_LONGNAME,
    tarfile.GNUTYPE_LONGLINK,
    tarfile.XHDTYPE,
    tarfile.XGLTYPE,
    tarfile.SOLARIS_XHDTYPE,
)


class _BoundedTarInfo(tarfile.TarInfo):
    """tarfile's header parsing with what a header may make it read bounded: tarfile reads an
    extended header's declared size whole (a few bytes of gzip can declare gigabytes), follows
    chained extended headers recursively and keeps global pax records for every later member;
    sparse members (whose maps are read without bound) are refused."""

    def _proc_member(self, tarfile_: Any) -> Any:
        if self.type == tarfile.GNUTYPE_SPARSE:
            raise _TarRefused("sparse members are refused")
        if self.type not in _EXTENDED:
            return super()._proc_member(tarfile_)  # type: ignore[misc]
        if not 0 <= self.size <= MAX_TAR_HEADER_BYTES:
            raise _TarRefused(
                f"an extended header of {self.size} bytes (at most {MAX_TAR_HEADER_BYTES})"
            )
        depth = getattr(tarfile_, "_fortis_chain", 0)
        if depth >= MAX_TAR_HEADER_CHAIN:
            raise _TarRefused(f"more than {MAX_TAR_HEADER_CHAIN} chained extended headers")
        tarfile_._fortis_chain = depth + 1
        try:
            out = super()._proc_member(tarfile_)  # type: ignore[misc]
        finally:
            tarfile_._fortis_chain = depth
        kept = sum(len(k) + len(v) for k, v in tarfile_.pax_headers.items())
        if kept > MAX_TAR_HEADER_BYTES:
            raise _TarRefused(f"global pax headers of more than {MAX_TAR_HEADER_BYTES} bytes")
        return out

    def _proc_gnusparse_10(self, *_: Any) -> Any:
        raise _TarRefused("sparse members are refused")


def _member_name(m: tarfile.TarInfo, where: str) -> str:
    """A member's name, refused when it is not a plain file with a relative, ``..``-free
    path (the archive is not trusted about where things would go)."""
    name = m.name
    if m.issym() or m.islnk():
        raise InvalidArgument(where, "links are refused in a WebDataset shard")
    if m.ischr() or m.isblk() or m.isfifo() or m.isdev():
        raise InvalidArgument(where, "devices and FIFOs are refused in a WebDataset shard")
    if name.startswith(("/", "\\")) or re.match(r"[A-Za-z]:", name):
        raise InvalidArgument(where, "absolute member names are refused")
    if ".." in PurePosixPath(name).parts or "\x00" in name:
        raise InvalidArgument(where, "member names with '..' are refused")
    if len(name) > MAX_ID_CHARS + 32:
        raise InvalidArgument(where, f"member names of at most {MAX_ID_CHARS + 32} characters")
    if not utf8(name):
        # tarfile keeps undecodable bytes as surrogates, which no message or report can carry
        raise InvalidArgument(where, "member names must be UTF-8 text")
    if m.issparse() or m.size < 0:
        raise InvalidArgument(where, "sparse members and negative sizes are refused")
    return name


def _printable(name: str) -> str:
    """A member name as a message may show it: bounded, control characters replaced."""
    return "".join(c if c.isprintable() else "?" for c in name[:120]) + (
        "..." if len(name) > 120 else ""
    )


def _split_key(name: str) -> tuple[str, str]:
    """WebDataset's key and extension: the path up to the first dot of the file name."""
    folder, _, base = name.rpartition("/")
    stem, _, ext = base.partition(".")
    return (f"{folder}/{stem}" if folder else stem), ext.lower()


def _wds_sample(
    plan: Plan, key: str, parts: dict[str, bytes], where: str, decode_image: bool
) -> Sample:
    ds, lm = plan.dataset, plan.dataset.label_map
    img_ext = next((e for e in _IMAGE_EXTS if e in parts), None)
    if img_ext is None:
        raise InvalidArgument(
            where,
            f"sample {_short(key, 80)} has no image (.jpg, .jpeg or "
            f".png); it has: {', '.join(sorted(parts))[:120]}",
        )
    img = decode(parts[img_ext], f"{where}.{img_ext}") if decode_image else None
    meta: Any = None
    if "json" in parts:
        try:
            meta = json.loads(parts["json"])
        except (RecursionError, ValueError):
            raise InvalidArgument(f"{where}.json", "not readable JSON") from None
        if not isinstance(meta, dict):
            raise InvalidArgument(f"{where}.json", "a JSON object is needed")
    if plan.target.task == Task.DETECTION:
        if meta is None:
            raise InvalidArgument(
                where,
                f"sample {_short(key, 80)}: a detection plan needs a .json with boxes and labels",
            )
        boxes = _boxes(meta.get("boxes"), f"{where}.json:boxes")
        labels = meta.get("labels", [])
        if not isinstance(labels, list) or len(labels) != len(boxes):
            raise InvalidArgument(f"{where}.json:labels", "one label per box is needed")
        fmt = meta.get("box_format", ds.box_format or "xyxy")
        if fmt not in BOX_FORMATS:
            raise InvalidArgument(
                f"{where}.json:box_format", f"one of {', '.join(BOX_FORMATS)}, got {_short(fmt)}"
            )
        labs = [_class(lm, v, None, f"{where}.json:labels[{k}]") for k, v in enumerate(labels)]
        return Sample(key, img, truth=_truth(boxes, labs, fmt, img))
    if "cls" in parts:
        text = parts["cls"].decode("utf-8", "replace").strip()
        if not re.fullmatch(r"-?\d{1,9}", text):
            raise InvalidArgument(
                f"{where}.cls", f"an integer class is needed, got {_short(text, 30)}"
            )
        return Sample(key, img, (_class(lm, int(text), None, f"{where}.cls"),))
    if meta is not None and "label" in meta:
        return Sample(key, img, (_class(lm, meta["label"], None, f"{where}.json:label"),))
    raise InvalidArgument(
        where, f"sample {_short(key, 80)} has no label (.cls, or .json with 'label')"
    )


def _shard_groups(
    store: DataStore, ref: Any, shard: str, skip: int, take: int, budget: list[int]
) -> Iterator[tuple[str, dict[str, bytes]] | None]:
    """The samples of one shard in order, read as a stream: None for each of the first
    ``skip`` keys (their data is never read), then (key, {ext: bytes}) for up to ``take``
    keys; the rest of the shard is not read."""
    field = f"dataset.path:{shard}"
    key: str | None = None
    parts: dict[str, bytes] = {}
    keys = members = 0
    with store.open(ref, field) as f:
        try:
            tf = tarfile.open(  # noqa: SIM115 - a stream, closed below
                fileobj=f, mode="r|*", tarinfo=_BoundedTarInfo
            )
        except _TarRefused as exc:
            raise InvalidArgument(field, f"not a readable tar archive: {exc}") from None
        except (tarfile.TarError, EOFError, OSError, ValueError):
            raise InvalidArgument(field, "not a readable tar archive") from None
        try:
            while True:
                try:
                    m = tf.next()
                except _TarRefused as exc:
                    raise InvalidArgument(
                        field, f"not a readable tar archive (after {members} members): {exc}"
                    ) from None
                except (tarfile.TarError, EOFError, OSError, ValueError):
                    raise InvalidArgument(
                        field, f"not a readable tar archive (after {members} members)"
                    ) from None
                if m is None:
                    break
                # a stream's TarFile keeps every header it has read; nothing here looks back
                tf.members.clear()  # type: ignore[attr-defined]
                members += 1
                where = f"{field}:{_printable(m.name)}"
                if members > MAX_SHARD_MEMBERS:
                    raise InvalidArgument(field, f"more than {MAX_SHARD_MEMBERS} members")
                name = _member_name(m, where)
                if m.isdir():
                    continue
                if not m.isfile():
                    raise InvalidArgument(where, "only regular files are read")
                if m.size > MAX_MEMBER_BYTES:
                    raise InvalidArgument(where, f"member larger than {MAX_MEMBER_BYTES} bytes")
                # headers count as well as data: a shard of empty members costs reading too
                if m.offset_data + m.size > budget[0]:
                    raise InvalidArgument(
                        field, f"more than {MAX_STREAM_BYTES} bytes of members streamed"
                    )
                k, ext = _split_key(name)
                if k != key:
                    if key is not None:
                        yield (key, parts) if keys > skip else None
                        if keys >= skip + take:
                            return
                    key, parts = k, {}
                    keys += 1
                if keys > skip and (ext in _IMAGE_EXTS or ext in ("cls", "json")):
                    if ext in ("cls", "json") and m.size > MAX_LABEL_BYTES:
                        raise InvalidArgument(
                            where, f"label file larger than {MAX_LABEL_BYTES} bytes"
                        )
                    src = tf.extractfile(m)
                    try:
                        parts[ext] = src.read(m.size) if src is not None else b""
                    except (tarfile.TarError, EOFError, OSError):
                        raise InvalidArgument(where, "the member is cut short") from None
            if key is not None:
                yield (key, parts) if keys > skip else None
        finally:
            budget[0] -= tf.offset
            tf.close()


def read_webdataset(plan: Plan, store: DataStore, decode_image: bool = True) -> list[Sample]:
    ds = plan.dataset
    if isinstance(ds.store, UploadLocation):
        shards = list(ds.store.blobs)  # each upload is one shard, in the plan's order
    else:
        relative_path(ds.path, "dataset.path", store.root_name)
        shards = expand_braces(ds.path, "dataset.path")
    refs = [(s, store.locate(PurePosixPath(), s, f"dataset.path:{s}")) for s in shards]
    out: list[Sample] = []
    seen = 0
    budget = [MAX_STREAM_BYTES]
    for shard, ref in refs:
        if len(out) >= ds.limit:
            break
        for g in _shard_groups(
            store, ref, shard, max(0, ds.offset - seen), ds.limit - len(out), budget
        ):
            seen += 1
            if g is not None:
                key, parts = g
                out.append(
                    _wds_sample(plan, key, parts, f"dataset.path:{shard}:{key}", decode_image)
                )
    return _unique(out, "dataset.path")
