"""Pieces every task type's correctness shares (IEEE Std 3129-2023 4.7.6). Domain code: no gRPC.

- :class:`AggregationRule` (IEEE-C3, 4.7.6.2.2): from the s per-label-set (classification) or
  per-object (detection) verdicts to the image's verdict.
- :class:`LabelMapping` (IEEE-P6): dataset labels -> service labels, one-to-one or
  one-to-many; an unmapped dataset label is an error naming the plan field, never a miss.
- Validation helpers used by the classification, detection and segmentation modules, kept here
  once so that every task reports bad input the same way (at most ``MAX_LISTED`` field
  violations, image names from ``image_ids``).

These names are internal to the package (the public ones are re-exported by
``fortis.services.scoring.correctness``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as dc_field
from typing import Any, Final

import numpy as np
import numpy.typing as npt
from fortis.core.criteria import (
    AGGREGATE_MODES,
    MAX_LISTED,
    AggregationRule,
    aggregation_violations,
    is_int,
    is_number,
    raise_violations,
)
from fortis.services.common.errors import FieldViolation, InvalidArgument

__all__ = [
    "AGGREGATE_MODES",
    "MAX_LISTED",
    "AggregationRule",
    "LabelMapping",
    "aggregation_violations",
    "image_name",
    "is_int",
    "is_number",
    "raise_violations",
    "rows_per_chunk",
]

#: IEEE-C3 (4.7.6.2.2): Alternative 2 "all" label sets / objects, Alternative 1 "at_least" Q.
#: Elements per vectorised chunk (bounds memory on large batches).
CHUNK_ELEMENTS: Final = 1 << 22
#: At most this many field violations are listed in one error (the rest are counted).

def rows_per_chunk(per_row: int) -> int:
    """How many rows of ``per_row`` elements fit one vectorised chunk (at least 1): the step
    handed to :func:`~fortis.services.common.arrays.chunk_slices`."""
    return max(1, CHUNK_ELEMENTS // max(1, per_row))


def image_name(image_ids: Sequence[str] | None, n: int) -> str:
    """How image ``n`` is named in an error: its quoted id when ids are given, else ``n``."""
    return repr(str(image_ids[n])) if image_ids is not None else str(n)


# --------------------------------------------------------------------------------------------
# IEEE-C3: from label sets / objects to the image
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class LabelMapping:
    """Dataset label -> service label(s), from the plan (IEEE-P6).

    ``table`` maps each dataset label to one service label or to several (one-to-many: any of
    them is accepted). Labels are non-negative integers as written by the dataset and by the
    service. A dataset label missing from the table is an error naming ``field`` (the plan
    field the mapping came from), so an unmapped class never silently counts as a miss.
    """

    table: Mapping[int, int | Sequence[int]]
    field: str = "dataset.label_map"
    _norm: dict[int, tuple[int, ...]] = dc_field(init=False, repr=False)
    _keys: np.ndarray = dc_field(init=False, repr=False)
    _lut: np.ndarray = dc_field(init=False, repr=False)

    def __post_init__(self) -> None:
        norm: dict[int, tuple[int, ...]] = {}
        violations: list[FieldViolation] = []
        if not isinstance(self.table, Mapping):
            raise InvalidArgument(self.field, "must map dataset label -> service label(s)")
        for k, v in self.table.items():
            key = _label_key(k)
            if key is None:
                violations.append(FieldViolation(
                    f"{self.field}.{k}", f"dataset labels must be integers >= 0, got {k!r}"))
                continue
            vals = (v,) if not isinstance(v, Sequence) or isinstance(v, str) else tuple(v)
            if not vals:
                violations.append(FieldViolation(
                    f"{self.field}.{k}", "maps to no service label (drop the images instead)"))
            elif not all(is_int(x) and x >= 0 for x in vals):
                violations.append(FieldViolation(
                    f"{self.field}.{k}", f"service labels must be integers >= 0, got {v!r}"))
            elif key in norm:
                violations.append(FieldViolation(f"{self.field}.{k}", "given twice"))
            else:
                norm[key] = tuple(dict.fromkeys(int(x) for x in vals))
        raise_violations(violations)
        object.__setattr__(self, "_norm", norm)
        keys = np.array(sorted(norm), dtype=np.int64)
        width = max((len(v) for v in norm.values()), default=1)
        lut = np.full((len(keys), width), -1, dtype=np.int64)
        for r, key in enumerate(keys.tolist()):
            lut[r, : len(norm[key])] = norm[key]
        object.__setattr__(self, "_keys", keys)
        object.__setattr__(self, "_lut", lut)

    @classmethod
    def from_dict(cls, d: Mapping[Any, Any], *, field: str = "dataset.label_map") -> LabelMapping:
        """From a plan mapping whose keys may be strings ("3": 7 or "3": [7, 8])."""
        if not isinstance(d, Mapping):
            raise InvalidArgument(field, "must map dataset label -> service label(s)")
        return cls(dict(d), field)

    @property
    def one_to_one(self) -> bool:
        """True when every dataset label maps to exactly one service label."""
        return int(self._lut.shape[1]) == 1

    def __getitem__(self, label: int) -> tuple[int, ...]:
        return self.map_label(label)

    def map_label(self, label: int, *, where: str = "") -> tuple[int, ...]:
        """The service labels of one dataset label; unmapped -> :class:`InvalidArgument`."""
        try:
            return self._norm[int(label)]
        except KeyError:
            raise InvalidArgument(self.field, f"no entry for dataset label {label}"
                                  + (f" (used by {where})" if where else "")) from None

    def map_array(self, labels: npt.ArrayLike, *, where: str = "",
                  ignore: int | None = None) -> np.ndarray:
        """Vectorised: an integer array of dataset labels -> service labels with one more
        trailing axis of width A (the most service labels any key maps to), padded with -1.
        Entries equal to ``ignore`` stay ``ignore`` (first column) untouched."""
        arr = np.asarray(labels)
        keys, lut = self._keys, self._lut
        if arr.size == 0 or len(keys) == 0:
            if arr.size:
                raise InvalidArgument(self.field, "is empty but labels need mapping"
                                      + (f" (used by {where})" if where else ""))
            return np.full((*arr.shape, lut.shape[1]), -1, dtype=np.int64)
        pos = np.clip(np.searchsorted(keys, arr), 0, len(keys) - 1)
        hit = keys[pos] == arr
        skip = (arr == ignore) if ignore is not None else np.zeros(arr.shape, bool)
        bad = ~hit & ~skip
        if bad.any():
            missing = sorted(set(np.asarray(arr[bad]).ravel().tolist()))
            raise InvalidArgument(self.field, "no entry for dataset label"
                                  f"{'s' if len(missing) > 1 else ''} "
                                  f"{', '.join(map(str, missing[:MAX_LISTED]))}"
                                  + (f" (used by {where})" if where else ""))
        out = lut[pos]
        if ignore is not None and skip.any():
            out[skip] = -1
            out[skip, 0] = ignore
        return np.asarray(out)


def _label_key(k: Any) -> int | None:
    if is_int(k):
        return int(k) if k >= 0 else None
    if isinstance(k, str) and k.strip().isdigit():
        return int(k.strip())
    return None


