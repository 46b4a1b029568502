"""OpenID Connect / JWT bearer tokens beside API keys, against a real identity provider's
JWKS: an ``http.server`` on loopback started here, publishing RSA and EC keys generated in
the test, and a real stack on loopback. Every call is made the way a client written from the
protos alone would make it: generated stubs and raw gRPC metadata
(``authorization: Bearer <jwt>``), never the fortis.client SDK.

- a valid token's tenant (a claim) sees only that tenant's evaluations, exactly as an API
  key of the same tenant does; a Kubernetes projected service-account token (a second
  issuer, tenant from ``kubernetes.io.namespace``) works the same way;
- refused, UNAUTHENTICATED with a precise reason that never quotes the token: expired, not
  yet valid, wrong audience, wrong issuer, unknown key, a known kid signed by another key,
  ``alg: none``, HS256 signed with the issuer's public key, no tenant claim;
- key rotation: a new kid published and the old removed; new tokens work at once (an
  unknown kid refreshes the JWKS), old-key tokens are refused after that refresh;
- the IdP down: UNAVAILABLE saying so, API keys still work, keys already fetched still
  verify; the failures are counted on the real /metrics endpoint;
- ``fortis serve --oidc-*`` (a real process) takes the same configuration from its flags.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from fortis.evaluation.v1 import evaluation_pb2 as pb
from fortis.evaluation.v1 import evaluation_pb2_grpc
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

K_ACME = "oidc-test-key-acme-0123456789"
K_B = "oidc-test-key-tenant-b-0123456"
AUD = "fortis"
PLAN = """
name: oidc
seed: 1
target: {name: fmnist-cnn, task: classification}
dataset: {source: fashion-mnist, split: test, limit: 4}
correctness: {mode: top1}
corruptions: [{id: contrast, severities: [1]}]
"""


# -- a real identity provider's key endpoint ----------------------------------------------------

class Idp:
    """Documents served by path (``{path: (status, json)}``), changed by the tests."""

    def __init__(self) -> None:
        self.docs: dict[str, tuple[int, Any]] = {}
        self.hits: dict[str, int] = {}
        idp = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                idp.hits[self.path] = idp.hits.get(self.path, 0) + 1
                status, doc = idp.docs.get(self.path, (404, {"error": "not found"}))
                body = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def publish(self, path: str, *keys: tuple[str, Any], status: int = 200) -> None:
        self.docs[path] = (status, {"keys": [_jwk(kid, k) for kid, k in keys]})

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _jwk(kid: str, private: Any) -> dict[str, Any]:
    if isinstance(private, rsa.RSAPrivateKey):
        d = RSAAlgorithm.to_jwk(private.public_key(), as_dict=True)
        alg = "RS256"
    else:
        d = ECAlgorithm.to_jwk(private.public_key(), as_dict=True)
        alg = "ES256"
    return {**d, "kid": kid, "alg": alg, "use": "sig"}


def _rsa() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


KEYS = {"c-rsa": _rsa(), "c-ec": ec.generate_private_key(ec.SECP256R1()), "k8s-1": _rsa(),
        "r1": _rsa(), "r2": _rsa(), "stranger": _rsa()}


@pytest.fixture(scope="module")
def idp() -> Iterator[Idp]:
    server = Idp()
    b = server.base
    # The corporate IdP: discovery document, then its JWKS (one RSA, one EC key).
    server.docs["/corp/.well-known/openid-configuration"] = (200, {
        "issuer": f"{b}/corp", "jwks_uri": f"{b}/corp/keys"})
    server.publish("/corp/keys", ("c-rsa", KEYS["c-rsa"]), ("c-ec", KEYS["c-ec"]))
    # A cluster's service-account issuer (its JWKS named explicitly, as --oidc-jwks-url).
    server.publish("/k8s/openid/v1/jwks", ("k8s-1", KEYS["k8s-1"]))
    server.publish("/rot/jwks", ("r1", KEYS["r1"]))
    yield server
    server.close()


@pytest.fixture(scope="module")
def oidc_stack(idp: Idp, tmp_path_factory: pytest.TempPathFactory, fmnist_target) -> Iterator[Any]:
    from fortis.infra.serving.identity import parse_issuer_spec
    from fortis.server.app.stack import StackSettings, TargetConfig, start_stack

    b = idp.base
    issuers = [
        # the corporate IdP is trusted to name the key holder's tenant acme (and only it)
        parse_issuer_spec(f"{b}/corp,tenants=acme", audiences=[AUD], tenant_claim="tenant"),
        # a namespace is a tenant apart from every other name: k8s-<namespace>
        parse_issuer_spec(f"{b}/k8s,jwks-url={b}/k8s/openid/v1/jwks,"
                          "tenant-claim=kubernetes.io.namespace,tenant-prefix=k8s-",
                          audiences=[AUD]),
        parse_issuer_spec(f"{b}/rot,jwks-url={b}/rot/jwks,tenants=rotor", audiences=[AUD],
                          tenant_claim="tenant"),
        # an IdP that is down: nothing listens on its port
        parse_issuer_spec(f"{b}/down,jwks-url=http://127.0.0.1:{_free_port()}/jwks,tenants=*",
                          audiences=[AUD], tenant_claim="tenant"),
    ]
    s = start_stack(StackSettings(
        state_dir=tmp_path_factory.mktemp("oidc") / "state",
        api_keys={K_ACME: "acme", K_B: "tenant-b"}, oidc_issuers=issuers,
        oidc_refresh_min_s=0.3, targets=[TargetConfig.parse("fmnist-cnn=builtin:fmnist-cnn")],
        metrics_port=0, metrics_host="127.0.0.1"))
    yield s
    s.stop(0)


@pytest.fixture(scope="module")
def ev(oidc_stack: Any) -> Iterator[Any]:
    ch = grpc.insecure_channel(oidc_stack.address)
    yield evaluation_pb2_grpc.EvaluationServiceStub(ch)
    ch.close()


def _token(idp: Idp, kid: str = "c-rsa", issuer: str = "corp", *, key: Any = None,
           alg: str = "", **claims: Any) -> str:
    now = int(time.time())
    body: dict[str, Any] = {"iss": f"{idp.base}/{issuer}", "aud": AUD, "sub": "alice",
                            "tenant": "acme", "iat": now, "exp": now + 300}
    body.update(claims)
    body = {k: v for k, v in body.items() if v is not None}
    private = key if key is not None else KEYS[kid]
    alg = alg or ("RS256" if isinstance(private, rsa.RSAPrivateKey) else "ES256")
    return jwt.encode(body, private, algorithm=alg, headers={"kid": kid})


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unsigned(idp: Idp, header: dict[str, Any], key: bytes | None = None) -> str:
    """A token made by hand, as an attacker would: ``alg: none``, or HMAC keyed with a
    public key."""
    now = int(time.time())
    payload = {"iss": f"{idp.base}/corp", "aud": AUD, "sub": "mallory", "tenant": "acme",
               "iat": now, "exp": now + 300}
    signing = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(payload).encode())}"
    sig = "" if key is None else _b64(hmac.new(key, signing.encode(), hashlib.sha256).digest())
    return f"{signing}.{sig}"


def _bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def _list(ev: Any, md: Any) -> list[tuple[str, str]]:
    return [(e.evaluation_id, e.tenant)
            for e in ev.ListEvaluations(pb.ListEvaluationsRequest(), metadata=md,
                                        timeout=20).evaluations]


def _refused(ev: Any, md: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as exc:
        ev.ListEvaluations(pb.ListEvaluationsRequest(), metadata=md, timeout=20)
    return exc.value




# -- tests --------------------------------------------------------------------------------------

def test_a_token_tenant_sees_only_its_evaluations(idp, ev, captured) -> None:
    rsa_tok, ec_tok = _token(idp, "c-rsa"), _token(idp, "c-ec")
    sa_tok = _token(idp, "k8s-1", "k8s", tenant=None, sub="system:serviceaccount:team-k:runner",
                    **{"kubernetes.io": {"namespace": "team-k",
                                         "serviceaccount": {"name": "runner", "uid": "u-1"}}})
    created = ev.CreateEvaluation(pb.CreateEvaluationRequest(plan=PLAN, evaluation_id="ev-tok"),
                                  metadata=_bearer(rsa_tok), timeout=60).evaluation
    assert created.tenant == "acme"
    # The same tenant by an ES256 token or an API key sees it; other tenants do not.
    assert _list(ev, _bearer(ec_tok)) == [("ev-tok", "acme")]
    assert _list(ev, (("x-api-key", K_ACME),)) == [("ev-tok", "acme")]
    assert _list(ev, (("x-api-key", K_B),)) == []
    assert _list(ev, _bearer(sa_tok)) == []
    sa = ev.CreateEvaluation(pb.CreateEvaluationRequest(plan=PLAN, evaluation_id="ev-tok"),
                             metadata=_bearer(sa_tok), timeout=60).evaluation
    assert sa.tenant == "k8s-team-k"    # its own "ev-tok", in its own namespace
    # A token never acts for another tenant: x-fortis-tenant is ignored, its own is seen.
    got = ev.GetEvaluation(pb.GetEvaluationRequest(evaluation_id="ev-tok"),
                           metadata=(*_bearer(sa_tok), ("x-fortis-tenant", "acme")),
                           timeout=20).evaluation
    assert got.tenant == "k8s-team-k"
    seen = [ln for ln in captured if ln.get("event") == "authenticated"]
    kinds = {(ln["kind"], ln["tenant"]) for ln in seen}
    assert {("oidc", "acme"), ("oidc", "k8s-team-k"), ("api_key", "acme"),
            ("api_key", "tenant-b")} <= kinds
    assert any(ln.get("issuer") == f"{idp.base}/k8s"
               and ln.get("subject") == "system:serviceaccount:team-k:runner" for ln in seen)
    text = json.dumps(captured, default=str)
    assert not any(t in text or t.split(".")[2] in text for t in (rsa_tok, ec_tok, sa_tok))


def test_bad_tokens_are_refused_with_a_precise_reason(idp, ev, captured) -> None:
    now = int(time.time())
    public_pem = KEYS["c-rsa"].public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    cases = {
        "expired (exp)": _token(idp, exp=now - 120, iat=now - 600),
        "not yet valid": _token(idp, nbf=now + 600),
        "audience (aud) is not this service's": _token(idp, aud="another-service"),
        "issuer is not accepted": _token(idp, iss="https://idp.evil.example"),
        "unknown kid": _token(idp, "stranger"),
        "signature does not verify": _token(idp, "c-rsa", key=KEYS["stranger"]),
        "'none' is never accepted": _unsigned(idp, {"alg": "none", "kid": "c-rsa"}),
        "'HS256' is never accepted": _unsigned(idp, {"alg": "HS256", "kid": "c-rsa",
                                                     "typ": "JWT"}, public_pem),
        "tenant claim 'tenant' is missing": _token(idp, tenant=None),
        "not a tenant name": _token(idp, tenant="../other"),
        "no 'exp' claim": _token(idp, exp=None),
        "not a signed JWT": "not-a-jwt",
    }
    for why, token in cases.items():
        err = _refused(ev, _bearer(token))
        assert err.code() == grpc.StatusCode.UNAUTHENTICATED, (why, err.details())
        assert why in err.details() and err.details().startswith("bearer token refused"), \
            (why, err.details())
        sig = token.split(".")[-1]
        assert token not in err.details() and not (sig and sig in err.details())
    err = _refused(ev, (("authorization", "Basic YWxhZGRpbjpvcGVuc2VzYW1l"),))
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED and "Bearer" in err.details()
    err = _refused(ev, ())
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED and "authorization" in err.details()
    failed = [ln for ln in captured if ln.get("event") == "auth_failed"]
    assert len(failed) == len(cases) + 2 and all(ln.get("kind") == "oidc" for ln in failed[:-1])
    text = json.dumps(captured, default=str)
    assert not any(t.split(".")[-1] in text for t in cases.values() if t.count(".") == 2
                   and t.split(".")[-1])


def test_key_rotation(idp, ev) -> None:
    old = _token(idp, "r1", "rot", tenant="rotor")
    assert _list(ev, _bearer(old)) == []
    # The IdP publishes r2 and drops r1 (a real IdP overlaps them; the hard case is tested).
    idp.publish("/rot/jwks", ("r2", KEYS["r2"]))
    time.sleep(0.4)                 # past the least interval between two fetches
    new = _token(idp, "r2", "rot", tenant="rotor")
    assert _list(ev, _bearer(new)) == []          # unknown kid -> fetched -> verified
    err = _refused(ev, _bearer(old))
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED and "unknown kid" in err.details()
    time.sleep(0.4)                 # even with a refresh allowed, r1 stays gone
    assert _refused(ev, _bearer(_token(idp, "r1", "rot", tenant="rotor"))).code() == \
        grpc.StatusCode.UNAUTHENTICATED
    # Made-up kids do not make a fetch each: at most one per interval.
    before = idp.hits.get("/rot/jwks", 0)
    for n in range(20):
        _refused(ev, _bearer(_token(idp, "r1", "rot", key=KEYS["r1"], jti=str(n), tenant="rotor")))
    assert idp.hits.get("/rot/jwks", 0) - before <= 2


def test_idp_down_is_unavailable_and_api_keys_still_work(idp, ev, oidc_stack) -> None:
    err = _refused(ev, _bearer(_token(idp, "c-rsa", "down")))
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    assert "JWKS" in err.details() and "cannot be fetched" in err.details()
    assert _list(ev, (("x-api-key", K_B),)) == []
    # The corporate IdP failing now: its keys already fetched keep verifying.
    good = _token(idp, "c-ec")
    assert _list(ev, _bearer(good)) is not None
    saved = idp.docs["/corp/keys"]
    idp.docs["/corp/keys"] = (503, {"error": "maintenance"})
    try:
        time.sleep(0.4)
        assert _list(ev, _bearer(_token(idp, "c-rsa"))) is not None
        err = _refused(ev, _bearer(_token(idp, "stranger")))      # unknown kid, IdP down
        assert err.code() == grpc.StatusCode.UNAVAILABLE, err.details()
    finally:
        idp.docs["/corp/keys"] = saved
    with urllib.request.urlopen(f"http://127.0.0.1:{oidc_stack.metrics_port}/metrics",
                                timeout=10) as r:
        text = r.read().decode()
    down = [ln for ln in text.splitlines() if ln.startswith("fortis_oidc_jwks_fetch_errors_total")
            and f'{idp.base}/down' in ln]
    assert down and float(down[0].rsplit(" ", 1)[1]) >= 1
    corp_ok = [ln for ln in text.splitlines()
               if ln.startswith("fortis_oidc_jwks_last_fetch_success_timestamp_seconds")
               and f'"{idp.base}/corp"' in ln]
    assert corp_ok and float(corp_ok[0].rsplit(" ", 1)[1]) > 0


def test_fortis_serve_takes_the_oidc_flags(idp, tmp_path: Path) -> None:
    b = idp.base
    proc = subprocess.Popen(
        [sys.executable, "-c", "from fortis.server.cli import main; raise SystemExit(main())",
         "serve", "--service", "evaluation", "--address", "127.0.0.1:0",
         "--state-dir", str(tmp_path / "state"),
         "--oidc-issuer", f"{b}/corp", "--oidc-audience", AUD, "--oidc-tenant-claim", "tenant",
         "--oidc-tenants", "acme",
         "--oidc-issuer", f"{b}/k8s,jwks-url={b}/k8s/openid/v1/jwks,"
         "tenant-claim=kubernetes.io.namespace,tenant-prefix=k8s-,tenants=*"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        started = json.loads(proc.stdout.readline())
        assert "api_key" not in started          # tokens only: no generated demo key
        ch = grpc.insecure_channel(started["address"])
        stub = evaluation_pb2_grpc.EvaluationServiceStub(ch)
        assert _list(stub, _bearer(_token(idp))) == []
        sa = _token(idp, "k8s-1", "k8s", tenant=None,
                    **{"kubernetes.io": {"namespace": "team-k"}})
        assert _list(stub, _bearer(sa)) == []
        assert _refused(stub, _bearer(_token(idp, aud="x"))).code() == \
            grpc.StatusCode.UNAUTHENTICATED
        assert _refused(stub, (("x-api-key", K_ACME),)).code() == \
            grpc.StatusCode.UNAUTHENTICATED
        ch.close()
    finally:
        proc.terminate()
        proc.communicate(timeout=60)


def test_a_namespace_named_like_a_tenant_is_not_that_tenant(idp, ev) -> None:
    """Tenant names are one space for keys and tokens: a pod in a namespace its owner named
    ``acme`` gets the tenant ``k8s-acme`` (the issuer's prefix) and reads nothing of the key
    holder ``acme``; the corporate issuer, trusted with ``acme`` only, cannot name another
    tenant; an issuer configured with neither an allow-list nor a prefix is refused."""
    from fortis.infra.serving.identity import parse_issuer_spec
    from fortis.services.common.errors import InvalidArgument

    ev.CreateEvaluation(pb.CreateEvaluationRequest(plan=PLAN, evaluation_id="acme-private"),
                        metadata=(("x-api-key", K_ACME),), timeout=60)
    ns_acme = _token(idp, "k8s-1", "k8s", tenant=None,
                     **{"kubernetes.io": {"namespace": "acme"}})
    assert ("acme-private", "acme") not in _list(ev, _bearer(ns_acme))
    with pytest.raises(grpc.RpcError) as got:
        ev.GetEvaluation(pb.GetEvaluationRequest(evaluation_id="acme-private"),
                         metadata=_bearer(ns_acme), timeout=20)
    assert got.value.code() == grpc.StatusCode.NOT_FOUND, got.value
    other = _refused(ev, _bearer(_token(idp, tenant="tenant-b")))
    assert other.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "not one this issuer's tokens may name" in other.details()
    with pytest.raises(InvalidArgument) as info:
        parse_issuer_spec(f"{idp.base}/corp", audiences=[AUD], tenant_claim="tenant")
    assert info.value.violations[0].field == "oidc_tenants"
    for bad in ("tenants=a/b", "tenant-prefix=-x", "tenant-prefix=" + "p" * 40):
        with pytest.raises(InvalidArgument):
            parse_issuer_spec(f"{idp.base}/corp,{bad}", audiences=[AUD], tenant_claim="tenant")
