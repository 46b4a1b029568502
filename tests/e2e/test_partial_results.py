"""One setting that fails does not lose the evaluation (IEEE-P4: every test is listed with its
outcome). A tenant's own style model and surrogate that raise at run time (real TorchScript
files, uploaded through the API) fail their settings; the other corruptions and attacks run,
the evaluation SUCCEEDS, the report lists the failed settings with their errors and how far
they got, the acceptance criteria that depend on them are "not evaluated" (and fail under
--strict), and the JUnit document carries them as errors.
"""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch
from fortis.client import FortisClient

from tests.conftest import API_KEY

pytestmark = pytest.mark.usefixtures("one_thread")

_LABELS = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
           "Sneaker", "Bag", "Ankle boot"]


class _Broken(torch.nn.Module):
    """A model that fails at run time, as a tenant's buggy export would: it passes
    validation's 32 x 32 probe and raises on the plan's 28 x 28 images."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != 32:
            raise RuntimeError("this model is broken")
        return x


def _upload_broken(fc: FortisClient, tmp: Path) -> str:
    path = tmp / "broken.pt"
    torch.jit.save(torch.jit.script(_Broken()), str(path))
    return fc.upload(path, kind="model").blob_id


def _plan(blob: str) -> str:
    return f"""
name: partial
seed: 3
target: {{name: fmnist-cnn, task: classification}}
dataset: {{source: fashion-mnist, split: test, limit: 40}}
corruptions:
  - {{id: gaussian_noise, severities: [1, 3]}}
  - {{id: neural_style, severities: [2, 4], params: {{model: "{blob}"}}}}
surrogates:
  - name: broken-net
    model: "{blob}"
    format: torchscript
    input: {{height: 28, width: 28, channels: 1}}
    labels: {json.dumps(_LABELS)}
attacks:
  - {{id: fgsm, name: fgsm-broken, surrogate: broken-net, params: {{epsilon: 0.1}}}}
  - {{id: fgsm, surrogate: fmnist-surrogate, params: {{epsilon: 0.1}}}}
  - {{id: square, params: {{epsilon: 0.1, max_queries: 20}}, limit: 8}}
execution: {{batch_size: 16}}
acceptance:
  accuracy: ">= 0.5"
  corruptions.neural_style.mean: ">= 0.1"
  corruptions.gaussian_noise.1: ">= 0.1"
  average_robustness_corr: ">= 0.1"
  attacks.fgsm-broken.success_rate: "<= 1.0"
  attacks.square.success_rate: "<= 1.0"
"""


def test_failed_settings_are_reported_and_the_rest_completes(stack, tmp_path):
    with FortisClient(stack.address, api_key=API_KEY) as fc:
        blob = _upload_broken(fc, tmp_path)
        ev = fc.wait(fc.submit(_plan(blob)).evaluation_id, timeout_s=600)
        assert ev.state.value == "SUCCEEDED", ev.error
        assert sorted(ev.summary["failed_settings"]) == \
            ["fgsm-broken", "neural_style@2", "neural_style@4"]
        report = fc.report(ev.evaluation_id)
        fc.write_report(ev.evaluation_id, tmp_path / "out")

    failed = {f["setting"]: f for f in report["failed_settings"]}
    assert set(failed) == {"fgsm-broken", "neural_style@2", "neural_style@4"}
    for f in failed.values():
        assert f["code"] in ("INTERNAL", "INVALID_ARGUMENT", "FAILED_PRECONDITION"), f
        assert f["message"] and f["images_done"] == 0 and f["images_planned"] == 40
    assert failed["fgsm-broken"]["kind"] == "transfer_attack"
    m = report["metrics"]
    # the settings that ran have their results; the failed ones have none
    assert set(m["corruptions"]) == {"gaussian_noise"}
    assert set(m["attacks"]) == {"fgsm", "square"}
    assert m["attacks"]["square"]["m"] == 8 and m["accuracy"]["m"] == 40

    verdict = report["verdict"]
    outcomes = {c["metric"]: c["outcome"] for c in verdict["criteria"]}
    assert outcomes["corruptions.neural_style.mean"] == "not_evaluated"
    assert outcomes["average_robustness_corr"] == "not_evaluated"
    assert outcomes["attacks.fgsm-broken.success_rate"] == "not_evaluated"
    assert outcomes["accuracy"] == outcomes["corruptions.gaussian_noise.1"] == "pass"
    assert outcomes["attacks.square.success_rate"] == "pass"
    assert verdict["status"] == "incomplete" and verdict["passed"] is True
    assert verdict["strict_passed"] is False and verdict["not_evaluated"] == 3

    html = (tmp_path / "out" / "report.html").read_text()
    assert "3 settings failed to run" in html and "INCOMPLETE" in html

    from fortis.server.cli.junit import junit_xml
    from fortis.services.report.verdict import report_verdict

    again = report_verdict(report)                  # the offline gate agrees
    assert {c["metric"]: c["outcome"] for c in again["criteria"]} == outcomes
    assert {k: v for k, v in again.items() if k != "criteria"} == \
        {k: v for k, v in verdict.items() if k != "criteria"}
    root = ET.fromstring(junit_xml(report, verdict))
    errors = {tc.get("name"): tc.find("error") for tc in root.iter("testcase")
              if tc.find("error") is not None}
    assert set(errors) == {"fgsm-broken", "neural_style/2", "neural_style/4"}
    assert root.get("errors") == "3" and root.get("failures") == "0"
    strict = ET.fromstring(junit_xml(report, verdict, strict=True))
    suite = next(t for t in strict.iter("testsuite") if t.get("name") == "acceptance")
    assert suite.get("failures") == "3"

    # the gate: passes without --strict (nothing failed), exit 3 with it
    path = tmp_path / "out" / "report.json"
    for extra, code in (([], 0), (["--strict"], 3)):
        r = subprocess.run([sys.executable, "-m", "fortis.server.cli", "gate", str(path), *extra],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == code, r.stdout + r.stderr
        assert "not evaluated" in r.stdout
