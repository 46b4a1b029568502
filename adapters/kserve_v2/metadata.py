"""The model metadata of the Open Inference Protocol (REST ``GET /v2/models/MODEL`` or gRPC
``ModelMetadata``), and the input tensor it implies once the URL's options are applied.

Pure functions: the transports fetch, these read.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fortis.adapters.kserve_v2.options import (
    DEFAULT_BATCH,
    INPUT_DTYPES,
    KServeOptions,
    bad_option,
    parse_labels,
)
from fortis.adapters.kserve_v2_protos import grpc_predict_v2_pb2 as pb
from fortis.adapters.target_errors import TargetResponseError


def json_body(body: bytes, what: str) -> Any:
    try:
        return json.loads(body)
    except RecursionError:      # nesting deeper than the interpreter's stack: hostile or broken
        raise TargetResponseError(f"{what}: JSON nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:
        snippet = body[:80].decode("utf-8", "replace")
        raise TargetResponseError(f"{what}: malformed JSON ({exc}): {snippet!r}") from None


@dataclass(frozen=True, kw_only=True)
class TensorMeta:
    name: str
    datatype: str
    shape: tuple[int, ...]
    parameters: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class ModelMeta:
    """The model metadata of the Open Inference Protocol."""

    name: str
    versions: tuple[str, ...] = ()
    platform: str = ""
    inputs: tuple[TensorMeta, ...] = ()
    outputs: tuple[TensorMeta, ...] = ()
    parameters: Mapping[str, Any] = field(default_factory=dict)

    def labels(self, output_name: str = "") -> tuple[str, ...]:
        """Class names the server publishes -- a ``labels`` parameter of the output, else of
        the model, else of any output -- or ()."""
        for t in self.outputs:
            if (not output_name or t.name == output_name) and "labels" in t.parameters:
                return parse_labels(t.parameters["labels"])
        if "labels" in self.parameters:
            return parse_labels(self.parameters["labels"])
        for t in self.outputs:
            if "labels" in t.parameters:
                return parse_labels(t.parameters["labels"])
        return ()


def _tensor_meta_json(doc: Any, where: str) -> TensorMeta:
    if not isinstance(doc, dict) or not isinstance(doc.get("name"), str):
        raise TargetResponseError(f"model metadata: {where} is not a tensor description")
    shape = doc.get("shape") or []
    if not isinstance(shape, list) or not all(isinstance(s, int) for s in shape):
        raise TargetResponseError(f"model metadata: {where}.shape is not a list of integers")
    params = doc.get("parameters") or {}
    return TensorMeta(name=doc["name"], datatype=str(doc.get("datatype", "")),
                      shape=tuple(shape), parameters=params if isinstance(params, dict) else {})


def meta_from_json(body: bytes) -> ModelMeta:
    """ModelMeta of a REST ``GET /v2/models/MODEL`` answer."""
    doc = json_body(body, "model metadata")
    if not isinstance(doc, dict) or not isinstance(doc.get("name"), str):
        raise TargetResponseError("model metadata: not a JSON object with a 'name'")
    params = doc.get("parameters") or {}
    return ModelMeta(
        name=doc["name"], versions=tuple(str(v) for v in doc.get("versions") or ()),
        platform=str(doc.get("platform") or ""),
        inputs=tuple(_tensor_meta_json(t, f"inputs[{i}]")
                     for i, t in enumerate(doc.get("inputs") or ())),
        outputs=tuple(_tensor_meta_json(t, f"outputs[{i}]")
                      for i, t in enumerate(doc.get("outputs") or ())),
        parameters=params if isinstance(params, dict) else {})


def _params_of(msg: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, p in msg.items():
        kind = p.WhichOneof("parameter_choice")
        if kind is not None:
            out[key] = getattr(p, kind)
    return out


def meta_from_proto(msg: pb.ModelMetadataResponse) -> ModelMeta:
    """ModelMeta of a gRPC ModelMetadata answer."""
    def tensor(t: Any) -> TensorMeta:
        return TensorMeta(name=t.name, datatype=t.datatype, shape=tuple(int(s) for s in t.shape),
                          parameters=_params_of(t.parameters))
    return ModelMeta(name=msg.name, versions=tuple(msg.versions), platform=msg.platform,
                     inputs=tuple(tensor(t) for t in msg.inputs),
                     outputs=tuple(tensor(t) for t in msg.outputs),
                     parameters=_params_of(msg.parameters))


@dataclass(frozen=True, kw_only=True)
class ResolvedInput:
    """The input tensor as it will be sent: options first, then metadata, then defaults."""

    name: str
    kind: str                   # "tensor" | "bytes"
    datatype: str               # FP32 | FP16 | UINT8 | BYTES
    layout: str                 # "nchw" | "nhwc" ("" for bytes)
    channels: int
    height: int                 # 0 = each image's own size
    width: int
    batch: int
    scale: float
    mean: tuple[float, ...]
    std: tuple[float, ...]


def resolve_input(opts: KServeOptions, meta: ModelMeta | None) -> ResolvedInput:
    """Fill what the URL left out from the model metadata (``meta`` may be None)."""
    first = meta.inputs[0] if meta and meta.inputs else None
    if meta and opts.input_name:
        first = next((t for t in meta.inputs if t.name == opts.input_name), first)
    name = opts.input_name or (first.name if first else "input")
    shape = first.shape if first and len(first.shape) == 4 else ()
    batch = opts.batch or DEFAULT_BATCH
    if shape and shape[0] > 0:
        batch = min(batch, shape[0])
    if opts.input_kind == "bytes":
        h, w = opts.resize or (0, 0)
        return ResolvedInput(name=name, kind="bytes", datatype="BYTES", layout="", channels=3,
                             height=h, width=w, batch=batch, scale=1.0, mean=(), std=())
    layout = opts.layout
    if not layout:
        if shape and shape[1] in (1, 3) and shape[3] not in (1, 3):
            layout = "nchw"
        elif shape and shape[3] in (1, 3):
            layout = "nhwc"
        else:
            layout = "nchw"
    if shape:
        nchw = layout == "nchw"
        dims = (shape[1], shape[2], shape[3]) if nchw else (shape[3], shape[1], shape[2])
    else:
        dims = (-1, -1, -1)
    channels = opts.channels or (dims[0] if dims[0] in (1, 3) else 3)
    if opts.resize:
        h, w = opts.resize
    else:
        h, w = (dims[1], dims[2]) if dims[1] > 0 and dims[2] > 0 else (0, 0)
    datatype = opts.dtype
    if not datatype:
        datatype = first.datatype if first and first.datatype in INPUT_DTYPES else "FP32"
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()
    if datatype == "UINT8":
        scale = 1.0
    else:
        scale = opts.scale if opts.scale is not None else 1.0 / 255.0
        mean, std = opts.mean, opts.std
    for key, values in (("mean", mean), ("std", std)):
        if len(values) not in (0, 1, channels):
            raise bad_option(key, f"{len(values)} values for a {channels}-channel input")
    return ResolvedInput(name=name, kind="tensor", datatype=datatype, layout=layout,
                         channels=channels, height=h, width=w, batch=batch, scale=scale,
                         mean=mean, std=std)
