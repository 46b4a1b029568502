"""White-box access is granted, never implied: a surrogate that shares a target's weights
(``fmnist-cnn`` is both) is an oracle outside the proxy (no session, budget or ledger row), so
a tenant uses it only with the operator's grant for every target it shares weights with.

The attack reproduced: ``RunAttack(fgsm, surrogate: fmnist-cnn, epsilon: 0)`` trying labels
0-9 per image read the target's top-1 label from ``initially_correct``. Spoken here with the
generated stubs alone (no SDK), then the grant's other faces: ApplyPerturbation's gradients,
ValidateAttack, ValidatePlan / CreateEvaluation naming the plan's field, the audit line, a
partial grant, a surrogate that is no twin, and an operator surrogate declared ``twin_of``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
from fortis.common.v1 import common_pb2 as common
from fortis.evaluation.v1 import evaluation_pb2 as ev_pb
from fortis.evaluation.v1 import evaluation_pb2_grpc as ev_grpc
from fortis.perturbation.v1 import perturbation_pb2 as pt_pb
from fortis.perturbation.v1 import perturbation_pb2_grpc as pt_grpc
from fortis.server.app.stack import StackSettings, TargetConfig, start_stack
from google.protobuf import struct_pb2
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from tests.conftest import API_KEY, MD, OTHER_KEY, OTHER_MD

pytestmark = pytest.mark.usefixtures("one_thread")

TARGETS = ("fmnist-cnn=builtin:fmnist-cnn",
           "fmnist-cnn-label=builtin:fmnist-cnn?output=label_only")
PLAN = """
name: whitebox
seed: 3
target: {name: fmnist-cnn, task: classification}
dataset: {source: fashion-mnist, split: test, limit: 4}
attacks:
  - {id: fgsm, params: {epsilon: 0.05}, surrogate: SURROGATE}
"""


@pytest.fixture(scope="module")
def world(tmp_path_factory, fmnist_target, fmnist_surrogate) -> Iterator[Any]:
    """Tenant A holds the grant for both views of fmnist-cnn; tenant B for one of them only
    (a partial grant: the other view shares the same weights)."""
    s = start_stack(StackSettings(
        state_dir=tmp_path_factory.mktemp("wb") / "state",
        api_keys={API_KEY: "tenant-a", OTHER_KEY: "tenant-b", "test-key-tenant-c": "tenant-c"},
        targets=[TargetConfig.parse(t) for t in TARGETS],
        whitebox_grants={"tenant-a": frozenset({"fmnist-cnn", "fmnist-cnn-label"}),
                         "tenant-b": frozenset({"fmnist-cnn"})}))
    ch = grpc.insecure_channel(s.address)
    yield s, pt_grpc.PerturbationServiceStub(ch), ev_grpc.EvaluationServiceStub(ch)
    ch.close()
    s.stop(0)


MD_C = (("x-api-key", "test-key-tenant-c"),)




def _image(image_id: str, pixels: np.ndarray) -> Any:
    return common.Image(image_id=image_id, tensor=common.Tensor(
        dtype=common.D_TYPE_UINT8, shape=list(pixels.shape), data=pixels.tobytes()))


def _refused_field(exc: grpc.RpcError) -> str:
    """The PERMISSION_DENIED status's field (google.rpc.BadRequest), from the status alone."""
    assert exc.code() == grpc.StatusCode.PERMISSION_DENIED, exc.details()
    status = rpc_status.from_call(exc)
    assert status is not None
    for d in status.details:
        if d.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            br = error_details_pb2.BadRequest()
            d.Unpack(br)
            return br.field_violations[0].field
    raise AssertionError("no BadRequest detail")


def _label_oracle(pt: Any, md: Any, images: np.ndarray, surrogate: str = "fmnist-cnn"
                  ) -> list[list[bool | None]]:
    """The finding's attack: fgsm at epsilon 0 on the target's twin, every label tried;
    per image, initially_correct for labels 0..9 (None: absent)."""
    params = struct_pb2.Struct()
    params.update({"epsilon": 0.0})
    out = []
    for n, img in enumerate(images):
        row: list[bool | None] = []
        for label in range(10):
            resp = list(pt.RunAttack(pt_pb.RunAttackRequest(
                attack_id="fgsm", params=params, seed=1, surrogate=surrogate,
                images=[pt_pb.LabeledImage(image=_image(f"i{n}", img), labels=[label])]),
                metadata=md, timeout=60))
            row.append(resp[0].initially_correct if resp[0].HasField("initially_correct")
                       else None)
        out.append(row)
    return out


def test_protos_alone_label_trick_refused_without_grant(world, fmnist_test_images):
    """No grant (tenant C) or a partial one (tenant B): every try is PERMISSION_DENIED on
    ``surrogate``; nothing per image comes back."""
    _, pt, _ = world
    images, _ = fmnist_test_images
    for md in (MD_C, OTHER_MD):
        with pytest.raises(grpc.RpcError) as info:
            _label_oracle(pt, md, images[:2])
        assert _refused_field(info.value) == "surrogate"
        assert "fmnist-cnn-label" not in info.value.details()     # no target names leak


def test_with_grant_the_twin_answers_and_is_audited(world, fmnist_test_images, fmnist_target,
                                                    captured):
    """Tenant A holds the grant for every target sharing the weights: the twin answers (the
    operator allowed exactly this), and each use is an audit line naming tenant and targets."""
    _, pt, _ = world
    images, _ = fmnist_test_images
    rows = _label_oracle(pt, MD, images[:2])
    assert all(sum(bool(x) for x in row) == 1 for row in rows)
    used = [ln for ln in captured if ln.get("event") == "whitebox_surrogate_used"]
    assert len(used) == 20 and used[0]["audit"] is True
    assert used[0]["tenant"] == "tenant-a" and set(used[0]["targets"]) == {
        "fmnist-cnn", "fmnist-cnn-label"} and used[0]["rpc"] == "RunAttack"


def test_apply_perturbation_gradients_and_validate_attack(world, fmnist_test_images):
    _, pt, _ = world
    images, labels = fmnist_test_images
    req = pt_pb.ApplyPerturbationRequest(perturbation_id="model_gradient_descent", severity=1,
                                         seed=1, surrogate="fmnist-cnn",
                                         labels=[int(labels[0])],
                                         images=[_image("g", images[0])])
    with pytest.raises(grpc.RpcError) as info:
        pt.ApplyPerturbation(req, metadata=MD_C, timeout=60)
    assert _refused_field(info.value) == "surrogate"
    assert len(pt.ApplyPerturbation(req, metadata=MD, timeout=60).images) == 1
    va = pt_pb.ValidateAttackRequest(attack_id="fgsm", surrogate="fmnist-surrogate",
                                     ensemble=["fmnist-cnn"])
    va.params.update({"epsilon": 0.1})
    with pytest.raises(grpc.RpcError) as info:
        pt.ValidateAttack(va, metadata=OTHER_MD, timeout=30)
    assert _refused_field(info.value) == "ensemble[0]"
    pt.ValidateAttack(va, metadata=MD, timeout=30)


def test_a_surrogate_that_is_no_twin_needs_no_grant(world, fmnist_test_images):
    """fmnist-surrogate is a model of its own (and fmnist-mlp is no target of this server)."""
    _, pt, _ = world
    images, labels = fmnist_test_images
    params = struct_pb2.Struct()
    params.update({"epsilon": 0.05})
    for sur in ("fmnist-surrogate", "fmnist-mlp"):
        resp = list(pt.RunAttack(pt_pb.RunAttackRequest(
            attack_id="fgsm", params=params, seed=1, surrogate=sur,
            images=[pt_pb.LabeledImage(image=_image("n", images[0]),
                                       labels=[int(labels[0])])]),
            metadata=MD_C, timeout=60))
        assert len(resp) == 1


def test_validate_plan_and_create_evaluation_name_the_plan_field(world):
    _, _, ev = world
    plan = PLAN.replace("SURROGATE", "fmnist-cnn")
    for call in (lambda md: ev.ValidatePlan(ev_pb.ValidatePlanRequest(plan=plan), metadata=md,
                                            timeout=60),
                 lambda md: ev.CreateEvaluation(ev_pb.CreateEvaluationRequest(
                     plan=plan, evaluation_id="wb-1"), metadata=md, timeout=60)):
        with pytest.raises(grpc.RpcError) as info:
            call(MD_C)
        assert _refused_field(info.value) == "attacks[0].surrogate"
    ev.ValidatePlan(ev_pb.ValidatePlanRequest(plan=plan), metadata=MD, timeout=60)
    ev.ValidatePlan(ev_pb.ValidatePlanRequest(plan=PLAN.replace("SURROGATE",
                                                                "fmnist-surrogate")),
                    metadata=MD_C, timeout=60)


def test_operator_surrogate_declared_twin(tmp_path):
    """An operator manifest's ``twin_of`` makes it a twin; a garbled ``twin_of`` counts as a
    twin of every target (a typo never opens weights)."""
    from fortis.adapters.torch_models.surrogate import OperatorSurrogates
    from fortis.services.common.errors import PermissionDenied
    from fortis.services.common.whitebox import WhiteboxPolicy

    base = {"model": "m.pt", "input": {"height": 28, "width": 28, "channels": 1},
            "labels": [str(i) for i in range(10)]}
    (tmp_path / "twin.json").write_text(json.dumps({**base, "twin_of": ["prod"]}))
    (tmp_path / "odd.json").write_text(json.dumps({**base, "twin_of": 5}))
    (tmp_path / "own.json").write_text(json.dumps(base))
    ops = OperatorSurrogates(tmp_path)
    policy = WhiteboxPolicy(grants={"a": frozenset({"prod"})}, builtin_models=("fmnist-cnn",),
                            builtin_targets={"fmnist-cnn": ["fmnist-cnn"]},
                            declared_twins=ops.twin_of)
    assert policy.check("a", "twin", "surrogate") == ("prod",)
    assert policy.check("b", "own", "surrogate") == ()
    for tenant, name in (("b", "twin"), ("a", "odd"), ("a", "fmnist-cnn")):
        with pytest.raises(PermissionDenied) as info:
            policy.check(tenant, name, "attacks[2].surrogate")
        assert info.value.field == "attacks[2].surrogate"
    # a perturbation service alone, without target configuration: built-ins fail closed
    alone = WhiteboxPolicy(builtin_models=("fmnist-cnn",), builtin_targets=None)
    with pytest.raises(PermissionDenied):
        alone.check("a", "fmnist-cnn", "surrogate")
    # twin_of is no field of the model's definition: the manifest still reads
    (tmp_path / "m.pt").write_bytes(b"PK")
    assert ops.spec("twin")[0].name == "twin"


def test_perturbation_service_apart_asks_the_proxy(tmp_path, fmnist_test_images, fmnist_target,
                                                   fmnist_surrogate):
    """The perturbation service run alone (its pods apart from the proxy's) has no target
    configuration: it asks the proxy, with the internal key, which targets serve each built-in
    model (``GetBuiltinTargets``). A twin still needs the grant; a surrogate no target serves
    (the demo's ``fmnist-surrogate``) needs none; a proxy that cannot be asked refuses the
    twin with UNAVAILABLE rather than letting it through."""
    keys = {API_KEY: "tenant-a", OTHER_KEY: "tenant-b"}
    proxy = start_stack(StackSettings(
        state_dir=tmp_path / "proxy", api_keys=keys, only="proxy", internal_key="ik-apart",
        targets=[TargetConfig.parse(t) for t in TARGETS]))
    pert = start_stack(StackSettings(
        state_dir=tmp_path / "pert", api_keys=keys, only="perturbation", internal_key="ik-apart",
        proxy_address=proxy.address,
        whitebox_grants={"tenant-a": frozenset({"fmnist-cnn", "fmnist-cnn-label"})}))
    ch = grpc.insecure_channel(pert.address)
    pt = pt_grpc.PerturbationServiceStub(ch)
    images, _ = fmnist_test_images
    try:
        with pytest.raises(grpc.RpcError) as info:
            _label_oracle(pt, OTHER_MD, images[:1])
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert _refused_field(info.value) == "surrogate"
        assert all(v is not None for v in _label_oracle(pt, MD, images[:1])[0])
        assert all(v is not None for v in _label_oracle(pt, OTHER_MD, images[:1],
                                                         surrogate="fmnist-surrogate")[0])
        proxy.stop(0)
        time.sleep(0.5)
        # a fresh perturbation service (nothing cached) with the proxy gone
        pert2 = start_stack(StackSettings(
            state_dir=tmp_path / "pert2", api_keys=keys, only="perturbation",
            internal_key="ik-apart", proxy_address=proxy.address))
        try:
            pt2 = pt_grpc.PerturbationServiceStub(grpc.insecure_channel(pert2.address))
            with pytest.raises(grpc.RpcError) as info:
                _label_oracle(pt2, OTHER_MD, images[:1])
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE, info.value
            assert proxy.address not in info.value.details()
        finally:
            pert2.stop(0)
    finally:
        ch.close()
        pert.stop(0)
        proxy.stop(0)


def test_apart_without_authentication(tmp_path, fmnist_test_images, fmnist_target):
    """With authentication off (the single-user mode, every caller the one user holding every
    grant) the perturbation service apart from the proxy still learns the twins and serves."""
    proxy = start_stack(StackSettings(state_dir=tmp_path / "proxy", only="proxy",
                                      targets=[TargetConfig.parse(t) for t in TARGETS]))
    pert = start_stack(StackSettings(state_dir=tmp_path / "pert", only="perturbation",
                                     proxy_address=proxy.address,
                                     whitebox_grants={"default": frozenset({"*"})}))
    ch = grpc.insecure_channel(pert.address)
    try:
        images, _ = fmnist_test_images
        row = _label_oracle(pt_grpc.PerturbationServiceStub(ch), (), images[:1])[0]
        assert all(v is not None for v in row)
    finally:
        ch.close()
        pert.stop(0)
        proxy.stop(0)
