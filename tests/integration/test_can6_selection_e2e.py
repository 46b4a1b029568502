"""CAN-6 evaluation example selection end to end (seed 003, 3.2.1): a transfer attack planned
at a budget too small to show what it can do is raised to where its misclassification ratio on
the target stops rising; the selection's queries go through the proxy in their own ledgered
session, and the attack's own session still receives each image once."""

from __future__ import annotations

import json

from fortis.client import FortisClient, progress_of

from tests.conftest import API_KEY

N = 256
PLAN = f"""
name: can6
seed: 3
target: {{name: fmnist-cnn, task: classification}}
dataset: {{source: fashion-mnist, split: test, limit: {N}}}
correctness: {{mode: top1}}
attacks:
  - {{id: fgsm, name: small, surrogate: fmnist-surrogate, params: {{epsilon: 0.03}},
     select_budget: {{images: 256}}}}
  - {{id: fgsm, name: fixed, surrogate: fmnist-surrogate, params: {{epsilon: 0.03}}}}
execution: {{batch_size: 128}}
"""


def test_selection_raises_a_too_small_budget_and_ledgers_its_queries(stack):
    with FortisClient(stack.address, api_key=API_KEY) as fc:
        ev = fc.submit(PLAN)
        seen = []
        final = fc.wait(ev.evaluation_id, on_progress=seen.append)
        assert progress_of(final).state == "SUCCEEDED", getattr(final.error, "message", "")
        assert seen[-1].items_done == seen[-1].items_total
        report = json.loads(fc.report_files(ev.evaluation_id)[0])
        eid = report["evaluation"]["id"]
        for name in ("small", "fixed"):        # each image sent once by the attack itself
            assert fc.session_stats(f"{eid}/attack/{name}").queries_ok == N
        sel = fc.session_stats(f"{eid}/attack/small.select").queries_ok
        assert sel > N and report["ledger"]["sessions"][f"{eid}/attack/small.select"] == sel
    tests = {t["id"]: t for t in report["tests"]}
    small, fixed = tests["small"], tests["fixed"]
    assert fixed["epsilon"] == 0.03 and "epsilon_selection" not in fixed["parameters"]
    assert small["parameters"]["epsilon_planned"] == 0.03
    assert small["epsilon"] > 0.03 and small["parameters"]["epsilon"] == small["epsilon"]
    assert "raised" in small["parameters"]["epsilon_selection"]
    # the larger selected budget misleads the target more often than the planned one
    m = report["metrics"]["attacks"]
    assert m["small"]["success_rate"] > m["fixed"]["success_rate"]
    assert m["small"]["max_linf"] <= small["epsilon"] + 1e-6
