"""The tensor codec: images -> the model's input tensor -> OIP requests (REST JSON, the binary
data extension, gRPC typed or raw contents), and OIP answers -> checked N x C probabilities.

Pure functions of their arguments; ``TargetResponseError`` names what does not fit.
"""

from __future__ import annotations

import base64
import json
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np
from fortis.adapters.kserve_v2.metadata import ResolvedInput, json_body
from fortis.adapters.kserve_v2_protos import grpc_predict_v2_pb2 as pb
from fortis.adapters.target_errors import TargetResponseError

#: Numeric OIP datatypes and their little-endian numpy dtypes.
NUMPY_DTYPES: dict[str, str] = {
    "BOOL": "?", "UINT8": "<u1", "UINT16": "<u2", "UINT32": "<u4", "UINT64": "<u8",
    "INT8": "<i1", "INT16": "<i2", "INT32": "<i4", "INT64": "<i8",
    "FP16": "<f2", "FP32": "<f4", "FP64": "<f8",
}
#: gRPC typed-contents field of each datatype (FP16 has none: raw only).
CONTENTS_FIELD: dict[str, str] = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents",
    "INT32": "int_contents", "INT64": "int64_contents", "UINT8": "uint_contents",
    "UINT16": "uint_contents", "UINT32": "uint_contents", "UINT64": "uint64_contents",
    "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}


# -- encoding ---------------------------------------------------------------------------------
def fit_image(image: np.ndarray, height: int, width: int, channels: int) -> np.ndarray:
    """uint8 HxWxC (C in 1, 3, 4) -> uint8 height x width x channels (0 size = keep)."""
    img = image[:, :, :3] if image.shape[2] == 4 else image
    h, w = img.shape[:2]
    if height and width and (h, w) != (height, width):
        shrink = height <= h and width <= w
        img = cv2.resize(np.ascontiguousarray(img), (width, height),
                         interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR)
        if img.ndim == 2:
            img = img[:, :, None]
    if img.shape[2] != channels:
        if channels == 3:
            img = np.repeat(img, 3, axis=2)
        else:
            img = cv2.cvtColor(np.ascontiguousarray(img), cv2.COLOR_RGB2GRAY)[:, :, None]
    return np.ascontiguousarray(img)


def image_tensor(images: Sequence[np.ndarray], spec: ResolvedInput) -> np.ndarray:
    """A batch of uint8 HxWxC images as the model's input tensor (N first, then the layout)."""
    fitted = np.stack([fit_image(im, spec.height, spec.width, spec.channels) for im in images])
    if spec.datatype == "UINT8":
        x: np.ndarray = fitted
    else:
        xf = fitted.astype(np.float32) * np.float32(spec.scale)
        if spec.mean:
            xf -= np.asarray(spec.mean, dtype=np.float32)
        if spec.std:
            xf /= np.asarray(spec.std, dtype=np.float32)
        x = xf.astype(np.float16) if spec.datatype == "FP16" else xf
    if spec.layout == "nchw":
        x = x.transpose(0, 3, 1, 2)
    return np.ascontiguousarray(x)


@dataclass(frozen=True)
class InTensor:
    """An input tensor: a numeric array, or BYTES elements."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray | tuple[bytes, ...]


@dataclass(frozen=True)
class OutTensor:
    """An output tensor as answered."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray            # flat, in the datatype's dtype


def raw_bytes(t: InTensor) -> bytes:
    """Row-major little-endian bytes of a tensor (BYTES: 4-byte length + bytes per element)."""
    if isinstance(t.data, tuple):
        return b"".join(struct.pack("<I", len(b)) + b for b in t.data)
    return np.ascontiguousarray(t.data, dtype=NUMPY_DTYPES[t.datatype]).tobytes()


def split_raw_bytes_elements(data: bytes) -> list[bytes]:
    """Inverse of ``raw_bytes`` for a BYTES tensor."""
    out, pos = [], 0
    while pos < len(data):
        if pos + 4 > len(data):
            raise TargetResponseError("BYTES tensor: truncated element length")
        (n,) = struct.unpack_from("<I", data, pos)
        pos += 4
        if pos + n > len(data):
            raise TargetResponseError("BYTES tensor: element runs past the end of the data")
        out.append(data[pos:pos + n])
        pos += n
    return out


def infer_request_json(t: InTensor, *, output_name: str = "", binary: bool = False,
                       request_id: str = "") -> tuple[bytes, int | None]:
    """REST infer body, and the JSON header length when the binary extension is used."""
    tensor: dict[str, Any] = {"name": t.name, "shape": list(t.shape), "datatype": t.datatype}
    payload = b""
    if binary:
        payload = raw_bytes(t)
        tensor["parameters"] = {"binary_data_size": len(payload)}
    elif isinstance(t.data, tuple):
        tensor["data"] = [base64.b64encode(b).decode("ascii") for b in t.data]
        tensor["parameters"] = {"content_type": "base64"}
    else:
        tensor["data"] = t.data.ravel().tolist()
    doc: dict[str, Any] = {"inputs": [tensor]}
    if request_id:
        doc["id"] = request_id
    if output_name:
        doc["outputs"] = [{"name": output_name, "parameters": {"binary_data": binary}}]
    if binary:
        doc["parameters"] = {"binary_data_output": True}
    head = json.dumps(doc, separators=(",", ":")).encode()
    return (head + payload, len(head)) if binary else (head, None)


def infer_request_proto(t: InTensor, *, model: str, version: str = "", output_name: str = "",
                        raw: bool = False, request_id: str = "") -> pb.ModelInferRequest:
    """gRPC ModelInferRequest (typed contents, or raw_input_contents when ``raw`` or FP16)."""
    req = pb.ModelInferRequest(model_name=model, model_version=version, id=request_id)
    tensor = req.inputs.add(name=t.name, datatype=t.datatype, shape=list(t.shape))
    if raw or t.datatype not in CONTENTS_FIELD:
        req.raw_input_contents.append(raw_bytes(t))
    elif isinstance(t.data, tuple):
        tensor.contents.bytes_contents.extend(t.data)
    else:
        getattr(tensor.contents, CONTENTS_FIELD[t.datatype]).extend(t.data.ravel().tolist())
    if output_name:
        req.outputs.add(name=output_name)
    return req


# -- decoding ---------------------------------------------------------------------------------
def _check_shape(name: str, shape: Any) -> tuple[int, ...]:
    if not isinstance(shape, list | tuple) or not all(
            isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape):
        raise TargetResponseError(f"output '{name}': shape {shape!r} is not a list of "
                                  "non-negative integers")
    return tuple(int(s) for s in shape)


def _numeric(name: str, datatype: str) -> np.dtype:
    if datatype == "BYTES":
        raise TargetResponseError(f"output '{name}' has datatype BYTES; expected numeric scores")
    if datatype not in NUMPY_DTYPES:
        raise TargetResponseError(f"output '{name}' has unknown datatype '{datatype}'")
    return np.dtype(NUMPY_DTYPES[datatype])


def _from_raw(name: str, datatype: str, shape: tuple[int, ...], data: bytes) -> np.ndarray:
    dtype = _numeric(name, datatype)
    n = math.prod(shape)
    if len(data) != n * dtype.itemsize:
        raise TargetResponseError(f"output '{name}': {len(data)} raw bytes do not match shape "
                                  f"{list(shape)} of {datatype} ({n * dtype.itemsize} bytes)")
    return np.frombuffer(data, dtype=dtype)


def outputs_from_json(body: bytes, header_length: int | None = None) -> list[OutTensor]:
    """Output tensors of a REST infer answer (JSON ``data``, or the binary extension)."""
    head = body if header_length is None else body[:header_length]
    doc = json_body(head, "inference answer")
    if not isinstance(doc, dict) or not isinstance(doc.get("outputs"), list):
        raise TargetResponseError("inference answer: no 'outputs' list in the JSON")
    pos = header_length or 0
    out: list[OutTensor] = []
    for i, o in enumerate(doc["outputs"]):
        if not isinstance(o, dict) or not isinstance(o.get("name"), str):
            raise TargetResponseError(f"inference answer: outputs[{i}] has no 'name'")
        name, datatype = o["name"], str(o.get("datatype", ""))
        shape = _check_shape(name, o.get("shape"))
        params = o.get("parameters") if isinstance(o.get("parameters"), dict) else {}
        size = params.get("binary_data_size") if params else None
        if size is not None:
            if header_length is None or not isinstance(size, int) or pos + size > len(body):
                raise TargetResponseError(f"output '{name}': binary_data_size {size!r} does not "
                                          f"fit the {len(body) - (header_length or 0)} bytes after "
                                          "the JSON header")
            data = _from_raw(name, datatype, shape, body[pos:pos + size])
            pos += size
        else:
            if "data" not in o:
                raise TargetResponseError(f"output '{name}' has no 'data'")
            dtype = _numeric(name, datatype)
            try:
                data = np.asarray(o["data"], dtype=np.float64).ravel()
            except (ValueError, TypeError):
                raise TargetResponseError(f"output '{name}': 'data' is not a list of numbers"
                                          ) from None
            if data.size != math.prod(shape):
                raise TargetResponseError(f"output '{name}': {data.size} values do not match "
                                          f"shape {list(shape)}")
            data = data.astype(dtype) if dtype.kind != "f" else data
        out.append(OutTensor(name, datatype, shape, data))
    return out


def outputs_from_proto(resp: pb.ModelInferResponse) -> list[OutTensor]:
    """Output tensors of a gRPC answer (typed contents or raw_output_contents)."""
    raw = list(resp.raw_output_contents)
    if raw and len(raw) != len(resp.outputs):
        raise TargetResponseError(f"inference answer: {len(raw)} raw_output_contents for "
                                  f"{len(resp.outputs)} outputs")
    out: list[OutTensor] = []
    for i, o in enumerate(resp.outputs):
        shape = tuple(int(s) for s in o.shape)
        if any(s < 0 for s in shape):
            raise TargetResponseError(f"output '{o.name}': negative dimension in {list(shape)}")
        if raw:
            data = _from_raw(o.name, o.datatype, shape, raw[i])
        else:
            dtype = _numeric(o.name, o.datatype)
            fname = CONTENTS_FIELD.get(o.datatype)
            values = getattr(o.contents, fname) if fname else ()
            if not values and math.prod(shape) > 0:
                raise TargetResponseError(f"output '{o.name}': no {fname or 'typed'} contents "
                                          "and no raw_output_contents")
            data = np.asarray(values, dtype=dtype)
            if data.size != math.prod(shape):
                raise TargetResponseError(f"output '{o.name}': {data.size} values do not match "
                                          f"shape {list(shape)}")
        out.append(OutTensor(o.name, o.datatype, shape, data))
    return out


def pick_output(outputs: Sequence[OutTensor], name: str, fallback: str = "") -> OutTensor:
    """The output named ``name`` (else the only one, else ``fallback``)."""
    names = [o.name for o in outputs]
    if not outputs:
        raise TargetResponseError("inference answer has no outputs")
    wanted = name or (outputs[0].name if len(outputs) == 1 else fallback)
    if not wanted:
        raise TargetResponseError(f"the answer has {len(outputs)} outputs {names}; choose one "
                                  "with output_name=NAME")
    for o in outputs:
        if o.name == wanted:
            return o
    raise TargetResponseError(f"no output '{wanted}' in the answer (outputs: {names})")


def scores_of(out: OutTensor, n_images: int) -> np.ndarray:
    """float64 N x C scores of an output answered for ``n_images`` images."""
    shape = out.shape
    ok = (len(shape) >= 2 and shape[0] == n_images) or (len(shape) == 1 and n_images == 1)
    if not ok or math.prod(shape) == 0:
        raise TargetResponseError(f"output '{out.name}' has shape {list(shape)} for "
                                  f"{n_images} image(s); expected [{n_images}, classes]")
    scores = np.asarray(out.data, dtype=np.float64).reshape(n_images, -1)
    if not np.all(np.isfinite(scores)):
        raise TargetResponseError(f"output '{out.name}' holds NaN or infinite values")
    return scores


def softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def to_probabilities(scores: np.ndarray, output: str, name: str = "output") -> np.ndarray:
    """Probabilities from ``probabilities`` (checked to be in [0, 1]) or ``logits`` scores."""
    if output == "logits":
        return softmax(scores)
    lo, hi = float(scores.min()), float(scores.max())
    if lo < -1e-4 or hi > 1 + 1e-4:
        raise TargetResponseError(f"output '{name}' should hold probabilities but ranges over "
                                  f"[{lo:.4g}, {hi:.4g}]; add output=logits for raw scores")
    return np.clip(scores, 0.0, 1.0)


def class_names(labels: Sequence[str], n_classes: int, where: str) -> Sequence[str]:
    if not labels:
        return [str(i) for i in range(n_classes)]
    if len(labels) != n_classes:
        raise TargetResponseError(f"the model answered {n_classes} scores but {where} "
                                  f"lists {len(labels)} class names")
    return labels
