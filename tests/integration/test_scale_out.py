"""The scale-out test: three proxy replicas, two worker
processes (each with ``JOB_COMPLETION_INDEX``), PostgreSQL and Redis on loopback, one
evaluation of the demo plan. SPEC: IEEE-M6 (queries counted per image at the proxy, read from
the ledger: QNC and Q_m), CAN-9 (deterministic, resumable work items: the same metrics
whoever computes them), the exact per-target rate limit at the target.

Everything is real and in its own process, as the Helm chart deploys it, on 127.0.0.1:

- PostgreSQL (``tests/infra/postgres.py``, a fresh database migrated with ``fortis db
  upgrade``) holds the evaluation store and the proxy ledger; Redis
  (``tests/infra/redis_server.py``) holds the rate limits and budgets;
- three ``fortis serve --service proxy --database-url --redis-url`` replicas (one Redis
  namespace: the limits hold in total) in front of one gRPC target of the test's own
  (``tests/e2e/_crash_target.py``: the Fashion-MNIST CNN, recording every image it receives
  with its SHA-256 and arrival time), limited to ``LIMIT`` images/s at the proxies
  (``?rate=LIMIT`` on the target URL);
- ``fortis serve --service evaluation --executor processes --worker-processes 2`` (two
  ``fortis worker`` processes per evaluation, ``JOB_COMPLETION_INDEX`` 0 and 1, sharing the
  work items through claims in PostgreSQL), and ``--service perturbation`` (query attacks run
  there and call the proxy), ``scoring`` and ``report``, each its own process;
- the evaluation service, its workers and the perturbation service reach the proxies through
  one ``ipv4:127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3`` target: gRPC's round_robin over the
  three replicas, balanced per call (the loopback analogue of the chart's headless Service
  and ``dns:///`` name).

The plan is the demo's (``fortis demo``: ``server/cli/plans/demo.yaml``), every stage of it
kept: the clean pass, all 13 corruptions at 5 severities, the transfer attacks (FGSM, PGD)
and the query attacks (Square, HSJA). To fit CI on 2 cores it runs on fewer images: the
dataset ``limit`` is 32 (the demo: 500) and the query attacks' own ``limit``s 8 and 4 images
(the demo: 100 and 50), their budgets (Q_m) unchanged. The reference is the same plan, same
seed and evaluation id, run by one in-process stack in the embedded mode (SQLite, the
evaluation service's own threads, no Redis, no rate limit) against a second recording target
over the same network.

Checked:
- the evaluation SUCCEEDED and its metrics equal the single-process run's;
- the PostgreSQL ledger's sent rows are exactly the images the target received (the same
  (image id, SHA-256) multiset), its answered rows per session are the queries the report
  states (IEEE-M6), and as many images as the single-process run sent;
- every replica served calls (its own Prometheus counter and its ledger rows), spread about
  evenly; both workers ran items, named with their completion index, and each worker's
  calls, like the perturbation service's query attacks, reached all three replicas (the
  ledger row's replica, joined with the item's worker);
- no 1-second window of arrivals at the target holds more than ``LIMIT`` images, while the
  same work from one process without a limit puts more than ``LIMIT`` in one second (so the
  limit was what held it back). Checked once by hand: with each replica in its own Redis
  namespace (not sharing the limit) the busiest second at the target was 384 > 150 and the
  test failed; with the evaluation service (so its workers) given one replica instead of
  the list, each worker reached 1 replica and the others served only the query attacks
  (593 of 4945 images each): it failed too.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import yaml
from fortis.client import FortisClient, progress_of
from fortis.infra.storage import sqldb
from fortis.services.evaluation.keys import StageName, WorkItemKey
from fortis.services.proxy.ledger import max_in_window

from tests.conftest import API_KEY
from tests.e2e._crash_target import RecordingTarget, start_target

TENANT = "tenant-a"
INTERNAL_KEY = "scale-out-internal-key"
EVALUATION = "ev-scale"
TARGET = "fmnist-cnn"
#: Images/s the target accepts (at the proxies, in total). Below what the stack sends without
#: a limit (checked in the test), above one call of the plan's batch (32 images).
LIMIT = 150
REPLICAS = 3
WORKERS = 2
#: The demo plan's sizes cut for CI (see the module docstring); one chunk per setting at the
#: plan's batch size (64), so a corruption item is one call.
DATASET_LIMIT = 32
ATTACK_LIMITS = {"square": 8, "hsja": 4}


def scaled_demo_plan() -> str:
    """The shipped demo plan (every stage), on fewer images, its target the test's own."""
    plan = yaml.safe_load(resources.files("fortis.server.cli").joinpath("plans/demo.yaml").read_text())
    plan["dataset"]["limit"] = DATASET_LIMIT
    plan["target"] = {"name": TARGET, "task": plan["target"]["task"]}   # served by the proxies
    for attack in plan["attacks"]:
        if attack["id"] in ATTACK_LIMITS:
            attack["limit"] = ATTACK_LIMITS[attack["id"]]
    assert plan["corruptions"] and {a["id"] for a in plan["attacks"]} >= {
        "fgsm", "pgd", "square", "hsja"} and plan["execution"]["batch_size"] >= DATASET_LIMIT, \
        "the demo plan changed: revisit this test"
    return yaml.safe_dump(plan, sort_keys=False)


class Served:
    """One ``fortis serve`` process; stdout goes to a file (read for the ready line) so its
    log lines never fill a pipe and stall it."""

    def __init__(self, name: str, tmp: Path, args: list[str], env: dict[str, str]) -> None:
        self.name = name
        tmp.mkdir(parents=True, exist_ok=True)
        self.out, self.err = tmp / "stdout.log", tmp / "stderr.log"
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "fortis.server.cli", "serve", "--address", "127.0.0.1:0",
                 "--state-dir", str(tmp / "state"), "--log-level", "warning", *args],
                cwd=tmp, env={**os.environ, **env}, stdout=out, stderr=err,
                start_new_session=True)     # its worker processes are in its group
        self.ready: dict[str, Any] = {}

    def wait_ready(self, timeout_s: float = 120.0) -> Served:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in self.out.read_text().splitlines():
                if line.startswith("{") and '"address"' in line and '"services"' in line:
                    self.ready = json.loads(line)
                    return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(f"{self.name} did not start: {self.err.read_text()[-3000:]}")

    @property
    def address(self) -> str:
        return str(self.ready["address"])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


def proxy_queries(metrics_port: int) -> float:
    """Images this replica sent to the target: its ``fortis_proxy_queries_total``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(float(m.group(1)) for m in re.finditer(
        r"^fortis_proxy_queries_total\{[^}]*\} (\S+)$", text, re.MULTILINE))


def run_plan(address: str, plan: str) -> dict[str, Any]:
    with FortisClient(address, api_key=API_KEY, timeout_s=120) as fc:
        fc.submit(plan, evaluation_id=EVALUATION)
        final = fc.wait(EVALUATION, timeout_s=600)
        assert progress_of(final).state == "SUCCEEDED", progress_of(final)
        return dict(fc.report(EVALUATION))


@pytest.fixture(scope="module")
def reference(tmp_path_factory: Any, fmnist_target: Any, fmnist_surrogate: Any
              ) -> tuple[dict[str, Any], RecordingTarget]:
    """The plan run by one process in the embedded mode, and what its target received."""
    from fortis.server.app.stack import StackSettings, TargetConfig, start_stack

    server, address, target = start_target(fmnist_target)
    stack = start_stack(StackSettings(
        state_dir=tmp_path_factory.mktemp("single") / "state", api_keys={API_KEY: TENANT},
        targets=[TargetConfig.parse(f"{TARGET}=grpc://{address}")],
        internal_key="single-internal-key"))
    try:
        return run_plan(stack.address, scaled_demo_plan()), target
    finally:
        stack.stop(0)
        server.stop(0)


@pytest.fixture()
def recording(fmnist_target: Any) -> Iterator[tuple[str, RecordingTarget]]:
    server, address, target = start_target(fmnist_target)
    yield address, target
    server.stop(0)


def start_scaled_stack(tmp: Path, target_address: str, database_url: str, redis_url: str
                       ) -> tuple[list[Served], list[Served]]:
    """(the proxy replicas, the other services); the evaluation service is the last one."""
    env = {"FORTIS_API_KEYS": f"{API_KEY}={TENANT}", "FORTIS_INTERNAL_KEY": INTERNAL_KEY,
           "FORTIS_DATABASE_URL": database_url, "FORTIS_REDIS_URL": redis_url}
    started: list[Served] = []
    try:
        proxies = [Served(f"proxy {k}", tmp / f"proxy{k}", [
            "--service", "proxy", "--no-default-targets", "--metrics-port", "0",
            "--target", f"{TARGET}=grpc://{target_address}?rate={LIMIT}",
            "--redis-namespace", "scale-out"], env) for k in range(REPLICAS)]
        started += proxies
        others = [Served(s, tmp / s, ["--service", s], env) for s in ("scoring", "report")]
        started += others
        for p in proxies:
            p.wait_ready()
        # every replica, as one target: gRPC balances the calls over them (round_robin)
        proxy_list = "ipv4:" + ",".join(p.address for p in proxies)
        perturbation = Served("perturbation", tmp / "perturbation", [
            "--service", "perturbation", "--proxy-address", proxy_list], env)
        started.append(perturbation)
        for s in (*others, perturbation):
            s.wait_ready()
        evaluation = Served("evaluation", tmp / "evaluation", [
            "--service", "evaluation", "--executor", "processes",
            "--worker-processes", str(WORKERS), "--proxy-address", proxy_list,
            "--perturbation-address", perturbation.address,
            "--scoring-address", others[0].address, "--report-address", others[1].address], env)
        started.append(evaluation)
        evaluation.wait_ready()
        return proxies, [*others, perturbation, evaluation]
    except BaseException:
        for s in started:
            s.stop()
        raise


@pytest.mark.slow
def test_three_replicas_two_workers_postgres_redis_equal_the_single_process_run(
        tmp_path: Path, postgres_url: str, redis_server: Any,
        recording: tuple[str, RecordingTarget],
        reference: tuple[dict[str, Any], RecordingTarget]) -> None:
    ref_report, ref_target = reference
    address, target = recording
    up = subprocess.run([sys.executable, "-m", "fortis.server.cli", "db", "upgrade"],
                        env={**os.environ, "FORTIS_DATABASE_URL": postgres_url},
                        capture_output=True, text=True, timeout=120)
    assert up.returncode == 0, up.stderr[-2000:]
    proxies, services = start_scaled_stack(tmp_path, address, postgres_url, redis_server.url)
    try:
        t0 = time.monotonic()
        report = run_plan(services[-1].address, scaled_demo_plan())
        seconds = time.monotonic() - t0
        per_replica = [proxy_queries(int(p.ready["metrics_port"])) for p in proxies]
    finally:
        for s in (*services, *proxies):
            s.stop()

    engine = sqldb.create_engine(postgres_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.text(
                "SELECT session_id, origin, image_id, input_sha256, status, error, owner,"
                " call_id FROM queries WHERE tenant=:t AND session_id LIKE :s"),
                {"t": TENANT, "s": f"{EVALUATION}/%"}).all()
            items = {str(k): str(o) for k, o in conn.execute(sa.text(
                "SELECT item_key, lease_owner FROM items WHERE evaluation_id=:e AND done"),
                {"e": EVALUATION}).all()}
    finally:
        engine.dispose()
    sent = [r for r in rows if not r.error.startswith("not sent:")]
    arrivals = target.arrivals()
    times = [a.at for a in arrivals]
    busiest, ref_busiest = max_in_window(times, 1.0), max_in_window(
        [a.at for a in ref_target.arrivals()], 1.0)
    item_owners = Counter(items.values())
    calls_by_owner = Counter(r.owner for r in {(r.owner, r.call_id): r for r in sent}.values())
    # which replicas (ledger owners) each worker's calls reached: a corruption item is one
    # call (one chunk per setting), its rows carry the origin "<corruption>@<severity>"
    replica_of = {r.origin: r.owner for r in sent if r.session_id == f"{EVALUATION}/corruptions"}
    reached: dict[str, set[int]] = {}
    for name, worker in items.items():
        key = WorkItemKey.parse(name)
        if key.stage is StageName.CORRUPTIONS:
            reached.setdefault(worker, set()).add(replica_of[f"{key.setting}@{key.level}"])
    # and the perturbation service's query attacks (one image per call)
    query_replicas = {r.owner for r in sent if "/attack/square/" in r.session_id
                      or "/attack/hsja/" in r.session_id}
    print(json.dumps({"seconds": round(seconds, 1), "received": len(arrivals),
                      "single_received": ref_target.count(), "busiest_second": busiest,
                      "single_busiest_second": ref_busiest, "limit": LIMIT,
                      "queries_by_replica": per_replica,
                      "calls_by_ledger_owner": sorted(calls_by_owner.values()),
                      "items_by_worker": dict(item_owners),
                      "replicas_reached_by_worker": {w: len(o) for w, o in reached.items()},
                      "replicas_reached_by_query_attacks": len(query_replicas)}))

    # the same measurements as one process computes (CAN-9)
    assert report["metrics"] == ref_report["metrics"]
    # the ledger is what the target received, image by image (IEEE-M6) ...
    assert not [r for r in rows if r.status in ("IN_FLIGHT", "INTERRUPTED")], "rows left open"
    assert Counter((r.image_id, r.input_sha256) for r in sent) == Counter(
        (a.image_id, a.sha256) for a in arrivals)
    assert len(arrivals) == ref_target.count() > 0
    # ... and the answered rows are the queries the report states, session by session
    answered = Counter(r.session_id for r in rows if r.status == "OK")
    assert {s: int(n) for s, n in report["ledger"]["sessions"].items()} == dict(answered)
    assert report["ledger"]["sessions"] == ref_report["ledger"]["sessions"]
    # every replica served calls, about evenly (round_robin per call; a replica left out,
    # or workers pinned to one replica each, would show here)
    assert sum(per_replica) == len(arrivals), per_replica
    assert len(per_replica) == REPLICAS and min(per_replica) >= len(arrivals) / (2 * REPLICAS)
    assert len(calls_by_owner) == REPLICAS, calls_by_owner
    assert min(calls_by_owner.values()) >= sum(calls_by_owner.values()) / (2 * REPLICAS)
    # both workers ran items, each named with its JOB_COMPLETION_INDEX, and each worker's
    # calls, like the perturbation service's, reached every replica (one ipv4: list,
    # balanced per call; a worker given one replica of the list would reach only that one)
    workers = sorted(o for o in item_owners if o)
    assert [o.rsplit("-", 1)[-1] for o in workers] == [f"i{i}" for i in range(WORKERS)], workers
    assert {w: len(o) for w, o in reached.items()} == {w: REPLICAS for w in workers}, reached
    assert len(query_replicas) == REPLICAS, query_replicas
    # the rate limit held in total at the target; without it the same work goes faster
    assert ref_busiest > LIMIT, "the load does not reach the limit: the check would be vacuous"
    assert busiest <= LIMIT, (busiest, LIMIT)
