"""Datasets read from S3-compatible object storage: the S3 implementation of the evaluation
service's dataset store (``services/evaluation/dataset_store.py``), with botocore.

A plan names ``dataset.store.s3: {bucket, prefix, endpoint_url, region, credentials}``; its
``credentials`` is the *name* of store credentials the operator configured for the calling
tenant (``fortis serve --dataset-stores FILE``), never a key. One tenant cannot use another's
credentials (an unknown name and another tenant's name read the same), and the server's own
instance credentials (environment, instance profile) are used only where the operator allows
it (``instance_credentials: true``) and the plan asks for ``credentials: instance``, and
then only to AWS or the operator's ``instance_endpoints``. The endpoints a credential may be
sent to are the operator's list, so a plan cannot make the server sign requests to a host of
its choosing (a session token travels in plain sight in every request).

The operator's file (YAML)::

    s3:
      instance_credentials: false
      instance_endpoints: []                          # besides AWS, for instance credentials
      tenants:
        tenant-a:
          team-data:
            access_key_id: env:TEAM_A_KEY_ID          # secret references, resolved per use
            secret_access_key: file:/run/secrets/team-a
            session_token: env:TEAM_A_TOKEN           # optional
            endpoints: ["https://minio.internal:9000"]  # optional; default: AWS only
            region: eu-west-1                         # optional

Every key is the prefix joined with a confined relative path (no ``..``, not absolute), so
nothing outside the prefix is read; a missing key reads "not found under the S3 prefix".
Objects are sized with HEAD before they are read, whole-object reads are ranged GETs bounded
by the caller's limit, and streams are the GET's streaming body (never the whole object in
memory, never the bucket copied). The server's answers are not trusted: a body is read no
further than HEAD's size and must keep a minimum rate, redirects are not followed (botocore
does not follow them), a listing must stay inside the folder asked for. Errors name the plan's field and the S3 error code only:
no key, secret or signature is ever in a message or a log line.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any

import structlog
import yaml
from fortis.adapters.http_json.auth import SecretRef
from fortis.services.common.errors import (
    FailedPrecondition,
    InvalidArgument,
    PermissionDenied,
    Unavailable,
)
from fortis.services.common.paths import relative_path

__all__ = ["MAX_OBJECTS", "S3Credential", "S3Store", "S3Stores", "load_config"]

#: Objects one store may be asked about (HEADs and GETs): bounds what one plan costs.
MAX_OBJECTS = 1_000_000
#: A body must arrive at this average rate once :data:`STREAM_GRACE_S` have passed, bytes/s:
#: a server that trickles (or never ends) must not hold a reader for ever (botocore's read
#: timeout is per socket read, so one byte a few seconds apart never trips it).
MIN_STREAM_RATE = 64 * 1024
STREAM_GRACE_S = 60.0
NOT_FOUND = "not found under the S3 prefix"
_FIELD = "dataset.store.s3"
_DENIED = {
    "AccessDenied",
    "403",
    "SignatureDoesNotMatch",
    "InvalidAccessKeyId",
    "InvalidToken",
    "ExpiredToken",
    "AllAccessDisabled",
    "AccountProblem",
}
_MISSING = {"NoSuchKey", "404", "NotFound"}
#: Error codes repeated in messages as the server gave them; any other code is the server's
#: own text (a hostile one may echo the request's access key id) and is shown as its status.
_KNOWN_CODES = {
    "InternalError",
    "InvalidArgument",
    "InvalidBucketName",
    "InvalidObjectState",
    "InvalidRange",
    "InvalidRequest",
    "KeyTooLongError",
    "MethodNotAllowed",
    "PermanentRedirect",
    "PreconditionFailed",
    "RequestTimeout",
    "ServiceUnavailable",
    "SlowDown",
    "TemporaryRedirect",
}
_SECRET_REF = re.compile(r"(env:[A-Za-z_][A-Za-z0-9_]*|file:/.+)")

log = structlog.get_logger("fortis.adapters.s3_store")

# botocore logs request headers at DEBUG; the server's logging must never carry them.
logging.getLogger("botocore").setLevel(logging.WARNING)


@dataclass(frozen=True, kw_only=True)
class S3Credential:
    """One named credential of one tenant: secret references (resolved on each use, so a
    rotated file is picked up), the endpoints it may be sent to, and its region."""

    access_key_id: SecretRef
    secret_access_key: SecretRef
    session_token: SecretRef | None = None
    endpoints: tuple[str, ...] = ()
    region: str = ""


def _norm_url(url: str) -> str:
    return url.rstrip("/").lower()


def load_config(path: Path) -> S3Stores:
    """The operator's ``--dataset-stores`` file, checked whole (ValueError naming the key)."""
    try:
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"dataset stores file: cannot read it ({type(exc).__name__})") from None
    if not isinstance(doc, dict) or set(doc) - {"s3"}:
        raise ValueError("dataset stores file: a mapping with the key 's3'")
    s3 = doc.get("s3") or {}
    if not isinstance(s3, dict) or set(s3) - {
        "instance_credentials",
        "instance_endpoints",
        "tenants",
    }:
        raise ValueError(
            "dataset stores file: s3 takes instance_credentials, instance_endpoints and tenants"
        )
    inst_eps = s3.get("instance_endpoints") or []
    if not isinstance(inst_eps, list) or not all(
        isinstance(e, str) and re.fullmatch(r"https?://\S+", e) for e in inst_eps
    ):
        raise ValueError("dataset stores file: s3.instance_endpoints is a list of http(s) URLs")
    inst = s3.get("instance_credentials", False)
    if not isinstance(inst, bool):
        raise ValueError("dataset stores file: s3.instance_credentials is true or false")
    tenants = s3.get("tenants") or {}
    if not isinstance(tenants, dict):
        raise ValueError("dataset stores file: s3.tenants maps tenant -> name -> credential")
    out: dict[str, dict[str, S3Credential]] = {}
    for tenant, creds in tenants.items():
        if not isinstance(creds, dict):
            raise ValueError(f"dataset stores file: s3.tenants.{tenant} must be a mapping")
        for name, c in creds.items():
            where = f"s3.tenants.{tenant}.{name}"
            if name == "instance":
                raise ValueError(f"dataset stores file: {where}: 'instance' is reserved")
            if not isinstance(c, dict) or set(c) - {
                "access_key_id",
                "secret_access_key",
                "session_token",
                "endpoints",
                "region",
            }:
                raise ValueError(
                    f"dataset stores file: {where}: access_key_id, "
                    "secret_access_key, session_token, endpoints, region"
                )
            refs: dict[str, SecretRef | None] = {}
            for k in ("access_key_id", "secret_access_key", "session_token"):
                v = c.get(k)
                if v is None and k == "session_token":
                    refs[k] = None
                    continue
                if not isinstance(v, str) or not _SECRET_REF.fullmatch(v):
                    # never echo the value: it may be the secret pasted inline
                    raise ValueError(
                        f"dataset stores file: {where}.{k} must be a secret "
                        "reference 'env:VAR' or 'file:/path'"
                    )
                refs[k] = SecretRef(v)
            eps = c.get("endpoints") or []
            if not isinstance(eps, list) or not all(
                isinstance(e, str) and re.fullmatch(r"https?://\S+", e) for e in eps
            ):
                raise ValueError(
                    f"dataset stores file: {where}.endpoints is a list of http(s) URLs"
                )
            access, secret = refs["access_key_id"], refs["secret_access_key"]
            assert access is not None and secret is not None
            out.setdefault(str(tenant), {})[str(name)] = S3Credential(
                access_key_id=access,
                secret_access_key=secret,
                session_token=refs["session_token"],
                endpoints=tuple(_norm_url(e) for e in eps),
                region=str(c.get("region") or ""),
            )
    return S3Stores(
        out,
        instance_credentials=inst,
        instance_endpoints=tuple(_norm_url(e) for e in inst_eps),
    )


class S3Stores:
    """The opener the evaluation service is given: (tenant, location) -> an :class:`S3Store`
    signed with that tenant's named credentials."""

    def __init__(
        self,
        credentials: Mapping[str, Mapping[str, S3Credential]],
        *,
        instance_credentials: bool = False,
        instance_endpoints: tuple[str, ...] = (),
    ) -> None:
        self.credentials = {t: dict(c) for t, c in credentials.items()}
        self.instance_credentials = instance_credentials
        #: Where the server's own credentials may be sent besides AWS (no endpoint_url).
        self.instance_endpoints = tuple(_norm_url(e) for e in instance_endpoints)
        # One botocore session: its loaded service model is reused by every client (a new
        # session re-reads it, ~0.3 s); create_client is not thread-safe, hence the lock.
        self._session: Any = None
        self._lock = threading.Lock()

    def __call__(self, tenant: str, loc: Any) -> S3Store:
        """``loc`` is the plan's ``S3Location`` (bucket, prefix, endpoint_url, region,
        credentials); the store returned is the evaluation service's ``DataStore``."""
        import botocore.config
        import botocore.session

        endpoint = _norm_url(loc.endpoint_url) if loc.endpoint_url else ""
        kwargs: dict[str, Any] = {}
        if loc.credentials == "instance":
            if not self.instance_credentials:
                raise FailedPrecondition(
                    f"{_FIELD}.credentials: the server's own credentials "
                    "are not lent to plans here (the operator has not "
                    "enabled instance_credentials)"
                )
            # the server's own credentials (a session token travels in plain sight in every
            # request) go to AWS or the operator's list only, never to a plan's host
            if endpoint and endpoint not in self.instance_endpoints:
                raise FailedPrecondition(
                    f"{_FIELD}.endpoint_url: the server's own credentials are "
                    "not used with this endpoint (the operator lists where they may be sent)"
                )
            region = loc.region
        else:
            cred = self.credentials.get(tenant, {}).get(loc.credentials)
            if cred is None:
                raise FailedPrecondition(
                    f"{_FIELD}.credentials: no store credentials named "
                    f"'{loc.credentials[:64]}' are configured for your "
                    "tenant (the operator's --dataset-stores file)"
                )
            allowed = cred.endpoints or ("",)
            if endpoint not in allowed:
                raise FailedPrecondition(
                    f"{_FIELD}.endpoint_url: the credentials "
                    f"'{loc.credentials}' are not used with this endpoint "
                    "(the operator lists where each may be sent)"
                )
            if not endpoint and cred.endpoints:
                endpoint = cred.endpoints[0]
            try:
                kwargs = {
                    "aws_access_key_id": cred.access_key_id.resolve(),
                    "aws_secret_access_key": cred.secret_access_key.resolve(),
                }
                if cred.session_token is not None:
                    kwargs["aws_session_token"] = cred.session_token.resolve()
            except FailedPrecondition as exc:
                # the reference's message names the operator's variable or file: for the
                # operator's log, not for the tenant
                log.warning(
                    "dataset store credentials cannot be resolved",
                    tenant=tenant,
                    credentials=loc.credentials,
                    reason=exc.message,
                )
                raise FailedPrecondition(
                    f"{_FIELD}.credentials: the credentials '{loc.credentials}' cannot be "
                    "read on the server (ask the operator)"
                ) from None
            region = loc.region or cred.region
        config = botocore.config.Config(
            signature_version="s3v4",
            connect_timeout=5,
            read_timeout=30,
            retries={"max_attempts": 3, "mode": "standard"},
            s3={"addressing_style": "path" if endpoint else "auto"},
        )
        with self._lock:
            if self._session is None:
                self._session = botocore.session.Session()
            client = self._session.create_client(
                "s3",
                region_name=region or "us-east-1",
                endpoint_url=endpoint or None,
                config=config,
                **kwargs,
            )
        return S3Store(client, loc)


class _Body:
    """A GET's streaming body as a binary stream (read, close, context manager), held to the
    object's size as HEAD gave it (a server may send more than it said, or never stop) and to
    :data:`MIN_STREAM_RATE` (a server may trickle)."""

    def __init__(self, body: Any, store: S3Store, field: str, size: int) -> None:
        self._body, self._store, self._field, self._size = body, store, field, size
        # one socket read per call (urllib3's read1), so the rate is checked between them
        raw = getattr(body, "_raw_stream", None)
        self._read1 = getattr(raw, "read1", None) or body.read
        self._got = 0
        self._start = time.monotonic()
        self.closed = False

    def read(self, n: int = -1) -> bytes:
        want = self._size + 1 - self._got if n is None or n < 0 else n
        parts: list[bytes] = []
        while want > 0:
            try:
                chunk = bytes(self._read1(min(want, 1 << 20)))
            except Exception as exc:  # noqa: BLE001 - botocore's read errors vary by transport
                raise self._store._error(exc, self._field) from None
            if not chunk:
                break
            self._got += len(chunk)
            if self._got > self._size:
                raise InvalidArgument(
                    self._field, f"the store sent more than the object's {self._size} bytes"
                )
            elapsed = time.monotonic() - self._start
            if elapsed > STREAM_GRACE_S and self._got < MIN_STREAM_RATE * elapsed:
                raise Unavailable(
                    f"{_FIELD}.endpoint_url: the S3 endpoint sends {self._field} too slowly "
                    f"(under {MIN_STREAM_RATE} bytes/s)"
                )
            parts.append(chunk)
            want -= len(chunk)
        return b"".join(parts)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._body.close()

    def __enter__(self) -> _Body:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class S3Store:
    """One bucket prefix as a dataset store (see the module docstring)."""

    root_name = "S3 prefix"

    def __init__(self, client: Any, loc: Any) -> None:
        self.client = client
        self.loc = loc
        self.prefix = PurePosixPath(loc.prefix) if loc.prefix else PurePosixPath()
        self.requests = 0

    def _count(self) -> None:
        self.requests += 1
        if self.requests > MAX_OBJECTS:
            raise InvalidArgument(_FIELD, f"more than {MAX_OBJECTS} objects asked for")

    def _error(self, exc: BaseException, field: str) -> Exception:
        """A precise, secret-free error for a botocore failure."""
        import botocore.exceptions as bex

        if isinstance(exc, bex.ClientError):
            err = exc.response.get("Error", {})
            status = str(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
            code = str(err.get("Code") or status)
            if code not in _MISSING | _DENIED | _KNOWN_CODES | {"NoSuchBucket"}:
                code = f"HTTP {status}" if status.isdigit() else ""
            if code in _MISSING:
                return InvalidArgument(field, NOT_FOUND)
            if code == "NoSuchBucket":
                return InvalidArgument(
                    f"{_FIELD}.bucket", f"no bucket '{self.loc.bucket}' at the endpoint"
                )
            if code in _DENIED:
                return PermissionDenied(
                    f"{_FIELD}.credentials: the store refused the "
                    f"credentials '{self.loc.credentials}' ({code[:40]})"
                )
            return FailedPrecondition(
                f"{_FIELD}: the store answered {code[:40] or 'an error'} for {field}"
            )
        if isinstance(
            exc,
            bex.EndpointConnectionError
            | bex.ConnectTimeoutError
            | bex.ReadTimeoutError
            | bex.ConnectionClosedError,
        ):
            return Unavailable(f"{_FIELD}.endpoint_url: the S3 endpoint cannot be reached")
        if isinstance(exc, bex.NoCredentialsError | bex.PartialCredentialsError):
            return FailedPrecondition(f"{_FIELD}.credentials: no credentials are available")
        if isinstance(exc, bex.BotoCoreError):
            return Unavailable(f"{_FIELD}: the S3 request failed ({type(exc).__name__})")
        return Unavailable(f"{_FIELD}: reading the object failed ({type(exc).__name__})")

    def key_of(self, base: PurePosixPath, raw: object, field: str) -> str:
        rel = relative_path(raw, field, self.root_name)
        key = (self.prefix / base / rel).as_posix()
        if ".." in PurePosixPath(key).parts or key.startswith("/"):
            raise InvalidArgument(field, NOT_FOUND)
        return key

    def locate(self, base: PurePosixPath, raw: object, field: str) -> tuple[str, int]:
        key = self.key_of(base, raw, field)
        self._count()
        try:
            head = self.client.head_object(Bucket=self.loc.bucket, Key=key)
        except Exception as exc:  # noqa: BLE001 - mapped precisely by _error
            raise self._error(exc, field) from None
        return key, int(head.get("ContentLength") or 0)

    def size(self, ref: tuple[str, int]) -> int:
        return ref[1]

    def read(self, ref: tuple[str, int], limit: int, field: str, what: str) -> bytes:
        key, size = ref
        if size > limit:
            raise InvalidArgument(field, f"the {what} is larger than {limit} bytes")
        self._count()
        try:
            got = self.client.get_object(Bucket=self.loc.bucket, Key=key, Range=f"bytes=0-{limit}")
        except Exception as exc:  # noqa: BLE001
            if _is_range_error(exc):  # an empty object has no byte 0
                return b""
            raise self._error(exc, field) from None
        with _Body(got["Body"], self, field, size) as body:
            data = body.read(limit + 1)
        if len(data) > limit:
            raise InvalidArgument(field, f"the {what} is larger than {limit} bytes")
        return data

    def open(self, ref: tuple[str, int], field: str) -> IO[bytes]:
        self._count()
        try:
            got = self.client.get_object(Bucket=self.loc.bucket, Key=ref[0])
        except Exception as exc:  # noqa: BLE001
            raise self._error(exc, field) from None
        return _Body(got["Body"], self, field, ref[1])  # type: ignore[return-value]

    def local_path(self, ref: tuple[str, int]) -> Path | None:
        return None

    def list_files(self, raw: object, field: str, limit: int) -> list[str]:
        """Keys under ``<prefix>/<raw>/`` (ListObjectsV2 pages, at most ``limit`` keys)."""
        folder = self.key_of(PurePosixPath(), raw, field).rstrip("/") + "/"
        out: list[str] = []
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.loc.bucket, Prefix=folder, PaginationConfig={"PageSize": 1000}
            )
            for page in pages:
                self._count()
                contents = page.get("Contents", [])
                if not contents and page.get("IsTruncated"):
                    # a server could page empty answers for ever, each a request
                    raise InvalidArgument(field, "the store listed an empty page of the folder")
                for obj in contents:
                    key = str(obj.get("Key", ""))
                    if not key.startswith(folder):
                        raise InvalidArgument(
                            field, "the store listed a key outside the folder asked for"
                        )
                    rest = key[len(folder) :]
                    if rest and not rest.endswith("/"):
                        out.append(rest)
                    if len(out) > limit:
                        raise InvalidArgument(field, f"more than {limit} files in the folder")
        except InvalidArgument:
            raise
        except Exception as exc:  # noqa: BLE001 - mapped precisely by _error
            raise self._error(exc, field) from None
        if not out:
            raise InvalidArgument(field, "no such folder under the S3 prefix")
        return sorted(out)


def _is_range_error(exc: BaseException) -> bool:
    import botocore.exceptions as bex

    return (
        isinstance(exc, bex.ClientError)
        and exc.response.get("Error", {}).get("Code") == "InvalidRange"
    )
