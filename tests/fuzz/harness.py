"""Send one fuzzed request over real loopback gRPC and judge the answer.

The rules every answer must keep, whatever the request:

- the status is never INTERNAL or UNKNOWN (INTERNAL is for bugs only);
- a non-OK status from Fortis carries its ErrorInfo (domain ``fortis``); a status without it
  came from the transport (e.g. "Stream removed" when trailers overflowed) and is only allowed
  for gRPC's own message-size and metadata-size limits (RESOURCE_EXHAUSTED "larger than max",
  "metadata size exceeds") and the harness's deadline; health and reflection, gRPC's own
  services, answer with gRPC's statuses;
- no message quotes a piece (24 characters) of a credential the call carried (API key,
  bearer token);
- the message is at most 1 KB (UTF-8) and echoes no more than a short piece (< 128
  characters) of any long string of the request;
- every INVALID_ARGUMENT has a ``google.rpc.BadRequest`` naming at least one field;
- per-item errors of streaming answers (``error`` fields) follow the same rules.

Used by ``tests/fuzz/test_fuzz_rpcs.py`` and ``bench/fuzz.py``. No mocks: ``channel`` is a real
``grpc.Channel`` to a real server.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf.message import Message
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status

from tests.fuzz.strategies import RpcCase

#: Longest status message, UTF-8 bytes (fortis.client.errors.MAX_MESSAGE_BYTES).
MAX_MESSAGE_BYTES = 1024
#: Longest piece of a request string a message may repeat.
MAX_ECHO = 128
_LONG = 160             # request strings at least this long are checked for echoes
_WINDOW, _STEP = MAX_ECHO - 32, 32
_FORBIDDEN = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}
#: Metadata that carries credentials, and the shortest piece of one a message may not quote.
_CREDENTIALS = ("authorization", "x-api-key")
_SECRET_PIECE = 24


@dataclass
class Outcome:
    """What one call answered: the final code, message, Fortis status (when the trailers
    carried one), per-item statuses of a stream, seconds, and any rule it broke."""

    code: grpc.StatusCode
    message: str = ""
    status: status_pb2.Status | None = None
    items: list[status_pb2.Status] = field(default_factory=list)
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)


def _strings(msg: Message, out: list[str], depth: int = 0) -> None:
    """Every string value in ``msg`` at least ``_LONG`` characters long (plan texts, ids)."""
    if depth > 200:
        return
    for fd, value in msg.ListFields():
        values = value if fd.label == fd.LABEL_REPEATED else [value]
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            values = [*value.keys(), *value.values()] if hasattr(value, "keys") else values
        for v in values:
            if isinstance(v, str):
                if len(v) >= _LONG:
                    out.append(v)
            elif isinstance(v, Message):
                _strings(v, out, depth + 1)


def long_strings(requests: Sequence[Message]) -> list[str]:
    out: list[str] = []
    for r in requests:
        _strings(r, out)
    return out


def echo_of(message: str, inputs: Iterable[str]) -> int:
    """Roughly the longest piece of any input the message repeats (0, or >= MAX_ECHO when a
    window of ``_WINDOW`` characters at a ``_STEP`` stride was found)."""
    if len(message) < _WINDOW:
        return 0
    windows = [message[i:i + _WINDOW] for i in range(0, len(message) - _WINDOW + 1, _STEP)]
    for s in inputs:
        hits = [w for w in windows if w in s]
        if len(hits) >= 2:
            return _WINDOW + _STEP * (len(hits) - 1)
    return 0


def judge_status(code: int, message: str, details: Sequence[Any], inputs: Sequence[str],
                 where: str) -> list[str]:
    """Problems of one (whole-call or per-item) status: code, size, echo, BadRequest."""
    problems = []
    name = code_pb2.Code.Name(code) if code in code_pb2.Code.values() else str(code)
    if code in (code_pb2.INTERNAL, code_pb2.UNKNOWN):
        problems.append(f"{where}: {name}: {message[:200]!r}")
    if len(message.encode("utf-8")) > MAX_MESSAGE_BYTES:
        problems.append(f"{where}: message of {len(message.encode())} bytes")
    echoed = echo_of(message, inputs)
    if echoed:
        problems.append(f"{where}: message echoes >= {echoed} characters of the input")
    if code == code_pb2.RESOURCE_EXHAUSTED and details:
        # Fortis's own refusals (budgets, quotas, decoded sizes) name what was limited.
        subjects = [v.subject for d in details if d.Is(error_details_pb2.QuotaFailure.DESCRIPTOR)
                    for v in _unpack_quota_failure(d).violations]
        if not subjects or not all(subjects):
            problems.append(f"{where}: RESOURCE_EXHAUSTED without a QuotaFailure subject: "
                            f"{message[:200]!r}")
    if code == code_pb2.INVALID_ARGUMENT:
        fields = [v.field for d in details if d.Is(error_details_pb2.BadRequest.DESCRIPTOR)
                  for v in _unpack_bad_request(d).field_violations]
        if not fields or not all(fields):
            problems.append(f"{where}: INVALID_ARGUMENT without a BadRequest field: "
                            f"{message[:200]!r}")
    return problems


def _unpack_quota_failure(a: Any) -> error_details_pb2.QuotaFailure:
    m = error_details_pb2.QuotaFailure()
    a.Unpack(m)
    return m


def _unpack_bad_request(a: Any) -> error_details_pb2.BadRequest:
    m = error_details_pb2.BadRequest()
    a.Unpack(m)
    return m


def _has_error_info(status: status_pb2.Status) -> bool:
    for a in status.details:
        if a.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            a.Unpack(info)
            if info.domain == "fortis":
                return True
    return False


def call(channel: grpc.Channel, case: RpcCase, request: Any, *,
         metadata: Sequence[tuple[str, str]] = (), timeout: float = 30.0,
         max_stream_items: int | None = None) -> Outcome:
    """Make the call ``case`` describes with ``request`` (a list for client-streaming
    methods) and judge what comes back."""
    requests = list(request) if case.streaming[0] == "s" else [request]
    ser = type(requests[0]).SerializeToString if requests else (lambda m: m.SerializeToString())
    des = case.response.FromString  # type: ignore[attr-defined]
    inputs = long_strings(requests) + [v for _, v in metadata if len(v) >= _LONG]
    secrets = [v for k, v in metadata if k in _CREDENTIALS and len(v) >= _SECRET_PIECE]
    items: list[status_pb2.Status] = []
    max_stream_items = max_stream_items or case.max_items
    t0 = time.perf_counter()
    try:
        if case.streaming == "uu":
            channel.unary_unary(case.path, ser, des)(request, timeout=timeout, metadata=metadata)
        elif case.streaming == "us":
            stream = channel.unary_stream(case.path, ser, des)(request, timeout=timeout,
                                                               metadata=metadata)
            _drain(stream, items, max_stream_items)
        elif case.streaming == "su":
            channel.stream_unary(case.path, ser, des)(iter(requests), timeout=timeout,
                                                      metadata=metadata)
        else:
            stream = channel.stream_stream(case.path, ser, des)(iter(requests), timeout=timeout,
                                                                metadata=metadata)
            _drain(stream, items, max_stream_items)
        out = Outcome(code=grpc.StatusCode.OK)
        if case.path.endswith("/CreateEvaluation"):
            _cancel_created(channel, case, metadata)
    except grpc.RpcError as exc:
        out = _failed(exc)
    out.seconds = time.perf_counter() - t0
    out.items = items
    _judge(out, inputs, case.fortis_errors)
    out.problems += quoted_secrets(out, secrets)
    return out


def quoted_secrets(out: Outcome, secrets: Sequence[str]) -> list[str]:
    """A credential (API key, bearer token) is never quoted, not even a piece of it: no
    ``_SECRET_PIECE`` characters of one may appear in any message of the answer."""
    messages = [out.message, *(i.message for i in out.items)]
    found = []
    for secret in secrets:
        for value in (secret, secret.partition(" ")[2]):
            pieces = {value[i:i + _SECRET_PIECE]
                      for i in range(0, max(1, len(value) - _SECRET_PIECE + 1), 8)}
            if any(p and p in m for m in messages for p in pieces if len(p) == _SECRET_PIECE):
                found.append(f"a message quotes part of the credential '{value[:12]}...'")
                break
    return found


def _cancel_created(channel: grpc.Channel, case: RpcCase, metadata: Sequence[tuple[str, str]]
                    ) -> None:
    """A fuzzed plan that was valid started an evaluation: cancel every running one (the
    machine is small), keeping the fuzz about answers, not about running evaluations."""
    from fortis.evaluation.v1 import evaluation_pb2 as ev
    service = case.path.rsplit("/", 1)[0]
    listing = channel.unary_unary(f"{service}/ListEvaluations",
                                  ev.ListEvaluationsRequest.SerializeToString,
                                  ev.ListEvaluationsResponse.FromString)
    cancel = channel.unary_unary(f"{service}/CancelEvaluation",
                                 ev.CancelEvaluationRequest.SerializeToString,
                                 ev.CancelEvaluationResponse.FromString)
    for e in listing(ev.ListEvaluationsRequest(page_size=1000), metadata=metadata,
                     timeout=30).evaluations:
        if e.state in (ev.EVALUATION_STATE_PENDING, ev.EVALUATION_STATE_RUNNING):
            cancel(ev.CancelEvaluationRequest(evaluation_id=e.evaluation_id),
                   metadata=metadata, timeout=30)


def _drain(stream: Iterator[Any], items: list[status_pb2.Status], limit: int) -> None:
    for i, resp in enumerate(stream):
        if resp.HasField("error") if "error" in type(resp).DESCRIPTOR.fields_by_name else False:
            items.append(resp.error)
        if i + 1 >= limit:          # an answer stream that goes on (WatchEvaluation): enough
            stream.cancel()         # type: ignore[attr-defined]
            return


def _failed(exc: grpc.RpcError) -> Outcome:
    code = exc.code()               # type: ignore[attr-defined]
    message = exc.details() or ""   # type: ignore[attr-defined]
    status = None
    try:
        status = rpc_status.from_call(exc)  # type: ignore[arg-type]
    except ValueError:
        status = None
    return Outcome(code=code, message=message, status=status)


def _judge(out: Outcome, inputs: Sequence[str], fortis_errors: bool = True) -> None:
    code = out.code
    if code != grpc.StatusCode.OK and code != grpc.StatusCode.CANCELLED:
        details = out.status.details if out.status is not None else []
        out.problems += judge_status(code.value[0], out.message, details, inputs, "status")
        transport = fortis_errors and (out.status is None or not _has_error_info(out.status))
        # gRPC's own limits refuse before Fortis sees the call: the message size, and the
        # metadata size (a 16 KB bearer token: soft limit 8 KiB, hard 16 KiB)
        allowed = (code == grpc.StatusCode.RESOURCE_EXHAUSTED and (
            "larger than max" in out.message or "metadata size exceeds" in out.message)
                   ) or code == grpc.StatusCode.DEADLINE_EXCEEDED
        if transport and not allowed and code not in _FORBIDDEN:
            out.problems.append(f"status: {code.name} from the transport, not Fortis: "
                                f"{out.message[:200]!r}")
    for i, item in enumerate(out.items):
        out.problems += judge_status(item.code, item.message, item.details, inputs,
                                     f"items[{i}].error")


def healthy(channel: grpc.Channel, timeout: float = 10.0) -> bool:
    """The server answers health checks with SERVING."""
    try:
        resp = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(),
                                                        timeout=timeout)
    except grpc.RpcError:
        return False
    return bool(resp.status == health_pb2.HealthCheckResponse.SERVING)
