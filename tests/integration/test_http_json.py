"""The HTTP/JSON adapter (``fortis.adapters.http_json``) for cloud vision APIs.

Cloud APIs (AWS Rekognition, Google Cloud Vision, Azure Image Analysis) cannot be reached from
here, so ``FakeCloud`` stands in for them: a stdlib HTTP server on 127.0.0.1 that answers in
each vendor's documented response shape (Google's proto3 JSON with its zeros left out
included), computing its answers from the image it receives -- the label depends on the mean
brightness, the box is the region of bright pixels -- so a corruption can change the answer.
It checks the auth header the profile sends. Everything runs through the real Fortis proxy
(``start_stack`` with ``TargetConfig.parse("NAME=http-json:PROFILE?rate=50")``) and its
ledger; the transforms are also unit-tested on their own.
"""

from __future__ import annotations

import ast
import base64
import email.utils
import json
import os
import secrets
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from email.parser import BytesParser
from email.policy import HTTP
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import cv2
import grpc
import numpy as np
import pytest
import yaml
from fortis.adapters import http_json as hj
from fortis.common.v1 import common_pb2
from fortis.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from fortis.services.common import errors
from fortis.services.common.codec import image_msg, tensor_to_array
from structlog.testing import capture_logs

from tests.conftest import API_KEY, MD

SECRET = "sk-fortis-test-" + secrets.token_hex(12)
PROFILES = hj.PROFILES_DIR
CAT, DOG, CELL_PHONE = 15, 16, 67          # indices in labels-coco-80.yaml
H, W = 32, 48


# ---------------------------------------------------------------------------------------------
# Test images and the fake service's "model"
# ---------------------------------------------------------------------------------------------

def _img(bg: int, rect: tuple[int, int, int, int] | None = None, value: int = 250) -> np.ndarray:
    a = np.full((H, W, 3), bg, dtype=np.uint8)
    if rect is not None:
        x0, y0, x1, y1 = rect
        a[y0:y1, x0:x1] = value
    return a


DARK = _img(40, (0, 0, 16, 10))          # mean ~62 -> Cat; bright object at the top-left corner
BRIGHT = _img(180, (20, 8, 44, 24), 255)  # mean ~199 -> Dog; object at x 20..44, y 8..24
PLAIN = _img(100)                         # mean 100 -> Cat; no object


def scene(img: np.ndarray) -> dict[str, Any]:
    """What the fake service 'sees': Cat when dark, Dog when bright, and the box of the bright
    (> 200) pixels."""
    grey = img.astype(np.float64).mean(axis=2) if img.ndim == 3 else img.astype(np.float64)
    mean = float(grey.mean())
    ys, xs = np.nonzero(grey > 200)
    box = None if len(xs) == 0 else (int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1)
    h, w = grey.shape
    return {"label": "Cat" if mean < 128 else "Dog", "conf": round(0.6 + 0.39 * abs(mean - 128) / 128, 4),
            "box": box, "w": w, "h": h, "mask": grey > 200}


def expected_conf(img: np.ndarray) -> float:
    return scene(img)["conf"]


def decode(data: bytes) -> np.ndarray:
    arr = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    assert arr is not None, "the adapter sent an undecodable image"
    return arr


def proto3(obj: Any) -> Any:
    """JSON as proto3's JSON mapping writes it: fields with default values are left out."""
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            v = proto3(v)
            if v is None or v is False or (not isinstance(v, bool) and v in (0, "", [], {})):
                continue
            out[k] = v
        return out
    if isinstance(obj, list):
        return [proto3(v) for v in obj]
    return obj


def rle_counts(mask: np.ndarray) -> list[int]:
    """COCO run lengths (column-major, starting with a run of zeros)."""
    flat = np.asarray(mask, dtype=bool).T.reshape(-1)
    counts, cur, run = [], False, 0
    for v in flat:
        if v == cur:
            run += 1
        else:
            counts.append(run)
            cur, run = v, 1
    counts.append(run)
    return counts


def rle_string(counts: list[int]) -> str:
    """COCO's compressed RLE string (as pycocotools writes it)."""
    out = []
    for i, c in enumerate(counts):
        x = c - counts[i - 2] if i > 2 else c
        more = True
        while more:
            ch = x & 0x1F
            x >>= 5
            more = (x != -1) if (ch & 0x10) else (x != 0)
            if more:
                ch |= 0x20
            out.append(chr(ch + 48))
    return "".join(out)


def png_b64(arr: np.ndarray) -> str:
    ok, buf = cv2.imencode(".png", arr)
    assert ok
    return base64.b64encode(buf.tobytes()).decode()


# ---------------------------------------------------------------------------------------------
# The stand-in cloud service
# ---------------------------------------------------------------------------------------------

def aws_answer(img: np.ndarray) -> dict[str, Any]:
    s = scene(img)
    inst = []
    if s["box"]:
        x0, y0, x1, y1 = s["box"]
        inst = [{"BoundingBox": {"Width": (x1 - x0) / s["w"], "Height": (y1 - y0) / s["h"],
                                 "Left": x0 / s["w"], "Top": y0 / s["h"]},
                 "Confidence": s["conf"] * 100 - 1.0}]
    return {"Labels": [
        {"Name": s["label"], "Confidence": s["conf"] * 100, "Instances": inst,
         "Parents": [{"Name": "Animal"}]},
        {"Name": "Indoors", "Confidence": 55.0, "Instances": [], "Parents": []},
        {"Name": "Mobile Phone", "Confidence": 51.0, "Instances": [], "Parents": []},
    ], "LabelModelVersion": "3.0"}


def google_answer(req: dict[str, Any]) -> dict[str, Any]:
    responses = []
    for r in req["requests"]:
        data = base64.b64decode(r["image"]["content"])
        img = decode(data)
        if img.shape[0] < 8:
            responses.append({"error": {"code": 3, "message": "Bad image data."}})
            continue
        s = scene(img)
        feats = {f["type"] for f in r["features"]}
        resp: dict[str, Any] = {}
        if "LABEL_DETECTION" in feats:
            resp["labelAnnotations"] = [
                {"mid": "/m/01yrx", "description": s["label"], "score": s["conf"],
                 "topicality": s["conf"]},
                {"mid": "/m/050k8", "description": "Mobile phone", "score": 0.0, "topicality": 0.0}]
        if "OBJECT_LOCALIZATION" in feats and s["box"]:
            x0, y0, x1, y1 = s["box"]
            w, h = s["w"], s["h"]
            resp["localizedObjectAnnotations"] = [{
                "mid": "/m/01yrx", "name": s["label"], "score": s["conf"],
                "boundingPoly": {"normalizedVertices": [
                    {"x": x0 / w, "y": y0 / h}, {"x": x1 / w, "y": y0 / h},
                    {"x": x1 / w, "y": y1 / h}, {"x": x0 / w, "y": y1 / h}]}}]
        responses.append(resp)
    return proto3({"responses": responses})


def azure_answer(img: np.ndarray, features: str) -> dict[str, Any]:
    s = scene(img)
    out: dict[str, Any] = {"modelVersion": "2023-10-01", "metadata": {"width": s["w"], "height": s["h"]}}
    if "tags" in features:
        out["tagsResult"] = {"values": [{"name": s["label"].lower(), "confidence": s["conf"]},
                                        {"name": "indoor", "confidence": 0.7}]}
    if "objects" in features:
        vals = []
        if s["box"]:
            x0, y0, x1, y1 = s["box"]
            vals = [{"boundingBox": {"x": x0, "y": y0, "w": x1 - x0, "h": y1 - y0},
                     "tags": [{"name": s["label"].lower(), "confidence": s["conf"]}]}]
        out["objectsResult"] = {"values": vals}
    return out


def seg_answer(img: np.ndarray) -> dict[str, Any]:
    s = scene(img)
    m = s["mask"]
    objs = []
    if m.any():
        objs.append({"label": s["label"].lower(), "score": s["conf"],
                     "rle": {"size": [int(m.shape[0]), int(m.shape[1])], "counts": rle_string(rle_counts(m))},
                     "png": png_b64(m.astype(np.uint8) * 255)})
    cmap = np.where(m, 1 if s["label"] == "Cat" else 2, 0).astype(np.uint8)
    return {"objects": objs, "classMap": png_b64(cmap)}


class FakeCloud:
    """Stand-in for cloud vision APIs (see the module docstring)."""

    def __init__(self) -> None:
        self.requests: Counter[str] = Counter()
        self.auth_seen: list[str] = []
        self.fetched_urls: list[str] = []
        self.uploads: dict[str, bytes] = {}
        self.flaky_left = 0
        self.lock = threading.Lock()
        cloud = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

            def _send(self, status: int, body: bytes | str | dict[str, Any],
                      headers: dict[str, str] | None = None) -> None:
                data = body if isinstance(body, bytes) else (
                    body.encode() if isinstance(body, str) else json.dumps(body).encode())
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def do_PUT(self) -> None:  # noqa: N802
                n = int(self.headers.get("Content-Length", 0))
                cloud.uploads[self.path.rsplit("/", 1)[-1]] = self.rfile.read(n)
                self._send(201, b"")

            def do_GET(self) -> None:  # noqa: N802
                data = cloud.uploads.get(self.path.rsplit("/", 1)[-1])
                if data is None:
                    self._send(404, {"error": "no such object"})
                else:
                    self._send(200, data)

            def do_POST(self) -> None:  # noqa: N802
                n = int(self.headers.get("Content-Length", 0))
                body = self.rfile.read(n)
                parts = urlsplit(self.path)
                path = parts.path
                with cloud.lock:
                    cloud.requests[path] += 1
                if path.startswith("/aws"):
                    self._aws(path, body)
                elif path.startswith("/google"):
                    if self.headers.get("x-goog-api-key") != SECRET:
                        self._send(403, {"error": {"code": 403, "message": "API key not valid"}})
                        return
                    cloud.auth_seen.append(self.headers["x-goog-api-key"])
                    self._send(200, google_answer(json.loads(body)))
                elif path.startswith("/azure"):
                    if self.headers.get("Ocp-Apim-Subscription-Key") != SECRET:
                        self._send(401, {"error": {"code": "401", "message": "Access denied"}})
                        return
                    assert self.headers.get("Content-Type") == "application/octet-stream"
                    features = parse_qs(parts.query).get("features", [""])[0]
                    self._send(200, azure_answer(decode(body), features))
                elif path.startswith("/seg"):
                    img = decode(base64.b64decode(json.loads(body)["image"]))
                    self._send(200, seg_answer(img))
                else:
                    self._send(404, {"message": "unknown path"})

            def _aws(self, path: str, body: bytes) -> None:
                key = self.headers.get("x-api-key")
                if key != SECRET:
                    self._send(403, {"__type": "UnrecognizedClientException",
                                     "message": "The security token included in the request is invalid."})
                    return
                cloud.auth_seen.append(key)
                mode = path.split("/")[2] if path.count("/") >= 2 else ""
                if mode == "flaky":
                    with cloud.lock:
                        fail = cloud.flaky_left > 0
                        cloud.flaky_left -= 1
                    if fail:
                        self._send(429, {"__type": "ThrottlingException", "message": "Rate exceeded"},
                                   {"Retry-After": "1"})
                        return
                if mode == "down":
                    self._send(500, {"__type": "InternalServerError", "message": "boom"})
                    return
                if mode == "echo-auth":       # a service that echoes the request headers back
                    self._send(503, {"echo": self.headers.get("x-api-key"), "message": "overloaded",
                                     "headers": dict(self.headers.items())})
                    return
                if mode == "malformed":
                    self._send(200, '{"Labels": [{"Name": "Cat", "Confi')
                    return
                if mode == "wrongshape":
                    self._send(200, {"Labelz": [{"Name": "Cat", "Confidence": 99.0}]})
                    return
                if mode == "slow":
                    time.sleep(1.0)
                if mode == "multipart":
                    msg = BytesParser(policy=HTTP).parsebytes(
                        f"Content-Type: {self.headers['Content-Type']}\r\n\r\n".encode() + body)
                    files = [p for p in msg.iter_parts()
                             if p.get_param("name", header="content-disposition") == "image"]
                    fields = {p.get_param("name", header="content-disposition"): p.get_content()
                              for p in msg.iter_parts() if p.get_filename() is None}
                    assert fields.get("MaxLabels") == "10", fields
                    payload = files[0].get_payload(decode=True)
                    assert isinstance(payload, bytes)
                    img = decode(payload)
                    self._send(200, aws_answer(img))
                    return
                req = json.loads(body)
                if "Url" in req["Image"]:
                    cloud.fetched_urls.append(req["Image"]["Url"])
                    with urllib.request.urlopen(req["Image"]["Url"], timeout=5) as r:
                        data = r.read()
                else:
                    data = base64.b64decode(req["Image"]["Bytes"])
                answer = aws_answer(decode(data))
                if mode == "outside":
                    for lab in answer["Labels"]:
                        for inst in lab["Instances"]:
                            inst["BoundingBox"]["Left"] = 0.8
                            inst["BoundingBox"]["Width"] = 0.5
                self._send(200, answer)

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass        # a client that gave up (timeout test) is not an error here

        self.server = Server(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# ---------------------------------------------------------------------------------------------
# Fixtures: the fake cloud, profiles, a real proxy stack
# ---------------------------------------------------------------------------------------------

ENV_VARS = ("FORTIS_REKOGNITION_URL", "FORTIS_REKOGNITION_API_KEY", "FORTIS_GOOGLE_VISION_URL",
            "GOOGLE_VISION_API_KEY", "AZURE_VISION_ENDPOINT", "AZURE_VISION_KEY")


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


def variant(directory: Path, shipped: str, name: str, **changes: Any) -> Path:
    """A copy of a shipped profile with some settings changed (dotted keys; None deletes)."""
    data = yaml.safe_load((PROFILES / f"{shipped}.yaml").read_text())
    data["name"] = name
    data["labels_file"] = str(PROFILES / "labels-coco-80.yaml")
    for dotted, value in changes.items():
        node = data
        *path, last = dotted.split(".")
        for k in path:
            node = node.setdefault(k, {})
        if value is None:
            node.pop(last, None)
        else:
            node[last] = value
    out = directory / f"{name}.yaml"
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


SEG_PROFILE = """
name: fake-seg-{fmt}
task: segmentation
labels: [background, cat, dog]
request:
  url: {base}/seg
  image: base64
  body: {{image: "${{image_base64}}"}}
response:
  {response}
"""


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
    from fortis.services.app import StackSettings, TargetConfig, start_stack
    specs = [
        f"aws=http-json:{PROFILES / 'aws-rekognition-labels.yaml'}?rate=50",
        f"aws-objects=http-json:{PROFILES / 'aws-rekognition-objects.yaml'}?rate=50",
        "gcv=http-json:google-vision-labels?rate=50",          # a shipped profile by name
        "gcv-objects=http-json:google-vision-objects?rate=50",
        "azure=http-json:azure-image-analysis-tags?rate=50",
        "azure-objects=http-json:azure-image-analysis-objects?rate=50",
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


def session(px: proxy_pb2_grpc.TargetProxyServiceStub, target: str) -> str:
    return px.CreateSession(proxy_pb2.CreateSessionRequest(target=target), metadata=MD).session.session_id


def predict(px: proxy_pb2_grpc.TargetProxyServiceStub, sid: str, images: dict[str, np.ndarray],
            raw: frozenset[str] = frozenset()) -> list[common_pb2.Prediction]:
    req = proxy_pb2.PredictRequest(session_id=sid, origin="test", images=[
        image_msg(k, v, raw=k in raw) for k, v in images.items()])
    return list(px.Predict(req, metadata=MD).predictions)


def ledger(px: proxy_pb2_grpc.TargetProxyServiceStub, sid: str) -> list[proxy_pb2.LedgerEntry]:
    return list(px.ListLedgerEntries(proxy_pb2.ListLedgerEntriesRequest(session_id=sid),
                                     metadata=MD).entries)


def stats(px: proxy_pb2_grpc.TargetProxyServiceStub, sid: str) -> proxy_pb2.GetSessionStatsResponse:
    return px.GetSessionStats(proxy_pb2.GetSessionStatsRequest(session_id=sid), metadata=MD)


def classes(p: common_pb2.Prediction) -> list[tuple[int, str, float]]:
    return [(c.label, c.name, round(c.score, 4)) for c in p.classification.classes]


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
    assert {r.status for r in rows} == {"OK"} and all(r.attempts == 1 for r in rows)
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
    (row,) = ledger(px, sid)
    assert row.status == "OK" and row.attempts == 2
    assert stats(px, sid).queries_ok == 1


def test_500_always_fails_rows_and_proxy_keeps_serving(px):
    sid = session(px, "down")
    with pytest.raises(grpc.RpcError) as ei:
        predict(px, sid, {"a": DARK, "b": BRIGHT})
    assert ei.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "HTTP 500" in ei.value.details()
    rows = ledger(px, sid)
    assert len(rows) == 2
    assert {r.status for r in rows} == {"UNAVAILABLE"} and {r.attempts for r in rows} == {4}
    st = stats(px, sid)
    assert st.queries_failed == 2 and st.queries_ok == 0 and st.session.queries_used == 0
    # the proxy keeps serving, the same target name too
    assert classes(predict(px, session(px, "aws"), {"d": DARK})[0])[0][:2] == (CAT, "cat")
    with pytest.raises(grpc.RpcError):
        predict(px, sid, {"c": PLAIN})
    assert stats(px, sid).queries_failed == 3


def test_timeout_is_unavailable(px):
    sid = session(px, "slow")
    with pytest.raises(grpc.RpcError) as ei:
        predict(px, sid, {"a": DARK})
    assert ei.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "no answer within 0.3 s" in ei.value.details()
    (row,) = ledger(px, sid)
    assert row.status == "UNAVAILABLE" and row.attempts == 4


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
    assert row.status == "TargetResponseError" and needle in row.error and row.attempts == 1
    assert stats(px, sid).queries_failed == 1
    # ... and the proxy serves the next call
    assert predict(px, session(px, "aws"), {"d": DARK})[0].classification.classes


def test_rejected_credentials_are_a_failed_row(px):
    sid = session(px, "badkey")
    with pytest.raises(grpc.RpcError) as ei:
        predict(px, sid, {"x": DARK})
    assert "HTTP 403" in ei.value.details() and "security token" in ei.value.details()
    (row,) = ledger(px, sid)
    assert row.status == "HttpTargetError" and row.attempts == 1


def test_secret_sent_but_never_logged_or_recorded(cloud, tmp_path, capfd, caplog):
    from fortis.services.app import StackSettings, TargetConfig, start_stack
    echo = variant(tmp_path, "aws-rekognition-labels", "aws-echo",
                   **{"request.url": cloud.base + "/aws/echo-auth"})
    seen_before = len(cloud.auth_seen)
    with capture_logs() as logs:
        s = start_stack(StackSettings(
            state_dir=tmp_path / "state", api_keys={API_KEY: "tenant-a"}, only="proxy",
            targets=[TargetConfig.parse(f"aws=http-json:{PROFILES / 'aws-rekognition-labels.yaml'}?rate=50"),
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
# Unit: transforms
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt,values,expected", [
    ("normalized_ltwh", (0.25, 0.5, 0.5, 0.25), (25, 100, 75, 150)),
    ("normalized_xyxy", (0.25, 0.5, 0.75, 0.75), (25, 100, 75, 150)),
    ("pixel_xywh", (25, 100, 50, 50), (25, 100, 75, 150)),
    ("pixel_xyxy", (25, 100, 75, 150), (25, 100, 75, 150)),
])
def test_box_formats(fmt, values, expected):
    assert hj.box_to_pixels(fmt, values, 100, 200) == pytest.approx(expected)


def test_box_format_errors():
    with pytest.raises(ValueError, match="negative"):
        hj.box_to_pixels("pixel_xywh", (0, 0, -1, 5), 10, 10)
    with pytest.raises(ValueError, match="4 numbers"):
        hj.box_to_pixels("pixel_xyxy", (0, 0, 1), 10, 10)
    with pytest.raises(ValueError, match="unknown box format"):
        hj.box_to_pixels("yolo", (0, 0, 1, 1), 10, 10)


def test_polygon_to_bounding_box():
    quad = [(0.1, 0.2), (0.6, 0.25), (0.55, 0.9), (0.05, 0.8)]
    assert hj.polygon_to_box(quad, normalized=True, width=100, height=50) == pytest.approx((5, 10, 60, 45))
    assert hj.polygon_to_box([(3, 4), (9, 1), (5, 7)], normalized=False, width=1, height=1) == (3, 1, 9, 7)
    with pytest.raises(ValueError):
        hj.polygon_to_box([], normalized=True, width=1, height=1)


def test_check_box_outside_inverted_and_tolerance():
    assert hj.check_box((-0.5, 0, 10.4, 5), 10, 5) == (0, 0, 10, 5)      # rounding: clipped
    with pytest.raises(ValueError, match="outside the 10x5 image"):
        hj.check_box((8, 0, 15, 5), 10, 5)
    with pytest.raises(ValueError, match="inverted"):
        hj.check_box((5, 0, 4, 5), 10, 5)
    with pytest.raises(ValueError, match="non-finite"):
        hj.check_box((0, 0, float("nan"), 5), 10, 5)


def test_coco_rle_matches_pycocotools():
    # Vectors from pycocotools.mask.encode (2.0.x) of these masks.
    m = np.zeros((6, 5), bool)
    m[1:4, 1:3] = True
    m[5, 4] = True
    assert hj.coco_rle_counts("7330:N") == [7, 3, 3, 3, 13, 1]
    np.testing.assert_array_equal(hj.decode_coco_rle({"size": [6, 5], "counts": "7330:N"}), m)
    np.testing.assert_array_equal(hj.decode_coco_rle({"size": [6, 5], "counts": [7, 3, 3, 3, 13, 1]}), m)
    m2 = np.zeros((40, 50), bool)
    m2[5:30, 10:45] = True
    m2[32:38, 0:3] = True
    s2 = "P16R1000m7c0`G" + "0" * 67 + "S6"
    np.testing.assert_array_equal(hj.decode_coco_rle({"size": [40, 50], "counts": s2}), m2)
    assert rle_string(rle_counts(m2)) == s2 and rle_string(rle_counts(m)) == "7330:N"


def test_coco_rle_errors():
    with pytest.raises(ValueError, match="cover 29 pixels"):
        hj.decode_coco_rle({"size": [6, 5], "counts": [7, 3, 3, 3, 13]})
    with pytest.raises(ValueError, match="alphabet"):
        hj.decode_coco_rle({"size": [6, 5], "counts": "7 30"})
    with pytest.raises(ValueError, match="ends in the middle"):
        hj.coco_rle_counts("7o")
    with pytest.raises(ValueError, match="size"):
        hj.decode_coco_rle({"counts": [30]})


def test_png_base64_masks():
    m = np.zeros((7, 9), np.uint8)
    m[2:5, 3:8] = 255
    np.testing.assert_array_equal(hj.decode_png_mask(png_b64(m)), m)
    np.testing.assert_array_equal(hj.decode_png_mask("data:image/png;base64," + png_b64(m)), m)
    np.testing.assert_array_equal(hj.decode_png_mask(png_b64(np.dstack([m, m, m]))), m)
    sixteen = (np.arange(63, dtype=np.uint16).reshape(7, 9) * 1000)
    np.testing.assert_array_equal(hj.decode_png_mask(png_b64(sixteen)), sixteen)
    with pytest.raises(ValueError, match="base64"):
        hj.decode_png_mask("not base64!")
    with pytest.raises(ValueError, match="PNG"):
        hj.decode_png_mask(base64.b64encode(b"garbage").decode())
    colour = np.dstack([m, m // 2, m])
    with pytest.raises(ValueError, match="grey"):
        hj.decode_png_mask(png_b64(colour))


def test_class_map_composition_higher_score_wins():
    a = np.zeros((3, 3), bool)
    a[:2, :2] = True
    b = np.zeros((3, 3), bool)
    b[1:, 1:] = True
    out = hj.compose_class_map([(1, a, 0.9), (2, b, 0.5)], 3, 3, background=0)
    np.testing.assert_array_equal(out, [[1, 1, 0], [1, 1, 2], [0, 2, 2]])


def test_score_scale():
    assert hj.scale_score(87.5, 100) == pytest.approx(0.875)
    assert hj.scale_score(0.3, 1) == pytest.approx(0.3)
    assert hj.scale_score(100.00001, 100) == 1.0
    with pytest.raises(ValueError, match="outside 0-1"):
        hj.scale_score(87.5, 1)
    with pytest.raises(ValueError, match="finite"):
        hj.scale_score(float("inf"), 1)


def test_proto3_numbers():
    assert hj.number(None, what="x") == 0.0                  # omitted zero
    assert hj.number("12.5", what="x") == 12.5               # int64 / special values as strings
    assert hj.number("NaN", what="x") != hj.number("NaN", what="x")
    with pytest.raises(ValueError, match="missing"):
        hj.number(None, what="x", missing_zero=False)
    with pytest.raises(ValueError, match="boolean"):
        hj.number(True, what="x")
    with pytest.raises(ValueError, match="expected a number"):
        hj.number("abc", what="x")


def test_retry_after_parsing():
    assert hj.parse_retry_after("3") == 3.0
    assert hj.parse_retry_after(" 0.5 ") == 0.5
    now = time.time()
    date = email.utils.formatdate(now + 10, usegmt=True)
    assert hj.parse_retry_after(date, now=now) == pytest.approx(10, abs=1.5)
    assert hj.parse_retry_after(email.utils.formatdate(now - 100, usegmt=True), now=now) == 0.0
    assert hj.parse_retry_after("soon") is None and hj.parse_retry_after(None) is None


def test_templates_keep_types_and_substitute_text():
    t = {"requests": "${images}", "n": "${image_width}", "uri": "data:${image_mime};base64,${image_base64}",
         "features": [{"type": "X", "maxResults": 3}]}
    out = hj.render_template(t, {"images": [{"a": 1}], "image_width": 48, "image_mime": "image/png",
                                 "image_base64": "QUJD"})
    assert out == {"requests": [{"a": 1}], "n": 48, "uri": "data:image/png;base64,QUJD",
                   "features": [{"type": "X", "maxResults": 3}]}
    assert hj.placeholders_in(t) == {"images", "image_width", "image_mime", "image_base64"}


def _profile(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": "p", "task": "classification", "labels": ["cat", "dog", "bird"],
        "request": {"url": "http://127.0.0.1:9/x", "body": {"img": "${image_base64}"}},
        "response": {"items": "labels", "label": "name", "score": "score"}}
    for k, v in overrides.items():
        node = base
        *path, last = k.split(".")
        for part in path:
            node = node.setdefault(part, {})
        if v is None:
            node.pop(last, None)
        else:
            node[last] = v
    return base


def test_proto3_omitted_fields_in_answers():
    p = hj.parse_profile(_profile(**{"response.missing_items": "empty"}))
    pred = hj.prediction_from_answer(p, {"labels": [{"name": "Dog", "score": 0.8}, {"name": "cat"}]}, 4, 4)
    assert classes(pred) == [(1, "dog", 0.8), (0, "cat", 0.0)]
    assert len(hj.prediction_from_answer(p, {}, 4, 4).classification.classes) == 0
    strict = hj.parse_profile(_profile(**{"response.missing_numbers": "error"}))
    with pytest.raises(ValueError, match="score 'score' is missing"):
        hj.prediction_from_answer(strict, {"labels": [{"name": "cat"}]}, 4, 4)
    with pytest.raises(ValueError, match="items path 'labels' not found"):
        hj.prediction_from_answer(strict, {"other": 1}, 4, 4)
    det = hj.parse_profile(_profile(**{
        "task": "detection", "response.box": {"path": "poly", "format": "normalized_polygon",
                                              "keys": ["x", "y"]}}))
    pred = hj.prediction_from_answer(det, {"labels": [
        {"name": "bird", "score": 0.5, "poly": [{}, {"x": 0.5}, {"x": 0.5, "y": 0.25}, {"y": 0.25}]}]}, 40, 20)
    (b,) = pred.detection.boxes
    assert (b.x_min, b.y_min, b.x_max, b.y_max, b.label) == (0, 0, 20, 5, 2)


def test_label_mapping():
    p = hj.parse_profile(_profile(label_map={"Kitty": "cat"}))
    assert p.label_of("Kitty") == (0, "cat")
    assert p.label_of("DOG") == (1, "dog")             # case-insensitive by default
    assert p.label_of("Zebra") == (-1, "Zebra")        # unknown names kept by name
    assert p.label_of(2) == (2, "bird") and p.label_of(7) == (-1, "7")
    exact = hj.parse_profile(_profile(label_match="exact", unknown_labels="drop"))
    assert exact.label_of("DOG") is None and exact.label_of("dog") == (1, "dog")
    one_based = hj.parse_profile(_profile(**{"response.label_index_base": 1}))
    assert one_based.label_of(1) == (0, "cat")
    with pytest.raises(errors.InvalidArgument, match="label_map.Kitty: maps to 'lion'"):
        hj.parse_profile(_profile(label_map={"Kitty": "lion"}))


def test_classification_output_modes():
    doc = {"labels": [{"name": "dog", "score": 0.2}, {"name": "cat", "score": 0.7},
                      {"name": "cat", "score": 0.1}]}
    full = hj.parse_profile(_profile(output="full_scores"))
    assert classes(hj.prediction_from_answer(full, doc, 4, 4)) == [(0, "cat", 0.7), (1, "dog", 0.2),
                                                                   (2, "bird", 0.0)]
    top1 = hj.parse_profile(_profile(output="top_k", top_k=1))
    assert classes(hj.prediction_from_answer(top1, doc, 4, 4)) == [(0, "cat", 0.7)]
    only = hj.parse_profile(_profile(output="label_only"))
    (c,) = hj.prediction_from_answer(only, doc, 4, 4).classification.classes
    assert (c.label, c.HasField("score")) == (0, False)


def test_profile_validation_names_every_problem():
    with pytest.raises(errors.InvalidArgument) as ei:
        hj.parse_profile(_profile(**{
            "task": "ocr", "colour": 1, "request.auth": {"header": "Authorization", "secret": "AKIAsupersecret"},
            "request.headers": {"X-Api-Key": "abc"}, "request.body": {"img": "${imag}"},
            "response.items": "labels[", "response.score_scale": 10}))
    fields = {v.field for v in ei.value.violations}
    assert {"task", "colour", "request.auth.secret", "request.headers.X-Api-Key", "request.body",
            "response.items", "response.score_scale"} <= fields
    assert "AKIAsupersecret" not in str(ei.value)
    assert "unknown placeholder ${imag}" in str(ei.value)
    with pytest.raises(errors.InvalidArgument, match="response.box: required for task: detection"):
        hj.parse_profile(_profile(task="detection"))
    with pytest.raises(errors.InvalidArgument, match="images_per_request > 1 needs a per_image"):
        hj.parse_profile(_profile(**{"request.images_per_request": 2}))
    with pytest.raises(errors.InvalidArgument, match="not set"):
        hj.parse_profile(_profile(**{"request.url": "${env:FORTIS_TEST_SURELY_UNSET}/x"}))


def test_secret_references(tmp_path, monkeypatch):
    f = tmp_path / "key"
    f.write_text("from-file\n")
    assert hj.SecretRef(f"file:{f}").resolve() == "from-file"
    monkeypatch.setenv("FORTIS_TEST_KEY", "from-env")
    assert hj.SecretRef("env:FORTIS_TEST_KEY").resolve() == "from-env"
    assert "from-env" not in repr(hj.SecretRef("env:FORTIS_TEST_KEY"))
    monkeypatch.delenv("FORTIS_TEST_KEY")
    with pytest.raises(errors.FailedPrecondition, match="env:FORTIS_TEST_KEY"):
        hj.SecretRef("env:FORTIS_TEST_KEY").resolve()
    with pytest.raises(errors.FailedPrecondition, match="cannot read"):
        hj.SecretRef(f"file:{tmp_path / 'none'}").resolve()


def test_urls_and_shipped_profiles(cloud):
    assert hj.profile_path("google-vision-labels") == PROFILES / "google-vision-labels.yaml"
    names = sorted(p.stem for p in PROFILES.glob("*.yaml") if not p.stem.startswith("labels-"))
    assert names == ["aws-rekognition-labels", "aws-rekognition-objects", "azure-image-analysis-objects",
                     "azure-image-analysis-tags", "google-vision-labels", "google-vision-objects"]
    for n in names:
        b = hj.backend_from_url(f"http-json:{n}?rate=5")
        try:
            assert b.info().name == n and len(b.info().labels) == 80
        finally:
            b.close()
    from fortis.adapters.registry import backend_for
    b = backend_for(f"http-json:{PROFILES / 'aws-rekognition-labels.yaml'}?rate=50")
    assert isinstance(b, hj.HttpJsonBackend)
    b.close()
    with pytest.raises(errors.InvalidArgument, match="cannot read"):
        hj.backend_from_url("http-json:/no/such/profile.yaml")


def test_no_grpc_in_the_adapter():
    tree = ast.parse(Path(hj.__file__).read_text())
    mods = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    mods |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not any(m == "grpc" or m.startswith("grpc") or m.endswith("_grpc") for m in mods), mods


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


def test_vendor_label_maps_are_case_insensitive():
    data = yaml.safe_load((PROFILES / "google-vision-labels.yaml").read_text())
    data["labels_file"] = str(PROFILES / "labels-coco-80.yaml")
    p = hj.parse_profile(data)
    assert p.label_of("Mobile phone") == (CELL_PHONE, "cell phone")
    assert p.label_of("MOBILE PHONE") == (CELL_PHONE, "cell phone")
    assert p.label_of("Dog") == (DOG, "dog")


def test_yaml_dates_in_templates_are_refused():
    with pytest.raises(errors.InvalidArgument, match="quote YAML dates"):
        hj.parse_profile(yaml.safe_load(
            "name: p\ntask: classification\noutput: label_only\n"
            "request: {url: 'http://h/x', body: {img: '${image_base64}', since: 2024-02-01}}\n"
            "response: {items: a, label: b}\n"))
