"""The whole perturbation catalogue over real gRPC on loopback: listed once
with its characterisation (DEG-5) and level kind, applied to batches unary and streaming, for
every kind -- corruptions (IEEE-A1..A5), styles (IEEE-A6), incremental degradation operators
(DEG-1, incl. the white-box one on the real surrogate) and safety properties (PER-1) -- and bad
input answered with a status naming the field while the service keeps serving. The attacks
are listed apart (ListAttacks, from the attack registry) with typed parameter schemas, and
images come back as raw uint8 tensors unless PNG is asked for."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from fortis.perturbation.v1 import perturbation_pb2 as ppb
from fortis.perturbation.v1 import perturbation_pb2_grpc
from fortis.services.common.codec import decode_image, image_msg
from fortis.services.perturbation.attacks.registry import ATTACKS
from fortis.services.perturbation.registry import PERTURBATIONS
from google.protobuf.struct_pb2 import Struct
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
    assert set(PERTURBATIONS) == set(ids)                      # image perturbations only
    assert not set(ATTACKS) & set(ids)
    kinds = {p.kind for p in items}
    assert kinds == {ppb.PERTURBATION_KIND_CORRUPTION, ppb.PERTURBATION_KIND_STYLE,
                     ppb.PERTURBATION_KIND_DEGRADATION, ppb.PERTURBATION_KIND_PROPERTY}
    for p in items:
        assert p.characterisation.scope in (ppb.SCOPE_GLOBAL, ppb.SCOPE_LOCAL), p.id
        assert p.characterisation.randomness in (ppb.RANDOMNESS_DETERMINISTIC,
                                                 ppb.RANDOMNESS_STOCHASTIC), p.id
        assert p.characterisation.domain in (ppb.DOMAIN_COLOUR, ppb.DOMAIN_PIXEL), p.id
        assert p.refs and p.level_kind != ppb.LEVEL_KIND_UNSPECIFIED, p.id
        spec = PERTURBATIONS[p.id]
        assert len(p.level_table) == len(spec.level_table), p.id
        if spec.levels:
            assert [row.level for row in p.level_table] == list(spec.levels), p.id
        for row in p.level_table:
            assert row.values and all(v.name and v.WhichOneof("value") for v in row.values), p.id
    deg = pt.ListPerturbations(ppb.ListPerturbationsRequest(kind=ppb.PERTURBATION_KIND_DEGRADATION),
                               metadata=MD).perturbations
    assert deg and all(list(p.levels) == list(range(1, 31)) for p in deg)
    assert all("DEG-1" in p.refs for p in deg)
    # typed parameter schemas: type, default in the case of its type, bounds
    prop = next(p for p in items if p.id == "per_brightness")
    direction = next(q for q in prop.parameters if q.name == "direction")
    assert direction.type == ppb.PARAMETER_TYPE_INT and not direction.required
    assert direction.default_value.WhichOneof("value") == "integer"
    assert direction.default_value.integer == 1
    assert direction.HasField("minimum") and direction.minimum == -1 and direction.maximum == 1
    # pages: the same entries, in order, through next_page_token
    paged, token = [], ""
    while True:
        page = pt.ListPerturbations(ppb.ListPerturbationsRequest(page_size=7, page_token=token),
                                    metadata=MD)
        assert len(page.perturbations) <= 7
        paged += [p.id for p in page.perturbations]
        token = page.next_page_token
        if not token:
            break
    assert paged == ids


def test_list_attacks_reads_the_registry_with_typed_schemas(pt, channel):
    items = pt.ListAttacks(ppb.ListAttacksRequest(), metadata=MD).attacks
    assert [a.id for a in items] == list(ATTACKS)
    by_id = {a.id: a for a in items}
    pgd, hsja, pk = by_id["pgd"], by_id["hsja"], by_id["pertknob"]
    assert pgd.kind == ppb.ATTACK_KIND_TRANSFER and pgd.needs_surrogate
    assert list(pgd.norms) == [ppb.NORM_LINF, ppb.NORM_L2] and pgd.untargeted and pgd.targeted
    assert list(by_id["sparse_l1"].norms) == [ppb.NORM_L1]
    assert list(by_id["spatial"].norms) == [ppb.NORM_SPATIAL]
    assert list(hsja.norms) == [ppb.NORM_L2] and hsja.kind == ppb.ATTACK_KIND_DECISION
    assert by_id["square"].kind == ppb.ATTACK_KIND_SCORE
    assert pgd.refs[0] == "IEEE-A7" and pk.refs[0] == "PER-3" and "IEEE-M6" in hsja.refs
    eps = next(p for p in pgd.parameters if p.name == "epsilon")
    assert eps.type == ppb.PARAMETER_TYPE_FLOAT and eps.required
    assert not eps.HasField("default_value") and (eps.minimum, eps.maximum) == (0.0, 1000.0)
    steps = next(p for p in pgd.parameters if p.name == "steps")
    assert steps.type == ppb.PARAMETER_TYPE_INT and steps.default_value.integer == 10
    start = next(p for p in pgd.parameters if p.name == "random_start")
    assert start.type == ppb.PARAMETER_TYPE_BOOL and start.default_value.flag is True
    mode = next(p for p in pk.parameters if p.name == "mode")
    assert mode.type == ppb.PARAMETER_TYPE_STRING and mode.default_value.text == "bisection"
    assert list(mode.choices) == ["bisection", "linear"] and not mode.HasField("minimum")
    transfer = pt.ListAttacks(ppb.ListAttacksRequest(kind=ppb.ATTACK_KIND_TRANSFER),
                              metadata=MD).attacks
    assert [a.id for a in transfer] == [k for k, s in ATTACKS.items() if s.kind == "transfer"]
    assert {"fgsm", "bim", "pgd", "mi_fgsm", "spatial", "ddn", "dispersion_reduction",
            "cw_l2", "ead", "fab", "sparse_l1", "fast_feature"} <= {a.id for a in transfer}
    with pytest.raises(grpc.RpcError) as ei:
        pt.ListAttacks(ppb.ListAttacksRequest(page_token="not-a-token"), metadata=MD)
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_images_come_back_as_raw_tensors_unless_png_is_asked(pt, fmnist_test_images,
                                                              fmnist_surrogate):
    """No PNG round trip between services; PNG on request; RunAttack returns the uint8 tensor
    the target receives and a typed stop reason."""
    images, labels = fmnist_test_images
    batch = _batch(images, 3)
    raw = pt.ApplyPerturbation(ppb.ApplyPerturbationRequest(
        perturbation_id="gaussian_noise", severity=2, seed=4, images=batch), metadata=MD).images
    png = pt.ApplyPerturbation(ppb.ApplyPerturbationRequest(
        perturbation_id="gaussian_noise", severity=2, seed=4, images=batch,
        response_encoding=ppb.IMAGE_ENCODING_PNG), metadata=MD).images
    assert all(m.WhichOneof("content") == "tensor" for m in raw)
    assert all(m.WhichOneof("content") == "encoded" for m in png)
    for a, b in zip(raw, png, strict=True):
        assert np.array_equal(decode_image(a, "raw"), decode_image(b, "png"))
    out = list(pt.RunAttack(ppb.RunAttackRequest(
        attack_id="fgsm", seed=1, surrogate="fmnist-surrogate",
        images=[ppb.LabeledImage(image=m, labels=[int(labels[i])]) for i, m in enumerate(batch)],
        params=_struct({"epsilon": 0.1})), metadata=MD))
    assert [r.image_id for r in out] == [m.image_id for m in batch]
    for i, r in enumerate(out):
        assert r.adversarial.WhichOneof("content") == "tensor"
        adv = decode_image(r.adversarial, "adv")
        assert adv.dtype == np.uint8 and adv.shape == images[i].shape
        assert np.abs(adv.astype(int) - images[i].astype(int)).max() <= 25
        assert r.stop_reason == ppb.STOP_REASON_ITERATIONS and not r.HasField("success")


def _struct(d: dict) -> Struct:
    s = Struct()
    s.update(d)
    return s


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
    assert [m.tensor.data for m in again] == [m.tensor.data for m in got["deg"].images]


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
