"""gRPC transport of the scoring service: decode, call the domain, encode.

ScoreEvaluation reads the client stream through ``convert.read_evaluation`` (the one place
that knows the messages), scores it with ``evaluation_scoring.score_evaluation`` and answers
with the typed response. ListMetrics pages through the catalogue with an opaque token;
Compute runs one catalogue entry (its params arrive as JSON, numbers as doubles: each entry
reads the integers it needs itself). Domain errors become statuses in the shared interceptor.

Bounded work: Compute refuses arrays over ``limits.MAX_ARRAY_ELEMENTS`` from their shapes
before decoding them, and hands the catalogue a stop check built from the call
(``stopping.caller_stop``), so a long entry ends with DEADLINE_EXCEEDED or CANCELLED as soon as
its caller's deadline passes or the call is cancelled, instead of working on (run in a worker
process, the worker is killed).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Iterable
from typing import Any, Final, TypeVar

from fortis.core.tensors import tensor_to_array
from fortis.infra.serving.call_context import in_work_slot
from fortis.infra.serving.workprocs import PieceProcesses
from fortis.scoring.v1 import scoring_pb2, scoring_pb2_grpc
from fortis.services.common.errors import InvalidArgument
from fortis.services.common.stopping import caller_stop
from fortis.services.scoring.catalogue import compute, list_metrics
from fortis.services.scoring.convert import read_evaluation, response_from_scores
from fortis.services.scoring.evaluation_scoring import score_evaluation
from fortis.services.scoring.limits import check_array_elements
from google.protobuf import json_format, struct_pb2

T = TypeVar("T")

SERVICE_NAME = scoring_pb2.DESCRIPTOR.services_by_name["ScoringService"].full_name

#: ListMetrics page sizes (the contract's default and most).
DEFAULT_PAGE_SIZE: Final = 100
MAX_PAGE_SIZE: Final = 1000
_TOKEN_PREFIX: Final = "metrics-offset:"


def page_token(offset: int) -> str:
    """The opaque token of a page starting at ``offset`` (base64url, no padding)."""
    return base64.urlsafe_b64encode(f"{_TOKEN_PREFIX}{offset}".encode()).decode().rstrip("=")


def page_offset(token: str, total: int) -> int:
    """The offset a token stands for; anything that is not one of ours is refused."""
    if not token:
        return 0
    try:
        text = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode("ascii")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        text = ""
    digits = text.removeprefix(_TOKEN_PREFIX)
    if not text.startswith(_TOKEN_PREFIX) or not digits.isdigit() or int(digits) > total:
        raise InvalidArgument("page_token", "not a token returned by ListMetrics")
    return int(digits)


class ScoringServicer(scoring_pb2_grpc.ScoringServiceServicer):
    """``pieces``: worker processes that run the metrics (infra/serving/workprocs.py: an IRT
    chain holds the interpreter lock for seconds, which every other tenant's calls in this
    process would wait on); None: in this process."""

    def __init__(self, pieces: PieceProcesses | None = None) -> None:
        self._pieces = pieces

    def _run(self, context: Any, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args, should_stop=...)`` in the tenant's share of the CPU, in a worker process
        when there are any (there the caller's deadline or cancellation kills the worker)."""
        stop = caller_stop(context.is_active, context.time_remaining)
        pieces = self._pieces
        if pieces is None:
            return in_work_slot(context, lambda: fn(*args, should_stop=stop))
        return in_work_slot(context, lambda: pieces.call(fn, *args, should_stop=stop))

    def ScoreEvaluation(self, request_iterator: Iterable[scoring_pb2.ScoreEvaluationRequest],
                        context: Any) -> scoring_pb2.ScoreEvaluationResponse:
        setup, settings = read_evaluation(request_iterator)
        # bootstrap intervals and IRT
        return response_from_scores(self._run(context, score_evaluation, setup, settings))

    def ListMetrics(self, request: Any, context: Any) -> scoring_pb2.ListMetricsResponse:
        if request.page_size < 0:
            raise InvalidArgument("page_size", "must be >= 0")
        size = min(request.page_size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
        entries = list_metrics()
        start = page_offset(request.page_token, len(entries))
        end = min(start + size, len(entries))
        return scoring_pb2.ListMetricsResponse(
            metrics=[scoring_pb2.MetricInfo(
                id=m["id"], refs=m["refs"], description=m["description"],
                inputs=[scoring_pb2.MetricInput(
                    name=i["name"], description=i["description"], required=i["required"],
                    kind=scoring_pb2.INPUT_KIND_ARRAY if i["kind"] == "array"
                    else scoring_pb2.INPUT_KIND_PARAM) for i in m["inputs"]])
                for m in entries[start:end]],
            next_page_token=page_token(end) if end < len(entries) else "")

    def Compute(self, request: Any, context: Any) -> scoring_pb2.ComputeResponse:
        check_array_elements((name, tuple(t.shape)) for name, t in request.arrays.items())
        arrays = {name: tensor_to_array(t, f"arrays.{name}") for name, t in request.arrays.items()}
        params = json_format.MessageToDict(request.params) if request.HasField("params") else {}
        # a metric can be seconds of CPU
        result = self._run(context, compute, request.metric, arrays, params)
        s = struct_pb2.Struct()
        json_format.ParseDict(result, s)
        return scoring_pb2.ComputeResponse(result=s)
