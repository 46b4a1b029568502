"""Python SDK: submit a test plan, follow its progress, fetch the report.

    from fortis.client import FortisClient
    with FortisClient("127.0.0.1:50051", api_key="...") as fc:
        ev = fc.submit(open("plan.yaml").read())
        final = fc.wait(ev.evaluation_id, on_progress=lambda p: print(p.items_done, p.items_total))
        report = fc.report(ev.evaluation_id)          # dict of report.json
        fc.write_report(ev.evaluation_id, "out/")     # report.json + report.html

Errors come back as ``fortis.services.common.errors`` exceptions (``InvalidArgument`` with
``.violations`` naming each bad field of the plan, ``NotFound``, ...).
"""

from __future__ import annotations

import builtins
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from fortis.evaluation.v1 import evaluation_pb2 as ev_pb
from fortis.evaluation.v1 import evaluation_pb2_grpc
from fortis.perturbation.v1 import perturbation_pb2, perturbation_pb2_grpc
from fortis.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from fortis.services.common.server import call_metadata, channel, error_from_rpc

STATE_NAMES = {v: k.removeprefix("EVALUATION_STATE_")
               for k, v in ev_pb.EvaluationState.items()}


@dataclass(frozen=True)
class Progress:
    state: str
    stage: str
    items_done: int
    items_total: int
    queries: int
    message: str

    @property
    def fraction(self) -> float:
        return self.items_done / self.items_total if self.items_total else 0.0


def progress_of(ev: ev_pb.Evaluation) -> Progress:
    p = ev.progress
    return Progress(state=STATE_NAMES[ev.state], stage=p.stage, items_done=p.items_done,
                    items_total=p.items_total, queries=p.queries, message=p.message)


class FortisClient:
    """Client of a running Fortis (``fortis serve``)."""

    def __init__(self, address: str, *, api_key: str = "", timeout_s: float = 60.0) -> None:
        self.address = address
        self._md = call_metadata(api_key)
        self._ch = channel(address)
        self.timeout_s = timeout_s
        self.evaluations = evaluation_pb2_grpc.EvaluationServiceStub(self._ch)
        self.proxy = proxy_pb2_grpc.TargetProxyServiceStub(self._ch)
        self.perturbation = perturbation_pb2_grpc.PerturbationServiceStub(self._ch)

    def close(self) -> None:
        self._ch.close()

    def __enter__(self) -> FortisClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, fn: Any, req: Any) -> Any:
        try:
            return fn(req, metadata=self._md, timeout=self.timeout_s)
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None

    # -- evaluations ------------------------------------------------------------------------
    def submit(self, plan_text: str, *, evaluation_id: str = "") -> ev_pb.Evaluation:
        return self._call(self.evaluations.CreateEvaluation, ev_pb.CreateEvaluationRequest(
            plan=plan_text, evaluation_id=evaluation_id)).evaluation

    def get(self, evaluation_id: str) -> ev_pb.Evaluation:
        return self._call(self.evaluations.GetEvaluation,
                          ev_pb.GetEvaluationRequest(evaluation_id=evaluation_id)).evaluation

    def list(self, page_size: int = 50) -> list[ev_pb.Evaluation]:
        return list(self._call(self.evaluations.ListEvaluations,
                               ev_pb.ListEvaluationsRequest(page_size=page_size)).evaluations)

    def cancel(self, evaluation_id: str) -> ev_pb.Evaluation:
        return self._call(self.evaluations.CancelEvaluation,
                          ev_pb.CancelEvaluationRequest(evaluation_id=evaluation_id)).evaluation

    def watch(self, evaluation_id: str) -> Iterator[ev_pb.Evaluation]:
        try:
            for resp in self.evaluations.WatchEvaluation(
                    ev_pb.WatchEvaluationRequest(evaluation_id=evaluation_id), metadata=self._md):
                yield resp.evaluation
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None

    def wait(self, evaluation_id: str, *,
             on_progress: Callable[[Progress], None] | None = None) -> ev_pb.Evaluation:
        """Follow the evaluation until it ends; calls ``on_progress`` on every change."""
        last = None
        while True:
            try:
                for ev in self.watch(evaluation_id):
                    last = ev
                    if on_progress:
                        on_progress(progress_of(ev))
            except Exception as exc:  # a dropped stream: reconnect unless it ended
                from fortis.services.common.errors import Unavailable
                if not isinstance(exc, Unavailable):
                    raise
            if last is not None and STATE_NAMES[last.state] in ("SUCCEEDED", "FAILED", "CANCELLED"):
                return last
            last = self.get(evaluation_id)
            if STATE_NAMES[last.state] in ("SUCCEEDED", "FAILED", "CANCELLED"):
                return last

    def report_files(self, evaluation_id: str) -> tuple[str, str]:
        r = self._call(self.evaluations.GetEvaluationReport,
                       ev_pb.GetEvaluationReportRequest(evaluation_id=evaluation_id))
        return r.report_json, r.report_html

    def report(self, evaluation_id: str) -> dict[str, Any]:
        return json.loads(self.report_files(evaluation_id)[0])

    def write_report(self, evaluation_id: str, out_dir: str | Path) -> tuple[Path, Path]:
        js, html = self.report_files(evaluation_id)
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.json").write_text(js)
        (out / "report.html").write_text(html)
        return out / "report.json", out / "report.html"

    # -- proxy and catalogue ----------------------------------------------------------------
    def session_stats(self, session_id: str) -> proxy_pb2.GetSessionStatsResponse:
        return self._call(self.proxy.GetSessionStats,
                          proxy_pb2.GetSessionStatsRequest(session_id=session_id))

    def perturbations(self) -> builtins.list[perturbation_pb2.PerturbationInfo]:
        return list(self._call(self.perturbation.ListPerturbations,
                               perturbation_pb2.ListPerturbationsRequest()).perturbations)
