"""MLflow pyfunc scoring server target adapter (``mlflow models serve``, and the same
``/invocations`` protocol behind MLflow deployments).

    mlflow+http://HOST:PORT[/PATH][?options]     PATH defaults to /invocations
    mlflow+https://HOST[:PORT][/PATH][?options]

Options (every one optional)::

    request=inputs|instances|dataframe_split   the request body (default inputs):
                              {"inputs": [...]} / {"instances": [...]}: one tensor per image;
                              {"dataframe_split": {"columns": [COLUMN], "data": [[b64], ...]}}
    input=tensor|bytes        tensor: decoded pixels (default; [H, W, C] per image, nested
                              lists); bytes: the PNG/JPEG file, base64 (default and only choice
                              for dataframe_split)
    column=NAME               dataframe_split's column (default "image")
    resize=HxW                model input size (default: each image's own size; then images of
                              one size go in one call)
    layout=nhwc|nchw          per-image tensor layout (default nhwc: [H, W, C])
    dtype=UINT8|FP32          UINT8: whole pixel values 0-255 (default); FP32: scaled and
                              normalised, x = (pixel * scale - mean) / std
    channels=1|3              colour channels (default 3)
    scale=S, mean=M[,M,M], std=S[,S,S]    FP32 only (scale defaults to 1/255)
    task=classification|detection         (default classification)
    output=probabilities|logits|labels    classification answers (default probabilities):
                              [N, C] scores (or records, one number per column), softmaxed when
                              logits; labels: one class index or class name per image
    labels=/path/labels.txt   class names, one a line; num_classes=N: names "0".."N-1"
    batch=N                   most images per request (default 32)
    timeout=S                 seconds per request (default 30)
    token_env=VAR             send "Authorization: Bearer $VAR"
    rate=R                    read by the proxy's rate limiter, ignored here
    boxes_output, scores_output, classes_output, count_output, box_format, box_coords,
    label_offset, min_score   task=detection, as for kserve targets: the answer is a dict of
                              batched arrays ({"boxes": [N, K, 4], "scores": [N, K], ...}, what
                              a pyfunc returning a dict of numpy arrays gives) or a list of
                              per-image dicts ([{"boxes": [K, 4], ...}, ...])

Errors: 408, 425, 429 and 5xx (with Retry-After), timeouts and refused connections become
``TargetUnavailable`` (retried by the proxy); any other status (the server's ``message``, never
its stack trace), malformed JSON, a missing ``predictions``, a count or shape that does not
fit, NaN scores, classes outside the label set become ``TargetResponseError`` naming the
part; an undecodable image ``InvalidArgument`` naming ``images[i]``.
"""

from __future__ import annotations

from fortis.adapters.mlflow_pyfunc.backend import MlflowBackend, backend_from_url, read_labels
from fortis.adapters.mlflow_pyfunc.codec import (
    detections_of,
    labels_of,
    predictions_of,
    request_body,
    scores_of,
)
from fortis.adapters.mlflow_pyfunc.options import SCHEMES, MlflowOptions, parse_url

__all__ = [
    "SCHEMES",
    "MlflowBackend",
    "MlflowOptions",
    "backend_from_url",
    "detections_of",
    "labels_of",
    "parse_url",
    "predictions_of",
    "read_labels",
    "request_body",
    "scores_of",
]
