"""The stages that query the target with perturbed images: clean (IEEE-M1), corruptions and
styles (IEEE-A1..A6; IEEE-M2, M4, M7) and incremental degradation (DEG-1..4).

Each image gets one perturbation at one level (IEEE-P5), seeded from the plan, sent to the
target through the proxy: one query per image, recorded in the ledger. Domain code.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
from fortis.services.evaluation.answers import concat
from fortis.services.evaluation.keys import SessionId, StageName, WorkItemKey
from fortis.services.evaluation.plan import Plan
from fortis.services.evaluation.ports import Catalogue, Setting, TestDefinition
from fortis.services.evaluation.stages.base import (
    RunContext,
    chunks,
    guarded,
    in_rounds,
    setting_failure,
)

__all__ = ["CleanStage", "CorruptionStage", "DegradationStage"]


@dataclass
class CleanStage:
    """The clean images, one query each (IEEE-M1)."""

    plan: Plan
    n_images: int
    progress_stage: str = "clean"

    def keys(self) -> list[WorkItemKey]:
        return [WorkItemKey(StageName.CLEAN, chunk=c)
                for c, _ in enumerate(chunks(self.n_images, self.plan.batch_size))]

    def images_total(self) -> int:
        return self.n_images

    def tests(self) -> list[TestDefinition]:
        return []

    def run(self, ctx: RunContext) -> list[Setting]:
        session = SessionId.clean(ctx.evaluation_id).format()
        ctx.proxy.open_session(session_id=session, target=self.plan.target.name,
                               description="clean images")
        results = ctx.items([
            (WorkItemKey(StageName.CLEAN, chunk=c), b - a,
             partial(self._item, ctx, session, [(i, im) for i, im, _ in ctx.images[a:b]]))
            for c, (a, b) in enumerate(ctx.chunk_ranges)])
        return [Setting(kind="clean", answers=concat([r["answers"] for r in results]))]

    @staticmethod
    def _item(ctx: RunContext, session: str, part: list[tuple[str, Any]],
              _attempt: int) -> tuple[dict[str, Any], int]:
        return {"answers": ctx.answers(session, "clean", part)}, len(part)


@dataclass
class CorruptionStage:
    """Each corruption or style alone at each listed severity (IEEE-P5)."""

    plan: Plan
    n_images: int
    catalogue: Catalogue
    progress_stage: str = "corruptions"

    def keys(self) -> list[WorkItemKey]:
        n = len(chunks(self.n_images, self.plan.batch_size))
        return [WorkItemKey(StageName.CORRUPTIONS, ct.id, sev, c)
                for ct in self.plan.corruptions for sev in ct.severities for c in range(n)]

    def images_total(self) -> int:
        return self.n_images * sum(len(ct.severities) for ct in self.plan.corruptions)

    def tests(self) -> list[TestDefinition]:
        out = []
        for ct in self.plan.corruptions:
            e = self.catalogue.perturbations[ct.id]
            out.append(TestDefinition(name=ct.id, kind="style" if e.kind == "style" else "corruption",
                                      perturbation_id=ct.id,
                                      family=e.family, refs=e.refs, levels=ct.severities,
                                      params=dict(ct.params), catalogue_info=e.info,
                                      images=self.n_images))
        return out

    def run(self, ctx: RunContext) -> list[Setting]:
        if not self.plan.corruptions:
            return []
        session = SessionId.corruptions(ctx.evaluation_id).format()
        ctx.proxy.open_session(session_id=session, target=self.plan.target.name,
                               description="corrupted images")
        order = [(ct, sev) for ct in self.plan.corruptions for sev in ct.severities]
        if ctx.sequential is not None and ctx.sequential.active:
            return self._run_sequential(ctx, session, order)
        # Every setting's chunks in one call: items are independent, so the workers of a
        # fan-out share the whole stage, not one setting at a time (a setting of
        # one chunk would otherwise go to whichever worker reached it first, every time).
        keys = [(WorkItemKey(StageName.CORRUPTIONS, ct.id, sev, c), ct, sev, a, b)
                for ct, sev in order for c, (a, b) in enumerate(ctx.chunk_ranges)]
        results = ctx.items([
            (key, b - a, guarded(key.format(), partial(
                self._item, ctx, session, [(i, im) for i, im, _ in ctx.images[a:b]],
                ct.id, sev, dict(ct.params))))
            for key, ct, sev, a, b in keys])
        n = len(ctx.chunk_ranges)
        sizes = [b - a for a, b in ctx.chunk_ranges]
        out = []
        for k, (ct, sev) in enumerate(order):
            mine = results[k * n:(k + 1) * n]
            failure = setting_failure(mine, sizes)
            out.append(Setting(kind="corruption", name=ct.id, level=sev, failure=failure,
                               answers=None if failure else concat([r["answers"] for r in mine])))
        return out

    def _run_sequential(self, ctx: RunContext, session: str,
                        order: list[tuple[Any, int]]) -> list[Setting]:
        """Sequential acceptance: the settings side by side, one chunk of each per round,
        each stopped once the criteria reading it are decided (``sequential.py``)."""
        seq = ctx.sequential
        assert seq is not None
        sizes = [b - a for a, b in ctx.chunk_ranges]
        plans, params = [], {}
        for ct, sev in order:
            k = ("corruption", ct.id, sev)
            seq.plan_setting(k, self.n_images)
            if seq.status(k) == "skip":
                continue
            params[k] = dict(ct.params)
            plans.append((k, [
                (key, b - a, guarded(key.format(), partial(
                    self._item, ctx, session, [(i, im) for i, im, _ in ctx.images[a:b]],
                    ct.id, sev, params[k])))
                for c, (a, b) in enumerate(ctx.chunk_ranges)
                for key in [WorkItemKey(StageName.CORRUPTIONS, ct.id, sev, c)]]))

        def prefix(k: tuple[Any, ...], results: list[dict[str, Any]]) -> Setting:
            n = sum(sizes[:len(results)])
            return Setting(kind="corruption", name=k[1], level=k[2],
                           image_index=tuple(range(n)) if n < self.n_images else (),
                           answers=concat([r["answers"] for r in results]))

        done = in_rounds(ctx, plans, prefix)
        out = []
        for k, _ in plans:
            results = done[k]
            failure = setting_failure(results, sizes[:len(results)])
            out.append(Setting(kind="corruption", name=k[1], level=k[2], failure=failure)
                       if failure else prefix(k, results))
        return out

    def _item(self, ctx: RunContext, session: str, part: list[tuple[str, Any]], cid: str,
              sev: int, params: dict[str, Any], _attempt: int) -> tuple[dict[str, Any], int]:
        out = ctx.perturbation.perturb(cid, sev, self.plan.seed, part, params or None)
        sent = [(i, im) for (i, _), im in zip(part, out, strict=True)]
        return {"answers": ctx.answers(session, f"{cid}@{sev}", sent)}, len(part)


def _changed(original: np.ndarray, degraded: np.ndarray) -> float:
    """Fraction of pixels (any channel) that differ (DEG-4)."""
    if degraded.ndim == 3:
        return float(np.any(degraded != original, axis=-1).mean())
    return float((degraded != original).mean())


@dataclass
class DegradationStage:
    """Each incremental operator at each listed level (DEG-1); level L is the operator applied
    L times (the perturbation service replays levels 1..L-1 from the same generator)."""

    plan: Plan
    n_images: int
    catalogue: Catalogue
    progress_stage: str = "degradation"

    def keys(self) -> list[WorkItemKey]:
        n = len(chunks(self.n_images, self.plan.batch_size))
        return [WorkItemKey(StageName.DEGRADATION, dt.id, lv, c)
                for dt in self.plan.degradation for lv in dt.levels for c in range(n)]

    def images_total(self) -> int:
        return self.n_images * sum(len(dt.levels) for dt in self.plan.degradation)

    def tests(self) -> list[TestDefinition]:
        out = []
        for dt in self.plan.degradation:
            e = self.catalogue.perturbations[dt.id]
            out.append(TestDefinition(name=dt.id, kind="degradation", perturbation_id=dt.id,
                                      family=e.family, refs=e.refs, levels=dt.levels,
                                      catalogue_info=e.info, surrogate=dt.surrogate,
                                      images=self.n_images))
        return out

    def run(self, ctx: RunContext) -> list[Setting]:
        if not self.plan.degradation:
            return []
        session = SessionId.degradation(ctx.evaluation_id).format()
        ctx.proxy.open_session(session_id=session, target=self.plan.target.name,
                               description="degraded images")
        order = [(dt, lv) for dt in self.plan.degradation for lv in dt.levels]
        keys = [(WorkItemKey(StageName.DEGRADATION, dt.id, lv, c), dt, lv, a, b)
                for dt, lv in order for c, (a, b) in enumerate(ctx.chunk_ranges)]
        results = ctx.items([      # one call for the whole stage, as CorruptionStage
            (key, b - a, guarded(key.format(), partial(
                self._item, ctx, session, list(ctx.images[a:b]), dt.id, lv, dt.surrogate)))
            for key, dt, lv, a, b in keys])
        n = len(ctx.chunk_ranges)
        sizes = [b - a for a, b in ctx.chunk_ranges]
        settings = []
        for k, (dt, lv) in enumerate(order):
            mine = results[k * n:(k + 1) * n]
            failure = setting_failure(mine, sizes)
            if failure is not None:
                settings.append(Setting(kind="degradation", name=dt.id, level=lv,
                                        failure=failure))
                continue
            changed = [np.asarray(r["changed"], dtype=np.float64) for r in mine]
            settings.append(Setting(kind="degradation", name=dt.id, level=lv,
                                    answers=concat([r["answers"] for r in mine]),
                                    fraction_changed=round(float(np.mean(np.concatenate(changed))), 6)))
        return settings

    def _item(self, ctx: RunContext, session: str, rows: list[Any], did: str, lv: int,
              sur: str, _attempt: int) -> tuple[dict[str, Any], int]:
        part = [(i, im) for i, im, _ in rows]
        out = ctx.perturbation.perturb(did, lv, self.plan.seed, part, surrogate=sur,
                                       labels=[lab[0] for _, _, lab in rows] if sur else None)
        answers = ctx.answers(session, f"{did}@{lv}",
                              [(i, im) for (i, _), im in zip(part, out, strict=True)])
        ch = [_changed(im, d) for (_, im), d in zip(part, out, strict=True)]
        return {"answers": answers, "changed": np.asarray(ch)}, len(part)
