"""Style changes (IEEE Std 3129-2023, 4.2 and Annex A.1: IEEE-A6), each at five severities.

Requirements implemented (see SPEC.md):

    IEEE-A6  style   sketch        pencil sketch (colour dodge + pencil hatching)
                     oil_painting  oil paint (Kuwahara strokes + impasto relief + saturation)
                     cubist        "Picasso": the image broken into facets (Voronoi cells cut
                                   by straight lines), each shifted and flattened, bold outlines
                     mondrian      "Mondrian": a rectilinear partition with thick black lines,
                                   areas in primary colours, white, grey and black
                     neural_style  slot for a user-supplied style-transfer model (TorchScript)

The first four are classical image processing (numpy + OpenCV): no network, no weights. Their
per-severity parameters are the visible tables of ``style_painters.py`` (index 0 = severity 1,
mild; 5 = strong).
Sizes are fractions of the image's shorter side ``m`` (never below 1 px), so a style looks
the same on a 224-px photo and a 512-px one; on a 28x28 Fashion-MNIST image the details are
coarse but every style stays well-defined (and any size >= 1x1 works).

``neural_style`` needs a model the user supplies (weights cannot be downloaded here): a
TorchScript file (``torch.jit.save``) whose forward takes a float tensor N x 3 x H x W in
[0, 1] and returns one of the same layout in [0, 1] (a different spatial size is resized back
bilinearly; values are clipped). Its path is the ``model_path`` parameter, relative to the
operator's model root (the call's ``ApplyContext.style_models``, else ``FORTIS_MODEL_ROOT``;
no root, an absolute path, ``..`` or a symlink out of the root are refused, so no tenant can
make the server open an arbitrary file); ``model`` names a MODEL blob the calling tenant
uploaded, resolved by the same ``style_models``. The severity is the blend weight between the
original and the stylised image (``NEURAL_BLEND``). A missing, unreadable or unloadable file,
or a model whose output is not N x 3 x h x w, raises ``InvalidArgument`` on the field naming
it (``params.model_path`` or ``params.model``).

Images: uint8 HxW, HxWx1 or HxWx3 (RGB), any size; the result has the same shape and dtype and
the input is never modified. Grey images are processed as achromatic RGB and the result is
returned as its luminance. Randomness (sketch's pencil grain, cubist facets, mondrian cuts)
comes only from the ``numpy.random.Generator`` passed in; oil_painting and neural_style never
use it. Domain code: no gRPC.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
from fortis.services.common.errors import InvalidArgument
from fortis.services.common.paths import confined_file
from fortis.services.perturbation.spec import (
    ApplyContext,
    ApplyFn,
    Characterisation,
    Param,
    PerturbationSpec,
    characterisation,
    check_image,
)
from fortis.services.perturbation.style_models import MODEL_ROOT_ENV, ModelBlobs, StyleModels
from fortis.services.perturbation.style_painters import (
    CUBIST_BRIGHTNESS_JITTER,
    CUBIST_EARTH,
    CUBIST_MIN_FACET_AREA,
    CUBIST_OUTLINE_RGB,
    CUBIST_PARAMS,
    MONDRIAN_HUES,
    MONDRIAN_LINE_RGB,
    MONDRIAN_LUMA,
    MONDRIAN_PALETTE,
    MONDRIAN_PARAMS,
    NEURAL_BLEND,
    OIL_PARAMS,
    SKETCH_HATCH_ANGLE_DEG,
    SKETCH_HATCH_LENGTH,
    SKETCH_PAPER,
    SKETCH_PARAMS,
    Params,
    _cubist,
    _luma,
    _mondrian,
    _oil_painting,
    _sketch,
    check_severity,
)

#: The styles' public names, the classical styles' tables defined in ``style_painters.py``
#: and importable from here as before.
__all__ = [
    "CUBIST_BRIGHTNESS_JITTER", "CUBIST_EARTH", "CUBIST_MIN_FACET_AREA", "CUBIST_OUTLINE_RGB",
    "CUBIST_PARAMS", "MODEL_ROOT_ENV", "MONDRIAN_HUES", "MONDRIAN_LINE_RGB", "MONDRIAN_LUMA",
    "MONDRIAN_PALETTE", "MONDRIAN_PARAMS", "NEURAL_BLEND", "OIL_PARAMS", "SKETCH_HATCH_ANGLE_DEG",
    "SKETCH_HATCH_LENGTH", "SKETCH_PAPER", "SKETCH_PARAMS", "SPECS", "STYLES", "ModelBlobs",
    "Params", "StyleFn", "StyleModels", "apply_style", "check_severity", "load_style_model",
    "model_root",
]


# ---------------------------------------------------------------------------------------------
# neural_style: a user-supplied TorchScript model
# ---------------------------------------------------------------------------------------------

_MODEL_LOCK = threading.Lock()
_MODEL_CACHE: dict[tuple[str, int, int], Any] = {}
_MODEL_CACHE_SIZE = 4


_MODEL_NOT_FOUND = "not found under the model root"
#: No store given: no uploaded models, the root from ``$FORTIS_MODEL_ROOT``.
_NO_STORE = StyleModels()


def model_root(models: StyleModels | None = None) -> Path | None:
    """The folder ``model_path`` is relative to: ``models.root``, else ``$FORTIS_MODEL_ROOT``
    (see :class:`StyleModels`); None when neither is set (``neural_style`` is then refused)."""
    return (models or _NO_STORE).model_root()


def _model_path(params: Params, models: StyleModels | None) -> tuple[Path, str]:
    """The model file and the field naming it: ``params.model`` (an uploaded MODEL blob of
    the calling tenant, through ``models.blobs``) or ``params.model_path`` confined to
    :func:`model_root`: relative, no ``..``, resolved (symlinks followed) inside the root;
    missing and outside give one message naming no server path (so nothing tells which files
    exist)."""
    store = models or _NO_STORE
    blob = params.get("model")
    if isinstance(blob, str) and blob:
        if params.get("model_path"):
            raise InvalidArgument("params.model", "give model (an uploaded blob) or model_path, "
                                                  "not both")
        if store.blobs is None:
            raise InvalidArgument("params.model", "uploaded models are not available on this "
                                                  "server")
        return store.blobs(blob, "params.model"), "params.model"
    raw, bad = params.get("model_path"), "params.model_path"
    if not isinstance(raw, str) or not raw.strip():
        raise InvalidArgument(bad, "required: model, the id of an uploaded TorchScript "
                              "style-transfer model (fortis upload --kind model), or the path, "
                              "relative to the server's model root, of one "
                              "(N x 3 x H x W in [0, 1] -> same)")
    root = store.model_root()
    if root is None:
        raise InvalidArgument(bad, "neural_style is not available: the operator has not "
                              f"configured a model root ({MODEL_ROOT_ENV})")
    return confined_file(root, raw, bad, root_name="model root"), bad


def load_style_model(params: Params, models: StyleModels | None = None) -> Any:
    """The TorchScript module named by ``params['model_path']`` (relative to the model root of
    ``models``) or ``params['model']`` (an upload ``models.blobs`` resolves), loaded on the CPU
    and cached (keyed by path, size and modification time). Raises InvalidArgument on the
    field naming it when it is missing, outside the root, not a file or not loadable."""
    import torch  # lazy: only this slot needs torch

    path, bad = _model_path(params, models)
    try:
        st = path.stat()
    except OSError:
        raise InvalidArgument(bad, _MODEL_NOT_FOUND) from None
    key = (str(path), st.st_size, st.st_mtime_ns)
    with _MODEL_LOCK:
        model = _MODEL_CACHE.get(key)
        if model is not None:
            return model
        try:
            model = torch.jit.load(str(path), map_location="cpu")
        except Exception as exc:   # any load failure: the caller's file is not a usable model
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise InvalidArgument(bad,
                                  f"not a loadable TorchScript model "
                                  f"({type(exc).__name__}: {first[:200]})") from None
        model.eval()
        if len(_MODEL_CACHE) >= _MODEL_CACHE_SIZE:
            _MODEL_CACHE.pop(next(iter(_MODEL_CACHE)))
        _MODEL_CACHE[key] = model
        return model


def _neural_style(x: np.ndarray, prm: tuple[float, ...], rng: np.random.Generator,
                  ctx: ApplyContext) -> np.ndarray:
    import torch

    (blend,) = prm
    params = ctx.params
    model = load_style_model(params, ctx.style_models)
    bad = "params.model" if params.get("model") else "params.model_path"
    h, w, _ = x.shape
    inp = torch.from_numpy(np.ascontiguousarray(x.transpose(2, 0, 1)[None]))
    try:
        with torch.inference_mode():
            out = model(inp)
    except Exception as exc:   # a model that cannot run on the image is the caller's model
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise InvalidArgument(bad, f"the model failed on a 1x3x{h}x{w} input "
                              f"({type(exc).__name__}: {first[:200]})") from None
    if not isinstance(out, torch.Tensor) or out.ndim != 4 or tuple(out.shape[:2]) != (1, 3):
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise InvalidArgument(bad, f"the model must return a 1x3xHxW tensor "
                              f"for a 1x3x{h}x{w} input, got {shape}")
    out = out.detach().to(torch.float32)
    if tuple(out.shape[2:]) != (h, w):
        out = torch.nn.functional.interpolate(out, size=(h, w), mode="bilinear",
                                              align_corners=False)
    styled = np.nan_to_num(out[0].permute(1, 2, 0).cpu().numpy(), nan=0.0, posinf=1.0, neginf=0.0)
    return (1.0 - blend) * x + blend * np.clip(styled, 0.0, 1.0)


# ---------------------------------------------------------------------------------------------
# Entry point and catalogue entries
# ---------------------------------------------------------------------------------------------

StyleFn = Callable[[np.ndarray, tuple[float, ...], np.random.Generator, Params], np.ndarray]
#: A style that reads more of the call's context than its parameters (neural_style: where its
#: model comes from, ``ApplyContext.style_models``).
ContextStyleFn = Callable[[np.ndarray, tuple[float, ...], np.random.Generator, ApplyContext],
                          np.ndarray]


def _params_only(fn: StyleFn) -> ContextStyleFn:
    """A classical style as a context style: it reads the parameters and nothing else."""
    def style(x: np.ndarray, prm: tuple[float, ...], rng: np.random.Generator,
              ctx: ApplyContext) -> np.ndarray:
        return fn(x, prm, rng, ctx.params)
    style.__name__ = fn.__name__
    style.__doc__ = fn.__doc__
    return style


def _make_apply(fn: ContextStyleFn, table: tuple[Any, ...]) -> ApplyFn:
    def apply(image: np.ndarray, level: Any, rng: np.random.Generator,
              ctx: ApplyContext) -> np.ndarray:
        check_image(image)
        severity = check_severity(level)
        if not isinstance(rng, np.random.Generator):
            raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
        context = ctx if ctx is not None else ApplyContext()
        grey = image.ndim == 2 or image.shape[2] == 1
        x = image.astype(np.float32) / np.float32(255.0)
        x = np.repeat(x.reshape(x.shape[0], x.shape[1], 1), 3, axis=2) if grey else x
        prm = table[severity - 1]
        out = fn(np.ascontiguousarray(x), prm if isinstance(prm, tuple) else (prm,), rng, context)
        out = np.clip(out, 0.0, 1.0).astype(np.float32)
        if grey:
            out = _luma(np.ascontiguousarray(out))
        return np.ascontiguousarray(np.rint(out * 255.0).astype(np.uint8).reshape(image.shape))
    apply.__name__ = f"apply{fn.__name__}"
    apply.__doc__ = fn.__doc__
    return apply


#: DEG-5 characterisation, short for the table below
_char = characterisation


def _spec(sid: str, fn: ContextStyleFn, table: tuple[Any, ...], doc: str, fields: tuple[str, ...],
          char: Characterisation, description: str,
          params: tuple[Param, ...] = ()) -> PerturbationSpec:
    return PerturbationSpec(
        id=sid, kind="style", family="style", refs=("IEEE-A6",), description=description,
        level_kind="severity", levels=(1, 2, 3, 4, 5), level_table=table, level_table_doc=doc,
        level_fields=fields, characterisation=char, apply=_make_apply(fn, table), params=params)


SPECS: tuple[PerturbationSpec, ...] = (
    _spec("sketch", _params_only(_sketch), SKETCH_PARAMS,
          "(dodge blur sigma / shorter side, line gamma, pencil shading, colour kept)",
          ("dodge_sigma_frac_of_min_side", "line_gamma", "pencil_shading", "colour_kept"),
          _char("global", "stochastic", "colour"),
          "pencil sketch: colour-dodge lines and 45-degree hatching; severity 5 is pure grey"),
    _spec("oil_painting", _params_only(_oil_painting), OIL_PARAMS,
          "(brush radius / shorter side, impasto relief, saturation boost)",
          ("brush_radius_frac_of_min_side", "impasto_relief", "saturation_boost"),
          _char("global", "deterministic", "colour"),
          "oil paint: Kuwahara brush strokes with impasto relief and richer colour"),
    _spec("cubist", _params_only(_cubist), CUBIST_PARAMS,
          "(facets, straight cuts, texture kept, max shift / shorter side, outline / shorter "
          "side, shading, earth-palette share)",
          ("facets", "straight_cuts", "texture_kept", "max_shift_frac_of_min_side",
           "outline_frac_of_min_side", "shading", "earth_palette_share"),
          _char("global", "stochastic", "pixel"),
          "'Picasso': facets (Voronoi cells cut by lines) displaced, flattened, shaded, "
          "outlined"),
    _spec("mondrian", _params_only(_mondrian), MONDRIAN_PARAMS,
          "(rectangles, black line thickness / shorter side, palette purity)",
          ("rectangles", "line_thickness_frac_of_min_side", "palette_purity"),
          _char("global", "stochastic", "colour"),
          "'Mondrian': content-guided rectangles in primary colours, white, grey and black "
          "between thick black lines"),
    _spec("neural_style", _neural_style, NEURAL_BLEND,
          "blend weight of the model's stylised image (the rest is the original)",
          ("stylised_blend",),
          _char("global", "deterministic", "colour"),
          "a user-supplied TorchScript style-transfer model (N x 3 x H x W in [0, 1]), "
          "blended with the original by severity",
          (Param(name="model", type="string", default="",
                 description="id ('sha256:...') of a TorchScript file (torch.jit.save) "
                             "mapping N x 3 x H x W float in [0, 1] to the same, uploaded by "
                             "the calling tenant (fortis upload --kind model); this or "
                             "model_path is required",
                 one_of="model"),
           Param(name="model_path", type="string", default="",
                 description="path, relative to the server's model root, of such a "
                             "TorchScript file; this or model is required",
                 one_of="model"))),
)

#: id -> spec, in IEEE-A6 order.
STYLES: Mapping[str, PerturbationSpec] = MappingProxyType({s.id: s for s in SPECS})


def apply_style(style_id: str, image: np.ndarray, severity: int, rng: np.random.Generator,
                params: Mapping[str, Any] | None = None, *,
                models: StyleModels | None = None) -> np.ndarray:
    """Apply one style (IEEE-A6) at ``severity`` 1..5 to one image; a new uint8 array of the
    same shape (``models``: where neural_style reads its model, see ``ApplyContext``). Raises
    ``InvalidArgument`` on ``perturbation_id``, ``severity``, ``image`` or ``params.<name>``."""
    spec = STYLES.get(style_id) if isinstance(style_id, str) else None
    if spec is None:
        raise InvalidArgument("perturbation_id", f"unknown style '{style_id}'; known: "
                              f"{', '.join(STYLES)}")
    given = dict(params or {})
    known = {p.name for p in spec.params}
    for key in given:
        if key not in known:
            raise InvalidArgument(f"params.{key}", f"unknown parameter for {style_id}")
    full = {p.name: p.default for p in spec.params} | given
    return spec.apply(image, severity, rng, ApplyContext(params=MappingProxyType(full),
                                                         style_models=models))

