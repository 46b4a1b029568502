"""The CANARY and benchmark parts of a report (CAN-1..CAN-5, CAN-7, CAN-8, CAN-10) as the
report document's ``canary`` and ``benchmark``, read back key for key from their typed
messages (``services/common/result_tree.py``), so report.json shows exactly what the scoring
service's Compute returned; a part of more than :data:`MAX_PART_VALUES` values is an
``InvalidArgument`` naming it. Pure code, no gRPC."""

from __future__ import annotations

from typing import Any, Final

from fortis.report.v1 import report_pb2
from fortis.services.common.errors import InvalidArgument
from fortis.services.common.result_tree import NULL_FIELDS, message_tree

__all__ = ["benchmark_part", "canary_part", "sequential_part"]

#: Values copied from one part at most: the page draws what a caller sends (heat maps,
#: tables), and no evaluation's results come near this.
MAX_PART_VALUES: Final = 500_000
#: Messages nested deeper than this are refused (the deepest part an evaluation writes is a
#: few levels; ``MetricNode.per_model`` nests itself, so a caller could nest it at will).
MAX_PART_DEPTH: Final = 32


def canary_part(parts: report_pb2.ReportParts) -> dict[str, Any] | None:
    """CAN-1..4 per attack when the plan asked for them (``{"model", "attacks": {NAME:
    {"effect", "cost", "perturbation"}}, "notes"}``); None when the parts carry none."""
    if not parts.HasField("canary"):
        return None
    return _part(parts.canary, "parts.canary")


def benchmark_part(parts: report_pb2.ReportParts) -> dict[str, Any] | None:
    """A multi-target plan's cross-model section (CAN-5/7/8/10); None for other plans."""
    if not parts.HasField("benchmark"):
        return None
    return _part(parts.benchmark, "parts.benchmark")


def sequential_part(parts: report_pb2.ReportParts) -> dict[str, Any] | None:
    """Sequential acceptance's record (criteria at their stopping times, settings' images
    used vs planned); None when no criterion was sequential."""
    if not parts.HasField("sequential"):
        return None
    return _part(parts.sequential, "parts.sequential")


def _part(msg: Any, path: str) -> dict[str, Any]:
    """The part's tree. ``""`` in a message's null fields makes that value null, which only a
    map's value may be: a part that is sent is an object (a part that is not there is left
    unset), so a caller's null part is refused by name rather than met later as nothing."""
    tree = message_tree(msg, path, MAX_PART_VALUES, MAX_PART_DEPTH)
    if not isinstance(tree, dict):
        raise InvalidArgument(f"{path}.{NULL_FIELDS}", '"" would make the whole part null; '
                              "leave the part unset instead")
    return tree
