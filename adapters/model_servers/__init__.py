"""Model-server target adapter: TorchServe's inference API, BentoML service endpoints and Ray
Serve HTTP applications.

All take one encoded image per HTTP request and answer JSON, so one back end serves them::

    torchserve://HOST[:PORT]/MODEL[/VERSION][?options]   POST /predictions/MODEL[/VERSION],
    torchserve+https://...                               the image bytes as the body
    bentoml://HOST[:PORT]/ENDPOINT[?options]             POST /ENDPOINT, the image as a
    bentoml+https://...                                  multipart file (or base64 in JSON)
    rayserve://HOST[:PORT][/PATH][?options]              POST /PATH (an application's route
    rayserve+https://...                                 prefix and any path below it), the
                                                         image bytes as the body (or base64 in
                                                         JSON, or a multipart file)

Default ports: TorchServe 8080, BentoML 3000, Ray Serve 8000 (443 for +https). Options (all
optional)::

    task=classification|detection   what the model does (default classification)
    labels=FILE          the target's label set, which numbers its labels (IEEE-P6): one name a
                         line, a JSON list, or a JSON object index -> name (TorchServe's
                         index_to_name.json, whose [id, name] values give the name). Without
                         it, labels must be class indices written as digits.
    output=top_k|full_scores|label_only   classification output kind (default top_k)
    top_k=K              classes kept per answer for top_k (default 5, as image_classifier)
    min_score=S          drop classes / boxes scored below S (default 0)
    box_format=xyxy|xywh pixel boxes: x1,y1,x2,y2 (TorchServe's object_detector) or x,y,w,h
    version=V            TorchServe model version (or /MODEL/VERSION in the path)
    input=multipart|json BentoML: the image as a multipart file, or base64 in a JSON object
    input=raw|json|multipart  Ray Serve: the image bytes as the body (default), or as above
    field=NAME           BentoML: the endpoint's image parameter; Ray Serve: the JSON key or
                         form field of input=json|multipart (default image)
    concurrency=N        requests in flight at once (default 4)
    timeout=S            seconds per request (default 30)
    max_answer_bytes=N   larger answers are refused unread (default 8 MiB)
    token_env=VAR        send "Authorization: Bearer $VAR" (TorchServe token authorization)
    rate=R               read by the proxy's rate limiter, ignored here

Answers (see ``answers``): a ``{label: score}`` object, a list of ``{label, score}``, or a
list of per-class scores for classification; TorchServe object_detector's list of ``{label:
[x1, y1, x2, y2], "score": s}`` or ``{label, box, score}`` objects for detection. Every answer
is checked (depth, size, types, NaN, scores in [0, 1], boxes inside the image) and one that
does not fit is a ``TargetResponseError`` naming the field. HTTP 408/425/429/5xx and transport
failures are ``TargetUnavailable`` (retried by the proxy with backoff, honouring Retry-After);
413/415/422 an ``InvalidArgument`` naming the image; any other status a
``TargetResponseError`` with the server's message (the token never appears in it).
"""

from __future__ import annotations

from fortis.adapters.model_servers.answers import AnswerSpec, BadAnswer, parse_json, prediction
from fortis.adapters.model_servers.backend import ModelServerBackend, backend_from_url
from fortis.adapters.model_servers.options import (
    SCHEMES,
    ServerOptions,
    parse_labels,
    parse_url,
    read_labels,
)

__all__ = [
    "SCHEMES",
    "AnswerSpec",
    "BadAnswer",
    "ModelServerBackend",
    "ServerOptions",
    "backend_from_url",
    "parse_json",
    "parse_labels",
    "parse_url",
    "prediction",
    "read_labels",
]
