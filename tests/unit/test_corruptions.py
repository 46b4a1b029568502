"""Unit tests of the common corruptions, IEEE-A1 (noise), IEEE-A2 (blur), IEEE-A3 (weather:
snow, frost, fog, brightness, spatter), IEEE-A4 (digital; geometric: rotation, translation,
scale, shear, affine) and IEEE-A5 (mask): shapes and dtypes at every severity and at any image
size (1x1 to 300x200, grey and RGB), seeded reproducibility, severity ordering, the tables'
meaning, the registry export (``SPECS``, DEG-5 characterisation, named level tables), input
validation and speed of glass blur. Frost, spatter, the geometric transforms and the fast
samplers are tests/unit/test_corruption_algorithms.py; the side-by-side comparison with the
reference implementation is tests/reference/test_corruptions_vs_imagecorruptions.py."""

from __future__ import annotations

import time

import cv2
import numpy as np
import pytest
from fortis.services.common.errors import InvalidArgument
from fortis.services.perturbation.corruptions import (
    CORRUPTIONS,
    GAUSSIAN_NOISE_SIGMA,
    IMPULSE_NOISE_AMOUNT,
    OCCLUSION_AREA,
    ROTATION_DEGREES,
    SCALE_FACTOR,
    SHEAR_DEGREES,
    SPECS,
    TRANSLATION_FRACTION,
    CorruptionSpec,
    apply_corruption,
    list_corruptions,
)
from fortis.services.perturbation.spec import ApplyContext, Characterisation, PerturbationSpec
from skimage import data

IDS = list(CORRUPTIONS)
STOCHASTIC = [c.id for c in CORRUPTIONS.values() if c.stochastic]
DETERMINISTIC = [c.id for c in CORRUPTIONS.values() if not c.stochastic]
SEVERITIES = [1, 2, 3, 4, 5]


def _rgb(h: int, w: int) -> np.ndarray:
    """A natural photo (skimage astronaut), resized to h x w."""
    return np.ascontiguousarray(cv2.resize(data.astronaut(), (w, h), interpolation=cv2.INTER_AREA))


def _grey28() -> np.ndarray:
    """28x28x1, Fashion-MNIST sized: smooth gradient plus a texture, dark border."""
    yy, xx = np.mgrid[0:28, 0:28].astype(np.float64)
    img = 40 + 5 * xx + 2 * yy + 30 * np.sin(xx / 2.0) * np.cos(yy / 3.0)
    img[:3, :] = 0
    img[:, -3:] = 0
    return np.clip(img, 0, 255).astype(np.uint8)[:, :, None]


@pytest.fixture(scope="module")
def grey28() -> np.ndarray:
    return _grey28()


@pytest.fixture(scope="module")
def rgb64x48() -> np.ndarray:
    return _rgb(64, 48)


@pytest.fixture(scope="module")
def rgb64() -> np.ndarray:
    return _rgb(64, 64)


def _mad(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean())


# ----------------------------------------------------------------------------- registry

def test_registry_covers_annex_a_families():
    """IEEE-A1..A5: every family has its corruptions, each with a 5-entry severity table."""
    required = {"gaussian_noise", "shot_noise", "impulse_noise", "speckle_noise",      # A1
                "defocus_blur", "motion_blur", "gaussian_blur", "zoom_blur", "glass_blur",  # A2
                "snow", "frost", "fog", "brightness", "spatter",                        # A3
                "contrast", "pixelate", "jpeg_compression", "elastic_transform",        # A4
                "rotation", "translation", "scale", "shear", "affine",                  # A4 c)
                "occlusion"}                                                            # A5
    assert required <= set(CORRUPTIONS)
    assert list_corruptions() == list(CORRUPTIONS.values())
    refs = {"noise": {"IEEE-A1"}, "blur": {"IEEE-A2"}, "weather": {"IEEE-A3"},
            "digital": {"IEEE-A4"}, "geometric": {"IEEE-A4"}, "mask": {"IEEE-A5"}}
    for key, spec in CORRUPTIONS.items():
        assert isinstance(spec, CorruptionSpec)
        assert spec.id == key
        assert spec.ieee_ref in refs[spec.family], spec
        assert len(spec.severity_params) == 5, spec.id
        assert spec.description


def test_reference_constants_are_visible():
    """IEEE-A1: the ImageNet-C (imagecorruptions 1.1.2) tables are the registry's data."""
    assert CORRUPTIONS["gaussian_noise"].severity_params == (0.08, 0.12, 0.18, 0.26, 0.38)
    assert CORRUPTIONS["jpeg_compression"].severity_params == (25, 18, 15, 10, 7)
    assert CORRUPTIONS["defocus_blur"].severity_params[4] == (10, 0.5)
    assert CORRUPTIONS["occlusion"].severity_params == OCCLUSION_AREA
    assert CORRUPTIONS["frost"].severity_params == ((1, 0.4), (0.8, 0.6), (0.7, 0.7),
                                                    (0.65, 0.7), (0.6, 0.75))
    assert CORRUPTIONS["spatter"].severity_params[3] == (0.65, 0.3, 1, 0.65, 1.5, 1)
    for cid, table in (("rotation", ROTATION_DEGREES), ("translation", TRANSLATION_FRACTION),
                       ("scale", SCALE_FACTOR), ("shear", SHEAR_DEGREES)):
        assert CORRUPTIONS[cid].severity_params == table
        assert list(table) == sorted(table) and len(set(table)) == 5, cid


# ----------------------------------------------------------------------------- registry export

def test_specs_export_every_corruption():
    """Registry (DEG-5 characterisation; IEEE-M7 severities): one PerturbationSpec per
    corruption, kind "corruption", severities 1..5, the severity table as level_table."""
    assert [s.id for s in SPECS] == list(CORRUPTIONS)
    for spec in SPECS:
        c = CORRUPTIONS[spec.id]
        assert isinstance(spec, PerturbationSpec)
        assert spec.kind == "corruption" and spec.level_kind == "severity"
        assert spec.levels == (1, 2, 3, 4, 5)
        assert spec.level_table == c.severity_params and spec.level_table_doc
        assert spec.refs == (c.ieee_ref,) and spec.family == c.family
        assert isinstance(spec.characterisation, Characterisation)
        assert spec.characterisation == c.characterisation
        assert spec.stochastic == c.stochastic
        assert not spec.needs_model and spec.params == ()


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.id)
def test_spec_apply_is_apply_corruption(spec, rgb64x48):
    """IEEE-A1..A5 through the registry: apply(image, level, rng, ctx) is apply_corruption,
    bit for bit."""
    for level in (1, 5):
        a = spec.apply(rgb64x48, level, np.random.default_rng(3), ApplyContext())
        b = apply_corruption(spec.id, rgb64x48, level, np.random.default_rng(3))
        np.testing.assert_array_equal(a, b)


def test_characterisations_follow_deg5():
    """DEG-5: global/local, deterministic/stochastic, colour/pixel as Swingler defines them."""
    char = {c.id: c.characterisation for c in CORRUPTIONS.values()}
    for c in CORRUPTIONS.values():
        assert c.characterisation.randomness == ("stochastic" if c.stochastic else "deterministic")
    for cid in ("brightness", "contrast", "saturate", "fog", "jpeg_compression"):
        assert char[cid].domain == "colour", cid                # the palette is remapped
    for cid in ("impulse_noise", "random_impulse_noise", "occlusion", "spatter"):
        assert char[cid].scope == "local", cid                  # only some pixels change
    for cid in ("gaussian_noise", "defocus_blur", "zoom_blur", "rotation", "frost"):
        assert char[cid].as_dict() == {"scope": "global", "randomness": char[cid].randomness,
                                       "domain": "pixel"}, cid


# ----------------------------------------------------------------------------- shapes

@pytest.mark.parametrize("severity", SEVERITIES)
@pytest.mark.parametrize("cid", IDS)
def test_grey_28x28x1(cid, severity, grey28):
    """IEEE-A1..A5 on a Fashion-MNIST-sized grey image: uint8, same shape, input untouched."""
    before = grey28.copy()
    out = apply_corruption(cid, grey28, severity, np.random.default_rng(0))
    assert out.dtype == np.uint8
    assert out.shape == (28, 28, 1)
    np.testing.assert_array_equal(grey28, before)


@pytest.mark.parametrize("severity", SEVERITIES)
@pytest.mark.parametrize("cid", IDS)
def test_rgb_non_square(cid, severity, rgb64x48):
    """IEEE-A1..A5 on a non-square 64x48x3 photo: uint8, same shape, input untouched."""
    before = rgb64x48.copy()
    out = apply_corruption(cid, rgb64x48, severity, np.random.default_rng(0))
    assert out.dtype == np.uint8
    assert out.shape == (64, 48, 3)
    np.testing.assert_array_equal(rgb64x48, before)


@pytest.mark.parametrize("cid", IDS)
@pytest.mark.parametrize("shape", [(28, 28), (1, 1), (2, 3, 3), (5, 9, 1), (9, 5), (33, 17, 3)])
def test_odd_and_tiny_shapes(cid, shape):
    """IEEE-A1..A5 small-image handling (fog map crop, kernel caps, glass-blur border): any
    size works."""
    rng = np.random.default_rng(3)
    img = rng.integers(0, 256, size=shape, dtype=np.uint8)
    for severity in (1, 5):
        out = apply_corruption(cid, img, severity, np.random.default_rng(1))
        assert out.dtype == np.uint8 and out.shape == shape


def _sized(h: int, w: int, channels: int | None) -> np.ndarray:
    img = _rgb(h, w) if h > 1 or w > 1 else np.array([[[200, 90, 30]]], dtype=np.uint8)
    if channels is None:
        return np.ascontiguousarray(img[:, :, 1])
    return img if channels == 3 else np.ascontiguousarray(img[:, :, 1:2])


@pytest.mark.parametrize("mode", [None, 1, 3], ids=["HxW", "HxWx1", "HxWx3"])
@pytest.mark.parametrize("size", [(1, 1), (7, 3), (37, 61), (224, 224), (300, 200)],
                         ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("cid", IDS)
def test_any_image_size(cid, size, mode):
    """IEEE-A1..A5 at any size: non-square, tiny and large, grey (HxW, HxWx1) and RGB; uint8,
    same shape, input untouched, at severities 1 and 5 (every severity at 37x61)."""
    img = _sized(*size, mode)
    before = img.copy()
    for severity in SEVERITIES if size == (37, 61) else (1, 5):
        out = apply_corruption(cid, img, severity, np.random.default_rng(severity))
        assert out.dtype == np.uint8 and out.shape == img.shape, (cid, size, mode, severity)
    np.testing.assert_array_equal(img, before)


# ----------------------------------------------------------------------------- randomness

@pytest.mark.parametrize("cid", IDS)
def test_same_seed_same_output(cid, rgb64x48, grey28):
    """Reproducible: the same seed gives bit-identical output (IEEE-A1..A5)."""
    for img in (rgb64x48, grey28):
        a = apply_corruption(cid, img, 3, np.random.default_rng(1234))
        b = apply_corruption(cid, img, 3, np.random.default_rng(1234))
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("cid", STOCHASTIC)
def test_different_seed_different_output(cid, rgb64x48):
    """IEEE-A1..A5 stochastic corruptions: different seeds, different output."""
    a = apply_corruption(cid, rgb64x48, 3, np.random.default_rng(1))
    b = apply_corruption(cid, rgb64x48, 3, np.random.default_rng(2))
    assert not np.array_equal(a, b)


@pytest.mark.parametrize("cid", DETERMINISTIC)
def test_deterministic_corruptions_do_not_touch_rng(cid, rgb64x48):
    """IEEE-A1..A5 (DEG-5 deterministic): the rng's state is left as it was."""
    rng = np.random.default_rng(7)
    state = rng.bit_generator.state
    apply_corruption(cid, rgb64x48, 4, rng)
    assert rng.bit_generator.state == state


@pytest.mark.parametrize("cid", STOCHASTIC)
def test_stochastic_corruptions_use_the_given_rng(cid, rgb64x48):
    """IEEE-A1..A5 (DEG-5 stochastic): draws come from the rng passed in, never numpy's
    global RNG."""
    rng = np.random.default_rng(7)
    state = rng.bit_generator.state
    np.random.seed(0)
    global_state = np.random.get_state()[1].copy()
    apply_corruption(cid, rgb64x48, 4, rng)
    assert rng.bit_generator.state != state
    np.testing.assert_array_equal(np.random.get_state()[1], global_state)  # global RNG untouched


# ----------------------------------------------------------------------------- severity

@pytest.mark.parametrize("cid", IDS)
def test_severity_5_changes_more_than_severity_1(cid, rgb64):
    """Severity ordering on average (IEEE-A1..A5): MAD from the original, over 3 seeds."""
    def mean_mad(severity: int) -> float:
        return float(np.mean([_mad(apply_corruption(cid, rgb64, severity,
                                                    np.random.default_rng(s)), rgb64)
                              for s in range(3)]))
    assert mean_mad(5) > mean_mad(1)


# ----------------------------------------------------------------------------- semantics

def test_gaussian_noise_std_matches_table():
    """IEEE-A1 a): additive noise with the table's standard deviation (mid-grey, no clipping)."""
    img = np.full((128, 128, 3), 128, dtype=np.uint8)
    out = apply_corruption("gaussian_noise", img, 1, np.random.default_rng(0))
    std = (out.astype(np.float64) - 128).std() / 255.0
    assert std == pytest.approx(GAUSSIAN_NOISE_SIGMA[0], rel=0.05)


def test_impulse_noise_amount_matches_table():
    """IEEE-A1 c): salt-and-pepper hits the table's fraction of values, half 0 and half 255."""
    img = np.full((128, 128, 3), 128, dtype=np.uint8)
    out = apply_corruption("impulse_noise", img, 5, np.random.default_rng(0))
    hit = (out == 0) | (out == 255)
    assert hit.mean() == pytest.approx(IMPULSE_NOISE_AMOUNT[4], rel=0.05)
    assert (out == 255).sum() == pytest.approx((out == 0).sum(), rel=0.1)
    assert np.all(out[~hit] == 128)


def test_brightness_on_grey_adds_to_value(grey28):
    """IEEE-A3 d) / A4 a): grey V is the grey level itself, so brightness adds c (clipped)."""
    out = apply_corruption("brightness", grey28, 2, np.random.default_rng(0))
    expected = np.clip(grey28.astype(np.float64) + 0.2 * 255, 0, 255)
    assert np.abs(out - expected).max() <= 1


def test_brightness_keeps_hue_and_saturation(rgb64):
    """IEEE-A4 a): only V changes; unclipped pixels keep their HSV hue and saturation."""
    out = apply_corruption("brightness", rgb64, 1, np.random.default_rng(0))
    hsv_in = cv2.cvtColor(rgb64, cv2.COLOR_RGB2HSV).astype(int)
    hsv_out = cv2.cvtColor(out, cv2.COLOR_RGB2HSV).astype(int)
    ok = (hsv_in[..., 2] < 200) & (hsv_in[..., 1] > 60) & (hsv_in[..., 2] > 60)
    assert ok.sum() > 100
    assert np.median(np.abs(hsv_out[..., 0] - hsv_in[..., 0])[ok]) <= 1
    assert np.all(hsv_out[..., 2][ok] >= hsv_in[..., 2][ok])


def test_contrast_blends_toward_mean(rgb64):
    """IEEE-A4 b): the mean is kept, the spread shrinks to the table's fraction."""
    out = apply_corruption("contrast", rgb64, 1, np.random.default_rng(0)).astype(np.float64)
    src = rgb64.astype(np.float64)
    means = src.mean(axis=(0, 1))
    np.testing.assert_allclose(out.mean(axis=(0, 1)), means, atol=1.0)
    assert (out - means).std() == pytest.approx(0.4 * (src - means).std(), rel=0.05)


def test_pixelate_is_blocky(rgb64):
    """IEEE-A4 d): down- then up-sampled: at severity 5 at most 16x16 distinct blocks."""
    out = apply_corruption("pixelate", rgb64, 5, np.random.default_rng(0))
    assert len(np.unique(out.reshape(-1, 3), axis=0)) <= 16 * 16


def test_jpeg_compression_loses_detail(rgb64, grey28):
    """IEEE-A4 e): lossy, and stronger at lower quality."""
    for img in (rgb64, grey28):
        mads = [_mad(apply_corruption("jpeg_compression", img, s, np.random.default_rng(0)), img)
                for s in (1, 5)]
        assert 0 < mads[0] < mads[1]


def test_affine_fills_outside_with_black():
    """IEEE-A4 c): pixels mapped from outside the field of view are the constant 0."""
    img = np.full((64, 64, 3), 255, dtype=np.uint8)
    for seed in range(5):
        out = apply_corruption("affine", img, 5, np.random.default_rng(seed))
        assert (out.max(axis=2) == 0).mean() > 0.01


def test_occlusion_area_grows_with_severity():
    """IEEE-A5: one rectangle covering about the table's fraction of the image."""
    img = np.zeros((64, 48, 3), dtype=np.uint8)
    for severity, frac in zip(SEVERITIES, OCCLUSION_AREA, strict=True):
        for seed in range(5):
            out = apply_corruption("occlusion", img, severity, np.random.default_rng(seed))
            covered = (out.max(axis=2) > 0).mean()
            assert covered == pytest.approx(frac, abs=0.02), (severity, seed)


def test_fog_brightens_dark_images():
    """IEEE-A3 c): fog adds a plasma layer; on a black image it's a non-constant haze."""
    img = np.zeros((40, 70, 3), dtype=np.uint8)
    img[10:20, 10:30] = 200
    out = apply_corruption("fog", img, 3, np.random.default_rng(0))
    assert out[:5].std() > 0


# ----------------------------------------------------------------------------- validation

@pytest.mark.parametrize("severity", [0, 6, -1, True, 2.0, "3", None])
def test_bad_severity(severity, rgb64x48):
    """IEEE-M7: a severity outside the integers 1..5 is refused, naming the field."""
    with pytest.raises(InvalidArgument) as ei:
        apply_corruption("gaussian_noise", rgb64x48, severity, np.random.default_rng(0))
    assert ei.value.violations[0].field == "severity"
    assert "1..5" in ei.value.violations[0].description


def test_numpy_integer_severity_is_accepted(rgb64x48):
    """IEEE-M7: a numpy integer severity is an integer."""
    out = apply_corruption("contrast", rgb64x48, np.int64(2), np.random.default_rng(0))
    assert out.shape == rgb64x48.shape


def test_unknown_corruption(rgb64x48):
    """IEEE-P3: an unknown corruption id is refused, listing the known ones."""
    with pytest.raises(InvalidArgument) as ei:
        apply_corruption("frostbite", rgb64x48, 1, np.random.default_rng(0))
    assert ei.value.violations[0].field == "perturbation_id"
    assert "frostbite" in ei.value.violations[0].description
    assert "gaussian_noise" in ei.value.violations[0].description


@pytest.mark.parametrize("image", [
    np.zeros((8, 8, 3), dtype=np.float32),
    np.zeros((8, 8), dtype=np.float64),
    np.zeros((8, 8, 3), dtype=np.uint16),
    np.zeros((8, 8, 4), dtype=np.uint8),
    np.zeros((8, 8, 2), dtype=np.uint8),
    np.zeros((8,), dtype=np.uint8),
    np.zeros((2, 8, 8, 3), dtype=np.uint8),
    np.zeros((0, 8, 3), dtype=np.uint8),
    [[0, 1], [2, 3]],
])
def test_bad_image(image):
    """IEEE-A1..A5: only uint8 HxW, HxWx1, HxWx3 images of at least 1x1 are taken."""
    with pytest.raises(InvalidArgument) as ei:
        apply_corruption("gaussian_noise", image, 1, np.random.default_rng(0))
    assert ei.value.violations[0].field == "image"


# ----------------------------------------------------------------------------- speed

def test_glass_blur_is_vectorised():
    """IEEE-A2 b): local pixel swaps are vectorised; 224x224x3 at severity 5 well under 0.5 s."""
    img = _rgb(224, 224)
    apply_corruption("glass_blur", img, 5, np.random.default_rng(0))   # warm-up
    best = float("inf")
    for seed in range(3):
        t0 = time.perf_counter()
        apply_corruption("glass_blur", img, 5, np.random.default_rng(seed))
        best = min(best, time.perf_counter() - t0)
    assert best < 0.5
