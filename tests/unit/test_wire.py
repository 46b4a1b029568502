"""Answers built in their wire form (infra/serving/wire.py) parse to exactly the message the
ordinary way builds, for every shape of answer that uses them: raw tensors and PNG, small
answers (joined) and large ones (pixels copied with the interpreter lock released), a prefix of
other fields, ids that are empty or not ASCII, and arrays that are not contiguous or not
little-endian."""

from __future__ import annotations

import numpy as np
import pytest
from fortis.common.v1 import common_pb2
from fortis.core.tensors import tensor_to_array
from fortis.infra.serving import wire
from fortis.perturbation.v1 import perturbation_pb2 as pb
from fortis.services.common.codec import add_images, decode_image


def _images(rng: np.random.Generator, shapes: list[tuple[int, ...]]) -> list[tuple[str, np.ndarray]]:
    ids = ["a", "", "bild-ä-図", "x" * 300]
    return [(ids[i % len(ids)], rng.integers(0, 256, s, dtype=np.uint8))
            for i, s in enumerate(shapes)]


SHAPES = {
    "small": [(2, 3, 3), (1, 1, 1), (5, 4)],
    "large": [(300, 200, 3), (129, 257, 1), (64, 64)],    # above the joined size
    "none": [],
}


@pytest.mark.parametrize("raw", [True, False], ids=["raw", "png"])
@pytest.mark.parametrize("size", sorted(SHAPES))
def test_same_message_as_protobuf_builds(size: str, raw: bool) -> None:
    items = _images(np.random.default_rng(len(size)), SHAPES[size])
    expected = pb.ApplyPerturbationResponse()
    add_images(expected.images, items, raw=raw)
    got = wire.image_list(pb.ApplyPerturbationResponse.IMAGES_FIELD_NUMBER, items, raw=raw)
    assert isinstance(got.data, bytes)
    parsed = pb.ApplyPerturbationResponse.FromString(got.data)
    assert parsed == expected
    for (image_id, arr), m in zip(items, parsed.images, strict=True):
        assert m.image_id == image_id
        assert np.array_equal(decode_image(m, "image").reshape(arr.shape), arr)
    if size == "large":
        assert len(got) > wire._DIRECT_MIN        # the lock-free copy was the one exercised


def test_prefix_and_field_number_of_a_stream_answer() -> None:
    items = _images(np.random.default_rng(7), SHAPES["large"])
    head = pb.ApplyPerturbationStreamResponse(request_id="batch-17")
    got = wire.image_list(pb.ApplyPerturbationStreamResponse.IMAGES_FIELD_NUMBER, items,
                          prefix=head.SerializeToString())
    expected = pb.ApplyPerturbationStreamResponse(request_id="batch-17")
    add_images(expected.images, items, raw=True)
    assert pb.ApplyPerturbationStreamResponse.FromString(got.data) == expected


@pytest.mark.parametrize("size", ["small", "large"])
def test_arrays_not_contiguous_or_big_endian(size: str) -> None:
    rng = np.random.default_rng(3)
    n = 2 if size == "small" else 200
    base = rng.integers(0, 256, (n, 2 * n, 3), dtype=np.uint8)
    strided = base[:, ::2]                          # not contiguous
    wide = rng.random((n, n)).astype(">f4")         # big-endian, not uint8
    got = wire.image_list(1, [("s", strided), ("w", wide)])
    parsed = pb.ApplyPerturbationResponse.FromString(got.data)
    assert np.array_equal(tensor_to_array(parsed.images[0].tensor, "t"), strided)
    back = tensor_to_array(parsed.images[1].tensor, "t")
    assert back.dtype == np.float32 and np.array_equal(back, wide.astype("<f4"))
    assert parsed.images[1].tensor.dtype == common_pb2.D_TYPE_FLOAT32


def test_every_answer_is_a_new_object() -> None:
    """A large answer is written after it is allocated: two answers never share their bytes,
    and building one leaves the pixels it was given unchanged."""
    items = _images(np.random.default_rng(11), SHAPES["large"])
    before = [a.copy() for _, a in items]
    one = wire.image_list(1, items)
    two = wire.image_list(1, items)
    assert one.data == two.data and one.data is not two.data
    assert all(np.array_equal(a, b) for (_, a), b in zip(items, before, strict=True))


def test_an_attack_answer_with_its_float_twin() -> None:
    """RunAttack's answer: scalars serialized by protobuf, then the adversarial image and its
    float tensor (fields written after the scalars: protobuf reads fields in any order)."""
    rng = np.random.default_rng(5)
    adv = rng.integers(0, 256, (120, 90, 3), dtype=np.uint8)
    adv_f = rng.random((120, 90, 3)).astype(np.float32)
    head = pb.RunAttackResponse(image_id="img-1", queries=37, linf=0.03, l2=1.5, success=True,
                                signal="top1", criterion="misclassification")
    got = wire.message(head.SerializeToString(),
                       wire.image_field(2, "img-1", adv, raw=True), wire.tensor_field(3, adv_f))
    expected = pb.RunAttackResponse()
    expected.CopyFrom(head)
    expected.adversarial.image_id = "img-1"
    expected.adversarial.tensor.CopyFrom(common_pb2.Tensor(
        dtype=common_pb2.D_TYPE_UINT8, shape=adv.shape, data=adv.tobytes()))
    expected.adversarial_float.CopyFrom(common_pb2.Tensor(
        dtype=common_pb2.D_TYPE_FLOAT32, shape=adv_f.shape, data=adv_f.tobytes()))
    assert pb.RunAttackResponse.FromString(got.data) == expected
