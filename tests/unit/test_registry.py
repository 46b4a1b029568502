"""Every perturbation of the one catalogue: at every severity / level / a grid of
epsilons it keeps shape, dtype and value range, is reproducible for a seed, and the
incremental operators (DEG-1) move further from the original as the level rises. Also the
registry's own rules: ids unique, characterisation (DEG-5) set, level tables sized to the
levels with every component named (``named_level_table``, listed by ``describe``), precise
errors for bad levels and parameters, and the example sheets render."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import replace

import numpy as np
import pytest
from fortis.services.common.errors import InvalidArgument
from fortis.services.common.seeding import rng_for
from fortis.services.perturbation import engine
from fortis.services.perturbation.catalogue import list_catalogue
from fortis.services.perturbation.registry import (
    PERTURBATIONS,
    apply_perturbation,
    check_level,
    describe,
    iterate_levels,
    make_context,
    named_level_table,
    perturbation_spec,
)
from fortis.services.perturbation.spec import ApplyContext

EPSILONS = (0.0, 0.1, 0.5, 1.0)
PLAIN = [s for s in PERTURBATIONS.values() if not s.needs_model and not
         any(p.needs_input for p in s.params)]


def _photo(h: int = 40, w: int = 56) -> np.ndarray:
    """A small natural-looking RGB image: smooth gradients, an edge and texture."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    r = 120 + 80 * np.sin(x / 7.0) * np.cos(y / 9.0)
    g = 60 + 2.5 * x
    b = np.where((x - w / 2) ** 2 + (y - h / 2) ** 2 < (min(h, w) / 3) ** 2, 200, 40)
    tex = np.random.default_rng(0).integers(0, 30, (h, w))
    return np.clip(np.stack([r + tex, g, b], axis=2), 0, 255).astype(np.uint8)


def _levels(spec) -> list:
    if spec.level_kind == "epsilon":
        return list(EPSILONS)
    return list(spec.levels)


def test_registry_shape():
    assert len(PERTURBATIONS) >= 19 + 4 + 14 + 15   # ImageNet-C 19, styles, DEG ops, PER-1
    kinds = {s.kind for s in PERTURBATIONS.values()}
    assert kinds == {"corruption", "style", "degradation", "property"}
    for s in PERTURBATIONS.values():
        assert s.refs and s.description, s.id
        if s.level_kind != "epsilon":
            assert len(s.level_table) == len(s.levels), s.id
        if s.kind == "degradation":
            assert s.levels == tuple(range(1, 31)) and s.iterate is not None, s.id
    ids = [it["id"] for it in list_catalogue()]
    assert len(ids) == len(set(ids))
    for name in ("gaussian_noise", "frost", "spatter", "glass_blur", "rotation", "translation",
                 "scale", "shear", "affine", "occlusion"):
        assert name in PERTURBATIONS, name


@pytest.mark.parametrize("spec", list(PERTURBATIONS.values()), ids=lambda s: s.id)
def test_every_level_table_is_named(spec):
    """Registry-wide: at every level, one snake_case name per component of the entry (a
    scalar: one; a tuple: one each; a mapping: its keys), unique within the level, every value
    a JSON number, string or bool or a list of numbers (never a tuple), and ``describe`` lists
    exactly that table."""
    named = named_level_table(spec)
    assert len(named) == len(spec.level_table), spec.id
    for level, (entry, row) in enumerate(zip(spec.level_table, named, strict=True), start=1):
        if isinstance(entry, Mapping):
            expected = len(entry)
            assert list(row) == [str(k) for k in entry], (spec.id, level)
        else:
            expected = len(entry) if isinstance(entry, tuple | list) else 1
            assert tuple(row) == spec.level_fields, (spec.id, level)
        assert len(row) == expected, (spec.id, level, row)
        for name, value in row.items():
            assert re.fullmatch(r"[a-z][a-z0-9]*(_[a-z0-9]+)*", name), (spec.id, name)
            assert not isinstance(value, tuple), (spec.id, name)
            assert isinstance(value, bool | int | float | str) or (
                isinstance(value, list) and all(isinstance(v, int | float) for v in value)), \
                (spec.id, name, value)
    assert describe(spec)["level_table"] == named
    assert json.loads(json.dumps(describe(spec)["level_table"])) == named


def test_named_level_table_examples():
    """The names come from each table's documentation; tuples are split, ranges are lists."""
    affine = named_level_table(PERTURBATIONS["affine"])
    assert affine[0] == {"rotation_deg": 5.0, "scale_change": 0.05, "shear_deg": 3.0,
                         "translation_fraction": 0.02}
    assert named_level_table(PERTURBATIONS["defocus_blur"])[4] == {"disk_radius_px": 10,
                                                                   "alias_sigma_px": 0.5}
    assert named_level_table(PERTURBATIONS["jpeg_compression"])[0] == {"jpeg_quality": 25}
    assert named_level_table(PERTURBATIONS["random_boxes"])[0]["side_px"] == [2, 5]
    assert named_level_table(PERTURBATIONS["per_fog"])[0]["strength"] == 3.5


def test_unnamed_or_misnamed_level_tables_are_refused():
    """A level table whose components cannot all be named is a catalogue bug, refused when the
    spec is built (as a duplicate id is), not listed as an unnamed tuple."""
    affine = PERTURBATIONS["affine"]
    with pytest.raises(ValueError, match="component"):
        replace(affine, level_fields=affine.level_fields[:3])
    with pytest.raises(ValueError, match="snake_case"):
        replace(affine, level_fields=("Rotation", "scale_change", "shear_deg", "shift"))
    with pytest.raises(ValueError, match="snake_case"):
        replace(affine, level_fields=("a", "a", "b", "c"))
    with pytest.raises(ValueError, match="mappings"):
        replace(PERTURBATIONS["posterise"], level_fields=("bins",))


@pytest.mark.parametrize("spec", PLAIN, ids=lambda s: s.id)
@pytest.mark.parametrize("shape", [(40, 56, 3), (33, 21, 1), (17, 29)], ids=["rgb", "grey1", "grey2"])
def test_every_level_keeps_shape_dtype_range_and_is_seeded(spec, shape):
    img = _photo(shape[0], shape[1])
    if len(shape) == 2:
        img = img[:, :, 1]
    elif shape[2] == 1:
        img = img[:, :, 1:2]
    img = np.ascontiguousarray(img)
    before = img.copy()
    for lv in _levels(spec):
        a = apply_perturbation(spec.id, img, lv, rng_for(7, spec.id))
        b = apply_perturbation(spec.id, img, lv, rng_for(7, spec.id))
        assert a.shape == img.shape and a.dtype == np.uint8, (spec.id, lv)
        assert np.array_equal(a, b), f"{spec.id} at {lv} is not reproducible for a seed"
    assert np.array_equal(img, before), f"{spec.id} modified its input"


@pytest.mark.parametrize("spec", [s for s in PLAIN if s.kind == "degradation"], ids=lambda s: s.id)
def test_incremental_operators_move_away_and_iterate_matches_apply(spec):
    """DEG-1: level L = the operator applied to level L-1; the distance from the original
    grows with the level (non-decreasing, and level 30 strictly further than level 1)."""
    img = _photo(32, 32)
    seq = list(iterate_levels(spec.id, img, 30, rng_for(3, spec.id)))
    assert len(seq) == 30
    for lv in (1, 7, 30):
        assert np.array_equal(seq[lv - 1], apply_perturbation(spec.id, img, lv, rng_for(3, spec.id))), lv
    dist = [0.0] + [float(np.abs(s.astype(np.int16) - img).mean()) for s in seq]
    assert dist[30] > dist[1] > 0, spec.id
    # Allow a wobble of 3% of the largest distance: stochastic operators that saturate on a
    # small image (random pixel exchange: fully shuffled) and re-quantising ones (JPEG)
    # fluctuate around their plateau; no real step back. tests/unit/test_degradation.py checks
    # the strict trend averaged over real photos.
    tol = 0.03 * max(dist)
    assert all(dist[i + 1] >= dist[i] - tol for i in range(30)), (spec.id, dist)


@pytest.mark.parametrize("spec", [s for s in PERTURBATIONS.values() if s.kind == "property"],
                         ids=lambda s: s.id)
def test_properties_start_at_identity(spec):
    """PER-1/PER-3: epsilon = 0 is the original image, epsilon = 1 changes it."""
    img = _photo()
    assert np.array_equal(apply_perturbation(spec.id, img, 0.0, rng_for(1, spec.id)), img)
    assert not np.array_equal(apply_perturbation(spec.id, img, 1.0, rng_for(1, spec.id)), img)


def test_bad_levels_and_params_name_the_field():
    g = perturbation_spec("gaussian_noise")
    with pytest.raises(InvalidArgument) as ei:
        check_level(g, 0)
    assert ei.value.violations[0].field == "severity"
    deg = next(s for s in PLAIN if s.kind == "degradation")
    with pytest.raises(InvalidArgument, match="0..30"):
        check_level(deg, 31)
    prop = next(s for s in PERTURBATIONS.values() if s.kind == "property")
    for bad in (-0.1, 1.01, float("nan"), "0.5", True):
        with pytest.raises(InvalidArgument) as ei:
            check_level(prop, bad)
        assert ei.value.violations[0].field == "epsilon"
    with pytest.raises(InvalidArgument) as ei:
        perturbation_spec("nope")
    assert ei.value.violations[0].field == "perturbation_id"
    with pytest.raises(InvalidArgument) as ei:
        make_context(g, {"bogus": 1})
    assert ei.value.violations[0].field == "params.bogus"
    with pytest.raises(InvalidArgument) as ei:
        apply_perturbation("gaussian_noise", np.zeros((4, 4, 3), np.float32), 1, rng_for(0))
    assert ei.value.violations[0].field == "image"


def test_engine_perturb_keys_the_generator_per_image_not_per_batch():
    """Same image id -> same pixels whatever the batch; incremental levels replay."""
    img = _photo()
    a = engine.perturb("gaussian_noise", 3, 11, [("x", img), ("y", img)])
    b = engine.perturb("gaussian_noise", 3, 11, [("y", img)])
    assert np.array_equal(a[1], b[0]) and not np.array_equal(a[0], a[1])
    deg = next(s for s in PLAIN if s.kind == "degradation" and s.stochastic)
    l5 = engine.perturb(deg.id, 5, 11, [("x", img)])[0]
    seq = list(iterate_levels(deg.id, img, 5, engine.perturbation_rng(11, deg, 5, "x")))
    assert np.array_equal(l5, seq[-1])


def test_white_box_operator_needs_model_and_label(fmnist_surrogate, fmnist_test_images):
    spec = next(s for s in PERTURBATIONS.values() if s.needs_model)
    images, labels = fmnist_test_images
    with pytest.raises(InvalidArgument) as ei:
        make_context(spec)
    assert ei.value.violations[0].field == "surrogate"
    ctx = make_context(spec, model=fmnist_surrogate)
    with pytest.raises(InvalidArgument) as ei:
        apply_perturbation(spec.id, images[0], 3, rng_for(0), ctx)
    assert ei.value.violations[0].field == "labels"
    out = apply_perturbation(spec.id, images[0], 3, rng_for(0),
                             ApplyContext(params=ctx.params, model=fmnist_surrogate, label=int(labels[0])))
    assert out.shape == images[0].shape and out.dtype == np.uint8


def test_example_sheets_render(tmp_path):
    from fortis.services.perturbation.sheets import write_sheets
    paths = write_sheets(tmp_path, image=_photo(64, 64), size=48)
    assert sorted(p.name for p in paths) == ["corruption.png", "degradation.png", "property.png", "style.png"]
    import cv2
    for p in paths:
        sheet = cv2.imread(str(p))
        assert sheet is not None and sheet.shape[0] > 48 and sheet.shape[1] > 48 * 5
