"""Cloud credentials for HTTP/JSON targets, with each vendor's own library doing the crypto:

* ``aws_sigv4`` -- botocore's credential chain (environment, shared credentials file, web
  identity / IRSA through ``AWS_WEB_IDENTITY_TOKEN_FILE`` + ``AWS_ROLE_ARN``, session tokens,
  container and instance roles) and ``botocore.auth.SigV4Auth`` over the exact bytes sent.
  Frozen credentials are taken per request, so a refresh in the middle of a run is used.
* ``google_oauth`` -- google-auth: a service-account key from a secret reference, or
  ``google.auth.default()`` (``GOOGLE_APPLICATION_CREDENTIALS``, workload identity, the
  metadata server); a bearer token refreshed under a lock when ``credentials.valid`` is false.
* ``azure_ad`` -- azure-identity (``DefaultAzureCredential``, ``ClientSecretCredential``,
  ``ManagedIdentityCredential``); the token for ``scope`` is kept until 5 minutes before it
  expires.

Every credential is read from the environment or from mounted secret files (Kubernetes
secrets), never from the profile. A credential the vendor refuses to issue becomes
``FailedPrecondition`` naming the profile, never the key (a Google or AWS token service that
does not answer is ``Unavailable``; each token request is bounded by the profile's timeout); every secret value a signer has
used is remembered so ``redact`` can scrub it from what a target echoes back; and the vendor
libraries' DEBUG records, which can quote tokens and signed requests, are held back
(``quiet_vendor_logs``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from fortis.adapters.http_json.auth import SecretRef
from fortis.adapters.http_json.templates import expand_env
from fortis.services.common import errors

#: What each kind needs and may take (profile.py validates against this).
CLOUD_AUTH_KINDS = ("aws_sigv4", "google_oauth", "azure_ad")
GOOGLE_DEFAULT_SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)
AZURE_CREDENTIALS = ("default", "client_secret", "managed_identity")
#: Entra ID authorities MSAL knows (instance discovery works for them).
AZURE_PUBLIC_AUTHORITIES = frozenset(
    {
        "login.microsoftonline.com",
        "login.microsoft.com",
        "login.windows.net",
        "sts.windows.net",
        "login.chinacloudapi.cn",
        "login.microsoftonline.us",
        "login.partner.microsoftonline.cn",
    }
)
#: An Azure token is used until this many seconds before it expires.
AZURE_REFRESH_MARGIN_S = 300.0
#: Seconds a token request may take when the caller names no timeout (google-auth's own
#: default is 120 s, azure-core's 300 s).
DEFAULT_TOKEN_TIMEOUT_S = 30.0
#: Secret values a signer remembers for redaction (old tokens may still be echoed).
_REMEMBERED = 16
#: Loggers of the vendor libraries; their DEBUG records can carry tokens or signed requests.
VENDOR_LOGGERS = (
    "botocore",
    "boto3",
    "google.auth",
    "google.oauth2",
    "azure.identity",
    "azure.core",
    "msal",
)


_QUIET_LOCK = threading.Lock()
_QUIETED = False


def quiet_vendor_logs() -> None:
    """Raise the vendor loggers to INFO at least, so that a root logger at DEBUG (``--log-level debug``) never writes their DEBUG records -- token answers,
    canonical requests, signed headers -- to the log (their children inherit the level)."""
    global _QUIETED
    with _QUIET_LOCK:
        if _QUIETED:
            return
        for name in VENDOR_LOGGERS:
            lg = logging.getLogger(name)
            if lg.level < logging.INFO:  # NOTSET (0) included
                lg.setLevel(logging.INFO)
        _QUIETED = True


def _no_answer(profile: str, kind: str, exc: BaseException) -> errors.Unavailable:
    """The token service could not be reached or did not answer in time: retried like any
    unavailable target, not reported as refused credentials."""
    return errors.Unavailable(
        f"http-json target '{profile}': the {kind} token service did not answer "
        f"({type(exc).__name__})"
    )


def _refused(profile: str, kind: str, exc: BaseException) -> errors.FailedPrecondition:
    """A refused or missing credential: the profile and the kind of failure, never the text of
    the vendor's exception (which may quote a key id, a token or a file's contents)."""
    return errors.FailedPrecondition(
        f"http-json target '{profile}': {kind} credentials were refused or are missing "
        f"({type(exc).__name__}); check the credentials this profile's auth names"
    )


@dataclass(frozen=True, kw_only=True)
class CloudAuthSpec:
    """``request.auth`` of a cloud kind, as parsed (no credential is read here)."""

    kind: str
    profile: str = ""
    # aws_sigv4
    service: str = ""
    region: str = ""
    aws_profile: str = ""
    # google_oauth
    credentials: SecretRef | None = None  # a service-account key (JSON)
    scopes: tuple[str, ...] = GOOGLE_DEFAULT_SCOPES
    # azure_ad
    scope: str = ""
    credential: str = "default"
    tenant_id: str = ""
    client_id: str = ""
    client_secret: SecretRef | None = None
    authority: str = ""
    options: Mapping[str, str] = field(default_factory=dict)

    def describe(self) -> dict[str, str]:
        """What the start-up log line says about this auth (names, never values)."""
        out = {"auth": self.kind}
        if self.kind == "aws_sigv4":
            out.update(service=self.service, region=self.region)
        elif self.kind == "google_oauth":
            out["credentials"] = self.credentials.ref if self.credentials else "google.auth.default"
        else:
            out.update(scope=self.scope, credential=self.credential)
        return out

    def signer(self, profile: str, *, timeout_s: float = DEFAULT_TOKEN_TIMEOUT_S) -> Signer:
        """The signer; ``timeout_s`` bounds each request for a token (the profile's own
        timeout), so a token endpoint that hangs cannot hold every call behind its lock."""
        if self.kind == "aws_sigv4":
            return AwsSigV4Signer(self, profile, timeout_s)
        if self.kind == "google_oauth":
            return GoogleOAuthSigner(self, profile, timeout_s)
        return AzureAdSigner(self, profile, timeout_s)


class Signer:
    """Adds the credentials to one request. Thread-safe; ``check`` fetches a credential at
    start-up so a wrong one fails there, not on the first query."""

    def __init__(self, spec: CloudAuthSpec, profile: str) -> None:
        quiet_vendor_logs()
        self.spec = spec
        self.profile = profile
        self._lock = threading.Lock()
        self._secrets: deque[str] = deque(maxlen=_REMEMBERED)

    def check(self) -> None:
        self.sign("GET", "https://check.invalid/", {}, None)

    def sign(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes | None
    ) -> dict[str, str]:
        raise NotImplementedError

    def secret_values(self) -> list[str]:
        with self._lock:
            return list(self._secrets)

    def _remember(self, *values: str | None) -> None:
        for v in values:
            if v and len(v) >= 4 and v not in self._secrets:
                self._secrets.append(v)


class AwsSigV4Signer(Signer):
    """SigV4 by botocore over the request as sent (method, URL, headers, body)."""

    def __init__(
        self, spec: CloudAuthSpec, profile: str, timeout_s: float = DEFAULT_TOKEN_TIMEOUT_S
    ) -> None:
        super().__init__(spec, profile)
        import botocore.session
        from botocore.config import Config

        session = botocore.session.Session(profile=spec.aws_profile or None)
        # STS (web identity, assumed roles) is asked under botocore's refresh lock: with its
        # 60 s defaults and retries a hanging STS would hold every call of the target; the
        # profile's timeout bounds each try, two tries in all.
        session.set_default_client_config(
            Config(
                connect_timeout=timeout_s,
                read_timeout=timeout_s,
                retries={"max_attempts": 2, "mode": "standard"},
            )
        )
        try:
            self._credentials = session.get_credentials()
        except Exception as exc:  # noqa: BLE001 - a broken config or profile: refused, named
            raise _refused(profile, "aws_sigv4", exc) from None

    def sign(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes | None
    ) -> dict[str, str]:
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest

        if self._credentials is None:
            raise errors.FailedPrecondition(
                f"http-json target '{self.profile}': aws_sigv4 found no AWS credentials "
                "(environment, shared credentials file, web identity or instance role)"
            )
        from botocore.exceptions import ConnectionError as BotoConnectionError
        from botocore.exceptions import HTTPClientError

        try:
            frozen = self._credentials.get_frozen_credentials()  # refreshed when due
        except (BotoConnectionError, HTTPClientError) as exc:
            raise _no_answer(self.profile, "aws_sigv4", exc) from None
        except Exception as exc:  # noqa: BLE001 - STS refused the role or token
            raise _refused(self.profile, "aws_sigv4", exc) from None
        with self._lock:
            self._remember(frozen.secret_key, frozen.token)
        req = AWSRequest(method=method, url=url, data=body or b"", headers=dict(headers))
        SigV4Auth(frozen, self.spec.service, self.spec.region).add_auth(req)
        return {
            k: v for k, v in req.headers.items() if k.lower() not in {h.lower() for h in headers}
        }


class GoogleOAuthSigner(Signer):
    """A bearer token of google-auth credentials, refreshed before it expires."""

    def __init__(
        self, spec: CloudAuthSpec, profile: str, timeout_s: float = DEFAULT_TOKEN_TIMEOUT_S
    ) -> None:
        super().__init__(spec, profile)
        import google.auth
        from google.auth.transport.requests import Request
        from google.oauth2 import service_account

        transport = Request()

        def request(*args: Any, **kwargs: Any) -> Any:
            kwargs.setdefault("timeout", timeout_s)
            return transport(*args, **kwargs)

        self._request = request
        try:
            if spec.credentials is not None:
                info = json.loads(spec.credentials.resolve_text())
                if not isinstance(info, dict):
                    raise ValueError("not a JSON object")
                self._creds = service_account.Credentials.from_service_account_info(
                    info, scopes=list(spec.scopes)
                )
                self._remember(str(info.get("private_key_id", "")))
            else:
                self._creds, _ = google.auth.default(scopes=list(spec.scopes))
        except errors.FortisError:
            raise
        except Exception as exc:  # noqa: BLE001 - unreadable key or no ADC: refused, named
            raise _refused(profile, "google_oauth", exc) from None

    def sign(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes | None
    ) -> dict[str, str]:
        with self._lock:
            if not self._creds.valid:
                from google.auth.exceptions import TransportError

                try:
                    self._creds.refresh(self._request)
                except TransportError as exc:  # unreachable, or no answer in time
                    raise _no_answer(self.profile, "google_oauth", exc) from None
                except Exception as exc:  # noqa: BLE001 - the token endpoint said no
                    raise _refused(self.profile, "google_oauth", exc) from None
            token = self._creds.token
            self._remember(token)
        return {"Authorization": f"Bearer {token}"}


class AzureAdSigner(Signer):
    """A bearer token of an azure-identity credential for ``scope``."""

    def __init__(
        self, spec: CloudAuthSpec, profile: str, timeout_s: float = DEFAULT_TOKEN_TIMEOUT_S
    ) -> None:
        super().__init__(spec, profile)
        import azure.identity as ai

        # azure-core's transport reads these; its defaults wait 300 s for a token
        kw: dict[str, Any] = {"connection_timeout": timeout_s, "read_timeout": timeout_s}
        authority = spec.authority or os.environ.get("AZURE_AUTHORITY_HOST", "")
        if spec.authority:
            kw["authority"] = spec.authority
        host = urlsplit(authority if "://" in authority else f"https://{authority}").hostname
        if authority and host not in AZURE_PUBLIC_AUTHORITIES:
            # MSAL would validate an unknown authority against login.microsoftonline.com's
            # instance discovery; a private or sovereign authority the operator named is
            # trusted as given (Azure Stack, AD FS, an in-cluster stand-in).
            kw["disable_instance_discovery"] = True
        try:
            if spec.credential == "client_secret":
                assert spec.client_secret is not None
                secret = spec.client_secret.resolve()
                self._remember(secret)
                self._cred: Any = ai.ClientSecretCredential(
                    spec.tenant_id, spec.client_id, secret, **kw
                )
            elif spec.credential == "managed_identity":
                self._cred = ai.ManagedIdentityCredential(client_id=spec.client_id or None)
            else:
                self._cred = ai.DefaultAzureCredential(**kw)
        except errors.FortisError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise _refused(profile, "azure_ad", exc) from None
        self._token = ""
        self._expires_on = 0.0

    def sign(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes | None
    ) -> dict[str, str]:
        with self._lock:
            if not self._token or time.time() >= self._expires_on - AZURE_REFRESH_MARGIN_S:
                try:
                    tok = self._cred.get_token(self.spec.scope)
                except Exception as exc:  # noqa: BLE001 - ClientAuthenticationError & co.
                    raise _refused(self.profile, "azure_ad", exc) from None
                self._token, self._expires_on = tok.token, float(tok.expires_on)
                self._remember(tok.token)
            token = self._token
        return {"Authorization": f"Bearer {token}"}


# -- parsing ``request.auth`` of a cloud kind (profile.py reads the rest of the profile) -------


def _env_string(
    r: Any, key: str, problems: list[errors.FieldViolation], *, required: bool = False
) -> str:
    """A non-secret setting that may use ``${env:VAR}`` (a region, a tenant id)."""
    text = r.string(key, required=required)
    if not text:
        return ""
    try:
        return expand_env(text, r.name(key))
    except errors.InvalidArgument as exc:
        problems.extend(exc.violations)
        return ""


def parse_cloud_auth(
    kind: str,
    r: Any,
    problems: list[errors.FieldViolation],
    secret_ref: Callable[[Any, str], SecretRef | None],
) -> CloudAuthSpec | None:
    """The settings of ``kind`` from profile.py's reader ``r`` (problems named by dotted
    field); None when a required one is missing or wrong."""
    if kind == "aws_sigv4":
        service = _env_string(r, "service", problems, required=True)
        region = _env_string(r, "region", problems, required=True)
        if region and not re.fullmatch(r"[a-z]{2}(-[a-z]+)+-\d{1,2}", region):
            r.bad("region", f"'{region}' is not an AWS region name (like eu-west-1)")
            region = ""
        aws_profile = _env_string(r, "aws_profile", problems)
        if not (service and region):
            return None
        return CloudAuthSpec(kind=kind, service=service, region=region, aws_profile=aws_profile)
    if kind == "google_oauth":
        creds = secret_ref(r, "credentials") if r.data.get("credentials") is not None else None
        r.used.add("credentials")
        raw_scopes = r.get("scopes")
        scopes = GOOGLE_DEFAULT_SCOPES
        if raw_scopes is not None:
            if (
                not isinstance(raw_scopes, list)
                or not raw_scopes
                or not all(isinstance(x, str) and x.startswith("https://") for x in raw_scopes)
            ):
                r.bad("scopes", "must be a list of https:// OAuth scope URLs")
            else:
                scopes = tuple(raw_scopes)
        return CloudAuthSpec(kind=kind, credentials=creds, scopes=scopes)
    scope = _env_string(r, "scope", problems, required=True)
    if scope and not scope.startswith("https://"):
        r.bad(
            "scope",
            f"'{scope}' is not a scope URL (like https://cognitiveservices.azure.com/.default)",
        )
        scope = ""
    credential = r.string("credential", "default", choices=AZURE_CREDENTIALS)
    need = credential == "client_secret"
    tenant_id = _env_string(r, "tenant_id", problems, required=need)
    client_id = _env_string(r, "client_id", problems, required=need)
    secret = secret_ref(r, "client_secret") if need else None
    if not need and r.data.get("client_secret") is not None:
        r.bad("client_secret", f"only used by credential: client_secret, not {credential}")
    authority = _env_string(r, "authority", problems)
    if not scope or (need and not (tenant_id and client_id and secret)):
        return None
    return CloudAuthSpec(
        kind=kind,
        scope=scope,
        credential=credential,
        tenant_id=tenant_id,
        client_id=client_id,
        client_secret=secret,
        authority=authority,
    )
