"""Local stand-ins for AWS, Google Cloud and Azure, for tests/integration/test_cloud_credentials.py.

The clouds cannot be reached from here, so each stand-in is a stdlib HTTP(S) server on
127.0.0.1 that VERIFIES every request with the vendor's own library, not with code of ours:

* ``AwsStandIn`` -- recomputes the SigV4 signature with ``botocore.auth.SigV4Auth`` from the
  credentials it issued (the same method, URL, signed headers, body and X-Amz-Date) and
  compares it; also plays STS ``AssumeRoleWithWebIdentity`` (IRSA: the web identity token file
  and role ARN) issuing short-lived session credentials.
* ``GoogleStandIn`` -- an OAuth token endpoint that checks the service-account JWT assertion
  with ``google.auth.jwt.decode`` against the account's public key (signature, audience,
  expiry) and issues short-lived tokens; its API accepts only a currently valid token.
* ``AzureStandIn`` -- an Entra ID authority over HTTPS (azure-identity/MSAL require https; a
  self-signed certificate made with ``cryptography``, trusted through ``REQUESTS_CA_BUNDLE``):
  OpenID configuration and a client-credentials token endpoint checking the client secret;
  its APIs accept only a currently valid token.

Their vision APIs answer in each vendor's shape from the image (``_http_json_support.scene``),
so a wrong image or mapping shows.
"""

from __future__ import annotations

import base64
import datetime as dt
import hmac
import json
import secrets
import ssl
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.integration._http_json_support import (
    aws_answer,
    azure_answer,
    decode,
    google_answer,
    scene,
)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    owner: Any = None

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass

    def send(
        self,
        status: int,
        body: bytes | str | dict[str, Any],
        headers: dict[str, str] | None = None,
        ctype: str = "application/json",
    ) -> None:
        data = (
            body
            if isinstance(body, bytes)
            else (body.encode() if isinstance(body, str) else json.dumps(body).encode())
        )
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length", 0)))

    def do_POST(self) -> None:  # noqa: N802
        self.owner.post(self, urlsplit(self.path), self.body())

    def do_GET(self) -> None:  # noqa: N802
        self.owner.get(self, urlsplit(self.path))


class _StandIn:
    """One server; ``post``/``get`` of the subclass answer. Counts what it saw."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.throttle_left = 0
        self.echo = False
        handler = type("H", (_Handler,), {"owner": self})
        self.server = _Server(("127.0.0.1", 0), handler)
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        port = self.server.server_address[1]
        self.base = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
        self.host = f"127.0.0.1:{port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def count(self, what: str) -> None:
        with self.lock:
            self.counts[what] += 1

    def take_throttle(self) -> bool:
        with self.lock:
            if self.throttle_left > 0:
                self.throttle_left -= 1
                return True
            return False

    def get(self, h: _Handler, url: Any) -> None:
        h.send(404, {"error": "not found"})

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def managed_answer(req: dict[str, Any], detection: bool) -> dict[str, Any]:
    """The managed-endpoint convention of adapters/profiles/managed/*.yaml."""
    preds = []
    for inst in req["instances"]:
        s = scene(decode(base64.b64decode(inst["b64"])))
        if detection:
            preds.append(
                {
                    "detections": [
                        {"label": s["label"].lower(), "score": s["conf"], "box": list(s["box"])}
                    ]
                    if s["box"]
                    else []
                }
            )
        else:
            preds.append(
                {
                    "classes": [
                        {"label": s["label"].lower(), "score": s["conf"]},
                        {"label": "indoor", "score": 0.5},
                    ]
                }
            )
    return {"predictions": preds}


# ---------------------------------------------------------------------------------------------
# AWS
# ---------------------------------------------------------------------------------------------


class AwsStandIn(_StandIn):
    """SigV4-verifying Rekognition / SageMaker runtime, and STS for web identity (IRSA)."""

    def __init__(self, region: str) -> None:
        super().__init__()
        self.region = region
        #: access key id -> (secret key, session token or None, expiry epoch or None)
        self.keys: dict[str, tuple[str, str | None, float | None]] = {}
        self.web_identity_token = "eyJ-web-identity-" + secrets.token_hex(16)
        self.role_arn = "arn:aws:iam::123456789012:role/fortis-irsa"
        self.session_lifetime_s = 15 * 60 + 2.0  # botocore refreshes 15 min before expiry
        self.verified: list[str] = []  # access key ids of verified requests
        self.refused: list[str] = []

    def static_key(self) -> tuple[str, str]:
        akid, secret = "AKIA" + secrets.token_hex(8).upper(), secrets.token_urlsafe(30)
        self.keys[akid] = (secret, None, None)
        return akid, secret

    def secrets(self) -> list[str]:
        return [v for s, t, _ in self.keys.values() for v in (s, t) if v] + [
            self.web_identity_token
        ]

    def verify(self, h: _Handler, url: Any, body: bytes, service: str) -> str | None:
        """None when the signature is botocore's own for these credentials, else why not."""
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.credentials import Credentials

        auth = h.headers.get("Authorization", "")
        try:
            algo, rest = auth.split(" ", 1)
            fields = dict(p.strip().split("=", 1) for p in rest.split(","))
            akid, date, region, svc, term = fields["Credential"].split("/")
            signed = fields["SignedHeaders"].split(";")
        except ValueError:
            return "malformed Authorization"
        if algo != "AWS4-HMAC-SHA256" or term != "aws4_request":
            return "not SigV4"
        if (region, svc) != (self.region, service):
            return f"scope {region}/{svc}, expected {self.region}/{service}"
        known = self.keys.get(akid)
        if known is None:
            return "unknown access key"
        secret, token, expiry = known
        if expiry is not None and time.time() > expiry:
            return "expired session credentials"
        if token is not None and h.headers.get("X-Amz-Security-Token") != token:
            return "missing or wrong session token"
        amz_date = h.headers.get("X-Amz-Date", "")
        when = dt.datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=dt.UTC)
        if abs(time.time() - when.timestamp()) > 300 or not amz_date.startswith(date):
            return "request time too skewed"
        headers = {k: h.headers[k] for k in signed if k != "host" and h.headers.get(k) is not None}
        req = AWSRequest(
            method=h.command, url=f"http://{h.headers['Host']}{h.path}", data=body, headers=headers
        )
        req.context["timestamp"] = amz_date
        signer = SigV4Auth(Credentials(akid, secret, token), service, self.region)
        expected = signer.signature(signer.string_to_sign(req, signer.canonical_request(req)), req)
        if not hmac.compare_digest(expected, fields["Signature"]):
            return "SignatureDoesNotMatch"
        return None

    def post(self, h: _Handler, url: Any, body: bytes) -> None:
        if url.path == "/sts":
            self._sts(h, body)
            return
        service = "sagemaker" if url.path.startswith("/endpoints/") else "rekognition"
        why = self.verify(h, url, body, service)
        if why is not None:
            self.refused.append(why)
            h.send(403, {"__type": "InvalidSignatureException", "message": why})
            return
        self.verified.append(h.headers["Authorization"].split("Credential=")[1].split("/")[0])
        self.count(service)
        if self.take_throttle():
            h.send(
                400,
                {"__type": "ThrottlingException", "message": "Rate exceeded"},
                {"x-amzn-ErrorType": "ThrottlingException:http://internal.amazon.com/"},
            )
            return
        if self.echo:
            h.send(503, {"message": "overloaded", "headers": dict(h.headers.items())})
            return
        if service == "sagemaker":
            h.send(200, managed_answer(json.loads(body), "detect" in url.path))
        else:
            h.send(200, aws_answer(decode(base64.b64decode(json.loads(body)["Image"]["Bytes"]))))

    def _sts(self, h: _Handler, body: bytes) -> None:
        q = {k: v[-1] for k, v in parse_qs(body.decode()).items()}
        self.count("sts")
        if (
            q.get("Action") != "AssumeRoleWithWebIdentity"
            or q.get("RoleArn") != self.role_arn
            or q.get("WebIdentityToken") != self.web_identity_token
        ):
            h.send(
                403,
                "<ErrorResponse><Error><Type>Sender</Type><Code>AccessDenied</Code>"
                "<Message>Not authorized</Message></Error></ErrorResponse>",
                ctype="text/xml",
            )
            return
        akid, secret, token = (
            "ASIA" + secrets.token_hex(8).upper(),
            secrets.token_urlsafe(30),
            secrets.token_urlsafe(60),
        )
        expiry = time.time() + self.session_lifetime_s
        self.keys[akid] = (secret, token, expiry)
        exp = dt.datetime.fromtimestamp(expiry, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        h.send(
            200,
            f"""<AssumeRoleWithWebIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
<AssumeRoleWithWebIdentityResult><Credentials><AccessKeyId>{akid}</AccessKeyId>
<SecretAccessKey>{secret}</SecretAccessKey><SessionToken>{token}</SessionToken>
<Expiration>{exp}</Expiration></Credentials>
<SubjectFromWebIdentityToken>system:serviceaccount:fortis:fortis</SubjectFromWebIdentityToken>
<AssumedRoleUser><Arn>{self.role_arn}/fortis</Arn><AssumedRoleId>AROA:fortis</AssumedRoleId></AssumedRoleUser>
</AssumeRoleWithWebIdentityResult><ResponseMetadata><RequestId>1</RequestId></ResponseMetadata>
</AssumeRoleWithWebIdentityResponse>""",
            ctype="text/xml",
        )


# ---------------------------------------------------------------------------------------------
# Google
# ---------------------------------------------------------------------------------------------


def _rsa_pem() -> tuple[str, str]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    public = (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    return private, public


class GoogleStandIn(_StandIn):
    """OAuth token endpoint checking JWT assertions with google.auth.jwt, and the APIs."""

    def __init__(self) -> None:
        super().__init__()
        self.token_lifetime_s = 225 + 1.5  # google-auth refreshes 3 min 45 s early
        self.public_keys: dict[str, str] = {}  # private_key_id -> public key PEM
        self.tokens: dict[str, float] = {}  # access token -> expiry epoch
        self.issued = 0
        self.accepted_tokens: list[str] = []
        self.token_errors: list[str] = []

    def service_account(self, path: Path, *, registered: bool = True) -> dict[str, Any]:
        private, public = _rsa_pem()
        kid = secrets.token_hex(20)
        if registered:
            self.public_keys[kid] = public
        info = {
            "type": "service_account",
            "project_id": "fortis-test",
            "private_key_id": kid,
            "private_key": private,
            "client_email": "fortis@fortis-test.iam.gserviceaccount.com",
            "client_id": "1234567890",
            "token_uri": f"{self.base}/token",
        }
        path.write_text(json.dumps(info))
        return info

    def secrets(self) -> list[str]:
        return list(self.tokens)

    def post(self, h: _Handler, url: Any, body: bytes) -> None:
        if url.path == "/token":
            self._token(h, body)
            return
        auth = h.headers.get("Authorization", "")
        token = auth[7:] if auth.startswith("Bearer ") else ""
        with self.lock:
            expiry = self.tokens.get(token)
        if expiry is None or time.time() >= expiry:
            h.send(
                401,
                {
                    "error": {
                        "code": 401,
                        "status": "UNAUTHENTICATED",
                        "message": "Request had invalid authentication credentials.",
                    }
                },
            )
            return
        self.accepted_tokens.append(token)
        self.count(url.path)
        if self.take_throttle():
            h.send(
                429,
                {
                    "error": {
                        "code": 429,
                        "status": "RESOURCE_EXHAUSTED",
                        "message": "Quota exceeded",
                    }
                },
            )
            return
        if self.echo:
            h.send(503, {"error": {"message": f"unavailable; you sent {auth}"}})
            return
        req = json.loads(body)
        if ":predict" in url.path or ":rawPredict" in url.path:
            h.send(200, managed_answer(req, False))
        else:
            h.send(200, google_answer(req))

    def _token(self, h: _Handler, body: bytes) -> None:
        from google.auth import jwt

        q = {k: v[-1] for k, v in parse_qs(body.decode()).items()}
        self.count("token")
        try:
            if q.get("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer":
                raise ValueError("grant_type")
            # google-auth addresses its assertions to Google's token URL wherever it sends them
            claims = jwt.decode(
                q["assertion"],
                certs=self.public_keys,
                audience="https://oauth2.googleapis.com/token",
            )
            if "https://www.googleapis.com/auth/cloud-platform" not in claims.get("scope", ""):
                raise ValueError("scope")
        except Exception as exc:  # noqa: BLE001 - any failure of the assertion: invalid_grant
            self.token_errors.append(f"{type(exc).__name__}: {exc}")
            h.send(400, {"error": "invalid_grant", "error_description": "Invalid JWT Signature."})
            return
        token = "ya29.stand-in-" + secrets.token_urlsafe(24)
        with self.lock:
            self.tokens[token] = time.time() + self.token_lifetime_s
            self.issued += 1
        h.send(
            200,
            {
                "access_token": token,
                "expires_in": int(self.token_lifetime_s + 0.5),
                "token_type": "Bearer",
            },
        )


# ---------------------------------------------------------------------------------------------
# Azure
# ---------------------------------------------------------------------------------------------


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 / localhost and its key, made with ``cryptography``."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fortis-test-authority")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "authority.pem", directory / "authority.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


class AzureStandIn(_StandIn):
    """Entra ID authority (client credentials) over HTTPS, and the APIs (plain loopback)."""

    def __init__(self, directory: Path) -> None:
        self.cert, key = self_signed(directory)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.cert, key)
        super().__init__(ctx)
        self.api = _StandIn()  # the vision / ML APIs, plain http on loopback
        self.api.post = self._api  # type: ignore[method-assign]
        self.tenant = "00000000-0000-0000-0000-00000000f0f0"
        self.client_id = "11111111-2222-3333-4444-555555555555"
        self.client_secret = "azure-secret-" + secrets.token_urlsafe(18)
        self.aml_key = "aml-endpoint-key-" + secrets.token_urlsafe(18)  # an Azure ML endpoint key
        # Short-lived: azure-identity asks again only once a token has expired or after 30 s
        self.token_lifetime_s = 2
        self.tokens: dict[str, tuple[float, str]] = {}  # token -> (expiry, scope)
        self.issued = 0
        self.accepted_tokens: list[str] = []

    def secrets(self) -> list[str]:
        return [self.client_secret, self.aml_key, *self.tokens]

    def get(self, h: _Handler, url: Any) -> None:
        if url.path.endswith("/.well-known/openid-configuration"):
            t = url.path.split("/")[1]
            h.send(
                200,
                {
                    "token_endpoint": f"{self.base}/{t}/oauth2/v2.0/token",
                    "authorization_endpoint": f"{self.base}/{t}/oauth2/v2.0/authorize",
                    "device_authorization_endpoint": f"{self.base}/{t}/oauth2/v2.0/devicecode",
                    "issuer": f"{self.base}/{t}/v2.0",
                },
            )
            return
        h.send(404, {"error": "not_found"})

    def post(self, h: _Handler, url: Any, body: bytes) -> None:
        q = {k: v[-1] for k, v in parse_qs(body.decode()).items()}
        self.count("token")
        if (
            url.path != f"/{self.tenant}/oauth2/v2.0/token"
            or q.get("client_id") != self.client_id
            or not hmac.compare_digest(q.get("client_secret", ""), self.client_secret)
        ):
            h.send(
                401,
                {
                    "error": "invalid_client",
                    "error_description": "AADSTS7000215: Invalid client secret provided.",
                },
            )
            return
        token = "eyJ0eXAiOi.stand-in." + secrets.token_urlsafe(24)
        with self.lock:
            # + 0.25 s: the client counts the lifetime from when it reads the answer
            self.tokens[token] = (time.time() + self.token_lifetime_s + 0.25, q.get("scope", ""))
            self.issued += 1
        h.send(
            200,
            {
                "token_type": "Bearer",
                "expires_in": self.token_lifetime_s,
                "ext_expires_in": self.token_lifetime_s,
                "access_token": token,
            },
        )

    def _api(self, h: _Handler, url: Any, body: bytes) -> None:
        auth = h.headers.get("Authorization", "")
        with self.lock:
            expiry, scope = self.tokens.get(auth[7:], (0.0, ""))
        want = (
            "https://ml.azure.com/.default"
            if url.path == "/score"
            else "https://cognitiveservices.azure.com/.default"
        )
        keyed = url.path == "/score" and hmac.compare_digest(auth, f"Bearer {self.aml_key}")
        if not keyed and (
            not auth.startswith("Bearer ") or time.time() >= expiry or want not in scope
        ):
            h.send(401, {"error": {"code": "401", "message": "Access denied: invalid token"}})
            return
        if not keyed:
            self.accepted_tokens.append(auth[7:])
        self.api.count(url.path)
        if self.api.take_throttle():
            h.send(429, {"error": {"code": "429", "message": "Rate limit"}}, {"Retry-After": "0"})
            return
        if url.path == "/score":
            h.send(200, managed_answer(json.loads(body), False))
            return
        features = parse_qs(url.query).get("features", [""])[0]
        h.send(200, azure_answer(decode(body), features))

    def close(self) -> None:
        self.api.close()
        super().close()
