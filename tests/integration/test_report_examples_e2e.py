"""Example images in the report, end to end through the real services on loopback:
a Fashion-MNIST plan with two corruptions, one degradation operator, a transfer attack (FGSM
on the surrogate) and a query attack (Square) runs on the real CNN behind the proxy, and
report.json carries

- a corruption example per (corruption, severity) on one sample image (IEEE-A1..A6), the
  very image the target received (its SHA-256 is the ledger's) with the ledger's answer;
- an original / adversarial / difference triplet per attack (IEEE-A7, A8) whose adversarial
  is the stored artifact's image (CAN-9) and the image the target received;
- the example image of each DEG-4 failure point with a level, as the target received it;

every image a PNG data URI, and not one query more in the ledger than the stages sent.
RenderReport refuses hostile example bytes naming the field and keeps serving."""

from __future__ import annotations

import base64
import io
import json
import re
from collections import defaultdict
from typing import Any

import grpc
import numpy as np
import pytest
from fortis.client import FortisClient, progress_of
from fortis.report.v1 import report_pb2, report_pb2_grpc
from fortis.services.common.codec import image_msg, image_sha256
from PIL import Image

from tests.conftest import API_KEY, MD
from tests.unit.report_parts import make_parts

pytestmark = pytest.mark.usefixtures("one_thread")

N = 48
PLAN = f"""
name: examples-e2e
seed: 5
roles: {{tester: {{name: pytest, organisation: Fortis CI}}}}
target: {{name: fmnist-cnn, task: classification}}
dataset: {{source: fashion-mnist, split: test, limit: {N}}}
correctness: {{mode: top1}}
corruptions:
  - {{id: gaussian_noise, severities: [2, 5]}}
  - {{id: contrast, severities: [4]}}
degradation:
  - {{id: global_blur, levels: [1, 5, 15, 30]}}
attacks:
  - {{id: fgsm, surrogate: fmnist-surrogate, params: {{epsilon: 0.15}}}}
  - {{id: square, params: {{epsilon: 0.3, max_queries: 40}}, limit: 8}}
execution: {{batch_size: 16}}
"""


def _png(uri: str) -> np.ndarray:
    prefix = "data:image/png;base64,"
    assert uri.startswith(prefix)
    data = base64.b64decode(uri[len(prefix):], validate=True)
    with Image.open(io.BytesIO(data), formats=["PNG"]) as im:
        im.load()
        assert im.format == "PNG"
        arr = np.asarray(im)
    return arr[:, :, None] if arr.ndim == 2 else arr


def _sha(image_id: str, arr: np.ndarray) -> str:
    """The SHA-256 the proxy's ledger records of an image sent as a raw tensor."""
    return image_sha256(image_msg(image_id, np.ascontiguousarray(arr), raw=True))


class _Words(str):
    """A ledger output summary ("top1=3 p=0.9876") as the report words it ("Bag (0.99)"). The
    ledger keeps 4 decimals and the report prints 2 from the full score, so 0.52495 is "0.52"
    in the report and "0.5250" in the ledger: equal when the labels are and the scores agree
    within the report's rounding."""

    def __new__(cls, summary: str, labels: list[str]) -> _Words:
        m = re.fullmatch(r"top1=(\d+) p=([0-9.]+)", summary)
        assert m, summary
        out = super().__new__(cls, f"{labels[int(m.group(1))]} ({float(m.group(2)):.2f})")
        out.label, out.p = labels[int(m.group(1))], float(m.group(2))
        return out

    def __eq__(self, other: object) -> bool:
        m = re.fullmatch(r"(.*) \(([0-9.]+)\)", str(other))
        return bool(m) and m.group(1) == self.label and abs(float(m.group(2)) - self.p) <= 0.0051

    __hash__ = str.__hash__


def _words(summary: str, labels: list[str]) -> _Words:
    return _Words(summary, labels)


def test_report_examples_are_what_the_target_received(stack, fmnist_target,
                                                       fmnist_test_images):
    labels = list(fmnist_target.class_names)
    with FortisClient(stack.address, api_key=API_KEY) as fc:
        ev = fc.submit(PLAN)
        final = fc.wait(ev.evaluation_id)
        assert progress_of(final).state == "SUCCEEDED", final.error.message
        eid = ev.evaluation_id
        report = json.loads(fc.report_files(eid)[0])
        sessions = report["ledger"]["sessions"]
        ledger = {s: list(fc.iter_ledger_entries(s)) for s in sessions}
    ok = {s: [e for e in entries if not e.error] for s, entries in ledger.items()}
    by = defaultdict(list)          # (session, origin, image id) -> entries
    for s, entries in ok.items():
        for e in entries:
            by[(s, e.origin, e.image_id)].append(e)
    examples = report["examples"]
    for ex in examples:             # every data URI is a PNG; the difference too
        for key in ("original", "perturbed", "difference"):
            assert _png(ex[key]).shape[:2] == _png(ex["original"]).shape[:2]

    def clean_words(image_id: str) -> str:
        (e,) = by[(f"{eid}/clean", "clean", image_id)]
        return _words(e.output_summary, labels)

    # corruptions: one sample image, every (corruption, severity) of the plan
    corr = [e for e in examples if e["kind"] == "corruption"]
    assert sorted((e["setting"], e["level"]) for e in corr) == [
        ("contrast", 4), ("gaussian_noise", 2), ("gaussian_noise", 5)]
    assert len({e["image_id"] for e in corr}) == 1
    for ex in corr:
        (sent,) = by[(f"{eid}/corruptions", f"{ex['setting']}@{ex['level']}", ex["image_id"])]
        assert _sha(ex["image_id"], _png(ex["perturbed"])) == sent.input_sha256
        assert ex["perturbed_answer"] == _words(sent.output_summary, labels)
        assert ex["original_answer"] == clean_words(ex["image_id"])
        (clean,) = by[(f"{eid}/clean", "clean", ex["image_id"])]
        assert _sha(ex["image_id"], _png(ex["original"])) == clean.input_sha256

    # attacks: a triplet per attack; the adversarial is the stored artifact's image
    arts = stack.manager.store.for_tenant("tenant-a")
    stored: dict[tuple[str, str], np.ndarray] = {}
    for a in arts.artifacts(eid):
        with np.load(io.BytesIO(arts.artifact(eid, a.name))) as z:
            attack = a.name.split("/")[1].rsplit("-", 1)[0]
            for i, image_id in enumerate(z["image_ids"]):
                stored[(attack, str(image_id))] = z["adversarial_uint8"][i]
    att = {e["setting"]: e for e in examples if e["kind"] == "attack"}
    assert set(att) == {"fgsm", "square"}
    for name, ex in att.items():
        adv = _png(ex["perturbed"])
        assert np.array_equal(adv, stored[(name, ex["image_id"])])
        assert ex["original_answer"] == clean_words(ex["image_id"])
        assert ex["level"] is None and _png(ex["difference"]).any()
    (sent,) = by[(f"{eid}/attack/fgsm", "fgsm", att["fgsm"]["image_id"])]
    assert _sha(att["fgsm"]["image_id"], _png(att["fgsm"]["perturbed"])) == sent.input_sha256
    assert att["fgsm"]["perturbed_answer"] == _words(sent.output_summary, labels)
    fgsm_m = report["metrics"]["attacks"]["fgsm"]
    if fgsm_m["robustness_adv"] < report["metrics"]["accuracy"]["value"]:
        assert att["fgsm"]["note"].startswith("the first image fgsm fooled")
        assert att["fgsm"]["perturbed_answer"] != att["fgsm"]["original_answer"]
    # square: the adversarial shown is one the target answered in the attack's session
    sq = att["square"]
    sq_entries = [e for s, entries in ok.items() if s.startswith(f"{eid}/attack/square/")
                  for e in entries if e.image_id == sq["image_id"]]
    sq_sha = _sha(sq["image_id"], _png(sq["perturbed"]))
    assert sq_sha in {e.input_sha256 for e in sq_entries}
    verdict = re.fullmatch(r"(fooled after|not fooled within) (\d+) queries",
                           sq["perturbed_answer"])
    assert verdict, sq["perturbed_answer"]
    assert int(verdict.group(2)) == len(sq_entries)
    # the verdict is the target's on that image: fooled iff its top-1 is not the true label
    (_, truth), index = fmnist_test_images, int(sq["image_id"].rsplit("-", 1)[1])
    answered = next(e for e in sq_entries if e.input_sha256 == sq_sha)
    top1 = int(re.match(r"top1=(\d+)", answered.output_summary).group(1))  # type: ignore[union-attr]
    assert (verdict.group(1) == "fooled after") == (top1 != int(truth[index]))

    # degradation: every DEG-4 failure point with a level has its image at that level
    fps = {(fp["level"], fp["example_image"])
           for fp in report["metrics"]["degradation"]["global_blur"]["failure_points"].values()
           if fp is not None and fp.get("level") is not None}
    assert fps, "global_blur up to level 30 takes accuracy below 90% on Fashion-MNIST"
    deg = [e for e in examples if e["kind"] == "degradation"]
    assert {(e["level"], e["image_id"]) for e in deg} == fps
    for ex in deg:
        (sent,) = by[(f"{eid}/degradation", f"global_blur@{ex['level']}", ex["image_id"])]
        assert _sha(ex["image_id"], _png(ex["perturbed"])) == sent.input_sha256
        assert ex["perturbed_answer"] == _words(sent.output_summary, labels)
        assert "DEG-4" in ex["note"]

    # no extra target query: one per image and setting, every session in the report
    from fortis.services.proxy.ledger import Ledger
    led = Ledger(stack.settings.state_dir / "ledger.sqlite", synchronous="NORMAL")
    try:
        assert set(led.sessions_with_prefix(f"{eid}/")) == set(sessions)
    finally:
        led.close()
    assert len(ok[f"{eid}/clean"]) == N and len(ok[f"{eid}/attack/fgsm"]) == N
    assert len(ok[f"{eid}/corruptions"]) == 3 * N and len(ok[f"{eid}/degradation"]) == 4 * N
    assert {s: len(e) for s, e in ok.items()} == sessions
    assert sum(len(e) for e in ledger.values()) == report["ledger"]["total_queries"]


def _example(**kw: Any) -> report_pb2.ExampleImage:
    buf = io.BytesIO()
    Image.fromarray(np.zeros((4, 5), np.uint8)).save(buf, format="PNG")
    fields: dict[str, Any] = dict(kind=report_pb2.EXAMPLE_KIND_ATTACK, setting="fgsm",
                                  image_id="i", original_png=buf.getvalue(),
                                  perturbed_png=buf.getvalue())
    fields.update(kw)
    return report_pb2.ExampleImage(**fields)


def test_render_report_refuses_hostile_example_bytes_and_keeps_serving(channel):
    """A 10000x10000 PNG header (decompression bomb), a JPEG, a truncated PNG: INVALID_ARGUMENT
    naming the field, never INTERNAL; the service then renders a valid example."""
    rp = report_pb2_grpc.ReportServiceStub(channel)
    import struct
    import zlib
    body = b"IHDR" + struct.pack(">IIBBBBB", 10000, 10000, 8, 0, 0, 0, 0)
    bomb = b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + body + struct.pack(
        ">I", zlib.crc32(body))
    jpeg = io.BytesIO()
    Image.fromarray(np.zeros((4, 5), np.uint8)).save(jpeg, format="JPEG")
    good = _example().original_png
    for n, bad in enumerate((_example(perturbed_png=bomb), _example(perturbed_png=jpeg.getvalue()),
                             _example(perturbed_png=good[: len(good) // 2]))):
        parts = make_parts()
        parts.examples.extend([_example()] * n + [bad])
        with pytest.raises(grpc.RpcError) as e:
            rp.RenderReport(report_pb2.RenderReportRequest(parts=parts), metadata=MD)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"parts.examples[{n}].perturbed_png" in (e.value.details() or "")
    parts = make_parts()
    parts.examples.append(_example())
    resp = rp.RenderReport(report_pb2.RenderReportRequest(parts=parts), metadata=MD)
    (ex,) = json.loads(resp.report_json)["examples"]
    assert ex["kind"] == "attack" and _png(ex["difference"]).max() == 0
