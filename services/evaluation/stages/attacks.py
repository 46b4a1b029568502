"""The adversarial stages (IEEE-M3, M5, M6; IEEE-A7..A9).

- :class:`TransferAttackStage`: adversarials crafted white-box on the plan's surrogate
  (IEEE-A7), bounded before the attack (IEEE-A9), quantised to uint8 and sent to the target
  through the proxy; judged on the target's answer to the image it received (IEEE-C1..C3,
  or IEEE-C4 / C5 on a detector or segmenter: crafted on a surrogate of that task, with each
  image's ground truth as the reference its task loss moves away from).
- :class:`QueryAttackStage`: score- and decision-based attacks (IEEE-A8) that query the
  target only through the proxy, in one proxy session per chunk (``.../<chunk>/a1``, opened
  by the first attempt and continued by every resumed one), with the per-image budget Q_m
  enforced by the proxy over all attempts together (resumed attempts never push an
  image past Q_m; a killed attempt's unanswered rows stay charged, its answered queries are
  replayed to the resumed attempt, which repeats them: CAN-9); queries per image are the
  ledger's answered rows of that session. Classifiers, detectors and segmenters alike: each
  attack carries the plan's success criterion (untargeted or ``targeted: {label: N}``, a
  PER-2 kind, the IEEE-C4 / C5 rule of the plan's detection / segmentation section) and, for
  detection and segmentation, each image's ground truth (boxes with their classes in pixel
  xyxy, masks) as the reference the criterion compares with; success is judged by the
  perturbation service on the answer to the uint8 image the target received.

Domain code.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import numpy as np
from fortis.core.task import Task
from fortis.services.common.arrays import l2_distance, linf_distance
from fortis.services.common.matching import to_xyxy
from fortis.services.evaluation.answers import ClassAnswers, concat
from fortis.services.evaluation.keys import SessionId, StageName, WorkItemKey
from fortis.services.evaluation.plan import AttackTest, Plan, surrogate_specs
from fortis.services.evaluation.ports import AttackOutcome, Catalogue, Setting, TestDefinition
from fortis.services.evaluation.selection import SELECT_DEFAULTS, select_epsilon, trace_text
from fortis.services.evaluation.stages.base import (
    RunContext,
    chunks,
    guarded,
    in_rounds,
    is_failed,
    setting_failure,
)

__all__ = ["QueryAttackStage", "TransferAttackStage", "attack_references", "attack_tests"]


def _n(plan: Plan, at: AttackTest, n_images: int) -> int:
    return min(n_images, at.limit) if at.limit else n_images


def left_out(plan: Plan, at: AttackTest, rows: Sequence[Any]) -> tuple[tuple[bool, ...], str]:
    """Per image of ``rows``, whether the attack's success criterion leaves it out before the
    attack, and why: a targeted attack on a classifier cannot move an image whose true label
    set holds the target class "to" that class (the target classifying it correctly already
    meets the criterion: a success that is not one). Such images are not attacked (no
    query is spent on them) and are no part of its success rate, queries, curve or PER-3/4."""
    target = at.criterion.get("target_label") if plan.target.task == Task.CLASSIFICATION else None
    if target is None:
        return (False,) * len(rows), ""
    flags = tuple(int(target) in tuple(r[2]) for r in rows)
    return flags, (f"their true class is the target class {int(target)}: a targeted attack "
                   "cannot move them there" if any(flags) else "")


def attack_references(task: Task, truths: Mapping[str, Any], ids: Sequence[str]) -> list[Any]:
    """The criterion's reference of each image: detection ground truth as pixel xyxy boxes
    with 0-based service labels (``{"boxes", "labels"}``, converted with the scoring rule's
    ``common.matching.to_xyxy``), segmentation masks; None where there is none (the
    perturbation service then takes the clean answer's)."""
    out: list[Any] = []
    for i in ids:
        t = truths.get(i)
        if t is None or task == Task.CLASSIFICATION:
            out.append(None)
        elif task == Task.DETECTION:
            size = t.get("image_size")
            boxes = to_xyxy(t.get("boxes") or [], str(t.get("box_format", "xyxy")),
                            image_size=tuple(size) if size else None,
                            field=f"dataset[{i}].boxes")
            base = int(t.get("label_base", 0))
            out.append({"boxes": boxes, "labels": [int(x) - base for x in t.get("labels") or []]})
        else:
            out.append(np.asarray(t))
    return out


def attack_tests(plan: Plan, n_images: int, catalogue: Catalogue,
                 observed: Mapping[str, tuple[str, str]] | None = None,
                 selected: Mapping[str, tuple[float, str]] | None = None) -> list[TestDefinition]:
    """The plan's attacks as the report lists them, in plan order; ``observed``: per attack
    name, (signal, criterion in words) as the perturbation service reported them;
    ``selected``: per attack name, the epsilon CAN-6 selected and how."""
    out = []
    seen = observed or {}
    for at in plan.attacks:
        e = catalogue.attacks[at.id]
        if selected and at.name in selected:
            eps_sel, how = selected[at.name]
            at = replace(at, params={**at.params, "epsilon": eps_sel,
                                     "epsilon_planned": at.params.get("epsilon"),
                                     "epsilon_selection": how})
        eps = at.params.get("epsilon")
        signal, words = seen.get(at.name, ("", ""))
        out.append(TestDefinition(
            name=at.name, kind=f"{e.kind}_attack", perturbation_id=at.id, family=e.family,
            refs=e.refs, params=dict(at.params),
            surrogate=" + ".join((at.surrogate, *at.ensemble)) if at.surrogate else "",
            epsilon=float(eps) if isinstance(eps, int | float) else None, norm=e.norm,
            query_budget=int(at.params["max_queries"]) if e.is_query_attack else None,
            images=_n(plan, at, n_images), signal=signal,
            criterion=words or str(at.criterion.get("kind", "")).replace("_", " ")))
    return out


def surrogate_args(plan: Plan, ctx: RunContext, at: AttackTest) -> dict[str, Any]:
    """An attack's ensemble and the definitions of the plan's own surrogates it names,
    resolved against the target's labels (IEEE-A7, IEEE-P6); nothing when it names none."""
    names = [n for n in (at.surrogate, *at.ensemble) if n]
    if not names:
        return {}
    specs = surrogate_specs(plan, ctx.target.labels) if plan.surrogates else {}
    out: dict[str, Any] = {}
    if at.ensemble:
        out["ensemble"] = tuple(at.ensemble)
    used = [specs[n] for n in names if n in specs]
    if used:
        out["surrogate_models"] = used
    return out


@dataclass
class _AttackStage:
    """What both attack stages share: the plan's attacks of one family, one work item per
    chunk of the images each attack covers (its ``limit``)."""

    plan: Plan
    n_images: int
    catalogue: Catalogue
    query: bool = False

    def _attacks(self) -> list[AttackTest]:
        return [a for a in self.plan.attacks
                if self.catalogue.attacks[a.id].is_query_attack == self.query]

    def keys(self) -> list[WorkItemKey]:
        return [WorkItemKey(StageName.ATTACKS, at.name, chunk=c) for at in self._attacks()
                for c, _ in enumerate(chunks(_n(self.plan, at, self.n_images), self.plan.batch_size))]

    def images_total(self) -> int:
        return sum(_n(self.plan, at, self.n_images) for at in self._attacks())

    def tests(self) -> list[TestDefinition]:
        return []      # every attack is listed in plan order by attack_tests()


@dataclass
class TransferAttackStage(_AttackStage):
    progress_stage: str = "transfer_attacks"
    #: CAN-6: per attack name, the epsilon selected and the trace of the points tried.
    selected: dict[str, tuple[float, str]] = field(default_factory=dict)

    def keys(self) -> list[WorkItemKey]:
        """The chunks, after each attack's CAN-6 budget selection where the plan asks."""
        out = []
        for at in self._attacks():
            if at.select_budget:
                out.append(WorkItemKey(StageName.ATTACKS, f"{at.name}.select", chunk=0))
            out += [WorkItemKey(StageName.ATTACKS, at.name, chunk=c) for c, _ in
                    enumerate(chunks(_n(self.plan, at, self.n_images), self.plan.batch_size))]
        return out

    def _select(self, ctx: RunContext, at: AttackTest) -> AttackTest:
        """The attack at the epsilon CAN-6 selects (``selection.py``): CANARY's MR (top-1
        misclassification among the images the target gets right) measured on the target
        through the proxy, in the attack's own session ``<name>.select`` (every query in the
        ledger); stored as a work item, so a resumed evaluation reuses it."""
        if not at.select_budget:
            return at
        cfg = {**SELECT_DEFAULTS, **at.select_budget}
        rows = list(ctx.images[:min(int(cfg["images"]), _n(self.plan, at, self.n_images))])
        upper = 1.0 if self.catalogue.attacks[at.id].norm == "linf" else float(
            np.sqrt(np.prod(rows[0][1].shape))) if rows else 1.0
        session = SessionId.transfer(ctx.evaluation_id, f"{at.name}.select").format()
        ids = [str(r[0]) for r in rows]
        used = [0]

        def work(_attempt: int) -> tuple[dict[str, Any], int]:
            ctx.proxy.open_session(session_id=session, target=self.plan.target.name,
                                   description=f"CAN-6 budget selection of {at.name}")
            clean = ctx.answers(session, f"{at.name}.select/clean", [(r[0], r[1]) for r in rows])
            top = clean.top1() if isinstance(clean, ClassAnswers) else None
            right = [i for i, r in enumerate(rows)
                     if top is not None and not clean.errors[i] and int(top[i]) in r[2]]
            used[0] += len(rows)

            def measure(eps: float) -> tuple[int, int]:
                if not right:
                    return 0, 0
                outs = ctx.perturbation.attack(at.id, {**at.params, "epsilon": eps},
                                               self.plan.seed, [rows[i] for i in right],
                                               surrogate=at.surrogate, criterion=at.criterion,
                                               **surrogate_args(self.plan, ctx, at))
                adv = ctx.answers(session, f"{at.name}.select/{eps:.6g}",
                                  [(ids[i], o.adversarial) for i, o in zip(right, outs,
                                                                            strict=True)])
                used[0] += len(outs)
                t = adv.top1() if isinstance(adv, ClassAnswers) else None
                misled = sum(1 for j, i in enumerate(right) if t is not None
                             and not adv.errors[j] and int(t[j]) not in rows[i][2])
                return misled, len(right)

            eps, trace = select_epsilon(at, measure, upper)
            return {"epsilon": eps, "trace": trace_text(trace)}, used[0]

        key = WorkItemKey(StageName.ATTACKS, f"{at.name}.select", chunk=0)
        res = ctx.item(key, 0, guarded(key.format(), work))
        if is_failed(res):
            raise _SelectionFailed(res)
        eps = float(res["epsilon"])
        self.selected[at.name] = (eps, str(res["trace"]))
        return replace(at, params={**at.params, "epsilon": eps})

    def run(self, ctx: RunContext) -> list[Setting]:
        settings = []
        for at in self._attacks():
            n = _n(self.plan, at, self.n_images)
            ranges = chunks(n, self.plan.batch_size)
            try:
                at = self._select(ctx, at)
            except _SelectionFailed as exc:
                settings.append(Setting(kind="transfer_attack", name=at.name, failure=(
                    setting_failure([exc.result], [n]))))
                continue
            session = SessionId.transfer(ctx.evaluation_id, at.name).format()
            ctx.proxy.open_session(session_id=session, target=self.plan.target.name,
                                   description=f"transfer attack {at.name}")
            # One chunk at a time in this process (as before); workers share them.
            keys = [WorkItemKey(StageName.ATTACKS, at.name, chunk=c) for c in range(len(ranges))]
            jobs = [(key, b - a, guarded(key.format(), partial(
                    self._item, ctx, session, list(ctx.images[a:b]), at, c)))
                    for c, (key, (a, b)) in enumerate(zip(keys, ranges, strict=True))]
            sizes = [b - a for a, b in ranges]
            results = _attack_results(ctx, ("attack", at.name), n, jobs, partial(
                self._setting, ctx, at, sizes), parallel=1)
            if results is None:
                continue                      # skipped: no criterion reads it
            failure = setting_failure(results, sizes[:len(results)])
            if failure is not None:
                settings.append(Setting(kind="transfer_attack", name=at.name, failure=failure))
                continue
            settings.append(self._setting(ctx, at, sizes, ("attack", at.name), results))
        return settings

    def _setting(self, ctx: RunContext, at: AttackTest, sizes: Sequence[int],
                 _key: Any, results: Sequence[Mapping[str, Any]]) -> Setting:
        """The attack's setting from its chunks' results (its first chunks, under
        sequential acceptance)."""
        n = sum(sizes[:len(results)])
        parts, linf, l2 = [], [], []
        for res in results:
            parts.append(res["answers"])
            linf += [float(x) for x in res["linf"]]
            l2 += [float(x) for x in res["l2"]]
        answers = concat(parts) if parts else ClassAnswers.from_rows([], [], [])
        excluded, why = left_out(self.plan, at, ctx.images[:n])
        return Setting(kind="transfer_attack", name=at.name, image_index=tuple(range(n)),
                       answers=answers, linf=tuple(linf), l2=tuple(l2), excluded=excluded,
                       excluded_reason=why)

    def _item(self, ctx: RunContext, session: str, rows: list[Any], at: AttackTest, c: int,
              _attempt: int) -> tuple[dict[str, Any], int]:
        # Crafted once per (attack, surrogate, image) and kept before anything is sent: a
        # resumed attempt at this chunk sends the stored images instead of crafting again
        # (CAN-9); the target's answers come from the proxy session as for any attempt.
        ids = [str(r[0]) for r in rows]
        kept = ctx.load_adversarials(at.name, c, ids)
        if kept is None:
            # detection / segmentation: each image's ground truth is what the surrogate's
            # task loss moves away from (None: the surrogate's own answer)
            refs = attack_references(self.plan.target.task, ctx.truths, ids) \
                if ctx.truths and self.plan.target.task != Task.CLASSIFICATION else None
            t0 = time.perf_counter()
            outs = ctx.perturbation.attack(at.id, at.params, self.plan.seed, rows,
                                           surrogate=at.surrogate, criterion=at.criterion,
                                           references=refs,
                                           **surrogate_args(self.plan, ctx, at))
            seconds: float | None = time.perf_counter() - t0      # CAN-3 CTC
            u8 = [o.adversarial for o in outs]
            ctx.save_adversarials(at.name, c, ids, u8, [o.adversarial_float for o in outs])
        else:
            seconds = None          # crafted by an earlier attempt: its time is unknown
            u8 = kept[0]
            ctx.progress.images(0, f"{at.name}: chunk {c} crafted before, sent as stored")
        answers = ctx.answers(session, at.name, list(zip(ids, u8, strict=True)))
        result = {"answers": answers,
                  "linf": np.array([linf_distance(r[1], a) for r, a in zip(rows, u8, strict=True)]),
                  "l2": np.array([l2_distance(r[1], a) for r, a in zip(rows, u8, strict=True)]),
                  "crafted": kept is None}
        if seconds is not None:
            result["seconds"] = seconds
        return result, len(u8)


@dataclass
class QueryAttackStage(_AttackStage):
    query: bool = True
    progress_stage: str = "query_attacks"
    #: Per attack name: (signal, criterion in words) the perturbation service reported.
    observed: dict[str, tuple[str, str]] = field(default_factory=dict)

    def sessions(self, ctx: RunContext) -> list[str]:
        """The proxy session of each chunk that finished, or failed after it was opened
        (every attempt at a chunk shares one session)."""
        out = []
        for key in self.keys():
            done, _, blob = ctx.store.item(ctx.evaluation_id, key.format())
            if done and blob is not None:
                out.append(SessionId.query(ctx.evaluation_id, key.setting, key.chunk,
                                           1).format())
        return out

    def run(self, ctx: RunContext) -> list[Setting]:
        settings = []
        for at in self._attacks():
            budget = int(at.params["max_queries"])
            n = _n(self.plan, at, self.n_images)
            ranges = chunks(n, self.plan.batch_size)
            keys = [WorkItemKey(StageName.ATTACKS, at.name, chunk=c) for c in range(len(ranges))]
            # Chunks in flight at once (the context's ``parallel``): an attack's queries are
            # sequential, each waiting for the proxy's durable ledger commit and the target,
            # so one chunk leaves the cores idle most of the time; another chunk's attack
            # computes meanwhile and the two chunks' ledger writes share a commit. Each chunk
            # has its own session, seeds and images, so its results do not depend on what
            # runs beside it (its CAN-3 wall time does: it is the time it took beside it).
            jobs = [(key, b - a, guarded(key.format(), partial(
                    self._item, ctx, list(ctx.images[a:b]), at, c, budget)))
                    for c, (key, (a, b)) in enumerate(zip(keys, ranges, strict=True))]
            sizes = [b - a for a, b in ranges]
            results = _attack_results(ctx, ("attack", at.name), n, jobs, partial(
                self._setting, ctx, at, sizes, budget), per_round=ctx.parallel)
            if results is None:
                continue                      # skipped: no criterion reads it
            failure = setting_failure(results, sizes[:len(results)])
            if failure is not None:
                settings.append(Setting(kind="query_attack", name=at.name, failure=failure,
                                        query_budget=budget))
                continue
            settings.append(self._setting(ctx, at, sizes, budget, ("attack", at.name),
                                          results))
        return settings

    def _setting(self, ctx: RunContext, at: AttackTest, sizes: Sequence[int], budget: int,
                 _key: Any, results: Sequence[Mapping[str, Any]]) -> Setting:
        """The attack's setting from its chunks' results (its first chunks, under
        sequential acceptance)."""
        n = sum(sizes[:len(results)])
        success: list[bool] = []
        queries: list[int] = []
        linf: list[float] = []
        l2: list[float] = []
        for res in results:
            success += [bool(x) for x in res["success"]]
            queries += [int(x) for x in res["ledger_queries"]]
            linf += [float(x) for x in res["linf"]]
            l2 += [float(x) for x in res["l2"]]
            if "signal" in res:
                self.observed[at.name] = (str(res["signal"]), str(res["criterion"]))
        excluded, why = left_out(self.plan, at, ctx.images[:n])
        return Setting(kind="query_attack", name=at.name, image_index=tuple(range(n)),
                       success=tuple(success), queries=tuple(queries), query_budget=budget,
                       linf=tuple(linf), l2=tuple(l2), excluded=excluded,
                       excluded_reason=why)

    def _item(self, ctx: RunContext, rows: list[Any], at: AttackTest, c: int, budget: int,
              attempt: int) -> tuple[dict[str, Any], int]:
        # One session for every attempt at the chunk: Q_m per image holds across them.
        session = SessionId.query(ctx.evaluation_id, at.name, c, 1).format()
        ctx.proxy.open_session(session_id=session, target=self.plan.target.name,
                               per_image_budget=budget, query_budget=budget * len(rows),
                               description=f"query attack {at.name}, chunk {c}")

        def on_result(o: AttackOutcome) -> None:
            ctx.progress.images(1, f"{at.name}: image {o.image_id} done")

        refs = attack_references(self.plan.target.task, ctx.truths, [r[0] for r in rows]) \
            if ctx.truths else None
        skip, _ = left_out(self.plan, at, rows)
        todo = [k for k, x in enumerate(skip) if not x]
        t0 = time.perf_counter()
        attacked = ctx.perturbation.attack(
            at.id, at.params, self.plan.seed, [rows[k] for k in todo], session_id=session,
            origin=at.name, on_result=on_result, cancelled=ctx.cancelled,
            surrogate=at.surrogate, criterion=at.criterion,
            references=[refs[k] for k in todo] if refs is not None else None,
            **surrogate_args(self.plan, ctx, at)) if todo else []
        by_row = dict(zip(todo, attacked, strict=True))
        outs = [by_row[k] if k in by_row else _not_attacked(rows[k]) for k in range(len(rows))]
        total, per_image = ctx.proxy.session_queries(session)
        ctx.save_adversarials(at.name, c, [o.image_id for o in outs],
                              [o.adversarial for o in outs], [o.adversarial_float for o in outs])
        return ({"success": np.array([bool(o.success) for o in outs]),
                 "attack_queries": np.array([o.queries for o in outs], dtype=np.int64),
                 "ledger_queries": np.array([per_image.get(o.image_id, 0) for o in outs],
                                            dtype=np.int64),
                 "linf": np.array([o.linf for o in outs]), "l2": np.array([o.l2 for o in outs]),
                 "stop_reason": [o.stop_reason for o in outs], "session": session,
                 "signal": _weakest(o.signal for o in outs),
                 "criterion": next((o.criterion for o in outs if o.criterion), ""),
                 # CAN-3 CTC: the attack's wall time for the chunk, queries included
                 "seconds": time.perf_counter() - t0}, total)


def _attack_results(ctx: RunContext, key: tuple[Any, ...], n: int, jobs: Sequence[Any],
                    prefix: Any, *, per_round: int = 1, parallel: int | None = None
                    ) -> list[dict[str, Any]] | None:
    """An attack's chunk results: every chunk, or under sequential acceptance the chunks
    sent until the criteria reading the attack were decided (``sequential.py``); None when
    sequential acceptance skips it (no criterion reads it)."""
    seq = ctx.sequential
    if seq is None or not seq.active:
        return ctx.items(jobs, parallel)
    seq.plan_setting(key, n)
    if seq.status(key) == "skip":
        return None
    return in_rounds(ctx, [(key, jobs)], prefix, per_round=per_round, parallel=parallel)[key]


def _not_attacked(row: Any) -> AttackOutcome:
    """The outcome of an image the criterion leaves out (``left_out``): the clean image,
    no query sent."""
    image = np.asarray(row[1])
    return AttackOutcome(image_id=str(row[0]), adversarial=image,
                         adversarial_float=image.astype(np.float32) / np.float32(255.0),
                         success=False, queries=0, linf=0.0, l2=0.0,
                         stop_reason="excluded", initially_correct=None)


class _SelectionFailed(Exception):
    """CAN-6's budget selection of an attack failed: the attack fails with its error."""

    def __init__(self, result: dict[str, Any]) -> None:
        super().__init__(str(result.get("message", "")))
        self.result = result


def _weakest(signals: Any) -> str:
    """The weakest signal the attack read over a chunk (an image that stopped at its clean
    query may have read less; say the least)."""
    order = ("labels", "decisions from top_k", "top_k", "decisions from masks", "masks",
             "decisions from scores", "probabilities", "decisions from boxes", "boxes", "scores")
    got = {s for s in signals if s}
    return next((s for s in order if s in got), next(iter(sorted(got)), ""))
