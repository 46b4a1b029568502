"""Per-image outcomes (report.json ``outcomes``): the evaluation places the scoring service's
verdicts on the evaluation's images (services/evaluation/outcomes.py) and the report service
writes them after checking them (services/report/outcomes_part.py); a malformed part is
refused naming the field, never written."""

from __future__ import annotations

import numpy as np
import pytest
from fortis.report.v1 import report_pb2
from fortis.scoring.v1 import scoring_pb2 as spb
from fortis.services.common.errors import InvalidArgument
from fortis.services.evaluation.outcomes import per_image_outcomes
from fortis.services.evaluation.ports import Setting
from fortis.services.report.convert import build_report

from tests.unit.report_parts import make_parts


def _verdicts(kind: int, name: str, level: int, correct: list[bool]) -> spb.SettingVerdicts:
    return spb.SettingVerdicts(kind=kind, name=name, level=level, count=len(correct),
                               correct=np.packbits(np.array(correct, dtype=bool)).tobytes())


def test_verdicts_placed_on_the_images():
    ids = [f"i{k}" for k in range(11)]
    rng = np.random.default_rng(29)
    clean = rng.random(11) < 0.7
    fog = rng.random(11) < 0.5
    covered = (1, 4, 5, 9)                       # a query attack limited to some images
    attack = [True, False, False, True]
    metrics = spb.ScoreEvaluationResponse(verdicts=[
        _verdicts(spb.SETTING_KIND_CLEAN, "", 0, clean.tolist()),
        _verdicts(spb.SETTING_KIND_CORRUPTION, "fog", 3, fog.tolist()),
        _verdicts(spb.SETTING_KIND_QUERY_ATTACK, "square", 0, attack)])
    settings = [Setting(kind="clean"), Setting(kind="corruption", name="fog", level=3),
                Setting(kind="query_attack", name="square", image_index=covered),
                Setting(kind="degradation", name="blur", level=1)]    # no verdicts: left out
    out = per_image_outcomes(ids, settings, metrics)
    assert out is not None and out.image_ids == tuple(ids)
    by = {(k, n, lv): s for k, n, lv, s in out.settings}
    assert set(by) == {("clean", "", 0), ("corruption", "fog", 3), ("query_attack", "square", 0)}
    assert by[("clean", "", 0)] == "".join("1" if c else "0" for c in clean)
    assert by[("corruption", "fog", 3)] == "".join("1" if c else "0" for c in fog)
    assert by[("query_attack", "square", 0)] == "-1--00---1-"
    # a setting whose verdicts do not match its covered images is left out, not guessed
    wrong = [Setting(kind="query_attack", name="square", image_index=(1, 4, 5))]
    assert per_image_outcomes(ids, wrong, metrics).settings == ()
    # no verdicts at all (an older scoring service): no outcomes
    assert per_image_outcomes(ids, settings, spb.ScoreEvaluationResponse()) is None


def _with_outcomes(ids: list[str], rows: list[tuple[str, str, int, str]]
                   ) -> report_pb2.ReportParts:
    parts = make_parts()
    parts.outcomes.image_ids.extend(ids)
    for k, n, lv, o in rows:
        parts.outcomes.settings.add(kind=k, name=n, level=lv, outcomes=o)
    return parts


def test_report_writes_checked_outcomes():
    doc = build_report(_with_outcomes(["a", "b", "c"], [("clean", "", 0, "10-")]))
    assert doc["outcomes"]["image_ids"] == ["a", "b", "c"]
    assert doc["outcomes"]["settings"] == [{"kind": "clean", "name": "", "level": 0,
                                            "outcomes": "10-"}]
    assert "outcomes" not in build_report(make_parts())


@pytest.mark.parametrize("ids,rows,field,text", [
    (["a", "b"], [("clean", "", 0, "1")], "parts.outcomes.settings[0].outcomes",
     "has 1 characters for 2 images"),
    (["a", "b"], [("clean", "", 0, "1x")], "parts.outcomes.settings[0].outcomes",
     "only '1', '0' and '-'"),
    (["a", "a"], [("clean", "", 0, "11")], "parts.outcomes.image_ids", "unique"),
    (["a"], [("../x", "", 0, "1")], "parts.outcomes.settings[0].kind", "must be one of"),
    (["a"], [("clean", "", 0, "1"), ("clean", "", 0, "0")], "parts.outcomes.settings[1]",
     "given twice"),
    (["a"], [("corruption", "fog", -1, "1")], "parts.outcomes.settings[0].level",
     "must be in [0, 1000]"),
    (["a"], [("corruption", "f" * 129, 1, "1")], "parts.outcomes.settings[0].name",
     "at most 128 characters"),
    (["x" * 257], [("clean", "", 0, "1")], "parts.outcomes.image_ids", "longer than 256"),
])
def test_report_refuses_malformed_outcomes(ids, rows, field, text):
    with pytest.raises(InvalidArgument) as exc:
        build_report(_with_outcomes(ids, rows))
    assert any(v.field == field and text in v.description for v in exc.value.violations)
