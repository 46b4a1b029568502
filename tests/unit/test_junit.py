"""JUnit XML of a report and its verdict (server/cli/junit.py): it validates
against the Jenkins/Surefire JUnit schema (tests/fixtures/junit/junit-10.xsd, see SOURCE.md),
has one test case per setting and per acceptance criterion, fails exactly the criteria the
verdict fails (inconclusive ones only with --strict), and survives hostile setting names."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import xmlschema
from fortis.server.cli.junit import junit_xml, write_junit
from fortis.services.report.convert import build_report
from fortis.services.report.verdict import report_verdict

from tests.unit.report_parts import CORRUPTIONS, PLAN_TEXT, QUERY, TRANSFER, make_parts

XSD = Path(__file__).resolve().parents[1] / "fixtures" / "junit" / "junit-10.xsd"


@pytest.fixture(scope="module")
def schema() -> xmlschema.XMLSchema:
    return xmlschema.XMLSchema(str(XSD))


def _report(acceptance: str = "", **names: str) -> dict:
    parts = make_parts(**names)
    if acceptance:
        parts.plan_text = PLAN_TEXT.replace(TRANSFER, names.get("transfer", TRANSFER)).replace(
            QUERY, names.get("query", QUERY)) + acceptance
    return build_report(parts)


def _cases(xml: bytes) -> dict[tuple[str, str], ET.Element]:
    root = ET.fromstring(xml)
    return {(tc.get("classname", ""), tc.get("name", "")): tc for tc in root.iter("testcase")}


def test_validates_and_has_a_case_per_setting_and_criterion(schema):
    """IEEE-M1..M7 settings each a test case; each criterion a test case (CAN-free plan)."""
    report = _report('acceptance: {accuracy: ">= 0.5", corruptions.motion_blur.2: ">= 0.99", '
                     'attacks.square_linf.success_rate: "<= 1.0"}\n')
    verdict = report["verdict"]
    xml = junit_xml(report, verdict)
    schema.validate(xml)
    cases = _cases(xml)
    m = report["metrics"]
    for cid in CORRUPTIONS:
        sevs = [k for k in m["corruptions"][cid] if k.isdigit()]
        for sev in [*sevs, "mean"]:
            assert ("corruptions", f"{cid}/{sev}") in cases
    for name in m["attacks"]:
        assert ("attacks", name) in cases
    for op, d in m["degradation"].items():
        for p in d["accuracy"]:
            assert ("degradation", f"{op}/{p['level']}") in cases
    assert ("overall", "accuracy") in cases
    acc = [k for k in cases if k[0] == "acceptance"]
    assert len(acc) == len(verdict["criteria"]) == 3
    # exactly the failing criterion fails: in the acceptance suite and on its setting
    failed = {k for k, tc in cases.items() if tc.find("failure") is not None}
    assert failed == {("acceptance", "corruptions.motion_blur.2 >= 0.99"),
                      ("corruptions", "motion_blur/2")}
    root = ET.fromstring(xml)
    assert root.get("failures") == "2" and root.get("tests") == str(len(cases))
    fail = cases[("acceptance", "corruptions.motion_blur.2 >= 0.99")].find("failure")
    assert fail is not None and fail.text == verdict["criteria"][1]["text"]
    # the setting's value and interval are in system-out
    out = cases[("corruptions", "motion_blur/2")].find("system-out")
    lo, hi = m["corruptions"]["motion_blur"]["2"]["ci95"]
    assert out is not None and f"{lo:.4f}-{hi:.4f}" in (out.text or "")


def test_inconclusive_fails_only_with_strict(schema):
    report = _report()
    acc = report["metrics"]["accuracy"]
    lo = acc["ci95"][0]
    threshold = round((lo + acc["value"]) / 2, 4)
    verdict = report_verdict(report, acceptance={"accuracy": f">= {threshold}"})
    assert verdict["criteria"][0]["confidence"] == "inconclusive"
    lax, strict = junit_xml(report, verdict), junit_xml(report, verdict, strict=True)
    schema.validate(lax)
    schema.validate(strict)
    name = ("acceptance", f"accuracy >= {threshold:g}")
    assert _cases(lax)[name].find("failure") is None
    assert "inconclusive" in (_cases(lax)[name].find("system-out").text or "")
    assert _cases(strict)[name].find("failure") is not None
    assert _cases(strict)[("overall", "accuracy")].find("failure") is not None
    assert ET.fromstring(strict).get("failures") == "2"


def test_missing_metric_fails(schema):
    report = _report()
    del report["metrics"]["attacks"][QUERY]
    verdict = report_verdict(report, acceptance={f"attacks.{QUERY}.success_rate": "<= 0.5"})
    xml = junit_xml(report, verdict)
    schema.validate(xml)
    fail = _cases(xml)[("acceptance", f"attacks.{QUERY}.success_rate <= 0.5")].find("failure")
    assert fail is not None and "missing" in fail.get("message", "")


HOSTILE = 'sq<"&\'>\x01\x7f]]>\ud800é'


def test_hostile_names_are_escaped_and_the_document_stays_valid(schema, tmp_path):
    """Names from plans: markup, quotes, ampersands, control characters, a lone surrogate."""
    report = _report()
    m = report["metrics"]
    m["attacks"][HOSTILE] = m["attacks"].pop(QUERY)
    m["corruptions"]["fog<&>\x02"] = m["corruptions"].pop(CORRUPTIONS[0])
    report["plan"]["name"] = "</testsuites><x>\x00"
    verdict = {"status": "fail", "passed": False, "strict_passed": False, "criteria": [
        {"metric": f"attacks.{HOSTILE}.success_rate", "op": "<=", "threshold": 0.1,
         "value": 0.5, "ci95": [0.4, 0.6], "outcome": "fail", "confidence": "conclusive",
         "text": "value <b>&amp; \x03 ]]> fails"}]}
    path = write_junit(tmp_path / "deep" / "junit.xml", report, verdict)
    schema.validate(str(path))
    cases = _cases(path.read_bytes())
    names = {n for _, n in cases}
    # markup and quotes survive as text; characters XML cannot carry become \xNN
    assert 'sq<"&\'>\\x01\x7f]]>\\xd800é' in names
    assert "fog<&>\\x02/1" in names
    attack_case = cases[("attacks", 'sq<"&\'>\\x01\x7f]]>\\xd800é')]
    failure = attack_case.find("failure")
    assert failure is not None and failure.text == "value <b>&amp; \\x03 ]]> fails"
    assert ET.parse(path).getroot().get("name") == "fortis </testsuites><x>\\x00"


def test_no_criteria_all_settings_pass(schema):
    report = _report()
    xml = junit_xml(report, report["verdict"])
    schema.validate(xml)
    root = ET.fromstring(xml)
    assert root.get("failures") == "0" and int(root.get("tests", "0")) > 0
    assert {s.get("name") for s in root.iter("testsuite")} >= {
        "acceptance", "overall", "corruptions", "attacks", "degradation"}


def test_the_schema_check_is_not_vacuous(schema):
    """The XSD refuses what CI systems would: a test case without a name, a time with four
    decimals, a test case directly under <testsuites>."""
    for bad in (b'<testsuites><testsuite name="a" tests="1" failures="0" errors="0">'
                b'<testcase classname="a"/></testsuite></testsuites>',
                b'<testsuites time="1.2345"/>',
                b'<testsuites><testcase name="x"/></testsuites>'):
        assert not schema.is_valid(bad)
