"""Hugging Face ``save_to_disk`` folders as a plan's dataset (IEEE-P3), read with pyarrow
alone from a :class:`~.dataset_store.DataStore`, for classification and detection. Domain code.

``dataset: {source: hf, path: hf/beans, split: test}``
    ``path`` is a folder written by ``datasets``' ``save_to_disk``: a ``Dataset`` folder
    (``state.json``, ``dataset_info.json``, ``data-*.arrow``), or a ``DatasetDict`` folder
    (``dataset_dict.json`` and one such folder per split, chosen by ``split``). Read with
    pyarrow alone: ``state.json`` and ``dataset_info.json`` are read bounded, every data file
    named there must be a plain name in the folder (confined like every path; a symlink out of
    the root is "not found"), its size is checked, then its schema, before any row is read:
    the image column (``image``) must be an Image feature with the bytes embedded (a row that
    only names a path is refused: a path in a dataset must not make the server read its own
    files), the label column (``label``) integers, the detection column (``objects``) a
    sequence of ``bbox`` (4 numbers, ``dataset.box_format``, default ``xywh``) and
    ``category``. Record batches are validated in full before use. Local files are memory
    mapped; from S3 they are streamed.

Labels (IEEE-P6) as for WebDataset (``dataset_streams.py``): a ``ClassLabel``'s names are
``label_map`` keys.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any

from fortis.core.task import Task
from fortis.services.common.errors import InvalidArgument
from fortis.services.common.paths import relative_path
from fortis.services.evaluation.dataset_files import MAX_IMAGE_BYTES, decode
from fortis.services.evaluation.dataset_files import short as _short
from fortis.services.evaluation.dataset_store import DataStore
from fortis.services.evaluation.dataset_streams import Sample, _boxes, _class, _truth
from fortis.services.evaluation.plan import Plan

__all__ = ["MAX_HF_FILE_BYTES", "MAX_HF_FILES", "MAX_HF_ROWS", "read_hf"]

#: Largest state.json / dataset_info.json / dataset_dict.json, bytes.
MAX_HF_META_BYTES = 4 * 1024 * 1024
#: Arrow files of one HF folder, and the largest one, bytes.
MAX_HF_FILES = 10_000
MAX_HF_FILE_BYTES = 64 * 1024**3
#: Rows one HF folder may declare (over all its files).
MAX_HF_ROWS = 100_000_000
#: Record batches read from one Arrow file (empty batches cost reading, not rows).
MAX_HF_BATCHES = 1_000_000
#: Largest single read of a streamed (not memory-mapped) Arrow file, bytes: pyarrow reads a
#: record batch's declared body whole into memory, so a file from S3 with one huge batch
#: must be refused rather than held (save_to_disk writes batches of 1000 rows).
MAX_HF_READ_BYTES = 1024**3
#: An Arrow file name in an HF folder: a plain name, never a path.
_ARROW_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,200}\.arrow")
_SPLIT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,63}")


def _json_file(store: DataStore, base: PurePosixPath, name: str, field: str) -> Any:
    data = store.read(store.locate(base, name, field), MAX_HF_META_BYTES, field, name)
    try:
        return json.loads(data)
    except (RecursionError, ValueError):
        raise InvalidArgument(field, f"{name} is not readable JSON") from None


def _class_names(feature: Any) -> list[str] | None:
    """The names of a ClassLabel feature, looked for through Sequence/List wrappers."""
    for _ in range(8):
        if not isinstance(feature, dict):
            return None
        if feature.get("_type") == "ClassLabel":
            names = feature.get("names")
            if isinstance(names, list) and all(isinstance(n, str) for n in names):
                return [n[:256] for n in names]
            return None
        feature = feature.get("feature")
    return None


def _hf_folder(plan: Plan, store: DataStore) -> tuple[PurePosixPath, str]:
    """The Dataset folder of the plan (a split's folder in a DatasetDict) and its field."""
    ds = plan.dataset
    base = relative_path(ds.path, "dataset.path", store.root_name)
    try:
        dd = _json_file(store, base, "dataset_dict.json", "dataset.path:dataset_dict.json")
    except InvalidArgument as exc:
        if "not found" not in exc.message:
            raise
        return base, "dataset.path"
    splits = dd.get("splits") if isinstance(dd, dict) else None
    if not isinstance(splits, list) or not all(isinstance(s, str) for s in splits):
        raise InvalidArgument("dataset.path:dataset_dict.json", "a list 'splits' is needed")
    if ds.split not in splits or not _SPLIT.fullmatch(ds.split):
        raise InvalidArgument(
            "dataset.split",
            f"the DatasetDict has splits "
            f"{', '.join(s[:40] for s in splits[:20])}; got {_short(ds.split)}",
        )
    return base / ds.split, f"dataset.path:{ds.split}"


def _hf_files(store: DataStore, base: PurePosixPath, field: str) -> list[tuple[str, Any]]:
    state = _json_file(store, base, "state.json", f"{field}/state.json")
    files = state.get("_data_files") if isinstance(state, dict) else None
    if not isinstance(files, list) or not files:
        raise InvalidArgument(
            f"{field}/state.json",
            "'_data_files' (the Arrow files) is needed: a folder written by save_to_disk",
        )
    if len(files) > MAX_HF_FILES:
        raise InvalidArgument(f"{field}/state.json", f"more than {MAX_HF_FILES} data files")
    out = []
    for k, f in enumerate(files):
        name = f.get("filename") if isinstance(f, dict) else None
        where = f"{field}/state.json:_data_files[{k}]"
        if not isinstance(name, str) or not _ARROW_NAME.fullmatch(name):
            raise InvalidArgument(where, f"a plain .arrow file name is needed, got {_short(name)}")
        ref = store.locate(base, name, where)
        if store.size(ref) > MAX_HF_FILE_BYTES:
            raise InvalidArgument(where, f"larger than {MAX_HF_FILE_BYTES} bytes")
        out.append((name, ref))
    return out


def _arrow_type_ok(t: Any, want: str) -> bool:
    import pyarrow as pa

    if want == "binary":
        return bool(pa.types.is_binary(t) or pa.types.is_large_binary(t))
    if want == "int":
        return bool(pa.types.is_integer(t))
    return False


def _check_schema(schema: Any, task: Task, where: str) -> None:
    import pyarrow as pa

    names = schema.names
    if "image" not in names:
        raise InvalidArgument(where, f"no 'image' column (columns: {', '.join(names)[:200]})")
    t = schema.field("image").type
    if pa.types.is_struct(t):
        if t.get_field_index("bytes") < 0 or not _arrow_type_ok(t.field("bytes").type, "binary"):
            raise InvalidArgument(f"{where}:image", "an Image feature (bytes, path) is needed")
    elif not _arrow_type_ok(t, "binary"):
        raise InvalidArgument(f"{where}:image", f"an Image feature is needed, got {t}")
    if task == Task.CLASSIFICATION:
        if "label" not in names or not _arrow_type_ok(schema.field("label").type, "int"):
            raise InvalidArgument(
                f"{where}:label", "an integer (ClassLabel) 'label' column is needed"
            )
        return
    if "objects" not in names:
        raise InvalidArgument(
            f"{where}:objects", "a detection plan needs an 'objects' column (bbox, category)"
        )
    t = schema.field("objects").type
    inner = t.value_type if pa.types.is_list(t) or pa.types.is_large_list(t) else t
    if (
        not pa.types.is_struct(inner)
        or inner.get_field_index("bbox") < 0
        or inner.get_field_index("category") < 0
    ):
        raise InvalidArgument(f"{where}:objects", "objects need 'bbox' and 'category'")


def _hf_objects(
    objs: Any, names: list[str] | None, lm: Mapping[int | str, int], where: str
) -> tuple[list[list[float]], list[int]]:
    """bbox/category of one row: a list of {bbox, category} or {bbox: [...], category: [...]}."""
    if objs is None:
        return [], []
    if isinstance(objs, list):
        bbox = [o.get("bbox") if isinstance(o, dict) else None for o in objs]
        cats = [o.get("category") if isinstance(o, dict) else None for o in objs]
    elif isinstance(objs, dict):
        bbox, cats = objs.get("bbox") or [], objs.get("category") or []
    else:
        raise InvalidArgument(where, "objects must be bbox/category records")
    boxes = _boxes(bbox, f"{where}.bbox")
    if not isinstance(cats, list) or len(cats) != len(boxes):
        raise InvalidArgument(f"{where}.category", "one category per box is needed")
    return boxes, [_class(lm, c, names, f"{where}.category[{k}]") for k, c in enumerate(cats)]


class _BoundedReads:
    """A streamed Arrow file whose single reads are bounded (see :data:`MAX_HF_READ_BYTES`)."""

    def __init__(self, stream: Any, where: str) -> None:
        self._stream, self._where = stream, where
        self.closed = False

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0 or n > MAX_HF_READ_BYTES:
            raise InvalidArgument(
                self._where,
                f"a record batch (or its metadata) of more than {MAX_HF_READ_BYTES} bytes",
            )
        return bytes(self._stream.read(n))

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def close(self) -> None:
        self.closed = True
        self._stream.close()


def _open_arrow(store: DataStore, ref: Any, where: str) -> tuple[Any, Any]:
    """An IPC stream reader over a memory map (local) or a streamed object (S3)."""
    import pyarrow as pa

    path = store.local_path(ref)
    src: Any = (
        pa.memory_map(str(path), "r")
        if path is not None
        else pa.PythonFile(_BoundedReads(store.open(ref, where), where), mode="r")
    )
    try:
        return src, pa.ipc.open_stream(src)
    except (pa.ArrowException, OSError, ValueError):
        src.close()
        raise InvalidArgument(where, "not an Arrow stream (save_to_disk's format)") from None


def read_hf(plan: Plan, store: DataStore, decode_image: bool = True) -> list[Sample]:
    import pyarrow as pa

    ds, task = plan.dataset, plan.target.task
    base, field = _hf_folder(plan, store)
    info = _json_file(store, base, "dataset_info.json", f"{field}/dataset_info.json")
    features = info.get("features") if isinstance(info, dict) else None
    features = features if isinstance(features, dict) else {}
    label_names = _class_names(features.get("label"))
    objects = features.get("objects")
    cat_names = None
    for _ in range(4):  # List/Sequence of {bbox, category}, or its dict
        if isinstance(objects, dict) and "category" in objects:
            cat_names = _class_names(objects["category"])
            break
        objects = objects.get("feature") if isinstance(objects, dict) else None
    files = _hf_files(store, base, field)
    lm = ds.label_map
    want = ["image", "label"] if task == Task.CLASSIFICATION else ["image", "objects"]
    out: list[Sample] = []
    row = 0
    for name, ref in files:
        where = f"{field}/{name}"
        src, reader = _open_arrow(store, ref, where)
        try:
            try:
                _check_schema(reader.schema, task, where)
            except (pa.ArrowException, ValueError):  # e.g. field names that are not UTF-8
                raise InvalidArgument(where, "the Arrow schema is not readable") from None
            batches = 0
            while len(out) < ds.limit:
                batches += 1
                if batches > MAX_HF_BATCHES:
                    raise InvalidArgument(where, f"more than {MAX_HF_BATCHES} record batches")
                try:
                    batch = reader.read_next_batch()
                except StopIteration:
                    break
                except (pa.ArrowException, OSError, ValueError):
                    raise InvalidArgument(
                        where, f"unreadable record batch after row {row}"
                    ) from None
                n = batch.num_rows
                if row + n > MAX_HF_ROWS:
                    raise InvalidArgument(where, f"more than {MAX_HF_ROWS} rows")
                lo = max(0, ds.offset - row)
                hi = min(n, ds.offset + ds.limit - row)
                row += n
                if lo >= hi:
                    continue
                part = batch.select(want).slice(lo, hi - lo)
                try:
                    part.validate(full=True)
                except (pa.ArrowException, ValueError):
                    raise InvalidArgument(
                        where, f"a record batch fails validation near row {row - n + lo}"
                    ) from None
                cols = part.to_pydict()
                for j in range(hi - lo):
                    r = row - n + lo + j
                    at = f"{where}:{r}"
                    im = cols["image"][j]
                    data = im.get("bytes") if isinstance(im, dict) else im
                    if not data:
                        raise InvalidArgument(
                            f"{at}.image",
                            "the image bytes are not in the "
                            "dataset (only a path): save it with embedded "
                            "images (Image feature, decode=True)",
                        )
                    if len(data) > MAX_IMAGE_BYTES:
                        raise InvalidArgument(f"{at}.image", f"larger than {MAX_IMAGE_BYTES} bytes")
                    img = decode(bytes(data), f"{at}.image") if decode_image else None
                    iid = (
                        f"{ds.split}-{r:06d}" if base != PurePosixPath(ds.path) else f"row-{r:06d}"
                    )
                    if task == Task.CLASSIFICATION:
                        lab = cols["label"][j]
                        if lab is None or lab < 0:
                            raise InvalidArgument(f"{at}.label", "the row has no label")
                        out.append(Sample(iid, img, (_class(lm, lab, label_names, f"{at}.label"),)))
                    else:
                        boxes, labs = _hf_objects(
                            cols["objects"][j], cat_names, lm, f"{at}.objects"
                        )
                        out.append(
                            Sample(
                                iid, img, truth=_truth(boxes, labs, ds.box_format or "xywh", img)
                            )
                        )
        finally:
            src.close()
        if len(out) >= ds.limit:
            break
    return out
