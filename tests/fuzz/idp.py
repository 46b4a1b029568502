"""A real OpenID Connect identity provider's key endpoint for fuzzing bearer tokens: an
``http.server`` on loopback publishing a discovery document and a JWKS of keys generated
here, and the tokens a client (honest or hostile) could send.

Used by ``tests/fuzz/test_fuzz_rpcs.py`` (a stack with ``oidc_issuers``) and ``bench/fuzz.py``
(``fortis serve --oidc-issuer``). Test code: no Fortis import.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

#: The audience the server under fuzz is configured with (``--oidc-audience``).
AUDIENCE = "fortis"
#: The claim naming the tenant (``--oidc-tenant-claim``).
TENANT_CLAIM = "tenant"


def b64(data: bytes | str) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


class FuzzIdp:
    """An issuer at ``{base}/fuzz`` (discovery + JWKS with one RSA and one EC key) and a key
    of its own nobody publishes (a token signed with it must be refused)."""

    def __init__(self) -> None:
        self.rsa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.ec = ec.generate_private_key(ec.SECP256R1())
        self.stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.hits = 0
        idp = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                idp.hits += 1
                if self.path == "/fuzz/.well-known/openid-configuration":
                    doc: Any = {"issuer": idp.issuer, "jwks_uri": f"{idp.base}/fuzz/keys"}
                elif self.path == "/fuzz/keys":
                    doc = {"keys": [idp._jwk("k-rsa", idp.rsa), idp._jwk("k-ec", idp.ec)]}
                else:
                    self.send_response(404)
                    self.end_headers()
                    return
                body = json.dumps(doc).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.issuer = f"{self.base}/fuzz"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @staticmethod
    def _jwk(kid: str, private: Any) -> dict[str, Any]:
        if isinstance(private, rsa.RSAPrivateKey):
            return {**RSAAlgorithm.to_jwk(private.public_key(), as_dict=True), "kid": kid,
                    "alg": "RS256", "use": "sig"}
        return {**ECAlgorithm.to_jwk(private.public_key(), as_dict=True), "kid": kid,
                "alg": "ES256", "use": "sig"}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -- tokens -------------------------------------------------------------------------------

    def claims(self, **over: Any) -> dict[str, Any]:
        now = int(time.time())
        body: dict[str, Any] = {"iss": self.issuer, "aud": AUDIENCE, "sub": "fuzz",
                                TENANT_CLAIM: "tenant-a", "iat": now, "exp": now + 3600}
        body.update(over)
        return {k: v for k, v in body.items() if v is not None}

    def token(self, kid: str = "k-rsa", *, key: Any = None, headers: dict[str, Any] | None = None,
              **claims: Any) -> str:
        """A token signed as the issuer signs (or with ``key``), with ``claims`` over the
        valid ones (None removes a claim; any JSON value, as a hostile IdP could write)."""
        private = key if key is not None else (self.rsa if kid != "k-ec" else self.ec)
        alg = "RS256" if isinstance(private, rsa.RSAPrivateKey) else "ES256"
        return self.raw_signed({"kid": kid, "alg": alg, **(headers or {})},
                               json.dumps(self.claims(**claims)), key=private)

    def raw_signed(self, header: dict[str, Any] | str, payload: str, kid: str = "k-rsa",
                   key: Any = None) -> str:
        """A token whose payload is ``payload`` verbatim (NaN, Infinity, huge numbers, deep
        nesting: what ``json.dumps`` would not write) signed with the issuer's RSA key (or
        ``key``), as a broken or hostile IdP could."""
        private = key if key is not None else self.rsa
        alg = "RS256" if isinstance(private, rsa.RSAPrivateKey) else "ES256"
        head = header if isinstance(header, str) else json.dumps(
            {"alg": alg, "typ": "JWT", "kid": kid, **header})
        signing = f"{b64(head)}.{b64(payload)}"
        sig = jwt.algorithms.get_default_algorithms()[alg].sign(signing.encode(), private)
        return f"{signing}.{b64(sig)}"

    def unsigned(self, header: dict[str, Any], hmac_key: bytes | None = None,
                 **claims: Any) -> str:
        """``alg: none`` (no signature) or an HMAC "signed" with ``hmac_key`` (the issuer's
        public key: what a confused verifier would accept)."""
        signing = f"{b64(json.dumps(header))}.{b64(json.dumps(self.claims(**claims)))}"
        sig = "" if hmac_key is None else b64(
            hmac.new(hmac_key, signing.encode(), hashlib.sha256).digest())
        return f"{signing}.{sig}"

    def public_pem(self) -> bytes:
        return self.rsa.public_key().public_bytes(serialization.Encoding.PEM,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo)
