"""A plan names every attack problem before it runs (ValidateAttack): rules between parameters
that a per-parameter schema cannot say (an L-inf epsilon <= 1 where epsilon also bounds L2,
an odd TI kernel), a query attack's prior surrogate, a score-based attack on a labels-only
target. Each is refused at ValidatePlan / CreateEvaluation as INVALID_ARGUMENT naming the
plan field; the RPC itself answers a client written from the protos alone the same way."""

from __future__ import annotations

import grpc
import pytest
from fortis.client import FortisClient
from fortis.client.errors import InvalidArgument
from fortis.common.v1 import common_pb2
from fortis.perturbation.v1 import perturbation_pb2 as pb
from fortis.perturbation.v1 import perturbation_pb2_grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from tests.conftest import API_KEY, MD

PLAN = """
name: refused
seed: 1
target: {name: TARGET, task: classification}
dataset: {source: fashion-mnist, split: test, limit: 4}
attacks:
  - ATTACK
"""


@pytest.mark.parametrize(("target", "attack", "field"), [
    ("fmnist-cnn", "{id: pgd, surrogate: fmnist-surrogate, params: {epsilon: 5.0}}",
     "attacks[0].params.epsilon"),
    ("fmnist-cnn", "{id: fab, surrogate: fmnist-surrogate, params: {epsilon: 2.0}}",
     "attacks[0].params.epsilon"),
    ("fmnist-cnn", "{id: mi_fgsm, surrogate: fmnist-surrogate, params: {epsilon: 0.1, "
                   "ti_kernel: 4}}", "attacks[0].params.ti_kernel"),
    ("fmnist-cnn", "{id: prgf, params: {epsilon: 2.0}}", "attacks[0].surrogate"),
    ("fmnist-cnn-label", "{id: square, params: {epsilon: 0.1}}", "attacks[0].id"),
])
def test_attack_problems_are_named_before_anything_runs(stack, target, attack, field):
    plan = PLAN.replace("TARGET", target).replace("ATTACK", attack)
    with FortisClient(stack.address, api_key=API_KEY) as fc:
        for call in (fc.validate, fc.submit):
            with pytest.raises(InvalidArgument) as e:
                call(plan)
            assert field in [v.field for v in e.value.violations], e.value
        assert fc.list() == []           # nothing was created
    # the same plan with the L2 norm (PGD) is accepted
    if "pgd" in attack:
        with FortisClient(stack.address, api_key=API_KEY) as fc:
            fc.validate(plan.replace("epsilon: 5.0", "epsilon: 5.0, norm: l2"))


def test_validate_attack_from_a_client_written_from_the_protos(channel):
    stub = perturbation_pb2_grpc.PerturbationServiceStub(channel)
    ok = pb.ValidateAttackRequest(attack_id="pgd", task=common_pb2.TASK_TYPE_CLASSIFICATION)
    ok.params.update({"epsilon": 0.1})
    resp = stub.ValidateAttack(ok, metadata=MD)
    assert resp.params["steps"] == 10 and resp.params["norm"] == "linf"   # defaults filled
    bad = pb.ValidateAttackRequest(attack_id="square",
                                   output_kind=common_pb2.OUTPUT_KIND_LABEL_ONLY)
    bad.params.update({"epsilon": 0.1})
    with pytest.raises(grpc.RpcError) as e:
        stub.ValidateAttack(bad, metadata=MD)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    status = rpc_status.from_call(e.value)
    fields = []
    for d in status.details:
        if d.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            br = error_details_pb2.BadRequest()
            d.Unpack(br)
            fields += [v.field for v in br.field_violations]
    assert fields == ["attack_id"]
    unknown = pb.ValidateAttackRequest(attack_id="no-such-attack")
    with pytest.raises(grpc.RpcError) as e:
        stub.ValidateAttack(unknown, metadata=MD)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
