"""``KServeV2Backend``: the proxy's ``TargetBackend`` over an Open Inference Protocol server.

Reads the model metadata once (when the URL leaves something to it), resolves the input
tensor, groups images into calls (at most the batch size; without a fixed input size, images of
one size per call), halves a call the server refuses as too large and remembers the smaller
batch, and turns answers into full-score classifications, detections or class maps (the
``task`` option; ``tasks`` reads the latter two).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from fortis.adapters.kserve_v2.codec import (
    InTensor,
    OutTensor,
    class_names,
    fit_image,
    image_tensor,
    pick_output,
    scores_of,
    to_probabilities,
)
from fortis.adapters.kserve_v2.grpc_transport import GrpcTransport
from fortis.adapters.kserve_v2.metadata import ModelMeta, ResolvedInput, resolve_input
from fortis.adapters.kserve_v2.options import KServeOptions, parse_url, read_labels
from fortis.adapters.kserve_v2.rest_transport import HttpTransport
from fortis.adapters.kserve_v2.tasks import Size, decode_class_maps, decode_detections
from fortis.adapters.kserve_v2.transport import MessageTooLarge, Transport
from fortis.adapters.target_errors import TargetResponseError, TargetUnavailable
from fortis.common.v1 import common_pb2
from fortis.core.tensors import fill_tensor
from fortis.services.common.codec import classification_from_proba, decode_image, encode_png
from fortis.target.v1 import target_pb2

#: Seconds before asking again for model metadata the server could not give.
METADATA_RETRY_S = 30.0
_TASK_TYPES = {"classification": (common_pb2.TASK_TYPE_CLASSIFICATION,
                                  common_pb2.OUTPUT_KIND_FULL_SCORES),
               "detection": (common_pb2.TASK_TYPE_DETECTION, common_pb2.OUTPUT_KIND_BOXES),
               "segmentation": (common_pb2.TASK_TYPE_SEGMENTATION, common_pb2.OUTPUT_KIND_MASKS)}


class KServeV2Backend:
    """A Fortis ``TargetBackend`` over an Open Inference Protocol server."""

    def __init__(self, opts: KServeOptions, transport: Transport | None = None) -> None:
        self.opts = opts
        self.transport: Transport = transport or (
            GrpcTransport(opts) if opts.transport == "grpc" else HttpTransport(opts))
        self._labels = read_labels(opts.labels_path) if opts.labels_path else ()
        self._lock = threading.Lock()
        self._meta: ModelMeta | None = None
        self._meta_retry_at = 0.0           # monotonic time before which not to ask again
        self._batch_limit = 0               # learnt from "message too large" answers (0 = none)

    def close(self) -> None:
        self.transport.close()

    @property
    def learnt_batch_limit(self) -> int:
        """Images per call after the server refused a larger call as too big (0 = none yet)."""
        return self._batch_limit

    def _needs_metadata(self) -> bool:
        o = self.opts
        if not o.input_name or not o.labels_path:
            return True
        if o.input_kind == "bytes":
            return False
        return not (o.resize and o.layout and o.dtype and o.channels)

    def metadata(self) -> ModelMeta | None:
        """The model metadata, read once and kept. None while the server has none to give
        (asked again after ``METADATA_RETRY_S``); a server that is down raises
        ``Unavailable``, and is asked again on the next call."""
        with self._lock:
            if self._meta is None and time.monotonic() >= self._meta_retry_at:
                try:
                    self._meta = self.transport.metadata()
                except TargetResponseError:
                    self._meta_retry_at = time.monotonic() + METADATA_RETRY_S
            return self._meta

    def _spec(self) -> tuple[ResolvedInput, tuple[str, ...], str]:
        meta = self.metadata() if self._needs_metadata() else None
        spec = resolve_input(self.opts, meta)
        if self._labels:
            return spec, self._labels, f"labels file '{self.opts.labels_path}'"
        labels = meta.labels(self._labels_output) if meta else ()
        return spec, labels, "the model metadata"

    @property
    def _labels_output(self) -> str:
        """The output whose metadata ``labels`` parameter names the classes."""
        o = self.opts
        return o.detection.classes_output if o.task == "detection" else o.output_name

    def _default_output(self) -> str:
        meta = self._meta
        return meta.outputs[0].name if meta and meta.outputs else ""

    def info(self) -> target_pb2.TargetInfo:
        if not self.transport.ready():
            raise TargetUnavailable(f"{self.transport.endpoint}: model '{self.opts.model}' "
                                    "is not ready")
        meta = self.metadata()
        spec = resolve_input(self.opts, meta)
        labels: Sequence[str] = self._labels or (meta.labels(self._labels_output) if meta else ())
        if not labels and meta and meta.outputs and self.opts.task == "classification":
            out = next((t for t in meta.outputs if t.name == self.opts.output_name),
                       meta.outputs[0])
            if len(out.shape) >= 2 and out.shape[-1] > 0:
                labels = [str(i) for i in range(out.shape[-1])]
        version = self.opts.version or (",".join(meta.versions) if meta else "")
        if meta and meta.platform:
            version = f"{meta.platform} {version}".strip()
        task_type, output_kind = _TASK_TYPES[self.opts.task]
        return target_pb2.TargetInfo(
            name=self.opts.model, task_type=task_type,
            labels=list(labels), output_kind=output_kind,
            input=target_pb2.InputSpec(height=spec.height, width=spec.width,
                                       channels=spec.channels, max_batch_size=spec.batch),
            version=version)

    def _inputs(self, images: Sequence[common_pb2.Image], spec: ResolvedInput
                ) -> tuple[list[np.ndarray | bytes], list[Size]]:
        """What is sent for each image, and each decoded image's (height, width)."""
        out: list[np.ndarray | bytes] = []
        sizes: list[Size] = []
        for i, img in enumerate(images):
            arr = decode_image(img, f"images[{i}]")      # InvalidArgument naming the image
            sizes.append((int(arr.shape[0]), int(arr.shape[1])))
            if spec.kind == "bytes":
                if spec.height and arr.shape[:2] != (spec.height, spec.width):
                    out.append(encode_png(fit_image(arr, spec.height, spec.width, 3)))
                elif img.WhichOneof("content") == "encoded":
                    out.append(img.encoded)
                else:
                    out.append(encode_png(arr))
            else:
                out.append(arr)
        return out, sizes

    def predict(self, images: Sequence[common_pb2.Image]) -> list[common_pb2.Prediction]:
        spec, labels, labels_from = self._spec()
        inputs, sizes = self._inputs(images, spec)
        # The frame pixel boxes and maps refer to: the size sent (resize), else the image's.
        frames = [(spec.height, spec.width) if spec.height else hw for hw in sizes]
        limit = min(spec.batch, self._batch_limit or spec.batch)
        # Calls of at most `limit` images; without a fixed size, images of one size each.
        groups: list[list[int]] = []
        for i, x in enumerate(inputs):
            last = groups[-1] if groups else None
            if (last is not None and len(last) < limit
                    and (spec.height or _size(inputs[last[0]]) == _size(x))):
                last.append(i)
            else:
                groups.append([i])
        task = self.opts.task

        def decode(outputs: list[OutTensor], idx: list[int]) -> list[Any]:
            """One call's answers, one per image of ``idx``."""
            if task == "detection":
                det = decode_detections(outputs, self.opts.detection, [sizes[i] for i in idx],
                                        [frames[i] for i in idx], len(labels))
                return _with_names(det.to_proto(), labels)
            out = pick_output(outputs, self.opts.output_name, self._default_output())
            if task == "segmentation":
                return decode_class_maps(out, self.opts, [sizes[i] for i in idx],
                                         [frames[i] for i in idx], len(labels))
            return list(to_probabilities(scores_of(out, len(idx)), self.opts.output, out.name))

        answers: list[Any] = []
        for group in groups:
            answers += self._infer(spec, inputs, group, decode)
        preds: list[common_pb2.Prediction] = []
        for img, answer in zip(images, answers, strict=True):
            pred = common_pb2.Prediction(image_id=img.image_id)
            if task == "detection":
                pred.detection.CopyFrom(answer.detection)
            elif task == "segmentation":
                fill_tensor(pred.segmentation.class_map, answer)   # in place: maps are large
            else:
                names = class_names(labels, len(answer), labels_from)
                pred.classification.CopyFrom(classification_from_proba(
                    answer, output="full_scores", top_k=len(names), names=names))
            preds.append(pred)
        return preds

    def _infer(self, spec: ResolvedInput, inputs: list[np.ndarray | bytes], idx: list[int],
               decode: Callable[[list[OutTensor], list[int]], list[Any]]) -> list[Any]:
        """The answers of one call for the images ``idx``; halves the call when the server
        says it is too large (and remembers the smaller batch for the next calls)."""
        items = [inputs[i] for i in idx]
        if spec.kind == "bytes":
            data = tuple(bytes(x) for x in items if isinstance(x, bytes))
            tensor = InTensor(spec.name, "BYTES", (len(data),), data)
        else:
            arr = image_tensor([x for x in items if isinstance(x, np.ndarray)], spec)
            tensor = InTensor(spec.name, spec.datatype, tuple(arr.shape), arr)
        # Detection reads several outputs: ask for all of them (the server's default).
        wanted = "" if self.opts.task == "detection" else self.opts.output_name
        try:
            outputs = self.transport.infer(tensor, wanted)
        except MessageTooLarge as exc:
            if len(items) == 1:
                raise TargetResponseError(f"the server refuses even a one-image request as too "
                                          f"large: {exc.message}") from None
            half = len(items) // 2
            with self._lock:
                self._batch_limit = min(self._batch_limit or half, half)
            return (self._infer(spec, inputs, idx[:half], decode)
                    + self._infer(spec, inputs, idx[half:], decode))
        return decode(outputs, idx)


def _with_names(preds: list[common_pb2.Prediction], labels: Sequence[str]
                ) -> list[common_pb2.Prediction]:
    """Detections with each box's class name, where the label set is known."""
    if labels:
        for p in preds:
            for b in p.detection.boxes:
                b.name = labels[b.label]
    return preds


def _size(x: np.ndarray | bytes) -> tuple[int, ...]:
    return tuple(x.shape[:2]) if isinstance(x, np.ndarray) else ()


def backend_from_url(url: str) -> KServeV2Backend:
    """The proxy back end of a ``kserve+grpc://`` / ``kserve+http(s)://`` URL (nothing is
    contacted until the first call)."""
    return KServeV2Backend(parse_url(url))
