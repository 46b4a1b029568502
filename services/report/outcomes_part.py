"""report.json's ``outcomes``: the per-image outcome of every scored setting, checked.

The report service writes what the evaluation passed (``ReportParts.outcomes``), after
checking it is what it claims: image ids unique, one character per image in '1'/'0'/'-' for
each setting, kinds the evaluation knows, each setting once. A malformed part is refused
naming the field, so a report never carries outcomes a paired comparison would misread.
"""

from __future__ import annotations

from typing import Any, Final

from fortis.report.v1 import report_pb2
from fortis.services.common.errors import FieldViolation, InvalidArgument
from fortis.services.common.limits import (
    MAX_EVALUATION_IMAGES,
    MAX_ID_CHARS,
    MAX_NAME_CHARS,
    MAX_SCORING_LEVEL,
    MAX_SETTINGS,
)

__all__ = ["KINDS", "OUTCOME_CHARS", "outcomes_part"]

#: The setting kinds a report's outcomes may name.
KINDS: Final = frozenset({"clean", "corruption", "transfer_attack", "query_attack", "degradation"})
#: '1' right (attacks: robust), '0' not, '-' not covered by the setting.
OUTCOME_CHARS: Final = frozenset("10-")
_MEANING: Final = (
    "one character per image of image_ids: '1' right under the plan's "
    "correctness rule (attacks: robust, IEEE-M3), '0' not, '-' not covered "
    "by the setting"
)


def outcomes_part(parts: report_pb2.ReportParts) -> dict[str, Any] | None:
    """The ``outcomes`` document of ``parts`` (None when absent); InvalidArgument naming
    ``parts.outcomes...`` when it is malformed."""
    if not parts.HasField("outcomes"):
        return None
    o = parts.outcomes
    ids = list(o.image_ids)
    n = len(ids)
    bad: list[FieldViolation] = []
    if n > MAX_EVALUATION_IMAGES or len(o.settings) > MAX_SETTINGS:
        raise InvalidArgument("parts.outcomes", f"at most {MAX_EVALUATION_IMAGES} images and "
                              f"{MAX_SETTINGS} settings ({n} and {len(o.settings)} given)")
    if any(len(i) > MAX_ID_CHARS for i in ids):
        bad.append(FieldViolation("parts.outcomes.image_ids",
                                  f"an image id is longer than {MAX_ID_CHARS} characters"))
    if len(set(ids)) != n:
        bad.append(FieldViolation("parts.outcomes.image_ids", "image ids must be unique"))
    seen: set[tuple[str, str, int]] = set()
    settings = []
    for j, s in enumerate(o.settings):
        path = f"parts.outcomes.settings[{j}]"
        if s.kind not in KINDS:
            bad.append(FieldViolation(f"{path}.kind", f"must be one of {', '.join(sorted(KINDS))}"))
        if len(s.name) > MAX_NAME_CHARS:
            bad.append(FieldViolation(f"{path}.name", f"at most {MAX_NAME_CHARS} characters"))
        if not 0 <= s.level <= MAX_SCORING_LEVEL:
            bad.append(FieldViolation(f"{path}.level", f"must be in [0, {MAX_SCORING_LEVEL}]"))
        if (s.kind, s.name, s.level) in seen:
            bad.append(FieldViolation(path, f"setting {s.kind}/{s.name}/{s.level} given twice"))
        seen.add((s.kind, s.name, s.level))
        if len(s.outcomes) != n:
            bad.append(
                FieldViolation(
                    f"{path}.outcomes",
                    f"has {len(s.outcomes)} characters for {n} images (one per image of image_ids)",
                )
            )
        elif not set(s.outcomes) <= OUTCOME_CHARS:
            bad.append(FieldViolation(f"{path}.outcomes", "may hold only '1', '0' and '-'"))
        settings.append(
            {"kind": s.kind, "name": s.name, "level": int(s.level), "outcomes": s.outcomes}
        )
        if len(bad) >= 20:
            break
    if bad:
        raise InvalidArgument.from_violations(bad)
    return {"encoding": _MEANING, "image_ids": ids, "settings": settings}
