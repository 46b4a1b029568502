"""The MLflow scoring server's JSON, both ways: images -> an ``/invocations`` body
(``inputs`` / ``instances`` tensors, or a ``dataframe_split`` column of base64 files), and its
``{"predictions": ...}`` answer -> probabilities, labels or detections. Pure functions;
``TargetResponseError`` names what does not fit (``predictions[i]``, ``predictions.KEY``).
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from fortis.adapters.kserve_v2.codec import OutTensor, to_probabilities
from fortis.adapters.kserve_v2.metadata import json_body
from fortis.adapters.kserve_v2.tasks import Size, decode_detections
from fortis.adapters.mlflow_pyfunc.options import MlflowOptions
from fortis.adapters.target_errors import TargetResponseError
from fortis.common.v1 import common_pb2


def request_body(opts: MlflowOptions, items: Sequence[np.ndarray | bytes]) -> bytes:
    """The ``/invocations`` JSON for one call: ``items`` are model-ready tensors (one per
    image, already resized/normalised) or encoded image files."""
    if opts.input_kind == "bytes":
        values: list[Any] = [base64.b64encode(bytes(x)).decode("ascii") for x in items]
    else:
        values = [np.asarray(x).tolist() for x in items]
    if opts.request == "dataframe_split":
        doc: dict[str, Any] = {
            "dataframe_split": {"columns": [opts.column], "data": [[v] for v in values]}
        }
    else:
        doc = {opts.request: values}
    return json.dumps(doc, separators=(",", ":")).encode()


def predictions_of(body: bytes, n: int) -> Any:
    """The ``predictions`` of an answer for ``n`` images."""
    doc = json_body(body, "scoring answer")
    if not isinstance(doc, dict) or "predictions" not in doc:
        raise TargetResponseError(
            "scoring answer: no 'predictions' in the JSON (an MLflow "
            'scoring server answers {"predictions": ...})'
        )
    return doc["predictions"]


def _array(value: Any, where: str) -> np.ndarray:
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (ValueError, TypeError, OverflowError):
        raise TargetResponseError(f"{where} is not a rectangular array of numbers") from None
    return arr


def _check_count(preds: Any, n: int, where: str = "predictions") -> None:
    if not isinstance(preds, list) or len(preds) != n:
        got = f"{len(preds)} items" if isinstance(preds, list) else type(preds).__name__
        raise TargetResponseError(
            f"{where}: expected a list of {n} answers (one per image), got {got}"
        )


def scores_of(preds: Any, n: int, output: str) -> np.ndarray:
    """N x C probabilities: from rows of scores, or records (a pyfunc's DataFrame: one number
    per column)."""
    _check_count(preds, n)
    rows = [list(p.values()) if isinstance(p, dict) else p for p in preds]
    arr = _array(rows, "predictions")
    if arr.ndim != 2 or arr.shape[1] == 0:
        raise TargetResponseError(
            f"predictions has shape {list(arr.shape)} for {n} image(s); "
            f"expected [{n}, classes] scores (output=labels reads one "
            "label per image)"
        )
    if not np.isfinite(arr).all():
        raise TargetResponseError("predictions holds NaN or infinite scores")
    return to_probabilities(arr, output, "predictions")


def labels_of(preds: Any, n: int, names: Sequence[str]) -> list[int]:
    """One class index per image: an integer, or a class name of ``names``."""
    _check_count(preds, n)
    index = {name: i for i, name in enumerate(names)}
    out: list[int] = []
    for i, p in enumerate(preds):
        if isinstance(p, list) and len(p) == 1:
            p = p[0]
        if isinstance(p, str):
            if p not in index:
                raise TargetResponseError(
                    f"predictions[{i}]: label {p[:80]!r} is not a class name of the labels file"
                )
            out.append(index[p])
            continue
        if (
            isinstance(p, bool)
            or not isinstance(p, int | float)
            or not math.isfinite(p)
            or p != int(p)
        ):
            raise TargetResponseError(
                f"predictions[{i}]: {str(p)[:80]!r} is neither a class index nor a class name"
            )
        label = int(p)
        if label < 0 or (names and label >= len(names)):
            span = f"0..{len(names) - 1}" if names else ">= 0"
            raise TargetResponseError(
                f"predictions[{i}]: class {label} is not in the label set ({span})"
            )
        out.append(label)
    return out


def _tensors(doc: dict[str, Any], where: str) -> list[OutTensor]:
    out = []
    for key, value in doc.items():
        if not isinstance(value, list | int | float):
            continue  # names, ids, ...: not a tensor
        arr = _array(value, f"{where}.{key}")
        out.append(OutTensor(str(key), "FP64", tuple(arr.shape), arr.ravel()))
    return out


def detections_of(
    preds: Any,
    opts: MlflowOptions,
    image_sizes: Sequence[Size],
    frames: Sequence[Size],
    n_classes: int,
) -> list[common_pb2.Detection]:
    """Per image, its detections: from a dict of batched arrays (``{"boxes": [N, K, 4],
    ...}``, a pyfunc returning a dict of numpy arrays) or a list of per-image dicts
    (``[{"boxes": [K, 4], ...}, ...]``: any K per image)."""
    n = len(image_sizes)
    if isinstance(preds, dict):
        answers = decode_detections(
            _tensors(preds, "predictions"), opts.detection, image_sizes, frames, n_classes
        ).to_proto()
        return [p.detection for p in answers]
    _check_count(preds, n)
    dets = []
    for i, p in enumerate(preds):
        if not isinstance(p, dict):
            raise TargetResponseError(
                f"predictions[{i}]: expected an object of boxes, scores "
                f"and labels, got {type(p).__name__}"
            )
        try:
            (ans,) = decode_detections(
                _tensors(p, f"predictions[{i}]"),
                opts.detection,
                [image_sizes[i]],
                [frames[i]],
                n_classes,
            ).to_proto()
        except TargetResponseError as exc:
            raise TargetResponseError(f"predictions[{i}]: {exc.message}") from None
        dets.append(ans.detection)
    return dets
