"""The HTTP/JSON adapter (``fortis.adapters.http_json``) through the real Fortis proxy.

Everything runs against ``FakeCloud`` (see ``_http_json_support``) through the real proxy
(``start_stack`` with ``TargetConfig.parse("NAME=http-json:PROFILE?rate=50")``) and its ledger:
the three vendors' answer shapes, images by URL and multipart, masks, and every failure path
(429 + Retry-After, 500, timeouts, answers that do not fit, refused credentials, secrets).
"""

from __future__ import annotations

import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import yaml
from fortis.adapters import http_json as hj
from fortis.common.v1 import common_pb2
from fortis.core.tensors import tensor_to_array
from fortis.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from fortis.services.common import errors
from fortis.services.common.codec import image_msg
from google.rpc import code_pb2
from structlog.testing import capture_logs

from tests.conftest import API_KEY, MD
from tests.integration._http_json_support import (
    BRIGHT,
    CAT,
    CELL_PHONE,
    DARK,
    DOG,
    ENV_VARS,
    PLAIN,
    PROFILES,
    SECRET,
    SEG_PROFILE,
    FakeCloud,
    H,
    W,
    classes,
    expected_conf,
    ledger,
    predict,
    scene,
    session,
    stats,
    variant,
)

# ---------------------------------------------------------------------------------------------
# Fixtures: the fake cloud, profiles, a real proxy stack
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cloud() -> Iterator[FakeCloud]:
    fc = FakeCloud()
    saved = {k: os.environ.get(k) for k in ENV_VARS}
    os.environ.update({
        "FORTIS_REKOGNITION_URL": fc.base + "/aws", "FORTIS_REKOGNITION_API_KEY": SECRET,
        "FORTIS_GOOGLE_VISION_URL": fc.base + "/google/v1/images:annotate",
        "GOOGLE_VISION_API_KEY": SECRET, "AZURE_VISION_ENDPOINT": fc.base + "/azure",
        "AZURE_VISION_KEY": SECRET})
    yield fc
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    fc.close()


@pytest.fixture(scope="module")
def profiles(cloud: FakeCloud, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("profiles")
    aws = cloud.base + "/aws"
    out = {
        "flaky": variant(d, "aws-rekognition-labels", "aws-flaky", **{"request.url": aws + "/flaky"}),
        "down": variant(d, "aws-rekognition-labels", "aws-down", **{"request.url": aws + "/down"}),
        "malformed": variant(d, "aws-rekognition-labels", "aws-malformed",
                             **{"request.url": aws + "/malformed"}),
        "wrongshape": variant(d, "aws-rekognition-labels", "aws-wrongshape",
                              **{"request.url": aws + "/wrongshape"}),
        "outside": variant(d, "aws-rekognition-objects", "aws-outside",
                           **{"request.url": aws + "/outside"}),
        "slow": variant(d, "aws-rekognition-labels", "aws-slow",
                        **{"request.url": aws + "/slow", "request.timeout_s": 0.3}),
        "badkey": variant(d, "aws-rekognition-labels", "aws-badkey",
                          **{"request.auth.secret": "file:" + str(d / "wrong-key.txt")}),
        "byurl": variant(d, "aws-rekognition-labels", "aws-byurl",
                         **{"request.image": "url", "request.body": {"Image": {"Url": "${image_url}"}}}),
        "upload": variant(d, "aws-rekognition-labels", "aws-upload",
                          **{"request.image": "url",
                             "request.body": {"Image": {"Url": "${image_url}"}},
                             "request.image_url": {"serve": "upload",
                                                   "upload_url": cloud.base + "/bucket/${name}",
                                                   "public_url": cloud.base + "/bucket/${name}"}}),
        "multipart": variant(d, "aws-rekognition-labels", "aws-multipart",
                             **{"request.url": aws + "/multipart", "request.image": "multipart",
                                "request.body": None, "request.headers": {},
                                "request.multipart": {"file_field": "image",
                                                      "fields": {"MaxLabels": "10"}}}),
        "google-batch": variant(d, "google-vision-labels", "gcv-batch",
                                **{"request.images_per_request": 4, "request.max_concurrency": 2}),
    }
    (d / "wrong-key.txt").write_text("not-the-key\n")
    for fmt, resp in (
            ("rle", "items: objects\n  label: label\n  score: score\n  mask: {path: rle, format: coco_rle}"),
            ("png", "items: objects\n  label: label\n  score: score\n  mask: {path: png, format: png_base64}"),
            ("map", "mask: {path: classMap, format: png_base64, kind: class_map}")):
        p = d / f"seg-{fmt}.yaml"
        p.write_text(SEG_PROFILE.format(fmt=fmt, base=cloud.base, response=resp))
        out[f"seg-{fmt}"] = p
    return out


@pytest.fixture(scope="module")
def stack(cloud: FakeCloud, profiles: dict[str, Path], tmp_path_factory: pytest.TempPathFactory):
    from fortis.server.app.stack import StackSettings, TargetConfig, start_stack
    d = tmp_path_factory.mktemp("keyed")
    keyed = {"aws": "aws-rekognition-labels", "aws-objects": "aws-rekognition-objects",
             "gcv": "google-vision-labels", "gcv-objects": "google-vision-objects",
             "azure": "azure-image-analysis-tags", "azure-objects": "azure-image-analysis-objects"}
    specs = [f"{k}=http-json:{variant(d, shipped, k)}?rate=50" for k, shipped in keyed.items()
             ] + [f"{k}=http-json:{p}?rate=50" for k, p in profiles.items()]
    s = start_stack(StackSettings(state_dir=tmp_path_factory.mktemp("state"),
                                  api_keys={API_KEY: "tenant-a"},
                                  targets=[TargetConfig.parse(x) for x in specs], only="proxy"))
    yield s
    s.stop(0)


@pytest.fixture(scope="module")
def px(stack) -> Iterator[proxy_pb2_grpc.TargetProxyServiceStub]:
    ch = grpc.insecure_channel(stack.address)
    yield proxy_pb2_grpc.TargetProxyServiceStub(ch)
    ch.close()


# ---------------------------------------------------------------------------------------------
# Through the real proxy: the three vendors' shapes
# ---------------------------------------------------------------------------------------------

def test_aws_rekognition_labels_through_proxy(px):
    from fortis.services.perturbation.corruptions import apply_corruption
    info = px.GetTargetInfo(proxy_pb2.GetTargetInfoRequest(target="aws"), metadata=MD).info
    assert info.task_type == common_pb2.TASK_TYPE_CLASSIFICATION
    assert info.output_kind == common_pb2.OUTPUT_KIND_TOP_K_SCORES and info.top_k == 10
    assert len(info.labels) == 80 and info.labels[CAT] == "cat"
    sid = session(px, "aws")
    bright_plain = apply_corruption("brightness", PLAIN, 5, np.random.default_rng(0))
    preds = predict(px, sid, {"dark": DARK, "bright": BRIGHT, "plain": PLAIN,
                              "plain-brightness-5": bright_plain, "raw": DARK},
                    raw=frozenset({"raw"}))
    assert [p.image_id for p in preds] == ["dark", "bright", "plain", "plain-brightness-5", "raw"]
    # Confidence 0-100 -> 0-1; names mapped onto the declared label set; unknown kept by name.
    assert classes(preds[0]) == [(CAT, "cat", expected_conf(DARK)), (-1, "Indoors", 0.55),
                                 (CELL_PHONE, "cell phone", 0.51)]
    assert classes(preds[1])[0] == (DOG, "dog", expected_conf(BRIGHT))
    # a corruption changes the stand-in service's answer
    assert classes(preds[2])[0][:2] == (CAT, "cat")
    assert classes(preds[3])[0][:2] == (DOG, "dog")
    assert classes(preds[4]) == classes(preds[0])       # a raw tensor is sent as PNG
    st = stats(px, sid)
    assert st.queries_ok == 5 and st.queries_failed == 0
    rows = ledger(px, sid)
    assert {r.status for r in rows} == {code_pb2.OK} and all(r.attempts == 1 for r in rows)
    assert rows[0].output_summary.startswith(f"top1={CAT} p=")


def test_aws_rekognition_objects_boxes_in_pixels(px):
    info = px.GetTargetInfo(proxy_pb2.GetTargetInfoRequest(target="aws-objects"), metadata=MD).info
    assert info.task_type == common_pb2.TASK_TYPE_DETECTION
    assert info.output_kind == common_pb2.OUTPUT_KIND_BOXES
    sid = session(px, "aws-objects")
    dark, bright, plain = predict(px, sid, {"d": DARK, "b": BRIGHT, "p": PLAIN})
    (b,) = dark.detection.boxes
    assert (b.label, b.name) == (CAT, "cat")
    assert b.score == pytest.approx(expected_conf(DARK) - 0.01, abs=1e-5)
    assert (b.x_min, b.y_min, b.x_max, b.y_max) == pytest.approx((0, 0, 16, 10), abs=1e-3)
    (b,) = bright.detection.boxes
    assert (b.label, b.name) == (DOG, "dog")
    assert (b.x_min, b.y_min, b.x_max, b.y_max) == pytest.approx((20, 8, 44, 24), abs=1e-3)
    assert len(plain.detection.boxes) == 0          # labels without instances give no box
    assert stats(px, sid).queries_ok == 3


def test_google_vision_labels_with_proto3_omitted_zeros(px):
    sid = session(px, "gcv")
    dark, bright = predict(px, sid, {"d": DARK, "b": BRIGHT})
    # "Mobile phone" came with no "score" (proto3 leaves 0 out): score 0, not an error.
    assert classes(dark) == [(CAT, "cat", expected_conf(DARK)), (CELL_PHONE, "cell phone", 0.0)]
    assert dark.classification.classes[1].HasField("score")
    assert classes(bright)[0] == (DOG, "dog", expected_conf(BRIGHT))
    # Google reports a per-image error inside a 200 answer: a failed row naming it.
    tiny = np.full((4, 4, 3), 9, np.uint8)
    with pytest.raises(grpc.RpcError) as ei:
        predict(px, sid, {"tiny": tiny})
    assert "the service reported an error: Bad image data." in ei.value.details()
    assert "'tiny'" in ei.value.details()
    st = stats(px, sid)
    assert st.queries_ok == 2 and st.queries_failed == 1


def test_google_vision_objects_polygons_and_omitted_fields(px):
    sid = session(px, "gcv-objects")
    dark, bright, plain = predict(px, sid, {"d": DARK, "b": BRIGHT, "p": PLAIN})
    (b,) = dark.detection.boxes
    # The top-left vertex was sent as {} (x = 0 and y = 0 left out): the box starts at 0, 0.
    assert (b.x_min, b.y_min, b.x_max, b.y_max) == pytest.approx((0, 0, 16, 10), abs=1e-3)
    assert (b.label, b.name) == (CAT, "cat") and b.score == pytest.approx(expected_conf(DARK))
    (b,) = bright.detection.boxes
    assert (b.x_min, b.y_min, b.x_max, b.y_max) == pytest.approx((20, 8, 44, 24), abs=1e-3)
    # no objects: localizedObjectAnnotations is absent altogether -> an empty answer, OK
    assert len(plain.detection.boxes) == 0
    assert stats(px, sid).queries_ok == 3


def test_google_vision_batches_several_images_per_request(px, cloud):
    sid = session(px, "google-batch")
    before = cloud.requests["/google/v1/images:annotate"]
    imgs = {f"i{k}": (DARK if k % 2 else BRIGHT) for k in range(6)}
    preds = predict(px, sid, imgs)
    assert cloud.requests["/google/v1/images:annotate"] - before == 2     # 4 + 2 images
    assert [p.image_id for p in preds] == list(imgs)
    assert [classes(p)[0][1] for p in preds] == ["dog", "cat"] * 3
    assert stats(px, sid).queries_ok == 6


def test_azure_image_analysis_tags_and_objects(px):
    sid = session(px, "azure")
    dark, bright = predict(px, sid, {"d": DARK, "b": BRIGHT})
    assert classes(dark) == [(CAT, "cat", expected_conf(DARK)), (-1, "indoor", 0.7)]
    assert classes(bright)[0] == (DOG, "dog", expected_conf(BRIGHT))
    sid = session(px, "azure-objects")
    dark, bright = predict(px, sid, {"d": DARK, "b": BRIGHT})
    (b,) = bright.detection.boxes
    assert (b.label, b.name) == (DOG, "dog")
    assert (b.x_min, b.y_min, b.x_max, b.y_max) == pytest.approx((20, 8, 44, 24))
    (b,) = dark.detection.boxes
    assert (b.x_min, b.y_min, b.x_max, b.y_max) == pytest.approx((0, 0, 16, 10))


def test_image_by_url_from_the_local_file_server(px, cloud):
    sid = session(px, "byurl")
    (p,) = predict(px, sid, {"d": DARK})
    assert classes(p)[0] == (CAT, "cat", expected_conf(DARK))
    url = cloud.fetched_urls[-1]
    assert url.startswith("http://127.0.0.1:") and "/images/" in url
    with pytest.raises(urllib.error.HTTPError) as ei:     # served only while the request ran
        urllib.request.urlopen(url, timeout=5)
    assert ei.value.code == 404


def test_image_by_url_after_upload(px, cloud):
    sid = session(px, "upload")
    (p,) = predict(px, sid, {"b": BRIGHT})
    assert classes(p)[0][:2] == (DOG, "dog")
    assert cloud.fetched_urls[-1].startswith(cloud.base + "/bucket/")
    assert len(cloud.uploads) >= 1


def test_multipart_form_data(px):
    sid = session(px, "multipart")
    dark, bright = predict(px, sid, {"d": DARK, "b": BRIGHT})
    assert classes(dark)[0][:2] == (CAT, "cat") and classes(bright)[0][:2] == (DOG, "dog")


@pytest.mark.parametrize("fmt", ["rle", "png", "map"])
def test_segmentation_masks(px, fmt):
    sid = session(px, f"seg-{fmt}")
    info = px.GetTargetInfo(proxy_pb2.GetTargetInfoRequest(target=f"seg-{fmt}"), metadata=MD).info
    assert info.task_type == common_pb2.TASK_TYPE_SEGMENTATION
    assert info.output_kind == common_pb2.OUTPUT_KIND_MASKS
    dark, bright, plain = predict(px, sid, {"d": DARK, "b": BRIGHT, "p": PLAIN})
    for pred, img, label in ((dark, DARK, 1), (bright, BRIGHT, 2), (plain, PLAIN, 0)):
        cmap = tensor_to_array(pred.segmentation.class_map, "class_map")
        assert cmap.dtype == np.int32 and cmap.shape == (H, W)
        expected = np.where(scene(img)["mask"], label, 0)
        np.testing.assert_array_equal(cmap, expected)


# ---------------------------------------------------------------------------------------------
# Through the real proxy: failures
# ---------------------------------------------------------------------------------------------

def test_429_with_retry_after_then_success(px, cloud):
    sid = session(px, "flaky")
    cloud.flaky_left = 1
    t0 = time.monotonic()
    (p,) = predict(px, sid, {"d": DARK})
    assert time.monotonic() - t0 >= 0.9                   # Retry-After: 1 was honoured
    assert classes(p)[0][:2] == (CAT, "cat")
    # write-ahead ledger: every attempt the target received is its own row
    assert [(r.status, r.attempts) for r in ledger(px, sid)] == [
        (code_pb2.UNAVAILABLE, 1), (code_pb2.OK, 2)]
    st = stats(px, sid)
    assert st.queries_ok == 1 and st.queries_failed == 1


def test_500_always_fails_rows_and_proxy_keeps_serving(px):
    sid = session(px, "down")
    with pytest.raises(grpc.RpcError) as ei:
        predict(px, sid, {"a": DARK, "b": BRIGHT})
    assert ei.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "HTTP 500" in ei.value.details()
    rows = ledger(px, sid)
    assert len(rows) == 8                                 # 2 images x 4 attempts, each a row
    assert {r.status for r in rows} == {code_pb2.UNAVAILABLE}
    assert sorted(r.attempts for r in rows) == [1, 1, 2, 2, 3, 3, 4, 4]
    st = stats(px, sid)
    assert st.queries_failed == 8 and st.queries_ok == 0 and st.session.queries_used == 0
    assert (st.queries_attempted, st.queries_in_flight) == (8, 0)      # what the budget counts
    assert sorted(i.attempts for i in st.images) == [4, 4]
    # the proxy keeps serving, the same target name too
    assert classes(predict(px, session(px, "aws"), {"d": DARK})[0])[0][:2] == (CAT, "cat")
    with pytest.raises(grpc.RpcError):
        predict(px, sid, {"c": PLAIN})
    assert stats(px, sid).queries_failed == 12


def test_timeout_is_unavailable(px):
    sid = session(px, "slow")
    with pytest.raises(grpc.RpcError) as ei:
        predict(px, sid, {"a": DARK})
    assert ei.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "no answer within 0.3 s" in ei.value.details()
    rows = ledger(px, sid)
    assert [r.attempts for r in rows] == [1, 2, 3, 4]
    assert {r.status for r in rows} == {code_pb2.UNAVAILABLE}


@pytest.mark.parametrize("target,needle", [
    ("malformed", "not valid JSON"),
    ("wrongshape", "items path 'Labels' not found in the answer; the answer has keys ['Labelz']"),
    ("outside", "lies outside the 48x32 image"),
])
def test_answers_that_do_not_fit_the_profile_are_failed_rows(px, target, needle):
    sid = session(px, target)
    with pytest.raises(grpc.RpcError) as ei:
        predict(px, sid, {"x": DARK})
    assert needle in ei.value.details()
    assert "'x'" in ei.value.details()                    # names the image
    (row,) = ledger(px, sid)
    # a TargetResponseError: the target's permanent failure (one error mapping):
    # FAILED_PRECONDITION naming the target, to the caller and in the ledger, not retried
    assert ei.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert f"target '{target}'" in ei.value.details()
    assert row.status == code_pb2.FAILED_PRECONDITION and needle in row.error
    assert row.attempts == 1
    assert stats(px, sid).queries_failed == 1
    # ... and the proxy serves the next call
    assert predict(px, session(px, "aws"), {"d": DARK})[0].classification.classes


def test_rejected_credentials_are_a_failed_row(px):
    sid = session(px, "badkey")
    with pytest.raises(grpc.RpcError) as ei:
        predict(px, sid, {"x": DARK})
    assert "HTTP 403" in ei.value.details() and "security token" in ei.value.details()
    (row,) = ledger(px, sid)
    # an HttpTargetError: the target's permanent failure, FAILED_PRECONDITION to the caller
    # and in the ledger, not retried (one error mapping)
    assert ei.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert row.status == code_pb2.FAILED_PRECONDITION and row.attempts == 1


def test_secret_sent_but_never_logged_or_recorded(cloud, tmp_path, capfd, caplog):
    from fortis.server.app.stack import StackSettings, TargetConfig, start_stack
    aws = variant(tmp_path, "aws-rekognition-labels", "aws")
    echo = variant(tmp_path, "aws-rekognition-labels", "aws-echo",
                   **{"request.url": cloud.base + "/aws/echo-auth"})
    seen_before = len(cloud.auth_seen)
    with capture_logs() as logs:
        s = start_stack(StackSettings(
            state_dir=tmp_path / "state", api_keys={API_KEY: "tenant-a"}, only="proxy",
            targets=[TargetConfig.parse(f"aws=http-json:{aws}?rate=50"),
                     TargetConfig.parse(f"echo=http-json:{echo}?rate=50")]))
        try:
            ch = grpc.insecure_channel(s.address)
            stub = proxy_pb2_grpc.TargetProxyServiceStub(ch)
            ok = predict(stub, session(stub, "aws"), {"d": DARK})
            assert classes(ok[0])[0][:2] == (CAT, "cat")
            sid = session(stub, "echo")
            with pytest.raises(grpc.RpcError) as ei:   # the service echoes our headers back
                predict(stub, sid, {"d": DARK})
            rows = ledger(stub, sid)
            ch.close()
        finally:
            s.stop(0)
    assert cloud.auth_seen[seen_before:] == [SECRET] * len(cloud.auth_seen[seen_before:])
    assert len(cloud.auth_seen) > seen_before                       # the header was sent
    assert ei.value.code() == grpc.StatusCode.UNAVAILABLE
    assert SECRET not in ei.value.details() and "[secret]" in ei.value.details()
    assert rows and all(SECRET not in r.error for r in rows)
    events = repr(logs)
    assert "http-json target ready" in events and "env:FORTIS_REKOGNITION_API_KEY" in events
    assert "http-json target unavailable" in events
    assert SECRET not in events
    out, err = capfd.readouterr()
    assert SECRET not in out and SECRET not in err and SECRET not in caplog.text
    for f in (tmp_path / "state").iterdir():                         # ledger + WAL, raw bytes
        if f.is_file():
            assert SECRET.encode() not in f.read_bytes(), f.name


# ---------------------------------------------------------------------------------------------
# Backends built directly from URLs and profiles
# ---------------------------------------------------------------------------------------------

def test_urls_and_shipped_profiles(cloud, tmp_path):
    # The shipped profiles sign with the vendors' libraries: built and run against stand-ins
    # verifying those signatures in test_cloud_credentials.py.
    assert hj.profile_path("google-vision-labels") == PROFILES / "google-vision-labels.yaml"
    names = sorted(p.stem for p in PROFILES.glob("*.yaml") if not p.stem.startswith("labels-"))
    assert names == ["aws-rekognition-labels", "aws-rekognition-objects", "azure-image-analysis-objects",
                     "azure-image-analysis-tags", "google-vision-labels", "google-vision-objects"]
    kinds = {n: yaml.safe_load((PROFILES / f"{n}.yaml").read_text())["request"]["auth"]["kind"]
             for n in names}
    assert kinds == {"aws-rekognition-labels": "aws_sigv4", "aws-rekognition-objects": "aws_sigv4",
                     "azure-image-analysis-objects": "azure_ad", "azure-image-analysis-tags": "azure_ad",
                     "google-vision-labels": "google_oauth", "google-vision-objects": "google_oauth"}
    from fortis.adapters.registry import backend_for
    b = backend_for(f"http-json:{variant(tmp_path, 'aws-rekognition-labels', 'aws')}?rate=50")
    assert isinstance(b, hj.HttpJsonBackend)
    b.close()
    with pytest.raises(errors.InvalidArgument, match="cannot read"):
        hj.backend_from_url("http-json:/no/such/profile.yaml")


def test_backend_split_into_concurrent_requests_reports_retry_after(cloud, profiles):
    """Three images, one request each; one answer is a 429: the whole call is Unavailable with
    the service's Retry-After, for the proxy to retry."""
    b = hj.backend_from_url(f"http-json:{profiles['flaky']}")
    try:
        cloud.flaky_left = 1
        imgs = [image_msg(f"i{k}", img) for k, img in enumerate((DARK, BRIGHT, PLAIN))]
        with pytest.raises(errors.Unavailable) as ei:
            b.predict(imgs)
        assert ei.value.retry_after_s == 1.0 and "HTTP 429" in str(ei.value)
        preds = b.predict(imgs)
        assert [classes(p)[0][1] for p in preds] == ["cat", "dog", "cat"]
        with pytest.raises(errors.InvalidArgument) as bad:
            b.predict([imgs[0], common_pb2.Image(image_id="x", encoded=b"\x89PNG junk")])
        assert bad.value.violations[0].field == "images[1].encoded"
    finally:
        b.close()


