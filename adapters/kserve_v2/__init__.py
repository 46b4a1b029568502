"""Open Inference Protocol (KServe v2) target adapter, over gRPC and REST.

Reaches any server that speaks the Open Inference Protocol -- KServe, Triton, Seldon
MLServer, OpenVINO Model Server -- as a Fortis target (``TargetBackend`` of the proxy)::

    kserve+grpc://HOST:PORT/MODEL[?options]      gRPC (inference.GRPCInferenceService)
    kserve+http://HOST:PORT/MODEL[?options]      REST (/v2/models/MODEL/...)
    kserve+https://HOST[:PORT]/MODEL[?options]   REST over TLS

Options (every one optional; metadata means the model's ``/v2/models/MODEL`` / ModelMetadata
answer, read once and cached)::

    version=V                 model version (default: the server's choice)
    input=tensor|bytes        tensor: decoded, resized, normalised pixels (default);
                              bytes: the PNG/JPEG file as a BYTES element (models that decode)
    input_name=NAME           input tensor (default: metadata's first input, else "input")
    output_name=NAME          output tensor (default: the only output, else metadata's first)
    layout=nchw|nhwc          pixel layout (default: from the metadata shape, else nchw)
    dtype=FP32|FP16|UINT8     input datatype (default: metadata's, else FP32)
    channels=1|3              colour channels (default: from the metadata shape, else 3)
    resize=HxW                model input size (default: from the metadata shape, else each
                              image's own size; images of different sizes go in separate calls)
    scale=S                   pixel multiplier, e.g. 1/255 (default 1/255 for FP*, 1 for UINT8)
    mean=M[,M,M]&std=S[,S,S]  per-channel normalisation: x = (pixel * scale - mean) / std
    output=probabilities|logits   what the output holds; logits are turned into softmax scores
    labels=/path/labels.txt   class names, one a line (default: a "labels" parameter in the
                              metadata -- JSON list or one name a line -- else "0".."C-1")
    raw=1                     gRPC: raw_input_contents instead of typed contents; REST: the
                              binary tensor data extension (Triton) instead of a JSON data list
    batch=N                   most images per inference request (default 32, or the model's
                              fixed batch dimension)
    timeout=S                 seconds per request (default 30)
    token_env=VAR             send "Authorization: Bearer $VAR" (gRPC: authorization metadata)
    host=NAME                 Host header / gRPC authority (KServe ingress routing)
    tls=1                     gRPC over TLS (REST: use kserve+https)
    rate=R                    read by the proxy's rate limiter, ignored here
    task=classification|detection|segmentation   what the model answers (default
                              classification); the options below apply to one task each

Detection (``tasks`` reads padded [N, K, ...] tensors; TF OD API / Triton NMS names first)::

    boxes_output=NAME         default: detection_boxes, boxes or bboxes, whichever is answered
    scores_output=NAME        default: detection_scores or scores (optional unless named)
    classes_output=NAME       default: detection_classes, classes or labels (optional; -1 = pad)
    count_output=NAME         default: num_detections, num_dets or count (optional)
    box_format=xyxy|xywh|cxcywh|yxyx     (default xyxy)
    box_coords=pixel|normalised          pixel: of the model input, scaled back (default)
    label_offset=N            subtracted from class ids (TF OD API: 1; default 0)
    min_score=S               detections scored below S are dropped (default 0)

Segmentation (output_name's tensor: [N, H, W] class ids, [N, 1, H, W] ids or foreground
probability, or [N, C, H, W] scores argmaxed; resized to the image by nearest neighbour)::

    mask_layout=chw|hwc       score map channel axis (default chw)
    mask_threshold=T          one-channel float masks: foreground above T (default 0.5)

Preprocessing for ``input=tensor`` matches the built-in torch targets: an alpha channel is
dropped, the image is resized to HxW (``cv2.INTER_AREA`` when shrinking, ``INTER_LINEAR``
otherwise; no crop, aspect ratio not kept), grey is repeated to RGB or RGB turned to grey
(``COLOR_RGB2GRAY``) as the model needs, then scaled and normalised.

Answers are read from typed contents or ``raw_output_contents`` (gRPC), from the JSON ``data``
list or the binary data extension (REST). Errors: HTTP 429/503 (with Retry-After), 408, 425,
any 5xx, timeouts, refused connections and gRPC UNAVAILABLE / DEADLINE_EXCEEDED /
RESOURCE_EXHAUSTED become ``errors.Unavailable`` (retried by the proxy, honouring
``retry_after_s``); a reply the adapter cannot use (malformed JSON, missing output, wrong
shape or datatype, other HTTP 4xx or gRPC codes) becomes ``TargetResponseError`` naming what
was wrong, and an undecodable image ``InvalidArgument`` naming ``images[i]``.

Layout: ``options`` (URL parsing), ``metadata`` (model metadata, input resolution), ``codec``
(tensors and OIP messages, pure), ``tasks`` (detection and segmentation outputs, pure), ``transport`` (the protocol both transports follow),
``rest_transport`` (REST on the shared ``fortis.adapters.http_client``), ``grpc_transport``
(the only module importing grpc, with the stubs generated into ``kserve_v2_protos`` by
scripts/gen_kserve_protos.py) and ``backend``. Everything is re-exported here.
"""

from __future__ import annotations

from fortis.adapters.http_client import parse_retry_after
from fortis.adapters.kserve_v2.backend import METADATA_RETRY_S, KServeV2Backend, backend_from_url
from fortis.adapters.kserve_v2.codec import (
    CONTENTS_FIELD,
    NUMPY_DTYPES,
    InTensor,
    OutTensor,
    class_names,
    fit_image,
    image_tensor,
    infer_request_json,
    infer_request_proto,
    outputs_from_json,
    outputs_from_proto,
    pick_output,
    raw_bytes,
    scores_of,
    softmax,
    split_raw_bytes_elements,
    to_probabilities,
)
from fortis.adapters.kserve_v2.grpc_transport import GrpcTransport
from fortis.adapters.kserve_v2.metadata import (
    ModelMeta,
    ResolvedInput,
    TensorMeta,
    meta_from_json,
    meta_from_proto,
    resolve_input,
)
from fortis.adapters.kserve_v2.options import (
    DEFAULT_BATCH,
    DEFAULT_TIMEOUT_S,
    INPUT_DTYPES,
    SCHEMES,
    DetectionFormat,
    KServeOptions,
    parse_labels,
    parse_url,
    read_labels,
)
from fortis.adapters.kserve_v2.rest_transport import HttpTransport, error_text
from fortis.adapters.kserve_v2.tasks import (
    DETECTION_OUTPUTS,
    decode_class_maps,
    decode_detections,
)
from fortis.adapters.kserve_v2.transport import MAX_MESSAGE_BYTES, MessageTooLarge, Transport
from fortis.adapters.target_errors import TargetResponseError, TargetUnavailable

__all__ = [
    "CONTENTS_FIELD", "DEFAULT_BATCH", "DEFAULT_TIMEOUT_S", "DETECTION_OUTPUTS", "INPUT_DTYPES",
    "MAX_MESSAGE_BYTES", "DetectionFormat", "decode_class_maps", "decode_detections",
    "METADATA_RETRY_S", "NUMPY_DTYPES", "SCHEMES",
    "GrpcTransport", "HttpTransport", "InTensor", "KServeOptions", "KServeV2Backend",
    "MessageTooLarge", "ModelMeta", "OutTensor", "ResolvedInput", "TargetResponseError",
    "TargetUnavailable", "TensorMeta", "Transport",
    "backend_from_url", "class_names", "error_text", "fit_image", "image_tensor",
    "infer_request_json", "infer_request_proto", "meta_from_json", "meta_from_proto",
    "outputs_from_json", "outputs_from_proto", "parse_labels", "parse_retry_after", "parse_url",
    "pick_output", "raw_bytes", "read_labels", "resolve_input", "scores_of", "softmax",
    "split_raw_bytes_elements", "to_probabilities",
]
