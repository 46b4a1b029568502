"""Class-folder trees as a plan's dataset (IEEE-P3): ``dataset: {source: folders, path:
pets/val}``, one sub-folder per class holding its images (``pets/val/cat/001.jpg``), as
torchvision's ``ImageFolder`` lays them out; read from a :class:`~.dataset_store.DataStore`
(the data root or an S3 prefix) for classification plans. Domain code.

Images (``.jpg``, ``.jpeg``, ``.png``, at any depth under their class folder) are taken in
sorted path order, selected by ``offset``/``limit``; an image's id is its path under ``path``
(``cat/001.jpg``). A class's number is the index of its folder name among the sorted class
names (ImageFolder's ``class_to_idx``); ``label_map`` keys may be those numbers or the folder
names (IEEE-P6) -- a key naming a folder wins, so ``{3: 7}`` maps the folder ``3/``, whatever
its number -- and once a map is given every class met must be in it. Files directly in
``path`` and files of other types are not images of the set. The listing is bounded
(:data:`MAX_FOLDER_FILES`), symlinked folders are not walked and every image is confined
when it is read, like every path.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import PurePosixPath

from fortis.services.common.errors import InvalidArgument
from fortis.services.evaluation.dataset_files import MAX_ID_CHARS, MAX_IMAGE_BYTES, decode, utf8
from fortis.services.evaluation.dataset_store import DataStore
from fortis.services.evaluation.dataset_streams import Sample, _class
from fortis.services.evaluation.plan import Plan

__all__ = ["MAX_FOLDER_FILES", "read_folders"]

#: Files listed under one dataset folder.
MAX_FOLDER_FILES = 1_000_000
_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


def read_folders(plan: Plan, store: DataStore, decode_image: bool = True) -> list[Sample]:
    ds = plan.dataset
    files = [
        f
        for f in store.list_files(ds.path, "dataset.path", MAX_FOLDER_FILES)
        if "/" in f and f.lower().endswith(_IMAGE_SUFFIXES)
    ]
    if not files:
        raise InvalidArgument(
            "dataset.path",
            "no images in class folders (<class>/<image>.jpg|jpeg|png) under the folder",
        )
    classes = sorted({f.split("/", 1)[0] for f in files})
    index = {c: k for k, c in enumerate(classes)}
    base = PurePosixPath(ds.path)
    out = []
    for rel in files[ds.offset : ds.offset + ds.limit]:
        if not utf8(rel):
            # an undecodable file name (kept as surrogates) cannot be an id or a message
            raise InvalidArgument(
                "dataset.path", f"file names must be UTF-8 text, got {ascii(rel)[:80]}"
            )
        where = f"dataset.path:{rel[:MAX_ID_CHARS]}"
        if len(rel) > MAX_ID_CHARS:
            raise InvalidArgument(where, f"image paths of at most {MAX_ID_CHARS} characters")
        ref = store.locate(base, rel, where)
        img = (
            decode(store.read(ref, MAX_IMAGE_BYTES, where, "image file"), where)
            if decode_image
            else None
        )
        cls = rel.split("/", 1)[0]
        out.append(
            Sample(rel, img, (_folder_label(ds.label_map, cls, index[cls], classes, where),))
        )
    return out


def _folder_label(
    lm: Mapping[int | str, int], cls: str, number: int, classes: list[str], where: str
) -> int:
    """A folder's label: a ``label_map`` key naming the folder wins (a numeric key matches a
    folder of that name, ``3: 7`` maps folder ``3/``), then its number among the classes."""
    if cls in lm:
        return int(lm[cls])
    if cls.isdigit() and len(cls) < 10 and int(cls) in lm:
        return int(lm[int(cls)])
    return _class(lm, number, classes, where)
