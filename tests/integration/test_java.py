"""A Java client generated from the contracts drives an evaluation end to end.

Why: the protos are the language-neutral seam, and Java is where many callers live. The stubs
come from `buf generate --template buf.gen.java.yaml` (protoc's Java generator and grpc-java's
plugin, both from Debian; scripts/setup_java.sh installs them when missing), are compiled with
clients/java/example/FortisExample.java against Debian's jars in /usr/share/java, and the
example runs against the real stack: it submits a plan, follows WatchEvaluation to the end and
downloads the report; a refused plan gives exit 2 with each field of the server's
google.rpc.BadRequest, decoded in Java from the grpc-status-details-bin trailer.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import API_KEY
from tests.toolchains import ensure

ROOT = Path(__file__).resolve().parents[2]
BUF = ROOT / "node_modules" / ".bin" / "buf"
EXAMPLE = ROOT / "clients" / "java" / "example" / "FortisExample.java"
JARS = Path("/usr/share/java")
# What the generated code and the example compile against, and what a plaintext channel needs
# at run time besides (grpc-netty and the parts of Netty it uses).
COMPILE_JARS = ["protobuf", "grpc-api", "grpc-core", "grpc-stub", "grpc-protobuf",
                "grpc-protobuf-lite", "grpc-context", "guava", "perfmark-api",
                "geronimo-annotation-1.3-spec"]
RUNTIME_JARS = ["grpc-netty", "netty-buffer", "netty-codec", "netty-codec-http",
                "netty-codec-http2", "netty-common", "netty-handler", "netty-resolver",
                "netty-transport"]

# One clean pass and one corruption setting of 16 images: enough for every stage the client
# sees (submitted, progress, done, report) and quick on a loaded machine.
PLAN = """\
name: java-small
seed: 5
target: {name: fmnist-cnn, task: classification}
dataset: {source: fashion-mnist, split: test, limit: 16}
corruptions: [{id: gaussian_noise, severities: [1]}]
execution: {batch_size: 8}
"""
N_IMAGES = 16
BAD_PLAN = PLAN.replace("severities: [1]}]",
                        "severities: [9]}, {id: brightnes, severities: [1]}]")


def _classpath(names: list[str]) -> str:
    return ":".join(str(JARS / f"{n}.jar") for n in names)


@pytest.fixture(scope="session")
def java_toolchain() -> str:
    """The java binary, with protoc, grpc-java's plugin and the jars installed from Debian."""
    java = ensure("setup_java.sh", "java", "javac")
    missing = [n for n in COMPILE_JARS + RUNTIME_JARS if not (JARS / f"{n}.jar").exists()]
    assert not missing, f"jars missing from {JARS}: {missing}"
    return java


@pytest.fixture(scope="session")
def java_client(java_toolchain: str, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The command that runs FortisExample: generated once per test session, then reused."""
    if not BUF.is_file():
        pytest.fail(f"{BUF} is missing: run `npm ci` at the repository root")
    work = tmp_path_factory.mktemp("java-client")
    gen, classes = work / "gen", work / "classes"
    r = subprocess.run([str(BUF), "generate", "--template", "buf.gen.java.yaml", "-o", str(gen)],
                       cwd=ROOT / "protos", capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (gen / "ai/fortis/evaluation/v1/EvaluationServiceGrpc.java").exists()
    assert (gen / "com/google/rpc/BadRequest.java").exists()
    sources = sorted(str(p) for p in gen.rglob("*.java"))
    (work / "sources.txt").write_text("\n".join([*sources, str(EXAMPLE)]) + "\n")
    classes.mkdir()
    # C1 only and the serial collector: javac over ~430 generated files is mostly start-up
    # work, and this halves it on a small machine.
    r = subprocess.run(["javac", "-J-XX:TieredStopAtLevel=1", "-J-XX:+UseSerialGC", "-nowarn",
                        "-encoding", "UTF-8", "-d", str(classes),
                        "-cp", _classpath(COMPILE_JARS), f"@{work / 'sources.txt'}"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (classes / "FortisExample.class").exists()
    cp = f"{classes}:{_classpath(COMPILE_JARS + RUNTIME_JARS)}"
    return [java_toolchain, "-XX:TieredStopAtLevel=1", "-cp", cp, "FortisExample"]


def _run(cmd: list[str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_java_client_submits_watches_and_downloads_the_report(java_client, stack, tmp_path):
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN)
    out = tmp_path / "java-out"
    conn = ["--address", stack.address, "--api-key", API_KEY]
    r = _run(java_client, *conn, "--out", str(out), str(plan))
    assert r.returncode == 0, r.stdout + r.stderr
    submitted = re.search(r"^Evaluation (\S+) submitted \(plan 'java-small'\)$", r.stderr, re.M)
    assert submitted, r.stderr
    # progress lines from the WatchEvaluation stream, ending at done with every query counted
    progress = re.findall(r"^\[(\w+)\] (\d+)/(\d+) items, (\d+) queries", r.stderr, re.M)
    stages = [p[0] for p in progress]
    assert "corruptions" in stages and stages[-1] == "done", r.stderr
    _, items_done, items_total, queries = progress[-1]
    assert items_done == items_total != "0" and queries == str(2 * N_IMAGES), r.stderr
    done = json.loads(r.stdout.strip().splitlines()[-1])
    assert done["evaluation_id"] == submitted.group(1)
    assert done["state"] == "SUCCEEDED" and done["queries"] == 2 * N_IMAGES
    assert done["report_json"] == str(out / "report.json")
    report = json.loads((out / "report.json").read_text())
    assert report["evaluation"]["id"] == done["evaluation_id"]
    assert report["plan_text"] == PLAN                       # the YAML went as-is
    assert report["metrics"]["accuracy"]["m"] == N_IMAGES
    assert done["evaluation_id"] in (out / "report.html").read_text()

    # a refused plan: INVALID_ARGUMENT, each BadRequest field violation printed, exit 2
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD_PLAN)
    r = _run(java_client, *conn, "--out", str(tmp_path / "bad-out"), str(bad))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "the plan is invalid (INVALID_ARGUMENT)" in r.stderr
    assert re.search(r"^  corruptions\[0\]\.severities\[0\]: .*9", r.stderr, re.M), r.stderr
    assert re.search(r"^  corruptions\[1\]\.id: unknown corruption 'brightnes'", r.stderr,
                     re.M), r.stderr
    assert not (tmp_path / "bad-out").exists()

    # a wrong key: UNAUTHENTICATED, exit 1
    r = _run(java_client, "--address", stack.address, "--api-key", "wrong",
             "--out", str(tmp_path / "x"), str(plan))
    assert r.returncode == 1 and "UNAUTHENTICATED" in r.stderr, r.stdout + r.stderr
