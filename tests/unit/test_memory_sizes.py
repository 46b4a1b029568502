"""Decoded sizes read from headers and shapes alone, and the per-tenant hold
(infra/serving/memory.py): pure code, real PNG/JPEG bytes made here."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
from fortis.common.v1 import common_pb2
from fortis.infra.serving.memory import CallHold, MemoryBudget, MemoryLimits, decoded_sizes
from fortis.perturbation.v1 import perturbation_pb2 as pt
from fortis.scoring.v1 import scoring_pb2
from fortis.services.common.errors import QuotaExceeded

from tests.fuzz.strategies import jpeg_header, png_header

APPLY = "/fortis.perturbation.v1.PerturbationService/ApplyPerturbation"


def _encoded(ext: str, arr: np.ndarray) -> bytes:
    ok, buf = cv2.imencode(ext, arr)
    assert ok
    return buf.tobytes()


@pytest.mark.parametrize("arr,ext,expected", [
    (np.zeros((30, 40), np.uint8), ".png", 30 * 40),
    (np.zeros((30, 40, 3), np.uint8), ".png", 30 * 40 * 3),
    (np.zeros((30, 40, 4), np.uint8), ".png", 30 * 40 * 4),
    (np.zeros((30, 40, 3), np.uint16), ".png", 30 * 40 * 3 * 2),
    (np.zeros((30, 40), np.uint8), ".jpg", 30 * 40),
    (np.zeros((30, 40, 3), np.uint8), ".jpg", 30 * 40 * 3)])
def test_an_encoded_image_is_sized_from_its_header(arr, ext, expected) -> None:
    req = pt.ApplyPerturbationRequest(images=[common_pb2.Image(image_id="a",
                                                               encoded=_encoded(ext, arr))])
    assert [(s.field, s.bytes) for s in decoded_sizes(req)] == [("images[0]", expected)]


def test_tensors_are_sized_from_their_shape_and_what_the_codec_refuses_counts_nothing() -> None:
    req = scoring_pb2.ComputeRequest()
    req.arrays["x"].CopyFrom(common_pb2.Tensor(dtype=common_pb2.D_TYPE_FLOAT32, shape=[5, 3],
                                               data=bytes(60)))
    req.arrays["bad"].CopyFrom(common_pb2.Tensor(dtype=common_pb2.D_TYPE_FLOAT32,
                                                 shape=[5, 3], data=bytes(7)))
    assert [(s.field, s.top, s.bytes) for s in decoded_sizes(req)] == [("arrays.x", "arrays", 60)]
    # past the pixel limit or unreadable: the decoder's own INVALID_ARGUMENT names them
    req = pt.ApplyPerturbationRequest(images=[
        common_pb2.Image(image_id="a", encoded=png_header(20000, 20000)),
        common_pb2.Image(image_id="b", encoded=b"GIF89a"),
        common_pb2.Image(image_id="c", encoded=jpeg_header(6000, 6000))])
    assert [(s.field, s.bytes) for s in decoded_sizes(req)] == [("images[2]", 36_000_000)]


def test_the_budget_refuses_names_and_gives_back() -> None:
    budget = MemoryBudget(MemoryLimits(max_request_bytes=1000, max_tenant_bytes=1500,
                                       max_response_bytes=10_000))
    req = pt.ApplyPerturbationRequest(images=[
        common_pb2.Image(image_id=str(i), encoded=png_header(20, 20)) for i in range(2)])
    release = budget.admit("t", APPLY, req)                 # 800 bytes held
    with pytest.raises(QuotaExceeded) as ei:
        budget.admit("t", APPLY, req)                       # 1600 > 1500 in flight
    assert ei.value.violations[0].subject == "images"
    budget.admit("u", APPLY, req)()                         # another tenant: unaffected
    budget.admit("t", APPLY, req, counted=False)()          # internal calls: not held
    release()
    release()                                               # once only
    assert budget.held("t") == 0
    hold = CallHold(budget, "t", APPLY, counted=True)
    hold.hold(req)
    hold.hold(pt.ApplyPerturbationRequest(images=[req.images[0]]))
    assert budget.held("t") == 1200
    hold.close()                                            # the call ended: all given back
    assert budget.held("t") == 0
    big = pt.ApplyPerturbationRequest(images=[
        common_pb2.Image(image_id=str(i), encoded=png_header(20, 20)) for i in range(3)])
    with pytest.raises(QuotaExceeded) as ei:
        budget.admit("t", APPLY, big)
    assert ei.value.violations[0].subject == "images"
    assert budget.held("t") == 0
