"""How many target queries a plan will make, how long they take at least and what they cost,
before anything is sent (the model owner's queries are the scarce resource). Domain code: a
validated :class:`Plan`, the number of images it resolves to and plain numbers in; frozen
records out. No gRPC.

The counts follow the stages exactly (``stages/measure.py``, ``stages/attacks.py``): they are
*answered* queries, what the ledger counts per session and IEEE-M6 counts.

- clean, each corruption or style at each severity, each degradation operator at each level:
  one query per image (M), fixed;
- a transfer attack: one query per image it covers (``limit``: its first N images; every one
  of them is sent, whether the target got it right or not), fixed; with CAN-6 budget
  selection (``select_budget``) its selection session sends the first ``images`` of those
  once clean (fixed) and then, at each epsilon it tries, the ones the target got right: at
  most ``2 + max_steps`` epsilons (the start, one raise that fails or ``max_steps`` that
  succeed, then up to ``max_steps`` lowerings), so at most ``images x (3 + max_steps)``;
- a query attack: each image it covers may take up to its Q_m (``max_queries``), the clean
  query included, and no more: the proxy enforces Q_m per image over every attempt in the
  chunk's session (``per_image_budget``, retries and resumed attempts included) and the
  session's total (``query_budget`` = Q_m x images). The stage itself sends nothing else.
  So the upper bound is Q_m x images; nothing is fixed (an attack may stop at the clean
  query).

Retries of a call the target answered UNAVAILABLE are further attempts: the tenant's daily
quota counts them, the answered counts here do not (a query attack's retries stay within Q_m).

Under sequential acceptance (``sequential.py``) a setting a sequential criterion reads may
stop after its first chunk: it is a bound (one chunk fixed), and a setting the plan skips
counts nothing.

The expected number comes from a finished evaluation of the same plan by the same tenant: its
ledger counts per session (report.json ``ledger.sessions``) stand for the adaptive settings;
fixed settings are exact.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from fortis.services.evaluation.plan import Plan
from fortis.services.evaluation.ports import Catalogue
from fortis.services.evaluation.selection import SELECT_DEFAULTS
from fortis.services.evaluation.sequential import is_sequential, setting_statuses

__all__ = [
    "FIXED",
    "UPPER_BOUND",
    "Duration",
    "Price",
    "QueryEstimate",
    "SettingEstimate",
    "estimate_plan",
    "ledger_groups",
    "plan_settings",
    "report_section",
]

FIXED = "fixed"
UPPER_BOUND = "upper_bound"


@dataclass(frozen=True, kw_only=True)
class SettingEstimate:
    """One setting's queries: ``fixed`` (certain), ``upper_bound`` (the most the run can
    make; equal to ``fixed`` for a fixed setting) and ``expected`` (fixed, or a finished
    run's count; None when unknown)."""

    stage: str  # clean | corruptions | degradation | transfer_attacks |
    #                         budget_selection | query_attacks
    setting: str  # "clean", "gaussian_noise@3", "fgsm", "fgsm.select", "square"
    kind: str  # FIXED | UPPER_BOUND
    images: int
    per_image: int  # queries per image at most
    fixed: int
    upper_bound: int
    expected: int | None = None
    target: str = ""  # the model queried (multi-target plans run every model)
    #: the ledger sessions counting this setting's queries, relative to the evaluation id:
    #: "clean", "corruptions", "attack/fgsm", "attack/square/" (a prefix: one per chunk)
    ledger: str = ""


@dataclass(frozen=True, kw_only=True)
class Duration:
    """The least time the queries take under one limit: queries / rate."""

    limit: str  # "target <name>" | "tenant images per second"
    rate: float
    unit: str  # "images/s"
    seconds_fixed: float
    seconds_upper_bound: float


@dataclass(frozen=True, kw_only=True)
class Price:
    """``per_1000`` is a currency-less number per 1000 answered queries, as declared."""

    per_1000: float
    source: str  # "plan" (the target's endpoint) | "target" (the operator's)
    fixed: float
    upper_bound: float


@dataclass(frozen=True, kw_only=True)
class QueryEstimate:
    images: int
    batch_size: int
    settings: tuple[SettingEstimate, ...]
    fixed: int
    upper_bound: int
    expected: int | None
    expected_from: str = ""  # the finished evaluation the expected counts come from
    durations: tuple[Duration, ...] = ()
    price: Price | None = None
    tenant_queries_today: int = 0
    tenant_queries_per_day: int = 0  # 0 = no quota


def _covered(n_images: int, limit: int) -> int:
    return min(n_images, limit) if limit else n_images


def _one_per_image(stage: str, setting: str, n: int, target: str,
                   ledger: str) -> SettingEstimate:
    """A setting that sends each of its ``n`` images once: ``n`` queries, fixed."""
    return SettingEstimate(stage=stage, setting=setting, kind=FIXED, images=n, per_image=1,
                           fixed=n, upper_bound=n, expected=n, target=target, ledger=ledger)


def _single(plan: Plan, n: int, catalogue: Catalogue, target: str) -> list[SettingEstimate]:
    """The settings of a single-target plan, in the order the stages run them."""
    out = [_one_per_image("clean", "clean", n, target, "clean")]
    out += [_one_per_image("corruptions", f"{c.id}@{s}", n, target, "corruptions")
            for c in plan.corruptions for s in c.severities]
    out += [_one_per_image("degradation", f"{d.id}@{lv}", n, target, "degradation")
            for d in plan.degradation for lv in d.levels]
    transfer = [a for a in plan.attacks if not catalogue.attacks[a.id].is_query_attack]
    query = [a for a in plan.attacks if catalogue.attacks[a.id].is_query_attack]
    for at in transfer:
        k = _covered(n, at.limit)
        if at.select_budget:
            cfg = {**SELECT_DEFAULTS, **at.select_budget}
            m = min(int(cfg["images"]), k)
            tries = 2 + int(cfg["max_steps"])
            out.append(
                SettingEstimate(
                    stage="budget_selection",
                    setting=f"{at.name}.select",
                    kind=UPPER_BOUND,
                    images=m,
                    per_image=1 + tries,
                    fixed=m,
                    upper_bound=m * (1 + tries),
                    target=target,
                    ledger=f"attack/{at.name}.select",
                )
            )
        out.append(_one_per_image("transfer_attacks", at.name, k, target, f"attack/{at.name}"))
    for at in query:
        k = _covered(n, at.limit)
        q = int(at.params["max_queries"])
        out.append(
            SettingEstimate(
                stage="query_attacks",
                setting=at.name,
                kind=UPPER_BOUND,
                images=k,
                per_image=q,
                fixed=0,
                upper_bound=q * k,
                target=target,
                ledger=f"attack/{at.name}/",
            )
        )
    return out


def plan_settings(
    plan: Plan, n_images: int, catalogue: Catalogue, *, members: Sequence[tuple[Plan, str]] = ()
) -> list[SettingEstimate]:
    """Every setting's queries. A multi-target plan runs each model as its own single-target
    plan (``members``: those plans, from ``benchmark.member_runs``, each with the prefix of
    its ledger sessions; "" for the primary model's); each setting names its model."""
    if not plan.is_benchmark or not members:
        return _sequential(plan, n_images, _single(plan, n_images, catalogue, plan.target.name))
    out: list[SettingEstimate] = []
    for mp, prefix in members:
        out += [
            replace(s, ledger=prefix + s.ledger)
            for s in _single(mp, n_images, catalogue, mp.target.name)
        ]
    return out


def _sequential(plan: Plan, n_images: int,
                settings: list[SettingEstimate]) -> list[SettingEstimate]:
    """Under sequential acceptance (``sequential.py``) a setting a sequential criterion reads
    may stop after its first chunk: its count becomes a bound, its fixed part one chunk; a
    setting the plan skips (``unreferenced: skip``) sends nothing."""
    if not is_sequential(plan):
        return settings
    status = setting_statuses(plan, n_images)
    out = []
    for s in settings:
        st = status.get(s.setting, "full")
        if st == "skip":
            out.append(replace(s, kind=FIXED, fixed=0, upper_bound=0, expected=0))
        elif st == "open":
            first = min(plan.batch_size, s.images)
            out.append(replace(s, kind=UPPER_BOUND, expected=None,
                               fixed=first * s.per_image if s.fixed else 0))
        else:
            out.append(s)
    return out


def ledger_groups(sessions: Mapping[str, int], evaluation_id: str) -> dict[str, int]:
    """A finished run's answered queries per session (``<evaluation>/clean``,
    ``<evaluation>/attack/square/00001/a1``, ...) as counts per the ``ledger`` keys of
    :class:`SettingEstimate`: a query attack's chunk sessions summed under
    ``attack/<name>/``. Sessions of other evaluations are left out."""
    out: dict[str, int] = {}
    head = f"{evaluation_id}/"
    for sid, count in sessions.items():
        if not sid.startswith(head):
            continue
        rest = sid[len(head) :]
        parts = rest.split("/")
        key = f"attack/{parts[1]}/" if len(parts) == 4 and parts[0] == "attack" else rest
        out[key] = out.get(key, 0) + int(count)
    return out


def _with_expected(
    settings: Sequence[SettingEstimate], prior: Mapping[str, int] | None
) -> list[SettingEstimate]:
    """Fixed settings expect their fixed count; adaptive ones the finished run's count of
    their ledger sessions (None without one)."""
    out = []
    # settings sharing a session (sequential corruptions) share its count
    sharing: dict[str, int] = {}
    for s in settings:
        if s.kind != FIXED:
            sharing[s.ledger] = sharing.get(s.ledger, 0) + 1
    for s in settings:
        if s.kind == FIXED:
            out.append(replace(s, expected=s.fixed))
        else:
            got = None if prior is None else prior.get(s.ledger)
            if got is not None and sharing.get(s.ledger, 1) > 1:
                got = round(got / sharing[s.ledger])
            out.append(replace(s, expected=None if got is None else min(got, s.upper_bound)))
    return out


def _durations(
    settings: Sequence[SettingEstimate],
    target_rates: Mapping[str, float],
    tenant_rate: float,
) -> list[Duration]:
    """Lower bounds on the run's time under each limit the proxy paces the evaluation's
    queries by: a target's images/s on its own queries (models of a multi-target plan run
    one after the other) and the tenant's images/s on all (``--tenant-rate``). The tenant's
    calls/s (``--max-call-rate-per-tenant``) paces the tenant's own calls to the server, not
    the ones the evaluation service makes for it, so it bounds nothing here."""
    out = []
    fixed = sum(s.fixed for s in settings)
    upper = sum(s.upper_bound for s in settings)
    for name in dict.fromkeys(s.target for s in settings):
        rate = float(target_rates.get(name, 0.0))
        if rate > 0:
            mine = [s for s in settings if s.target == name]
            out.append(
                Duration(
                    limit=f"target {name}",
                    rate=rate,
                    unit="images/s",
                    seconds_fixed=sum(s.fixed for s in mine) / rate,
                    seconds_upper_bound=sum(s.upper_bound for s in mine) / rate,
                )
            )
    if tenant_rate > 0:
        out.append(
            Duration(
                limit="tenant images per second",
                rate=tenant_rate,
                unit="images/s",
                seconds_fixed=fixed / tenant_rate,
                seconds_upper_bound=upper / tenant_rate,
            )
        )
    return out


def _price(
    settings: Sequence[SettingEstimate], prices: Mapping[str, tuple[float, str]]
) -> Price | None:
    """The price of the queries when every model queried declares one (a partial sum would
    read as the whole); None otherwise."""
    targets = list(dict.fromkeys(s.target for s in settings))
    if not targets or any(t not in prices for t in targets):
        return None
    fixed = sum(s.fixed / 1000.0 * prices[s.target][0] for s in settings)
    upper = sum(s.upper_bound / 1000.0 * prices[s.target][0] for s in settings)
    per = {prices[t] for t in targets}
    first = prices[targets[0]]
    return Price(
        per_1000=first[0] if len(per) == 1 else math.nan,
        source=first[1] if len({p[1] for p in per}) == 1 else "mixed",
        fixed=fixed,
        upper_bound=upper,
    )


def estimate_plan(
    plan: Plan,
    n_images: int,
    catalogue: Catalogue,
    *,
    members: Sequence[tuple[Plan, str]] = (),
    prior: Mapping[str, int] | None = None,
    prior_from: str = "",
    target_rates: Mapping[str, float] | None = None,
    tenant_rate: float = 0.0,
    prices: Mapping[str, tuple[float, str]] | None = None,
    tenant_queries_today: int = 0,
    tenant_queries_per_day: int = 0,
) -> QueryEstimate:
    """The plan's queries (per setting and in total), the least time they take under each
    limit and their price. ``prior``: a finished run's counts per ledger key
    (:func:`ledger_groups`); ``prices``: per target name, (price per 1000 queries, where it
    was declared)."""
    settings = _with_expected(plan_settings(plan, n_images, catalogue, members=members), prior)
    expected: int | None = None
    if all(s.expected is not None for s in settings):
        expected = sum(int(s.expected or 0) for s in settings)
    return QueryEstimate(
        images=n_images,
        batch_size=plan.batch_size,
        settings=tuple(settings),
        fixed=sum(s.fixed for s in settings),
        upper_bound=sum(s.upper_bound for s in settings),
        expected=expected,
        expected_from=prior_from if prior is not None else "",
        durations=tuple(_durations(settings, target_rates or {}, tenant_rate)),
        price=_price(settings, prices or {}),
        tenant_queries_today=tenant_queries_today,
        tenant_queries_per_day=tenant_queries_per_day,
    )


def _group_rows(settings: Iterable[SettingEstimate]) -> list[tuple[str, str, str, int, str]]:
    """(stage, setting, kind, estimated, ledger key): one row per ledger key, in order.
    The settings of one stage that share a session (corruptions, degradation) are one row
    named by how many they are, since the ledger counts them together."""
    rows: dict[str, list[SettingEstimate]] = {}
    for s in settings:
        rows.setdefault(s.ledger, []).append(s)
    out = []
    for key, group in rows.items():
        first = group[0]
        kind = FIXED if all(s.kind == FIXED for s in group) else UPPER_BOUND
        name = first.setting if len(group) == 1 else f"{len(group)} settings"
        out.append((first.stage, name, kind, sum(s.upper_bound for s in group), key))
    return out


def report_section(
    est: QueryEstimate, sessions: Mapping[str, int], evaluation_id: str
) -> dict[str, Any]:
    """report.json's ``estimate``: the estimate made before the run beside what the run's
    ledger counted (answered queries per session, as the report's ``ledger`` section).
    ``per_setting`` has one row per ledger session group; ``estimated`` is the fixed count
    or the upper bound (``kind``)."""
    actual = ledger_groups(sessions, evaluation_id)
    return {
        "fixed": est.fixed,
        "upper_bound": est.upper_bound,
        "expected": est.expected,
        "per_setting": [
            {
                "stage": stage,
                "setting": name,
                "kind": kind,
                "estimated": estimated,
                "actual": actual.get(key, 0),
            }
            for stage, name, kind, estimated, key in _group_rows(est.settings)
        ],
        "total_actual": sum(int(v) for v in sessions.values()),
    }
