"""Who a caller is, besides an API key: OpenID Connect / JWT bearer tokens and the subject of
an mTLS client certificate. Enterprises run their own identity provider (an IdP, or the
Kubernetes API server issuing projected service-account tokens) and will not hand every
workload a shared key.

Pure code, no gRPC: the interceptor in ``server.py`` hands this module the ``authorization``
metadata or the call's TLS auth context and gets back an :class:`Identity` (the tenant), or a
domain error (UNAUTHENTICATED with a precise reason, UNAVAILABLE when the IdP's keys cannot
be fetched). Nothing else changes: tenant namespaces, quotas and metrics see a tenant name
exactly as with an API key.

Tokens (:class:`TokenVerifier`), checked by PyJWT (no hand-written crypto):

- the token's ``iss`` picks one of the configured issuers (several are allowed, e.g. the
  corporate IdP and the cluster's service-account issuer); any other issuer is refused;
- the header's ``alg`` must be one of the issuer's allowed algorithms (RS256 and ES256 by
  default). ``none`` and every HMAC algorithm are never accepted: the keys are public, so an
  HS256 token "signed" with a public key would verify for anyone holding it;
- the key is the issuer's JWKS entry named by the header's ``kid``; the key's own algorithm
  must be the header's (an RSA key never checks an ES256 token);
- signature, ``iss``, ``aud`` (one of the configured audiences), ``exp`` (required) and
  ``nbf``/``iat`` are checked with a small leeway for clock skew;
- the tenant is a configured claim (a dotted path into nested claims, matching names that
  contain dots themselves, so ``kubernetes.io.namespace`` reads a projected
  service-account token's ``{"kubernetes.io": {"namespace": ...}}``), and must be a valid
  tenant name; a token can never act as the internal service (``*``);
- tenant names are one space for every identity (an API key's tenant ``acme`` and a token
  naming ``acme`` are the same tenant), so each issuer says which tenants its tokens may name:
  an allow-list (``tenants=a:b``; ``*`` trusts it with every name) and/or a prefix added to
  the claim (``tenant-prefix=k8s-``: a namespace ``acme`` is the tenant ``k8s-acme``, never the
  key holder ``acme``). An issuer with neither is refused at start-up: a cluster's
  service-account issuer would otherwise let any namespace, named as its owner likes, be any
  tenant.

JWKS (:class:`JwksCache`): fetched over HTTP(S) from ``jwks_url``, or from the issuer's
``/.well-known/openid-configuration`` (``jwks_uri``), bounded in size and time, cached.
An unknown ``kid`` triggers a refresh (that is how rotation is seen: the new key is
published before tokens are signed with it), at most once per ``min_refresh_s`` per issuer,
so a stream of made-up ``kid``s cannot turn the server into a load generator against the
IdP. The set is also refreshed after ``max_age_s``; if the IdP is down then, the keys in
hand stay in use (an IdP outage does not lock out callers whose keys are known). With no
keys at all and the IdP unreachable, token calls are UNAVAILABLE (retry later); API keys
keep working.

Certificates (:class:`CertTenant`): with ``--tls-client-auth require`` the handshake has
already verified the chain against ``--tls-ca``; the tenant is the subject's CN or O, or the
part of a URI SAN after a configured prefix (``SAN-URI=spiffe://corp.example/tenant/``).

No error message or log line quotes a token or any part of it.
"""

from __future__ import annotations

import json
import re
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
from fortis.infra.serving.api_keys import TENANT_RE
from fortis.services.common import errors

__all__ = ["AuditLog", "CertTenant", "Identity", "IdentityCollector", "JwksCache",
           "OidcIssuer", "TokenVerifier", "claim_value", "parse_issuer_spec"]

log = structlog.get_logger("fortis.identity")

#: Algorithms accepted unless an issuer narrows them: asymmetric only.
DEFAULT_ALGORITHMS = ("RS256", "ES256")
#: Algorithms that may be allowed at all (no ``none``, no HMAC: JWKS keys are public).
ASYMMETRIC_ALGORITHMS = frozenset({"RS256", "RS384", "RS512", "PS256", "PS384", "PS512",
                                   "ES256", "ES384", "ES512", "EdDSA"})
#: Seconds of clock skew tolerated on ``exp``, ``nbf`` and ``iat``.
DEFAULT_LEEWAY_S = 30.0
#: Longest token read (a JWT with many groups is a few KB; gRPC metadata is 8 KB by default).
MAX_TOKEN_CHARS = 16 * 1024
#: Largest JWKS or discovery document read.
MAX_DOCUMENT_BYTES = 1024 * 1024
#: Most keys kept from one JWKS.
MAX_KEYS = 100
_SAFE = re.compile(r"[^A-Za-z0-9_.\-]")


def _safe(value: object, n: int = 20) -> str:
    """A token-supplied value made safe to show (bounded, plain characters only)."""
    return _SAFE.sub("?", str(value))[:n]


@dataclass(frozen=True, slots=True)
class Identity:
    """An authenticated caller: its tenant, how it proved it and (for the audit log) who."""

    tenant: str
    kind: str                   # "api_key" | "oidc" | "mtls"
    issuer: str = ""
    subject: str = ""


# -- configuration ----------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class OidcIssuer:
    """One accepted token issuer."""

    issuer: str
    audiences: tuple[str, ...]
    tenant_claim: str
    #: Where its JWKS is; "" = the issuer's discovery document's ``jwks_uri``.
    jwks_url: str = ""
    #: CA bundle that verifies the JWKS host (e.g. the Kubernetes API server's); None: the
    #: system's trust store.
    ca_file: Path | None = None
    algorithms: tuple[str, ...] = DEFAULT_ALGORITHMS
    leeway_s: float = DEFAULT_LEEWAY_S
    #: The tenants its tokens may name (after the prefix); ("*",): any.
    tenants: tuple[str, ...] = ()
    #: Added in front of the claim's value (its tokens' tenants are apart from other names).
    tenant_prefix: str = ""

    def __post_init__(self) -> None:
        field = "oidc_issuer"
        if not self.tenants and not self.tenant_prefix:
            raise errors.InvalidArgument("oidc_tenants", f"issuer '{self.issuer[:200]}': say "
                                         "which tenants its tokens may name (tenants=A:B, or "
                                         "tenants=* to trust it with any) or keep its tenants "
                                         "apart with tenant-prefix=P: tenant names are shared "
                                         "with API keys and other issuers")
        bad_t = [t for t in self.tenants if t != "*" and not TENANT_RE.fullmatch(t)]
        if bad_t:
            raise errors.InvalidArgument("oidc_tenants", f"'{_safe(bad_t[0], 64)}' is not a "
                                         "tenant name (1-64 letters, digits, '-', '_' or '.')")
        if self.tenant_prefix and not _PREFIX_RE.fullmatch(self.tenant_prefix):
            raise errors.InvalidArgument("oidc_tenant_prefix", "1-32 letters, digits, '-', '_' "
                                         "or '.', starting with a letter or digit")
        u = urllib.parse.urlsplit(self.issuer)
        if u.scheme not in ("https", "http") or not u.netloc:
            raise errors.InvalidArgument(field, f"'{self.issuer[:200]}' is not an http(s) URL")
        if self.jwks_url:
            j = urllib.parse.urlsplit(self.jwks_url)
            if j.scheme not in ("https", "http") or not j.netloc:
                raise errors.InvalidArgument("oidc_jwks_url", f"'{self.jwks_url[:200]}' is "
                                             "not an http(s) URL")
        if not self.audiences or not all(self.audiences):
            raise errors.InvalidArgument("oidc_audience", f"issuer '{self.issuer[:200]}' needs "
                                         "an audience (--oidc-audience): a token made for "
                                         "another service must not be accepted here")
        if not self.tenant_claim:
            raise errors.InvalidArgument("oidc_tenant_claim", f"issuer '{self.issuer[:200]}' "
                                         "needs the claim naming the tenant "
                                         "(--oidc-tenant-claim)")
        bad = [a for a in self.algorithms if a not in ASYMMETRIC_ALGORITHMS]
        if bad or not self.algorithms:
            raise errors.InvalidArgument("oidc_algorithms", "only asymmetric algorithms may "
                                         f"be allowed ({', '.join(sorted(ASYMMETRIC_ALGORITHMS))})")
        if not 0 <= self.leeway_s <= 300:
            raise errors.InvalidArgument("oidc_leeway", "0..300 seconds")


_SPEC_KEYS = {"audience", "tenant-claim", "jwks-url", "ca-file", "algorithms", "leeway",
              "tenants", "tenant-prefix"}
#: A tenant prefix: the start of a tenant name.
_PREFIX_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,31}")


def parse_issuer_spec(spec: str, *, audiences: Sequence[str] = (), tenant_claim: str = "",
                      jwks_url: str = "", ca_file: str = "", algorithms: Sequence[str] = (),
                      leeway_s: float = DEFAULT_LEEWAY_S, tenants: Sequence[str] = (),
                      tenant_prefix: str = "") -> OidcIssuer:
    """``URL[,audience=A][,tenant-claim=C][,tenants=T1:T2][,tenant-prefix=P][,jwks-url=U]
    [,ca-file=F][,algorithms=RS256:ES256][,leeway=S]`` (``--oidc-issuer``), the keyword
    arguments being the defaults that the global flags give (``--oidc-audience`` and so on).
    ``audience=`` may repeat."""
    parts = [p.strip() for p in spec.split(",")]
    url, opts = parts[0], parts[1:]
    aud: list[str] = []
    values: dict[str, str] = {}
    for p in filter(None, opts):
        k, sep, v = p.partition("=")
        if not sep or k not in _SPEC_KEYS:
            raise errors.InvalidArgument("oidc_issuer", f"'{p[:60]}': expected one of "
                                         f"{', '.join(sorted(_SPEC_KEYS))} as KEY=VALUE")
        if k == "audience":
            aud.append(v)
        else:
            values[k] = v
    try:
        leeway = float(values.get("leeway", leeway_s))
    except ValueError:
        raise errors.InvalidArgument("oidc_leeway", "a number of seconds") from None
    algs = values.get("algorithms", "")
    ca = values.get("ca-file", ca_file)
    return OidcIssuer(issuer=url, audiences=tuple(aud or audiences),
                      tenant_claim=values.get("tenant-claim", tenant_claim),
                      jwks_url=values.get("jwks-url", jwks_url),
                      ca_file=Path(ca) if ca else None,
                      algorithms=tuple(filter(None, algs.split(":"))) if algs
                      else tuple(algorithms) or DEFAULT_ALGORITHMS,
                      leeway_s=leeway,
                      tenants=tuple(filter(None, values["tenants"].split(":")))
                      if "tenants" in values else tuple(tenants),
                      tenant_prefix=values.get("tenant-prefix", tenant_prefix))


# -- JWKS -------------------------------------------------------------------------------------

class _FetchError(Exception):
    """The IdP's document could not be fetched or read (message safe for the operator log)."""


class JwksCache:
    """One issuer's signing keys by ``kid``, fetched on first use and refreshed as described
    in the module docstring. Thread-safe; one fetch at a time per issuer."""

    def __init__(self, issuer: OidcIssuer, *, min_refresh_s: float = 5.0,
                 max_age_s: float = 600.0, timeout_s: float = 5.0) -> None:
        self.issuer = issuer
        self.min_refresh_s = min_refresh_s
        self.max_age_s = max_age_s
        self.timeout_s = timeout_s
        self.fetches = 0                    # successful
        self.fetch_errors = 0
        self.last_success_time = 0.0        # wall clock, for the metric
        self._keys: dict[str, Any] | None = None
        self._fetched_at = 0.0              # monotonic
        self._attempted_at = -1e18
        self._last_error = ""
        self._jwks_url = issuer.jwks_url
        self._lock = threading.Lock()
        self._ssl: ssl.SSLContext | None = None

    def _context(self) -> ssl.SSLContext:
        if self._ssl is None:
            ca = self.issuer.ca_file
            self._ssl = ssl.create_default_context(cafile=str(ca) if ca else None)
        return self._ssl

    def _get(self, url: str) -> Any:
        req = urllib.request.Request(url, headers={"Accept": "application/json"})
        try:
            ctx = self._context() if url.startswith("https:") else None
            with urllib.request.urlopen(req, timeout=self.timeout_s, context=ctx) as resp:
                data = resp.read(MAX_DOCUMENT_BYTES + 1)
        except urllib.error.HTTPError as exc:
            raise _FetchError(f"HTTP {exc.code} from {url[:200]}") from None
        except (OSError, ValueError, ssl.SSLError) as exc:
            reason = getattr(exc, "reason", None) or exc
            raise _FetchError(f"cannot fetch {url[:200]}: {str(reason)[:200]}") from None
        if len(data) > MAX_DOCUMENT_BYTES:
            raise _FetchError(f"{url[:200]}: larger than {MAX_DOCUMENT_BYTES} bytes")
        try:
            return json.loads(data)
        except ValueError:
            raise _FetchError(f"{url[:200]}: not JSON") from None

    def _fetch(self) -> dict[str, Any]:
        import jwt

        if not self._jwks_url:
            base = self.issuer.issuer.rstrip("/")
            doc = self._get(base + "/.well-known/openid-configuration")
            if not isinstance(doc, dict) or not isinstance(doc.get("jwks_uri"), str):
                raise _FetchError("the discovery document has no jwks_uri")
            if doc.get("issuer") != self.issuer.issuer:
                raise _FetchError("the discovery document names another issuer")
            self._jwks_url = doc["jwks_uri"]
        doc = self._get(self._jwks_url)
        if not isinstance(doc, dict) or not isinstance(doc.get("keys"), list):
            raise _FetchError("the JWKS has no 'keys' list")
        keys: dict[str, Any] = {}
        for jwk in doc["keys"][:MAX_KEYS]:
            if not isinstance(jwk, dict) or jwk.get("use", "sig") != "sig":
                continue
            try:
                key = jwt.PyJWK.from_dict(jwk)
            except (jwt.PyJWKError, jwt.InvalidKeyError, ValueError, TypeError, KeyError):
                continue                    # a key type or curve we cannot use: skipped
            if key.algorithm_name not in self.issuer.algorithms:
                continue
            kid = jwk.get("kid")
            keys[kid if isinstance(kid, str) else ""] = key
        return keys

    def _refresh(self) -> None:
        """Fetch now (the caller holds the lock and checked the rate limit)."""
        self._attempted_at = time.monotonic()
        try:
            keys = self._fetch()
        except _FetchError as exc:
            self.fetch_errors += 1
            self._last_error = str(exc)
            log.error("oidc_jwks_fetch_failed", issuer=self.issuer.issuer[:200],
                      reason=self._last_error, kept_keys=len(self._keys or {}))
            return
        old = set(self._keys or ())
        self._keys, self._fetched_at = keys, time.monotonic()
        self.fetches += 1
        self.last_success_time = time.time()
        self._last_error = ""
        if set(keys) != old:
            log.info("oidc_jwks_loaded", issuer=self.issuer.issuer[:200], keys=len(keys),
                     added=len(set(keys) - old), removed=len(old - set(keys)))

    def key_for(self, kid: str) -> Any:
        """The PyJWK named ``kid`` ("" when the token names none), refreshing as allowed."""
        keys, fetched = self._keys, self._fetched_at
        now = time.monotonic()
        if keys is not None and kid in keys and now - fetched < self.max_age_s:
            return keys[kid]
        with self._lock:
            # Checked again under the lock: a thread that waited here while another fetched
            # sees the new set and does not fetch a second time.
            now = time.monotonic()
            keys = self._keys
            usable = keys is not None and kid in keys and now - self._fetched_at < self.max_age_s
            if not usable and now - self._attempted_at >= self.min_refresh_s:
                self._refresh()
            keys = self._keys
            if keys is None:
                raise errors.Unavailable(
                    "bearer token not checked: the identity provider's signing keys (JWKS) "
                    "cannot be fetched now; retry later (API keys still work)",
                    retry_after_s=self.min_refresh_s)
            if kid in keys:
                return keys[kid]
            if not kid and len(keys) == 1:
                return next(iter(keys.values()))
            if self._last_error and now - self._attempted_at < self.min_refresh_s:
                raise errors.Unavailable(
                    "bearer token not checked: its key is not among the identity provider's "
                    "known keys and the JWKS cannot be fetched now; retry later",
                    retry_after_s=self.min_refresh_s)
        if not kid:
            raise errors.Unauthenticated("bearer token refused: it names no key (kid)")
        raise errors.Unauthenticated("bearer token refused: signed by a key the issuer does "
                                     "not publish (unknown kid)")

    def prefetch(self) -> None:
        """Fetch once in the background at start (a failure only logs: the IdP may come up
        later; the first token call fetches again)."""
        def run() -> None:
            with self._lock:
                if self._keys is None:
                    self._refresh()
        threading.Thread(target=run, name="oidc-jwks-prefetch", daemon=True).start()


# -- tokens -----------------------------------------------------------------------------------

def claim_value(claims: Mapping[str, Any], path: str) -> Any:
    """The claim at dotted ``path``; a name holding dots itself (``kubernetes.io``) is
    matched whole first, so ``kubernetes.io.namespace`` reads ``{"kubernetes.io":
    {"namespace": ...}}``. None when absent."""
    if path in claims:
        return claims[path]
    parts = path.split(".")
    for i in range(len(parts) - 1, 0, -1):
        head = ".".join(parts[:i])
        inner = claims.get(head)
        if isinstance(inner, Mapping):
            found = claim_value(inner, ".".join(parts[i:]))
            if found is not None:
                return found
    return None


def _refused(why: str) -> errors.Unauthenticated:
    return errors.Unauthenticated(f"bearer token refused: {why}")


class TokenVerifier:
    """Checks bearer tokens against the configured issuers (see the module docstring)."""

    def __init__(self, issuers: Iterable[OidcIssuer], *, min_refresh_s: float = 5.0,
                 max_age_s: float = 600.0, timeout_s: float = 5.0) -> None:
        self.caches: dict[str, JwksCache] = {}
        for iss in issuers:
            if iss.issuer in self.caches:
                raise errors.InvalidArgument("oidc_issuer", f"'{iss.issuer[:200]}' given twice")
            self.caches[iss.issuer] = JwksCache(iss, min_refresh_s=min_refresh_s,
                                                max_age_s=max_age_s, timeout_s=timeout_s)
        if not self.caches:
            raise errors.InvalidArgument("oidc_issuer", "no issuer")

    def prefetch(self) -> None:
        for cache in self.caches.values():
            cache.prefetch()

    def verify(self, token: str) -> Identity:
        import jwt

        if not token or len(token) > MAX_TOKEN_CHARS:
            raise _refused(f"empty or longer than {MAX_TOKEN_CHARS} characters")
        try:
            header = jwt.get_unverified_header(token)
            # Read unverified only to pick the issuer's keys; everything is verified below.
            unverified = jwt.decode(token, options={"verify_signature": False})
        except jwt.InvalidTokenError:
            raise _refused("not a signed JWT (header.payload.signature, base64url)") from None
        alg = header.get("alg")
        if not isinstance(alg, str) or alg not in ASYMMETRIC_ALGORITHMS:
            raise _refused(f"algorithm '{_safe(alg)}' is never accepted (asymmetric "
                           "signatures only: RS256, ES256)")
        iss = unverified.get("iss")
        if not isinstance(iss, str):
            raise _refused("it has no 'iss' (issuer) claim")
        cache = self.caches.get(iss)
        if cache is None:
            raise _refused("its issuer is not accepted by this server (--oidc-issuer)")
        conf = cache.issuer
        if alg not in conf.algorithms:
            raise _refused(f"algorithm '{_safe(alg)}' is not allowed for this issuer "
                           f"(allowed: {', '.join(conf.algorithms)})")
        kid = header.get("kid", "")
        if not isinstance(kid, str) or len(kid) > 256:
            raise _refused("its key id (kid) is not a short string")
        key = cache.key_for(kid)
        if key.algorithm_name != alg:
            raise _refused(f"its algorithm '{_safe(alg)}' is not its key's")
        try:
            claims = jwt.decode(token, key=key.key, algorithms=[alg],
                                audience=list(conf.audiences), issuer=conf.issuer,
                                leeway=conf.leeway_s,
                                options={"require": ["exp", "iss", "aud"]})
        except jwt.ExpiredSignatureError:
            raise _refused("expired (exp)") from None
        except jwt.ImmatureSignatureError:
            raise _refused("not yet valid (nbf or iat in the future)") from None
        except jwt.InvalidAudienceError:
            raise _refused("its audience (aud) is not this service's (--oidc-audience)") from None
        except jwt.InvalidIssuerError:
            raise _refused("its issuer is not accepted by this server") from None
        except jwt.MissingRequiredClaimError as exc:
            raise _refused(f"it has no '{_safe(exc.claim)}' claim") from None
        except jwt.InvalidSignatureError:
            raise _refused("its signature does not verify with the issuer's key") from None
        except jwt.InvalidTokenError as exc:
            raise _refused(f"invalid ({type(exc).__name__})") from None
        named = claim_value(claims, conf.tenant_claim)
        tenant = conf.tenant_prefix + named if isinstance(named, str) and named else ""
        if not TENANT_RE.fullmatch(tenant):
            raise _refused(f"its tenant claim '{_safe(conf.tenant_claim, 64)}' is missing or "
                           "not a tenant name (1-64 letters, digits, '-', '_' or '.')")
        if "*" not in conf.tenants and conf.tenants and tenant not in conf.tenants:
            raise _refused("its tenant is not one this issuer's tokens may name "
                           "(the operator's tenants= for the issuer)")
        sub = claims.get("sub")
        return Identity(tenant=tenant, kind="oidc", issuer=conf.issuer,
                        subject=str(sub)[:200] if sub is not None else "")


# -- client certificates ----------------------------------------------------------------------

CERT_TENANT_SOURCES = ("CN", "O", "SAN-URI")


@dataclass(frozen=True)
class CertTenant:
    """The tenant from a verified client certificate (``--tls-tenant-from``)."""

    source: str                 # CN | O | SAN-URI
    uri_prefix: str = ""        # SAN-URI: the tenant is what follows it, up to the next '/'

    @classmethod
    def parse(cls, spec: str) -> CertTenant:
        source, _, prefix = spec.partition("=")
        if source not in CERT_TENANT_SOURCES:
            raise errors.InvalidArgument("tls_tenant_from", "CN, O or SAN-URI=PREFIX")
        if source == "SAN-URI" and not prefix:
            raise errors.InvalidArgument("tls_tenant_from", "SAN-URI needs the prefix before "
                                         "the tenant, e.g. SAN-URI=spiffe://corp.example/tenant/")
        if source != "SAN-URI" and prefix:
            raise errors.InvalidArgument("tls_tenant_from", f"{source} takes no prefix")
        return cls(source, prefix)

    def tenant_of(self, auth_context: Mapping[str, Sequence[bytes]]) -> Identity:
        from cryptography import x509
        from cryptography.x509.oid import NameOID

        pems = auth_context.get("x509_pem_cert") or []
        if not pems:
            raise errors.Unauthenticated("no credentials: send metadata 'x-api-key' or "
                                         "'authorization: Bearer <token>', or a client "
                                         "certificate")
        try:
            cert = x509.load_pem_x509_certificate(pems[0])
        except ValueError:
            raise errors.Unauthenticated("client certificate refused: it does not parse") from None
        values: list[str] = []
        if self.source in ("CN", "O"):
            oid = NameOID.COMMON_NAME if self.source == "CN" else NameOID.ORGANIZATION_NAME
            values = [str(a.value) for a in cert.subject.get_attributes_for_oid(oid)]
        else:
            try:
                san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
                uris = san.value.get_values_for_type(x509.UniformResourceIdentifier)
            except x509.ExtensionNotFound:
                uris = []
            values = [u[len(self.uri_prefix):].split("/", 1)[0] for u in uris
                      if u.startswith(self.uri_prefix)]
        tenants = {v for v in values if TENANT_RE.fullmatch(v)}
        if len(tenants) != 1:
            raise errors.Unauthenticated(
                f"client certificate refused: its {self.source} names "
                f"{'no' if not tenants else 'more than one'} tenant (--tls-tenant-from)")
        tenant = tenants.pop()
        return Identity(tenant=tenant, kind="mtls",
                        subject=cert.subject.rfc4514_string()[:200])


# -- audit ------------------------------------------------------------------------------------

@dataclass
class AuditLog:
    """One ``authenticated`` log line per identity (kind, tenant, issuer, subject) when first
    seen and again after ``every_s`` seconds: the audit trail of who came in and how, without
    a line per call. Bounded: at most ``max_entries`` identities are remembered."""

    every_s: float = 600.0
    max_entries: int = 10_000
    _seen: dict[tuple[str, str, str, str], float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def note(self, ident: Identity, method: str, peer: str) -> None:
        key = (ident.kind, ident.tenant, ident.issuer, ident.subject)
        now = time.monotonic()
        with self._lock:
            last = self._seen.get(key)
            if last is not None and now - last < self.every_s:
                return
            if len(self._seen) >= self.max_entries:
                self._seen.clear()
            self._seen[key] = now
        log.info("authenticated", kind=ident.kind, tenant=ident.tenant,
                 **({"issuer": ident.issuer[:200]} if ident.issuer else {}),
                 **({"subject": ident.subject} if ident.subject else {}),
                 method=method, peer=peer)


# -- metrics ----------------------------------------------------------------------------------

class IdentityCollector:
    """Prometheus view of the token verifier: JWKS fetch failures and the time of the last
    good fetch, per issuer (an IdP that stays unreachable shows as a growing counter)."""

    def __init__(self, verifier: TokenVerifier) -> None:
        self._verifier = verifier

    def collect(self) -> Iterable[object]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        errs = CounterMetricFamily("fortis_oidc_jwks_fetch_errors",
                                   "JWKS fetches of an issuer that failed", labels=["issuer"])
        ok = GaugeMetricFamily("fortis_oidc_jwks_last_fetch_success_timestamp_seconds",
                               "Unix time of the last good JWKS fetch of an issuer",
                               labels=["issuer"])
        for name, cache in self._verifier.caches.items():
            errs.add_metric([name[:200]], cache.fetch_errors)
            ok.add_metric([name[:200]], cache.last_success_time)
        yield errs
        yield ok
