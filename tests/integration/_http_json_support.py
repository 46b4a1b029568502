"""Shared by the HTTP/JSON adapter tests (test_http_json_proxy.py, test_http_json_units.py):
the test images, ``FakeCloud`` and the helpers that talk to the proxy.

Cloud APIs (AWS Rekognition, Google Cloud Vision, Azure Image Analysis) cannot be reached from
here, so ``FakeCloud`` stands in for them: a stdlib HTTP server on 127.0.0.1 that answers in
each vendor's documented response shape (Google's proto3 JSON with its zeros left out
included), computing its answers from the image it receives -- the label depends on the mean
brightness, the box is the region of bright pixels -- so a corruption can change the answer.
It checks the auth header the profile sends.
"""

from __future__ import annotations

import base64
import json
import secrets
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from email.parser import BytesParser
from email.policy import HTTP
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import cv2
import numpy as np
import yaml
from fortis.adapters import http_json as hj
from fortis.common.v1 import common_pb2
from fortis.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from fortis.services.common.codec import image_msg

from tests.conftest import MD

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


#: The API-key header each vendor also takes (the shipped profiles sign with the vendors'
#: libraries instead: tests/integration/test_cloud_credentials.py), and the URL the key-auth
#: copies of the AWS profiles use (a gateway taking an API key, here ``FakeCloud``).
KEY_AUTH: dict[str, dict[str, str]] = {
    "aws": {"header": "x-api-key", "secret": "env:FORTIS_REKOGNITION_API_KEY"},
    "google": {"header": "x-goog-api-key", "secret": "env:GOOGLE_VISION_API_KEY"},
    "azure": {"header": "Ocp-Apim-Subscription-Key", "secret": "env:AZURE_VISION_KEY"},
}


def variant(directory: Path, shipped: str, name: str, **changes: Any) -> Path:
    """A copy of a shipped profile authenticating with the vendor's API-key header, with some
    settings changed (dotted keys; None deletes)."""
    data = yaml.safe_load((PROFILES / f"{shipped}.yaml").read_text())
    data["name"] = name
    data["request"]["auth"] = dict(KEY_AUTH[shipped.split("-")[0]])
    if shipped.startswith("aws"):
        data["request"]["url"] = "${env:FORTIS_REKOGNITION_URL}"
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


