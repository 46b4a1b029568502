"""Per-image outcomes of an evaluation's scored settings, for report.json's ``outcomes``.

The scoring service already judged every image of every setting (its per-image verdicts,
``ScoreEvaluationResponse.verdicts``: the booleans its metrics count); this module only places
them on the evaluation's images, so two reports of the same images can be compared image by
image (McNemar's test in ``fortis compare``) instead of as two independent samples. One
character per image keeps it small: 65 settings x 500 images is ~33 kB of report.json.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import structlog
from fortis.services.evaluation.convert import setting_verdicts
from fortis.services.evaluation.ports import PerImageOutcomes, Setting

__all__ = ["per_image_outcomes"]

log = structlog.get_logger(__name__)

_RIGHT, _WRONG, _NOT_COVERED = ord("1"), ord("0"), ord("-")


def per_image_outcomes(
    image_ids: Sequence[str], settings: Sequence[Setting], metrics: Any
) -> PerImageOutcomes | None:
    """The outcome of each scored setting on each of ``image_ids``, from the scoring
    answer's verdicts (over the setting's covered images, ``Setting.image_index`` order).
    None when the answer carries no verdicts; a setting whose verdicts do not match its
    covered images is left out (logged), never guessed."""
    verdicts = setting_verdicts(metrics)
    if not verdicts:
        return None
    n = len(image_ids)
    rows: list[tuple[str, str, int, str]] = []
    for s in settings:
        v = verdicts.get((s.kind, s.name, s.level))
        if v is None:
            continue
        index = np.asarray(s.image_index if s.image_index else range(n), dtype=np.int64)
        if index.size != v.size or (index.size and (index.min() < 0 or index.max() >= n)):
            log.warning(
                "outcomes_mismatch",
                kind=s.kind,
                name=s.name,
                level=s.level,
                verdicts=int(v.size),
                covered=int(index.size),
            )
            continue
        chars = np.full(n, _NOT_COVERED, dtype=np.uint8)
        chars[index] = np.where(v, _RIGHT, _WRONG)
        rows.append((s.kind, s.name, int(s.level), chars.tobytes().decode("ascii")))
    return PerImageOutcomes(image_ids=tuple(str(i) for i in image_ids), settings=tuple(rows))
