"""Where a plan's dataset files are read from (IEEE-P3): the operator's data root or an
S3-compatible prefix, behind one small interface so that every format (COCO, VOC, Hugging
Face ``save_to_disk`` folders, WebDataset shards) reads the same way from either. Domain code.

A store confines every name a plan gives to its own root (the data root's folder, the S3
prefix): the name must be relative, free of ``..`` and NUL, and (on disk) resolve inside the
root with symlinks followed. A missing object and one outside the root read the same ("not
found under the <root>"), so no plan learns what else exists. Reads are bounded: a whole-file
read names its limit, a stream is read by the caller against its own bounds.

The S3 implementation lives in ``adapters/s3_store.py`` (it needs botocore); the composition
root hands :class:`PlanDatasets` an opener of stores per tenant, so this service imports no
cloud SDK.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import IO, Any, Protocol

from fortis.services.common.errors import InvalidArgument
from fortis.services.common.paths import relative_path
from fortis.services.evaluation.dataset_files import confined_file, read_bounded
from fortis.services.evaluation.plan_model import S3Location

__all__ = ["DataStore", "LocalStore", "S3Location", "StoreOpener"]


class DataStore(Protocol):
    """The files of one dataset place. ``locate`` confines a name (relative to ``base``) and
    checks it names a readable file, returning an opaque reference; ``read`` and ``open``
    take such references only."""

    #: How messages name the place: "data root", "S3 prefix".
    root_name: str

    def locate(self, base: PurePosixPath, raw: object, field: str) -> Any: ...

    def size(self, ref: Any) -> int: ...

    def read(self, ref: Any, limit: int, field: str, what: str) -> bytes: ...

    def open(self, ref: Any, field: str) -> IO[bytes]:
        """A binary stream of the whole object, read sequentially (never the whole object
        held in memory); the caller bounds what it reads."""
        ...

    def local_path(self, ref: Any) -> Path | None:
        """The file on this machine (memory-mappable), None for a remote store."""
        ...

    def list_files(self, raw: object, field: str, limit: int) -> list[str]:
        """The files under the folder ``raw`` names, as sorted paths relative to it (links
        are listed but confined when located); more than ``limit`` is an error."""
        ...


class LocalStore:
    """Files under the operator's data root (``fortis serve --data-root DIR``)."""

    root_name = "data root"

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def locate(self, base: PurePosixPath, raw: object, field: str) -> Path:
        return confined_file(self.root, base, raw, field)

    def size(self, ref: Path) -> int:
        return ref.stat().st_size

    def read(self, ref: Path, limit: int, field: str, what: str) -> bytes:
        return read_bounded(ref, limit, field, what)

    def open(self, ref: Path, field: str) -> IO[bytes]:
        try:
            return ref.open("rb")
        except OSError:
            raise InvalidArgument(field, "not found under the data root") from None

    def local_path(self, ref: Path) -> Path | None:
        return ref

    def list_files(self, raw: object, field: str, limit: int) -> list[str]:
        rel = relative_path(raw, field, self.root_name)
        try:
            top = self.root.resolve(strict=True)
            folder = (top / rel).resolve(strict=True)
            ok = folder.is_relative_to(top) and folder.is_dir()
        except (OSError, RuntimeError, ValueError):
            ok = False
        if not ok:
            raise InvalidArgument(field, "no such folder under the data root")
        out: list[str] = []
        # symlinked folders are not walked (they could lead anywhere); files are listed and
        # confined one by one when they are located
        for here, dirs, files in os.walk(folder, followlinks=False):
            dirs.sort()
            for f in files:
                out.append((Path(here) / f).relative_to(folder).as_posix())
                if len(out) > limit:
                    raise InvalidArgument(field, f"more than {limit} files in the folder")
        return sorted(out)


#: (tenant, location) -> the store of that prefix, opened with that tenant's credentials.
StoreOpener = Callable[[str, S3Location], DataStore]
