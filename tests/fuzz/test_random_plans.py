"""Property-based plans: random valid plans run to the end.

Hypothesis draws plans a user could write against the Fashion-MNIST classifier served with
full scores, top-3 scores or labels only: catalogue entries (corruptions, degradation
operators, transfer attacks on a surrogate or an ensemble, query attacks, PertKnob over a
PER-1 property), every parameter anywhere in its schema range (the registry's bounds; only the
parameters that set how much work is done -- query budgets, iterations, population sizes --
are drawn small, so an example stays a few seconds), dataset sizes, batch sizes, targeted or
not, limits. Properties:

- the server either refuses the plan at validation, naming a field (a plan it cannot run), or
  accepts it; an accepted plan's evaluation SUCCEEDS with no failed setting (never FAILED: the
  target here is a built-in model that does not fail);
- no image of a query attack received more than its Q_m (attempted and answered queries, from
  the proxy's ledger) and no session more than its budget.

Derandomized, so CI runs the same examples every time.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fortis.client import FortisClient
from fortis.client.errors import InvalidArgument
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]

KEY = "random-plans-key"
TARGETS = {"cnn": "builtin:fmnist-cnn", "cnn-top3": "builtin:fmnist-cnn?output=top_k&top_k=3",
           "cnn-label": "builtin:fmnist-cnn?output=label_only"}
SURROGATES = ("fmnist-surrogate", "fmnist-mlp", "fmnist-cnn-at")
#: Parameters that set how much work an entry does: drawn within these small caps.
COST = {"max_queries": 30, "steps": 8, "binary_search_steps": 2, "epochs": 3,
        "generations": 4, "popsize": 24, "restarts": 2, "rotation_steps": 7,
        "translation_steps": 3, "vmi_samples": 3, "si_copies": 3, "width": 24,
        "n_probes": 40, "norm_samples": 8}
#: Examples per run (each is one evaluation of a second or a few); a longer hunt:
#: ``FORTIS_PLAN_EXAMPLES=500 FORTIS_PLAN_RANDOM=1 pytest tests/fuzz/test_random_plans.py``.
EXAMPLES = int(os.environ.get("FORTIS_PLAN_EXAMPLES", "60"))


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, fmnist_target, fmnist_surrogate
          ) -> Iterator[Any]:
    from fortis.server.app.stack import StackSettings, TargetConfig, start_stack

    s = start_stack(StackSettings(
        state_dir=Path(tmp_path_factory.mktemp("plans")) / "state", api_keys={KEY: "fuzz"},
        targets=[TargetConfig.parse(f"{k}={v}") for k, v in TARGETS.items()],
        metrics_port=0, metrics_host="127.0.0.1"))
    yield s
    s.stop(0)


def _value(p: Any) -> st.SearchStrategy[Any]:
    """A value anywhere in a parameter's schema (work-setting ones capped small)."""
    if p.type == "bool":
        return st.booleans()
    if p.choices:
        return st.sampled_from(list(p.choices))
    if p.type == "int":
        lo = int(p.minimum if p.minimum is not None else 0)
        hi = int(p.maximum if p.maximum is not None else lo + 1000)
        if p.name in COST:
            hi = max(lo, min(hi, COST[p.name]))
        return st.integers(lo, hi)
    if p.type == "float":
        lo = float(p.minimum if p.minimum is not None else 0.0)
        hi = float(p.maximum if p.maximum is not None else 1e6)
        return st.one_of(st.sampled_from([lo, hi]),
                         st.floats(lo, hi, allow_nan=False, allow_infinity=False))
    return st.nothing()


@st.composite
def _params(draw: st.DrawFn, spec: Any, required_only: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for p in spec.params:
        if p.type == "string" and not p.choices:
            continue                       # names (a layer, a property): defaults or below
        if p.default is None or p.name in COST or draw(st.booleans()):
            out[p.name] = draw(_value(p))
    return out


@st.composite
def plans(draw: st.DrawFn) -> tuple[str, dict[str, int]]:
    """A plan and, per query attack name, its Q_m."""
    from fortis.services.perturbation.attacks.registry import ATTACKS
    from fortis.services.perturbation.registry import PERTURBATIONS

    target = draw(st.sampled_from(sorted(TARGETS)))
    n = draw(st.integers(1, 10))
    doc: dict[str, Any] = {"name": "random", "seed": draw(st.integers(0, 2**31)),
                           "target": {"name": target, "task": "classification"},
                           "dataset": {"source": "fashion-mnist", "split": "test",
                                       "limit": n}}
    batch = draw(st.sampled_from([None, 1, 2, 3, 7, 64, 1024]))
    if batch is not None:
        doc["execution"] = {"batch_size": batch}
    corr = [p for p in PERTURBATIONS.values() if p.kind in ("corruption", "style")
            and p.id != "neural_style"]
    picked = draw(st.lists(st.sampled_from(corr), max_size=2, unique_by=lambda p: p.id))
    if picked:
        doc["corruptions"] = [{"id": p.id, "severities": draw(st.lists(
            st.integers(1, 5), min_size=1, max_size=3, unique=True))} for p in picked]
    ops = [p for p in PERTURBATIONS.values() if p.kind == "degradation"]
    if draw(st.booleans()):
        op = draw(st.sampled_from(ops))
        item: dict[str, Any] = {"id": op.id, "levels": draw(st.lists(
            st.integers(1, 30), min_size=1, max_size=2, unique=True))}
        if op.needs_model:
            item["surrogate"] = draw(st.sampled_from(SURROGATES))
        doc["degradation"] = [item]
    label_only = target == "cnn-label"
    eligible = [a for a in ATTACKS.values() if a.supports_task("classification")
                and not (label_only and a.kind == "score")]
    attacks, budgets = [], {}
    for k, spec in enumerate(draw(st.lists(st.sampled_from(eligible), max_size=3))):
        name = f"{spec.id}-{k}"
        item = {"id": spec.id, "name": name, "params": draw(_params(spec))}
        if spec.id == "pertknob":
            props = [p.id for p in PERTURBATIONS.values() if p.kind == "property"]
            item["params"]["property"] = draw(st.sampled_from(props))
        if spec.needs_surrogate:
            item["surrogate"] = draw(st.one_of(
                st.sampled_from(SURROGATES),
                st.lists(st.sampled_from(SURROGATES), min_size=2, max_size=2, unique=True)))
        elif spec.uses_surrogate and draw(st.booleans()):
            item["surrogate"] = draw(st.sampled_from(SURROGATES))
        if spec.targeted and (not spec.untargeted or draw(st.booleans())):
            item["targeted"] = {"label": draw(st.integers(0, 9))}
        if draw(st.booleans()):
            item["limit"] = draw(st.integers(1, n))
        if spec.is_query_attack:
            budgets[name] = int(item["params"].get("max_queries", 0))
        attacks.append(item)
    if attacks:
        doc["attacks"] = attacks
    return json.dumps(doc), budgets


@settings(max_examples=EXAMPLES, deadline=None, database=None,
          derandomize=not os.environ.get("FORTIS_PLAN_RANDOM"),
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                 HealthCheck.data_too_large])
@given(case=plans())
def test_random_valid_plans_run_to_the_end_within_their_budgets(stack, case) -> None:
    text, budgets = case
    with FortisClient(stack.address, api_key=KEY) as fc:
        try:
            fc.validate(text)
        except InvalidArgument as exc:           # refused up front, naming the field
            assert exc.violations and all(v.field for v in exc.violations), exc
            event(f"refused: {exc.violations[0].field}: {exc.violations[0].description[:80]}")
            return
        doc = json.loads(text)
        event(f"ran: {len(doc.get('attacks', []))} attacks, "
              f"{len(doc.get('corruptions', []))} corruptions")
        ev = fc.wait(fc.submit(text).evaluation_id, timeout_s=900)
        assert ev.state.value == "SUCCEEDED", (ev.error, text)
        report = fc.report(ev.evaluation_id)
        assert not report["failed_settings"], (report["failed_settings"], text)
        for sid in report["ledger"]["sessions"]:
            name = sid.split("/")[2] if sid.count("/") >= 4 else ""
            if name not in budgets:
                continue
            images = fc.session_stats(sid).raw.images
            assert all(max(i.attempts, i.queries) <= budgets[name] for i in images), \
                (sid, text)
