"""What the evaluation runner needs from the other services, in domain terms.

The runner (domain) depends only on these protocols; ``clients.py`` implements them over
gRPC, and tests can run the runner against the real services through those clients.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from fortis.services.scoring.ieee import ClassPrediction


@dataclass(frozen=True, kw_only=True)
class TargetDescription:
    name: str
    task: str
    labels: tuple[str, ...]
    output_kind: str        # "full_scores" | "top_k" | "label_only" | ...
    top_k: int
    input_height: int
    input_width: int
    input_channels: int
    version: str


@dataclass(frozen=True, kw_only=True)
class AttackOutcome:
    image_id: str
    adversarial: np.ndarray          # uint8, what the target receives
    adversarial_float: np.ndarray    # float32 [0,1] (CAN-9)
    success: bool | None
    queries: int
    linf: float
    l2: float
    stop_reason: str
    initially_correct: bool | None


class ProxyPort(Protocol):
    def target_info(self, target: str) -> TargetDescription: ...

    def open_session(self, *, session_id: str, target: str, query_budget: int = 0,
                     per_image_budget: int = 0, description: str = "") -> None: ...

    def predict(self, *, session_id: str, origin: str,
                images: Sequence[tuple[str, np.ndarray]]) -> list[ClassPrediction]:
        """One prediction per image; a failed call gives predictions with ``error`` set."""
        ...

    def predict_answers(self, *, session_id: str, origin: str,
                        images: Sequence[tuple[str, np.ndarray]]) -> list[dict[str, Any]]:
        """Detection/segmentation answers as JSON-able dicts, one per image:
        ``{"boxes": [[x1, y1, x2, y2], ...], "labels": [...], "scores": [...]}`` or
        ``{"mask_png": BASE64}``; a failed query gives ``{"error": MESSAGE}``."""
        ...

    def session_queries(self, session_id: str) -> tuple[int, dict[str, int]]:
        """(answered queries, answered queries per image id) read from the ledger."""
        ...


class PerturbationPort(Protocol):
    def corrupt(self, corruption_id: str, severity: int, seed: int,
                images: Sequence[tuple[str, np.ndarray]],
                params: Mapping[str, Any] | None = None, *, surrogate: str = "",
                labels: Sequence[int] | None = None) -> list[np.ndarray]:
        """Any severity/level perturbation of the catalogue; white-box degradation operators
        take a surrogate name and the images' true labels."""
        ...

    def attack(self, attack_id: str, params: Mapping[str, Any], seed: int,
               images: Sequence[tuple[str, np.ndarray, Sequence[int]]], *,
               session_id: str = "", origin: str = "", surrogate: str = "") -> list[AttackOutcome]: ...


class ScoringPort(Protocol):
    def score(self, *, rule: Mapping[str, Any], labels: Mapping[str, Sequence[int]],
              tests: Sequence[Mapping[str, Any]]) -> dict[str, Any]: ...

    def compute(self, metric: str, arrays: Mapping[str, np.ndarray],
                params: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """One entry of the scoring service's metric catalogue (ListMetrics)."""
        ...


class ReportPort(Protocol):
    def render(self, parts: Mapping[str, Any]) -> tuple[str, str]: ...
