"""The plan's image source (IEEE-P3): built-in datasets available offline. Domain code.

    fashion-mnist     Fashion-MNIST (Debian dataset-fashion-mnist), 28x28 grey, ids fmnist-<split>-NNNNN
    imagenet-photos   natural photos available offline with their ImageNet labels, resized
                      (shorter side 256) and centre-cropped to 224x224, ids photo-<name>
    manifest          your own images with ground truth: a JSON-lines file (``dataset.path``,
                      relative to the server's data root), one image per line:
                        {"id": "img-1", "image": "photos/1.jpg", "labels": [3]}            classification
                        {"id": "img-2", "image": "2.png", "boxes": [[x1, y1, x2, y2]],
                         "labels": [0], "box_format": "xyxy", "label_base": 0}              detection (IEEE-C4)
                        {"id": "img-3", "image": "3.png", "mask": "3-mask.png"}            segmentation (IEEE-C5)
                      image and mask paths relative to the manifest's folder; masks are PNGs
                      of class indices
    uploads           the same rows in a manifest the tenant uploaded (``dataset.manifest``:
                      "sha256:..."), naming uploaded images (and masks) by blob id:
                        {"id": "img-1", "image": "sha256:<hex>", "labels": [3]}
                      (no plan reads the server's disk; blobs are the calling
                      tenant's own, infra/storage/blobs.py). Content ids pin the data, so the
                      plan in the report repeats the evaluation exactly (IEEE-P4).
    coco, voc         COCO JSON and Pascal VOC folders under the data root, kept as they are
                      (detection and segmentation; dataset_formats.py)
    webdataset, hf    WebDataset tar shards and Hugging Face save_to_disk folders
                      (classification and detection; dataset_streams.py)

The kept formats (coco, voc, webdataset, hf, folders) are read from a store
(dataset_store.py): the data root, the S3 prefix of the plan's ``dataset.store`` opened with
the calling tenant's credentials as the operator configured them, or the tenant's uploaded
archive (``dataset.store.upload``, read in place: dataset_archive.py).

Confinement (otherwise any tenant could read any server file, and its bytes would come back
in the error). Manifests exist only under an operator-configured ``data_root``: with none,
manifests are refused. ``dataset.path`` and every image/mask path must be relative, free of
``..``, and resolve (symlinks followed) inside the root; a missing file and one outside the
root give the same "not found under the data root" (so nothing reveals which server files
exist), and no message names a resolved server path or quotes file content.

Sizes: the manifest is read line by line with bounded lines and total, and
an image's width x height is checked from its PNG/JPEG header before it is decoded.

``dataset.label_map`` (IEEE-P6) maps dataset labels to the service's labels.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping
from io import BytesIO
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

import cv2
import numpy as np
from fortis.core.task import Task
from fortis.infra.storage.blobs import BlobStorage
from fortis.services.common.errors import FailedPrecondition, InvalidArgument
from fortis.services.evaluation.dataset_archive import open_upload_store
from fortis.services.evaluation.dataset_files import (
    MAX_ID_CHARS,
    confined_file,
)
from fortis.services.evaluation.dataset_files import NOT_FOUND as _NOT_FOUND
from fortis.services.evaluation.dataset_files import decode as _decode
from fortis.services.evaluation.dataset_files import read_image as _read_image
from fortis.services.evaluation.dataset_files import short as _short
from fortis.services.evaluation.dataset_formats import annotated_items, load_annotated
from fortis.services.evaluation.dataset_sources import read_samples
from fortis.services.evaluation.dataset_store import DataStore, LocalStore, StoreOpener
from fortis.services.evaluation.plan import DatasetRef, Plan
from fortis.services.evaluation.plan_model import (
    ANNOTATED_FORMATS,
    STREAM_FORMATS,
    UploadLocation,
)
from fortis.services.evaluation.runner import DatasetPort
from fortis.services.evaluation.stages.base import LabeledImage

#: A built-in image source: (split, offset, limit) of a dataset -> images with their dataset
#: labels. Wired in by the composition root (server/app/stack.py) from the adapters' data sets,
#: so this service imports no model or data code.
BuiltinSource = Callable[[DatasetRef], list[LabeledImage]]

#: Largest manifest read, bytes.
MAX_MANIFEST_BYTES = 50 * 1024 * 1024
#: Longest manifest line, bytes (without its line break).
MAX_LINE_BYTES = 64 * 1024
def _int(v: Any, field: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int | float | str):
        raise InvalidArgument(field, f"must be an integer, got {_short(v)}")
    try:
        return int(v)
    except (TypeError, ValueError, OverflowError):
        raise InvalidArgument(field, f"must be an integer, got {_short(v)}") from None


def _manifest_lines(path: Path, first: int, count: int) -> Iterator[tuple[int, str]]:
    """(line number, text) of the non-blank lines ``first`` .. ``first + count - 1`` (0-based
    entries), each line and the whole read bounded; undecodable text named by line only."""
    try:
        f = path.open("rb")
    except OSError:
        raise InvalidArgument("dataset.path", _NOT_FOUND) from None
    with f:
        if os.fstat(f.fileno()).st_size > MAX_MANIFEST_BYTES:
            raise InvalidArgument("dataset.path", f"the manifest is larger than "
                                  f"{MAX_MANIFEST_BYTES} bytes")
        yield from _lines_of(f, first, count, "dataset.path")


def _lines_of(f: BinaryIO, first: int, count: int, field: str) -> Iterator[tuple[int, str]]:
    """The selected non-blank lines of an open manifest (see :func:`_manifest_lines`);
    problems named ``<field>`` or ``<field>:<line>``."""
    total = entry = 0
    lineno = 0
    while entry < first + count:
        raw = f.readline(MAX_LINE_BYTES + 2)
        if not raw:
            return
        lineno += 1
        total += len(raw)
        if total > MAX_MANIFEST_BYTES:
            raise InvalidArgument(field, f"the manifest is larger than "
                                  f"{MAX_MANIFEST_BYTES} bytes")
        content = raw.rstrip(b"\r\n")
        if len(content) > MAX_LINE_BYTES:
            raise InvalidArgument(f"{field}:{lineno}",
                                  f"line longer than {MAX_LINE_BYTES} bytes")
        if not content.strip():
            continue
        entry += 1
        if entry <= first:
            continue
        try:
            text = content.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidArgument(f"{field}:{lineno}", "not UTF-8 text: a manifest is "
                                  "JSON lines") from None
        yield lineno, text


#: Loads one image (or mask) a manifest row names: (value, field, cv2 flags) -> pixels.
ImageLoader = Callable[[object, str, int], np.ndarray]
#: Where uploaded data is read: the blob store and the tenant whose plan it is.
Uploads = tuple[BlobStorage, str]


def _opened(plan: Plan, data_root: Path | None, uploads: Uploads | None
            ) -> tuple[Iterator[tuple[int, str]], str, ImageLoader]:
    """The plan's selected manifest lines, the field naming the manifest, and the loader of
    the images its rows name: under the data root (``manifest``) or the tenant's uploads."""
    ds = plan.dataset
    if ds.source == "uploads":
        if uploads is None:
            raise FailedPrecondition("dataset.manifest: uploads are not available on this "
                                     "server")
        blobs, tenant = uploads
        data = blobs.read(tenant, ds.manifest, "dataset.manifest", kind="manifest")
        if len(data) > MAX_MANIFEST_BYTES:
            raise InvalidArgument("dataset.manifest", f"the manifest is larger than "
                                  f"{MAX_MANIFEST_BYTES} bytes")

        def load_blob(raw: object, field: str, flags: int) -> np.ndarray:
            return _decode(blobs.read(tenant, str(raw), field, kind="image"), field, flags)
        return _lines_of(BytesIO(data), ds.offset, ds.limit, "dataset.manifest"), \
            "dataset.manifest", load_blob
    if data_root is None:
        raise FailedPrecondition("dataset.path: manifests are not available on this server: "
                                 "the operator has not configured a data root (fortis serve "
                                 "--data-root DIR)")
    root = data_root
    base = PurePosixPath(ds.path).parent
    path = confined_file(root, PurePosixPath(), ds.path, "dataset.path")

    def load_file(raw: object, field: str, flags: int) -> np.ndarray:
        return _read_image(confined_file(root, base, raw, field), field, flags)
    return _manifest_lines(path, ds.offset, ds.limit), "dataset.path", load_file


def read_manifest(plan: Plan, data_root: Path | None, uploads: Uploads | None = None,
                  ) -> list[dict[str, Any]]:
    """The manifest's entries (selected by offset/limit), with images loaded and every problem
    named by line: ``dataset.path:LINE.field`` (``dataset.manifest:LINE.field`` for uploads).
    Everything is confined to ``data_root`` (with no root configured,
    manifests are refused) or to the tenant's own uploads."""
    lines, field, load = _opened(plan, data_root, uploads)
    rows = []
    for n, line in lines:
        where = f"{field}:{n}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InvalidArgument(where, f"not JSON at column {exc.colno}: {exc.msg}") from None
        except (RecursionError, ValueError) as exc:
            raise InvalidArgument(where, f"not readable JSON ({type(exc).__name__}: nested "
                                  "too deeply or a number too long)") from None
        if not isinstance(row, dict) or not isinstance(row.get("image"), str):
            raise InvalidArgument(f"{where}.image", "each line needs an 'image' path"
                                  if field == "dataset.path" else
                                  "each line needs an 'image' blob id")
        row["_image"] = load(row["image"], f"{where}.image", cv2.IMREAD_COLOR)
        iid = row.setdefault("id", PurePosixPath(row["image"]).stem)
        if isinstance(iid, bool) or not isinstance(iid, str | int) or len(str(iid)) > MAX_ID_CHARS:
            raise InvalidArgument(f"{where}.id", f"a string of at most {MAX_ID_CHARS} "
                                  f"characters is needed, got {_short(iid)}")
        row["_where"] = where
        row["_load"] = load
        rows.append(row)
    ids = [str(r["id"]) for r in rows]
    if len(set(ids)) != len(ids):
        raise InvalidArgument(field, "image ids repeat in the manifest")
    return rows


def check_manifest(plan: Plan, data_root: Path | None, uploads: Uploads | None = None
                   ) -> None:
    """What reading the plan's manifest would refuse, without decoding an image: no data
    root, a path absolute, with ``..`` or outside the root, a missing file, a blob that is
    not this tenant's (or not of its kind), a line that is not JSON or names no image. For
    ValidatePlan: a plan it accepts does not fail on these when the run reads them."""
    if plan.dataset.source not in ("manifest", "uploads"):
        return
    ds = plan.dataset
    if ds.source == "uploads":
        if uploads is None:
            raise FailedPrecondition("dataset.manifest: uploads are not available on this "
                                     "server")
        blobs, tenant = uploads

        def locate(raw: object, field: str) -> None:
            blobs.path_of(tenant, str(raw), field, kind="image")
    else:
        if data_root is None:
            raise FailedPrecondition("dataset.path: manifests are not available on this "
                                     "server: the operator has not configured a data root "
                                     "(fortis serve --data-root DIR)")
        root, base = data_root, PurePosixPath(ds.path).parent

        def locate(raw: object, field: str) -> None:
            confined_file(root, base, raw, field)
    lines, field, _load = _opened(plan, data_root, uploads)
    for n, line in lines:
        where = f"{field}:{n}"
        try:
            row = json.loads(line)
        except (RecursionError, ValueError):
            raise InvalidArgument(where, "not readable JSON") from None
        if not isinstance(row, dict) or not isinstance(row.get("image"), str):
            raise InvalidArgument(f"{where}.image", "each line needs an 'image'")
        locate(row["image"], f"{where}.image")
        if isinstance(row.get("mask"), str):
            locate(row["mask"], f"{where}.mask")


def load_plan_truths(plan: Plan, data_root: Path | None, uploads: Uploads | None = None,
                     ) -> dict[str, Any]:
    """Ground truth of a detection or segmentation plan, per image id: detection
    ``{boxes, labels, box_format, label_base, image_size}``; segmentation an HxW int array."""
    out: dict[str, Any] = {}
    for row in read_manifest(plan, data_root, uploads):
        iid, where = str(row["id"]), row["_where"]
        h, w = row["_image"].shape[:2]
        if plan.target.task == Task.DETECTION:
            boxes = row.get("boxes")
            if not isinstance(boxes, list):
                raise InvalidArgument(f"{where}.boxes", "a detection manifest needs boxes per image (may be [])")
            labels = row.get("labels", [0] * len(boxes))
            if not isinstance(labels, list) or len(labels) != len(boxes):
                raise InvalidArgument(f"{where}.labels", "one label per box")
            box_format = row.get("box_format", "xyxy")
            if not isinstance(box_format, str) or len(box_format) > 16:
                raise InvalidArgument(f"{where}.box_format", f"a short name is needed, got "
                                      f"{_short(box_format)}")
            out[iid] = {"boxes": boxes, "labels": labels, "box_format": box_format,
                        "label_base": _int(row.get("label_base", 0), f"{where}.label_base"),
                        "image_size": [w, h]}
        elif plan.target.task == Task.SEGMENTATION:
            if not isinstance(row.get("mask"), str):
                raise InvalidArgument(f"{where}.mask", "a segmentation manifest needs a mask PNG per image")
            mask = row["_load"](row["mask"], f"{where}.mask", cv2.IMREAD_UNCHANGED)
            if mask.ndim == 3:
                mask = mask[:, :, 0]
            if mask.shape != (h, w):
                raise InvalidArgument(f"{where}.mask", f"mask is {mask.shape[1]}x{mask.shape[0]}, image {w}x{h}")
            out[iid] = mask.astype(np.int64)
    return out


class PlanDatasets(DatasetPort):
    """The plan's images: a built-in source (by name), a manifest under ``data_root`` (the
    operator's folder of server-side datasets; None = manifests refused),
    or the tenant's uploads (``blobs``; :meth:`for_tenant` binds the plan's tenant)."""

    def __init__(self, builtin: Mapping[str, BuiltinSource], data_root: Path | None = None,
                 *, blobs: BlobStorage | None = None, tenant: str = "",
                 stores: StoreOpener | None = None) -> None:
        self.builtin = dict(builtin)
        self.data_root = Path(data_root) if data_root is not None else None
        self.blobs = blobs
        self.tenant = tenant
        self.stores = stores
        self._upload_stores: dict[tuple[str, tuple[str, ...]], DataStore] = {}

    def for_tenant(self, tenant: str) -> PlanDatasets:
        """The datasets as ``tenant``'s plans see them (their own uploads and store
        credentials only)."""
        return PlanDatasets(self.builtin, self.data_root, blobs=self.blobs, tenant=tenant,
                            stores=self.stores)

    def store(self, plan: Plan) -> DataStore | None:
        """Where the plan's kept dataset is read: its S3 prefix (with this tenant's
        credentials), else the data root (None: neither is available)."""
        loc = plan.dataset.store
        if loc is None:
            return LocalStore(self.data_root) if self.data_root is not None else None
        if isinstance(loc, UploadLocation):
            if self.blobs is None or not self.tenant:
                raise FailedPrecondition("dataset.store.upload: uploaded datasets are not "
                                         "available on this server")
            key = (plan.dataset.source, loc.blobs)
            st = self._upload_stores.get(key)
            if st is None:      # one index per plan's archive, however often it is asked for
                st = self._upload_stores[key] = open_upload_store(self.blobs, self.tenant,
                                                           plan.dataset.source, loc.blobs)
            return st
        if self.stores is None or not self.tenant:
            raise FailedPrecondition("dataset.store.s3: S3 dataset stores are not available on "
                                     "this server (the operator has not configured "
                                     "--dataset-stores)")
        return self.stores(self.tenant, loc)

    def _samples(self, plan: Plan, *, decode_image: bool = True) -> list[Any]:
        st = self.store(plan)
        if st is None:
            raise FailedPrecondition("dataset.path: kept datasets are not available on this "
                                     "server: the operator has not configured a data root "
                                     "(fortis serve --data-root DIR) and the plan names no "
                                     "dataset.store")
        return read_samples(plan, st, decode_image=decode_image)

    @property
    def _uploads(self) -> Uploads | None:
        return (self.blobs, self.tenant) if self.blobs is not None and self.tenant else None

    def truths(self, plan: Plan) -> dict[str, Any]:
        if plan.dataset.source in ANNOTATED_FORMATS:
            return {i: truth for i, _, truth in load_annotated(plan, self.store(plan))}
        if plan.dataset.source in STREAM_FORMATS:
            return {s.id: s.truth for s in self._samples(plan)}
        return load_plan_truths(plan, self.data_root, self._uploads)

    def check(self, plan: Plan) -> None:
        """The first stage's refusals of the plan's data, no image decoded (check_manifest),
        and the uploaded models its surrogates name (this tenant's, of kind model)."""
        check_manifest(plan, self.data_root, self._uploads)
        if plan.dataset.source in ANNOTATED_FORMATS:
            annotated_items(plan, self.store(plan))
        if plan.dataset.source in STREAM_FORMATS:
            self._samples(plan, decode_image=False)
        for k, sd in enumerate(plan.surrogates):
            if self.blobs is None or not self.tenant:
                raise FailedPrecondition(f"surrogates[{k}].model: uploaded models are not "
                                         "available on this server")
            self.blobs.path_of(self.tenant, sd.model, f"surrogates[{k}].model", kind="model")

    def count(self, plan: Plan) -> int:
        """How many images the plan's selection resolves to, decoding none where the source
        allows (manifest lines, annotation items, stream samples); a built-in source is
        read (its images are in memory already)."""
        ds = plan.dataset
        if ds.source in ("manifest", "uploads"):
            lines, _, _ = _opened(plan, self.data_root, self._uploads)
            return sum(1 for _ in lines)
        if ds.source in ANNOTATED_FORMATS:
            return len(annotated_items(plan, self.store(plan)))
        if ds.source in STREAM_FORMATS:
            return len(self._samples(plan, decode_image=False))
        return len(self.images(plan))

    def images(self, plan: Plan) -> list[LabeledImage]:
        ds = plan.dataset
        lm = ds.label_map
        if ds.source in ANNOTATED_FORMATS:
            return [(i, img, ()) for i, img, _ in load_annotated(plan, self.store(plan),
                                                                      truths=False)]
        if ds.source in STREAM_FORMATS:
            return [(s.id, s.image, s.labels) for s in self._samples(plan)]
        if ds.source in ("manifest", "uploads"):
            out: list[LabeledImage] = []
            for row in read_manifest(plan, self.data_root, self._uploads):
                truth_labels: tuple[int, ...] = ()
                if plan.target.task == Task.CLASSIFICATION:
                    lab = row.get("labels")
                    lab = [lab] if isinstance(lab, int) else lab
                    if not isinstance(lab, list) or not lab:
                        raise InvalidArgument(f"{row['_where']}.labels", "a classification manifest needs labels per image")
                    ints = [_int(x, f"{row['_where']}.labels[{i}]") for i, x in enumerate(lab)]
                    truth_labels = tuple(lm.get(x, x) for x in ints)
                out.append((str(row["id"]), row["_image"], truth_labels))
            return out
        source = self.builtin.get(ds.source)
        if source is None:
            raise FailedPrecondition(f"dataset source '{ds.source}' is not available on this server")
        try:
            rows = source(ds)
        except FileNotFoundError as exc:
            raise FailedPrecondition(str(exc)) from None
        return [(i, im, tuple(lm.get(lab, lab) for lab in labels)) for i, im, labels in rows]
