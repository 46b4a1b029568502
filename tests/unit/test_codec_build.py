"""Messages that carry images and tensors are built in place (``tensors.fill_tensor``,
``fill_image``, ``add_images``, ``add_messages``; under upb a message
passed to a constructor is copied slowly, see ``bench/codec.py``). These helpers must build
exactly what the constructor form built: the same bytes on the wire, the same arrays back."""

from __future__ import annotations

import numpy as np
import pytest
from fortis.common.v1 import common_pb2
from fortis.core.tensors import array_to_tensor, fill_tensor, tensor_to_array
from fortis.proxy.v1 import proxy_pb2
from fortis.services.common.codec import (
    add_images,
    add_messages,
    classification_from_proba,
    decode_image,
    encode_png,
    fill_classification,
    fill_image,
    image_msg,
)
from fortis.services.common.errors import InvalidArgument


@pytest.mark.parametrize("dtype,shape", [(np.uint8, (7, 5, 3)), (np.float32, (2, 3)),
                                         (np.int64, (4,)), (np.int32, (3, 3))])
def test_fill_tensor_is_the_constructor_form(dtype, shape):
    a = np.random.default_rng(1).integers(0, 200, shape).astype(dtype)
    built = fill_tensor(common_pb2.Tensor(), a)
    legacy = common_pb2.Tensor(dtype=built.dtype, shape=list(a.shape), data=a.tobytes())
    assert built.SerializeToString() == legacy.SerializeToString()
    assert np.array_equal(tensor_to_array(built, "t"), a)
    again = fill_tensor(built, a[:1])            # refilled: the old shape is replaced
    assert list(again.shape) == [1, *shape[1:]]
    assert np.array_equal(tensor_to_array(array_to_tensor(a), "t"), a)


def test_big_endian_arrays_are_sent_little_endian():
    a = np.arange(6, dtype=">i4").reshape(2, 3)
    assert np.array_equal(tensor_to_array(array_to_tensor(a), "t"), a)


def test_a_dtype_without_wire_form_is_refused_naming_the_field():
    with pytest.raises(InvalidArgument, match="tensor.dtype"):
        fill_tensor(common_pb2.Tensor(), np.zeros(3, dtype=np.complex64))


def test_images_built_in_place_equal_the_constructor_form():
    rng = np.random.default_rng(2)
    imgs = [(f"i{k}", rng.integers(0, 256, (9, 11, 3), dtype=np.uint8)) for k in range(3)]
    req = proxy_pb2.PredictRequest(session_id="s", origin="o")
    add_images(req.images, imgs)
    legacy = proxy_pb2.PredictRequest(session_id="s", origin="o", images=[
        common_pb2.Image(image_id=i, tensor=common_pb2.Tensor(
            dtype=common_pb2.D_TYPE_UINT8, shape=list(a.shape), data=a.tobytes()))
        for i, a in imgs])
    assert req.SerializeToString() == legacy.SerializeToString()
    for (i, a), m in zip(imgs, req.images, strict=True):
        assert m.image_id == i and np.array_equal(decode_image(m, "images"), a)
    png = fill_image(common_pb2.Image(), "p", imgs[0][1])          # raw=False: PNG bytes
    assert png.encoded == encode_png(imgs[0][1])
    assert np.array_equal(decode_image(image_msg("p", imgs[0][1]), "p"), imgs[0][1])


def test_add_messages_copies():
    preds = [common_pb2.Prediction(image_id=f"p{k}") for k in range(3)]
    resp = proxy_pb2.PredictResponse()
    add_messages(resp.predictions, preds)
    preds[0].image_id = "changed"                  # a copy, not the same object
    assert [p.image_id for p in resp.predictions] == ["p0", "p1", "p2"]


def _constructor_form(proba, *, output, top_k, names):
    """A classification answer built the way the codec built it before it filled messages
    in place: one ClassScore message per class handed to the constructor."""
    order = np.argsort(-proba, kind="stable")
    if output == "label_only":
        top = int(order[0])
        return common_pb2.Classification(classes=[common_pb2.ClassScore(label=top,
                                                                        name=names[top])])
    keep = order if output == "full_scores" else order[:top_k]
    return common_pb2.Classification(classes=[
        common_pb2.ClassScore(label=int(c), name=names[int(c)], score=float(proba[c]))
        for c in keep])


@pytest.mark.parametrize("output", ["full_scores", "top_k", "label_only"])
def test_classification_filled_in_place_is_the_constructor_form(output):
    rng = np.random.default_rng(4)
    proba = rng.random((6, 10)).astype(np.float32)
    proba[1, [2, 5, 7]] = proba[1].max() + 0.5      # ties: the stable order keeps label order
    proba[2] = 0.1                                   # every class tied
    names = [f"class-{k}" for k in range(10)]
    orders = np.argsort(-proba, axis=1, kind="stable")  # a whole batch sorted at once
    for p, order in zip(proba, orders, strict=True):
        want = _constructor_form(p, output=output, top_k=3, names=names).SerializeToString()
        assert classification_from_proba(p, output=output, top_k=3,
                                         names=names).SerializeToString() == want
        pred = common_pb2.Prediction(image_id="x")
        fill_classification(pred.classification, p, output=output, top_k=3, names=names,
                            order=order)
        assert pred.classification.SerializeToString() == want
