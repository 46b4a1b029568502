"""JUnit XML of a report and its verdict, for CI systems (``--junit FILE``, ``fortis gate``).

One ``<testsuite>`` per kind of result, in this order:

    acceptance    one <testcase> per acceptance criterion: a <failure> with the verdict's
                  sentence when it fails or its metric is missing; an inconclusive or a not
                  evaluated criterion passes with the sentence in <system-out>, and fails
                  with --strict
    overall       accuracy (IEEE-M1), the averages and worst cases (IEEE-M2..M5)
    corruptions   one per corruption and severity (``fog/3``) and per corruption mean
    attacks       one per attack (robustness, success rate, queries; IEEE-M3, M6)
    degradation   one per operator and level (DEG-2)

A setting's test case passes unless an acceptance criterion on it failed; its value and 95 %
interval are in <system-out>. A setting that failed to run (the report's ``failed_settings``)
is a test case of its suite with an <error> carrying the setting's error. The document validates against the Jenkins/Surefire JUnit schema
(junit-10.xsd, tests/fixtures/junit/). Every text is escaped, and characters XML 1.0 cannot
carry (control characters, lone surrogates) are written as ``\\xNN``: setting names come
from plans, which are hostile input.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from fortis.server.cli.report_doc import mapping as _mapping
from fortis.server.cli.report_doc import number as _f

__all__ = ["junit_xml", "write_junit"]

#: Characters XML 1.0 cannot carry, even escaped.
_NOT_XML: Final = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_MAX_TEXT: Final = 4000
_MAX_NAME: Final = 200
_GLOBALS: Final = ("accuracy", "average_robustness_corr", "worstcase_robustness_corr",
                   "average_robustness_adv", "worstcase_robustness_adv")


def _clean(text: Any, limit: int = _MAX_TEXT) -> str:
    s = str(text)
    s = _NOT_XML.sub(lambda m: f"\\x{ord(m.group()):02x}", s)
    return s if len(s) <= limit else s[:limit - 3] + "..."


def _rate(value: Any, ci: Any, correct: Any = None, m: Any = None) -> str:
    v = _f(value)
    if v is None:
        return "no value"
    out = f"{v:.4f}"
    if isinstance(ci, list | tuple) and len(ci) == 2 and None not in (_f(ci[0]), _f(ci[1])):
        out += f" (95% CI {float(ci[0]):.4f}-{float(ci[1]):.4f})"
    if isinstance(correct, int) and isinstance(m, int) and m:
        out += f", {correct}/{m}"
    return out


def _setting_of(metric: str) -> tuple[str, str] | None:
    """The (suite, test case) a criterion's metric is about."""
    parts = metric.split(".")
    if len(parts) == 1:
        return ("overall", metric) if metric in _GLOBALS else None
    if len(parts) >= 3 and parts[0] == "corruptions":
        return "corruptions", f"{'.'.join(parts[1:-1])}/{parts[-1]}"
    if len(parts) >= 3 and parts[0] == "attacks":
        return "attacks", ".".join(parts[1:-1])
    return None


_WHY: Final = {("missing", "no_ci"): "the metric is missing",
               ("fail", "conclusive"): "fails (conclusive)",
               ("fail", "inconclusive"): "fails (inconclusive: the 95% CI straddles it)",
               ("fail", "no_ci"): "fails (no interval: the value decides)",
               ("pass", "inconclusive"): "inconclusive, failed by --strict",
               ("not_evaluated", "no_ci"): "not evaluated (a setting failed), failed by "
                                           "--strict"}
#: The JUnit suite of each kind of failed setting.
_SUITE_OF: Final = {"corruption": "corruptions", "degradation": "degradation",
                    "transfer_attack": "attacks", "query_attack": "attacks"}


def _fails(c: Mapping[str, Any], strict: bool) -> bool:
    if c.get("outcome") == "not_evaluated":
        return strict
    return c.get("outcome") != "pass" or (strict and c.get("confidence") == "inconclusive")


class _Suites:
    def __init__(self, root: ET.Element, started_at: str) -> None:
        self.root, self.started_at = root, started_at
        self.suites: dict[str, ET.Element] = {}

    def suite(self, name: str) -> ET.Element:
        if name not in self.suites:
            attrs = {"name": name, "tests": "0", "failures": "0", "errors": "0", "skipped": "0"}
            if self.started_at:
                attrs["timestamp"] = self.started_at
            self.suites[name] = ET.SubElement(self.root, "testsuite", attrs)
        return self.suites[name]

    def case(self, suite: str, name: str, out: str, failures: list[tuple[str, str]],
             error: tuple[str, str] | None = None) -> None:
        s = self.suite(suite)
        tc = ET.SubElement(s, "testcase", {"classname": suite, "name": _clean(name, _MAX_NAME),
                                           "time": "0"})
        if error is not None:
            e = ET.SubElement(tc, "error", {"type": _clean(error[0], 100),
                                           "message": _clean(error[1], 500)})
            e.text = _clean(error[1])
        for message, text in failures:
            f = ET.SubElement(tc, "failure", {"type": "acceptance",
                                             "message": _clean(message, 500)})
            f.text = _clean(text)
        if out:
            ET.SubElement(tc, "system-out").text = _clean(out)
        s.set("tests", str(int(s.get("tests", "0")) + 1))
        if error is not None:
            s.set("errors", str(int(s.get("errors", "0")) + 1))
        elif failures:
            s.set("failures", str(int(s.get("failures", "0")) + 1))


def junit_xml(report: Mapping[str, Any], verdict: Mapping[str, Any], *,
              strict: bool = False) -> bytes:
    """The JUnit XML document (module docstring) of ``report`` and its ``verdict``."""
    plan, ev = _mapping(report.get("plan")), _mapping(report.get("evaluation"))
    target, m = _mapping(report.get("target")), _mapping(report.get("metrics"))
    duration = _f(ev.get("duration_s")) or 0.0
    root = ET.Element("testsuites", {"name": _clean(f"fortis {plan.get('name', '')}", _MAX_NAME),
                                     "time": f"{max(duration, 0.0):.3f}"})
    suites = _Suites(root, _clean(ev.get("started_at") or "", 64))
    criteria = [c for c in verdict.get("criteria") or () if isinstance(c, Mapping)]

    acc = suites.suite("acceptance")
    props = ET.SubElement(acc, "properties")
    for name, value in (("plan", plan.get("name")), ("target", target.get("name")),
                        ("evaluation", ev.get("id")), ("status", verdict.get("status")),
                        ("strict", "true" if strict else "false"),
                        ("policy", "point estimate decides; 95% Wilson interval: conclusive "
                                   "or inconclusive (IEEE-M8)")):
        ET.SubElement(props, "property", {"name": name, "value": _clean(value or "", 500)})
    on_setting: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for c in criteria:
        metric = str(c.get("metric", ""))
        t = _f(c.get("threshold"))
        rule = f"{metric} {c.get('op', '')} {t:g}" if t is not None else metric
        text = str(c.get("text", ""))
        fails = _fails(c, strict)
        why = _WHY.get((str(c.get("outcome")), str(c.get("confidence"))), "fails")
        suites.case("acceptance", rule, "" if fails else text,
                    [(f"{rule}: {why}", text)] if fails else [])
        where = _setting_of(metric)
        if fails and where is not None:
            on_setting.setdefault(where, []).append((f"acceptance {rule}: {why}", text))

    for name in _GLOBALS:
        node = _mapping(m.get(name))
        if _f(node.get("value")) is not None:
            value = _rate(node.get("value"), node.get("ci95"), node.get("correct"), node.get("m"))
            suites.case("overall", name, f"{name} {value}", on_setting.get(("overall", name), []))
    for cid, node in _mapping(m.get("corruptions")).items():
        for sev in sorted((k for k in _mapping(node) if str(k).isdigit()), key=int) + ["mean"]:
            s = _mapping(_mapping(node).get(sev))
            if s:
                value = _rate(s.get("robustness"), s.get("ci95"), s.get("correct"), s.get("m"))
                suites.case("corruptions", f"{cid}/{sev}", f"robustness {value}",
                            on_setting.get(("corruptions", f"{cid}/{sev}"), []))
    for name, a in _mapping(m.get("attacks")).items():
        a = _mapping(a)
        rob = _rate(a.get("robustness_adv"), a.get("ci95"), a.get("correct"), a.get("m"))
        sr = _rate(a.get("success_rate"), a.get("success_rate_ci95"), a.get("successes"),
                   a.get("success_rate_n"))
        out = f"robustness_adv {rob}; success_rate {sr}"
        if _f(a.get("mean_queries")) is not None:
            out += f"; mean_queries {float(a['mean_queries']):.1f}"
        suites.case("attacks", str(name), out, on_setting.get(("attacks", str(name)), []))
    for op, d in _mapping(m.get("degradation")).items():
        for p in _mapping(d).get("accuracy") or ():
            p = _mapping(p)
            if p:
                value = _rate(p.get("value"), p.get("ci95"), p.get("correct"), p.get("m"))
                suites.case("degradation", f"{op}/{p.get('level')}", f"accuracy {value}", [])
    for f in report.get("failed_settings") or ():
        f = _mapping(f)
        suite = _SUITE_OF.get(str(f.get("kind")), "settings")
        name = str(f.get("setting") or f.get("name") or "?")
        if suite == "corruptions" and f.get("level") is not None:
            name = f"{f.get('name')}/{f.get('level')}"
        suites.case(suite, name,
                    f"failed to run: {f.get('images_done')} of {f.get('images_planned')} "
                    "images done", [], error=(str(f.get("code") or "ERROR"),
                                              str(f.get("message") or "")))
    total = sum(int(s.get("tests", "0")) for s in suites.suites.values())
    failed = sum(int(s.get("failures", "0")) for s in suites.suites.values())
    errored = sum(int(s.get("errors", "0")) for s in suites.suites.values())
    root.set("tests", str(total))
    root.set("failures", str(failed))
    root.set("errors", str(errored))
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True)


def write_junit(path: Path, report: Mapping[str, Any], verdict: Mapping[str, Any], *,
                strict: bool = False) -> Path:
    """Write :func:`junit_xml` to ``path`` (its folder is created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(junit_xml(report, verdict, strict=strict))
    return path
