"""The whole perturbation catalogue over real gRPC on loopback (issue 3, item 5): listed once
with its characterisation (DEG-5) and level kind, applied to batches unary and streaming, for
every kind -- corruptions (IEEE-A1..A5), styles (IEEE-A6), incremental degradation operators
(DEG-1, incl. the white-box one on the real surrogate) and safety properties (PER-1) -- and bad
input answered with a status naming the field while the service keeps serving."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from fortis.perturbation.v1 import perturbation_pb2 as ppb
from fortis.perturbation.v1 import perturbation_pb2_grpc
from fortis.services.common.codec import decode_image, image_msg
from fortis.services.perturbation.registry import PERTURBATIONS
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from tests.conftest import MD


def _violations(exc: grpc.RpcError) -> list[str]:
    st = rpc_status.from_call(exc)
    assert st is not None
    for d in st.details:
        br = error_details_pb2.BadRequest()
        if d.Unpack(br):
            return [v.field for v in br.field_violations]
    raise AssertionError("no BadRequest detail")


@pytest.fixture()
def pt(channel):
    return perturbation_pb2_grpc.PerturbationServiceStub(channel)


def _batch(images: np.ndarray, n: int = 4) -> list:
    return [image_msg(f"img-{i}", images[i]) for i in range(n)]


def test_list_perturbations_has_every_entry_once_with_characterisation(pt):
    items = pt.ListPerturbations(ppb.ListPerturbationsRequest(), metadata=MD).perturbations
    ids = [p.id for p in items]
    assert len(ids) == len(set(ids))
    assert set(PERTURBATIONS) <= set(ids)
    kinds = {p.kind for p in items}
    assert {ppb.PERTURBATION_KIND_CORRUPTION, ppb.PERTURBATION_KIND_STYLE,
            ppb.PERTURBATION_KIND_DEGRADATION, ppb.PERTURBATION_KIND_PROPERTY,
            ppb.PERTURBATION_KIND_TRANSFER_ATTACK, ppb.PERTURBATION_KIND_SCORE_ATTACK,
            ppb.PERTURBATION_KIND_DECISION_ATTACK} <= kinds
    for p in items:
        if p.kind in (ppb.PERTURBATION_KIND_CORRUPTION, ppb.PERTURBATION_KIND_STYLE,
                      ppb.PERTURBATION_KIND_DEGRADATION, ppb.PERTURBATION_KIND_PROPERTY):
            assert p.characterisation.scope in ("global", "local"), p.id
            assert p.characterisation.randomness in ("deterministic", "stochastic"), p.id
            assert p.characterisation.domain in ("colour", "pixel"), p.id
            assert p.refs and p.level_kind != ppb.LEVEL_KIND_UNSPECIFIED, p.id
    deg = pt.ListPerturbations(ppb.ListPerturbationsRequest(kind=ppb.PERTURBATION_KIND_DEGRADATION),
                               metadata=MD).perturbations
    assert deg and all(list(p.levels) == list(range(1, 31)) for p in deg)
    assert all("DEG-1" in p.refs for p in deg)


def test_every_kind_applies_over_unary_and_stream(pt, fmnist_test_images):
    images, labels = fmnist_test_images
    batch = _batch(images)
    style = next(s for s in PERTURBATIONS.values() if s.kind == "style" and not s.params)
    deg = next(s for s in PERTURBATIONS.values() if s.kind == "degradation" and not s.needs_model)
    prop = next(s for s in PERTURBATIONS.values() if s.kind == "property")
    # unary: a style at severity 3
    out = pt.ApplyPerturbation(ppb.ApplyPerturbationRequest(
        perturbation_id=style.id, severity=3, seed=5, images=batch), metadata=MD).images
    assert [m.image_id for m in out] == [m.image_id for m in batch]
    arr = [decode_image(m, "x") for m in out]
    assert all(a.shape == images[0].shape and a.dtype == np.uint8 for a in arr)
    # streaming: degradation level 10 then property epsilon 0.5, then a bad request, then more
    reqs = [
        ppb.ApplyPerturbationStreamRequest(request_id="deg", perturbation_id=deg.id, severity=10,
                                           seed=5, images=batch),
        ppb.ApplyPerturbationStreamRequest(request_id="prop", perturbation_id=prop.id,
                                           epsilon=0.5, seed=5, images=batch),
        ppb.ApplyPerturbationStreamRequest(request_id="bad", perturbation_id=deg.id, severity=31,
                                           seed=5, images=batch),
        ppb.ApplyPerturbationStreamRequest(request_id="eps0", perturbation_id=prop.id,
                                           epsilon=0.0, seed=5, images=batch),
    ]
    got = {r.request_id: r for r in pt.ApplyPerturbationStream(iter(reqs), metadata=MD)}
    assert set(got) == {"deg", "prop", "bad", "eps0"}
    assert got["bad"].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "severity" in got["bad"].error.message
    for key in ("deg", "prop"):
        assert not got[key].HasField("error")
        assert any(not np.array_equal(decode_image(m, "x"), images[i])
                   for i, m in enumerate(got[key].images)), key
    # epsilon 0 is the original image (PER-3's search starts there)
    for i, m in enumerate(got["eps0"].images):
        assert np.array_equal(decode_image(m, "x"), images[i])
    # deterministic for a seed: the same request twice gives the same pixels
    again = pt.ApplyPerturbation(ppb.ApplyPerturbationRequest(
        perturbation_id=deg.id, severity=10, seed=5, images=batch), metadata=MD).images
    assert [m.encoded for m in again] == [m.encoded for m in got["deg"].images]


def test_white_box_degradation_uses_the_surrogate(pt, fmnist_test_images, fmnist_surrogate):
    """DEG-1 model gradient descent: white box on the named surrogate, with the true labels."""
    spec = next(s for s in PERTURBATIONS.values() if s.needs_model)
    images, labels = fmnist_test_images
    batch = _batch(images, 8)
    with pytest.raises(grpc.RpcError) as ei:
        pt.ApplyPerturbation(ppb.ApplyPerturbationRequest(
            perturbation_id=spec.id, severity=5, seed=1, images=batch), metadata=MD)
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "surrogate" in _violations(ei.value)
    with pytest.raises(grpc.RpcError) as ei:
        pt.ApplyPerturbation(ppb.ApplyPerturbationRequest(
            perturbation_id=spec.id, severity=5, seed=1, images=batch, surrogate="fmnist-surrogate",
            labels=[int(x) for x in labels[:3]]), metadata=MD)
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "labels" in _violations(ei.value)
    out = pt.ApplyPerturbation(ppb.ApplyPerturbationRequest(
        perturbation_id=spec.id, severity=30, seed=1, images=batch, surrogate="fmnist-surrogate",
        labels=[int(x) for x in labels[:8]]), metadata=MD).images
    adv = np.stack([decode_image(m, "x") for m in out])
    before = fmnist_surrogate.predict_proba(images[:8]).argmax(1)
    after = fmnist_surrogate.predict_proba(adv).argmax(1)
    right = before == labels[:8]
    assert right.sum() >= 4
    assert (after[right] == labels[:8][right]).mean() < 1.0   # pushed away from the true class


@pytest.mark.parametrize("req,field", [
    (dict(perturbation_id="no_such_thing", severity=1), "perturbation_id"),
    (dict(perturbation_id="gaussian_noise", severity=0), "severity"),
    (dict(perturbation_id="gaussian_noise", severity=6), "severity"),
    ("degradation-31", "severity"),
    ("property-1.5", "epsilon"),
    ("style-unknown-param", "params.bogus"),
])
def test_bad_catalogue_requests_name_the_field(pt, channel, fmnist_test_images, req, field):
    images, _ = fmnist_test_images
    batch = _batch(images, 2)
    if req == "degradation-31":
        deg = next(s for s in PERTURBATIONS.values() if s.kind == "degradation" and not s.needs_model)
        r = ppb.ApplyPerturbationRequest(perturbation_id=deg.id, severity=31, images=batch)
    elif req == "property-1.5":
        prop = next(s for s in PERTURBATIONS.values() if s.kind == "property")
        r = ppb.ApplyPerturbationRequest(perturbation_id=prop.id, epsilon=1.5, images=batch)
    elif req == "style-unknown-param":
        style = next(s for s in PERTURBATIONS.values() if s.kind == "style")
        r = ppb.ApplyPerturbationRequest(perturbation_id=style.id, severity=1, images=batch)
        r.params.update({"bogus": 1})
    else:
        r = ppb.ApplyPerturbationRequest(images=batch, **req)
    with pytest.raises(grpc.RpcError) as ei:
        pt.ApplyPerturbation(r, metadata=MD)
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in _violations(ei.value), ei.value.details()
    # the service keeps serving
    ok = pt.ApplyPerturbation(ppb.ApplyPerturbationRequest(
        perturbation_id="gaussian_noise", severity=1, seed=1, images=batch), metadata=MD)
    assert len(ok.images) == 2
