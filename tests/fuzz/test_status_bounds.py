"""The one conversion of errors to statuses bounds every error: a status message is at most
1 KB, the whole google.rpc.Status at most 3 KB (so the trailers never pass gRPC's 8 KiB soft /
16 KiB hard metadata limit, which turned 32 long field violations into RESOURCE_EXHAUSTED
"Stream removed"), and a long quoted value or resource name is cut to 100 characters instead
of being echoed. Checked through ``to_status`` and over a real loopback gRPC call, since the
metadata limit only shows on the wire."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
from fortis.client.errors import (
    MAX_MESSAGE_BYTES,
    MAX_STATUS_BYTES,
    FieldViolation,
    InvalidArgument,
    NotFound,
    from_rpc_error,
    to_status,
)
from grpc_status import rpc_status


def _violations(n: int, chars: int, ch: str = "f") -> InvalidArgument:
    return InvalidArgument.from_violations(
        [FieldViolation(ch * chars + str(i), ch * chars) for i in range(n)])


@pytest.mark.parametrize("exc", [
    _violations(32, 256), _violations(32, 256, "\u00e9"), _violations(200, 50),
    InvalidArgument("x", "y" * 1_000_000), NotFound("evaluation", "z" * 1_000_000),
])
def test_to_status_bounds_message_and_status(exc: Exception) -> None:
    st = to_status(exc)
    assert len(st.message.encode()) <= MAX_MESSAGE_BYTES
    assert st.ByteSize() <= MAX_STATUS_BYTES
    assert st.details            # the BadRequest/ResourceInfo survives, with fewer entries


def test_long_quoted_values_and_names_are_cut_not_echoed() -> None:
    huge = "q" * 50_000
    for exc in (InvalidArgument("corruptions[0].id", f"unknown corruption '{huge}'; see X"),
                NotFound("session", huge)):
        st = to_status(exc)
        assert "q" * 101 not in st.message and "q" * 99 in st.message
    # a short quoted name next to a long unquoted tail is left as it is
    text = "target 'stub' failed: " + "w" * 300
    assert to_status(InvalidArgument("t", text)).message.startswith("t: target 'stub' failed: ww")


@pytest.fixture()
def aborting() -> Iterator[tuple[grpc.Channel, dict[str, Exception]]]:
    box: dict[str, Exception] = {}

    def handler(request: bytes, context: grpc.ServicerContext) -> bytes:
        context.abort_with_status(rpc_status.to_status(to_status(box["exc"])))
        return b""

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("t.S", {
        "M": grpc.unary_unary_rpc_method_handler(handler, lambda b: b, lambda b: b)})])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    ch = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield ch, box
    ch.close()
    server.stop(0)


def test_many_long_violations_arrive_as_invalid_argument_over_grpc(aborting) -> None:
    ch, box = aborting
    call = ch.unary_unary("/t.S/M", lambda b: b, lambda b: b)
    for exc in (_violations(32, 256), _violations(32, 256, "\u00e9"), _violations(200, 50)):
        box["exc"] = exc
        for _ in range(5):          # the soft limit refuses at random: try several times
            with pytest.raises(grpc.RpcError) as ei:
                call(b"", timeout=10)
            assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT, ei.value.details()
            back = from_rpc_error(ei.value)
            assert isinstance(back, InvalidArgument) and back.violations[0].field.startswith(
                exc.violations[0].field[:50])
