"""Export of a report to an MLflow tracking store (``--mlflow-uri``, ``fortis mlflow-export``).

One MLflow run per evaluation, in the experiment ``--mlflow-experiment`` (default: the plan's
name), named after the evaluation id:

    params     plan, target, evaluation_id, seed, dataset.<field>, corruptions (the ids),
               attacks.<name>.<id|surrogate|limit|params.<key>> (flattened)
    metrics    accuracy and its 95 % bounds, the averages and worst cases (IEEE-M1..M5),
               corruptions.<id>.<severity> and .mean (IEEE-M2, M7),
               attacks.<name>.<success_rate|robustness_adv|mean_queries|median_queries>
               (IEEE-M3, M6): the names the acceptance grammar uses
    tags       fortis.verdict (pass / fail / no_criteria), fortis.version, fortis.plan,
               fortis.target, fortis.evaluation_id
    artifacts  report.json, report.html and whatever else was written (PDF, JUnit XML)

Names are cut to MLflow's allowed characters (letters, digits, ``_ - . space``; anything else
becomes ``_``). The maintained ``mlflow`` client (``mlflow-skinny`` suffices) is imported only
here and only when asked for: ``pip install 'fortis[mlflow]'``. A ``file://`` URI (or a plain
folder) is MLflow's file store, which MLflow 3 keeps in maintenance mode and refuses unless
``MLFLOW_ALLOW_FILE_STORE`` is set: Fortis sets it for such a URI (unless already set);
``sqlite:///mlflow.db`` is MLflow's recommended local store.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any, Final

from fortis.server.cli.report_doc import mapping as _mapping
from fortis.server.cli.report_doc import number as _f

__all__ = ["MlflowExportError", "export_report", "metrics_of", "params_of", "sanitize"]

_BAD: Final = re.compile(r"[^A-Za-z0-9_.\- ]")
_MAX_KEY: Final = 250
_MAX_PARAM: Final = 6000
_MAX_TAG: Final = 8000
_INSTALL: Final = "pip install 'fortis[mlflow]'"


class MlflowExportError(Exception):
    """The export could not be done (no mlflow client, a store that refused); the message says
    what to do."""


def sanitize(name: str) -> str:
    """``name`` in MLflow's allowed characters, never a path MLflow would refuse."""
    s = _BAD.sub("_", name)[:_MAX_KEY].strip() or "_"
    while ".." in s:
        s = s.replace("..", "._")
    return "_" + s[1:] if s.startswith(".") else s


def metrics_of(report: Mapping[str, Any]) -> dict[str, float]:
    """The report's metrics as MLflow metrics (module docstring), finite values only."""
    m = _mapping(report.get("metrics"))
    out: dict[str, float] = {}

    def put(name: str, value: Any) -> None:
        v = _f(value)
        if v is not None:
            out[sanitize(name)] = v

    acc = _mapping(m.get("accuracy"))
    put("accuracy", acc.get("value"))
    ci = acc.get("ci95")
    if isinstance(ci, Sequence) and len(ci) == 2:
        put("accuracy.ci95_low", ci[0])
        put("accuracy.ci95_high", ci[1])
    for name in ("average_robustness_corr", "average_robustness_adv",
                 "worstcase_robustness_corr", "worstcase_robustness_adv"):
        put(name, _mapping(m.get(name)).get("value"))
    for cid, node in _mapping(m.get("corruptions")).items():
        for sev, s in _mapping(node).items():
            put(f"corruptions.{cid}.{sev}", _mapping(s).get("robustness"))
    for name, a in _mapping(m.get("attacks")).items():
        a = _mapping(a)
        for key in ("success_rate", "robustness_adv", "mean_queries", "median_queries"):
            put(f"attacks.{name}.{key}", a.get(key))
    return out


def _flatten(prefix: str, value: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(value, Mapping):
        for k, v in value.items():
            yield from _flatten(f"{prefix}.{k}", v)
    else:
        yield prefix, value


def params_of(report: Mapping[str, Any]) -> dict[str, str]:
    """The run's parameters (module docstring) as strings."""
    plan = _mapping(report.get("plan"))
    ev = _mapping(report.get("evaluation"))
    env = _mapping(report.get("environment"))
    raw: list[tuple[str, Any]] = [
        ("plan", plan.get("name")), ("target", _mapping(report.get("target")).get("name")),
        ("evaluation_id", ev.get("id")), ("seed", env.get("seed", plan.get("seed")))]
    raw += list(_flatten("dataset", _mapping(ev.get("dataset"))))
    corruptions = [c.get("id") if isinstance(c, Mapping) else c
                   for c in plan.get("corruptions") or () if c]
    if corruptions:
        raw.append(("corruptions", ",".join(str(c) for c in corruptions)))
    for a in plan.get("attacks") or ():
        if not isinstance(a, Mapping):
            continue
        name = a.get("name") or a.get("id")
        for key in ("id", "surrogate", "limit"):
            if a.get(key) is not None:
                raw.append((f"attacks.{name}.{key}", a[key]))
        raw += list(_flatten(f"attacks.{name}.params", _mapping(a.get("params"))))
    out: dict[str, str] = {}
    for key, value in raw:
        if value is None:
            continue
        text = value if isinstance(value, str) else str(value)
        out[sanitize(key)] = text[:_MAX_PARAM]
    return out


def _version() -> str:
    try:
        return metadata.version("fortis")
    except metadata.PackageNotFoundError:
        return "unknown"


def _chunks(items: list[Any], n: int) -> Iterator[list[Any]]:
    for i in range(0, len(items), n):
        yield items[i:i + n]


def export_report(report: Mapping[str, Any], *, uri: str, experiment: str | None = None,
                  artifacts: Sequence[Path] = (), verdict: Mapping[str, Any] | None = None
                  ) -> tuple[str, str]:
    """Log ``report`` as one MLflow run in ``experiment`` at tracking ``uri``; returns
    (experiment id, run id). Raises MlflowExportError with what to do."""
    try:
        from mlflow.entities import Metric, Param, RunTag
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient
    except ImportError:
        raise MlflowExportError(f"the MLflow export needs the mlflow client: {_INSTALL}") \
            from None
    if not uri:
        raise MlflowExportError("mlflow_uri: give the tracking store's URI, e.g. "
                                "file:///tmp/mlruns or sqlite:///mlflow.db")
    if uri.startswith("file:") or ("://" not in uri and not uri.startswith("sqlite:")):
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    # a new SQLite store logs its schema migrations at INFO: keep pipeline logs to the point
    for noisy in ("mlflow", "alembic"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING,
                                              logging.getLogger(noisy).getEffectiveLevel()))
    plan = _mapping(report.get("plan"))
    ev = _mapping(report.get("evaluation"))
    name = (experiment or str(plan.get("name") or "fortis"))[:200]
    verdict = verdict if verdict is not None else _mapping(report.get("verdict"))
    finished = _f(ev.get("finished"))
    stamp = int((finished if finished is not None else time.time()) * 1000)
    tags = {"fortis.version": _version(), "fortis.plan": str(plan.get("name") or ""),
            "fortis.target": str(_mapping(report.get("target")).get("name") or ""),
            "fortis.evaluation_id": str(ev.get("id") or ""),
            "fortis.verdict": str(verdict.get("status") or "no_criteria")}
    try:
        client = MlflowClient(tracking_uri=uri)
        exp = client.get_experiment_by_name(name)
        exp_id = exp.experiment_id if exp is not None else client.create_experiment(name)
        run = client.create_run(exp_id, run_name=str(ev.get("id") or "fortis")[:200])
        run_id = run.info.run_id
        metrics = [Metric(k, v, stamp, 0) for k, v in metrics_of(report).items()]
        params = [Param(k, v) for k, v in params_of(report).items()]
        tag_list = [RunTag(k, v[:_MAX_TAG]) for k, v in tags.items()]
        for chunk in _chunks(metrics, 1000):
            client.log_batch(run_id, metrics=chunk)
        for chunk in _chunks(params, 100):
            client.log_batch(run_id, params=chunk)
        client.log_batch(run_id, tags=tag_list)
        for path in artifacts:
            if path.is_file():
                client.log_artifact(run_id, str(path))
        client.set_terminated(run_id)
    except MlflowException as exc:
        raise MlflowExportError(f"the MLflow store at {uri} refused the export: "
                                f"{str(exc)[:500]}") from None
    except OSError as exc:
        raise MlflowExportError(f"cannot write to the MLflow store at {uri}: {exc}") from None
    return exp_id, run_id
