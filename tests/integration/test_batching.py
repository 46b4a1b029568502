"""Calls are split where the transport or the target needs it, whatever the plan's batch size:
an attack whose query (running images x rows per image) passes a request's image count runs,
and a target that declares a small ``max_batch_size`` is never sent more (IEEE-M6: each row
is still one query of its image, counted and budgeted by the proxy).

Real parts: the services in one process on loopback, the Fashion-MNIST CNN, and a real gRPC
``TargetService`` on its own port that refuses batches over its declared maximum.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import pytest
from fortis.client import FortisClient, progress_of

pytestmark = pytest.mark.usefixtures("one_thread")

KEY = "test-key-batching"


class _Recording:
    """The CNN as a target that declares ``max_batch`` and records every batch it gets."""

    def __init__(self, inner, max_batch: int) -> None:
        self.inner = inner
        self.inner.max_batch = max_batch
        self.sizes: list[int] = []
        self._lock = threading.Lock()

    def info(self):
        return self.inner.info()

    def predict(self, images: Sequence) -> list:
        with self._lock:
            self.sizes.append(len(images))
        return self.inner.predict(images)


def _plan(target: str, n: int, attack: str, batch: int | None = None) -> str:
    execution = f"execution: {{batch_size: {batch}}}\n" if batch else ""
    return (f"name: batching\nseed: 5\ntarget: {{name: {target}, task: classification}}\n"
            f"dataset: {{source: fashion-mnist, split: test, limit: {n}}}\n"
            f"attacks:\n  - {attack}\n" + execution)


def test_nes_at_its_defaults_runs_at_the_default_batch(tmp_path: Path, fmnist_target):
    """NES's default query asks 25 images x 46 rows = 1,150 rows at once, more than one
    request may carry (1,024): it used to end the evaluation FAILED."""
    from fortis.server.app.stack import StackSettings, TargetConfig, start_stack

    s = start_stack(StackSettings(state_dir=tmp_path / "state", api_keys={KEY: "t"},
                                  targets=[TargetConfig.parse("cnn=builtin:fmnist-cnn")],
                                  metrics_port=0, metrics_host="127.0.0.1"))
    try:
        with FortisClient(s.address, api_key=KEY) as fc:
            ev = fc.submit(_plan("cnn", 25, "{id: nes, params: {epsilon: 0.1, max_queries: 200}}"))
            final = fc.wait(ev.evaluation_id, timeout_s=600)
            assert progress_of(final).state == "SUCCEEDED", final.error
            report = fc.report(ev.evaluation_id)
            node = report["metrics"]["attacks"]["nes"]
            assert node["m"] == 25 and node["median_queries"] <= 200
            sessions = {sid: n for sid, n in report["ledger"]["sessions"].items()
                        if "/attack/nes/" in sid}
            assert sessions                 # the chunk's session, read from the ledger
            for sid, n in sessions.items():
                images = fc.session_stats(sid).raw.images
                assert len(images) == 25 and all(i.attempts <= 200 for i in images)
                assert sum(i.queries for i in images) == n
    finally:
        s.stop(0)


def test_a_target_is_never_sent_more_than_it_declares(tmp_path: Path, fmnist_target):
    """A remote TargetService declaring max_batch_size 4 gets batches of at most 4, from the
    clean pass (plan batch 64) and from a query attack's queries alike."""
    from fortis.adapters.torch_target import ClassifierTarget
    from fortis.server.app.stack import (
        StackSettings,
        TargetConfig,
        start_stack,
        start_target_server,
    )

    remote = _Recording(ClassifierTarget(fmnist_target), max_batch=4)
    server = start_target_server(TargetConfig.parse("r=builtin:fmnist-cnn"), target=remote)
    s = start_stack(StackSettings(
        state_dir=tmp_path / "state", api_keys={KEY: "t"},
        targets=[TargetConfig.parse(f"remote=grpc://{server.address}")],
        metrics_port=0, metrics_host="127.0.0.1"))
    try:
        with FortisClient(s.address, api_key=KEY) as fc:
            ev = fc.submit(_plan("remote", 40, "{id: square, params: {epsilon: 0.1, "
                                 "max_queries: 20}, limit: 12}", batch=64))
            final = fc.wait(ev.evaluation_id, timeout_s=600)
            assert progress_of(final).state == "SUCCEEDED", final.error
            report = fc.report(ev.evaluation_id)
            assert report["metrics"]["accuracy"]["m"] == 40
    finally:
        s.stop(0)
        server.stop(0)
    assert remote.sizes and max(remote.sizes) <= 4
    # every clean image and every attack query arrived, in batches the target accepts
    assert sum(remote.sizes) >= 40 + 12


def test_the_operator_caps_a_target_batch(tmp_path: Path):
    """``?max_batch=N`` on any target scheme caps the proxy's calls (and is checked)."""
    from fortis.server.app.stack import TargetConfig
    from fortis.services.common import errors

    assert TargetConfig.parse("a=builtin:fmnist-cnn?max_batch=8").max_batch == 8
    assert TargetConfig.parse("a=grpc://127.0.0.1:1?max_batch=2").max_batch == 2
    assert "max_batch" not in TargetConfig.parse(
        "a=kserve+grpc://127.0.0.1:1/m?max_batch=2&batch=4").url
    for bad in ("0", "5000", "x"):
        with pytest.raises(errors.InvalidArgument, match="max_batch"):
            TargetConfig.parse(f"a=builtin:fmnist-cnn?max_batch={bad}")
