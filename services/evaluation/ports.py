"""What the evaluation runner needs from the other services, in domain terms.

The runner (domain) depends only on these protocols and dataclasses; ``clients.py`` is the one
place that implements them over gRPC and converts between these objects and the contracts'
messages. What the evaluation service knows about perturbations, attacks and targets it
learns here, from the other services' List RPCs (never by importing their code).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from fortis.core.task import Task
from fortis.services.common.params import Param
from fortis.services.common.surrogates import SurrogateSpec
from fortis.services.evaluation.answers import Answers

if TYPE_CHECKING:
    from fortis.services.evaluation.store import EvaluationRow

__all__ = ["AttackEntry", "AttackOutcome", "Catalogue", "CataloguePort", "ExampleBox",
           "LedgerSummary",
           "PerturbationEntry", "PerturbationPort", "ProxyPort", "ReportInput", "ReportPort",
           "RunStore", "Scored", "ScoringPort", "ScoringSetup", "Setting", "SettingFailure",
           "Summary", "TargetDescription", "TestDefinition"]


@dataclass(frozen=True, kw_only=True)
class TargetDescription:
    name: str
    task: str               # "classification" | "detection" | "segmentation"
    labels: tuple[str, ...]
    output_kind: str        # "full_scores" | "top_k" | "label_only" | "boxes" | "masks"
    top_k: int
    input_height: int
    input_width: int
    input_channels: int
    version: str


@dataclass(frozen=True, kw_only=True)
class PerturbationEntry:
    """A catalogue perturbation as ListPerturbations describes it."""

    id: str
    kind: str                        # "corruption" | "style" | "degradation" | "property"
    family: str
    refs: tuple[str, ...]
    level_kind: str                  # "severity" | "level" | "epsilon"
    levels: tuple[int, ...]
    needs_model: bool
    params: tuple[Param, ...]
    info: Any = None                 # the catalogue message (passed on to the report as is)


@dataclass(frozen=True, kw_only=True)
class AttackEntry:
    """A catalogue attack as ListAttacks describes it."""

    id: str
    kind: str                        # "transfer" | "score" | "decision"
    family: str
    refs: tuple[str, ...]
    norms: tuple[str, ...]           # "linf" | "l2" | "l0" | "l1" | "spatial"
    needs_surrogate: bool
    params: tuple[Param, ...]
    targeted: bool = False           # has a targeted variant
    untargeted: bool = True
    #: Task types it attacks.
    tasks: tuple[Task, ...] = (Task.CLASSIFICATION,)
    uses_surrogate: bool = False     # a query attack that may take a surrogate prior

    @property
    def is_query_attack(self) -> bool:
        return self.kind in ("score", "decision")

    @property
    def norm(self) -> str:
        return self.norms[0] if self.norms else ""


@dataclass(frozen=True, kw_only=True)
class Catalogue:
    """Everything the plan may name, learned from the perturbation and proxy services."""

    perturbations: Mapping[str, PerturbationEntry]
    attacks: Mapping[str, AttackEntry]


class CataloguePort(Protocol):
    def catalogue(self) -> Catalogue: ...


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
    signal: str = ""                 # what the attack read from the target (query attacks)
    criterion: str = ""              # its success criterion, in words


#: An image's reference for a detection / segmentation attack: ``{"boxes": (k, 4) pixel
#: xyxy, "labels": (k,) service labels}`` or an (H, W) int mask; None: the clean answer's.
AttackReference = Any


@dataclass(frozen=True, kw_only=True)
class TenantUsage:
    """The calling tenant's queries today (UTC, retries included), its daily quota (0 = none)
    and its images/s across all targets (0 = unlimited), as the proxy keeps them."""

    queries_today: int
    queries_per_day: int
    images_per_second: float


class ProxyPort(Protocol):
    def target_info(self, target: str) -> TargetDescription: ...

    def target_names(self) -> list[str]: ...

    def target_terms(self) -> dict[str, tuple[float, float | None]]:
        """Per visible target: (images/s, 0 = unlimited; price per 1000 queries or None)."""
        ...

    def tenant_usage(self) -> TenantUsage: ...

    def open_session(self, *, session_id: str, target: str, query_budget: int = 0,
                     per_image_budget: int = 0, description: str = "") -> None: ...

    def predict(self, *, session_id: str, origin: str, task: str,
                images: Sequence[tuple[str, np.ndarray]]) -> Answers:
        """The target's answers, as arrays; a failed call gives per-image errors."""
        ...

    def session_queries(self, session_id: str) -> tuple[int, dict[str, int]]:
        """(answered queries, answered queries per image id) read from the ledger."""
        ...


class PerturbationPort(CataloguePort, Protocol):
    def perturb(self, perturbation_id: str, level: int, seed: int,
                images: Sequence[tuple[str, np.ndarray]],
                params: Mapping[str, Any] | None = None, *, surrogate: str = "",
                labels: Sequence[int] | None = None) -> list[np.ndarray]:
        """Any severity/level perturbation of the catalogue; white-box degradation operators
        take a surrogate name and the images' true labels."""
        ...

    def attack(self, attack_id: str, params: Mapping[str, Any], seed: int,
               images: Sequence[tuple[str, np.ndarray, Sequence[int]]], *,
               session_id: str = "", origin: str = "", surrogate: str = "",
               on_result: Callable[[AttackOutcome], None] | None = None,
               cancelled: Callable[[], bool] | None = None,
               criterion: Mapping[str, Any] | None = None,
               references: Sequence[AttackReference] | None = None,
               ensemble: Sequence[str] = (),
               surrogate_models: Sequence[SurrogateSpec] = ()) -> list[AttackOutcome]:
        """Run an attack; ``criterion`` its success criterion as plain data (kind,
        target_label, threshold, k, detection / segmentation parameters; None: the task's
        default), ``references`` one per image (detection / segmentation), ``ensemble``
        further surrogates crafted on with ``surrogate`` (IEEE-A7), ``surrogate_models``
        the tenant's surrogates those names may refer to (IEEE-P6)."""
        ...

    def validate_attack(self, attack_id: str, params: Mapping[str, Any], *, task: str,
                        output_kind: str = "",
                        criterion: Mapping[str, Any] | None = None, surrogate: str = "",
                        ensemble: Sequence[str] = ()) -> dict[str, Any]:
        """Whether the attack can run with these parameters and criterion against a target
        of ``task`` returning ``output_kind`` ("" = not known), before any image: the
        perturbation service's every rule (InvalidArgument naming ``params.<name>``,
        ``criterion...`` or ``attack_id``; PermissionDenied naming ``surrogate`` or
        ``ensemble[j]`` for a target's twin the tenant holds no white-box grant for).
        Returns the parameters it would run with."""
        ...


@dataclass(frozen=True, kw_only=True)
class ScoringSetup:
    image_ids: tuple[str, ...]
    task: str
    truth: Any                       # labels per image | detection truths | [M,H,W] maps
    criterion: Mapping[str, Any]     # the plan's correctness / detection / segmentation section
    ranking: bool = False
    ranking_reason: str = ""
    num_classes: int = 0


@dataclass(frozen=True, kw_only=True)
class PerImageOutcomes:
    """Every scored setting's outcome on each image of the evaluation: ``settings`` holds
    (kind, name, level, one character per image of ``image_ids``: '1' right / robust, '0'
    not, '-' not covered)."""

    image_ids: tuple[str, ...]
    settings: tuple[tuple[str, str, int, str], ...]


@dataclass(frozen=True, kw_only=True)
class SettingFailure:
    """Why a setting could not be run to its end: the ``google.rpc.Code`` and message of the
    error (as a caller may see it: internals never), and how far it got."""

    code: int
    message: str
    images_done: int
    images_planned: int


@dataclass(frozen=True, kw_only=True)
class Setting:
    """One test setting's recorded answers, for the scoring service; or, with ``failure``,
    a setting that failed (no answers: the report lists it with its error)."""

    kind: str                        # clean | corruption | transfer_attack | query_attack | degradation
    name: str = ""
    level: int = 0
    image_index: tuple[int, ...] = ()
    answers: Answers | None = None
    errors: tuple[str, ...] = ()
    success: tuple[bool, ...] = ()
    queries: tuple[int, ...] = ()
    query_budget: int = 0
    linf: tuple[float, ...] = ()
    l2: tuple[float, ...] = ()
    fraction_changed: float | None = None
    failure: SettingFailure | None = None
    #: Attacks: per covered image, left out by the plan's success criterion before the
    #: attack (a targeted attack's image already of the target class), and why.
    excluded: tuple[bool, ...] = ()
    excluded_reason: str = ""

    @property
    def label(self) -> str:
        """The setting as reports name it: ``fog@3``, ``square``."""
        return f"{self.name}@{self.level}" if self.kind in ("corruption", "degradation") \
            else self.name or self.kind


@dataclass(frozen=True, kw_only=True)
class Summary:
    accuracy: float | None
    average_robustness_corr: float | None
    average_robustness_adv: float | None
    m: int
    #: Settings that failed (``Setting.label``), listed with their errors in the report.
    failed_settings: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Scored:
    summary: Summary
    metrics: Any                     # the scoring service's typed answer, passed to the report


class ScoringPort(Protocol):
    def score(self, setup: ScoringSetup, settings: Iterable[Setting]) -> Scored: ...

    def compute(self, metric: str, arrays: Mapping[str, np.ndarray],
                params: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """One entry of the scoring service's metric catalogue (the Compute RPC), e.g. the
        CANARY metrics (CAN-1..4, ``canary_metrics.py``): its JSON result (numbers are
        doubles, NaN is None)."""
        ...


@dataclass(frozen=True, kw_only=True)
class TestDefinition:
    """One test of the plan, as the report lists it."""

    __test__ = False

    name: str
    kind: str                        # corruption | degradation | transfer_attack | score_attack | decision_attack
    perturbation_id: str
    family: str
    refs: tuple[str, ...]
    levels: tuple[int, ...] = ()
    params: Mapping[str, Any] = field(default_factory=dict)
    catalogue_info: Any = None       # the perturbation's catalogue message (levels, DEG-5)
    surrogate: str = ""
    epsilon: float | None = None
    norm: str = ""
    query_budget: int | None = None
    images: int = 0
    signal: str = ""                 # query attacks: what the attack read from the target
    criterion: str = ""              # attacks: the success criterion, in words


@dataclass(frozen=True, kw_only=True)
class LedgerSummary:
    sessions: Mapping[str, int]
    aborted: Mapping[str, int]


@dataclass(frozen=True, kw_only=True)
class ExampleBox:
    """A box drawn on an example image: pixel ``(x_min, y_min, x_max, y_max)`` in the
    example's images, its class in words, the target's confidence (None: ground truth, or a
    target that gives none)."""

    box: tuple[float, float, float, float]
    label: str = ""
    score: float | None = None


@dataclass(frozen=True, kw_only=True)
class Example:
    """One example image for the report: ``kind`` "corruption" (a severity on a
    sample image), "attack" (original / adversarial) or "degradation" (a DEG-4 failure
    point's level). Images are uint8 H x W x C (C 1 or 3) as the target received them.

    ``original_correct`` / ``perturbed_correct``: how the plan's correctness rule judged the
    two answers (the scoring service's per-image verdicts; None: not judged). Detection
    examples carry the ground truth and both answers' boxes; segmentation examples H x W
    maps the images' size (0: no class of interest, k: ``mask_classes[k - 1]``)."""

    kind: str
    setting: str
    level: int
    image_id: str
    original: np.ndarray
    perturbed: np.ndarray
    original_answer: str = ""
    perturbed_answer: str = ""
    note: str = ""
    target: str = ""
    original_correct: bool | None = None
    perturbed_correct: bool | None = None
    truth_boxes: tuple[ExampleBox, ...] = ()
    original_boxes: tuple[ExampleBox, ...] = ()
    perturbed_boxes: tuple[ExampleBox, ...] = ()
    truth_mask: np.ndarray | None = None
    original_mask: np.ndarray | None = None
    perturbed_mask: np.ndarray | None = None
    mask_classes: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class ReportInput:
    plan: Any                        # the validated Plan
    plan_text: str
    target: TargetDescription
    environment: Mapping[str, str]
    metrics: Any                     # Scored.metrics
    tests: Sequence[TestDefinition]
    ledger: LedgerSummary
    evaluation_id: str
    started: float
    finished: float
    images: int
    resumed_count: int
    #: Example images (``examples.py``).
    examples: Sequence[Example] = ()
    #: CANARY metrics per attack (CAN-1..4) when the plan asks for them: plain JSON data.
    canary: Mapping[str, Any] | None = None
    #: Settings that failed (``Setting.failure``), in plan order.
    failed: Sequence[Setting] = ()
    #: Multi-target plans (CAN-5/7/8/10): plain JSON data (``benchmark.py``).
    benchmark: Mapping[str, Any] | None = None
    #: Sequential acceptance's record (``sequential.py``): plain JSON data.
    sequential: Mapping[str, Any] | None = None
    #: The query estimate beside the ledger's counts (``estimate.report_section``).
    estimate: Mapping[str, Any] | None = None
    #: Per-image outcomes of the scored settings (``outcomes.py``), for paired comparisons
    #: of two evaluations; None when the scoring answer carries no verdicts.
    outcomes: PerImageOutcomes | None = None


class ReportPort(Protocol):
    def render(self, parts: ReportInput) -> tuple[str, str]: ...


class RunStore(Protocol):
    """What one run of a single-target plan needs of the evaluation store: its row's
    progress and end, its resumable work items (claimed by workers in a fan-out) and its
    artifacts. The evaluation store is one; a model of a multi-target plan sees the parent
    evaluation's store through ``benchmark.MemberStore``, which offers exactly these."""

    @property
    def tenant(self) -> str | None: ...

    # the evaluation's row
    def get(self, evaluation_id: str) -> EvaluationRow | None: ...
    def update_running(self, evaluation_id: str, **fields: Any) -> bool: ...
    def finish(self, evaluation_id: str, *, report_json: str, report_html: str, summary: Any,
               finished_at: float) -> bool: ...

    # work items (CAN-9)
    def item(self, evaluation_id: str, key: str) -> tuple[bool, int, bytes | None]: ...
    def start_item(self, evaluation_id: str, key: str) -> int: ...
    def finish_item(self, evaluation_id: str, key: str, result: bytes, *, items_done: int,
                    images_done: int, queries: int, message: str) -> None: ...
    def items(self, evaluation_id: str) -> Iterator[tuple[str, int, bool]]: ...
    def add_items(self, evaluation_id: str, keys: Iterable[str]) -> int: ...

    # exclusive, leased claims of the workers of a fan-out (``claims.py``)
    def claim_key(self, evaluation_id: str, key: str, worker_id: str, *,
                  lease_s: float) -> str: ...
    def finish_claimed(self, evaluation_id: str, key: str, worker_id: str, result: bytes, *,
                       images: int, queries: int, message: str) -> bool: ...
    def renew_leases(self, evaluation_id: str, worker_id: str, *, lease_s: float) -> int: ...
    def release_items(self, evaluation_id: str, worker_id: str,
                      keys: Iterable[str] | None = None) -> int: ...

    # artifacts (adversarial examples, CAN-9)
    def put_artifact(self, evaluation_id: str, name: str, data: bytes) -> object: ...
    def artifact(self, evaluation_id: str, name: str) -> bytes | None: ...
