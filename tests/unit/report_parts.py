"""A realistic ``fortis.report.v1.ReportParts`` for report tests: 6 images, clean + 2
corruptions x 2 severities + 1 transfer attack + 1 query attack + 1 degradation operator, with
hostile text where a caller controls it (plan text, target name, tester name)."""

from __future__ import annotations

from fortis.common.v1 import common_pb2
from fortis.perturbation.v1 import perturbation_pb2
from fortis.report.v1 import report_pb2
from fortis.scoring.v1 import scoring_pb2
from google.protobuf import timestamp_pb2

CORRUPTIONS = ("gaussian_noise", "motion_blur")
TRANSFER = "fgsm_surrogate"
QUERY = "square_linf"
OPERATOR = "global_blur"
M = 6

PLAN_TEXT = """\
# evaluation plan </title><script>alert("pwned")</script>
name: hostile-demo
seed: 1234
target:
  name: "mobilenet <b>v2</b>"
  endpoint: https://user:hunter2@vision.example.com/v1/predict?api_key=sk-SECRET&region=eu
  task: classification
roles:
  requester: {name: Acme Retail, organisation: Acme}
  tester: {name: "Dana <QA>", organisation: QA Lab}
  provider: {name: Vision Inc., organisation: Vision}
dataset: {source: fashion-mnist, split: test, limit: 6}
correctness: {mode: top1}
corruptions: [{id: gaussian_noise, severities: [1, 2]}, {id: motion_blur, severities: [1, 2]}]
degradation: [{id: global_blur, levels: [1, 2]}]
attacks:
  - {id: fgsm, name: fgsm_surrogate, surrogate: fmnist-surrogate, params: {epsilon: 0.03}}
  - {id: square, name: square_linf, params: {epsilon: 0.03, max_queries: 500}, limit: 4}
"""


def rate(correct: int, m: int, *, interval: bool = True) -> scoring_pb2.Rate:
    """A rate with a (rough, test-only) interval around it."""
    r = scoring_pb2.Rate(m=m, correct=correct)
    if m:
        r.value = correct / m
        if interval:
            r.ci95_low, r.ci95_high = max(0.0, r.value - 0.2), min(1.0, r.value + 0.2)
    return r


def _ieee(attack_names: tuple[str, str]) -> scoring_pb2.IeeeMetrics:
    transfer, query = attack_names
    ieee = scoring_pb2.IeeeMetrics(m=M, accuracy=rate(5, M))
    for j, name in enumerate(CORRUPTIONS):
        sev = [scoring_pb2.SeverityRobustness(severity=s, robustness=rate(5 - s - j, M))
               for s in (1, 2)]
        ieee.corruptions.add(name=name, severities=sev,
                             mean_robustness=sum(x.robustness.value for x in sev) / 2)
    mean = sum(c.mean_robustness for c in ieee.corruptions) / 2
    ieee.average_robustness_corr.CopyFrom(scoring_pb2.Average(
        value=mean, n=2, m=M, definition="mean over the N corruptions of Robustness_Corr(j)"))
    ieee.worstcase_robustness_corr.CopyFrom(scoring_pb2.WorstCase(rate=rate(1, M), n_settings=4))
    for s in (1, 2):
        ieee.by_severity.add(severity=s, average=scoring_pb2.Average(value=(4.5 - s) / M, n=2),
                             worst_case=rate(3 - s, M), n_settings=2)
    ieee.attacks.add(name=transfer, kind=scoring_pb2.ATTACK_SCORING_TRANSFER,
                     robustness_adv=rate(3, M), success=rate(2, 5), clean_mismatches=0,
                     mean_linf=0.03, max_linf=0.03, mean_l2=1.25)
    ieee.attacks.add(name=query, kind=scoring_pb2.ATTACK_SCORING_QUERY,
                     robustness_adv=rate(2, 4), success=rate(2, 4), mean_queries=120.5,
                     median_queries=100.0, mean_queries_successful=40.0, query_budget=500,
                     errors=1, error_images=["img3"], mean_linf=0.03, max_linf=0.03,
                     mean_l2=1.1, mean_l2_successful=0.9, median_l2_successful=0.85,
                     success_by_queries=[scoring_pb2.QueryCurvePoint(queries=10, success_rate=0.25),
                                         scoring_pb2.QueryCurvePoint(queries=500, success_rate=0.5)],
                     fooling_rate=0.25, fooling_threshold=0.9, never_fooled=0.5)
    ieee.average_robustness_adv.CopyFrom(scoring_pb2.Average(
        value=(3 / M + 2 / 4) / 2, n=2, definition="mean over the K attacks of Robustness_Adv"))
    ieee.m_per_attack[transfer] = M
    ieee.m_per_attack[query] = 4
    ieee.worstcase_robustness_adv.CopyFrom(scoring_pb2.WorstCase(
        rate=rate(1, 4), n_settings=2, over="images covered by every attack"))
    return ieee


def _ranking(attack_names: tuple[str, str]) -> scoring_pb2.Ranking:
    ranking = scoring_pb2.Ranking(applicable=True, gamma_b=0.01, gamma_a=0.001, drr_k=5)
    names = [f"{c}@{s}" for c in CORRUPTIONS for s in (1, 2)]
    for n, name in enumerate([*names, attack_names[0]]):
        kind = (scoring_pb2.SETTING_KIND_CORRUPTION if "@" in name
                else scoring_pb2.SETTING_KIND_TRANSFER_ATTACK)
        ranking.settings.add(name=name, kind=kind, m=M, ndcg_1=0.9 - n / 20,
                             ndcg_at=[0.9 - n / 20 + i / 100 for i in range(10)],
                             drr=0.8 - n / 20, drr_n=M, applicable=True)
    return ranking


def _degradation() -> scoring_pb2.DegradationProfile:
    d = scoring_pb2.DegradationProfile(name=OPERATOR, m=M, m_used=5, applicable=True)
    for lv, correct in ((0, 5), (1, 4), (2, 2)):
        d.accuracy.add(level=lv, value=correct / 5, ci95_low=max(0, correct / 5 - 0.3),
                       ci95_high=min(1, correct / 5 + 0.2), n=5, correct=correct)
        d.rank.add(level=lv, value=lv * 0.5, at_least=lv * 0.5, n=5)
        d.probability.add(level=lv, value=0.9 - lv * 0.2, n=5)
    d.fraction_of_pixels_changed[1] = 0.25
    d.fraction_of_pixels_changed[2] = 0.5
    d.failure_points.add(threshold=0.9, reached=True, level=1, accuracy=0.8, ci95_low=0.4,
                         ci95_high=0.96, fraction_of_pixels_changed=0.25, example_image="img2")
    d.failure_points.add(threshold=0.5, reached=True, level=2, accuracy=0.4, ci95_low=0.1,
                         ci95_high=0.8, fraction_of_pixels_changed=0.5, example_image="img4")
    d.failure_points.add(threshold=0.1, reached=False)
    return d


def _tests(attack_names: tuple[str, str]) -> list[report_pb2.TestDefinition]:
    tests = []
    for name, sigma in zip(CORRUPTIONS, (0.08, 0.12), strict=True):
        t = report_pb2.TestDefinition(
            name=name, kind=report_pb2.TEST_KIND_CORRUPTION, perturbation_id=name,
            family="noise", refs=["IEEE-A1"], levels=[1, 2], images=M)
        for lv in (1, 2):
            row = t.level_parameters.add(level=lv)
            row.values.add(name="sigma", number=sigma * lv)
            row.values.add(name="kernel", text="w*h//50")
        tests.append(t)
    deg = report_pb2.TestDefinition(name=OPERATOR, kind=report_pb2.TEST_KIND_DEGRADATION,
                                    perturbation_id=OPERATOR, family="blur", refs=["DEG-1"],
                                    levels=[1, 2], images=M)
    for lv in (1, 2):
        deg.level_parameters.add(level=lv).values.add(name="sigmas",
                                                      numbers=perturbation_pb2.NumberList(
                                                          values=[0.5 * lv, 0.5 * lv]))
    tests.append(deg)
    transfer = report_pb2.TestDefinition(
        name=attack_names[0], kind=report_pb2.TEST_KIND_TRANSFER_ATTACK, perturbation_id="fgsm",
        family="gradient", refs=["IEEE-A7"], surrogate="fmnist-surrogate", epsilon=0.03,
        norm="linf", images=M)
    transfer.params.add(name="epsilon", number=0.03)
    query = report_pb2.TestDefinition(
        name=attack_names[1], kind=report_pb2.TEST_KIND_SCORE_ATTACK, perturbation_id="square",
        family="score-based", refs=["IEEE-A8"], epsilon=0.03, norm="linf", query_budget=500,
        images=4)
    query.params.add(name="epsilon", number=0.03)
    query.params.add(name="max_queries", integer=500)
    return [*tests, transfer, query]


def _characterise(test: report_pb2.TestDefinition) -> None:
    """Fill a Characterisation whether its fields are strings or enums (typed lately)."""
    c = test.characterisation
    for field, word in (("scope", "global"), ("randomness", "stochastic"), ("domain", "pixel")):
        fd = c.DESCRIPTOR.fields_by_name[field]
        if fd.enum_type is None:
            setattr(c, field, word)
        else:
            match = [v.number for v in fd.enum_type.values if v.name.lower().endswith(word)]
            setattr(c, field, match[0] if match else 0)


def make_parts(*, transfer: str = TRANSFER, query: str = QUERY) -> report_pb2.ReportParts:
    """The realistic parts; ``transfer``/``query`` rename the attacks (e.g. "<script>")."""
    names = (transfer, query)
    metrics = scoring_pb2.ScoreEvaluationResponse(
        ieee=_ieee(names), ranking=_ranking(names), degradation=[_degradation()],
        query_errors=scoring_pb2.QueryErrors(total=1, settings=[scoring_pb2.SettingErrors(
            name=query, errors=1, of=4, examples=["img3: target unreachable <after retries>"])]))
    tests = _tests(names)
    for t in tests[:2]:
        _characterise(t)
    return report_pb2.ReportParts(
        plan_text=PLAN_TEXT,
        target=report_pb2.TargetReport(
            name="mobilenet <b>v2</b>", model_name="fmnist-target",
            task=common_pb2.TASK_TYPE_CLASSIFICATION,
            endpoint="https://user:hunter2@vision.example.com/v1/predict?api_key=sk-SECRET"
                     "&region=eu",
            output_kind=common_pb2.OUTPUT_KIND_FULL_SCORES, labels_count=10, version="2024-05",
            input_height=28, input_width=28, input_channels=1,
            correctness=scoring_pb2.CorrectnessRule(mode=scoring_pb2.CORRECTNESS_MODE_TOP1, k=5,
                                                    threshold=0.5)),
        roles=report_pb2.Roles(
            requester=report_pb2.Party(name="Acme Retail", organisation="Acme"),
            tester=report_pb2.Party(name="Dana <QA>", organisation="QA Lab"),
            provider=report_pb2.Party(name="Vision Inc.", organisation="Vision")),
        environment=report_pb2.Environment(python="3.11.7", platform="Linux", fortis="0.1.0",
                                           torch="2.13.0+cpu", numpy="2.4.6", seed=1234),
        metrics=metrics, tests=tests,
        ledger=report_pb2.LedgerSummary(
            sessions={"ev-42/clean": 6, "ev-42/corruptions": 24, "ev-42/degradation": 12,
                      f"ev-42/attack/{transfer}": 6, f"ev-42/attack/{query}/00000/a1": 1186},
            total_queries=1234, aborted_attempt_sessions={}, aborted_attempt_queries=0),
        evaluation=report_pb2.EvaluationInfo(
            evaluation_id="ev-42", start_time=timestamp_pb2.Timestamp(seconds=1735812000),
            end_time=timestamp_pb2.Timestamp(seconds=1735812330, nanos=500_000_000), images=M,
            dataset=report_pb2.DatasetInfo(source="fashion-mnist", split="test", limit=6)))
