"""What every adversarial attack shares (IEEE-A7, IEEE-A8, IEEE-A9, IEEE-M6), in the spirit of
Foolbox 3's ``Attack`` base: the attack only says how it searches; the base owns the image the
target receives, the bound, the query budget and the success criterion, so ~30 attacks can be
added later without each re-deciding those rules.

* **The image the target receives.** Images are uint8 arrays ``N x H x W x C`` (any H, W;
  C = 1 or 3). What the target receives is uint8, so every attack returns uint8 adversarials
  and judges success on exactly those images. :func:`make_result` measures the distances on
  them (``common.arrays``).
* **The bound (IEEE-A9)**, fixed before the attack, in [0, 1] pixel scale. L-inf: in uint8
  space ``e = floor(epsilon * 255 + 1e-6)`` levels (:func:`linf_levels`) and every returned
  adversarial satisfies ``|adv - x| <= e`` pixel-wise (:func:`clip_to_linf`). L2: measured on
  images scaled to [0, 1], ``||(adv - x) / 255||_2`` (:func:`project_l2` keeps it after
  rounding).
* **The query budget Q_m (IEEE-M6)**, per image (:class:`QueryBudget`): one query per image per
  call to the query function, the clean image included; an image stops at its first success
  or when it has spent Q_m, never later. A call that raises
  :class:`~fortis.services.common.errors.BudgetExhausted` (the proxy refused: nothing was sent)
  is not counted and stops the images of that call with ``budget_exhausted_by_proxy``.
  Q_m holds across resumed attempts (CAN-9): an attempt starts from the queries a previous,
  killed attempt left charged without an answer (``AttackContext.spent``: the proxy session's
  interrupted or failed rows), and asks only for images with queries left.
* **The success criterion** (``criteria.py``): :class:`Misclassification` (untargeted),
  :class:`TargetedMisclassification` for targeted variants, the PER-2 threat criteria, and
  for detectors and segmenters the IEEE-C4 / IEEE-C5 criteria (``ObjectMissed``,
  ``ObjectRelabelled``, ``MIoUBelow``). Query attacks never judge answers themselves: they ask
  :meth:`AttackContext.margin_query` (score-based) or :meth:`AttackContext.decision_query`
  (decision-based), which a task judge (``judges.py``) answers from the target's raw
  predictions, so one attack runs on classifiers, detectors and segmenters, on full scores,
  top-k scores or labels, unchanged. :attr:`AttackContext.signal` says what the target gives.
* **The registry entry** (:class:`AttackSpec`: kind, norms, targeted / untargeted, the task
  types it attacks, an optional surrogate prior) and the **run signature**
  ``run(ctx: AttackContext) -> list[AttackResult]``: the context carries the batch, validated
  parameters, seed-derived generators, the query client (through the proxy) or the surrogate,
  the criterion and the references (detection boxes, segmentation masks).

Domain code: no gRPC.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, Literal, Protocol

import numpy as np
import torch
from fortis.core.task import TASKS, Task
from fortis.services.common.arrays import l2_distance, linf_distance
from fortis.services.common.errors import BudgetExhausted, InvalidArgument
from fortis.services.common.params import Param
from fortis.services.common.seeding import rng_for, torch_generator_for
from fortis.services.perturbation.criteria import (
    Criterion,
    Misclassification,
    TargetedMisclassification,
)
from fortis.services.perturbation.judges import Judge, make_judge

__all__ = [
    "ATTACK_KINDS", "EPSILON_LINF", "MAX_QUERIES", "NORMS", "STOP_ALREADY_MISCLASSIFIED",
    "TASKS",
    "STOP_BUDGET", "STOP_ITERATIONS", "STOP_PROXY_BUDGET", "STOP_REASONS", "STOP_SUCCESS",
    "AttackContext", "AttackKind", "AttackResult", "AttackSpec", "Criterion", "DecisionQuery",
    "LabelQuery", "MarginQuery",
    "Misclassification", "Norm", "QueryBudget", "QueryClient", "RunFn", "ScoreQuery",
    "TargetedMisclassification", "check_batch", "check_l2_epsilon", "check_linf_epsilon",
    "check_max_queries", "check_surrogate_input",
    "clip_to_linf", "decisions_of", "linf_levels", "make_result", "margins_of", "project_l2",
]

STOP_SUCCESS: Final = "success"
STOP_BUDGET: Final = "budget"
STOP_ALREADY_MISCLASSIFIED: Final = "already_misclassified"
STOP_PROXY_BUDGET: Final = "budget_exhausted_by_proxy"
STOP_ITERATIONS: Final = "iterations"
STOP_REASONS: Final = (STOP_SUCCESS, STOP_BUDGET, STOP_ALREADY_MISCLASSIFIED, STOP_PROXY_BUDGET,
                       STOP_ITERATIONS)

AttackKind = Literal["transfer", "score", "decision"]
Norm = Literal["linf", "l2", "l0", "l1", "spatial"]
ATTACK_KINDS: Final = ("transfer", "score", "decision")
#: "l1": sum of absolute changes in [0, 1] scale (Sparse L1 Descent); "spatial": not an Lp
#: ball but a transformation range (rotation / translation, the Spatial attack), recorded in
#: the attack's parameters (IEEE-A9).
NORMS: Final = ("linf", "l2", "l0", "l1", "spatial")

#: Parameters most attacks share (one definition each).
EPSILON_LINF = Param(name="epsilon", type="float", minimum=0.0, maximum=1.0,
                     description="L-inf bound in [0,1] pixel scale (IEEE-A9)")
MAX_QUERIES = Param(name="max_queries", type="int", default=1000, minimum=1, maximum=1_000_000,
                    description="query budget Q_m per image (IEEE-M6)")


@dataclass(kw_only=True)
class AttackResult:
    """Outcome of one attack on one image of the batch."""

    index: int                     # position in the input batch
    adversarial: np.ndarray        # uint8 HxWxC: best adversarial found (or original/last iterate)
    adversarial_float: np.ndarray  # float32 in [0,1] version of the same (CAN-9 keeps floats)
    success: bool | None           # judged on the uint8 image by the target's answer; None: transfer
    queries: int                   # queries this attack sent for this image (0 for transfer)
    initially_correct: bool | None
    linf: float                    # ||adv - x||_inf in [0,1] scale
    l2: float                      # ||adv - x||_2 in [0,1] scale
    stop_reason: str               # one of STOP_REASONS
    signal: str = ""               # what it read from the target (set by the engine)
    criterion: str = ""            # the success criterion in words (set by the engine)


ScoreQuery = Callable[[np.ndarray, np.ndarray], np.ndarray]
"""(images uint8 n x H x W x C, batch indices int n) -> scores float n x num_classes.

Probabilities or scores; classes the target did not return score 0. May raise
``BudgetExhausted``."""

LabelQuery = Callable[[np.ndarray, np.ndarray], np.ndarray]
"""(images uint8 n x H x W x C, batch indices int n) -> top-1 labels int n. May raise
``BudgetExhausted``."""

MarginQuery = Callable[[np.ndarray, np.ndarray], np.ndarray]
"""(images uint8 n x H x W x C, batch indices int n) -> float n: the success criterion's margin
on the target's answer for each image, < 0 exactly when the criterion is met (the attack has
succeeded on that image). What score-based attacks minimise, whatever the task: built by
:meth:`AttackContext.margin_query` from the target's answers and the criterion (a
classifier's class scores, a detector's boxes, a segmenter's masks), so an attack never reads
scores itself. May raise ``BudgetExhausted``. Ask it through :meth:`QueryBudget.ask`."""

DecisionQuery = Callable[[np.ndarray, np.ndarray], np.ndarray]
"""(images uint8 n x H x W x C, batch indices int n) -> bool n: whether the success criterion
holds on the target's answer (decision-based attacks: the only signal they use). May raise
``BudgetExhausted``. Ask it through :meth:`QueryBudget.ask`."""


def margins_of(query: ScoreQuery, labels: np.ndarray, criterion: Criterion) -> MarginQuery:
    """A :data:`MarginQuery` over a classifier's scores: ``criterion.margins`` of the scores
    for the images' true labels (``labels[idx]``); the shape of the answer is checked."""
    labels = np.asarray(labels, dtype=np.int64)

    def margin(images: np.ndarray, idx: np.ndarray) -> np.ndarray:
        scores = np.asarray(query(images, idx))
        if scores.ndim != 2 or scores.shape[0] != len(idx):
            raise InvalidArgument("scores", f"query returned shape {scores.shape} for "
                                  f"{len(idx)} images")
        if len(idx) and int(labels[idx].max()) >= scores.shape[1]:
            raise InvalidArgument("labels", f"label {int(labels[idx].max())} out of range for "
                                  f"{scores.shape[1]} scores")
        return np.asarray(criterion.margins(scores, labels[idx]), dtype=np.float64)
    return margin


def decisions_of(query: LabelQuery, labels: np.ndarray, criterion: Criterion) -> DecisionQuery:
    """A :data:`DecisionQuery` over a classifier's top-1 labels: ``criterion.adversarial_labels``
    for the images' true labels."""
    labels = np.asarray(labels, dtype=np.int64)

    def decide(images: np.ndarray, idx: np.ndarray) -> np.ndarray:
        top1 = np.asarray(query(images, idx))
        if top1.shape != (len(idx),):
            raise InvalidArgument("labels", f"query returned shape {top1.shape} for "
                                  f"{len(idx)} images")
        return np.asarray(criterion.adversarial_labels(top1, labels[idx]), dtype=bool)
    return decide


class QueryClient(Protocol):
    """Sends images to the target (through the proxy). One image = one query, charged to the
    image id given with it. ``scores`` / ``labels`` serve classifiers; ``predictions`` (the
    raw answers as ``judges.Answer``, any task), ``task`` and ``signal`` (what the target gives:
    "scores", "top_k", "labels", "boxes", "masks") are optional: a client without them is a
    classifier's with full scores."""

    num_classes: int

    def scores(self, images: np.ndarray, image_ids: Sequence[str]) -> np.ndarray:
        """Dense score matrix n x num_classes (classes not returned score 0)."""
        ...

    def labels(self, images: np.ndarray, image_ids: Sequence[str]) -> np.ndarray:
        """Top-1 labels, n."""
        ...


# --------------------------------------------------------------------------------------------
# Bounds (IEEE-A9) and checks
# --------------------------------------------------------------------------------------------


def linf_levels(epsilon: float) -> int:
    """The L-inf bound in uint8 levels: ``floor(epsilon * 255 + 1e-6)`` (IEEE-A9)."""
    eps = float(epsilon)
    if not np.isfinite(eps) or eps < 0.0:
        raise InvalidArgument("epsilon", f"must be a finite number >= 0, got {epsilon!r}")
    return min(int(np.floor(eps * 255.0 + 1e-6)), 255)


def check_l2_epsilon(epsilon: float) -> float:
    eps = float(epsilon)
    if not np.isfinite(eps) or eps < 0.0:
        raise InvalidArgument("epsilon", f"must be a finite number >= 0, got {epsilon!r}")
    return eps


def check_max_queries(max_queries: int) -> int:
    if isinstance(max_queries, bool) or int(max_queries) != max_queries or max_queries < 1:
        raise InvalidArgument("max_queries", f"must be an integer >= 1, got {max_queries!r}")
    return int(max_queries)


def check_batch(images: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Validate an ``N x H x W x C`` uint8 batch and its ``N`` integer labels."""
    images = np.asarray(images)
    if images.dtype != np.uint8:
        raise InvalidArgument("images", f"must be uint8, got {images.dtype}")
    if images.ndim != 4 or min(images.shape[1:]) < 1:
        raise InvalidArgument("images", f"must be N x H x W x C, got shape {images.shape}")
    labels = np.asarray(labels)
    if labels.shape != (images.shape[0],):
        raise InvalidArgument("labels", f"need one label per image: {images.shape[0]}, "
                              f"got shape {labels.shape}")
    if labels.size and (not np.issubdtype(labels.dtype, np.integer) or labels.min() < 0):
        raise InvalidArgument("labels", "must be non-negative integers")
    return images, labels.astype(np.int64)


def check_linf_epsilon(params: Mapping[str, Any]) -> None:
    """An attack whose ``epsilon`` bounds L-inf or L2 (by its ``norm``): as an L-inf bound it
    is at most 1.0 in [0, 1] pixel scale (IEEE-A9)."""
    eps = float(params.get("epsilon") or 0.0)
    if str(params.get("norm", "linf")) == "linf" and eps > 1.0:
        raise InvalidArgument("params.epsilon", f"an L-inf bound is at most 1.0 ([0,1] pixel "
                              f"scale), got {eps:g}; give norm: l2 for an L2 bound")


def clip_to_linf(adv_levels: np.ndarray, x: np.ndarray, e: int) -> np.ndarray:
    """Project integer-valued ``adv_levels`` onto the uint8 L-inf ball: ``[x-e, x+e] & [0, 255]``."""
    xi = x.astype(np.int16)
    out = np.clip(adv_levels, xi - e, xi + e)
    return np.clip(out, 0, 255).astype(np.uint8)


def project_l2(adv: np.ndarray, x: np.ndarray, epsilon: float) -> np.ndarray:
    """Project a float candidate (uint8 scale, any shape of ``x``) onto the L2 ball of radius
    ``epsilon`` ([0, 1] scale) around uint8 ``x`` and round it to uint8 *towards x*, so the
    image the target receives is still within the bound (rounding to nearest could leave it).
    """
    eps = check_l2_epsilon(epsilon)
    xf = x.astype(np.float64)
    delta = np.asarray(adv, dtype=np.float64) - xf
    norm = float(np.sqrt(np.sum((delta / 255.0) ** 2)))
    if norm > eps:
        delta *= eps / norm
    return np.clip(xf + np.trunc(delta), 0, 255).astype(np.uint8)


def check_surrogate_input(classifier: Any, shape: tuple[int, ...]) -> None:
    """A surrogate (``.input_spec``: height, width, channels) must take the images as they are:
    resizing would attack a different image than the one the target receives. A surrogate
    whose ``input_spec`` is None (a detector or segmenter) takes any size."""
    spec = getattr(classifier, "input_spec", None)
    if spec is None:
        return
    if (shape[0], shape[1], shape[2]) != (spec.height, spec.width, spec.channels):
        raise InvalidArgument(
            "images", f"surrogate '{classifier.name}' takes {spec.height}x{spec.width}x"
            f"{spec.channels} images, got {shape[0]}x{shape[1]}x{shape[2]}; resize the plan's "
            "images to the surrogate's input size")


def make_result(index: int, x: np.ndarray, adv: np.ndarray, *, success: bool | None,
                queries: int, initially_correct: bool | None, stop_reason: str) -> AttackResult:
    """Build an :class:`AttackResult` with distances measured on the uint8 images."""
    if stop_reason not in STOP_REASONS:
        raise ValueError(f"unknown stop reason {stop_reason!r}")
    adv = np.ascontiguousarray(adv, dtype=np.uint8)
    return AttackResult(
        index=int(index), adversarial=adv,
        adversarial_float=(adv.astype(np.float32) / np.float32(255.0)),
        success=None if success is None else bool(success), queries=int(queries),
        initially_correct=None if initially_correct is None else bool(initially_correct),
        linf=linf_distance(x, adv), l2=l2_distance(x, adv), stop_reason=stop_reason)


# --------------------------------------------------------------------------------------------
# The query budget Q_m (IEEE-M6)
# --------------------------------------------------------------------------------------------


class QueryBudget:
    """Per-image query accounting for one batch: ``used[i]`` queries spent by image ``i``, its
    ``stop`` reason once it stopped. :meth:`ask` is the only way an attack queries the target,
    so no image can exceed ``limit`` (Q_m) and a proxy refusal stops exactly the images of
    the refused call."""

    def __init__(self, n: int, max_queries: int, spent: np.ndarray | None = None) -> None:
        self.limit = check_max_queries(max_queries)
        #: Queries each image already has against Q_m without an answer (a killed attempt's
        #: interrupted rows, failed ones): this attempt has ``limit - spent`` left.
        self.spent = np.zeros(n, dtype=np.int64) if spent is None else \
            np.clip(np.asarray(spent, dtype=np.int64).reshape(-1), 0, self.limit)
        if self.spent.shape != (n,):
            raise ValueError(f"spent: need {n} counts, got {self.spent.shape}")
        self.used = self.spent.copy()
        self.stop: list[str | None] = [None] * n

    def remaining(self, i: int) -> int:
        return self.limit - int(self.used[i])

    def sent(self, i: int) -> int:
        """Queries this attempt sent for image ``i`` (what its result reports)."""
        return int(self.used[i] - self.spent[i])

    def ask(self, query: Callable[[np.ndarray, np.ndarray], np.ndarray], images: np.ndarray,
            idx: np.ndarray) -> np.ndarray | None:
        """Send ``images`` (row k charged to image ``idx[k]``); the answer, or None when the
        proxy refused (those images stop with ``budget_exhausted_by_proxy``)."""
        idx = np.asarray(idx, dtype=np.int64)
        need = np.bincount(idx, minlength=self.used.shape[0])
        if np.any(self.used + need > self.limit):
            raise RuntimeError("an attack tried to exceed its per-image query budget Q_m")
        try:
            answer = np.asarray(query(images, idx.copy()))
        except BudgetExhausted:
            for i in idx:
                self.stop[int(i)] = STOP_PROXY_BUDGET
            return None
        self.used += need
        return answer

    def running(self) -> np.ndarray:
        """Indices still running; an image that spent Q_m stops here with ``budget``."""
        for i in range(self.used.shape[0]):
            if self.stop[i] is None and self.used[i] >= self.limit:
                self.stop[i] = STOP_BUDGET
        return np.array([i for i, s in enumerate(self.stop) if s is None], dtype=np.int64)


# --------------------------------------------------------------------------------------------
# The registry entry and the run context
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class AttackContext:
    """Everything one run of an attack may use. ``images`` N x H x W x C uint8 of one shape;
    ``labels`` the first true label of each (``label_sets`` all acceptable ones); ``params``
    validated against the spec's schema, defaults filled in; ``criterion`` the success
    criterion; ``query`` (query attacks: reaches the target through the proxy) or
    ``surrogate`` (transfer attacks: ``.model``, ``.input_spec``)."""

    spec: AttackSpec
    images: np.ndarray
    labels: np.ndarray
    image_ids: tuple[str, ...]
    label_sets: tuple[tuple[int, ...], ...]
    params: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    seed: int = 0
    criterion: Criterion = field(default_factory=Misclassification)
    query: QueryClient | None = None
    #: Transfer attacks: the surrogate they are crafted on; query attacks with
    #: ``spec.uses_surrogate``: the local prior the plan names.
    surrogate: Any = None
    #: Transfer attacks: further surrogates crafted on together with ``surrogate`` (IEEE-A7
    #: model ensembles; ``whitebox.WhiteBox`` averages their logits or losses).
    ensemble: tuple[Any, ...] = ()
    #: Per image, the reference the criterion compares with: detection ``judges.BoxReference``
    #: (objects of interest), segmentation an (H, W) int mask; None or empty = the clean
    #: answer (taken from the first, clean query: no extra query).
    references: tuple[Any, ...] = ()
    _judges: dict[str, Judge] = field(default_factory=dict, init=False, repr=False,
                                      compare=False)

    @property
    def key(self) -> tuple[str, ...]:
        """(attack id, image ids): one generator per call, so a rerun of the same chunk (e.g.
        after a restart) is identical."""
        return (self.spec.id, *self.image_ids)

    def rng(self) -> np.random.Generator:
        """The numpy generator of this call (seed, attack id, image ids)."""
        return rng_for(self.seed, *self.key)

    def torch_generator(self) -> torch.Generator:
        """The torch generator of this call (seed, attack id, image ids)."""
        return torch_generator_for(self.seed, *self.key)

    def derive_rng(self, *keys: object) -> np.random.Generator:
        """A generator for other keys of the same seed (e.g. one per image)."""
        return rng_for(self.seed, *keys)

    def spent(self) -> np.ndarray | None:
        """Per image, queries already charged against Q_m without an answer in this proxy
        session (a killed attempt's interrupted rows, failed rows), from the query client's
        ``lost`` when it has one, so resumed attempts never push an image past Q_m; None:
        nothing known."""
        lost = getattr(self.query, "lost", None)
        if lost is None:
            return None
        return np.asarray(lost(self.image_ids), dtype=np.int64)

    def query_client(self) -> QueryClient:
        """The query client (query attacks), or InvalidArgument naming the missing session."""
        if self.query is None:
            raise InvalidArgument("proxy_session_id",
                                  f"{self.spec.id} is a query attack: a proxy session is required")
        return self.query

    def score_query(self) -> ScoreQuery:
        """Scores through the proxy, each row charged to its image id."""
        client, ids = self.query_client(), self.image_ids
        return lambda batch, idx: client.scores(batch, [ids[i] for i in idx])

    def label_query(self) -> LabelQuery:
        """Top-1 labels through the proxy, each row charged to its image id."""
        client, ids = self.query_client(), self.image_ids
        return lambda batch, idx: client.labels(batch, [ids[i] for i in idx])

    @property
    def task(self) -> str:
        """The target's task type: the criterion's ("classification", "detection",
        "segmentation")."""
        return str(self.criterion.task)

    @property
    def signal(self) -> str:
        """What the target gives: "scores" (every class), "top_k" (the k best scores; classes
        not returned score 0 -- a weaker signal), "labels" (top-1 only: decision-based attacks
        only), "boxes" (detection), "masks" (segmentation; per-pixel probabilities used when
        an answer carries them); "" without a query client."""
        if self.query is None:
            return ""
        return str(getattr(self.query, "signal", None) or "scores")

    def judge(self) -> Judge:
        """The task judge of this call (one per context, so references taken from the clean
        answers are kept): see ``judges.py``."""
        j = self._judges.get("judge")
        if j is None:
            j = self._judges["judge"] = make_judge(
                self.task, self.criterion, self.query_client(), self.images, self.image_ids,
                self.labels, self.references)
        return j

    def used_signal(self) -> str:
        """What the attack read from the target's answers (reports: a weaker signal than full
        scores is stated); "" when it asked nothing through the judge."""
        j = self._judges.get("judge")
        return j.signal() if j is not None else ""

    def margin_query(self) -> MarginQuery:
        """The criterion's margin on the target's answers (score-based attacks): < 0 exactly
        where the attack has succeeded, whatever the task (class scores, a detector's boxes,
        a segmenter's masks and probabilities: ``judges.py``)."""
        return self.judge().margins

    def decision_query(self) -> DecisionQuery:
        """Whether the criterion holds on the target's answers (decision-based attacks): top-1
        labels where the criterion is decidable from them, else the margin's sign."""
        return self.judge().decisions


#: ``run(ctx) -> one AttackResult per image, in order``.
RunFn = Callable[[AttackContext], list[AttackResult]]


@dataclass(frozen=True, kw_only=True)
class AttackSpec:
    """One entry of the attack registry (``registry.py``), listed by ``ListAttacks``."""

    id: str                        # unique, snake_case
    kind: AttackKind               # transfer (IEEE-A7) | score | decision (IEEE-A8)
    family: str
    norms: tuple[Norm, ...]        # the norm(s) its bound is in (IEEE-A9)
    refs: tuple[str, ...]          # SPEC requirement ids; refs[0] is the primary one
    description: str
    run: RunFn
    params: tuple[Param, ...] = ()
    targeted: bool = False         # accepts a targeted criterion (TargetedMisclassification, ...)
    untargeted: bool = True
    needs_surrogate: bool = False  # crafted white-box on a local surrogate (transfer)
    stochastic: bool = True
    #: The task types it attacks (IEEE-P3). None: every task for a query attack (it judges
    #: through ``ctx.margin_query()`` / ``ctx.decision_query()``, which serve them all),
    #: classification for a transfer attack.
    tasks: tuple[Task, ...] | None = None
    #: A query attack that takes a local surrogate as a prior (P-RGF, ODS): the plan's
    #: ``surrogate`` reaches it as ``ctx.surrogate``; a plan must name one.
    uses_surrogate: bool = False
    #: A minimal-norm attack: it searches the smallest perturbation that meets the criterion,
    #: succeeds when that lies within the bound (if any), and returns its best point even when
    #: it does not. Any other attack with a bound returns every image within it (IEEE-A9).
    minimal_norm: bool = False
    #: Rules between parameters that the schema's per-parameter bounds cannot say (e.g. an
    #: L-inf epsilon <= 1 where epsilon also serves L2): called with the validated
    #: parameters before the attack runs and by ValidateAttack; raises InvalidArgument.
    check: Callable[[Mapping[str, Any]], None] | None = None

    def __post_init__(self) -> None:
        if self.kind not in ATTACK_KINDS:
            raise ValueError(f"{self.id}: kind must be one of {ATTACK_KINDS}")
        if not self.norms or not set(self.norms) <= set(NORMS):
            raise ValueError(f"{self.id}: norms must be a non-empty subset of {NORMS}")
        if not self.refs or not (self.targeted or self.untargeted):
            raise ValueError(f"{self.id}: needs refs and targeted and/or untargeted")
        if self.needs_surrogate != (self.kind == "transfer"):
            raise ValueError(f"{self.id}: transfer attacks (only) need a surrogate")
        if self.uses_surrogate and self.kind == "transfer":
            raise ValueError(f"{self.id}: uses_surrogate is for query attacks (a transfer "
                             "attack needs its surrogate)")
        if self.tasks is None:
            object.__setattr__(self, "tasks", TASKS if self.kind != "transfer"
                               else (Task.CLASSIFICATION,))
        elif not self.tasks or not set(self.tasks) <= set(TASKS):
            raise ValueError(f"{self.id}: tasks must be a non-empty subset of "
                             f"{', '.join(TASKS)}")

    @property
    def is_query_attack(self) -> bool:
        return self.kind in ("score", "decision")

    def supports_task(self, task: str) -> bool:
        """Whether it attacks targets of ``task`` (``tasks``)."""
        return task in (self.tasks or ())

    @property
    def norm(self) -> str:
        """The norm epsilon bounds (the first of ``norms``)."""
        return self.norms[0]

    @property
    def ieee_ref(self) -> str:
        """The primary requirement (``refs[0]``), as reports print it."""
        return self.refs[0]
