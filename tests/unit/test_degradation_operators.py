"""Unit tests of the incremental degradation operators against the paper's per-level counts and
parameters (DEG-1; Swingler, seed 001), operator by operator: pixel exchanges, random noise,
white fog, boxes, local blur, lines, global blur, fades, posterise and JPEG. Split from
test_degradation.py, whose catalogue index and test images these share."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
from fortis.services.common.errors import InvalidArgument
from fortis.services.perturbation.degradation import (
    operators,
    per_level_count,
)
from fortis.services.perturbation.spec import ApplyContext
from skimage import data

from tests.unit.test_degradation import BY_ID, IMAGES, _changed, _photo

# ----------------------------------------------------------------------------- the paper's counts

def test_per_level_counts_follow_the_papers_formulas():
    """DEG-1 counts for a w x h image: (h+w)/10 boxes, h+w local-blur rectangles, wh/50 noise
    pixels, wh/20 exchanged pairs, wh/20 adjacent swaps, wh/5 fog pixels; at least 1."""
    h, w = 64, 48
    assert per_level_count("black_lines", h, w) == per_level_count("white_lines", h, w) == 1
    assert per_level_count("random_boxes", h, w) == 11
    assert per_level_count("local_blur", h, w) == 112
    assert per_level_count("random_noise", h, w) == 61
    assert per_level_count("random_pixel_exchange", h, w) == 153
    assert per_level_count("adjacent_pixel_exchange", h, w) == 153
    assert per_level_count("white_fog", h, w) == 614
    assert per_level_count("random_boxes", 224, 224) == 44   # the paper's 224 x 224 input
    for op in ("random_boxes", "random_noise", "random_pixel_exchange", "white_fog"):
        assert per_level_count(op, 1, 1) == 1
    with pytest.raises(InvalidArgument):
        per_level_count("posterise", h, w)


def _distinct_rgb(h: int, w: int) -> np.ndarray:
    """Every pixel a different colour (index encoded in R, G)."""
    idx = np.arange(h * w)
    img = np.stack([idx % 256, idx // 256, np.full_like(idx, 7)], axis=1)
    return img.reshape(h, w, 3).astype(np.uint8)



def test_random_pixel_exchange_swaps_exactly_wh_over_20_pairs_per_level():
    h, w = 40, 30
    n = per_level_count("random_pixel_exchange", h, w)
    img = _distinct_rgb(h, w)
    rng = np.random.default_rng(3)
    prev = img
    for out in BY_ID["random_pixel_exchange"].iterate(img, 5, rng, ApplyContext()):
        assert int(_changed(prev, out).sum()) == 2 * n  # n disjoint pairs, 2n pixels moved
        moved = _changed(prev, out)
        # a permutation: the same multiset of pixels, and the moved ones pair up
        assert sorted(map(tuple, out.reshape(-1, 3))) == sorted(map(tuple, prev.reshape(-1, 3)))
        assert sorted(map(tuple, out[moved])) == sorted(map(tuple, prev[moved]))
        prev = out


def test_adjacent_pixel_exchange_swaps_wh_over_20_pixels_with_a_neighbour():
    h, w = 30, 40
    n = per_level_count("adjacent_pixel_exchange", h, w)
    a, b = operators._adjacent_pairs(h, w, np.random.default_rng(4))
    assert len(a) == len(b) == n and len(set(a.tolist())) == n
    ay, ax = np.divmod(a, w)
    by, bx = np.divmod(b, w)
    assert (np.maximum(np.abs(ay - by), np.abs(ax - bx)) == 1).all()  # one of the 8 neighbours
    assert ((by >= 0) & (by < h) & (bx >= 0) & (bx < w)).all()
    # the image is the result of exactly those swaps, in draw order
    img = _distinct_rgb(h, w)
    expect = img.reshape(-1, 3).copy()
    for i, j in zip(a.tolist(), b.tolist(), strict=True):
        expect[[i, j]] = expect[[j, i]]
    out = BY_ID["adjacent_pixel_exchange"].apply(img, 1, np.random.default_rng(4), ApplyContext())
    np.testing.assert_array_equal(out.reshape(-1, 3), expect)
    # all 8 directions occur
    assert len({(int(dy), int(dx)) for dy, dx in zip(by - ay, bx - ax, strict=True)}) == 8


def test_random_noise_changes_exactly_wh_over_50_pixels_per_level():
    h, w = 50, 40
    n = per_level_count("random_noise", h, w)
    img = _distinct_rgb(h, w)
    out = BY_ID["random_noise"].apply(img, 1, np.random.default_rng(8), ApplyContext())
    assert int(_changed(img, out).sum()) == n


def test_white_fog_adds_20_to_exactly_wh_over_5_pixels_per_level():
    h, w = 25, 40
    n = per_level_count("white_fog", h, w)
    img = np.full((h, w, 3), 100, dtype=np.uint8)
    outs = list(BY_ID["white_fog"].iterate(img, 2, np.random.default_rng(2), ApplyContext()))
    one = outs[0].astype(int) - 100
    assert int((one[:, :, 0] == 20).sum()) == n and set(np.unique(one)) == {0, 20}
    assert (one == one[:, :, :1]).all()  # every channel of a chosen pixel
    assert int((outs[1].astype(int) - 100).sum()) == 2 * n * 20 * 3
    bright = np.full((4, 5), 250, dtype=np.uint8)  # clipped at 255
    assert BY_ID["white_fog"].apply(bright, 30, np.random.default_rng(0), ApplyContext()).max() == 255


def test_random_boxes_draws_h_plus_w_over_10_black_boxes_of_2_to_5_px():
    h, w = 40, 60
    n = per_level_count("random_boxes", h, w)
    rects = operators._random_rects(h, w, n, operators.BOX_SIDE, np.random.default_rng(6))
    assert len(rects) == n == 10
    assert ((rects[:, 2] >= 2) & (rects[:, 2] <= 5) & (rects[:, 3] >= 2) & (rects[:, 3] <= 5)).all()
    mask = np.zeros((h, w), bool)
    for y, x, rh, rw in rects:
        assert y + rh <= h and x + rw <= w
        mask[y:y + rh, x:x + rw] = True
    white = np.full((h, w, 3), 255, dtype=np.uint8)
    out = BY_ID["random_boxes"].apply(white, 1, np.random.default_rng(6), ApplyContext())
    np.testing.assert_array_equal(out[:, :, 0] == 0, mask)
    assert set(np.unique(out)) == {0, 255}


def test_local_blur_replaces_h_plus_w_rectangles_by_their_mean():
    h, w = 30, 20
    rects = operators._random_rects(h, w, per_level_count("local_blur", h, w), operators.LOCAL_BLUR_SIDE,
                              np.random.default_rng(1))
    assert len(rects) == 50
    assert rects[:, 2:].min() >= 2 and rects[:, 2:].max() <= 10
    assert len(np.unique(rects[:, 2])) > 5  # sides spread over 2..10
    img = _photo(data.coffee, h, w)
    expect = img.copy()
    for y, x, rh, rw in rects:
        patch = expect[y:y + rh, x:x + rw]
        patch[...] = np.rint(patch.mean(axis=(0, 1)))
    out = BY_ID["local_blur"].apply(img, 1, np.random.default_rng(1), ApplyContext())
    np.testing.assert_array_equal(out, expect)


@pytest.mark.parametrize("colour_op", ["black_lines", "white_lines"])
def test_one_line_per_level_from_left_or_top_to_right_or_bottom(colour_op):
    h, w = 30, 45
    target = 0 if colour_op == "black_lines" else 255
    base = np.full((h, w), 255 - target, dtype=np.uint8)
    for seed in range(20):
        start, end = operators._line_endpoints(h, w, np.random.default_rng(seed))
        assert start[0] == 0 or start[1] == 0
        assert end[0] == w - 1 or end[1] == h - 1
        out = BY_ID[colour_op].apply(base, 1, np.random.default_rng(seed), ApplyContext())
        expect = cv2.line(base.copy(), start, end, (target,), 1, lineType=cv2.LINE_AA)
        np.testing.assert_array_equal(out, expect)
        touched = out != base
        assert touched[:, 0].any() or touched[0, :].any()
        assert touched[:, -1].any() or touched[-1, :].any()


def test_global_blur_is_one_5x5_box_filter_per_level():
    img = _photo(data.astronaut, 40, 30)
    outs = list(BY_ID["global_blur"].iterate(img, 3, np.random.default_rng(0), ApplyContext()))
    expect = img
    for out in outs:
        expect = cv2.blur(expect, (5, 5))
        np.testing.assert_array_equal(out, expect)


def test_fades_multiply_by_0_9_and_1_1():
    img = _photo(data.coffee, 20, 30)
    black = BY_ID["fade_to_black"].apply(img, 1, np.random.default_rng(0), ApplyContext())
    white = BY_ID["fade_to_white"].apply(img, 1, np.random.default_rng(0), ApplyContext())
    np.testing.assert_array_equal(black, np.rint(img * 0.9).astype(np.uint8))
    np.testing.assert_array_equal(white, np.clip(np.rint(img * 1.1), 0, 255).astype(np.uint8))
    dark = BY_ID["fade_to_black"].apply(img, 30, np.random.default_rng(0), ApplyContext())
    assert dark.max() <= img.max() * 0.9 ** 30 + 3  # 0.9^30 = 0.042, plus rounding
    assert BY_ID["fade_to_white"].apply(img, 30, np.random.default_rng(0),
                                        ApplyContext()).mean() > 240


def test_fade_to_grey_scales_hsv_saturation_by_0_9():
    img = _photo(data.astronaut, 24, 32)
    out = BY_ID["fade_to_grey"].apply(img, 1, np.random.default_rng(0), ApplyContext())
    f = img.astype(np.float32) / 255
    hsv = cv2.cvtColor(f, cv2.COLOR_RGB2HSV)  # the paper's route, in float
    hsv[:, :, 1] *= 0.9
    via_hsv = cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB) * 255
    assert np.abs(out - via_hsv).max() < 1.0  # the same up to the integer truncation
    g = out.astype(np.float32) / 255
    s_in = cv2.cvtColor(f, cv2.COLOR_RGB2HSV)[:, :, 1]
    s_out = cv2.cvtColor(g, cv2.COLOR_RGB2HSV)[:, :, 1]
    sel = img.max(axis=2) >= 64  # rounding to uint8 dominates S of dark pixels
    np.testing.assert_allclose(s_out[sel], 0.9 * s_in[sel], atol=0.02)
    np.testing.assert_array_equal(out.max(axis=2), img.max(axis=2))  # V unchanged
    s30 = cv2.cvtColor(BY_ID["fade_to_grey"].apply(img, 30, np.random.default_rng(0),
                                                   ApplyContext()).astype(np.float32) / 255,
                       cv2.COLOR_RGB2HSV)[:, :, 1]
    assert s30.mean() < 0.1 * s_in.mean()
    grey = IMAGES["grey_hw1_28"]
    np.testing.assert_array_equal(
        BY_ID["fade_to_grey"].apply(grey, 30, np.random.default_rng(0), ApplyContext()), grey)


def test_posterise_uses_b_bins_valued_i_plus_1_times_255_over_b():
    """DEG-1: b = 32 - level bins per channel, bin i -> (i+1)*255/b; applied to the previous
    level's image."""
    ramp = np.arange(256, dtype=np.uint8).reshape(16, 16)
    outs = list(BY_ID["posterise"].iterate(ramp, 30, np.random.default_rng(0), ApplyContext()))
    b = 31
    expect1 = np.rint((np.minimum(ramp.astype(int) * b // 255, b - 1) + 1) * 255 / b)
    np.testing.assert_array_equal(outs[0], expect1.astype(np.uint8))
    for level, out in enumerate(outs, 1):
        b = 32 - level
        allowed = {int(np.rint((i + 1) * 255 / b)) for i in range(b)}
        assert set(np.unique(out).tolist()) <= allowed, level
    assert set(np.unique(outs[-1]).tolist()) <= {128, 255}
    rgb = _photo(data.coffee, 32, 32)
    out30 = BY_ID["posterise"].apply(rgb, 30, np.random.default_rng(0), ApplyContext())
    assert len(np.unique(out30.reshape(-1, 3), axis=0)) <= 8  # 2 bins per channel: <= 8 colours


def test_jpeg_reencodes_with_quality_32_minus_level():
    img = _photo(data.chelsea, 32, 48)
    outs = list(BY_ID["jpeg_recompress"].iterate(img, 3, np.random.default_rng(0), ApplyContext()))
    prev = img
    for level, out in enumerate(outs, 1):
        ok, buf = cv2.imencode(".jpg", prev[:, :, ::-1].copy(),
                               [int(cv2.IMWRITE_JPEG_QUALITY), 32 - level])
        assert ok
        np.testing.assert_array_equal(out, cv2.imdecode(buf, cv2.IMREAD_COLOR)[:, :, ::-1])
        prev = out
    grey = IMAGES["grey_hw1_28"]
    ok, buf = cv2.imencode(".jpg", grey[:, :, 0], [int(cv2.IMWRITE_JPEG_QUALITY), 31])
    np.testing.assert_array_equal(
        BY_ID["jpeg_recompress"].apply(grey, 1, np.random.default_rng(0), ApplyContext())[:, :, 0],
        cv2.imdecode(buf, cv2.IMREAD_GRAYSCALE))
