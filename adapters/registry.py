"""Target back ends by URL scheme: how the proxy reaches a target that is not a built-in model.

    grpc://HOST:PORT                      any fortis.target.v1.TargetService (any language)
    kserve+grpc://HOST:PORT/MODEL         Open Inference Protocol (KServe v2) over gRPC
    kserve+http://HOST:PORT/MODEL         Open Inference Protocol over REST (KServe, Triton,
                                          Seldon MLServer, OpenVINO Model Server)
    mlflow+http://HOST:PORT[/PATH]        an MLflow pyfunc scoring server (/invocations)
    http-json:/path/to/profile.yaml       an HTTP/JSON vision API described by a profile
                                          (AWS Rekognition, Google Cloud Vision, Azure, ...)
    sagemaker:ENDPOINT?region=R           SageMaker runtime InvokeEndpoint (SigV4)
    vertex:ENDPOINT_ID?project=P&region=R Vertex AI endpoints.predict / rawPredict (OAuth)
    azureml:ENDPOINT?region=R&key=env:V   Azure ML online endpoint /score (key or Entra ID)
    torchserve://HOST:PORT/MODEL          TorchServe's inference API (+https for TLS)
    bentoml://HOST:PORT/ENDPOINT          a BentoML service's image endpoint (+https for TLS)
    rayserve://HOST:PORT/PATH             a Ray Serve HTTP application (+https for TLS)

Each scheme's module exposes ``backend_from_url(url) -> TargetBackend`` (see
``fortis.services.proxy.proxy.TargetBackend``); modules load only when their scheme is
used, so a missing optional dependency only matters to the targets that need it.
"""

from __future__ import annotations

import importlib
from typing import Any

from fortis.services.common.errors import InvalidArgument

SCHEMES: dict[str, str] = {
    "kserve+grpc": "fortis.adapters.kserve_v2",
    "kserve+http": "fortis.adapters.kserve_v2",
    "kserve+https": "fortis.adapters.kserve_v2",
    "http-json": "fortis.adapters.http_json",
    "mlflow+http": "fortis.adapters.mlflow_pyfunc",
    "mlflow+https": "fortis.adapters.mlflow_pyfunc",
    "sagemaker": "fortis.adapters.managed_endpoints",
    "vertex": "fortis.adapters.managed_endpoints",
    "azureml": "fortis.adapters.managed_endpoints",
    **{scheme: "fortis.adapters.model_servers"
       for scheme in ("torchserve", "torchserve+http", "torchserve+https",
                      "bentoml", "bentoml+http", "bentoml+https",
                      "rayserve", "rayserve+http", "rayserve+https")},
}


def scheme_of(url: str) -> str:
    return url.split(":", 1)[0] if ":" in url else ""


def backend_for(url: str) -> Any:
    """The proxy back end for ``url``; ``InvalidArgument`` on ``target`` for unknown schemes."""
    scheme = scheme_of(url)
    module = SCHEMES.get(scheme)
    if module is None:
        raise InvalidArgument("target", f"unknown target scheme '{scheme}' in '{url}'; known: "
                              f"builtin, grpc, {', '.join(sorted(SCHEMES))}")
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        raise InvalidArgument("target", f"the '{scheme}' adapter is not available: {exc}") from None
    return mod.backend_from_url(url)
