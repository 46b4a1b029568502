"""End to end: a multi-target plan over the built-in Fashion-MNIST models and their defended
(adversarially trained) variant gives CANARY's cross-model sections (seed 003): the K x M x M
data matrix with transfer heat maps and the two-way squeeze (CAN-7), IRT abilities with their
intervals (CAN-8), the defence effect of fmnist-cnn-at over fmnist-cnn (CAN-5), and a fast-mode
ranking of a new model against the stored evaluation without re-running it (CAN-10).

Everything is real: the five services on loopback, the models, the proxy's ledger, the store.
The checks are properties that must hold, and cross-checks between independent paths (the
matrix against each model's own attack metrics, the ledger against what each target must
have received), not recorded numbers."""

from __future__ import annotations

import json
import math

import pytest
from fortis.client import FortisClient, progress_of

from tests.conftest import API_KEY, OTHER_KEY

pytestmark = pytest.mark.timeout(900)

N = 96
PLAN = f"""
name: fmnist-benchmark
seed: 13
targets:
  - {{name: fmnist-cnn, surrogate: fmnist-cnn}}
  - {{name: fmnist-cnn-at, surrogate: fmnist-cnn-at, defends: fmnist-cnn}}
  - {{name: fmnist-mlp, surrogate: fmnist-mlp}}
dataset: {{source: fashion-mnist, split: test, limit: {N}}}
correctness: {{mode: top1}}
corruptions:
  - {{id: gaussian_noise, severities: [3]}}
attacks:
  - {{id: fgsm, params: {{epsilon: 0.1}}}}
  - {{id: pgd, params: {{epsilon: 0.1, steps: 10}}}}
  - {{id: square, params: {{epsilon: 0.1, max_queries: 40}}, limit: 8}}
acceptance:
  accuracy: ">= 0.5"
  attacks.pgd.fmnist-cnn.success_rate: "<= 1.0"
execution: {{batch_size: 48}}
"""

FAST = f"""
name: fmnist-benchmark-fast
seed: 13
targets:
  - {{name: fmnist-cnn-top3, surrogate: fmnist-cnn}}
baseline: {{evaluation: BASELINE}}
dataset: {{source: fashion-mnist, split: test, limit: {N}}}
correctness: {{mode: top1}}
attacks:
  - {{id: fgsm, params: {{epsilon: 0.1}}}}
  - {{id: pgd, params: {{epsilon: 0.1, steps: 10}}}}
  - {{id: square, params: {{epsilon: 0.1, max_queries: 40}}, limit: 8}}
execution: {{batch_size: 48}}
"""


@pytest.fixture()
def bench_stack(tmp_path, fmnist_target, fmnist_surrogate):
    from fortis.server.app.stack import DEFAULT_TARGETS, StackSettings, TargetConfig, start_stack
    s = start_stack(StackSettings(
        state_dir=tmp_path / "state", api_keys={API_KEY: "tenant-a", OTHER_KEY: "tenant-b"},
        targets=[TargetConfig.parse(t) for t in DEFAULT_TARGETS],
        # the models are attacked through their own weights: the operator grants it
        whitebox_grants={"tenant-a": frozenset({"*"})}))
    yield s
    s.stop(0)


def _run(fc: FortisClient, plan: str) -> tuple[dict, str]:
    ev = fc.submit(plan)
    final = fc.wait(ev.evaluation_id)
    assert progress_of(final).state == "SUCCEEDED", getattr(final.error, "message", "")
    js, html = fc.report_files(ev.evaluation_id)
    return json.loads(js), html


def test_multi_target_benchmark_and_fast_mode(bench_stack, tmp_path):
    with FortisClient(bench_stack.address, api_key=API_KEY) as fc:
        report, html = _run(fc, PLAN)
        # the page carries the cross-model sections (rendered by the report service)
        for anchor in ("benchmark-models", "benchmark-transfer", "benchmark-rankings",
                       "benchmark-irt", "benchmark-defence"):
            assert f'id="{anchor}"' in html, anchor
        eid = report["evaluation"]["id"]
        b = report["benchmark"]
        models = ["fmnist-cnn", "fmnist-cnn-at", "fmnist-mlp"]
        assert b["mode"] == "benchmark" and b["model_names"] == models
        assert b["attacks"] == ["fgsm", "pgd", "square"] and b["metric"] == "MR"
        m = b["matrix"]
        assert len(m) == 3 and all(len(r) == 3 and all(len(c) == 3 for c in r) for r in m)
        # CAN-7 cross-check: the matrix is each model's own attack metrics, crafted on each
        # surrogate (the primary's report carries its own per-setting success rates).
        own = report["metrics"]["attacks"]
        for k, attack in enumerate(("fgsm", "pgd")):
            for i, src in enumerate(models):
                assert m[k][i][0] == pytest.approx(own[f"{attack}.{src}"]["success_rate"])
                for j in range(3):
                    assert 0.0 <= m[k][i][j] <= 1.0
        # a query attack runs against each model itself: the diagonal only
        assert all((m[2][i][j] is None) == (i != j) for i in range(3) for j in range(3))
        assert m[2][0][0] == pytest.approx(own["square"]["success_rate"])
        # the defended model resists white-box PGD far better than the model it defends
        assert m[1][1][1] < m[1][0][0] - 0.3
        # CAN-7 two-way squeeze: the adversarially trained model ranks most robust
        tw = b["twoway"]["two_way"]
        ranks = tw["model_robustness"]["entries"]
        assert ranks["fmnist-cnn-at"]["rank"] == 1, ranks
        assert set(b["twoway"]["heatmaps"]) == {"fgsm", "pgd", "square"}
        # CAN-8: IRT abilities with their spread for every model
        irt = b["irt"]["subjects"]
        assert set(irt) == set(models)
        for name in models:
            assert math.isfinite(irt[name]["theta"]) and irt[name]["theta_sd"] >= 0
        # CAN-5: fmnist-cnn-at named the defended version of fmnist-cnn
        (d,) = b["defence"]
        assert (d["baseline"], d["defended"]) == ("fmnist-cnn", "fmnist-cnn-at")
        assert d["result"]["RR"]["status"] == "ok" and d["result"]["SR"]["status"] == "ok"
        assert d["attacks"]["pgd"]["ACV"]["MR"]["value"] < 0      # the defence lowers MR
        # summaries: clean accuracy with a CI per model
        for s in b["models"]:
            lo, hi = s["accuracy"]["ci95"]
            assert lo <= s["accuracy"]["value"] <= hi
        # the verdict reads expanded attack names
        assert report["verdict"]["status"] == "pass"
        # ledger: every target received every transfer example once (shared, crafted once)
        for k in range(len(models)):
            prefix = eid if k == 0 else f"{eid}.m{k}"
            for attack in ("fgsm", "pgd"):
                for src in models:
                    stats = fc.session_stats(f"{prefix}/attack/{attack}.{src}")
                    assert stats.queries_ok == N
        store = bench_stack.manager.store.for_tenant("tenant-a")
        arts = [a.name for a in store.artifacts(eid)]
        for attack in ("fgsm", "pgd"):
            for src in models:
                assert arts.count(f"adversarial/{attack}.{src}-00000.npz") == 1
        assert any(a.startswith("m1/adversarial/square") for a in arts)

        # CAN-10 fast mode: a new model ranked against the stored evaluation
        fast, fast_html = _run(fc, FAST.replace("BASELINE", eid))
        assert 'id="benchmark-fast"' in fast_html
        fb = fast["benchmark"]
        assert fb["mode"] == "fast" and fb["baseline_evaluation"] == eid
        assert 1 <= fb["fast"]["rank"] <= fb["fast"]["of"] == 4
        fid = fast["evaluation"]["id"]
        # the baseline's stored examples were sent, not crafted again
        fast_arts = [a.name for a in store.artifacts(fid)]
        assert not any(a.startswith("adversarial/pgd.fmnist-cnn-at") for a in fast_arts)
        assert fc.session_stats(f"{fid}/attack/pgd.fmnist-cnn-at").queries_ok == N

    # another tenant cannot use the evaluation as its baseline: unknown, as any foreign id
    with FortisClient(bench_stack.address, api_key=OTHER_KEY) as other:
        with pytest.raises(Exception) as exc:
            other.submit(FAST.replace("BASELINE", eid))
        assert "baseline.evaluation" in str(exc.value)
