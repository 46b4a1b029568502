"""CANARY metrics of one evaluation, per attack, when the plan asks for them (``canary: true``;
seed 003, Sun et al. 2023, section 3.1): computed by the scoring service's catalogue through
``ScoringPort.compute`` (the Compute RPC; this module never imports the scoring service).
Domain code, no gRPC.

- CAN-1 model capability once (``canary.model_capability``): the true labels and the target's
  clean answers.
- Per attack, CAN-2 attack effect (``canary.attack_effect``): the clean and the adversarial
  answers of the images it covered (a targeted attack adds its target label per image).
  Transfer attacks only: a query attack's success is judged during its search and Fortis does
  not ask the target again for its final adversarial, so there is no answer on it to score.
- CAN-3 attack cost (``canary.attack_cost``): the kind (transfer, score, decision), QNC-F per
  image from the proxy ledger's counts (the setting's queries; a transfer attack crafts on the
  surrogate and sends nothing to the target while crafting: 0), QNC-B = 0 (black box), and
  CTC from the seconds a chunk's result records, when it records them.
- CAN-4 perturbation cost (``canary.perturbation_cost``): the clean images and the uint8
  adversarials the attack stage stored per chunk (``RunContext.load_adversarials``), averaged
  over the images attacked (transfer: every covered image; query: those the attack did not
  find misclassified already).

The answers go as N x C probability matrices for a full-score target; a top-k or label-only
target's go as top-1 labels, and the confidence metrics (CC, AIAC, ARTC) are then "not
available" (the notes say why). Failed queries are left out. Every Compute call is bounded
to :data:`MAX_ELEMENTS` array elements (the first images in plan order are kept; a note says
so). The result, JSON-able (NaN as None)::

    {"model": {...CAN-1...}, "attacks": {NAME: {"effect", "cost", "perturbation"}},
     "notes": [...]}

CAN-5 (defence effect) compares two models: multi-target plans (``benchmark.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import numpy as np
from fortis.core.task import Task
from fortis.services.common.errors import InvalidArgument
from fortis.services.evaluation.answers import ClassAnswers, unpack
from fortis.services.evaluation.keys import StageName, WorkItemKey
from fortis.services.evaluation.plan import AttackTest
from fortis.services.evaluation.ports import Catalogue, ScoringPort, Setting
from fortis.services.evaluation.stages.base import RunContext, chunks

__all__ = ["MAX_ELEMENTS", "NOT_AVAILABLE", "canary_metrics", "class_answers"]

#: Array elements of one Compute call, all arrays together (the catalogue allows 50 million;
#: this keeps a call's message far below the 64 MiB gRPC bound, float32 or uint8).
MAX_ELEMENTS: Final = 8_000_000
NOT_AVAILABLE: Final = "not available"
#: The attack's own verdict that an image was misclassified before it started (not attacked).
_ALREADY: Final = "already_misclassified"
_NO_QUERY_ANSWERS: Final = ("a query attack is judged during its search (success and queries "
                            "per image, IEEE-M6); Fortis does not ask the target again for its "
                            "final adversarial, so CAN-2 has no answer to score")
_NO_TIME: Final = "the attack stage records no crafting time per example"


def class_answers(a: ClassAnswers, num_classes: int,
                  probabilities: bool) -> tuple[np.ndarray, np.ndarray]:
    """(answers, answered): an N x C float32 probability matrix (``probabilities``) or the N
    top-1 labels, and the N rows usable (answered; with every class scored in [0, 1])."""
    answered = np.array([not e for e in a.errors], dtype=bool) & (a.labels[:, 0] >= 0)
    if not probabilities or a.scores is None:
        return a.labels[:, 0].astype(np.int64), answered
    dense = np.full((a.n, num_classes), np.nan, dtype=np.float32)
    r, c = np.nonzero((a.labels >= 0) & (a.labels < num_classes))
    dense[r, a.labels[r, c]] = a.scores[r, c]
    full = np.isfinite(dense).all(axis=1) & (dense >= 0).all(axis=1) & (dense <= 1).all(axis=1)
    return dense, answered & full


def _first(mask: np.ndarray, per_row: int) -> tuple[np.ndarray, bool]:
    """The rows of ``mask`` kept under :data:`MAX_ELEMENTS` (the first ones), and whether
    some were cut."""
    rows = np.flatnonzero(mask)
    most = max(1, MAX_ELEMENTS // max(per_row, 1))
    return rows[:most], rows.size > most


def _failed(reason: str) -> dict[str, Any]:
    return {"value": None, "status": NOT_AVAILABLE, "reason": reason}


class _Canary:
    def __init__(self, ctx: RunContext, settings: Sequence[Setting], catalogue: Catalogue,
                 scoring: ScoringPort) -> None:
        self.ctx, self.catalogue, self.scoring = ctx, catalogue, scoring
        self.settings = settings
        self.notes: list[str] = []
        self.c = len(ctx.target.labels)
        self.labels = np.array([lab[0] for _, _, lab in ctx.images], dtype=np.int64)
        if any(len(lab) > 1 for _, _, lab in ctx.images):
            self.notes.append("CANARY takes one true label per image: the first of each "
                              "image's acceptable labels")
        kind = ctx.target.output_kind
        clean = next(s for s in settings if s.kind == "clean")
        assert isinstance(clean.answers, ClassAnswers)
        self.probs = kind == "full_scores" and clean.answers.scores is not None
        if not self.probs:
            what = {"top_k": f"its top-{ctx.target.top_k} classes only",
                    "label_only": "labels only"}.get(kind, "no full score vector")
            self.notes.append(f"the target returns {what}: CANARY's answers are its top-1 "
                              "labels, and CC, AIAC and ARTC (which need the full probability "
                              "vector) are not available")
        self.clean, self.clean_ok = class_answers(clean.answers, self.c, self.probs)

    def compute(self, metric: str, arrays: Mapping[str, np.ndarray],
                params: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Compute through the scoring service; a refusal of these inputs is recorded in the
        node (and the notes), not raised: CANARY is an addition to the evaluation's report."""
        try:
            return self.scoring.compute(metric, arrays, params)
        except InvalidArgument as exc:
            self.notes.append(f"{metric}: {exc}")
            return {"status": "error", "reason": str(exc)}

    def _width(self) -> int:
        return self.c if self.probs else 1

    def model(self) -> dict[str, Any]:
        """CAN-1 on the images whose clean query was answered."""
        rows, cut = _first(self.clean_ok, self._width() + 1)
        if cut:
            self.notes.append(f"CAN-1 over the first {rows.size} images (Compute bound)")
        if rows.size == 0:
            return _failed("no clean answer to score")
        return self.compute("canary.model_capability",
                            {"labels": self.labels[rows], "clean": self.clean[rows]})

    def attack(self, at: AttackTest, s: Setting) -> dict[str, Any]:
        entry = self.catalogue.attacks[at.id]
        n = len(s.image_index) if s.image_index else self.labels.size
        results = self._results(at, n)
        attacked = ~np.asarray(s.excluded, dtype=bool) if s.excluded else np.ones(n, dtype=bool)
        if s.kind == "query_attack":
            reasons = [r for res in results for r in res.get("stop_reason", ())] \
                if results is not None else []
            if len(reasons) == n:
                attacked &= np.array([r != _ALREADY for r in reasons], dtype=bool)
        return {"effect": self._effect(at, s, n),
                "cost": self._cost(at, s, n, entry.kind, results, attacked),
                "perturbation": self._perturbation(at, n, attacked)}

    def _results(self, at: AttackTest, n: int) -> list[dict[str, Any]] | None:
        """The stored results of the attack's chunks (None when one is missing)."""
        ctx = self.ctx
        out = []
        for c, _ in enumerate(chunks(n, ctx.plan.batch_size)):
            done, _, blob = ctx.store.item(ctx.evaluation_id,
                                           WorkItemKey(StageName.ATTACKS, at.name, chunk=c).format())
            if not done or blob is None:
                return None
            out.append(unpack(blob))
        return out

    def _effect(self, at: AttackTest, s: Setting, n: int) -> dict[str, Any]:
        if s.kind != "transfer_attack":
            return _failed(_NO_QUERY_ANSWERS)
        assert isinstance(s.answers, ClassAnswers)
        adv, adv_ok = class_answers(s.answers, self.c, self.probs)
        idx = np.arange(n)              # the stages attack the first n images, in order
        labels, clean = self.labels[idx], self.clean[idx]
        ok = self.clean_ok[idx] & adv_ok
        arrays: dict[str, np.ndarray] = {}
        target = at.criterion.get("target_label") if at.targeted else None
        if target is not None:
            same = labels == int(target)
            if same[ok].any():
                self.notes.append(f"{at.name}: {int(same[ok].sum())} images whose true label "
                                  f"is the target {target} left out of CAN-2 (TAS needs "
                                  "y_adv != y)")
            ok &= ~same
        rows, cut = _first(ok, 2 * self._width() + 2)
        if cut:
            self.notes.append(f"{at.name}: CAN-2 over the first {rows.size} images (Compute "
                              "bound)")
        if rows.size == 0:
            return _failed("no image with both answers to score")
        arrays.update(labels=labels[rows], clean=clean[rows], adversarial=adv[rows])
        if target is not None:
            arrays["target_labels"] = np.full(rows.size, int(target), dtype=np.int64)
        return self.compute("canary.attack_effect", arrays)

    def _cost(self, at: AttackTest, s: Setting, n: int, kind: str,
              results: list[dict[str, Any]] | None, attacked: np.ndarray) -> dict[str, Any]:
        arrays: dict[str, np.ndarray] = {"qnc_backward": np.zeros(n, dtype=np.int64)}
        if s.kind != "query_attack":
            arrays["qnc_forward"] = np.zeros(n, dtype=np.int64)
        elif len(s.queries) == n:                   # the ledger's answered queries per image
            arrays["qnc_forward"] = np.asarray(s.queries, dtype=np.int64)
        seconds = self._seconds(results, n)
        if seconds is not None:
            arrays["seconds"] = seconds
        if not attacked.all():
            arrays["include"] = attacked
        out = self.compute("canary.attack_cost", arrays, {"kind": kind})
        ctc = out.get("CTC")
        if seconds is None and isinstance(ctc, dict):
            ctc["reason"] = _NO_TIME
        return out

    @staticmethod
    def _seconds(results: list[dict[str, Any]] | None, n: int) -> np.ndarray | None:
        """Seconds per example: each chunk's recorded ``seconds`` over its images, when every
        chunk recorded them."""
        if not results or any("seconds" not in r for r in results):
            return None
        sizes = [len(np.atleast_1d(r["l2"])) for r in results]
        per = np.concatenate([np.full(k, float(r["seconds"]) / max(k, 1))
                              for r, k in zip(results, sizes, strict=True)])
        return per if per.size == n else None

    def _perturbation(self, at: AttackTest, n: int, attacked: np.ndarray) -> dict[str, Any]:
        ctx = self.ctx
        clean_imgs = [img for _, img, _ in ctx.images[:n]]
        advs: list[np.ndarray] = []
        for c, (a, b) in enumerate(chunks(n, ctx.plan.batch_size)):
            kept = ctx.load_adversarials(at.name, c, ctx.ids[a:b])
            if kept is None:
                return _failed(f"the adversarials of chunk {c} are not stored")
            advs += kept[0]
        if any(x.shape != y.shape for x, y in zip(clean_imgs, advs, strict=True)):
            return _failed("the adversarials' sizes differ from the clean images'")
        rows, cut = _first(attacked, 2 * int(clean_imgs[0].size))
        if cut:
            self.notes.append(f"{at.name}: CAN-4 over the first {rows.size} images attacked "
                              "(Compute bound)")
        if rows.size == 0:
            return _failed("no image attacked")
        return self.compute("canary.perturbation_cost",
                            {"clean": np.stack([clean_imgs[i] for i in rows.tolist()]),
                             "adversarial": np.stack([advs[i] for i in rows.tolist()])})


def canary_metrics(ctx: RunContext, settings: Sequence[Setting],
                   catalogue: Catalogue) -> dict[str, Any]:
    """The report's ``canary`` section (module docstring) of a finished evaluation: its
    measured ``settings`` (one per test), the stored chunk results and adversarials, through
    ``ctx.scoring.compute``."""
    plan = ctx.plan
    if plan.target.task != Task.CLASSIFICATION:
        return {"model": None, "attacks": {}, "notes": [
            f"CANARY's metrics (seed 003) are defined for image classifiers; not computed for "
            f"a {plan.target.task} target"]}
    run = _Canary(ctx, settings, catalogue, ctx.scoring)
    model = run.model()
    attacks: dict[str, Any] = {}
    by_name = {s.name: s for s in settings if s.kind in ("transfer_attack", "query_attack")}
    for at in plan.attacks:
        ctx.check_cancelled()
        s = by_name.get(at.name)
        if s is not None:
            attacks[at.name] = run.attack(at, s)
    untimed = [name for name, a in attacks.items()
               if isinstance(a["cost"].get("CTC"), dict) and a["cost"]["CTC"].get("reason") == _NO_TIME]
    if untimed:
        run.notes.append(f"CTC (CAN-3) is not available for {', '.join(untimed)}: {_NO_TIME}")
    return {"model": model, "attacks": attacks, "notes": run.notes}
