"""``fortis compare`` on reports of real evaluations (embedded ``fortis run``, 64 Fashion-MNIST
images, Gaussian noise at two severities, FGSM from the surrogate): the Fashion-MNIST CNN, its
adversarially trained twin (``builtin:fmnist-cnn-at``) and the CNN again under another plan
seed.

- every per-image rate is compared by McNemar's exact test, its discordant images recounted
  here from the two reports' ``outcomes`` and its p-value checked against statsmodels;
- the adjusted p-values are statsmodels' Holm adjustment of the family's raw p-values;
- ``--fail-on-regression`` fails on the CNN against its adversarially trained twin (FGSM
  robustness far lower) and passes once the family is restricted to accuracy
  (``--metrics accuracy``, where the CNN is the better one);
- the CNN against itself under another seed flags nothing.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
from fortis.server.cli import main
from fortis.server.cli.compare import EXIT_REGRESSION, PAIRED
from statsmodels.stats import contingency_tables as contingency  # the dev extra's reference
from statsmodels.stats import multitest

pytestmark = pytest.mark.slow

PLAN = """
name: compare-paired
seed: {seed}
target: {{name: {target}, task: classification}}
dataset: {{source: fashion-mnist, split: test, limit: 64}}
corruptions:
  - {{id: gaussian_noise, severities: [1, 3]}}
attacks:
  - {{id: fgsm, surrogate: fmnist-surrogate, params: {{epsilon: 0.1}}}}
acceptance:
  accuracy: ">= 0.5"
"""


def cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def reports(tmp_path_factory, fmnist_target, fmnist_surrogate) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("compare")
    out = {}
    for name, target, seed in (("at", "fmnist-cnn-at", 7), ("cnn", "fmnist-cnn", 7),
                               ("cnn8", "fmnist-cnn", 8)):
        plan = root / f"{name}.yaml"
        plan.write_text(PLAN.format(target=target, seed=seed))
        code, _, err = cli("run", str(plan), "--out", str(root / name), "--quiet",
                           "--state-dir", str(root / "state"))
        assert code == 0, err[-2000:]
        out[name] = root / name / "report.json"
    return out


def _outcome(doc: dict, kind: str, name: str, level: int) -> str:
    return next(s["outcomes"] for s in doc["outcomes"]["settings"]
                if (s["kind"], s["name"], s["level"]) == (kind, name, level))


def test_paired_rows_and_holm_against_statsmodels(reports):
    code, out, _ = cli("compare", str(reports["at"]), str(reports["cnn"]), "--json")
    assert code == 0
    doc = json.loads(out)
    a, b = (json.loads(reports[n].read_text()) for n in ("at", "cnn"))
    assert doc["paired"] and doc["family"]["control"] == "holm"
    rows = {r["metric"]: r for r in doc["rows"]}
    for metric, key in (("accuracy", ("clean", "", 0)),
                        ("corruptions.gaussian_noise.1", ("corruption", "gaussian_noise", 1)),
                        ("corruptions.gaussian_noise.3", ("corruption", "gaussian_noise", 3)),
                        ("attacks.fgsm.robustness_adv", ("transfer_attack", "fgsm", 0))):
        sa, sb = _outcome(a, *key), _outcome(b, *key)
        # the outcomes count what the metrics count
        assert sa.count("1") == rows[metric]["a_counts"][0]
        bb = sum(x == "1" and y == "0" for x, y in zip(sa, sb, strict=True))
        cc = sum(x == "0" and y == "1" for x, y in zip(sa, sb, strict=True))
        row = rows[metric]
        assert row["test"] == PAIRED
        assert row["paired"] == {"images": 64, "a_not_b": bb, "b_not_a": cc}
        ref = contingency.mcnemar([[0, bb], [cc, 0]], exact=True).pvalue
        assert row["p_value"] == pytest.approx(ref, rel=1e-9)
    fam = [r for r in doc["rows"] if r["in_family"]]
    assert len(fam) == doc["family"]["size"] >= 6
    ref = multitest.multipletests([r["p_value"] for r in fam], method="holm")[1]
    assert [r["p_adjusted"] for r in fam] == pytest.approx(list(ref))


def test_regression_gate_with_holm(reports):
    at, cnn = str(reports["at"]), str(reports["cnn"])
    code, out, _ = cli("compare", at, cnn, "--json")
    rows = {r["metric"]: r for r in json.loads(out)["rows"]}
    robust = rows["attacks.fgsm.robustness_adv"]
    assert robust["change"] == "worse" and robust["regression"], robust
    code, table, _ = cli("compare", at, cnn, "--fail-on-regression")
    assert code == EXIT_REGRESSION and "Holm" in table
    # the gate reading accuracy only (a family of one): the CNN is not worse there
    assert rows["accuracy"]["change"] == "better"
    code, _, _ = cli("compare", at, cnn, "--fail-on-regression", "--metrics", "accuracy")
    assert code == 0
    # --gate acceptance: the plan's one criterion, accuracy
    code, out, _ = cli("compare", at, cnn, "--json", "--gate", "acceptance",
                       "--fail-on-regression")
    assert code == 0
    assert [r["metric"] for r in json.loads(out)["rows"] if r["in_family"]] == ["accuracy"]


def test_same_model_other_seed_flags_nothing(reports):
    code, out, _ = cli("compare", str(reports["cnn"]), str(reports["cnn8"]), "--json",
                       "--fail-on-regression")
    doc = json.loads(out)
    assert code == 0 and doc["regressions"] == 0 and doc["paired"]
    assert any("seed" in w for w in doc["warnings"])
