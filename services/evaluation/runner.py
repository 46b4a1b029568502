"""Runs one test plan (IEEE-P2): plan -> clean pass -> corruption robustness -> adversarial
robustness -> scoring -> report. Domain code: reaches the other services through ports.

Resumable (CAN-9): the work is cut into items (a chunk of images under one test); each item
commits its results to the store when it finishes, and a rerun skips finished items. Every
random draw is derived from the plan's seed and the item's identity, so a redone item gives
the same numbers. Query attacks open a fresh proxy session per attempt of an item: queries of
an attempt cut short by a crash stay in the ledger under their own session (reported as
aborted) and are never counted in the results.
"""

from __future__ import annotations

import base64
import datetime as _dt
import functools
import json
import platform
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np
from fortis.services.common.errors import FailedPrecondition, FortisError, InvalidArgument
from fortis.services.evaluation.plan import Plan
from fortis.services.evaluation.ports import (
    PerturbationPort,
    ProxyPort,
    ReportPort,
    ScoringPort,
    TargetDescription,
)
from fortis.services.evaluation.store import EvaluationStore
from fortis.services.perturbation.catalogue import ATTACKS
from fortis.services.perturbation.registry import PERTURBATIONS
from fortis.services.scoring.ieee import ClassPrediction

#: Scores kept per recorded prediction (enough for top-k rules; full vectors are not needed).
KEEP_SCORES = 20

LabeledImage = tuple[str, np.ndarray, tuple[int, ...]]
DatasetLoader = Callable[[Plan], list[LabeledImage]]


class Cancelled(FortisError):
    """The evaluation was cancelled by a caller."""


@dataclass(kw_only=True)
class RunContext:
    evaluation_id: str
    plan: Plan
    plan_text: str
    store: EvaluationStore
    proxy: ProxyPort
    perturbation: PerturbationPort
    scoring: ScoringPort
    report: ReportPort
    load_dataset: DatasetLoader
    artifacts_dir: Path
    cancelled: Callable[[], bool] = lambda: False
    items_done: int = 0
    queries: int = 0
    item_keys: list[str] = field(default_factory=list)


def _pred_json(p: ClassPrediction) -> dict[str, Any]:
    return {"labels": list(p.labels[:KEEP_SCORES]),
            "scores": None if p.scores is None else [round(float(s), 6) for s in p.scores[:KEEP_SCORES]],
            "error": p.error}


def _iso(t: float) -> str:
    return _dt.datetime.fromtimestamp(t, _dt.UTC).isoformat(timespec="seconds")


def _chunks(n: int, size: int) -> list[tuple[int, int]]:
    return [(s, min(s + size, n)) for s in range(0, n, size)]


def _dense_scores(preds: Mapping[str, Any], ids: Sequence[str], n_classes: int) -> np.ndarray:
    """M x C scores of recorded answers; NaN for classes not returned and for failed queries."""
    out = np.full((len(ids), n_classes), np.nan)
    for r, i in enumerate(ids):
        p = preds[i]
        if p.get("scores") and not p.get("error"):
            out[r, p["labels"]] = p["scores"]
    return out


def _query_errors(tests: Sequence[Mapping[str, Any]],
                  deg: Mapping[str, Mapping[int, Mapping[str, Any]]]) -> dict[str, Any]:
    """Per setting, the queries the target failed (down after retries, refused the image,
    answered something unusable): each is scored as incorrect and listed here (at most 20
    examples per setting), so a misbehaving target shows in the report, never as a crash."""
    settings: dict[str, Any] = {}

    def add(name: str, preds: Mapping[str, Any]) -> None:
        bad = [(i, p["error"]) for i, p in preds.items() if isinstance(p, Mapping) and p.get("error")]
        if bad:
            settings[name] = {"errors": len(bad), "of": len(preds),
                              "examples": [{"image_id": i, "error": str(e)[:300]} for i, e in bad[:20]]}
    for t in tests:
        if not t.get("predictions"):
            continue
        name = ("clean" if t["kind"] == "clean" else f"{t['perturbation_id']}@{t['severity']}"
                if t["kind"] == "corruption" else str(t["perturbation_id"]))
        add(name, t["predictions"])
    for op, levels in deg.items():
        for lv, preds in levels.items():
            add(f"{op}@level{lv}", preds)
    return {"total": sum(s["errors"] for s in settings.values()), "settings": settings}


def plan_items(plan: Plan, n_images: int) -> list[str]:
    """Every work item of a plan, in execution order."""
    keys = [f"clean/{c:05d}" for c, _ in enumerate(_chunks(n_images, plan.batch_size))]
    for ct in plan.corruptions:
        for sev in ct.severities:
            keys += [f"corr/{ct.id}/{sev}/{c:05d}" for c, _ in enumerate(_chunks(n_images, plan.batch_size))]
    for dt in plan.degradation:
        for lv in dt.levels:
            keys += [f"deg/{dt.id}/{lv}/{c:05d}" for c, _ in enumerate(_chunks(n_images, plan.batch_size))]
    for at in plan.attacks:
        n = min(n_images, at.limit) if at.limit else n_images
        keys += [f"attack/{at.name}/{c:05d}" for c, _ in enumerate(_chunks(n, plan.batch_size))]
    return keys


def check_target(plan: Plan, target: TargetDescription, images: Sequence[LabeledImage]) -> None:
    if target.task != plan.target.task:
        raise InvalidArgument("target.task", f"plan says {plan.target.task} but target '{target.name}' is {target.task}")
    n_labels = len(target.labels)
    for image_id, _, labels in images:
        for lab in labels:
            if not 0 <= lab < n_labels:
                raise InvalidArgument("dataset.label_map", f"image '{image_id}' has label {lab}, outside the target's {n_labels} labels")
    if plan.correctness["mode"] == "threshold" and target.output_kind == "label_only":
        raise InvalidArgument("correctness.mode", "threshold needs a score-returning target; this one returns labels only")
    for i, at in enumerate(plan.attacks):
        spec = ATTACKS[at.id]
        if spec.kind == "score" and target.output_kind == "label_only":
            raise InvalidArgument(f"attacks[{i}].id", f"{at.id} is score-based but target '{target.name}' returns labels only")


class EvaluationRunner:
    """Executes one evaluation to the end (or until cancelled / failed)."""

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self.plan = ctx.plan
        self.eid = ctx.evaluation_id

    # -- helpers ----------------------------------------------------------------------------
    def _progress(self, stage: str, message: str = "") -> None:
        self.ctx.store.update(self.eid, stage=stage, message=message)

    def _item(self, key: str, work: Callable[[int], tuple[Any, int]]) -> Any:
        """Run ``work(attempt)`` unless the item is already done; commit its result."""
        if self.ctx.cancelled():
            raise Cancelled("cancelled")
        done, _, result = self.ctx.store.item(self.eid, key)
        if done:
            return result
        attempt = self.ctx.store.start_item(self.eid, key)
        result, queries = work(attempt)
        self.ctx.items_done += 1
        self.ctx.queries += queries
        self.ctx.store.finish_item(self.eid, key, result, items_done=self.ctx.items_done,
                                   queries=self.ctx.queries, message=key)
        return result

    # -- the run ----------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        plan, store = self.plan, self.ctx.store
        started = time.time()
        store.update(self.eid, state="RUNNING", stage="plan", started_at=started)
        images = self.ctx.load_dataset(plan)
        if not images:
            raise FailedPrecondition("the plan's dataset selection is empty")
        target = self.ctx.proxy.target_info(plan.target.name)
        check_target(plan, target, images)
        keys = plan_items(plan, len(images))
        # Count what earlier runs already finished (resume).
        finished = {k for k, _, d in store.items(self.eid) if d}
        self.ctx.items_done = len([k for k in keys if k in finished])
        row = store.get(self.eid)
        self.ctx.queries = row.queries if row else 0
        store.update(self.eid, items_total=len(keys), items_done=self.ctx.items_done)
        ids = [i for i, _, _ in images]
        labels = {i: list(lab) for i, _, lab in images}
        chunks = _chunks(len(images), plan.batch_size)

        # Clean pass (IEEE-M1).
        self._progress("clean")
        sess_clean = f"{self.eid}/clean"
        self.ctx.proxy.open_session(session_id=sess_clean, target=plan.target.name,
                                    description="clean images")
        clean: dict[str, Any] = {}
        for c, (a, b) in enumerate(chunks):
            def clean_work(_att: int, a: int = a, b: int = b) -> tuple[Any, int]:
                part = [(i, im) for i, im, _ in images[a:b]]
                return self._answers(sess_clean, "clean", part), len(part)
            res = self._item(f"clean/{c:05d}", clean_work)
            clean.update(zip(ids[a:b], res, strict=True))

        # Corruption robustness (IEEE-M2, M4, M7): one corruption per image (IEEE-P5).
        self._progress("corruptions")
        sess_corr = f"{self.eid}/corruptions"
        self.ctx.proxy.open_session(session_id=sess_corr, target=plan.target.name,
                                    description="corrupted images")
        corr: dict[tuple[str, int], dict[str, Any]] = {}
        for ct in plan.corruptions:
            for sev in ct.severities:
                out: dict[str, Any] = {}
                for c, (a, b) in enumerate(chunks):
                    def work(_att: int, a: int = a, b: int = b, cid: str = ct.id, sev: int = sev,
                             ct: Any = ct) -> tuple[Any, int]:
                        part = [(i, im) for i, im, _ in images[a:b]]
                        corrupted = self.ctx.perturbation.corrupt(cid, sev, plan.seed, part,
                                                                  ct.params or None)
                        return self._answers(sess_corr, f"{cid}@{sev}", [
                            (i, im) for (i, _), im in zip(part, corrupted, strict=True)]), len(part)
                    res = self._item(f"corr/{ct.id}/{sev}/{c:05d}", work)
                    out.update(zip(ids[a:b], res, strict=True))
                corr[(ct.id, sev)] = out

        # Incremental degradation (DEG-1): each operator at each listed level; level L is
        # the operator applied L times (the perturbation service replays levels 1..L-1 from
        # the same per-image generator), one query per image and level.
        deg: dict[str, dict[int, dict[str, Any]]] = {}
        if plan.degradation:
            self._progress("degradation")
            sess_deg = f"{self.eid}/degradation"
            self.ctx.proxy.open_session(session_id=sess_deg, target=plan.target.name,
                                        description="degraded images")
            for dt in plan.degradation:
                deg[dt.id] = {}
                for lv in dt.levels:
                    dout: dict[str, Any] = {}
                    for c, (a, b) in enumerate(chunks):
                        def dwork(_att: int, a: int = a, b: int = b, dt: Any = dt, lv: int = lv
                                  ) -> tuple[Any, int]:
                            part = [(i, im) for i, im, _ in images[a:b]]
                            degraded = self.ctx.perturbation.corrupt(
                                dt.id, lv, plan.seed, part, surrogate=dt.surrogate,
                                labels=[lab[0] for _, _, lab in images[a:b]] if dt.surrogate else None)
                            preds = self.ctx.proxy.predict(
                                session_id=sess_deg, origin=f"{dt.id}@{lv}",
                                images=[(i, im) for (i, _), im in zip(part, degraded, strict=True)])
                            changed = [float(np.any(d != im, axis=-1).mean()) if d.ndim == 3
                                       else float((d != im).mean())
                                       for (_, im), d in zip(part, degraded, strict=True)]
                            return [{**_pred_json(p), "changed": ch}
                                    for p, ch in zip(preds, changed, strict=True)], len(part)
                        res = self._item(f"deg/{dt.id}/{lv}/{c:05d}", dwork)
                        dout.update(zip(ids[a:b], res, strict=True))
                    deg[dt.id][lv] = dout

        # Adversarial robustness (IEEE-M3, M5, M6).
        self._progress("attacks")
        attack_results: dict[str, dict[str, Any]] = {}
        for at in plan.attacks:
            spec = ATTACKS[at.id]
            n = min(len(images), at.limit) if at.limit else len(images)
            res_all: dict[str, Any] = {}
            sess_transfer = f"{self.eid}/attack/{at.name}"
            if not spec.is_query_attack:
                self.ctx.proxy.open_session(session_id=sess_transfer, target=plan.target.name,
                                            description=f"transfer attack {at.name}")
            for c, (a, b) in enumerate(_chunks(n, plan.batch_size)):
                key = f"attack/{at.name}/{c:05d}"
                part = list(images[a:b])
                if spec.is_query_attack:
                    res = self._item(key, functools.partial(self._query_attack, at, part, c))
                else:
                    res = self._item(key, functools.partial(self._transfer_attack_item, at, part, c,
                                                            sess_transfer))
                res_all.update(res)
            attack_results[at.name] = res_all

        # Scoring.
        self._progress("scoring")
        tests: list[dict[str, Any]] = [{"kind": "clean", "predictions": clean}]
        for (cid, sev), preds in corr.items():
            tests.append({"kind": "corruption", "perturbation_id": cid, "severity": sev,
                          "predictions": preds})
        for at in plan.attacks:
            r = attack_results[at.name]
            spec = ATTACKS[at.id]
            t: dict[str, Any] = {"kind": "attack", "perturbation_id": at.name,
                                 "query_budget": int(at.params.get("max_queries", 0)) if spec.is_query_attack else 0,
                                 "image_ids": list(r)}
            if spec.is_query_attack:
                t["success"] = {i: v["success"] for i, v in r.items()}
                t["queries"] = {i: v["ledger_queries"] for i, v in r.items()}
            else:
                t["predictions"] = {i: v["prediction"] for i, v in r.items()}
            tests.append(t)
        if plan.target.task == "classification":
            metrics = self.ctx.scoring.score(rule=plan.correctness, labels=labels, tests=tests)
            self._add_attack_distances(metrics, attack_results)
            metrics["ranking"] = self._ranking(target, clean, tests)
        else:
            metrics = self._score_task(ids, tests)
            metrics["ranking"] = {"applicable": False, "settings": {},
                                  "reason": f"NDCG and DRR rank classes; not defined for {plan.target.task}"}
        if deg:
            metrics["degradation"] = self._degradation(target, ids, labels, clean, deg)
        metrics["query_errors"] = _query_errors(tests, deg)

        # Report (IEEE-P4).
        self._progress("report")
        finished_at = time.time()
        parts = self._report_parts(target, metrics, attack_results, started, finished_at, len(images))
        report_json, report_html = self.ctx.report.render(parts)
        summary = {"accuracy": metrics["accuracy"]["value"],
                   "average_robustness_corr": _value(metrics.get("average_robustness_corr")),
                   "average_robustness_adv": _value(metrics.get("average_robustness_adv")),
                   "m": len(images)}
        store.update(self.eid, state="SUCCEEDED", stage="done", report_json=report_json,
                     report_html=report_html, summary_json=json.dumps(summary),
                     finished_at=finished_at, message="")
        return metrics

    def _answers(self, session: str, origin: str,
                 part: Sequence[tuple[str, np.ndarray]]) -> list[dict[str, Any]]:
        """The target's answers through the proxy, as stored with the items (JSON)."""
        if self.plan.target.task == "classification":
            preds = self.ctx.proxy.predict(session_id=session, origin=origin, images=part)
            return [_pred_json(p) for p in preds]
        return self.ctx.proxy.predict_answers(session_id=session, origin=origin, images=part)

    def _score_task(self, ids: Sequence[str], tests: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """IEEE-M1..M7 of a detection (IEEE-C4) or segmentation (IEEE-C5) plan, computed by the
        scoring service from the recorded answers and the manifest's ground truth."""
        from fortis.services.evaluation.datasets import load_plan_truths

        truths = load_plan_truths(self.plan)
        plain = [{k: v for k, v in t.items() if k != "predictions"} for t in tests]
        if self.plan.target.task == "detection":
            dtests = [{**meta, "predictions": {i: ({"error": p["error"]} if p.get("error") else
                                                   {"boxes": p["boxes"], "labels": p["labels"],
                                                    "scores": p["scores"]})
                                               for i, p in t["predictions"].items()}}
                      for meta, t in zip(plain, tests, strict=True)]
            return self.ctx.scoring.compute("ieee.detection", {}, {
                "criterion": dict(self.plan.detection), "truths": {i: truths[i] for i in ids},
                "tests": dtests})
        truth = [truths[i] for i in ids]
        shapes = {t.shape for t in truth}
        if len(shapes) != 1:
            raise InvalidArgument("dataset.path", "segmentation images must share one size, got "
                                  f"{sorted(shapes)}")
        arrays: dict[str, np.ndarray] = {"truth": np.stack(truth)}
        for n, t in enumerate(tests):
            masks = []
            for i, tr in zip(ids, truth, strict=True):
                p = t["predictions"][i]
                m = None if p.get("error") else cv2.imdecode(
                    np.frombuffer(base64.b64decode(p["mask_png"]), np.uint8), cv2.IMREAD_UNCHANGED)
                if m is None or m.shape != tr.shape:
                    m = np.full(tr.shape, -1, dtype=np.int64)     # a failed answer: no pixel right
                masks.append(m.astype(np.int64))
            arrays[f"masks@{n}"] = np.stack(masks)
        return self.ctx.scoring.compute("ieee.segmentation", arrays, {
            "criterion": dict(self.plan.segmentation), "image_ids": list(ids), "tests": plain})

    def _degradation(self, target: TargetDescription, ids: Sequence[str],
                     labels: Mapping[str, Sequence[int]], clean: Mapping[str, Any],
                     deg: Mapping[str, Mapping[int, Mapping[str, Any]]]) -> dict[str, Any]:
        """Degradation profiles and failure points per operator (DEG-2..DEG-4), computed by
        the scoring service on the images the target got right at level 0 (DEG-3). The change
        at a level (DEG-4) is the mean fraction of pixels that differ from the original."""
        n_classes = len(target.labels)
        scored = target.output_kind != "label_only"

        def ranked(preds: Mapping[str, Any]) -> np.ndarray:
            out = np.full((len(ids), KEEP_SCORES), -1, dtype=np.int64)
            for r, i in enumerate(ids):
                p = preds[i]
                if not p.get("error"):
                    lab = p["labels"][:KEEP_SCORES]
                    out[r, :len(lab)] = lab
            return out

        result: dict[str, Any] = {}
        for op, levels in deg.items():
            arrays: dict[str, np.ndarray] = {
                "true_labels": np.array([labels[i][0] for i in ids], dtype=np.int64),
                "labels@0": ranked(clean)}
            if scored:
                arrays["probs@0"] = _dense_scores(clean, ids, n_classes)
            changes: dict[str, Any] = {}
            for lv, preds in sorted(levels.items()):
                arrays[f"labels@{lv}"] = ranked(preds)
                if scored:
                    arrays[f"probs@{lv}"] = _dense_scores(preds, ids, n_classes)
                changes[str(lv)] = {"fraction_of_pixels_changed": round(float(np.mean(
                    [preds[i]["changed"] for i in ids])), 6)}
            result[op] = self.ctx.scoring.compute(
                "degradation_profile", arrays,
                {"image_ids": list(ids), "changes": changes, "num_classes": n_classes})
        return result

    def _ranking(self, target: TargetDescription, clean: Mapping[str, Any],
                 tests: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """NDCG@1 and DRR@5 of each setting's answers against the clean answers (RANK-1,
        RANK-2), computed by the scoring service from the recorded scores (top KEEP_SCORES
        per answer; classes not returned are NaN). A labels-only target: not applicable
        (RANK-3), never 0."""
        if target.output_kind == "label_only":
            return {"applicable": False, "reason": "the target returns labels only; NDCG and "
                    "DRR need scores (RANK-3)", "settings": {}}
        n_classes = len(target.labels)
        ids = [i for i in clean if not clean[i].get("error") and clean[i].get("scores")]
        if not ids:
            return {"applicable": False, "reason": "no scored clean answers", "settings": {}}

        settings: dict[str, Any] = {}
        for t in tests:
            if t["kind"] == "clean" or not t.get("predictions"):
                continue
            preds = t["predictions"]
            keep = [i for i in ids if i in preds and not preds[i].get("error") and preds[i].get("scores")]
            if not keep:
                continue
            benign = _dense_scores(clean, keep, n_classes)
            pert = _dense_scores(preds, keep, n_classes)
            name = (f"{t['perturbation_id']}@{t['severity']}" if t["kind"] == "corruption"
                    else t["perturbation_id"])
            nd = self.ctx.scoring.compute("ndcg", {"perturbed_probs": pert, "benign_probs": benign})
            dr = self.ctx.scoring.compute("drr", {"perturbed_probs": pert,
                                                  "benign_class": np.nanargmax(benign, axis=1)})
            settings[name] = {"kind": t["kind"], "m": len(keep),
                              "ndcg_1": nd.get("mean", {}).get("ndcg_1"),
                              "ndcg_at": nd.get("mean", {}).get("ndcg_at"),
                              "drr_5": (dr.get("mean") or {}).get("drr"), "drr_n": dr.get("m_applicable"),
                              "applicable": bool(nd.get("applicable", True))}
        return {"applicable": True, "gamma_b": 0.01, "gamma_a": 0.001, "drr_k": 5,
                "scores_kept": KEEP_SCORES, "settings": settings}

    # -- attacks ----------------------------------------------------------------------------
    def _save_adversarials(self, name: str, chunk: int, outs: Sequence[Any]) -> str:
        d = self.ctx.artifacts_dir / self.eid / "adversarial"
        d.mkdir(parents=True, exist_ok=True)
        path = d / f"{name}-{chunk:05d}.npz"
        tmp = path.with_suffix(".tmp.npz")
        np.savez_compressed(tmp, image_ids=np.array([o.image_id for o in outs]),
                            adversarial_uint8=np.stack([o.adversarial for o in outs]),
                            adversarial_float=np.stack([o.adversarial_float for o in outs]))
        tmp.replace(path)
        return str(path)

    def _transfer_attack_item(self, at: Any, part: Sequence[LabeledImage], chunk: int,
                              session: str, _attempt: int) -> tuple[dict[str, Any], int]:
        outs = self.ctx.perturbation.attack(at.id, at.params, self.plan.seed, part,
                                            surrogate=at.surrogate)
        preds = self.ctx.proxy.predict(session_id=session, origin=at.name,
                                       images=[(o.image_id, o.adversarial) for o in outs])
        self._save_adversarials(at.name, chunk, outs)
        return ({o.image_id: {"prediction": _pred_json(p), "linf": o.linf, "l2": o.l2,
                              "surrogate_initially_correct": o.initially_correct}
                 for o, p in zip(outs, preds, strict=True)}, len(outs))

    def _query_attack(self, at: Any, part: Sequence[LabeledImage], chunk: int,
                      attempt: int) -> tuple[dict[str, Any], int]:
        budget = int(at.params["max_queries"])
        session = f"{self.eid}/attack/{at.name}/{chunk:05d}/a{attempt}"
        self.ctx.proxy.open_session(session_id=session, target=self.plan.target.name,
                                    per_image_budget=budget, query_budget=budget * len(part),
                                    description=f"query attack {at.name}, chunk {chunk}, attempt {attempt}")
        outs = self.ctx.perturbation.attack(at.id, at.params, self.plan.seed, part,
                                            session_id=session, origin=at.name)
        total, per_image = self.ctx.proxy.session_queries(session)
        self._save_adversarials(at.name, chunk, outs)
        return ({o.image_id: {"success": bool(o.success), "attack_queries": o.queries,
                              "ledger_queries": per_image.get(o.image_id, 0), "linf": o.linf,
                              "l2": o.l2, "stop_reason": o.stop_reason, "session": session}
                 for o in outs}, total)

    def _add_attack_distances(self, metrics: dict[str, Any], results: dict[str, dict[str, Any]]) -> None:
        for name, r in results.items():
            m = metrics.get("attacks", {}).get(name)
            if m is None or not r:
                continue
            linf = [v["linf"] for v in r.values()]
            l2 = [v["l2"] for v in r.values()]
            m["mean_linf"] = float(np.mean(linf))
            m["max_linf"] = float(np.max(linf))
            m["mean_l2"] = float(np.mean(l2))
            ok = [v["l2"] for v in r.values() if v.get("success")]
            # PER-4 (and any query attack): the smallest perturbations that misled the target
            m["mean_l2_successful"] = float(np.mean(ok)) if ok else None
            m["median_l2_successful"] = float(np.median(ok)) if ok else None

    # -- report -----------------------------------------------------------------------------
    def _report_parts(self, target: TargetDescription, metrics: dict[str, Any],
                      attack_results: dict[str, dict[str, Any]], started: float,
                      finished: float, m: int) -> dict[str, Any]:
        plan = self.plan
        tests: list[dict[str, Any]] = []
        for ct in plan.corruptions:
            pspec = PERTURBATIONS[ct.id]
            tests.append({"id": ct.id, "kind": "corruption", "perturbation_kind": pspec.kind,
                          "family": pspec.family,
                          "ieee_ref": ", ".join(pspec.refs), "severities": list(ct.severities),
                          "parameters": {str(s): repr(pspec.level_table[s - 1]) for s in ct.severities},
                          "params": dict(ct.params),
                          "characterisation": pspec.characterisation.as_dict(),
                          "steps": [f"apply {ct.id} alone at each severity to every image (IEEE-P5), "
                                    "with a generator seeded from the plan seed, the corruption, the "
                                    "severity and the image id",
                                    "send each corrupted image to the target through the proxy "
                                    "(one query per image, recorded in the ledger)",
                                    "judge each answer with the plan's correctness rule (IEEE-C1/C2)"],
                          "metrics": ["Robustness_Corr (IEEE-M2)", "per severity (IEEE-M7)", "WorstCase_Robustness_Corr (IEEE-M4)"]})
        for dt in plan.degradation:
            dspec = PERTURBATIONS[dt.id]
            tests.append({"id": dt.id, "kind": "degradation", "family": dspec.family,
                          "ieee_ref": ", ".join(dspec.refs), "levels": list(dt.levels),
                          "parameters": {str(lv): repr(dspec.level_table[lv - 1]) for lv in dt.levels},
                          "characterisation": dspec.characterisation.as_dict(),
                          **({"surrogate": dt.surrogate} if dt.surrogate else {})})
        for at in plan.attacks:
            spec = ATTACKS[at.id]
            steps = ([f"craft the adversarial on the local surrogate '{at.surrogate}' (white box, "
                      "seeded from the plan), bounded before the attack (IEEE-A9)",
                      "quantise to uint8 and send it to the target through the proxy",
                      "judge the target's answer to the image it received (IEEE-C1/C2)"]
                     if not spec.is_query_attack else
                     ["open a proxy session per chunk of images with the per-image budget Q_m, "
                      "which the proxy enforces",
                      "query the target through the proxy only (every query recorded); stop at "
                      "the first success or at Q_m (IEEE-M6)",
                      "success is judged on the uint8 image the target received; queries per "
                      "image are read from the ledger"])
            tests.append({"id": at.name, "attack": at.id, "kind": "attack", "attack_kind": spec.kind,
                          "family": spec.family, "epsilon": at.params.get("epsilon"),
                          "norm": spec.norm,
                          "query_budget": at.params.get("max_queries") if spec.is_query_attack else None,
                          "ieee_ref": spec.ieee_ref, "parameters": dict(at.params),
                          "surrogate": at.surrogate or None, "images_attacked": len(attack_results.get(at.name, {})),
                          "steps": steps,
                          "metrics": ["Robustness_Adv (IEEE-M3)", "WorstCase_Robustness_Adv (IEEE-M5)"]
                          + (["attack success rate and queries (IEEE-M6)"] if spec.is_query_attack else [])})
        source = (f"{plan.dataset.source} ({plan.dataset.split}), images {plan.dataset.offset}.."
                  f"{plan.dataset.offset + m - 1} (M={m})")
        for t in tests:
            n_img = t.get("images_attacked") or m
            t["image_source"] = source if n_img == m else f"{source}; the first {n_img} attacked (plan limit)"
        ledger = self._ledger_summary(attack_results)
        from importlib.metadata import version

        import numpy
        import torch
        environment = {"python": platform.python_version(), "platform": platform.platform(),
                       "fortis": version("fortis"), "torch": torch.__version__, "numpy": numpy.__version__,
                       "seed": plan.seed}
        return {
            "plan": dict(plan.raw), "plan_text": self.ctx.plan_text,
            "target": {"name": plan.target.name, "model_name": target.name, "task": target.task,
                       "endpoint": plan.target.endpoint,
                       "output_kind": target.output_kind, "top_k": target.top_k,
                       "labels_count": len(target.labels), "version": target.version,
                       "input": f"{target.input_height}x{target.input_width}x{target.input_channels}",
                       "service_type_parameters": {"correctness": dict(plan.correctness)}},
            "tester": {"name": plan.tester.name or None,
                       "organization": plan.tester.organisation or None,
                       "roles": {"tester": vars(plan.tester), "requester": vars(plan.requester),
                                 "provider": vars(plan.provider)}},
            "environment": environment, "metrics": metrics, "tests": tests, "ledger": ledger,
            "evaluation": {"id": self.eid, "started": started, "finished": finished,
                           "started_at": _iso(started), "ended_at": _iso(finished),
                           "duration_s": round(finished - started, 3), "images": m,
                           "dataset": {"source": plan.dataset.source, "split": plan.dataset.split,
                                       "offset": plan.dataset.offset, "limit": plan.dataset.limit},
                           "resumed_count": (self.ctx.store.get(self.eid).resumed_count
                                             if self.ctx.store.get(self.eid) else 0)},
        }

    def _ledger_summary(self, attack_results: dict[str, dict[str, Any]]) -> dict[str, Any]:
        sessions: dict[str, int] = {}
        for name in ("clean", "corruptions"):
            total, _ = self.ctx.proxy.session_queries(f"{self.eid}/{name}")
            sessions[f"{self.eid}/{name}"] = total
        counted_query_sessions: set[str] = set()
        for at in self.plan.attacks:
            if ATTACKS[at.id].is_query_attack:
                for v in attack_results[at.name].values():
                    counted_query_sessions.add(v["session"])
            else:
                s = f"{self.eid}/attack/{at.name}"
                sessions[s], _ = self.ctx.proxy.session_queries(s)
        for s in sorted(counted_query_sessions):
            sessions[s], _ = self.ctx.proxy.session_queries(s)
        aborted: dict[str, int] = {}
        for key, attempts, _done in self.ctx.store.items(self.eid):
            if key.startswith("attack/") and attempts > 1:
                name, chunk = key.split("/")[1], key.split("/")[2]
                for a in range(1, attempts):
                    s = f"{self.eid}/attack/{name}/{chunk}/a{a}"
                    try:
                        aborted[s], _ = self.ctx.proxy.session_queries(s)
                    except FortisError:
                        aborted[s] = 0
        return {"sessions": sessions, "total_queries": sum(sessions.values()),
                "aborted_attempt_sessions": aborted,
                "aborted_attempt_queries": sum(aborted.values()),
                "note": "counts read from the target-proxy ledger; queries of attempts cut short by a restart are listed separately and not used in any metric"}


def _value(x: Any) -> Any:
    if isinstance(x, dict):
        return x.get("value")
    return x
