"""Sequential acceptance: stop sending a setting's images once every criterion that reads it
is decided (the plan's ``acceptance: {..., sequential: true}``). Domain code, no gRPC.

Why it is sound. The plan's M images are a finite population; the evaluation sends them in
one seeded random order (:func:`sequential_order`), so every prefix is a sample drawn
without replacement. After each round of chunks the criteria still open are judged by an
anytime-valid 95 % confidence sequence for a mean of values in [0, 1] sampled without
replacement (Waudby-Smith & Ramdas' betting confidence sequences,
``services/common/confseq.py``): it covers the population value at every prefix at once, so
at a stopping time chosen by looking at the data it still covers with 95 % (IEEE-M8 holds
at the stopping time), and a criterion is decided as soon as the sequence lies wholly on one
side of its threshold. On the whole population (a prefix of M images) the sequence is the
exact value, so a setting that never decides ends with the verdict of a full run.

What each criterion reads, per image ``i`` (``a_i`` in [0, b_i], ``b_i`` in {0, 1}; the
metric is sum(a) / sum(b) over the M images, IEEE-M1..M6):

- ``accuracy``: the clean verdict (the clean pass always runs on every image: every attack's
  success rate is counted over the images the target gets right);
- ``corruptions.<id>.<severity>``: Corr_Result(i, (id, severity)); ``.mean``: its mean over
  the corruption's severities; ``average_robustness_corr``: the mean over every corruption
  of those means (IEEE-M2 eq. (3) is exactly the mean over images of this per-image value);
  ``worstcase_robustness_corr``: the product over every setting (IEEE-M4);
- ``attacks.<name>.robustness_adv``: Adv_Result(i, name) over the attack's images;
  ``attacks.<name>.success_rate``: a_i = misled, b_i = attacked (clean-correct, not left out):
  a ratio, judged through ``y = a - t b + t`` (``confseq.ratio_transform``), whose mean is
  above ``t`` exactly when the ratio is.

Averages over attacks (``average_robustness_adv``, ``worstcase_robustness_adv``) span two
stages whose attacks may cover different images; counts (``mean_queries``) have no bounded
per-image value: their settings run on every image, as without ``sequential``. A setting
that no criterion reads runs on every image, or is skipped when the plan says
``sequential: {unreferenced: skip}``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import structlog
from fortis.services.common import confseq
from fortis.services.common.acceptance import Criterion
from fortis.services.common.seeding import rng_for
from fortis.services.evaluation.convert import setting_verdicts
from fortis.services.evaluation.plan import Plan
from fortis.services.evaluation.ports import ScoringPort, ScoringSetup, Setting

__all__ = ["ALPHA", "SequentialRun", "SettingKey", "is_sequential", "sequential_order",
           "setting_statuses"]

log = structlog.get_logger("fortis.evaluation.sequential")

#: Error level of every confidence sequence: 95 % intervals, as the report's (IEEE-M8).
ALPHA: Final = 0.05

#: A setting: ("clean",), ("corruption", id, severity), ("attack", name).
SettingKey = tuple[Any, ...]


def is_sequential(plan: Plan) -> bool:
    """Whether some acceptance criterion of ``plan`` is judged sequentially."""
    return any(c.sequential for c in plan.acceptance)


def setting_statuses(plan: Plan, n_images: int) -> dict[str, str]:
    """Each corruption and attack setting of ``plan`` (as reports name it, ``fog@3``,
    ``square``) -> ``open`` (may stop early), ``full`` or ``skip``: what the query estimate
    counts on before the run."""
    stopping = Stopping.of(plan, n_images)
    keys: list[SettingKey] = [("corruption", ct.id, s) for ct in plan.corruptions
                              for s in ct.severities]
    keys += [("attack", at.name) for at in plan.attacks]
    return {_label(k): stopping.status(k) for k in keys}


def sequential_order(n: int, seed: int) -> np.ndarray:
    """The seeded random order the images are sent in (a permutation of 0..n-1), derived
    from the plan's seed alone: a rerun or a resumed run sends the same prefixes."""
    return rng_for(seed, "sequential-order").permutation(n)


def _key(s: Setting) -> SettingKey:
    if s.kind == "clean":
        return ("clean",)
    if s.kind in ("corruption", "degradation"):
        return (s.kind, s.name, int(s.level))
    return ("attack", s.name)


@dataclass
class _Decision:
    criterion: Criterion
    reads: frozenset[SettingKey]
    population: int
    #: None while open; "pass" / "fail" once the confidence sequence decided it.
    decided: str | None = None
    images: int = 0
    interval: tuple[float, float] | None = None
    estimate: float | None = None


def _reads(plan: Plan, c: Criterion) -> frozenset[SettingKey]:
    """The settings criterion ``c`` reads."""
    if c.scope == "corruption":
        return frozenset(("corruption", c.setting, s) for ct in plan.corruptions
                         if ct.id == c.setting for s in ct.severities
                         if c.measure == "mean" or s == c.severity)
    if c.scope == "attack":
        return frozenset({("attack", c.setting)})
    if c.metric == "accuracy":
        return frozenset({("clean",)})
    if c.metric.endswith("_corr"):
        return frozenset(("corruption", ct.id, s) for ct in plan.corruptions
                         for s in ct.severities)
    return frozenset(("attack", a.name) for a in plan.attacks)       # over every attack


@dataclass(frozen=True)
class Stopping:
    """Which settings of a plan may stop early: the sequential criteria (each with the
    settings it reads and its population) and the settings read by a criterion judged whole.
    Averages and worst cases over attacks are judged whole (module docstring); counts are
    never sequential (``acceptance.parse_acceptance``)."""

    plan: Plan
    criteria: tuple[tuple[Criterion, frozenset[SettingKey], int], ...]
    full: frozenset[SettingKey]

    @classmethod
    def of(cls, plan: Plan, n_images: int) -> Stopping:
        criteria: list[tuple[Criterion, frozenset[SettingKey], int]] = []
        full: set[SettingKey] = set()
        for c in plan.acceptance:
            reads = _reads(plan, c)
            if c.sequential and not c.metric.endswith("_adv"):
                at = next((a for a in plan.attacks if a.name == c.setting), None) \
                    if c.scope == "attack" else None
                pop = min(n_images, at.limit) if at is not None and at.limit else n_images
                criteria.append((c, reads, pop))
            else:       # judged whole: every setting it reads runs on every image
                full |= reads
        return cls(plan=plan, criteria=tuple(criteria), full=frozenset(full))

    def status(self, key: SettingKey) -> str:
        """``open`` (stopped once its criteria are decided), ``full`` (every image) or
        ``skip`` (no criterion reads it and the plan skips such settings)."""
        if key == ("clean",) or key in self.full:
            return "full"
        if any(key in reads for _, reads, _ in self.criteria):
            return "open"
        if key[0] == "degradation" or self.plan.sequential.unreferenced != "skip":
            return "full"
        return "skip"


@dataclass
class SequentialRun:
    """The stopping state of one evaluation: which settings are still sent images.

    Stages ask :meth:`status` of each setting before they run it, run the open ones in
    rounds of chunks, and after each round call :meth:`update` with every open setting's
    answers so far; the settings whose criteria are all decided stop there. Everything is
    derived from stored results in a fixed order, so a resumed run (or each worker of a
    fan-out) decides the same."""

    plan: Plan
    n_images: int
    scoring: ScoringPort
    setup: ScoringSetup
    #: A setting as scoring takes it (the runner's: segmentation masks on the truth's grid).
    prepare: Callable[[Setting], Setting] = lambda s: s
    clean: Setting | None = None
    decisions: list[_Decision] = field(default_factory=list)
    #: setting -> images it was planned for
    planned: dict[SettingKey, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.stopping = Stopping.of(self.plan, self.n_images)
        self.decisions = [_Decision(criterion=c, reads=reads, population=pop)
                          for c, reads, pop in self.stopping.criteria]

    # -- what the stages ask -----------------------------------------------------------------
    @property
    def active(self) -> bool:
        return bool(self.decisions)

    def status(self, key: SettingKey) -> str:
        """See :meth:`Stopping.status`."""
        return self.stopping.status(key)

    def is_open(self, key: SettingKey) -> bool:
        """Whether ``key`` is still to be sent more images."""
        st = self.status(key)
        if st != "open":
            return st == "full"
        return any(d.decided is None for d in self.decisions if key in d.reads)

    def plan_setting(self, key: SettingKey, images: int) -> None:
        self.planned[key] = images

    def set_clean(self, clean: Setting) -> None:
        """The clean pass ran (on every image): criteria on it alone are judged now."""
        self.clean = self.prepare(clean)
        self.update([])

    # -- after each round ------------------------------------------------------------------
    def update(self, settings: Sequence[Setting]) -> None:
        """Judge the open criteria on ``settings`` (every setting of the stage sent images so
        far, each over its prefix: ``image_index`` 0..n-1 in the sequential order)."""
        by_key = {_key(s): s for s in settings}
        if self.clean is not None:
            by_key[("clean",)] = self.clean
        todo = [d for d in self.decisions if d.decided is None and d.reads <= by_key.keys()]
        if not todo or self.clean is None:
            return
        wanted = {k for d in todo for k in d.reads}
        scored = self.scoring.score(self.setup, [self.clean, *(
            self.prepare(by_key[k]) for k in sorted(wanted, key=str) if k != ("clean",))])
        verdicts = setting_verdicts(scored.metrics)
        clean = verdicts.get(("clean", "", 0))
        if clean is None:
            return
        for d in todo:
            ab = self._values(d, by_key, verdicts, clean)
            if ab is None:
                continue
            self._judge(d, *ab)

    def _values(self, d: _Decision, by_key: Mapping[SettingKey, Setting],
                verdicts: Mapping[tuple[str, str, int], np.ndarray], clean: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray] | None:
        c = d.criterion
        if c.metric == "accuracy":
            return clean.astype(float), np.ones(clean.size)
        cols = []
        for k in sorted(d.reads, key=str):
            s = by_key[k]
            v = verdicts.get((s.kind, s.name, int(s.level)))
            if v is None:
                return None
            cols.append((k, s, v))
        n = min(v.size for _, _, v in cols)
        if c.scope == "attack":
            _, s, v = cols[0]
            v = v[:n]
            if c.measure == "robustness_adv":
                return v.astype(float), np.ones(n)
            excluded = np.asarray(s.excluded[:n] if s.excluded else np.zeros(n), dtype=bool)
            attacked = clean[:n] & ~excluded
            if s.kind == "query_attack":
                misled = attacked & np.asarray(s.success[:n], dtype=bool)
            else:
                misled = attacked & ~v
            return misled.astype(float), attacked.astype(float)
        mat = np.stack([v[:n] for _, _, v in cols]).astype(float)
        if c.metric == "worstcase_robustness_corr":
            return mat.min(axis=0), np.ones(n)
        # means over severities, then over corruptions (IEEE-M2 eq. (3), M7)
        names = sorted({k[1] for k, _, _ in cols})
        per = [mat[[j for j, (k, _, _) in enumerate(cols) if k[1] == nm]].mean(axis=0)
               for nm in names]
        return np.mean(per, axis=0), np.ones(n)

    def _judge(self, d: _Decision, a: np.ndarray, b: np.ndarray) -> None:
        c = d.criterion
        d.images = int(a.size)
        t = c.threshold
        y = confseq.ratio_transform(a, b, t)
        side = confseq.decide(y, population=d.population, threshold=t, alpha=ALPHA)
        d.estimate = float(a.sum() / b.sum()) if b.sum() > 0 else None
        d.interval = confseq.ratio_interval(a, b, population=d.population, alpha=ALPHA)
        if side == 0:
            if a.size >= d.population:       # every image seen: the exact value decides
                d.decided = "pass" if d.estimate is not None and c.holds(d.estimate) else "fail"
            return
        above = side > 0
        d.decided = "pass" if above == (c.op in (">=", ">")) else "fail"
        log.info("sequential_decided", criterion=c.text, outcome=d.decided, images=d.images,
                 population=d.population)

    # -- the report ------------------------------------------------------------------------
    def record(self, settings: Sequence[Setting] = ()) -> dict[str, Any]:
        """Plain data for the report: each sequential criterion (its time-uniform interval at
        the stopping time, when it was decided) and each setting (images used vs planned)."""
        crit = [{"metric": d.criterion.metric, "op": d.criterion.op,
                 "threshold": d.criterion.threshold, "outcome": d.decided or "open",
                 "images": d.images, "population": d.population,
                 "estimate": d.estimate,
                 "interval": list(d.interval) if d.interval is not None else None}
                for d in self.decisions]
        by_key = {_key(s): s for s in settings}
        rows = []
        for k, planned in self.planned.items():
            s = by_key.get(k)           # none: skipped, or failed (failed_settings
            # gives how far a failed one got)
            used = 0 if s is None else len(s.image_index) if s.image_index else self.n_images
            row: dict[str, Any] = {"setting": _label(k), "status": self.status(k),
                                   "stopped_early": used < planned,
                                   "images_planned": planned, "images_used": used}
            if s is not None and s.kind == "query_attack":
                spent = int(sum(s.queries))
                per = spent / used if used else 0.0
                # a query attack's queries per image vary: the images not sent would have
                # cost about the mean of those sent (never more than Q_m each)
                row.update(queries_used=spent, queries_upper_bound=planned * s.query_budget,
                           queries_saved_estimate=round(per * (planned - used)),
                           queries_saved_kind="estimated from the mean per image sent")
            else:
                row.update(queries_used=used, queries_planned=planned,
                           queries_saved_estimate=planned - used,
                           queries_saved_kind="exact: one query per image")
            rows.append(row)
        saved = sum(r["queries_saved_estimate"] for r in rows)
        return {"alpha": ALPHA, "method": _METHOD, "order_seed": self.plan.seed,
                "unreferenced": self.plan.sequential.unreferenced,
                "queries_saved_estimate": saved, "criteria": crit, "settings": rows}


_METHOD: Final = ("betting confidence sequence for sampling without replacement "
                  "(Waudby-Smith & Ramdas), time-uniform: it covers at any stopping time")


def _label(k: SettingKey) -> str:
    if k[0] in ("corruption", "degradation"):
        return f"{k[1]}@{k[2]}"
    return str(k[-1])
