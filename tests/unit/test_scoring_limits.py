"""So that one tenant cannot stall every tenant, every numeric parameter of the
metric catalogue has a documented bound checked before any work, refused as INVALID_ARGUMENT
naming ``params.<key>``; the arrays of one Compute call are bounded together; ListMetrics shows
the bounds; the stop check built from a call raises DeadlineExceeded or Cancelled by cause."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from fortis.services.common.errors import Cancelled, DeadlineExceeded, InvalidArgument
from fortis.services.common.stopping import caller_stop, never, raise_if_stopped
from fortis.services.scoring import limits
from fortis.services.scoring.catalogue import METRICS, compute, list_metrics

_IRT: dict[str, Any] = {
    "subjects": ["a", "b", "c"],
    "metrics": [{"name": "m1", "category": "x", "values": [0.1, 0.5, 0.9],
                 "higher_is_better": True},
                {"name": "m2", "category": "x", "values": [0.2, 0.4, 0.8],
                 "higher_is_better": True}],
}


def _fields(exc: pytest.ExceptionInfo[InvalidArgument]) -> list[str]:
    return [v.field for v in exc.value.violations]


def test_every_bound_names_a_parameter_of_its_entry() -> None:
    for metric_id, bounds in limits.PARAM_BOUNDS.items():
        names = {i.name for i in METRICS[metric_id].inputs if i.kind == "param"}
        for path in bounds:
            if metric_id == "ndcg" and path in ("max_k1", "max_k2"):
                continue        # read by the adapter, not (yet) listed as inputs
            assert path.split(".")[0] in names, (metric_id, path)


@pytest.mark.parametrize("value", [1e9, 100_001, 0, -5, 2.5, float("nan"), "many", True])
def test_irt_chain_length_out_of_bounds_is_refused_naming_the_field(value: Any) -> None:
    with pytest.raises(InvalidArgument) as exc:
        compute("irt", {}, {**_IRT, "chain_length": value})
    assert _fields(exc) == ["params.chain_length"]


def test_all_violations_at_once_before_any_work() -> None:
    with pytest.raises(InvalidArgument) as exc:
        compute("irt", {}, {**_IRT, "chain_length": 1e9, "burn_in": -1, "step_c": 5.0,
                            "seed": -1})
    assert sorted(_fields(exc)) == ["params.burn_in", "params.chain_length", "params.seed",
                                    "params.step_c"]


@pytest.mark.parametrize(("metric", "params", "field"), [
    ("drr", {"k": 1e7}, "params.k"),
    ("ndcg", {"positions": 0}, "params.positions"),
    ("ndcg", {"gamma_b": 2.0}, "params.gamma_b"),
    ("degradation_profile", {"thresholds": [0.5, 1.5]}, "params.thresholds[1]"),
    ("degradation_profile", {"thresholds": [0.5] * 17}, "params.thresholds"),
    ("degradation_profile", {"num_classes": 1e12}, "params.num_classes"),
    ("canary.perturbation_cost", {"change_tolerance": 1e6}, "params.change_tolerance"),
    ("twoway", {"attacks": ["a"] * 1001, "models": ["m"]}, "params.attacks"),
    ("irt", {"subjects": [f"s{i}" for i in range(1001)]}, "params.subjects"),
    ("irt", {"step_theta": 0.0}, "params.step_theta"),
    ("ieee.classification", {"rule": {"k": 1e9}}, "params.rule.k"),
    ("ieee.detection", {"criterion": {"iou_threshold": 3}}, "params.criterion.iou_threshold"),
    ("pertknob.robustness", {"threshold": float("inf")}, "params.threshold"),
])
def test_bounds_of_each_entry(metric: str, params: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidArgument) as exc:
        limits.check_params(metric, params)
    assert _fields(exc) == [field]


def test_values_inside_the_bounds_pass_and_integral_doubles_are_integers() -> None:
    limits.check_params("irt", {"chain_length": 100_000.0, "burn_in": 0, "seed": 7,
                                "step_c": 0.03, "subjects": ["a", "b"]})
    limits.check_params("drr", {"k": None})          # null = the default
    out = compute("irt", {}, {**_IRT, "chain_length": 40.0, "burn_in": 10,
                              "step_theta": 0.5})
    assert out["layer1"]["x"]["sampler"] == {"chain_length": 40, "burn_in": 10}


def test_array_elements_are_bounded_from_the_shapes() -> None:
    big = limits.MAX_ARRAY_ELEMENTS
    with pytest.raises(InvalidArgument) as exc:
        limits.check_array_elements([("perturbed_probs", (big, 2))])
    assert _fields(exc) == ["arrays.perturbed_probs.shape"]
    with pytest.raises(InvalidArgument) as exc:
        limits.check_array_elements([("a", (big // 2 + 1,)), ("b", (big // 2,))])
    assert _fields(exc) == ["arrays"]
    limits.check_array_elements([("a", (big // 2,)), ("b", (big // 2,)), ("c", (0, 3))])


def test_compute_checks_array_elements(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "MAX_ARRAY_ELEMENTS", 10)
    probs = np.full((4, 3), 1 / 3)
    with pytest.raises(InvalidArgument) as exc:
        compute("drr", {"perturbed_probs": probs, "benign_class": np.zeros(4, dtype=np.int64)})
    assert _fields(exc) == ["arrays.perturbed_probs.shape"]


def test_list_metrics_documents_the_bounds() -> None:
    irt = next(m for m in list_metrics() if m["id"] == "irt")
    text = {i["name"]: i["description"] for i in irt["inputs"]}
    assert "integer in [1, 100000]" in text["chain_length"]
    drr = next(m for m in list_metrics() if m["id"] == "drr")
    assert "[1, 10000]" in next(i["description"] for i in drr["inputs"] if i["name"] == "k")


def test_caller_stop_decides_the_error_by_the_cause() -> None:
    assert caller_stop(lambda: True, lambda: None)() is False
    assert caller_stop(lambda: True, lambda: 3.0)() is False
    with pytest.raises(DeadlineExceeded):
        caller_stop(lambda: False, lambda: -0.1)()      # past the deadline: deadline wins
    with pytest.raises(Cancelled):
        caller_stop(lambda: False, lambda: 2.0)()
    with pytest.raises(Cancelled):
        raise_if_stopped(lambda: True, "work")
    raise_if_stopped(never, "work")
