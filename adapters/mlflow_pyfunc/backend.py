"""``MlflowBackend``: the proxy's ``TargetBackend`` over an MLflow pyfunc scoring server."""

from __future__ import annotations

import json
import ssl
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from fortis.adapters.http_client import HttpClient
from fortis.adapters.kserve_v2.codec import fit_image, image_tensor
from fortis.adapters.kserve_v2.metadata import ResolvedInput
from fortis.adapters.kserve_v2.options import bad_option, bearer_token, parse_labels, scrub
from fortis.adapters.kserve_v2.rest_transport import error_text
from fortis.adapters.mlflow_pyfunc.codec import (
    detections_of,
    labels_of,
    predictions_of,
    request_body,
    scores_of,
)
from fortis.adapters.mlflow_pyfunc.options import MlflowOptions, parse_url
from fortis.adapters.target_errors import TargetResponseError, TargetUnavailable
from fortis.common.v1 import common_pb2
from fortis.services.common.codec import classification_from_proba, decode_image, encode_png
from fortis.target.v1 import target_pb2

#: Largest answer read (the scoring server's JSON of a batch).
MAX_RESPONSE_BYTES = 64 * 1024 * 1024


def read_labels(path: str) -> tuple[str, ...]:
    """Class names from a text file, one a line."""
    try:
        names = parse_labels(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise bad_option("labels", f"cannot read '{path}': {exc}", "mlflow") from None
    if not names:
        raise bad_option("labels", f"'{path}' holds no class names", "mlflow")
    return names


def server_error(body: bytes, secrets: Sequence[str] = ()) -> str:
    """The scoring server's error: its ``message`` and, from the ``stack_trace`` it attaches,
    only the last line (the model's own exception, e.g. ``ValueError: expected ...``), never
    the frames (server paths and code)."""
    text = error_text(body, secrets)
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return text
    trace = doc.get("stack_trace") if isinstance(doc, dict) else None
    if isinstance(trace, str):
        last = next((ln.strip() for ln in reversed(trace.splitlines()) if ln.strip()), "")
        if last and not last.startswith(("File ", "Traceback")):
            last = scrub(last, secrets)  # before the line is cut
            text = f"{last[:300]} ({text})"  # the model's own words first
    return text


class MlflowBackend:
    """A Fortis ``TargetBackend`` over ``mlflow models serve`` (``POST /invocations``)."""

    def __init__(self, opts: MlflowOptions) -> None:
        self.opts = opts
        self.labels = (
            read_labels(opts.labels_path)
            if opts.labels_path
            else tuple(str(i) for i in range(opts.num_classes))
        )
        h, w = opts.resize or (0, 0)
        self.spec = ResolvedInput(
            name="",
            kind=opts.input_kind,
            datatype=opts.dtype,
            layout=opts.layout,
            channels=opts.channels,
            height=h,
            width=w,
            batch=opts.batch,
            scale=1.0
            if opts.dtype == "UINT8"
            else (opts.scale if opts.scale is not None else 1.0 / 255.0),
            mean=opts.mean,
            std=opts.std,
        )
        self._token = bearer_token(opts.token_env, "mlflow")
        self._client = HttpClient(
            timeout_s=opts.timeout_s,
            label=f"mlflow target {opts.endpoint}",
            max_response_bytes=MAX_RESPONSE_BYTES,
            ssl_context=ssl.create_default_context() if opts.scheme == "https" else None,
        )

    def close(self) -> None:
        self._client.close()

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        return headers

    def info(self) -> target_pb2.TargetInfo:
        o = self.opts
        # The scoring server's health check; ``/ping`` sits beside ``/invocations``.
        ping = o.path.rsplit("/", 1)[0] + "/ping"
        resp = self._client.request(
            "GET", o.endpoint + ping, self._headers(), label=f"{o.endpoint}{ping}"
        )
        if resp.status != 200:
            raise TargetUnavailable(
                f"{o.endpoint}{ping}: HTTP {resp.status}: the model is not "
                f"ready: {error_text(resp.body, (self._token,))}",
                resp.retry_after_s,
            )
        if o.task == "detection":
            task, kind = common_pb2.TASK_TYPE_DETECTION, common_pb2.OUTPUT_KIND_BOXES
        else:
            task = common_pb2.TASK_TYPE_CLASSIFICATION
            kind = (
                common_pb2.OUTPUT_KIND_LABEL_ONLY
                if o.output == "labels"
                else common_pb2.OUTPUT_KIND_FULL_SCORES
            )
        return target_pb2.TargetInfo(
            name=f"mlflow {o.endpoint}{o.path}",
            task_type=task,
            labels=list(self.labels),
            output_kind=kind,
            version="mlflow pyfunc",
            input=target_pb2.InputSpec(
                height=self.spec.height,
                width=self.spec.width,
                channels=o.channels,
                max_batch_size=o.batch,
            ),
        )

    def predict(self, images: Sequence[common_pb2.Image]) -> list[common_pb2.Prediction]:
        spec = self.spec
        items: list[np.ndarray | bytes] = []
        sizes: list[tuple[int, int]] = []
        for i, img in enumerate(images):
            arr = decode_image(img, f"images[{i}]")  # InvalidArgument naming the image
            sizes.append((int(arr.shape[0]), int(arr.shape[1])))
            if spec.kind == "bytes":
                if spec.height and arr.shape[:2] != (spec.height, spec.width):
                    items.append(encode_png(fit_image(arr, spec.height, spec.width, 3)))
                elif img.WhichOneof("content") == "encoded":
                    items.append(img.encoded)
                else:
                    items.append(encode_png(arr))
            else:
                items.append(image_tensor([arr], spec)[0])
        frames = [(spec.height, spec.width) if spec.height else hw for hw in sizes]
        # A JSON tensor must be rectangular: without resize, images of one size per call.
        groups: list[list[int]] = []
        for i, x in enumerate(items):
            last = groups[-1] if groups else None
            same = (
                spec.kind == "bytes" or np.shape(items[last[0]]) == np.shape(x) if last else False
            )
            if last is not None and len(last) < spec.batch and same:
                last.append(i)
            else:
                groups.append([i])
        preds: list[common_pb2.Prediction] = []
        for group in groups:
            preds += self._call(images, items, sizes, frames, group)
        return preds

    def _call(
        self,
        images: Sequence[common_pb2.Image],
        items: list[np.ndarray | bytes],
        sizes: list[tuple[int, int]],
        frames: list[tuple[int, int]],
        idx: list[int],
    ) -> list[common_pb2.Prediction]:
        o = self.opts
        where = f"{o.endpoint}{o.path}"
        body = request_body(o, [items[i] for i in idx])
        resp = self._client.request(
            "POST",
            o.endpoint + o.path,
            {**self._headers(), "Content-Type": "application/json"},
            body,
            label=where,
        )
        if resp.retryable:
            raise resp.unavailable(f"{where}: HTTP {resp.status}: {server_error(resp.body, (self._token,))}")
        if resp.status != 200:
            raise TargetResponseError(f"{where}: HTTP {resp.status}: {server_error(resp.body, (self._token,))}")
        n = len(idx)
        try:
            raw = predictions_of(resp.body, n)
            out = [common_pb2.Prediction(image_id=images[i].image_id) for i in idx]
            names = self.labels
            if o.task == "detection":
                dets = detections_of(
                    raw, o, [sizes[i] for i in idx], [frames[i] for i in idx], len(names)
                )
                for p, d in zip(out, dets, strict=True):
                    p.detection.CopyFrom(d)
                    if names:
                        for b in p.detection.boxes:
                            b.name = names[b.label]
            elif o.output == "labels":
                for p, label in zip(out, labels_of(raw, n, names), strict=True):
                    p.classification.classes.add(label=label, name=names[label] if names else "")
            else:
                proba = scores_of(raw, n, o.output)
                if names and proba.shape[1] != len(names):
                    raise TargetResponseError(
                        f"predictions: {proba.shape[1]} scores per image "
                        f"but the label set has {len(names)} classes"
                    )
                cls_names = names or [str(c) for c in range(proba.shape[1])]
                for p, row in zip(out, proba, strict=True):
                    p.classification.CopyFrom(
                        classification_from_proba(
                            row, output="full_scores", top_k=len(cls_names), names=cls_names
                        )
                    )
        except TargetResponseError as exc:  # it may quote the answer, an echoed token too
            raise TargetResponseError(f"{where}: {scrub(exc.message, (self._token,))}") from None
        return out


def backend_from_url(url: str) -> MlflowBackend:
    """The proxy back end of an ``mlflow+http(s)://`` URL (nothing is contacted until the
    first call)."""
    return MlflowBackend(parse_url(url))
