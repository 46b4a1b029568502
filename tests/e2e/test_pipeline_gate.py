"""The pipeline gate end to end (docs/pipelines.md), through the CLI entry point
``fortis.server.cli.main`` with real evaluations of the Fashion-MNIST CNN (64 images, one corruption
at two severities, FGSM from the surrogate):

- a plan whose acceptance criteria hold: exit 0, JUnit XML without failures (validated against
  tests/fixtures/junit/junit-10.xsd), an MLflow run in a local file store read back;
- the same plan with one criterion it misses: exit 3, a JUnit failure naming it, also from
  ``fortis report ID`` of the finished evaluation; ``fortis gate`` offline, ``--strict``
  failing an inconclusive criterion (threshold taken inside the measured 95 % CI, IEEE-M8);
- ``fortis compare`` of the CNN against a second model (the surrogate served as target B) on
  the same plan: the paired McNemar test on the reports' per-image outcomes (the discordant
  images recounted), and the pooled two-proportion z-test recomputed from the counts when one
  report has no outcomes;
- ``fortis mlflow-export`` of an existing report to a SQLite store, read back;
- ``--pdf`` wired to fortis.server.cli.pdf.export_pdf.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import types
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import xmlschema
from fortis.server.cli import main
from fortis.server.cli.compare import EXIT_REGRESSION, two_proportion_z

XSD = Path(__file__).resolve().parents[1] / "fixtures" / "junit" / "junit-10.xsd"
KEY = "fk_gate_test_key_0123456789abcdef"

PLAN = """
name: gate-small
seed: 7
target: {{name: {target}, task: classification}}
dataset: {{source: fashion-mnist, split: test, limit: 64}}
corruptions:
  - {{id: gaussian_noise, severities: [1, 3]}}
attacks:
  - {{id: fgsm, surrogate: fmnist-surrogate, params: {{epsilon: 0.1}}}}
acceptance:
  accuracy: ">= 0.5"
  corruptions.gaussian_noise.1: ">= 30%"
  attacks.fgsm.success_rate: "<= 1.0"
{extra}"""


def cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


class Runs:
    """Three evaluations, run once for the module."""

    def __init__(self, root: Path, address: str) -> None:
        self.root, self.address = root, address
        self.mlruns = f"file://{root / 'mlruns'}"
        self.results: dict[str, tuple[int, str, str]] = {}

    def run(self, name: str, plan: str, *extra: str) -> Path:
        path = self.root / f"{name}.yaml"
        path.write_text(plan)
        out = self.root / name
        self.results[name] = cli("run", str(path), "--out", str(out), "--quiet",
                                 "--junit", str(out / "junit.xml"), *extra)
        return out

    def report(self, name: str) -> dict[str, Any]:
        return json.loads((self.root / name / "report.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory, fmnist_target, fmnist_surrogate) -> Iterator[Runs]:
    from fortis.server.app.stack import StackSettings, TargetConfig, start_stack

    root = tmp_path_factory.mktemp("gate")
    stack = start_stack(StackSettings(
        state_dir=root / "state", api_keys={KEY: "tenant-gate"},
        targets=[TargetConfig.parse("fmnist-cnn=builtin:fmnist-cnn"),
                 TargetConfig.parse("model-b=builtin:fmnist-surrogate")],
        # model-b is the surrogate's own weights: its operator grants the tenant white-box
        # access, as the plans attack fmnist-cnn through fmnist-surrogate
        whitebox_grants={"tenant-gate": frozenset({"*"})}))
    r = Runs(root, stack.address)
    remote = ("--address", stack.address, "--api-key", KEY)
    try:
        # A: embedded (no --address), criteria it meets, MLflow file store
        r.run("a", PLAN.format(target="fmnist-cnn", extra=""), "--state-dir",
              str(root / "embedded"), "--mlflow-uri", r.mlruns)
        # F: the same plan with a criterion it misses, through a running Fortis
        r.run("f", PLAN.format(target="fmnist-cnn", extra='  accuracy: ">= 0.999"\n')
              .replace('  accuracy: ">= 0.5"\n', ""), *remote, "--id", "ev-gate-fail")
        # B: the same plan on another model
        r.run("b", PLAN.format(target="model-b", extra=""), *remote, "--id", "ev-gate-b")
        yield r
    finally:
        stack.stop(0)


@pytest.fixture(scope="module")
def schema() -> xmlschema.XMLSchema:
    return xmlschema.XMLSchema(str(XSD))


def _failures(path: Path) -> list[tuple[str, str]]:
    root = ET.parse(path).getroot()
    return [(tc.get("classname", ""), tc.get("name", "")) for tc in root.iter("testcase")
            if tc.find("failure") is not None]


def test_criteria_met_exit_0(runs, schema):
    code, out, err = runs.results["a"]
    assert code == 0, err[-2000:]
    v = runs.report("a")["verdict"]
    assert v["status"] == "pass" and v["passed"] and len(v["criteria"]) == 3
    assert "Verdict: PASS" in out and "JUnit:" in out and "MLflow: run" in out
    junit = runs.root / "a" / "junit.xml"
    schema.validate(str(junit))
    assert _failures(junit) == []
    root = ET.parse(junit).getroot()
    names = {tc.get("name") for tc in root.iter("testcase")}
    assert {"gaussian_noise/1", "gaussian_noise/3", "gaussian_noise/mean", "fgsm",
            "accuracy >= 0.5"} <= names


def test_failing_criterion_exit_3_and_junit_failure(runs, schema):
    code, out, err = runs.results["f"]
    assert code == 3, err[-2000:]
    report = runs.report("f")
    bad = [c for c in report["verdict"]["criteria"] if c["outcome"] != "pass"]
    assert [c["metric"] for c in bad] == ["accuracy"]
    assert "Verdict: FAIL" in out and bad[0]["text"] in out
    junit = runs.root / "f" / "junit.xml"
    schema.validate(str(junit))
    assert set(_failures(junit)) == {("acceptance", "accuracy >= 0.999"),
                                     ("overall", "accuracy")}
    # the finished evaluation's report, fetched again: the same verdict and exit code
    again = runs.root / "f-again"
    code, out, _ = cli("report", "ev-gate-fail", "--address", runs.address, "--api-key", KEY,
                       "--out", str(again), "--junit", str(again / "j.xml"))
    assert code == 3 and json.loads((again / "report.json").read_text())["verdict"] == \
        report["verdict"]
    assert _failures(again / "j.xml") == _failures(junit)


def test_gate_offline_and_strict(runs, schema):
    a = runs.root / "a" / "report.json"
    code, out, _ = cli("gate", str(a))
    assert code == 0 and "Verdict: PASS" in out
    # a threshold inside the measured interval, below the estimate: passes, inconclusively
    acc = runs.report("a")["metrics"]["accuracy"]
    lo, value = acc["ci95"][0], acc["value"]
    assert lo < value
    t = f"{(lo + value) / 2:.6f}"
    code, out, _ = cli("gate", str(a), "--criterion", f"accuracy >= {t}")
    assert code == 0 and "inconclusive" in out
    junit = runs.root / "strict.xml"
    code, out, _ = cli("gate", str(a), "--criterion", f"accuracy >= {t}", "--strict",
                       "--junit", str(junit))
    assert code == 3 and "Verdict (strict): FAIL" in out
    schema.validate(str(junit))
    assert ("acceptance", f"accuracy >= {float(t):g}") in _failures(junit)
    # a criterion naming nothing the plan tested: bad input, naming the option
    code, _, err = cli("gate", str(a), "--criterion", "attacks.square.success_rate <= 0.1")
    assert code == 2 and "criterion.attacks.square.success_rate" in err


def test_compare_two_models(runs):
    a, b = runs.root / "a" / "report.json", runs.root / "b" / "report.json"
    assert runs.results["b"][0] == (0 if runs.report("b")["verdict"]["passed"] else 3)
    code, out, _ = cli("compare", str(a), str(b), "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["warnings"] == []               # the same plan, only the target differs
    rows = {r["metric"]: r for r in doc["rows"]}
    ra, rb = runs.report("a")["metrics"], runs.report("b")["metrics"]
    for metric, na, nb, xa, xb in (
            ("accuracy", ra["accuracy"]["m"], rb["accuracy"]["m"],
             ra["accuracy"]["correct"], rb["accuracy"]["correct"]),
            ("attacks.fgsm.success_rate", ra["attacks"]["fgsm"]["success_rate_n"],
             rb["attacks"]["fgsm"]["success_rate_n"], ra["attacks"]["fgsm"]["successes"],
             rb["attacks"]["fgsm"]["successes"])):
        row = rows[metric]
        # both reports carry per-image outcomes over the same images: the paired test
        assert row["test"] == "McNemar exact (paired)"
        assert row["in_family"] and row["significant"] == (row["p_adjusted"] < 0.05)
        assert row["difference"] == pytest.approx(xb / nb - xa / na)
    oa, ob = (runs.report(n)["outcomes"] for n in ("a", "b"))
    assert oa["image_ids"] == ob["image_ids"]
    clean_a, clean_b = (next(s["outcomes"] for s in o["settings"] if s["kind"] == "clean")
                        for o in (oa, ob))
    b_only = sum(x == "0" and y == "1" for x, y in zip(clean_a, clean_b, strict=True))
    a_only = sum(x == "1" and y == "0" for x, y in zip(clean_a, clean_b, strict=True))
    assert rows["accuracy"]["paired"] == {"images": len(clean_a), "a_not_b": a_only,
                                          "b_not_a": b_only}
    assert rows["corruptions.gaussian_noise.mean"]["test"] == "no test"
    # without the outcomes: the pooled z-test on the counts, saying why
    bare = runs.root / "b-bare.json"
    doc_b = runs.report("b")
    del doc_b["outcomes"]
    bare.write_text(json.dumps(doc_b))
    code, out, _ = cli("compare", str(a), str(bare), "--json", "--family", "none")
    rows = {r["metric"]: r for r in json.loads(out)["rows"]}
    xa, na = ra["accuracy"]["correct"], ra["accuracy"]["m"]
    xb, nb = rb["accuracy"]["correct"], rb["accuracy"]["m"]
    z, p = two_proportion_z(xa, na, xb, nb)
    assert rows["accuracy"]["test"] == "two-proportion z-test"
    assert rows["accuracy"]["p_value"] == pytest.approx(p) and rows["accuracy"]["z"] == pytest.approx(z)
    assert rows["accuracy"]["unpaired_because"] == "B carries no per-image outcomes"
    code, table, _ = cli("compare", str(a), str(b))
    assert code == 0 and "McNemar exact (paired)" in table
    code, _, _ = cli("compare", str(a), str(b), "--fail-on-regression")
    assert code == (EXIT_REGRESSION if doc["regressions"] else 0)


def _mlflow_run(uri: str, experiment: str) -> tuple[Any, Any]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None
    found = client.search_runs([exp.experiment_id])
    assert len(found) == 1
    return client, found[0]


def test_mlflow_file_store_round_trip(runs):
    report = runs.report("a")
    client, run = _mlflow_run(runs.mlruns, "gate-small")
    m = report["metrics"]
    assert run.data.metrics["accuracy"] == pytest.approx(m["accuracy"]["value"])
    assert run.data.metrics["corruptions.gaussian_noise.3"] == pytest.approx(
        m["corruptions"]["gaussian_noise"]["3"]["robustness"])
    assert run.data.metrics["attacks.fgsm.success_rate"] == pytest.approx(
        m["attacks"]["fgsm"]["success_rate"])
    assert run.data.metrics["average_robustness_corr"] == pytest.approx(
        m["average_robustness_corr"]["value"])
    p = run.data.params
    assert p["evaluation_id"] == report["evaluation"]["id"] and p["seed"] == "7"
    assert p["attacks.fgsm.params.epsilon"] == "0.1" and p["dataset.limit"] == "64"
    assert run.data.tags["fortis.verdict"] == "pass" and run.data.tags["fortis.version"]
    assert run.info.status == "FINISHED"
    files = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert files == {"report.json", "report.html", "junit.xml"}
    local = Path(client.download_artifacts(run.info.run_id, "report.json",
                                           str(runs.root / "dl")))
    assert json.loads(local.read_text()) == report


def test_mlflow_export_command_sqlite(runs, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)                # a SQLite store's default artifact root
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    b = runs.root / "b" / "report.json"
    code, out, err = cli("mlflow-export", str(b), "--mlflow-uri", uri,
                         "--mlflow-experiment", "models")
    assert code == 0, err[-2000:]
    assert json.loads(out)["run_id"]
    client, run = _mlflow_run(uri, "models")
    report = runs.report("b")
    assert run.data.params["target"] == "model-b"
    assert run.data.metrics["accuracy"] == pytest.approx(report["metrics"]["accuracy"]["value"])
    assert run.data.tags["fortis.verdict"] == report["verdict"]["status"]
    assert {a.path for a in client.list_artifacts(run.info.run_id)} == {
        "report.json", "report.html", "junit.xml"}
    code, _, err = cli("mlflow-export", str(tmp_path / "missing.json"), "--mlflow-uri", uri)
    assert code == 2 and "cannot read" in err


def test_pdf_flag_is_wired(runs, monkeypatch):
    """``--pdf`` calls fortis.server.cli.pdf.export_pdf(html, pdf) (headless Chromium, tested with
    that module); here a stand-in records the call, so only the wiring is under test."""
    calls: list[tuple[Path, Path]] = []

    def export_pdf(html_path: Path, pdf_path: Path, *, timeout_s: float = 120) -> Path:
        calls.append((html_path, pdf_path))
        pdf_path.write_bytes(b"%PDF-1.4 stand-in")
        return pdf_path

    stub = types.ModuleType("fortis.server.cli.pdf")
    stub.export_pdf = export_pdf  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fortis.server.cli.pdf", stub)
    out = runs.root / "pdf"
    code, stdout, _ = cli("report", "ev-gate-b", "--address", runs.address, "--api-key", KEY,
                          "--out", str(out), "--pdf", str(out / "report.pdf"))
    assert calls == [(out / "report.html", out / "report.pdf")]
    assert code == (0 if runs.report("b")["verdict"]["passed"] else 3)
    assert "PDF:" in stdout

    def broken(html_path: Path, pdf_path: Path, *, timeout_s: float = 120) -> Path:
        raise RuntimeError("chromium crashed")

    stub.export_pdf = broken  # type: ignore[attr-defined]
    code, _, err = cli("report", "ev-gate-b", "--address", runs.address, "--api-key", KEY,
                       "--out", str(out), "--pdf", str(out / "report.pdf"))
    assert code == 1 and "chromium crashed" in err



def test_mlflow_names_and_missing_client(runs, monkeypatch):
    """Hostile setting names become MLflow-legal names; without the mlflow package the
    export is one line saying what to install (exit 1), not a traceback."""
    from fortis.server.cli.mlflow_export import metrics_of, sanitize
    from mlflow.utils.validation import path_not_unique, validate_param_and_metric_name

    for hostile in ("attacks.sq<&>/../x:y", "..", "", "...", "/abs", ".hidden", "a" * 300,
                    "attacks.../evil\n.success_rate", "é\x00"):
        name = sanitize(hostile)
        assert validate_param_and_metric_name(name) and not path_not_unique(name), name
        assert 0 < len(name) <= 250
    assert sanitize("attacks.sq-v2.success_rate") == "attacks.sq-v2.success_rate"
    report = runs.report("a")
    report["metrics"]["attacks"]["../evil\n"] = report["metrics"]["attacks"]["fgsm"]
    names = metrics_of(report)
    assert "attacks._._evil_.success_rate" in names
    for mod in [m for m in sys.modules if m == "mlflow" or m.startswith("mlflow.")]:
        monkeypatch.setitem(sys.modules, mod, None)     # as if mlflow were not installed
    monkeypatch.setitem(sys.modules, "mlflow", None)
    code, _, err = cli("mlflow-export", str(runs.root / "a" / "report.json"), "--mlflow-uri",
                       f"file://{runs.root / 'never'}")
    assert code == 1 and "pip install 'fortis[mlflow]'" in err
    assert not (runs.root / "never").exists()
