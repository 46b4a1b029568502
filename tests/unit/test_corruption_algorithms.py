"""Unit tests of the common corruptions' algorithms, by topic: frost (IEEE-A3: the calibrated
procedural texture's statistics, the blend constants, no image files shipped), spatter
(IEEE-A3), the geometric transforms (IEEE-A4 c: the table's transform with a random sense,
monotone severities, black fill) and the fast samplers (standard normals, truncated Poisson,
shot-noise levels; pixelate equal to Pillow's BOX + NEAREST). Split from test_corruptions.py,
whose helpers (photos, severities) these share."""

from __future__ import annotations

import math
from pathlib import Path

import cv2
import numpy as np
import pytest
from fortis.services.perturbation import corruptions
from fortis.services.perturbation.corruptions import (
    CORRUPTIONS,
    FROST_BLEND,
    FROST_TEXTURES,
    PIXELATE_FACTOR,
    SHOT_NOISE_PHOTONS,
    TRANSLATION_FRACTION,
    apply_corruption,
    frost,
    sampling,
)
from PIL import Image

from tests.unit.test_corruptions import SEVERITIES, _mad, _rgb

# ----------------------------------------------------------------------------- frost (IEEE-A3)

@pytest.mark.parametrize("index", range(len(FROST_TEXTURES)),
                         ids=lambda i: FROST_TEXTURES[i].source)
def test_frost_texture_has_the_table_statistics(index):
    """IEEE-A3 frost: on a black image at severity 1 (x' = 0 x + 0.4 F) each channel of the
    result has the table's standard deviation (x 0.4; within 2% over 6 textures, 5% each: a
    dark texture drawn darker than its mean clips a little at 0) and a mean within 4
    crop-to-crop standard deviations of the table's; the texture's skewness, averaged over 40
    textures (it varies by ~0.3 from one to the next), is the table's within 0.15."""
    texture = FROST_TEXTURES[index]
    black = np.zeros((224, 224, 3), dtype=np.uint8)
    weight = FROST_BLEND[0][1]
    stds = []
    for seed in range(6):
        out = frost.frost_blend(black, FROST_BLEND[0], texture,
                                       np.random.default_rng(seed)).astype(np.float64) / weight
        stds.append(out.std(axis=(0, 1)))
        for ch in range(3):
            assert out[:, :, ch].std() == pytest.approx(texture.std[ch], rel=0.05), (seed, ch)
            assert abs(out[:, :, ch].mean() - texture.mean[ch]) <= 4 * texture.mean_sd[ch] + 1
    np.testing.assert_allclose(np.mean(stds, axis=0), texture.std, rtol=0.02)
    skews = []
    for seed in range(100, 140):
        z = frost.calibrated_frost_texture(texture.style, 224, 224, np.random.default_rng(seed))
        assert abs(float(z.mean())) < 1e-4 and float(z.std()) == pytest.approx(1.0, abs=1e-3)
        skews.append(float((z.astype(np.float64) ** 3).mean()))
    assert np.mean(skews) == pytest.approx(texture.skew, abs=0.15)


def test_frost_picks_all_five_textures_and_differs_by_seed():
    """IEEE-A3 frost: the texture (one of five, as the reference's five photographs) and its
    crystals come from the rng: different seeds, different frost."""
    img = _rgb(64, 64)
    outs = [apply_corruption("frost", img, 3, np.random.default_rng(s)) for s in range(40)]
    picks = {int(np.random.default_rng(s).integers(len(FROST_TEXTURES))) for s in range(40)}
    assert picks == set(range(len(FROST_TEXTURES)))
    assert len({o.tobytes() for o in outs}) == 40


def test_frost_blend_constants_and_grey():
    """IEEE-A3 frost: x' = c0 x + c1 F: a mid-grey image keeps c0 of itself under a layer of
    mean c1 * (texture mean); grey images get the texture's luminance."""
    grey = np.full((96, 96), 128, dtype=np.uint8)
    for severity, (c0, c1) in enumerate(FROST_BLEND, start=1):
        outs = [apply_corruption("frost", grey, severity, np.random.default_rng(s)).astype(float)
                for s in range(30)]
        expected = c0 * 128 + c1 * np.mean([np.array(t.mean) @ (0.299, 0.587, 0.114)
                                            for t in FROST_TEXTURES])
        assert np.mean([o.mean() for o in outs]) == pytest.approx(expected, rel=0.06), severity


def test_frost_ships_no_image_files():
    """IEEE-A3 frost: the texture is procedural; no image file sits beside the code."""
    here = Path(corruptions.__file__).parents[1]
    images = [p for p in here.rglob("*") if p.suffix.lower() in (".png", ".jpg", ".jpeg")]
    assert images == []


# ----------------------------------------------------------------------------- spatter (IEEE-A3)

def test_spatter_liquid_adds_water_and_mud_covers():
    """IEEE-A3 spatter: severities 1-3 (liquid) only add pale-turquoise light to some pixels;
    4-5 (mud) paint some pixels brown and leave most of the image as it was."""
    img = _rgb(128, 160)
    for severity in (1, 2, 3):
        out = apply_corruption("spatter", img, severity, np.random.default_rng(severity))
        d = out.astype(int) - img
        assert d.min() >= -1, severity                       # rounding only
        changed = (d > 1).any(axis=2).mean()
        assert 0.01 < changed < 0.9, (severity, changed)
        # more red-free light than red: water colour (175, 238, 238)
        assert d[..., 1].sum() > d[..., 0].sum() and d[..., 2].sum() > d[..., 0].sum()
    white = np.full((128, 160, 3), 255, dtype=np.uint8)
    for severity in (4, 5):
        out = apply_corruption("spatter", white, severity, np.random.default_rng(severity))
        mud = (out.astype(int).sum(axis=2) < 3 * 255 - 30)
        assert 0.001 < mud.mean() < 0.5, (severity, mud.mean())
        r, g, b = out[mud].astype(int).T
        assert np.all(r >= g) and np.all(g >= b)             # brown (63, 42, 20) blended


# ----------------------------------------------------------------------------- geometric (A4 c)

def _forward(img: np.ndarray, a: np.ndarray, shift=(0.0, 0.0)) -> np.ndarray:
    h, w = img.shape[:2]
    centre = np.array([(w - 1) / 2.0, (h - 1) / 2.0])
    m = np.hstack([a, (centre + np.asarray(shift) - a @ centre)[:, None]])
    return cv2.warpAffine(img, m, (w, h), flags=cv2.INTER_LINEAR,
                          borderMode=cv2.BORDER_CONSTANT, borderValue=(0, 0, 0, 0))


def _candidates(cid: str, value: float, h: int, w: int) -> list[np.ndarray]:
    """The 2x2 maps a geometric corruption may draw at one table value."""
    if cid == "rotation":
        return [np.array([[math.cos(t), -math.sin(t)], [math.sin(t), math.cos(t)]])
                for t in (math.radians(value), -math.radians(value))]
    if cid == "scale":
        return [np.eye(2) * value, np.eye(2) / value]
    k = math.tan(math.radians(value))
    return [np.array(m, dtype=float) for m in ([[1, k], [0, 1]], [[1, -k], [0, 1]],
                                               [[1, 0], [k, 1]], [[1, 0], [-k, 1]])]


@pytest.mark.parametrize("cid", ["rotation", "scale", "shear"])
def test_geometric_is_the_table_transform_with_a_random_sense(cid):
    """IEEE-A4 c): rotation / scale / shear are exactly the table's transform about the centre
    (black fill), in a direction the rng picks; over seeds every direction occurs."""
    img = _rgb(48, 64)
    for severity in SEVERITIES:
        value = CORRUPTIONS[cid].severity_params[severity - 1]
        cands = [_forward(img, a) for a in _candidates(cid, value, 48, 64)]
        seen = set()
        for seed in range(16):
            out = apply_corruption(cid, img, severity, np.random.default_rng(seed))
            hits = [i for i, c in enumerate(cands) if np.array_equal(out, c)]
            assert hits, (cid, severity, seed)
            seen.update(hits)
        assert len(seen) == len(cands), (cid, severity, seen)


def test_translation_shifts_by_the_table_fraction():
    """IEEE-A4 c): translation moves a white image by f*(W cos t, H sin t): the black area
    is 1 - (1 - f|cos t|)(1 - f|sin t|) of the image, and the direction varies with the seed."""
    img = np.full((100, 140, 3), 255, dtype=np.uint8)
    for severity, f in zip(SEVERITIES, TRANSLATION_FRACTION, strict=True):
        fractions = []
        for seed in range(8):
            rng = np.random.default_rng(seed)
            theta = np.random.default_rng(seed).uniform(0.0, 2.0 * math.pi)
            out = apply_corruption("translation", img, severity, rng)
            black = (out.max(axis=2) < 128).mean()
            expected = 1 - (1 - f * abs(math.cos(theta))) * (1 - f * abs(math.sin(theta)))
            assert black == pytest.approx(expected, abs=0.02), (severity, seed)
            fractions.append(black)
        assert np.mean(fractions) > 0


@pytest.mark.parametrize("cid", ["rotation", "translation", "scale", "shear", "affine"])
def test_geometric_severity_is_monotone(cid):
    """IEEE-A4 c), IEEE-M7: every severity moves the image more than the one before (mean
    absolute change over 6 seeds)."""
    img = _rgb(64, 64)
    mads = [np.mean([_mad(apply_corruption(cid, img, s, np.random.default_rng(k)), img)
                     for k in range(6)]) for s in SEVERITIES]
    assert all(b > a for a, b in zip(mads, mads[1:], strict=False)), (cid, np.round(mads, 2))


def test_geometric_fill_is_black():
    """IEEE-A4 c): pixels from outside the image are the constant 0."""
    img = np.full((64, 64, 3), 255, dtype=np.uint8)
    for cid in ("rotation", "translation", "shear", "affine"):
        for seed in range(4):
            out = apply_corruption(cid, img, 5, np.random.default_rng(seed))
            assert (out.max(axis=2) == 0).mean() > 0.01, (cid, seed)
    outs = [apply_corruption("scale", img, 5, np.random.default_rng(s)) for s in range(8)]
    assert any((o.max(axis=2) == 0).mean() > 0.1 for o in outs)      # zoomed out: black frame
    assert any((o == 255).all() for o in outs)                       # zoomed in: none


# ----------------------------------------------------------------------------- fast samplers

def test_standard_normal_sampler():
    """IEEE-A1 a): the table sampler behind gaussian/speckle noise and snow: mean 0, std 1,
    symmetric, Gaussian quantiles, all from the rng (reproducible, different per seed)."""
    z = sampling.standard_normal(np.random.default_rng(0), (1000, 1000)).astype(np.float64)
    assert abs(z.mean()) < 0.005 and z.std() == pytest.approx(1.0, abs=0.005)
    assert abs((z ** 3).mean()) < 0.02 and (z ** 4).mean() == pytest.approx(3.0, abs=0.05)
    for q, expected in ((0.5, 0.0), (0.8413, 1.0), (0.9772, 2.0), (0.99865, 3.0)):
        assert np.quantile(z, q) == pytest.approx(expected, abs=0.02), q
    a = sampling.standard_normal(np.random.default_rng(5), (50,))
    np.testing.assert_array_equal(a, sampling.standard_normal(np.random.default_rng(5), (50,)))
    assert not np.array_equal(a, sampling.standard_normal(np.random.default_rng(6), (50,)))


def test_standard_normal_drawn_in_blocks_is_one_stream():
    """A large image's draws are made a block at a time (the generator holds the interpreter
    lock while it makes bytes); the values are those of one draw of every byte at once, so a
    seed gives the same image whatever the block size."""
    shape = (3 * sampling._BLOCK // 1000 + 7, 1000)        # several blocks and a part of one
    n = shape[0] * shape[1]
    bits = np.frombuffer(np.random.default_rng(21).bytes(2 * n), dtype="<u2")
    whole = sampling._normal_table()[bits].reshape(shape)
    np.testing.assert_array_equal(sampling.standard_normal(np.random.default_rng(21), shape),
                                  whole)


@pytest.mark.parametrize("photons", [60, 12, 3])
def test_truncated_poisson_sampler(photons):
    """IEEE-A1 b): the alias-method sampler behind shot noise: min(Poisson(k c / 255), c) per
    value, its frequencies matching the exact probabilities (chi-square, 4 levels k)."""
    for k in (0, 40, 128, 255):
        img = np.full((300, 300, 1), k, dtype=np.uint8)
        t = sampling.truncated_poisson(np.random.default_rng(k), img, photons).ravel()
        lam = k / 255 * photons
        pmf = np.array([math.exp(-lam) * lam ** i / math.factorial(i) for i in range(photons)])
        pmf = np.append(pmf, max(0.0, 1.0 - pmf.sum()))
        counts = np.bincount(t, minlength=photons + 1)
        assert counts.size == photons + 1                       # never above the cap
        expected = pmf * t.size
        keep = expected > 5
        chi2 = float((((counts - expected) ** 2)[keep] / expected[keep]).sum())
        dof = max(1, int(keep.sum()) - 1)
        assert chi2 < dof + 5 * math.sqrt(2 * dof), (photons, k, chi2, dof)


def test_shot_noise_levels_have_the_poisson_mean():
    """IEEE-A1 b): on a flat image of level k the mean output is E[min(P, c) / c] * 255 with
    P ~ Poisson(k c / 255) (counts above c are white), within 4 standard errors, at every
    severity."""
    for k in (30, 100, 220):
        img = np.full((200, 200, 3), k, dtype=np.uint8)
        for severity, c in zip(SEVERITIES, SHOT_NOISE_PHOTONS, strict=True):
            lam = k / 255 * c
            pmf = [math.exp(-lam) * lam ** i / math.factorial(i) for i in range(c)]
            levels = [round(i / c * 255) for i in range(c)]
            probs = np.append(pmf, 1 - sum(pmf))
            values = np.append(levels, 255.0)
            expected = float(probs @ values)
            se = math.sqrt(float(probs @ (values - expected) ** 2) / img.size)
            out = apply_corruption("shot_noise", img, severity, np.random.default_rng(severity))
            assert out.mean() == pytest.approx(expected, abs=4 * se), (k, severity)


def test_pixelate_is_pillows_box_then_nearest():
    """IEEE-A4 d): exactly Pillow's BOX down-sampling and NEAREST up-sampling (the reference's
    two calls), on every route (OpenCV on squares, Pillow's reduce, Pillow's resize): every
    square side up to 79, ImageNet's 224, and oblong sizes where OpenCV's nearest-neighbour
    grid differs from Pillow's or Pillow runs its vertical pass first."""
    rng = np.random.default_rng(0)
    squares = [(n, n) for n in range(1, 80)] + [(224, 224), (256, 256)]
    for h, w in squares + [(37, 61), (100, 33), (300, 200), (7, 3), (10, 4), (112, 224)]:
        img = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        for severity, f in zip(SEVERITIES, PIXELATE_FACTOR, strict=True):
            small = Image.fromarray(img).resize((max(1, int(w * f)), max(1, int(h * f))),
                                                Image.Resampling.BOX)
            expected = np.asarray(small.resize((w, h), Image.Resampling.NEAREST))
            out = apply_corruption("pixelate", img, severity, np.random.default_rng(0))
            np.testing.assert_array_equal(out, expected, err_msg=f"{h}x{w} s{severity}")
