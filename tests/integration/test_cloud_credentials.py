"""Cloud credentials (``aws_sigv4``, ``google_oauth``, ``azure_ad``) and managed endpoints
(``sagemaker:``, ``vertex:``, ``azureml:``) through the real Fortis proxy.

AWS, Google Cloud and Azure cannot be reached from here: the targets are the local stand-ins of
``_cloud_stand_ins`` (each says so), which verify every request with the vendor's own library
-- botocore recomputes the SigV4 signature, google.auth.jwt checks the service-account
assertion, an HTTPS Entra ID authority issues client-credential tokens to azure-identity -- and
accept only currently valid tokens. The proxy is the real one (``start_stack``), with its
ledger; the credentials come from the environment and files, as in a pod.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import yaml
from fortis.adapters import http_json as hj
from fortis.adapters import managed_endpoints as me
from fortis.adapters.registry import backend_for
from fortis.proxy.v1 import proxy_pb2_grpc
from fortis.services.common import errors
from fortis.services.common.codec import image_msg
from google.rpc import code_pb2
from structlog.testing import capture_logs

from tests.conftest import API_KEY
from tests.integration._cloud_stand_ins import AwsStandIn, AzureStandIn, GoogleStandIn
from tests.integration._http_json_support import (
    BRIGHT,
    CAT,
    DARK,
    DOG,
    PLAIN,
    PROFILES,
    classes,
    expected_conf,
    ledger,
    predict,
    session,
    stats,
)
from tests.integration._plan_support import (
    DETECTION,
    check_accuracy,
    check_ledger,
    check_no_secrets,
    classification_manifest,
    detection_manifest,
    plan,
    run_plan,
    start_stack_with_data,
)

REGION = "eu-west-1"


def shipped_copy(directory: Path, shipped: str, name: str, **changes: Any) -> Path:
    """A shipped profile as it is (its cloud auth kept), with some settings changed."""
    data = yaml.safe_load((PROFILES / f"{shipped}.yaml").read_text())
    data["name"] = name
    data["labels_file"] = str(PROFILES / "labels-coco-80.yaml")
    for dotted, value in changes.items():
        node = data
        *path, last = dotted.split(".")
        for k in path:
            node = node[k]
        node[last] = value
    out = directory / f"{name}.yaml"
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


class Clouds:
    def __init__(self, d: Path) -> None:
        self.aws = AwsStandIn(REGION)
        self.google = GoogleStandIn()
        self.azure = AzureStandIn(d)
        self.dir = d
        self.sa_path = d / "gcp-key.json"
        self.sa = self.google.service_account(self.sa_path)
        self.wit = d / "web-identity-token"
        self.wit.write_text(self.aws.web_identity_token)

    def env(self) -> dict[str, str]:
        """What a pod would have: IRSA, a mounted GCP key, Entra ID client credentials."""
        return {
            "AWS_REGION": REGION,
            "AWS_ROLE_ARN": self.aws.role_arn,
            "AWS_WEB_IDENTITY_TOKEN_FILE": str(self.wit),
            "AWS_ENDPOINT_URL_STS": self.aws.base + "/sts",
            "AWS_CONFIG_FILE": str(self.dir / "no-aws-config"),
            "AWS_SHARED_CREDENTIALS_FILE": str(self.dir / "no-aws-credentials"),
            "AWS_EC2_METADATA_DISABLED": "true",
            "GOOGLE_APPLICATION_CREDENTIALS": str(self.sa_path),
            "FORTIS_GOOGLE_VISION_URL": self.google.base + "/v1/images:annotate",
            "AZURE_VISION_ENDPOINT": self.azure.api.base,
            "AZURE_TENANT_ID": self.azure.tenant,
            "AZURE_CLIENT_ID": self.azure.client_id,
            "AZURE_CLIENT_SECRET": self.azure.client_secret,
            "AZURE_AUTHORITY_HOST": self.azure.base,
            "REQUESTS_CA_BUNDLE": str(self.azure.cert),
            "AML_KEY": self.azure.aml_key,
        }

    def secrets(self) -> list[str]:
        return (
            self.aws.secrets()
            + self.google.secrets()
            + self.azure.secrets()
            + [self.sa["private_key"].splitlines()[1], self.sa["private_key_id"]]
        )

    def close(self) -> None:
        for s in (self.aws, self.google, self.azure):
            s.close()


AWS_UNSET = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
)


@pytest.fixture(scope="module")
def clouds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Clouds]:
    c = Clouds(tmp_path_factory.mktemp("clouds"))
    with pytest.MonkeyPatch.context() as mp:
        for k in AWS_UNSET:
            mp.delenv(k, raising=False)
        for k, v in c.env().items():
            mp.setenv(k, v)
        yield c
    c.close()


def targets(c: Clouds, d: Path) -> dict[str, str]:
    aws, google, azure = c.aws.base, c.google.base, c.azure.api.base
    return {
        "aws": f"http-json:{shipped_copy(d, 'aws-rekognition-labels', 'aws', **{'request.url': aws + '/rekognition'})}",
        "aws-objects": f"http-json:{shipped_copy(d, 'aws-rekognition-objects', 'aws-objects', **{'request.url': aws + '/rekognition'})}",
        "gcv": "http-json:google-vision-labels",  # shipped, by name
        "gcv-objects": "http-json:google-vision-objects",
        "azure": "http-json:azure-image-analysis-tags",
        "azure-objects": "http-json:azure-image-analysis-objects",
        "sm": f"sagemaker:classify-ep?region={REGION}&endpoint_url={aws}",
        "sm-det": f"sagemaker:detect-ep?region={REGION}&task=detection&endpoint_url={aws}",
        "vx": f"vertex:1234567?project=fortis-test&region=europe-west4&endpoint_url={google}",
        "vx-raw": f"vertex:1234567?project=fortis-test&region=europe-west4&method=rawPredict"
        f"&endpoint_url={google}",
        "aml": f"azureml:fortis-ep?region=westeurope&auth=aad&endpoint_url={azure}",
        "aml-key": f"azureml:fortis-ep?region=westeurope&key=env:AML_KEY&deployment=blue"
        f"&endpoint_url={azure}",
    }


@pytest.fixture(scope="module")
def stack(clouds: Clouds, tmp_path_factory: pytest.TempPathFactory):
    from fortis.server.app.stack import StackSettings, TargetConfig, start_stack

    d = tmp_path_factory.mktemp("profiles")
    specs = [f"{k}={u}{'&' if '?' in u else '?'}rate=100" for k, u in targets(clouds, d).items()]
    s = start_stack(
        StackSettings(
            state_dir=tmp_path_factory.mktemp("state"),
            api_keys={API_KEY: "tenant-a"},
            only="proxy",
            targets=[TargetConfig.parse(x) for x in specs],
        )
    )
    yield s
    s.stop(0)


@pytest.fixture(scope="module")
def px(stack) -> Iterator[proxy_pb2_grpc.TargetProxyServiceStub]:
    ch = grpc.insecure_channel(stack.address)
    yield proxy_pb2_grpc.TargetProxyServiceStub(ch)
    ch.close()


# ---------------------------------------------------------------------------------------------
# Every auth kind and every managed scheme, through the proxy
# ---------------------------------------------------------------------------------------------

CLASSIFIERS = ["aws", "gcv", "azure", "sm", "vx", "vx-raw", "aml", "aml-key"]
DETECTORS = ["aws-objects", "gcv-objects", "azure-objects", "sm-det"]


@pytest.mark.parametrize("target", CLASSIFIERS)
def test_classification_through_the_proxy(px, clouds, target):
    before = (
        len(clouds.aws.verified),
        len(clouds.google.accepted_tokens),
        sum(clouds.azure.api.counts.values()),
    )
    sid = session(px, target)
    dark, bright = predict(px, sid, {"d": DARK, "b": BRIGHT})
    assert classes(dark)[0] == (CAT, "cat", expected_conf(DARK))
    assert classes(bright)[0] == (DOG, "dog", expected_conf(BRIGHT))
    rows = ledger(px, sid)
    assert {r.status for r in rows} == {code_pb2.OK} and len(rows) == 2
    after = (
        len(clouds.aws.verified),
        len(clouds.google.accepted_tokens),
        sum(clouds.azure.api.counts.values()),
    )
    assert after != before  # the vendor stand-in verified and answered it


@pytest.mark.parametrize("target", DETECTORS)
def test_detection_through_the_proxy(px, target):
    sid = session(px, target)
    dark, bright = predict(px, sid, {"d": DARK, "b": BRIGHT})
    (b,) = bright.detection.boxes
    assert (b.label, b.name) == (DOG, "dog")
    assert (b.x_min, b.y_min, b.x_max, b.y_max) == pytest.approx((20, 8, 44, 24), abs=1e-3)
    (b,) = dark.detection.boxes
    assert (b.label, b.name) == (CAT, "cat")
    assert stats(px, sid).queries_ok == 2


def test_managed_endpoint_requests_reach_the_documented_paths(px, clouds):
    for target in ("sm", "vx", "vx-raw", "aml"):
        predict(px, session(px, target), {"d": DARK})
    assert clouds.aws.counts["sagemaker"] >= 1
    assert (
        clouds.google.counts[
            "/v1/projects/fortis-test/locations/europe-west4/endpoints/1234567:predict"
        ]
        >= 1
    )
    assert (
        clouds.google.counts[
            "/v1/projects/fortis-test/locations/europe-west4/endpoints/1234567:rawPredict"
        ]
        >= 1
    )
    assert clouds.azure.api.counts["/score"] >= 1


# ---------------------------------------------------------------------------------------------
# Credentials that change during a run
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_tokens_and_session_credentials_refresh_during_a_run(px, clouds):
    """Short lifetimes: AWS session credentials (web identity) due for refresh after 2 s,
    Google tokens after 1.5 s, Entra ID tokens expiring after 2 s. A run spanning 5 s keeps
    working and each vendor library fetched new credentials on its own."""
    sids = {t: session(px, t) for t in ("aws", "gcv", "azure")}
    sts0, g0, a0 = clouds.aws.counts["sts"], clouds.google.issued, clouds.azure.issued
    akids0 = set(clouds.aws.verified)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 5.0:
        for t, sid in sids.items():
            (p,) = predict(px, sid, {"d": DARK})
            assert classes(p)[0][:2] == (CAT, "cat"), t
        time.sleep(0.5)
    assert clouds.aws.counts["sts"] > sts0
    assert set(clouds.aws.verified) - akids0  # requests signed with fresh keys
    assert clouds.google.issued > g0 and clouds.azure.issued > a0
    for t, sid in sids.items():
        assert {r.status for r in ledger(px, sid)} == {code_pb2.OK}, t


# ---------------------------------------------------------------------------------------------
# Throttling: retried with backoff and recorded like every retry
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "target,cloud", [("aws", "aws"), ("sm", "aws"), ("gcv", "google"), ("azure", "azure-api")]
)
def test_throttled_answers_are_retried_and_recorded(px, clouds, target, cloud):
    """AWS: HTTP 400 ThrottlingException (x-amzn-ErrorType); Google: 429 RESOURCE_EXHAUSTED;
    Azure: 429 with Retry-After."""
    stand_in = {"aws": clouds.aws, "google": clouds.google, "azure-api": clouds.azure.api}[cloud]
    sid = session(px, target)
    stand_in.throttle_left = 1
    (p,) = predict(px, sid, {"d": DARK})
    assert classes(p)[0][:2] == (CAT, "cat")
    assert [(r.status, r.attempts) for r in ledger(px, sid)] == [
        (code_pb2.UNAVAILABLE, 1),
        (code_pb2.OK, 2),
    ]
    st = stats(px, sid)
    assert (st.queries_ok, st.queries_failed) == (1, 1)


def test_aws_throttling_is_told_from_other_400s():
    from fortis.adapters.http_client import HttpResponse
    from fortis.adapters.http_json.backend import _aws_throttled

    def r(status: int, body: bytes, headers: dict[str, str] | None = None) -> HttpResponse:
        return HttpResponse(status, headers or {}, body)

    assert _aws_throttled(r(400, b'{"__type": "com.amazon.coral#ThrottlingException"}'))
    assert _aws_throttled(
        r(400, b"", {"x-amzn-errortype": "ProvisionedThroughputExceededException:"})
    )
    assert not _aws_throttled(r(400, b'{"__type": "InvalidParameterException"}'))
    assert not _aws_throttled(r(400, b'{"__type": 7}'))
    assert not _aws_throttled(r(400, b'{"__type": "Thrott'))
    assert not _aws_throttled(r(403, b'{"__type": "ThrottlingException"}'))


# ---------------------------------------------------------------------------------------------
# Wrong credentials: a precise error naming the profile, never the key
# ---------------------------------------------------------------------------------------------


def test_aws_static_keys_and_a_wrong_secret(clouds, monkeypatch, tmp_path):
    akid, secret = clouds.aws.static_key()
    for k in ("AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(k)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", akid)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    url = f"sagemaker:classify-ep?region={REGION}&endpoint_url={clouds.aws.base}"
    b = backend_for(url)
    try:
        (p,) = b.predict([image_msg("d", DARK)])
        assert classes(p)[0][:2] == (CAT, "cat") and clouds.aws.verified[-1] == akid
    finally:
        b.close()
    wrong = "W" + secret[1:]
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", wrong)
    b = backend_for(url)
    try:
        with pytest.raises(hj.HttpTargetError) as ei:
            b.predict([image_msg("d", DARK)])
    finally:
        b.close()
    assert "HTTP 403" in str(ei.value) and "SignatureDoesNotMatch" in str(ei.value)
    assert clouds.aws.refused[-1] == "SignatureDoesNotMatch"
    assert wrong not in str(ei.value) and secret not in str(ei.value)


def test_refused_credentials_fail_at_start_naming_the_profile(clouds, monkeypatch, tmp_path):
    # Google: a key the token endpoint does not know (its JWT signature does not verify)
    stranger = tmp_path / "stranger.json"
    info = clouds.google.service_account(stranger, registered=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(stranger))
    with pytest.raises(errors.FailedPrecondition) as ei:
        backend_for("http-json:google-vision-labels")
    msg = str(ei.value)
    assert "'google-vision-labels'" in msg and "google_oauth" in msg and "RefreshError" in msg
    assert info["private_key_id"] not in msg and "BEGIN" not in msg
    # Azure: a wrong client secret
    monkeypatch.setenv("AZURE_CLIENT_SECRET", "not-the-secret-" + "x" * 20)
    with pytest.raises(errors.FailedPrecondition) as ei:
        backend_for("http-json:azure-image-analysis-tags")
    assert "'azure-image-analysis-tags'" in str(ei.value) and "azure_ad" in str(ei.value)
    assert "not-the-secret" not in str(ei.value)
    # AWS: a web identity token STS refuses
    clouds.wit.write_text("eyJ-forged")
    try:
        with pytest.raises(errors.FailedPrecondition) as ei:
            backend_for(f"sagemaker:ep?region={REGION}&endpoint_url={clouds.aws.base}")
        assert "'sagemaker:ep'" in str(ei.value) and "aws_sigv4" in str(ei.value)
        assert "eyJ-forged" not in str(ei.value)
    finally:
        clouds.wit.write_text(clouds.aws.web_identity_token)
    # ... and an AWS chain that finds nothing at all
    monkeypatch.delenv("AWS_ROLE_ARN")
    monkeypatch.delenv("AWS_WEB_IDENTITY_TOKEN_FILE")
    with pytest.raises(errors.FailedPrecondition, match="found no AWS credentials"):
        backend_for(f"sagemaker:ep?region={REGION}&endpoint_url={clouds.aws.base}")


# ---------------------------------------------------------------------------------------------
# No secret in logs, errors or the ledger
# ---------------------------------------------------------------------------------------------


def test_no_secret_in_logs_errors_or_ledger(clouds, tmp_path, caplog, capfd):
    """Root logging at DEBUG, every vendor library in play, a target that echoes the request's
    headers (tokens, signatures, session tokens) back in its error answers."""
    from fortis.server.app.stack import StackSettings, TargetConfig, start_stack

    caplog.set_level(logging.DEBUG)
    names = ["aws", "gcv", "azure", "aml-key"]
    all_targets = targets(clouds, tmp_path)
    with capture_logs() as logs:
        s = start_stack(
            StackSettings(
                state_dir=tmp_path / "state",
                api_keys={API_KEY: "tenant-a"},
                only="proxy",
                targets=[TargetConfig.parse(f"{n}={all_targets[n]}") for n in names],
            )
        )
        details = []
        try:
            ch = grpc.insecure_channel(s.address)
            stub = proxy_pb2_grpc.TargetProxyServiceStub(ch)
            rows = []
            for n in names:
                sid = session(stub, n)
                predict(stub, sid, {"d": DARK})
                rows += ledger(stub, sid)
            clouds.aws.echo = clouds.google.echo = True
            for n in ("aws", "gcv"):
                sid = session(stub, n)
                with pytest.raises(grpc.RpcError) as ei:
                    predict(stub, sid, {"d": DARK})
                details.append(ei.value.details())
                rows += ledger(stub, sid)
            ch.close()
        finally:
            clouds.aws.echo = clouds.google.echo = False
            s.stop(0)
    secrets = [x for x in clouds.secrets() if len(x) >= 8]
    assert clouds.google.tokens and clouds.azure.tokens and len(secrets) > 6
    out, err = capfd.readouterr()
    texts = {
        "details": "\n".join(details),
        "ledger": "\n".join(r.error for r in rows),
        "structlog": repr(logs),
        "logging": caplog.text,
        "stdout": out,
        "stderr": err,
    }
    # the operator's log has the target's whole answer, the echoed token and session token
    # replaced by the adapter (the tenant's error and the ledger get the proxy's short reason)
    assert "[secret]" in texts["structlog"] and "target_error" in texts["structlog"]
    for where, text in texts.items():
        for x in secrets:
            assert x not in text, f"a secret in {where}"
    for f in (tmp_path / "state").iterdir():
        if f.is_file():
            data = f.read_bytes()
            assert not any(x.encode() in data for x in secrets), f.name


# ---------------------------------------------------------------------------------------------
# Hostile settings: precise errors naming the setting
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url,needle",
    [
        ("sagemaker:ep?region=eu-west-1&endpoint_url=http://169.254.169.254", "not loopback"),
        (
            "vertex:1?project=fortis-test&region=europe-west4&endpoint_url=file:///etc/passwd",
            "not an http:// or https:// URL",
        ),
        ("azureml:ep?region=westeurope&key=env:K&endpoint_url=https://u:p@host", "takes a scheme"),
        ("sagemaker:../../admin?region=eu-west-1", "not an endpoint name"),
        ("sagemaker:ep%2F..?region=eu-west-1", "not an endpoint name"),
        ("sagemaker:ep?region=../x", "region '../x' is not an AWS region"),
        ("sagemaker:ep", "region= is required"),
        ("vertex:1?region=europe-west4&project=a/b", "project 'a/b' is not"),
        ("vertex:1?region=europe-west4&project=fortis-test&method=delete", "method 'delete'"),
        ("azureml:ep?region=westeurope&auth=key", "auth=key needs key="),
        ("azureml:ep?region=westeurope&key=sk-live-123", "secret reference"),
        ("azureml:ep?region=westeurope&auth=aad&key=env:K", "only used with auth=key"),
        ("azureml:ep?region=westeurope&auth=aad&deployment=a%0Ab", "not a deployment name"),
        ("sagemaker:ep?region=eu-west-1&regoin=x", "unknown setting regoin"),
        ("sagemaker:ep?region=eu-west-1&task=segmentation", "task 'segmentation'"),
        ("sagemaker:ep?region=eu-west-1&profile=/no/such.yaml", "cannot read the mapping"),
    ],
)
def test_hostile_managed_endpoint_urls(url, needle, monkeypatch):
    monkeypatch.setenv("K", "x" * 12)
    with pytest.raises(errors.InvalidArgument) as ei:
        backend_for(url)
    assert needle in str(ei.value)
    assert "sk-live-123" not in str(ei.value)
    assert ei.value.violations[0].field in ("target", "request.auth.secret")


@pytest.mark.parametrize(
    "auth,field,needle",
    [
        ({"kind": "aws_sigv4", "region": "eu-west-1"}, "request.auth.service", "required"),
        (
            {"kind": "aws_sigv4", "service": "s", "region": "mars-1"},
            "request.auth.region",
            "not an AWS region",
        ),
        (
            {"kind": "aws_sigv4", "service": "s", "region": "${env:NO_SUCH_VAR_X}"},
            "request.auth.region",
            "not set",
        ),
        (
            {"kind": "google_oauth", "credentials": '{"private_key": "..."}'},
            "request.auth.credentials",
            "secret reference",
        ),
        ({"kind": "google_oauth", "scopes": "cloud-platform"}, "request.auth.scopes", "https://"),
        (
            {"kind": "azure_ad", "scope": "cognitiveservices"},
            "request.auth.scope",
            "not a scope URL",
        ),
        (
            {
                "kind": "azure_ad",
                "scope": "https://x/.default",
                "credential": "client_secret",
                "tenant_id": "t",
                "client_id": "c",
            },
            "request.auth.client_secret",
            "required",
        ),
        (
            {"kind": "azure_ad", "scope": "https://x/.default", "client_secret": "env:S"},
            "request.auth.client_secret",
            "only used by credential: client_secret",
        ),
        ({"kind": "kerberos"}, "request.auth.kind", "not one of header, aws_sigv4"),
        (
            {"kind": "aws_sigv4", "service": "s", "region": "eu-west-1", "secret_key": "abc"},
            "request.auth.secret_key",
            "unknown setting",
        ),
    ],
)
def test_bad_cloud_auth_settings_are_named(auth, field, needle):
    data = yaml.safe_load((PROFILES / "google-vision-labels.yaml").read_text())
    data["labels_file"] = str(PROFILES / "labels-coco-80.yaml")
    data["request"]["auth"] = auth
    with pytest.raises(errors.InvalidArgument) as ei:
        hj.parse_profile(data)
    hits = [v for v in ei.value.violations if v.field == field]
    assert hits and needle in hits[0].description, ei.value.violations


def test_profile_for_maps_each_scheme_to_the_vendor_url():
    """The vendors' documented paths (no endpoint_url): what a real endpoint would be sent."""
    d = me.profile_for("sagemaker:my-ep?region=eu-west-1&task=detection")
    assert (
        d["request"]["url"]
        == "https://runtime.sagemaker.eu-west-1.amazonaws.com/endpoints/my-ep/invocations"
    )
    assert d["request"]["auth"] == {
        "kind": "aws_sigv4",
        "service": "sagemaker",
        "region": "eu-west-1",
    }
    assert d["task"] == "detection"
    d = me.profile_for("vertex:42?project=p-12345&region=us-central1")
    assert d["request"]["url"] == (
        "https://us-central1-aiplatform.googleapis.com/v1/projects/p-12345/"
        "locations/us-central1/endpoints/42:predict"
    )
    d = me.profile_for("azureml:My-Ep?region=westeurope&auth=aad")
    assert d["request"]["url"] == "https://my-ep.westeurope.inference.ml.azure.com/score"
    assert d["request"]["auth"]["scope"] == "https://ml.azure.com/.default"


def test_google_token_is_fetched_once_by_concurrent_requests(clouds):
    """Many threads signing at once with a fresh signer: one token request (the refresh is
    under the signer's lock), every thread gets that token."""
    from concurrent.futures import ThreadPoolExecutor

    from fortis.adapters.http_json.cloud_auth import CloudAuthSpec

    signer = CloudAuthSpec(kind="google_oauth").signer("concurrent")
    before = clouds.google.issued
    with ThreadPoolExecutor(8) as pool:
        headers = list(pool.map(lambda _: signer.sign("POST", "https://x/", {}, b""), range(16)))
    assert clouds.google.issued == before + 1
    assert len({h["Authorization"] for h in headers}) == 1


def test_aws_keys_from_a_mounted_shared_credentials_file(clouds, monkeypatch, tmp_path):
    """A Kubernetes secret mounted as an AWS credentials file, named by a profile."""
    akid, secret = clouds.aws.static_key()
    creds = tmp_path / "credentials"
    creds.write_text(f"[fortis]\naws_access_key_id = {akid}\naws_secret_access_key = {secret}\n")
    for k in ("AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(k)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(creds))
    b = backend_for(
        f"sagemaker:classify-ep?region={REGION}&aws_profile=fortis&endpoint_url={clouds.aws.base}"
    )
    try:
        (p,) = b.predict([image_msg("d", DARK)])
    finally:
        b.close()
    assert classes(p)[0][:2] == (CAT, "cat") and clouds.aws.verified[-1] == akid


def test_a_whole_evaluation_against_a_managed_endpoint(clouds, tmp_path):
    """All five services, a plan naming a ``vertex:`` target whose own mapping declares the
    Fashion-MNIST classes: every query of the clean and corruption stages goes through the
    proxy to the stand-in, authorised with google-auth tokens, and the evaluation succeeds
    with a report."""
    from fortis.adapters.torch_models.datasets import FASHION_MNIST_CLASSES
    from fortis.evaluation.v1 import evaluation_pb2 as epb
    from fortis.evaluation.v1 import evaluation_pb2_grpc
    from fortis.server.app.stack import StackSettings, TargetConfig, start_stack

    from tests.conftest import MD

    mapping = yaml.safe_load((me.MAPPINGS_DIR / "classification.yaml").read_text())
    mapping.pop("labels_file")
    mapping.update(
        labels=list(FASHION_MNIST_CLASSES),
        top_k=2,
        label_map={"cat": "T-shirt/top", "dog": "Trouser"},
    )
    (tmp_path / "fmnist-mapping.yaml").write_text(yaml.safe_dump(mapping))
    url = (
        f"vertex:777?project=fortis-test&region=europe-west4&endpoint_url={clouds.google.base}"
        f"&profile={tmp_path / 'fmnist-mapping.yaml'}&rate=200"
    )
    plan = """
name: vertex-eval
seed: 3
target: {name: vx, task: classification}
dataset: {source: fashion-mnist, split: test, limit: 8}
corruptions: [{id: gaussian_noise, severities: [1]}]
execution: {batch_size: 8}
"""
    path = "/v1/projects/fortis-test/locations/europe-west4/endpoints/777:predict"
    before = clouds.google.counts[path]
    s = start_stack(
        StackSettings(
            state_dir=tmp_path / "state",
            api_keys={API_KEY: "tenant-a"},
            targets=[TargetConfig.parse(f"vx={url}")],
        )
    )
    try:
        ch = grpc.insecure_channel(s.address)
        stub = evaluation_pb2_grpc.EvaluationServiceStub(ch)
        eid = stub.CreateEvaluation(
            epb.CreateEvaluationRequest(plan=plan), metadata=MD
        ).evaluation.evaluation_id
        deadline = time.time() + 120
        while True:
            ev = stub.GetEvaluation(
                epb.GetEvaluationRequest(evaluation_id=eid), metadata=MD
            ).evaluation
            if (
                ev.state
                in (
                    epb.EVALUATION_STATE_SUCCEEDED,
                    epb.EVALUATION_STATE_FAILED,
                    epb.EVALUATION_STATE_CANCELLED,
                )
                or time.time() > deadline
            ):
                break
            time.sleep(0.2)
        ch.close()
    finally:
        s.stop(0)
    assert ev.state == epb.EVALUATION_STATE_SUCCEEDED, ev
    # 8 clean images and 8 corrupted ones, up to 8 a request
    assert clouds.google.counts[path] - before >= 2


# ---------------------------------------------------------------------------------------------
# Whole plans against SageMaker and Azure ML endpoints
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def plan_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The plans' data root: their manifests and images."""
    return tmp_path_factory.mktemp("plan-data")


@pytest.fixture(scope="module")
def plan_stack(
    clouds: Clouds, plan_data: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    """All five services (the module's ``stack`` is the proxy alone) reading manifests under
    ``plan_data``, with the managed targets of ``targets`` the plans name."""
    d = tmp_path_factory.mktemp("plans")
    urls = targets(clouds, d)
    s = start_stack_with_data(
        d / "state", plan_data, {t: f"{urls[t]}&rate=200" for t in ("sm", "sm-det", "aml")}
    )
    yield s
    s.stop(0)


def _flat(v: int) -> np.ndarray:
    return np.full_like(DARK, v)


def _dark_with(rect: tuple[int, int, int, int]) -> np.ndarray:
    img = _flat(40)
    x0, y0, x1, y1 = rect
    img[y0:y1, x0:x1] = 250
    return img


@pytest.mark.parametrize(
    "target,stand_in,path", [("sm", "aws", "sagemaker"), ("aml", "azure", "/score")]
)
def test_a_whole_plan_against_each_managed_classifier(
    plan_stack, plan_data, clouds, tmp_path, target, stand_in, path
):
    """A classification plan through all five services to a ``sagemaker:`` endpoint (SigV4
    recomputed by botocore) and an ``azureml:`` one (Entra ID tokens from azure-identity).
    The stand-in answers cat for a dark image and dog for a bright one (mean below / above
    128); two images carry the other animal as their truth, so 4 of 6 are right. No
    credential (keys, tokens, signatures' secrets) reaches the report or the ledger."""
    # (image, truth label, whether the stand-in's answer matches the truth)
    drawn = {
        "dark": (DARK, CAT, True),
        "bright": (BRIGHT, DOG, True),
        "plain": (PLAIN, CAT, True),
        "dim": (_flat(60), CAT, True),
        "light": (_flat(220), CAT, False),  # bright: the stand-in says dog
        "night": (_flat(20), DOG, False),  # dark: the stand-in says cat
    }
    manifest = classification_manifest(
        plan_data, f"cls-{target}", [(k, img, lab) for k, (img, lab, _) in drawn.items()]
    )
    counter = clouds.aws.counts if stand_in == "aws" else clouds.azure.api.counts
    before = counter[path]
    run = run_plan(
        plan_stack.address, plan(f"{target}-plan", target, "classification", manifest), tmp_path
    )
    check_accuracy(run, [right for _, _, right in drawn.values()])
    check_ledger(run, target, list(drawn))
    assert counter[path] - before >= 2  # the clean and the corrupted images, verified
    check_no_secrets(run, [x for x in clouds.secrets() if len(x) >= 8])


def test_a_whole_detection_plan_against_sagemaker(plan_stack, plan_data, clouds, tmp_path):
    """A detection plan to a ``sagemaker:`` detector: the stand-in's box is the region of
    bright pixels and its label cat (dark image) or dog (bright one); one truth box is
    elsewhere and one names the other animal, so 3 of 5 images are right (IEEE-C4)."""
    drawn = {
        "dark": (DARK, [(CAT, (0, 0, 16, 10))], True),
        "bright": (BRIGHT, [(DOG, (20, 8, 44, 24))], True),
        "corner": (_dark_with((30, 20, 46, 30)), [(CAT, (30, 20, 46, 30))], True),
        "elsewhere": (_dark_with((30, 20, 46, 30)), [(CAT, (0, 0, 12, 12))], False),
        "other-animal": (_dark_with((4, 12, 24, 28)), [(DOG, (4, 12, 24, 28))], False),
    }
    manifest = detection_manifest(
        plan_data, "det-sm", [(k, img, objs) for k, (img, objs, _) in drawn.items()]
    )
    before = clouds.aws.counts["sagemaker"]
    run = run_plan(
        plan_stack.address,
        plan("sm-det-plan", "sm-det", "detection", manifest, DETECTION),
        tmp_path,
    )
    check_accuracy(run, [right for _, _, right in drawn.values()])
    check_ledger(run, "sm-det", list(drawn))
    assert clouds.aws.counts["sagemaker"] - before >= 2
