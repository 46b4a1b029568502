"""Managed model endpoints as target schemes: a scheme is an HTTP/JSON profile with parameters.

    sagemaker:ENDPOINT?region=R                     SageMaker runtime InvokeEndpoint, SigV4
                                                    (service sagemaker) by botocore
    vertex:ENDPOINT_ID?project=P&region=R           Vertex AI endpoints.predict (or
                                                    &method=rawPredict), google-auth bearer token
    azureml:ENDPOINT?region=R&key=env:VAR           Azure ML online endpoint /score, with the
    azureml:ENDPOINT?region=R&auth=aad              endpoint key or an Entra ID token

Every scheme also takes ``task=classification|detection`` (which shipped mapping in
``adapters/profiles/managed/`` to use; default classification), ``profile=PATH`` (a mapping of
your own: its request body and response paths are used, its URL and auth are replaced) and
``endpoint_url=URL`` (send to this base instead of the vendor's host: a private endpoint, a
VPC interface endpoint, a test stand-in). Like every target URL these are the operator's
(``fortis serve --target``, Helm values); tenants only name targets. ``endpoint_url`` keeps
the rule of profile URLs -- http:// or https:// only -- and allows plain http only to a
loopback host, so credentials never cross a network unencrypted.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

import yaml
from fortis.adapters.http_json.backend import HttpJsonBackend
from fortis.adapters.http_json.profile import PROFILES_DIR, parse_profile, profile_path
from fortis.services.common import errors

MAPPINGS_DIR = PROFILES_DIR / "managed"
SCHEMES = ("sagemaker", "vertex", "azureml")
#: Query keys every scheme takes; ``rate`` is the proxy's (TargetConfig), not ours.
_COMMON = {"task", "profile", "endpoint_url", "rate"}
_KEYS = {
    "sagemaker": _COMMON | {"region", "aws_profile"},
    "vertex": _COMMON | {"project", "region", "method", "credentials"},
    "azureml": _COMMON | {"region", "auth", "key", "deployment"},
}
_AWS_REGION = re.compile(r"[a-z]{2}(-[a-z]+)+-\d{1,2}")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,62}")
_GCP_REGION = re.compile(r"[a-z]+-[a-z]+\d{1,2}")
_GCP_PROJECT = re.compile(r"[a-z][a-z0-9-]{4,28}[a-z0-9]|\d{1,20}")
_AZURE_REGION = re.compile(r"[a-z][a-z0-9]{2,30}")


def _bad(url: str, msg: str) -> errors.InvalidArgument:
    return errors.InvalidArgument("target", f"'{url[:200]}': {msg}")


def _endpoint_base(url: str, given: str) -> str:
    """``endpoint_url``: http(s) only; plain http only to a loopback host."""
    parts = urlsplit(given)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise _bad(url, f"endpoint_url '{given}' is not an http:// or https:// URL")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise _bad(url, "endpoint_url takes a scheme, host, port and path only")
    if parts.scheme == "http":
        host = parts.hostname
        try:
            loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            raise _bad(
                url,
                f"endpoint_url '{given}' is plain http to a host that is not "
                "loopback; use https:// (credentials would cross the network "
                "unencrypted)",
            )
    return given.rstrip("/")


def _params(url: str) -> tuple[str, str, dict[str, str]]:
    scheme, _, rest = url.partition(":")
    rest = rest[2:] if rest.startswith("//") else rest
    name, _, query = rest.partition("?")
    raw = parse_qs(query, keep_blank_values=True)
    twice = sorted(k for k, v in raw.items() if len(v) > 1)
    if twice:  # the last would win silently: a duplicate is a typo, naming the wrong key
        raise _bad(url, f"setting {', '.join(twice)} given twice")
    q = {k: v[-1] for k, v in raw.items()}
    unknown = sorted(set(q) - _KEYS[scheme])
    if unknown:
        raise _bad(
            url,
            f"unknown setting {', '.join(unknown)}; {scheme}: takes "
            f"{', '.join(sorted(_KEYS[scheme] - {'rate'}))}",
        )
    return scheme, name, q


def _require(url: str, q: dict[str, str], key: str, pattern: re.Pattern[str], what: str) -> str:
    v = q.get(key, "")
    if not v:
        raise _bad(url, f"{key}= is required ({what})")
    if not pattern.fullmatch(v):
        raise _bad(url, f"{key} '{v[:80]}' is not {what}")
    return v


def _mapping(url: str, q: dict[str, str]) -> tuple[dict[str, Any], Path]:
    """The mapping profile's YAML (a shipped one by task, or ``profile=``) and its folder."""
    if "profile" in q:
        path = profile_path(q["profile"])
    else:
        task = q.get("task", "classification")
        if task not in ("classification", "detection"):
            raise _bad(
                url,
                f"task '{task[:40]}' is not classification or detection (or name "
                "a mapping with profile=)",
            )
        path = MAPPINGS_DIR / f"{task}.yaml"
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise _bad(url, f"cannot read the mapping profile '{path}': {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise _bad(url, f"the mapping profile '{path}' is not valid YAML: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("request"), dict):
        raise _bad(url, f"the mapping profile '{path}' has no request section")
    return data, path.parent


def profile_for(url: str) -> dict[str, Any]:
    """The profile mapping (``parse_profile`` input) a managed-endpoint URL stands for."""
    return _profile_and_folder(url)[0]


def _profile_and_folder(url: str) -> tuple[dict[str, Any], Path]:
    scheme, name, q = _params(url)
    if not _NAME.fullmatch(name):
        raise _bad(url, f"'{name[:80]}' is not an endpoint name (letters, digits, '-')")
    data, folder = _mapping(url, q)
    rq = data["request"]
    base = _endpoint_base(url, q["endpoint_url"]) if q.get("endpoint_url") else ""
    headers = dict(rq.get("headers") or {})
    if scheme == "sagemaker":
        region = _require(url, q, "region", _AWS_REGION, "an AWS region like eu-west-1")
        host = base or f"https://runtime.sagemaker.{region}.amazonaws.com"
        rq["url"] = f"{host}/endpoints/{quote(name)}/invocations"
        rq["auth"] = {"kind": "aws_sigv4", "service": "sagemaker", "region": region}
        if q.get("aws_profile"):
            rq["auth"]["aws_profile"] = q["aws_profile"]
    elif scheme == "vertex":
        region = _require(url, q, "region", _GCP_REGION, "a Google Cloud region like europe-west4")
        project = _require(url, q, "project", _GCP_PROJECT, "a Google Cloud project id or number")
        method = q.get("method", "predict")
        if method not in ("predict", "rawPredict"):
            raise _bad(url, f"method '{method[:40]}' is not predict or rawPredict")
        host = base or f"https://{region}-aiplatform.googleapis.com"
        rq["url"] = (
            f"{host}/v1/projects/{project}/locations/{region}/endpoints/{quote(name)}:{method}"
        )
        rq["auth"] = {"kind": "google_oauth"}
        if q.get("credentials"):
            rq["auth"]["credentials"] = q["credentials"]
    else:
        region = _require(url, q, "region", _AZURE_REGION, "an Azure region like westeurope")
        host = base or f"https://{name.lower()}.{region}.inference.ml.azure.com"
        rq["url"] = f"{host}/score"
        auth = q.get("auth", "key" if "key" in q else "aad")
        if auth == "key":
            if not q.get("key"):
                raise _bad(url, "auth=key needs key=env:VAR or key=file:/path (the endpoint key)")
            rq["auth"] = {"header": "Authorization", "prefix": "Bearer ", "secret": q["key"]}
        elif auth == "aad":
            if "key" in q:
                raise _bad(url, "key= is only used with auth=key")
            rq["auth"] = {"kind": "azure_ad", "scope": "https://ml.azure.com/.default"}
        else:
            raise _bad(url, f"auth '{auth[:40]}' is not key or aad")
        if q.get("deployment"):
            if not _NAME.fullmatch(q["deployment"]):
                raise _bad(url, f"deployment '{q['deployment'][:80]}' is not a deployment name")
            headers["azureml-model-deployment"] = q["deployment"]
    if headers:
        rq["headers"] = headers
    data["name"] = f"{scheme}:{name}"
    return data, folder


def backend_from_url(url: str) -> HttpJsonBackend:
    """The HTTP/JSON back end of a ``sagemaker:``, ``vertex:`` or ``azureml:`` URL."""
    data, folder = _profile_and_folder(url)
    return HttpJsonBackend(parse_profile(data, source=url.split("?", 1)[0], base_dir=folder))
