"""The typed CANARY and benchmark parts (``ReportParts.canary``, ``benchmark``) give the report
what the untyped Struct parts they replace gave: the same report.json text (ints stay ints,
nulls stay nulls, absent keys stay absent) and the same HTML page, for results the scoring
service's own functions compute -- CAN-1..CAN-4 with ok, "not available" and failed nodes,
and a benchmark's summaries, matrices with gaps, two-way squeeze, heat maps, IRT, defence
effects and fast-mode rank."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from fortis.report.v1 import report_pb2
from fortis.services.common.errors import InvalidArgument
from fortis.services.common.result_tree import fill_message, message_tree
from fortis.services.report.convert import build_report
from fortis.services.report.render import render_html, report_json
from fortis.services.scoring.canary import (
    attack_cost,
    attack_effect,
    model_capability,
    perturbation_cost,
)
from fortis.services.scoring.catalogue import compute, jsonable
from google.protobuf import json_format, struct_pb2

from tests.unit.report_parts import QUERY, TRANSFER, make_parts

N, C = 12, 4


def _as_compute_returned(tree: Any) -> Any:
    """A result as the evaluation service receives it from Compute: a Struct, read back with
    every number a double."""
    s = struct_pb2.Struct()
    json_format.ParseDict(jsonable(tree), s)
    return json_format.MessageToDict(s)


def _probs(rng: np.random.Generator) -> np.ndarray:
    x = rng.random((N, C))
    return x / x.sum(axis=1, keepdims=True)


def _canary() -> dict[str, Any]:
    rng = np.random.default_rng(3)
    labels = rng.integers(0, C, N)
    clean, adv = _probs(rng), _probs(rng)
    clean[np.arange(N), labels] += 2.0          # mostly right on the clean images
    clean /= clean.sum(axis=1, keepdims=True)
    imgs = rng.integers(0, 256, (N, 8, 8, 3), dtype=np.uint8)
    advs = np.clip(imgs.astype(int) + rng.integers(-9, 10, imgs.shape), 0, 255).astype(np.uint8)
    other = {"other": {"clean": clean, "adversarial": adv}}
    effect = attack_effect(labels, clean, adv, transfer=other)
    targeted = attack_effect(labels, clean.argmax(axis=1), adv.argmax(axis=1),
                             target_labels=(labels + 1) % C)
    cost = attack_cost(kind="transfer", qnc_forward=np.zeros(N, int),
                       qnc_backward=np.zeros(N, int))
    timed = attack_cost(kind="score", seconds=rng.random(N), qnc_forward=rng.integers(1, 50, N),
                        qnc_backward=np.zeros(N, int), include=rng.random(N) > 0.3,
                        ctc_peers={"other": 0.25})
    pert = perturbation_cost(imgs, advs)
    failed = {"value": None, "status": "not available", "reason": "no image attacked"}
    canary = {
        "model": model_capability(labels, clean),
        "attacks": {
            TRANSFER: {"effect": effect, "cost": cost, "perturbation": pert},
            QUERY: {"effect": failed, "cost": timed,
                    "perturbation": {"status": "error", "reason": "canary.perturbation_cost: x"}},
            "labels-only": {"effect": targeted, "cost": cost, "perturbation": failed},
        },
        "notes": ["CAN-1 over the first 12 images (Compute bound)"],
    }
    return _as_compute_returned(canary)


def _benchmark() -> dict[str, Any]:
    rng = np.random.default_rng(5)
    attacks, models = ["fgsm", "pgd", "square"], ["a", "b", "c"]
    cube = rng.random((3, 3, 3))
    cube[2, 0, 1] = np.nan                               # a block not run
    mat = {"attacks": attacks, "models": models, "metric": "MR",
           "higher_is_more_effective": True}
    twoway = _as_compute_returned(compute("twoway", {"values": cube},
                                          {**mat, "heatmaps": True}))
    irt = _as_compute_returned(compute("irt", {}, {
        "subjects": models, "seed": 1, "chain_length": 60, "burn_in": 20,
        "metrics": [{"name": "clean accuracy", "category": "capability",
                     "higher_is_better": True, "values": [0.9, 0.7, 0.8]},
                    {"name": "fog", "category": "corruption", "higher_is_better": True,
                     "values": [0.5, None, 0.6]},
                    {"name": "fgsm", "category": "transfer attacks", "higher_is_better": True,
                     "values": [0.2, 0.4, 0.1]}]}))
    labels = rng.integers(0, C, N)
    defence = _as_compute_returned(compute("canary.defence_effect", {
        "labels": labels, "baseline_clean": _probs(rng), "defended_clean": _probs(rng),
        "baseline_adv": _probs(rng), "defended_adv": _probs(rng)},
        {"baseline_attack": {"MR": 0.5}, "defended_attack": {"MR": 0.25}}))
    fast = _as_compute_returned(compute(
        "twoway.fast_rank", {"values": cube[:, :2, :2], "white_box": np.array([0.1, 0.2, 0.3]),
                             "evaluated_on_new": rng.random((3, 2))},
        {**mat, "models": ["a", "b"], "new_name": "c", "new_kind": "model"}))

    def summary(name: str, surrogate: str | None, defends: str | None) -> dict[str, Any]:
        return {"name": name, "surrogate": surrogate, "defends": defends,
                "accuracy": {"value": 0.75, "ci95": [0.5, 0.9], "m": 12, "correct": 9},
                "average_robustness_corr": {"value": 0.5},
                "average_robustness_adv": {"value": None},
                "corruptions": {"fog": 0.5, "snow": None},
                "attacks": {f"fgsm.{surrogate}": {"success_rate": 1.0,
                                                  "success_rate_ci95": None,
                                                  "robustness_adv": 0.0}}}

    matrix = [[[None if np.isnan(x) else float(x) for x in row] for row in block]
              for block in cube.tolist()]
    return {
        "mode": "benchmark", "metric": "MR", "task": "classification", "attacks": attacks,
        "model_names": models, "sources": ["sa", "sb", "sc"],
        "models": [summary("a", "sa", None), summary("b", "sb", "a"), summary("c", None, None)],
        "matrix": matrix, "baseline_evaluation": None, "notes": [],
        "twoway_models": models, "matrix_square": matrix, "twoway": twoway, "irt": irt,
        "defence": [{"baseline": "a", "defended": "b", "result": defence,
                     "attacks": {"fgsm": defence, "pgd": None}}],
        "fast": fast,
    }


def _struct_reading(tree: Any) -> Any:
    """The section as the report read it from the Struct part before the part was typed
    (whole numbers as ints, non-finite ones None, map order as the Struct's), after the trip
    over the wire."""
    s = struct_pb2.Struct()
    json_format.ParseDict(tree, s)
    s = struct_pb2.Struct.FromString(s.SerializeToString())

    def value(v: Any) -> Any:
        kind = v.WhichOneof("kind")
        if kind == "struct_value":
            return {k: value(x) for k, x in v.struct_value.fields.items()}
        if kind == "list_value":
            return [value(x) for x in v.list_value.values]
        if kind == "number_value":
            n = v.number_value
            return (int(n) if n.is_integer() and abs(n) < 2 ** 53 else n) \
                if math.isfinite(n) else None
        return getattr(v, kind) if kind in ("string_value", "bool_value") else None

    return {k: value(x) for k, x in s.fields.items()}


def _typed(canary: Any, benchmark: Any) -> report_pb2.ReportParts:
    parts = make_parts()
    fill_message(parts.canary, canary, "canary")
    fill_message(parts.benchmark, benchmark, "benchmark")
    return parts


def _sent(parts: report_pb2.ReportParts) -> report_pb2.ReportParts:
    return report_pb2.ReportParts.FromString(parts.SerializeToString())


def test_typed_parts_render_the_same_report_as_the_untyped_ones() -> None:
    canary, benchmark = _canary(), _benchmark()
    after = build_report(_sent(_typed(canary, benchmark)))
    before = {**after, "canary": _struct_reading(canary), "benchmark": _struct_reading(benchmark)}
    assert set(before["canary"]["attacks"]) == {TRANSFER, QUERY, "labels-only"}
    assert before["benchmark"]["twoway"]["heatmaps"] and before["benchmark"]["irt"]["layer1"]
    assert after == before
    assert report_json(after) == report_json(before)        # 1 vs 1.0, null vs absent
    assert render_html(after) == render_html(before)
    assert "CAN-7" in render_html(after) and "CAN-2 attack effect" in render_html(after)


def test_a_typed_part_gives_back_the_tree_it_was_filled_from() -> None:
    """Null, empty and absent keys, and a null map value, survive; whole doubles come back as
    ints (as they did from the Struct)."""
    benchmark = _benchmark()
    msg = _sent(_typed(_canary(), benchmark)).benchmark
    tree = message_tree(msg)
    assert tree["baseline_evaluation"] is None and tree["notes"] == []
    assert tree["defence"][0]["attacks"]["pgd"] is None
    assert tree["matrix"][2][0][1] is None
    assert tree["models"][0]["corruptions"] == {"fog": 0.5, "snow": None}
    assert tree["models"][0]["attacks"]["fgsm.sa"] == {
        "success_rate": 1, "success_rate_ci95": None, "robustness_adv": 0}
    assert "correct" not in tree["models"][0]["average_robustness_adv"]


def test_keys_outside_the_contract_are_refused_or_named() -> None:
    canary = _canary()
    canary["attacks"][TRANSFER]["effect"]["MR"]["novel"] = 1.0
    with pytest.raises(ValueError, match=r"canary\.attacks\..*\.effect\.MR\.novel"):
        fill_message(report_pb2.CanaryMetrics(), canary, "canary")
    left_out: list[str] = []
    msg = fill_message(report_pb2.CanaryMetrics(), canary, "canary", left_out)
    assert left_out == [f"canary.attacks.{TRANSFER}.effect.MR.novel"]
    assert message_tree(msg)["attacks"][TRANSFER]["effect"]["MR"]["status"] == "ok"
    with pytest.raises(ValueError, match="whole number"):
        fill_message(report_pb2.CanaryMetrics(), {"model": {"n": 1.5}}, "canary")


def test_a_part_larger_than_any_evaluation_gives_is_refused_by_name() -> None:
    """The page draws what a caller sends: a part is bounded in values, as the untyped part
    was."""
    parts = make_parts()
    block = report_pb2.NumberMatrix()
    block.values.add().values.extend([0.5] * 1000)
    for _ in range(600):
        parts.benchmark.matrix.add().CopyFrom(block)
    with pytest.raises(InvalidArgument, match="more than 500000 values") as err:
        build_report(parts)
    assert err.value.violations[0].field == "parts.benchmark"


@pytest.mark.parametrize("part", ["canary", "benchmark"])
def test_a_part_sent_as_null_is_refused_by_name(part: str) -> None:
    """``""`` in null_fields nulls a map's value; on a whole part (a caller's RenderReport) it
    is refused naming the field, not an internal error later."""
    parts = make_parts()
    getattr(parts, part).null_fields.append("")
    with pytest.raises(InvalidArgument) as err:
        build_report(parts)
    assert err.value.violations[0].field == f"parts.{part}.null_fields"
    parts = make_parts()                                  # a map value may be null
    parts.canary.attacks["fgsm"].null_fields.append("")
    assert build_report(parts)["canary"]["attacks"]["fgsm"] is None


def test_values_the_schema_cannot_hold_are_refused_or_named_never_a_crash() -> None:
    """The untyped parts took any JSON value; a typed part cannot hold a null where the schema
    has no null, a bool where a number belongs or a string in a matrix. Strict (RenderReport's
    callers): a ValueError naming the path. Tolerant (the evaluation's own parts): the value
    is left out and named, and everything else is kept -- a finished run never fails at its
    last step for one odd value."""
    bad = {"by_source": {"pgd": None, "fgsm": {"vgg": 0.25}}}
    with pytest.raises(ValueError, match=r"transfer\.by_source\.pgd"):
        fill_message(report_pb2.TransferSummary(), bad, "transfer")
    left_out: list[str] = []
    msg = fill_message(report_pb2.TransferSummary(), bad, "transfer", left_out)
    assert [p.split(" ")[0] for p in left_out] == ["transfer.by_source.pgd"]
    assert message_tree(msg) == {"by_source": {"fgsm": {"vgg": 0.25}}}

    rows = {"matrix": [None], "model_names": ["a"], "attacks": [True]}
    with pytest.raises(ValueError, match=r"benchmark\.matrix\[0\]"):
        fill_message(report_pb2.BenchmarkResults(), rows, "benchmark")
    left_out = []
    msg = fill_message(report_pb2.BenchmarkResults(), rows, "benchmark", left_out)
    assert sorted(p.split(" ")[0] for p in left_out) == ["benchmark.attacks", "benchmark.matrix"]
    assert message_tree(msg) == {"model_names": ["a"]}


def test_numpy_numbers_are_numbers() -> None:
    import numpy as np
    msg = fill_message(report_pb2.TransferSummary(),
                       {"by_source": {"pgd": {"vgg": np.float32(0.5), "res": np.int64(1)}}}, "t")
    assert message_tree(msg) == {"by_source": {"pgd": {"vgg": 0.5, "res": 1}}}


def test_a_part_nested_past_the_bound_is_refused_by_name() -> None:
    """``MetricNode.per_model`` nests itself, so a caller could send a part nested without end:
    the report refuses it past 32 levels, naming the part, as it refused a deep open part."""
    parts = make_parts()
    node = parts.canary.model.ca
    for _ in range(40):
        node = node.per_model["m"]
        node.value = 0.5
    with pytest.raises(InvalidArgument, match="nested deeper than 32") as err:
        build_report(parts)
    assert err.value.violations[0].field == "parts.canary"
    shallow = make_parts()
    shallow.canary.model.ca.per_model["m"].per_model["n"].value = 0.5
    build_report(shallow)


def test_a_whole_number_out_of_its_fields_range_is_named_not_a_crash() -> None:
    with pytest.raises(ValueError, match=r"t\.top_k: out of range"):
        fill_message(report_pb2.TargetReport(), {"top_k": 2 ** 40}, "t")
    left_out: list[str] = []
    msg = fill_message(report_pb2.TargetReport(), {"top_k": 2 ** 40, "name": "m"}, "t", left_out)
    assert [p.split(" ")[0] for p in left_out] == ["t.top_k"]
    assert msg.name == "m" and not msg.top_k
