"""Every sentence of the report (IEEE-P4), in one place.

The evaluation service sends facts only (``fortis.report.v1.ReportParts``); the words that
explain them -- the steps of each test, the metrics it feeds, where its images came from, the
definitions of the metrics and how to repeat the run -- are written here, so that changing the
wording of a report never touches the service that ran the evaluation, and every report reads
the same. Pure data and string functions: no protobuf, no gRPC.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "DEFAULT_REF",
    "DEGRADATION_DEFINITIONS",
    "LEDGER_NOTE",
    "METRICS_USED",
    "attack_metrics_used",
    "extra_metrics_used",
    "image_source",
    "repeat_instructions",
    "test_metrics",
    "test_steps",
]

#: Where the standard (or the paper) defines a kind of test, when the catalogue gives no refs.
DEFAULT_REF: Final = {
    "corruption": "IEEE 3129 4.7.2, 4.7.4, 5.2/5.3, Annex A.1 (IEEE-A1..A6, IEEE-M2/M4/M7)",
    "attack": "IEEE 3129 4.7.3, 4.7.5, 5.4, Annex A.2 (IEEE-A7/A8, IEEE-M3/M5/M6)",
    "degradation": "Swingler 2022, incremental degradation operators (DEG-1..DEG-5)",
}

#: The IEEE 3129 metrics every report uses, with where the standard defines them.
METRICS_USED: Final = (
    {"name": "Accuracy", "ref": "IEEE 3129 4.7.1 eq. (1), IEEE-M1"},
    {"name": "Robustness_Corr (per corruption and severity)",
     "ref": "IEEE 3129 4.7.2 eq. (2), 5.2, IEEE-M2/M7"},
    {"name": "Average_Robustness_Corr", "ref": "IEEE 3129 4.7.2 eq. (3), IEEE-M2"},
    {"name": "WorstCase_Robustness_Corr", "ref": "IEEE 3129 4.7.4 eq. (6), IEEE-M4"},
    {"name": "Robustness_Adv", "ref": "IEEE 3129 4.7.3 eq. (4), IEEE-M3"},
    {"name": "Average_Robustness_Adv", "ref": "IEEE 3129 4.7.3 eq. (5), IEEE-M3"},
    {"name": "WorstCase_Robustness_Adv", "ref": "IEEE 3129 4.7.5 eq. (7), IEEE-M5"},
    {"name": "Attack success rate, mean/median queries, budget Q_m",
     "ref": "IEEE 3129 5.4, IEEE-M6"},
    {"name": "95 % Wilson confidence interval for every rate", "ref": "IEEE-M8"},
)

_RANKING_USED: Final = (
    {"name": "NDCG@k and NDCG@1 of each setting's answers against the clean answers",
     "ref": "Brama, Dery, Grinshpoun (RANK-1)"},
    {"name": "Defense reciprocal rank DRR@5", "ref": "Brama, Dery, Grinshpoun (RANK-2)"},
)
_DEGRADATION_USED: Final = {
    "name": "Degradation profiles (accuracy, true-label rank and probability per level) and "
            "failure points at 90/50/10%",
    "ref": "Swingler 2022 (DEG-2..DEG-4)"}
_PERTURBATION_SIZE_USED: Final = {
    "name": "Minimal perturbation L2 of the images misled (mean, median)",
    "ref": "Zhong, Hu, Chen 2020 (PER-3, PER-4)"}

#: What each degradation profile means (DEG-2..DEG-4); shown with every profile.
DEGRADATION_DEFINITIONS: Final = {
    "accuracy": "top-1 accuracy on the images correct at level 0 (DEG-2, DEG-3), 95 % Wilson "
                "interval (IEEE-M8)",
    "rank": "mean 0-based rank of the true label (0 = top) on the images correct at level 0; "
            "None when a top-k answer lacked the true label (then at_least is a lower bound, "
            "such ranks counted as k) (DEG-2)",
    "probability": "mean probability of the true label on the images correct at level 0; None "
                   "without full scores for the true label (DEG-2)",
    "failure_point": "first level whose accuracy is strictly below the threshold, with the "
                     "change made at that level and an example image (DEG-4)",
}

#: What the ledger summary counts (and why no attempt is listed apart).
LEDGER_NOTE: Final = ("answered queries read from the target-proxy ledger; a query attack's "
                      "chunk keeps one session across restarts, so Q_m counts every attempt; "
                      "rows a crash interrupted stay charged and are not answers")

_DEGRADATION_STEPS: Final = (
    "Apply the operator incrementally (level L = the operator applied L times) to each clean "
    "image at its model input size, seeded from the plan",
    "Send each degraded image to the target through the proxy (one query per image and level)",
    "Profile accuracy, true-label rank and probability against level on the images correct at "
    "level 0; failure points at 90/50/10%",
)
_QUERY_ATTACK_STEPS: Final = (
    "open a proxy session per chunk of images with the per-image budget Q_m, which the proxy "
    "enforces",
    "query the target through the proxy only (every query recorded); stop at the first success "
    "or at Q_m (IEEE-M6)",
    "success is judged on the uint8 image the target received; queries per image are read from "
    "the ledger",
)


def test_steps(kind: str, name: str, *, attack_kind: str | None = None,
               surrogate: str | None = None) -> list[str]:
    """The steps of one test (IEEE-P4), worded for its kind; ``name`` is the setting's name."""
    if kind == "corruption":
        return [f"apply {name} alone at each severity to every image (IEEE-P5), with a "
                "generator seeded from the plan seed, the corruption, the severity and the "
                "image id",
                "send each corrupted image to the target through the proxy (one query per "
                "image, recorded in the ledger)",
                "judge each answer with the plan's correctness rule (IEEE-C1/C2)"]
    if kind == "degradation":
        return list(_DEGRADATION_STEPS)
    if attack_kind == "transfer":
        return [f"craft the adversarial on the local surrogate '{surrogate or ''}' (white box, "
                "seeded from the plan), bounded before the attack (IEEE-A9)",
                "quantise to uint8 and send it to the target through the proxy",
                "judge the target's answer to the image it received (IEEE-C1/C2)"]
    return list(_QUERY_ATTACK_STEPS)


def test_metrics(kind: str, *, attack_kind: str | None = None) -> list[str]:
    """The metrics one test feeds, by kind."""
    if kind == "corruption":
        return ["Robustness_Corr (IEEE-M2)", "per severity (IEEE-M7)",
                "WorstCase_Robustness_Corr (IEEE-M4)"]
    if kind == "degradation":
        return ["accuracy per level", "mean true-label rank per level",
                "mean true-label probability per level", "failure points at 90/50/10%"]
    out = ["Robustness_Adv (IEEE-M3)", "WorstCase_Robustness_Adv (IEEE-M5)"]
    if attack_kind != "transfer":
        out.append("attack success rate and queries (IEEE-M6)")
    return out


def image_source(*, source: str, split: str, offset: int, m: int, covered: int) -> str:
    """Where a test's images came from: the dataset selection, and the plan's limit when the
    test covered fewer than the M images (an attack limited to the first N)."""
    text = f"{source} ({split}), images {offset}..{offset + m - 1} (M={m})"
    if covered and covered != m:
        text += f"; the first {covered} attacked (plan limit)"
    return text


def extra_metrics_used(*, ranking: bool, degradation: bool,
                       perturbation_size: bool) -> list[dict[str, str]]:
    """The metric families beyond IEEE 3129 that this evaluation computed."""
    out = [dict(m) for m in _RANKING_USED] if ranking else []
    if degradation:
        out.append(dict(_DEGRADATION_USED))
    if perturbation_size:
        out.append(dict(_PERTURBATION_SIZE_USED))
    return out


_SUCCESS_CURVE_USED: Final = {
    "name": "Attack success rate against queries (the share of the images attacked misled "
            "within q queries, from the ledger's per-image counts; last point at the budget Q_m)",
    "ref": "IEEE 3129 5.4, IEEE-M6"}
_FOOLING_USED: Final = {
    "name": "Fooling rate at threshold T (share of the images attacked misled by a "
            "perturbation with L2 < T; T the mean L2 of those misled) and share never fooled; "
            "the L2 is the minimal one for PertKnob, the L2 the attack found otherwise",
    "ref": "Zhong, Hu, Chen 2020 (PER-4)"}
_CANARY_USED: Final = (
    {"name": "CANARY model capability: CA, CF (macro F1), CC (mean true-class confidence)",
     "ref": "Sun et al. 2023, CANARY 3.1.1 (CAN-1)"},
    {"name": "CANARY attack effect on the images the model got right: MR, TAS, AIAC, ARTC",
     "ref": "Sun et al. 2023, CANARY 3.1.2 (CAN-2)"},
    {"name": "CANARY attack cost: CTC (seconds per example), QNC-F / QNC-B (queries per "
             "example, from the ledger)", "ref": "Sun et al. 2023, CANARY 3.1.3 (CAN-3)"},
    {"name": "CANARY perturbation cost: AMD, AED, APCR, AED-FD, ALMS, ADMS",
     "ref": "Sun et al. 2023, CANARY 3.1.3 (CAN-4)"},
)


def attack_metrics_used(*, success_curve: bool, fooling_rate: bool,
                        canary: bool) -> list[dict[str, str]]:
    """The per-attack metric families this evaluation computed beyond IEEE 3129's:
    success-vs-queries curves (IEEE-M6), the PER-4 fooling rate, CANARY (CAN-1..4)."""
    out = [dict(_SUCCESS_CURVE_USED)] if success_curve else []
    if fooling_rate:
        out.append(dict(_FOOLING_USED))
    if canary:
        out += [dict(m) for m in _CANARY_USED]
    return out


def repeat_instructions(plan_file: str, command: str) -> list[str]:
    """How to repeat the evaluation (IEEE-P4)."""
    return [f"Save the report's plan_text verbatim as {plan_file} (it is also shown in full in "
            "this report).",
            "Install the versions listed under environment (python, torch, numpy, fortis).",
            f"Run: {command}",
            "Every random operation is seeded from the seeds in the plan, so the same plan and "
            "versions reproduce the same corrupted and adversarial images; a non-deterministic "
            "target can still answer differently."]


#: What a query attack read from the target, in words (IEEE-A8: the report says when an
#: attack worked on a weaker signal than full scores).
_SIGNALS = {
    "scores": "full class scores",
    "top_k": "top-k class scores only (a weaker signal than full scores: classes not "
             "returned score 0)",
    "labels": "top-1 labels only",
    "decisions from scores": "decisions judged on full class scores",
    "decisions from top_k": "decisions judged on top-k class scores (weaker than full scores)",
    "decisions from boxes": "decisions judged on detected boxes with their classes and scores "
                            "(IEEE-C4)",
    "decisions from masks": "decisions judged on class maps (IEEE-C5)",
    "boxes": "detected boxes with their classes and scores (IEEE-C4)",
    "masks": "class maps only (IEEE-C5; no per-pixel probabilities)",
    "probabilities": "class maps and per-pixel probabilities (IEEE-C5)",
}


def signal_note(signal: str, attack_kind: str | None) -> str | None:
    """The signal a query attack read, in words; None when there is none (transfer)."""
    if not signal:
        return None
    text = _SIGNALS.get(signal, signal)
    if attack_kind == "score" and signal in ("top_k", "masks"):
        return f"score-based on {text}"
    return text
