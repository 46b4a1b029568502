"""The `fortis` command line as a user runs it: a subprocess, real files, an embedded stack
(README's CLI tour). Exit codes: 0 ok, 2 bad input, 1 failed."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import grpc
import pytest
from fortis.proxy.v1 import proxy_pb2, proxy_pb2_grpc

PLAN = """
name: cli-small
seed: 5
target: {name: fmnist-cnn, task: classification}
dataset: {source: fashion-mnist, split: test, limit: 48}
corruptions:
  - {id: gaussian_noise, severities: [1, 5]}
attacks:
  - {id: fgsm, surrogate: fmnist-surrogate, params: {epsilon: 0.1}}
  - {id: square, params: {epsilon: 0.1, max_queries: 30}, limit: 8}
"""


def fortis(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fortis.server.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600)


def test_validate_names_every_bad_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(PLAN.replace("limit: 48", "limit: 0").replace("severities: [1, 5]", "severities: [1, 9]")
                   .replace("epsilon: 0.1, max", "epsilon: 3, max"))
    r = fortis("validate", str(bad), cwd=tmp_path)
    assert r.returncode == 2
    for field in ("dataset.limit", "corruptions[0].severities[1]", "attacks[1].params.epsilon"):
        assert field in r.stdout
    good = tmp_path / "good.yaml"
    good.write_text(PLAN)
    r = fortis("validate", str(good), cwd=tmp_path)
    assert r.returncode == 0 and "valid" in r.stdout
    r = fortis("validate", str(tmp_path / "missing.yaml"), cwd=tmp_path)
    assert r.returncode == 2 and "cannot read plan" in r.stderr


def test_run_embedded_writes_report_and_ledger_agrees(tmp_path, fmnist_target, fmnist_surrogate):
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN)
    state = tmp_path / "state"
    r = fortis("run", str(plan), "--out", str(tmp_path / "out"), "--state-dir", str(state),
               "--id", "ev-cli", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    # not a terminal: plain progress lines, one per stage at least, no carriage-return bars
    assert "[clean]" in r.stderr and "[done]" in r.stderr and "\r" not in r.stderr
    assert "clean accuracy" in r.stdout
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["metrics"]["accuracy"]["m"] == 48
    assert "<html" in (tmp_path / "out" / "report.html").read_text().lower()
    # the local ledger tells the same number of queries as the report
    r = fortis("ledger", "--evaluation", "ev-cli", "--json", "--state-dir", str(state), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    sessions = json.loads(r.stdout)
    assert sessions, "no sessions in the ledger"
    assert sum(s["queries_ok"] for s in sessions) == sum(report["ledger"]["sessions"].values())


def test_run_mobilenet_on_photos_with_the_shipped_plan(tmp_path):
    """The shipped plan: torchvision's MobileNetV2 served as a top-5 API, evaluated on the
    offline natural photos with their ImageNet labels under the top-K rule (IEEE-C2)."""
    shipped = resources.files("fortis.server.cli").joinpath("plans/mobilenet-photos.yaml")
    text = shipped.read_text().replace("limit: 8", "limit: 4").replace("max_queries: 100", "max_queries: 20")
    plan = tmp_path / "plan.yaml"
    plan.write_text(text)
    r = fortis("run", str(plan), "--out", str(tmp_path / "out"), "--state-dir", str(tmp_path / "s"),
               "--quiet", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    m = report["metrics"]
    t = report["target"]
    assert t["name"] == "mobilenet-v2" and t["output_kind"] == "top_k" and t["labels_count"] == 1000
    assert m["accuracy"]["m"] == 4 and m["accuracy"]["value"] >= 0.75     # top-5 on real photos
    assert m["corruptions"]["gaussian_noise"]["5"]["robustness"] <= m["accuracy"]["value"]
    sq = m["attacks"]["square"]
    assert sq["query_budget"] == 20 and sq["m"] == 4


def test_styles_in_a_plan_and_degradation_ids_rejected_there(tmp_path, fmnist_target, fmnist_surrogate):
    """IEEE-A6 styles run in a plan like corruptions (severities); incremental degradation
    operators (DEG-1, levels 1..30) and properties (PER-1, epsilon) are refused there, naming
    the field."""
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN.replace("  - {id: gaussian_noise, severities: [1, 5]}",
                                 "  - {id: gaussian_noise, severities: [1, 5]}\n"
                                 "  - {id: oil_painting, severities: [1, 5]}")
                    .replace("limit: 48", "limit: 16"))
    r = fortis("run", str(plan), "--out", str(tmp_path / "out"), "--state-dir", str(tmp_path / "s"),
               "--quiet", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    oil = report["metrics"]["corruptions"]["oil_painting"]
    assert set(oil) >= {"1", "5"} and 0 <= oil["5"]["robustness"] <= 1
    assert any(t.get("id") == "oil_painting" and t.get("perturbation_kind") == "style"
               for t in report["tests"]), report["tests"]
    bad = tmp_path / "bad.yaml"
    bad.write_text(PLAN.replace("  - {id: gaussian_noise, severities: [1, 5]}",
                                "  - {id: global_blur, severities: [1]}\n"
                                "  - {id: per_rotation}\n"
                                "  - {id: neural_style, severities: [1]}"))
    r = fortis("validate", str(bad), cwd=tmp_path)
    assert r.returncode == 2
    for field in ("corruptions[0].id", "corruptions[1].id", "corruptions[2].params.model_path"):
        assert field in r.stdout, r.stdout


def test_perturbations_listing_and_sheets(tmp_path):
    r = fortis("perturbations", "--json", cwd=tmp_path)
    assert r.returncode == 0
    items = json.loads(r.stdout)
    kinds = {it["kind"] for it in items}
    assert kinds == {"corruption", "style", "degradation", "property"}     # attacks: their own list
    deg = [it for it in items if it["kind"] == "degradation"]
    assert all(it["characterisation"]["scope"] in ("global", "local") for it in deg)
    r = fortis("perturbations", "--kind", "property", cwd=tmp_path)
    assert r.returncode == 0 and "per_rotation" in r.stdout
    assert not any(line.startswith("gaussian_noise ") for line in r.stdout.splitlines())
    r = fortis("attacks", "--json", cwd=tmp_path)
    assert r.returncode == 0
    attacks = json.loads(r.stdout)
    from fortis.services.perturbation.attacks.registry import ATTACKS
    assert [a["id"] for a in attacks] == list(ATTACKS)        # every entry, registry order
    assert [a["id"] for a in attacks][:4] == ["fgsm", "bim", "pgd", "mi_fgsm"]
    mi = next(a for a in attacks if a["id"] == "mi_fgsm")
    assert {"DI", "TI", "SI", "NI", "VMI", "ensemble"} <= set(mi["boosters"])
    assert all(a["parameters"] and a["norms"] for a in attacks)
    eps = next(p for p in attacks[0]["parameters"] if p["name"] == "epsilon")
    assert (eps["minimum"], eps["maximum"]) == (0.0, 1.0)
    r = fortis("attacks", "--kind", "transfer", cwd=tmp_path)
    assert r.returncode == 0
    listed = [line.split()[0] for line in r.stdout.splitlines()[1:] if line.strip()]
    assert listed[:4] == ["fgsm", "bim", "pgd", "mi_fgsm"] and "square" not in listed
    assert "Boosters of the transfer attacks" in r.stdout
    assert {"DI", "TI", "SI", "NI", "VMI", "ensemble"} <= set(listed)
    r = fortis("sheets", "--out", str(tmp_path / "sheets"), "--image", "fashion-mnist",
               "--kind", "style", "--size", "32", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "sheets" / "style.png").stat().st_size > 1000
    r = fortis("sheets", "--out", str(tmp_path / "x"), "--image", "no-such-photo", cwd=tmp_path)
    assert r.returncode == 2 and "image" in r.stderr


def test_degradation_section_validated_with_field_names(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(PLAN + """degradation:
  - {id: gaussian_noise}
  - {id: global_blur, levels: [0, 31]}
  - {id: model_gradient_descent}
""")
    r = fortis("validate", str(bad), cwd=tmp_path)
    assert r.returncode == 2
    for field in ("degradation[0].id", "degradation[1].levels[0]", "degradation[1].levels[1]",
                  "degradation[2].surrogate"):
        assert field in r.stdout, r.stdout


def _page_images(html: str) -> dict[str, dict[str, str]]:
    """The page's <img> elements by their alt text."""
    from html.parser import HTMLParser

    out: dict[str, dict[str, str]] = {}

    class P(HTMLParser):
        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            if tag == "img":
                a = {k: v or "" for k, v in attrs}
                out[a.get("alt", "")] = a

    P().feed(html)
    return out


def _decoded(uri: str) -> Any:
    import base64
    import io

    import numpy as np
    from PIL import Image

    with Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1]))) as im:
        return np.asarray(im.convert("RGB")).astype(int)


def _judged_again(task: str, report: dict[str, Any], ex: dict[str, Any]) -> bool:
    """The example's answer judged here by the scoring service's own IEEE-C4 / C5 code, from
    what report.json carries (the boxes, the masks) and the plan's rule."""
    import numpy as np
    from fortis.core.criteria import DetectionCriterion, SegmentationCriterion
    from fortis.services.scoring.correctness import (
        DetectionBatch,
        detection_correct,
        segmentation_correct,
    )

    if task == "detection":
        crit = DetectionCriterion(iou_threshold=0.5)

        def batch(boxes: list[dict[str, Any]], scores: bool) -> Any:
            b = np.array([x["box"] for x in boxes], np.float64).reshape(-1, 4)
            return DetectionBatch.from_arrays(
                boxes=b, labels=np.zeros(len(b), np.int64), counts=np.array([len(b)]),
                scores=np.array([x["score"] for x in boxes], np.float64) if scores else None)

        return bool(detection_correct(batch(ex["truth_boxes"], False),
                                      batch(ex["perturbed_boxes"], True), crit)[0])
    truth = _decoded(ex["truth_mask"])[:, :, 0]
    pred = _decoded(ex["perturbed_mask"])[:, :, 0]
    crit = SegmentationCriterion(classes=(1,), miou_threshold=0.6)
    return bool(segmentation_correct(pred[None], truth[None], crit)[0])


def test_detection_and_segmentation_demos_run_end_to_end(tmp_path):
    """The demo runs a detection plan (OpenCV Haar faces, IEEE-C4) and a segmentation
    plan (U2-Net-p, IEEE-C5) end to end: generated scenes with known ground truth (96 and
    60: a 95% interval narrower than 0.3, IEEE-M8), corruptions through the proxy, IEEE
    metrics with CIs in the report. The example grid shows the answers drawn (the target's
    boxes / mask in magenta, at the box edges of the boxes report.json lists) beside the
    ground truth, and marks an answer failing exactly when the plan's rule, judged again
    here from report.json, calls it incorrect."""
    import numpy as np
    from fortis.adapters.vision_demo import DETECTION_IMAGES, SEGMENTATION_IMAGES
    from fortis.services.report import annotate

    magenta = np.array(annotate.ANSWER_COLOUR)
    for task, target, m in (("detection", "haar-face", DETECTION_IMAGES),
                            ("segmentation", "u2netp", SEGMENTATION_IMAGES)):
        out = tmp_path / task
        r = fortis("demo", "--task", task, "--out", str(out), "--state-dir", str(tmp_path / f"s-{task}"),
                   cwd=tmp_path)
        assert r.returncode == 0, r.stderr[-3000:]
        assert f"Demo data: {m} generated" in r.stderr
        report = json.loads((out / "report.json").read_text())
        assert report["target"]["name"] == target and report["target"]["task_type"] == task
        mt = report["metrics"]
        acc = mt["accuracy"]
        assert acc["m"] == m and acc["value"] >= 0.8, acc         # the target finds most
        assert acc["ci95"][1] - acc["ci95"][0] < 0.3, acc
        assert mt["worstcase_robustness_corr"]["value"] < acc["value"]   # something breaks it
        assert mt["ranking"]["applicable"] is False
        assert report["ledger"]["sessions"][f"{report['evaluation']['id']}/clean"] == m
        assert f"{m} generated" in report["plan"]["description"]

        html = (out / "report.html").read_text()
        imgs = _page_images(html)
        examples = report["examples"]
        planned = {(c["id"], s) for c in report["plan"]["corruptions"] for s in c["severities"]}
        assert {(e["setting"], e["level"]) for e in examples} == planned   # no cell left out
        assert any(e["perturbed_verdict"] == "incorrect" for e in examples)
        for e in examples:
            assert e["original_verdict"] == "correct"              # the sample: right clean
            assert (e["perturbed_verdict"] == "correct") == _judged_again(task, report, e), e
            shot = imgs[f"{e['setting']} at severity {e['level']}"]
            assert ("fail" in shot["class"].split()) == (e["perturbed_verdict"] == "incorrect")
            drawn = _decoded(shot["src"])
            s = drawn.shape[1] / 256                               # the scenes are 256 wide
            if task == "detection":
                assert e["truth_boxes"] and all(b["label"] == "face" for b in e["truth_boxes"])
                for b in e["perturbed_boxes"]:
                    x1, y1, x2, y2 = (v * s for v in b["box"])
                    mid = int((y1 + y2) / 2)
                    for x in (x1, x2):
                        assert np.abs(drawn[mid, int(x)] - magenta).max() <= 3, (e, x)
            else:                   # the mask filled: 40% magenta over the image
                assert s == 1
                pred = _decoded(e["perturbed_mask"])[:, :, 0] > 0
                expect = 0.6 * _decoded(e["perturbed"]) + 0.4 * magenta
                if pred.any():
                    assert np.median(np.abs(drawn[pred] - expect[pred]).max(axis=-1)) <= 2
                outside = ~pred & (_decoded(e["truth_mask"])[:, :, 0] == 0)
                assert np.array_equal(drawn[outside], _decoded(e["perturbed"])[outside])
        assert f"ground truth of image {examples[0]['image_id']}" in imgs


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture()
def served(tmp_path: Path, fmnist_target, fmnist_surrogate) -> Iterator[tuple[str, str]]:
    """`fortis serve` with no --target and no --service, as the README shows it: (address,
    the API key it printed)."""
    proc = subprocess.Popen([sys.executable, "-m", "fortis.server.cli", "serve", "--address",
                             f"127.0.0.1:{_free_port()}", "--state-dir", str(tmp_path / "state"),
                             "--log-level", "warning"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        line = proc.stdout.readline()
        assert line, proc.stderr.read()[-3000:]
        info = json.loads(line)
        yield info["address"], info["api_key"]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_serve_without_target_serves_the_builtins(served):
    address, key = served
    with grpc.insecure_channel(address) as ch:
        resp = proxy_pb2_grpc.TargetProxyServiceStub(ch).ListTargets(
            proxy_pb2.ListTargetsRequest(), metadata=(("x-api-key", key),), timeout=30)
    assert {t.name for t in resp.targets} == {"fmnist-cnn", "fmnist-cnn-label", "fmnist-cnn-top3",
                                              "fmnist-mlp", "fmnist-cnn-at",
                                              "mobilenet-v2", "efficientnet-lite0"}


def test_serve_on_a_busy_port_is_one_clear_line(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = fortis("serve", "--address", f"127.0.0.1:{port}", "--state-dir", str(tmp_path / "s"),
                   cwd=tmp_path)
    assert r.returncode == 6            # docs/pipelines.md: exit codes of fortis serve
    assert r.stderr.strip() == (f"fortis: startup failed at 'gRPC address': cannot listen on "
                                f"127.0.0.1:{port}: address in use")
    assert "Traceback" not in r.stderr and r.stdout == ""


def test_remote_commands_through_the_client(tmp_path, served):
    """run/watch/report/list/cancel/ledger/perturbations with --address: fortis.client only."""
    address, key = served
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN.replace("limit: 48", "limit: 16").split("attacks:")[0])
    remote = ("--address", address, "--api-key", key)
    r = fortis("run", str(plan), "--out", str(tmp_path / "out"), "--id", "ev-remote", "--quiet",
               *remote, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((tmp_path / "out" / "report.json").read_text())["metrics"]["accuracy"]["m"] == 16
    r = fortis("watch", "ev-remote", "--timeout", "60", "--quiet", *remote, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "ev-remote SUCCEEDED", r.stderr
    r = fortis("report", "ev-remote", "--out", str(tmp_path / "again"), *remote, cwd=tmp_path)
    assert r.returncode == 0 and (tmp_path / "again" / "report.html").exists(), r.stderr
    r = fortis("list", "--json", "--page-size", "1", *remote, cwd=tmp_path)
    assert r.returncode == 0 and [e["evaluation_id"] for e in json.loads(r.stdout)] == ["ev-remote"]
    r = fortis("cancel", "ev-remote", *remote, cwd=tmp_path)
    assert r.returncode == 1 and "FailedPrecondition" in r.stderr and "Traceback" not in r.stderr
    r = fortis("watch", "ev-nope", *remote, cwd=tmp_path)
    assert r.returncode == 1 and "ev-nope" in r.stderr
    assert r.stderr.count("not found") == 1, r.stderr        # no "'... not found' not found"
    r = fortis("ledger", "--session", "ev-remote/clean", "--json", *remote, cwd=tmp_path)
    assert r.returncode == 0 and json.loads(r.stdout)["queries_ok"] == 16, r.stderr
    r = fortis("perturbations", "--json", "--kind", "corruption", *remote, cwd=tmp_path)
    assert r.returncode == 0
    assert "gaussian_noise" in {p["id"] for p in json.loads(r.stdout)}
    bad = tmp_path / "bad.yaml"
    bad.write_text(PLAN.replace("severities: [1, 5]", "severities: [1, 9]"))
    r = fortis("run", str(bad), "--out", str(tmp_path / "x"), *remote, cwd=tmp_path)
    assert r.returncode == 2 and "corruptions[0].severities[1]" in r.stderr
    # validate by the server: its catalogue, and its targets (a missing one is named)
    r = fortis("validate", str(plan), *remote, cwd=tmp_path)
    assert r.returncode == 0 and "is valid on" in r.stdout, r.stderr
    bad.write_text(PLAN.replace("name: fmnist-cnn", "name: not-served"))
    r = fortis("validate", str(bad), *remote, cwd=tmp_path)
    assert r.returncode == 2 and "target.name" in r.stdout + r.stderr, r.stdout + r.stderr
    r = fortis("attacks", "--json", "--kind", "score", *remote, cwd=tmp_path)
    from fortis.services.perturbation.attacks.registry import ATTACKS
    score_ids = [k for k, spec in ATTACKS.items() if spec.kind == "score"]
    assert r.returncode == 0, r.stderr
    assert [a["id"] for a in json.loads(r.stdout)] == score_ids and "square" in score_ids
