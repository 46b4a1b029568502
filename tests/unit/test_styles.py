"""Unit tests of the style changes, IEEE-A6 (sketch, oil painting, "Picasso" = cubist,
"Mondrian"), at the five severities of IEEE-M7, and of the ``neural_style`` slot for a
user-supplied TorchScript style-transfer model.

Checked: the catalogue entries (spec.py contract); shape, dtype and range on RGB and grey,
square, non-square and tiny images; the input is never modified; seeded reproducibility; the
distance from the original grows from severity 1 to 5 on real photos and Fashion-MNIST; each
style shows the traits it claims (a grey pencil drawing, edge-preserving paint, outlined facets,
palette rectangles between black lines); the neural slot loads a real TorchScript file through
the real code path, blends by severity, and names ``params.model_path`` in every error.
``render_style_sheet`` (also ``python tests/unit/test_styles.py OUT_DIR``) draws a photo under
every style for a person to look at.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import MappingProxyType

import cv2
import numpy as np
import pytest
import torch
from fortis.services.common.errors import InvalidArgument
from fortis.services.perturbation import styles
from fortis.services.perturbation.spec import ApplyContext
from fortis.services.perturbation.style_models import StyleModels
from fortis.services.perturbation.styles import (
    MONDRIAN_LINE_RGB,
    MONDRIAN_PALETTE,
    NEURAL_BLEND,
    SPECS,
    STYLES,
    apply_style,
    check_severity,
    load_style_model,
)
from skimage import data

CLASSICAL = ["sketch", "oil_painting", "cubist", "mondrian"]
STOCHASTIC = [s.id for s in SPECS if s.stochastic]
SEVERITIES = (1, 2, 3, 4, 5)


def _photo(name: str, scale: float) -> np.ndarray:
    return np.ascontiguousarray(cv2.resize(getattr(data, name)(), None, fx=scale, fy=scale,
                                           interpolation=cv2.INTER_AREA))


def _style(sid: str, image: np.ndarray, severity: int, seed: int = 0,
           models: StyleModels | None = None, **params: object) -> np.ndarray:
    return apply_style(sid, image, severity, np.random.default_rng(seed), params or None,
                       models=models)


def _images() -> dict[str, np.ndarray]:
    return {
        "rgb64": _photo("astronaut", 0.125),
        "rgb48x80": np.ascontiguousarray(cv2.resize(data.coffee(), (80, 48),
                                                    interpolation=cv2.INTER_AREA)),
        "grey28": np.ascontiguousarray(cv2.resize(data.camera(), (28, 28),
                                                  interpolation=cv2.INTER_AREA)),
        "grey36x20x1": np.ascontiguousarray(cv2.resize(data.camera(), (20, 36))[:, :, None]),
        "rgb5x7": np.random.default_rng(3).integers(0, 256, (5, 7, 3), dtype=np.uint8),
        "rgb2x3": np.random.default_rng(4).integers(0, 256, (2, 3, 3), dtype=np.uint8),
        "rgb1x1": np.array([[[10, 200, 90]]], np.uint8),
        "grey1x1": np.array([[77]], np.uint8),
    }


IMAGES = _images()


@pytest.fixture(scope="module")
def real_images() -> list[np.ndarray]:
    photos = [_photo("astronaut", 0.3), _photo("chelsea", 0.35), _photo("coffee", 0.3)]
    try:
        from fortis.adapters.torch_models.datasets import load_fashion_mnist
        fm, _ = load_fashion_mnist("test", limit=8)
    except Exception as exc:   # the apt dataset is missing on this machine
        pytest.skip(f"Fashion-MNIST not available: {exc}")
    return photos + [np.ascontiguousarray(x) for x in fm]


def _dist(a: np.ndarray, b: np.ndarray) -> float:
    """Root-mean-square difference (L2 / sqrt(size)), comparable across image sizes."""
    return float(np.linalg.norm(a.astype(np.float64) - b.astype(np.float64)) / np.sqrt(a.size))


# ---------------------------------------------------------------------------------------------
# Catalogue entries (spec.py contract)
# ---------------------------------------------------------------------------------------------

def test_the_ieee_a6_styles_and_the_neural_slot():
    assert [s.id for s in SPECS] == ["sketch", "oil_painting", "cubist", "mondrian",
                                     "neural_style"]
    assert set(STYLES) == {s.id for s in SPECS}


@pytest.mark.parametrize("sid", list(STYLES))
def test_spec_fields(sid):
    s = STYLES[sid]
    assert s.kind == "style" and s.family == "style" and s.refs == ("IEEE-A6",)
    assert s.level_kind == "severity" and s.levels == SEVERITIES
    assert len(s.level_table) == 5 and s.level_table_doc and s.description
    assert s.characterisation.scope in ("global", "local")
    assert s.characterisation.randomness in ("deterministic", "stochastic")
    assert s.characterisation.domain in ("colour", "pixel")
    if sid == "neural_style":
        # one of the two is required at use: an uploaded blob or a model-root path
        assert [(p.name, p.type, p.default) for p in s.params] == [
            ("model", "string", ""), ("model_path", "string", "")]
        assert s.level_table == NEURAL_BLEND
    else:
        assert s.params == ()
        assert all(isinstance(row, tuple) and len(row) == len(s.level_table[0])
                   for row in s.level_table)


# ---------------------------------------------------------------------------------------------
# Shape, dtype, input untouched, reproducibility
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", list(IMAGES))
@pytest.mark.parametrize("sid", CLASSICAL)
def test_shape_dtype_and_input_untouched(sid, kind):
    img = IMAGES[kind]
    before = img.copy()
    for sev in SEVERITIES:
        out = _style(sid, img, sev, seed=1)
        assert out.shape == img.shape and out.dtype == np.uint8, (sid, kind, sev)
        assert out.flags.c_contiguous and not np.shares_memory(out, img)
    np.testing.assert_array_equal(img, before)


@pytest.mark.parametrize("sid", CLASSICAL)
def test_reproducible_for_a_seed(sid):
    img = IMAGES["rgb48x80"]
    for sev in (1, 5):
        np.testing.assert_array_equal(_style(sid, img, sev, seed=9), _style(sid, img, sev, seed=9))


@pytest.mark.parametrize("sid", [s for s in STOCHASTIC if s in CLASSICAL])
def test_stochastic_styles_depend_on_the_seed(sid):
    img = IMAGES["rgb64"]
    assert not np.array_equal(_style(sid, img, 3, seed=1), _style(sid, img, 3, seed=2))


def test_oil_painting_is_deterministic_and_leaves_the_rng_alone():
    spec = STYLES["oil_painting"]
    rng = np.random.default_rng(5)
    state = rng.bit_generator.state
    out = spec.apply(IMAGES["rgb64"], 4, rng, ApplyContext())
    assert rng.bit_generator.state == state
    np.testing.assert_array_equal(out, _style("oil_painting", IMAGES["rgb64"], 4, seed=77))


# ---------------------------------------------------------------------------------------------
# Severity ordering on real images (IEEE-M7)
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("sid", CLASSICAL)
def test_distance_grows_from_severity_1_to_5(sid, real_images):
    """IEEE-M7: severity 1 is mild, 5 strong: the mean distance from the original over the
    photos and the Fashion-MNIST images grows with the severity."""
    dist = np.array([[_dist(_style(sid, im, sev, seed=k), im) for sev in SEVERITIES]
                     for k, im in enumerate(real_images)])
    mean = dist.mean(axis=0)
    assert np.all(np.diff(mean) > 0), (sid, mean.round(1).tolist())
    assert mean[0] > 1.0 and mean[-1] > 1.2 * mean[0]
    photos = dist[:3].mean(axis=0)
    assert np.all(np.diff(photos) > 0), (sid, photos.round(1).tolist())


# ---------------------------------------------------------------------------------------------
# Each style shows what it claims
# ---------------------------------------------------------------------------------------------

def test_sketch_is_a_grey_pencil_drawing_at_severity_5():
    img = _photo("chelsea", 0.3)
    out = _style("sketch", img, 5).astype(int)
    assert np.abs(out - out[:, :, :1]).max() <= 1                   # no colour left
    assert np.median(out) > 150                                     # mostly paper
    edges = cv2.Canny(cv2.cvtColor(img, cv2.COLOR_RGB2GRAY), 80, 160)
    near_edge = cv2.dilate(edges, np.ones((3, 3), np.uint8)) > 0
    dark = out[:, :, 0] < np.percentile(out[:, :, 0], 10)          # the pencil strokes
    assert (dark & near_edge).sum() / dark.sum() > near_edge.mean() + 0.2   # drawn on edges
    flat_black = np.zeros((32, 32, 3), np.uint8)                   # flat areas stay paper-light
    assert _style("sketch", flat_black, 5).mean() > 80
    mild = _style("sketch", img, 1).astype(int)
    assert np.abs(mild - mild[:, :, :1]).max() > 30                 # severity 1 keeps colour


def test_oil_painting_keeps_edges_and_flattens_texture():
    """Kuwahara strokes: a sharp step stays sharp (no blur across it), fine texture is
    smoothed into flat strokes (the median local 3x3 standard deviation falls)."""
    step = np.zeros((40, 60, 3), np.uint8)
    step[:, 30:] = 220
    out = _style("oil_painting", step, 5).astype(int)
    assert np.abs(out[:, :26] - 0).max() <= 2 and np.abs(out[:, 34:] - 220).max() <= 30

    def local_std(a: np.ndarray) -> float:
        g = cv2.cvtColor(a, cv2.COLOR_RGB2GRAY).astype(np.float32)
        m, m2 = cv2.blur(g, (3, 3)), cv2.blur(g * g, (3, 3))
        return float(np.median(np.sqrt(np.maximum(m2 - m * m, 0.0))))

    for name in ("coffee", "astronaut"):
        img = _photo(name, 0.3)
        assert local_std(_style("oil_painting", img, 5)) < 0.8 * local_std(img)


def test_cubist_facets_have_dark_outlines():
    img = _photo("astronaut", 0.3)
    out = _style("cubist", img, 5, seed=3).astype(np.float32) / 255
    outline = np.all(np.abs(out - np.array(styles.CUBIST_OUTLINE_RGB)) < 0.02, axis=2)
    assert 0.03 < outline.mean() < 0.5
    n_regions, _ = cv2.connectedComponents((~outline).astype(np.uint8), connectivity=4)
    assert n_regions - 1 >= 20                                      # many facets
    mild = _style("cubist", img, 1, seed=3)
    assert _dist(mild, img) < _dist(_style("cubist", img, 5, seed=3), img)


def test_mondrian_is_palette_rectangles_between_black_lines():
    img = _photo("astronaut", 0.3)
    out = _style("mondrian", img, 5, seed=2).astype(np.float32) / 255
    allowed = np.array(list(MONDRIAN_PALETTE.values()) + [MONDRIAN_LINE_RGB], np.float32)
    nearest = np.abs(out[:, :, None, :] - allowed[None, None]).max(axis=3).min(axis=2)
    assert (nearest < 0.01).mean() > 0.99                           # palette colours only
    line = np.all(np.abs(out - np.array(MONDRIAN_LINE_RGB)) < 0.01, axis=2)
    rows, cols = line.all(axis=1), line.all(axis=0)
    assert rows.any() or cols.any()                                 # a line across the canvas
    n, _ = cv2.connectedComponents((~line).astype(np.uint8), connectivity=4)
    assert 6 <= n - 1 <= 14                                         # about 14 rectangles
    # severity 1: the mean colours still dominate, so the picture is still there
    mild = _style("mondrian", img, 1, seed=2)
    small = cv2.resize(img, (16, 16), interpolation=cv2.INTER_AREA).astype(float)
    mild_small = cv2.resize(mild, (16, 16), interpolation=cv2.INTER_AREA).astype(float)
    assert np.corrcoef(small.ravel(), mild_small.ravel())[0, 1] > 0.8


# ---------------------------------------------------------------------------------------------
# neural_style: a real TorchScript file through the real code path
# ---------------------------------------------------------------------------------------------

class _Invert(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 1.0 - x


class _HalfSize(torch.nn.Module):
    """A 'style' network that returns half the spatial size (resized back by Fortis)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.avg_pool2d(x.flip(1), 2)


class _OneChannel(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=1, keepdim=True)


class _Fails(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.conv2d(x, torch.ones(1, 4, 1, 1))   # wants 4 channels


def _save(module: torch.nn.Module, path: Path) -> str:
    """Save under the model root (the test's tmp_path, see ``models``); the relative path
    a plan gives as ``model_path``."""
    torch.jit.save(torch.jit.script(module), str(path))
    return path.name


@pytest.fixture(autouse=True)
def models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> StyleModels:
    """The operator's model folder, handed in with the call (no environment to fall back on):
    model paths are relative to it, never any server path."""
    monkeypatch.delenv(styles.MODEL_ROOT_ENV, raising=False)
    return StyleModels(root=tmp_path)


def test_neural_style_blends_the_model_output_by_severity(tmp_path, models):
    path = _save(_Invert(), tmp_path / "invert.pt")
    img = IMAGES["rgb48x80"]
    for sev, w in zip(SEVERITIES, NEURAL_BLEND, strict=True):
        out = _style("neural_style", img, sev, models=models, model_path=path)
        expected = (1 - w) * img.astype(float) + w * (255.0 - img)
        assert np.abs(out - expected).max() <= 0.5 + 1e-6, sev
    np.testing.assert_array_equal(
        _style("neural_style", img, 5, models=models, model_path=path), 255 - img)
    grey = IMAGES["grey36x20x1"]
    g = _style("neural_style", grey, 5, models=models, model_path=path)
    assert g.shape == grey.shape and np.abs(g.astype(int) - (255 - grey)).max() <= 1


def test_neural_style_resizes_other_output_sizes(tmp_path, models):
    path = _save(_HalfSize(), tmp_path / "half.pt")
    img = IMAGES["rgb48x80"]
    out = _style("neural_style", img, 5, models=models, model_path=path)
    assert out.shape == img.shape
    assert abs(float(out[:, :, 0].mean()) - float(img[:, :, 2].mean())) < 3   # channels flipped


def test_neural_style_model_is_cached_and_reloaded_when_changed(tmp_path, models):
    p = tmp_path / "m.pt"
    _save(_Invert(), p)
    a = load_style_model({"model_path": "m.pt"}, models)
    assert load_style_model({"model_path": "m.pt"}, models) is a
    _save(_HalfSize(), p)
    os.utime(p, ns=(p.stat().st_atime_ns, p.stat().st_mtime_ns + 10_000_000))
    assert load_style_model({"model_path": "m.pt"}, models) is not a


def test_model_root_from_the_environment(tmp_path, monkeypatch):
    sub = tmp_path / "models"
    sub.mkdir()
    _save(_Invert(), sub / "inv.pt")
    monkeypatch.setenv(styles.MODEL_ROOT_ENV, str(sub))
    # no store in the context, or one without a root: the environment's folder
    assert styles.model_root() == sub and styles.model_root(StyleModels()) == sub
    assert load_style_model({"model_path": "inv.pt"}) is not None
    assert load_style_model({"model_path": "inv.pt"}, StyleModels()) is not None
    # a root handed in wins over the environment
    assert styles.model_root(StyleModels(root=tmp_path)) == tmp_path
    with pytest.raises(InvalidArgument, match="not found under the model root"):
        load_style_model({"model_path": "inv.pt"}, StyleModels(root=tmp_path))


def test_each_call_reads_the_models_its_context_carries(tmp_path):
    """Two calls in one process with different stores (two tenants, two deployments in a
    test) each see only their own: the store is part of the call, not process state."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    _save(_Invert(), a / "only_a.pt")
    img = IMAGES["rgb64"]
    out = _style("neural_style", img, 5, models=StyleModels(root=a), model_path="only_a.pt")
    np.testing.assert_array_equal(out, 255 - img)
    with pytest.raises(InvalidArgument, match="not found under the model root"):
        _style("neural_style", img, 5, models=StyleModels(root=b), model_path="only_a.pt")
    with pytest.raises(InvalidArgument, match="not configured a model root"):
        _style("neural_style", img, 5, model_path="only_a.pt")   # no store, no environment


def test_uploaded_models_come_only_from_the_store_in_the_context(tmp_path):
    """``model`` (an uploaded blob id) is resolved by the store's ``blobs``, bound to one
    tenant (as the perturbation servicer binds the caller): that tenant's upload is used,
    another tenant's store refuses it naming params.model, and a store without ``blobs``
    refuses any id."""
    import functools

    from fortis.infra.storage.blobs import BlobStore, iter_chunks

    _save(_Invert(), tmp_path / "invert.pt")
    data = (tmp_path / "invert.pt").read_bytes()
    store = BlobStore(tmp_path / "blobs")
    try:
        up = store.begin("a", kind="model", size=len(data))
        for chunk in iter_chunks(data):
            up.write(chunk)
        blob = up.finish()[0].blob_id
        img = IMAGES["rgb64"]

        def of(tenant: str) -> StyleModels:
            return StyleModels(blobs=functools.partial(store.path_of, tenant, kind="model"))

        out = _style("neural_style", img, 5, models=of("a"), model=blob)
        np.testing.assert_array_equal(out, 255 - img)
        for models, says in ((of("b"), "no such upload"),
                             (None, "uploaded models are not available on this server"),
                             (StyleModels(root=tmp_path),
                              "uploaded models are not available on this server")):
            with pytest.raises(InvalidArgument) as e:
                _style("neural_style", img, 5, models=models, model=blob)
            assert e.value.violations[0].field == "params.model"
            assert says in e.value.message, e.value.message
    finally:
        store.close()


@pytest.mark.parametrize("case", ["missing", "empty", "no_file", "directory", "not_torchscript",
                                  "state_dict", "wrong_channels", "forward_fails"])
def test_neural_style_errors_name_the_model_path(case, tmp_path, models):
    params: dict[str, object]
    if case == "missing":
        params = {}
    elif case == "empty":
        params = {"model_path": "  "}
    elif case == "no_file":
        params = {"model_path": "nope.pt"}
    elif case == "directory":
        (tmp_path / "sub").mkdir()
        params = {"model_path": "sub"}
    elif case == "not_torchscript":
        (tmp_path / "junk.pt").write_bytes(b"not a model")
        params = {"model_path": "junk.pt"}
    elif case == "state_dict":
        torch.save(torch.nn.Conv2d(3, 3, 1).state_dict(), tmp_path / "sd.pt")
        params = {"model_path": "sd.pt"}
    elif case == "wrong_channels":
        params = {"model_path": _save(_OneChannel(), tmp_path / "one.pt")}
    else:
        params = {"model_path": _save(_Fails(), tmp_path / "fails.pt")}
    spec = STYLES["neural_style"]
    with pytest.raises(InvalidArgument) as e:
        spec.apply(IMAGES["rgb64"], 3, np.random.default_rng(0),
                   ApplyContext(params=MappingProxyType(params), style_models=models))
    assert e.value.violations[0].field == "params.model_path", e.value.message


# ---------------------------------------------------------------------------------------------
# Errors name the field
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [0, 6, 2.5, True, "3", None, float("nan")])
def test_bad_severity(bad):
    with pytest.raises(InvalidArgument) as e:
        _style("cubist", IMAGES["rgb64"], bad)
    assert e.value.violations[0].field == "severity"


def test_severity_accepts_integral_numbers():
    assert check_severity(np.int64(3)) == 3 and check_severity(5.0) == 5


@pytest.mark.parametrize("bad", [np.zeros((4, 4), np.float32), np.zeros((4, 4, 4), np.uint8),
                                 np.zeros((4, 0), np.uint8), [[1, 2]]])
def test_bad_image(bad):
    with pytest.raises(InvalidArgument) as e:
        _style("mondrian", bad, 1)
    assert e.value.violations[0].field == "image"


def test_unknown_style_or_parameter():
    with pytest.raises(InvalidArgument) as e:
        _style("picasso", IMAGES["rgb64"], 1)
    assert e.value.violations[0].field == "perturbation_id"
    with pytest.raises(InvalidArgument) as e:
        _style("sketch", IMAGES["rgb64"], 1, pencil="2B")
    assert e.value.violations[0].field == "params.pencil"


# ---------------------------------------------------------------------------------------------
# A sheet to look at
# ---------------------------------------------------------------------------------------------

def render_style_sheet(image: np.ndarray, out_path: Path, seed: int = 7) -> Path:
    """Write one PNG: a row per classical style, the original then severities 1..5."""
    out_path.parent.mkdir(parents=True, exist_ok=True)
    rgb = image if image.ndim == 3 and image.shape[2] == 3 else \
        np.repeat(image.reshape(image.shape[0], image.shape[1], 1), 3, axis=2)
    rows = []
    for sid in CLASSICAL:
        tiles = [rgb] + [_style(sid, rgb, sev, seed=seed) for sev in SEVERITIES]
        row = np.hstack([np.pad(t, ((2, 2), (2, 2), (0, 0)), constant_values=255) for t in tiles])
        bar = np.full((18, row.shape[1], 3), 255, np.uint8)
        cv2.putText(bar, f"{sid}: original, severity 1..5", (4, 13), cv2.FONT_HERSHEY_SIMPLEX,
                    0.4, (0, 0, 0), 1, cv2.LINE_AA)
        rows.append(np.vstack([bar, row]))
    cv2.imwrite(str(out_path), np.vstack(rows)[:, :, ::-1])
    return out_path


def test_render_style_sheet(tmp_path):
    path = render_style_sheet(_photo("coffee", 0.25), tmp_path / "styles.png")
    sheet = cv2.imread(str(path))
    assert sheet is not None and sheet.shape[0] > 300 and sheet.shape[1] > 600


if __name__ == "__main__":   # python tests/unit/test_styles.py OUT_DIR [skimage photo]
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "style-sheets")
    name = sys.argv[2] if len(sys.argv) > 2 else "astronaut"
    photo = getattr(data, name)()
    photo = cv2.resize(photo, (224, int(224 * photo.shape[0] / photo.shape[1])),
                       interpolation=cv2.INTER_AREA)
    print(render_style_sheet(photo, target / f"styles_{name}.png"))


def test_neural_style_takes_exactly_one_model_source_and_the_contract_says_so():
    """IEEE-A6 neural_style: ``model`` (an uploaded blob) and ``model_path`` (under
    the operator's model root) are alternatives, ``one_of`` group "model": neither or both is
    refused at validation naming the fields, and ListPerturbations carries the group so the
    evaluation service (which sees the catalogue only over the contract) refuses it too."""
    import pytest
    from fortis.perturbation.v1 import perturbation_pb2 as ppb
    from fortis.services.common.errors import InvalidArgument
    from fortis.services.common.params import validate_params
    from fortis.services.evaluation.clients import catalogue_from_messages
    from fortis.services.perturbation.registry import PERTURBATIONS
    from fortis.services.perturbation.servicer import PerturbationServicer

    spec = PERTURBATIONS["neural_style"]
    for bad in ({}, {"model": "sha256:" + "0" * 64, "model_path": "m.pt"}):
        with pytest.raises(InvalidArgument) as exc:
            validate_params(spec, bad)
        assert {v.field for v in exc.value.violations} == {"params.model", "params.model_path"}
    assert validate_params(spec, {"model_path": "m.pt"})["model_path"] == "m.pt"
    sv = PerturbationServicer(proxy_stub=None, surrogate_loader=lambda *a: None)
    listed = sv.ListPerturbations(ppb.ListPerturbationsRequest(page_size=1000), None).perturbations
    entry = next(p for p in listed if p.id == "neural_style")
    assert {p.name: p.one_of for p in entry.parameters} == {"model": "model", "model_path": "model"}
    seen = catalogue_from_messages(listed, []).perturbations["neural_style"]
    with pytest.raises(InvalidArgument):
        validate_params(seen, {})
