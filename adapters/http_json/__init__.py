"""HTTP/JSON vision APIs as Fortis targets, configured by a YAML profile, not coded.

    http-json:/path/to/profile.yaml        a profile file
    http-json:google-vision-labels         a profile shipped in ``adapters/profiles/``

A profile says how to send one image (base64 in a JSON template, the raw bytes, multipart form
data, or a URL the service fetches), how to authenticate (a header whose value comes from a
secret *reference*, ``env:VAR`` or ``file:/path``, never the secret itself; or a cloud kind --
``aws_sigv4``, ``google_oauth``, ``azure_ad`` -- signed by the vendor's library, see
``cloud_auth``), and where the answer is in the JSON (JMESPath expressions) with declarative
transforms: score scale, box format, mask encoding and label mapping. ``adapters/profiles/README.md`` documents every key;
``adapters/profiles/*.yaml`` are worked examples for AWS Rekognition, Google Cloud Vision and
Azure Image Analysis 4.0.

Errors, as the proxy expects them (``fortis.services.proxy.proxy.TargetBackend``):

* HTTP 429, 408, 5xx, AWS's HTTP 400 throttling answers, timeouts, refused connections ->
  ``errors.Unavailable`` with ``retry_after_s`` from a Retry-After header; the proxy retries
  with backoff and records the attempts in its ledger.
* An answer that does not fit the profile (not JSON, a missing ``items`` path, a box outside
  the image, a score outside 0-1 after scaling, a bad mask) -> ``TargetResponseError`` naming
  the problem and the image: a failed row in the ledger, never a crash.
* HTTP 400/413/415/422 -> ``errors.InvalidArgument`` on ``images``; other 4xx (401, 403, 404)
  -> ``HttpTargetError``. Neither is retried.

Missing numbers in an answer count as 0 (proto3 JSON, e.g. Google Cloud Vision, leaves out
zeros: a score of 0 or a box at x = 0 is absent), unless the profile says
``missing_numbers: error``.

Layout, by concern: ``profile`` (parsing and validation), ``templates`` and ``auth`` (the
``${...}`` syntax; secrets by reference), ``request`` (base64 / binary / multipart / URL
requests), ``image_server`` (the loopback file server of image: url), ``response`` (answers ->
predictions) and ``backend`` (``HttpJsonBackend``); HTTP goes through the shared
``fortis.adapters.http_client``. Everything is re-exported here.

Domain rule (docs/architecture.md section 4): no gRPC here, only HTTP transport and pure
transforms; the transforms (``box_to_pixels``, ``polygon_to_box``, ``decode_coco_rle``,
``decode_png_mask``, ``scale_score``, ...) are plain functions, tested without a server.
"""

from __future__ import annotations

from fortis.adapters.http_client import HttpClient, HttpResponse, parse_retry_after
from fortis.adapters.http_json.auth import AuthSpec, SecretRef, auth_headers, redact
from fortis.adapters.http_json.backend import HttpJsonBackend, HttpTargetError, backend_from_url
from fortis.adapters.http_json.image_server import ImageServer
from fortis.adapters.http_json.profile import (
    BOX_FORMATS,
    CLASSIFICATION_OUTPUTS,
    IMAGE_MODES,
    MASK_FORMATS,
    MASK_KINDS,
    PROFILES_DIR,
    SCORE_SCALES,
    TASKS,
    BoxSpec,
    ImageUrlSpec,
    MaskSpec,
    Profile,
    load_profile,
    parse_profile,
    profile_path,
)
from fortis.adapters.http_json.request import PreparedImage, build_request, prepare_image
from fortis.adapters.http_json.response import (
    box_to_pixels,
    check_box,
    coco_rle_counts,
    compose_class_map,
    decode_coco_rle,
    decode_png_mask,
    number,
    polygon_to_box,
    prediction_from_answer,
    scale_score,
)
from fortis.adapters.http_json.templates import (
    PLACEHOLDERS,
    expand_env,
    placeholders_in,
    render_template,
)
from fortis.adapters.target_errors import TargetResponseError, TargetUnavailable

__all__ = [
    "BOX_FORMATS", "CLASSIFICATION_OUTPUTS", "IMAGE_MODES", "MASK_FORMATS", "MASK_KINDS",
    "PLACEHOLDERS", "PROFILES_DIR", "SCORE_SCALES", "TASKS",
    "AuthSpec", "BoxSpec", "HttpClient", "HttpJsonBackend", "HttpResponse", "HttpTargetError",
    "ImageServer", "ImageUrlSpec", "MaskSpec", "PreparedImage", "Profile", "SecretRef",
    "TargetResponseError", "TargetUnavailable",
    "auth_headers", "backend_from_url", "box_to_pixels", "build_request", "check_box",
    "coco_rle_counts", "compose_class_map", "decode_coco_rle", "decode_png_mask", "expand_env",
    "load_profile", "number", "parse_profile", "parse_retry_after", "placeholders_in",
    "polygon_to_box", "prediction_from_answer", "prepare_image", "profile_path", "redact",
    "render_template", "scale_score",
]
