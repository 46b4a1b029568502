"""Property-based fuzzing of every RPC that takes user data: the quick run in the test suite.

Hostile requests from ``tests/fuzz/strategies.py`` (hypothesis, derandomized: the same cases on
every run) go over real loopback gRPC to a real stack (all five services, two tenants, the
built-in Fashion-MNIST target) and to the built-in TargetService adapter on its own port.
Each answer must keep the rules of ``tests/fuzz/harness.py``: never INTERNAL or UNKNOWN, no
status made by the transport (e.g. trailers too large), message <= 1 KB echoing no more than a
short piece of the input, every INVALID_ARGUMENT with a BadRequest naming a field, per-item
stream errors alike. After each RPC's cases the server still answers health and a normal call.
``bench/fuzz.py`` runs the same generators for >= 10,000 cases.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from fortis.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.conftest import API_KEY, MD, OTHER_KEY
from tests.fuzz.harness import call, healthy
from tests.fuzz.strategies import (
    AUTH_RPC_NAMES,
    FUZZ_SESSION,
    FUZZ_TARGET,
    RPCS,
    SERVED_RPCS,
    TARGET_RPCS,
    auth_cases,
)

#: Cases per RPC in the quick run (bench/fuzz.py runs hundreds per RPC).
EXAMPLES = 50

_SETTINGS = settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
                     phases=[Phase.explicit, Phase.generate],
                     suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def fuzz_stack(tmp_path_factory: pytest.TempPathFactory, fmnist_target: Any,
               fmnist_surrogate: Any) -> Iterator[Any]:
    from fortis.server.app.stack import StackSettings, TargetConfig, start_stack
    s = start_stack(StackSettings(
        state_dir=tmp_path_factory.mktemp("fuzz") / "state",
        api_keys={API_KEY: "tenant-a", OTHER_KEY: "tenant-b"},
        targets=[TargetConfig.parse(f"{FUZZ_TARGET}=builtin:fmnist-cnn"),
                 TargetConfig.parse("fmnist-cnn-label=builtin:fmnist-cnn?output=label_only")],
        max_message_bytes=8 * 1024 * 1024))
    with grpc.insecure_channel(s.address) as ch:
        proxy_pb2_grpc.TargetProxyServiceStub(ch).CreateSession(
            proxy_pb2.CreateSessionRequest(target=FUZZ_TARGET, session_id=FUZZ_SESSION),
            metadata=MD)
    yield s
    s.stop(0)


@pytest.fixture(scope="module")
def fuzz_channel(fuzz_stack: Any) -> Iterator[grpc.Channel]:
    ch = grpc.insecure_channel(fuzz_stack.address, options=[
        ("grpc.max_send_message_length", 16 * 1024 * 1024)])
    yield ch
    ch.close()


@pytest.fixture(scope="module")
def target_channel(fmnist_target: Any) -> Iterator[grpc.Channel]:
    from fortis.server.app.stack import TargetConfig, start_target_server
    server = start_target_server(TargetConfig.parse("t=builtin:fmnist-cnn"),
                                 max_message_bytes=8 * 1024 * 1024)
    ch = grpc.insecure_channel(server.address)
    yield ch
    ch.close()
    server.stop(0)


def _normal_call(channel: grpc.Channel) -> None:
    stub = proxy_pb2_grpc.TargetProxyServiceStub(channel)
    names = [t.name for t in stub.ListTargets(proxy_pb2.ListTargetsRequest(), metadata=MD,
                                              timeout=30).targets]
    assert FUZZ_TARGET in names
    info = stub.GetTargetInfo(proxy_pb2.GetTargetInfoRequest(target=FUZZ_TARGET), metadata=MD,
                              timeout=30).info
    assert len(info.labels) == 10


def _fuzz(channel: grpc.Channel, case: Any, md: Any) -> list[str]:
    """Run the case's strategy; collect every rule broken (reported all at once, so a
    failure shows each kind of problem, not just the first example)."""
    broken: list[str] = []

    @_SETTINGS
    @given(st.data())
    def one(data: Any) -> None:
        request = data.draw(case.requests)
        meta = data.draw(case.metadata) if case.metadata is not None else md
        out = call(channel, case, request, metadata=meta, timeout=60.0)
        if out.problems:
            shown = [(k, v[:40]) for k, v in meta]
            broken.append(f"{out.code.name}: {out.problems[:2]} <- {str(request)[:200]!r} "
                          f"{shown}")

    one()
    return broken


@pytest.mark.parametrize("name", sorted(RPCS))
def test_fuzzed_requests_get_precise_bounded_errors(name: str, fuzz_channel: grpc.Channel
                                                   ) -> None:
    broken = _fuzz(fuzz_channel, RPCS[name], MD)
    assert not broken, "\n".join(broken[:8])
    assert healthy(fuzz_channel)
    _normal_call(fuzz_channel)


@pytest.mark.parametrize("name", sorted(TARGET_RPCS))
def test_fuzzed_requests_to_the_builtin_target_adapter(name: str, target_channel: grpc.Channel
                                                       ) -> None:
    from fortis.common.v1 import common_pb2
    from fortis.target.v1 import target_pb2, target_pb2_grpc

    broken = _fuzz(target_channel, TARGET_RPCS[name], ())
    assert not broken, "\n".join(broken[:8])
    assert healthy(target_channel)
    ok = target_pb2_grpc.TargetServiceStub(target_channel).Predict(target_pb2.PredictRequest(
        images=[common_pb2.Image(image_id="ok", tensor=common_pb2.Tensor(
            dtype=common_pb2.D_TYPE_UINT8, shape=[28, 28, 1], data=bytes(784)))]), timeout=30)
    assert [p.image_id for p in ok.predictions] == ["ok"]


@pytest.mark.parametrize("name", sorted(SERVED_RPCS))
def test_fuzzed_health_and_reflection(name: str, fuzz_channel: grpc.Channel) -> None:
    """gRPC's own services on every Fortis server: unknown and hostile service names and
    reflection symbols get gRPC's precise statuses, never INTERNAL."""
    broken = _fuzz(fuzz_channel, SERVED_RPCS[name], ())
    assert not broken, "\n".join(broken[:8])
    assert healthy(fuzz_channel)


@pytest.fixture(scope="module")
def oidc_fuzz(tmp_path_factory: pytest.TempPathFactory, fmnist_target: Any
              ) -> Iterator[tuple[grpc.Channel, dict[str, Any]]]:
    """A stack accepting tenant-a's API key and the bearer tokens of a real local identity
    provider (tests/fuzz/idp.py), and the credential-fuzzing cases made with its keys."""
    from fortis.infra.serving.identity import parse_issuer_spec
    from fortis.server.app.stack import StackSettings, TargetConfig, start_stack

    from tests.fuzz.idp import AUDIENCE, TENANT_CLAIM, FuzzIdp
    idp = FuzzIdp()
    s = start_stack(StackSettings(
        state_dir=tmp_path_factory.mktemp("fuzz-oidc") / "state", api_keys={API_KEY: "tenant-a"},
        oidc_issuers=[parse_issuer_spec(idp.issuer, audiences=[AUDIENCE], tenants=["tenant-a"],
                                        tenant_claim=TENANT_CLAIM)],
        targets=[TargetConfig.parse(f"{FUZZ_TARGET}=builtin:fmnist-cnn")]))
    ch = grpc.insecure_channel(s.address)
    yield ch, auth_cases(idp, API_KEY)
    ch.close()
    s.stop(0)
    idp.close()


@pytest.mark.parametrize("name", AUTH_RPC_NAMES)
def test_fuzzed_credentials(name: str, oidc_fuzz: tuple[grpc.Channel, dict[str, Any]]) -> None:
    """Bearer tokens (valid, expired, wrong audience or key, alg none, HS256 keyed with the
    public key, malformed JWTs, hostile claims signed by the issuer, garbage, 9-20 KB values),
    API keys and a forged x-fortis-tenant: UNAUTHENTICATED with a precise reason that quotes
    no piece of the credential, or the call answered for the token's tenant; never INTERNAL."""
    channel, cases = oidc_fuzz
    broken = _fuzz(channel, cases[name], ())
    assert not broken, "\n".join(broken[:8])
    assert healthy(channel)


def test_the_harness_catches_what_it_must(fuzz_channel: grpc.Channel) -> None:
    """The rules are not vacuous: a status a careless server could send breaks them."""
    from google.rpc import code_pb2

    from tests.fuzz.harness import judge_status
    huge = "A" * 5000
    assert judge_status(code_pb2.INTERNAL, "boom", [], [], "s")
    assert judge_status(code_pb2.NOT_FOUND, f"target '{huge[:900]}' not found", [], [huge], "s")
    assert judge_status(code_pb2.INVALID_ARGUMENT, "x" * 2000, [], [], "s")
    assert judge_status(code_pb2.INVALID_ARGUMENT, "no detail", [], [], "s")
    assert not judge_status(code_pb2.NOT_FOUND, f"target '{huge[:99]}…' not found", [], [huge],
                            "s")
    # a credential is never quoted, not even a piece of it
    from tests.fuzz.harness import Outcome, quoted_secrets
    token = "Bearer eyJhbGciOiJSUzI1NiJ9." + "c" * 40 + ".sig"
    assert quoted_secrets(Outcome(code=grpc.StatusCode.UNAUTHENTICATED,
                                  message=f"token {token[7:40]} refused"), [token])
    assert not quoted_secrets(Outcome(code=grpc.StatusCode.UNAUTHENTICATED,
                                      message="bearer token refused: expired (exp)"), [token])


def test_every_rpc_of_the_contracts_is_fuzzed() -> None:
    """A new RPC that takes user data fails here until it has a fuzz case."""
    import importlib

    modules = ("fortis.evaluation.v1.evaluation_pb2", "fortis.evaluation.v1.uploads_pb2",
               "fortis.perturbation.v1.perturbation_pb2", "fortis.proxy.v1.proxy_pb2",
               "fortis.scoring.v1.scoring_pb2", "fortis.report.v1.report_pb2",
               "fortis.target.v1.target_pb2")
    declared = {f"{svc.name}.{m.name}"
                for mod in modules
                for svc in importlib.import_module(mod).DESCRIPTOR.services_by_name.values()
                for m in svc.methods}
    fuzzed = set(RPCS) | {f"TargetService.{k.split('.', 1)[1]}" for k in TARGET_RPCS}
    assert declared - fuzzed == set()
