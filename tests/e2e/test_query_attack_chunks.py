"""A query attack's chunks run in flight together (``RunContext.items``), and that changes
nothing an evaluation reports: each chunk has its own proxy session, seeds and images, so the
same seeded plan sends every chunk the same images in the same order and gets the same
answers whether its chunks run one at a time or side by side (IEEE-M6: the ledger is the
count; CAN-9: a chunk's result depends on its own work only)."""

from __future__ import annotations

import pytest
from fortis.client import FortisClient, progress_of
from fortis.services.evaluation import runner

from tests.conftest import API_KEY

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

PLAN = """
name: chunks
seed: 5
target: {name: fmnist-cnn}
dataset: {source: fashion-mnist, split: test, limit: 24}
attacks:
  - {id: square, params: {epsilon: 0.05, max_queries: 30}}
  - {id: hsja, params: {epsilon: 1.0, max_queries: 30}}
execution: {batch_size: 6}
"""
ATTACKS = ("square", "hsja")
CHUNKS = 4


def _run(stack) -> tuple[dict, dict[str, list], dict[str, list[tuple[int, int]]]]:
    """The report's attack metrics; per attack and chunk the queries the ledger recorded
    (image, input hash, answer, status, in order); per attack each chunk's span of ledger
    entry ids."""
    with FortisClient(stack.address, api_key=API_KEY) as fc:
        ev = fc.submit(PLAN)
        final = fc.wait(ev.evaluation_id, timeout_s=300)
        assert progress_of(final).state == "SUCCEEDED", final.error.message
        metrics = fc.report(ev.evaluation_id)["metrics"]
        queries: dict[str, list] = {}
        spans: dict[str, list[tuple[int, int]]] = {}
        for attack in ATTACKS:
            for c in range(CHUNKS):
                rows = list(fc.iter_ledger_entries(f"{ev.evaluation_id}/attack/{attack}/"
                                                   f"{c:05d}/a1"))
                assert rows, f"{attack} chunk {c} sent nothing"
                queries[f"{attack}/{c}"] = [(r.image_id, r.input_sha256, r.output_summary,
                                             r.status) for r in rows]
                ids = [r.entry_id for r in rows]
                spans.setdefault(attack, []).append((min(ids), max(ids)))
    return metrics, queries, spans


def _overlapping(spans: list[tuple[int, int]]) -> bool:
    """Whether any two chunks' ledger rows interleave (one started before another ended)."""
    s = sorted(spans)
    return any(b[0] < a[1] for a, b in zip(s, s[1:], strict=False))


def test_chunks_in_flight_send_and_report_what_one_at_a_time_does(stack, monkeypatch):
    metrics, queries, spans = _run(stack)
    assert all(_overlapping(spans[a]) for a in ATTACKS), spans     # they did run together

    made = runner.EvaluationRunner._context

    def one_at_a_time(self, *args, **kwargs):
        ctx = made(self, *args, **kwargs)
        ctx.parallel = 1
        return ctx

    monkeypatch.setattr(runner.EvaluationRunner, "_context", one_at_a_time)
    metrics_1, queries_1, spans_1 = _run(stack)
    assert not any(_overlapping(spans_1[a]) for a in ATTACKS), spans_1
    assert queries == queries_1
    attacks = {k: v for k, v in metrics.items() if "attack" in k}
    assert attacks and attacks == {k: v for k, v in metrics_1.items() if "attack" in k}
