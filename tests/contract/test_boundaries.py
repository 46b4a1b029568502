"""Enforced service boundaries (docs/architecture.md, "Rules that keep the boundaries").

- The import-linter contracts in pyproject.toml ([tool.importlinter]) hold: the five services
  never import each other; services/common imports no service; services import neither the
  adapters nor the wiring (only server/app/stack.py and the CLI compose them); adapters reach the
  services only through services/common; the client distribution imports no server code and
  no numpy/torch/OpenCV.
- No import cycles: between any two packages of the tree, and between modules.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
ROOTS = ("fortis.core", "fortis.infra", "fortis.services", "fortis.adapters", "fortis.client",
         "fortis.server")


def test_import_contracts_hold():
    assert LINT_IMPORTS.exists(), "import-linter is missing: it is a dev dependency"
    r = subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    assert " 0 broken" in r.stdout.split("Contracts:")[-1], r.stdout[-2000:]


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph(*ROOTS, cache_dir=None)


def _sccs(nodes: set[str], edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for start in sorted(nodes):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in nodes:
                    continue
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(edges.get(nxt, ())))))
                elif nxt in on:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def _package_of(module: str, depth: int) -> str:
    return ".".join(module.split(".")[:depth])


def test_no_import_cycles_between_modules(graph):
    mods = {m for m in graph.modules if m.startswith(ROOTS)}
    edges = {m: {i for i in graph.find_modules_directly_imported_by(m) if i in mods} for m in mods}
    cycles = _sccs(mods, edges)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


@pytest.mark.parametrize("depth", [3, 4])
def test_no_import_cycles_between_packages(graph, depth):
    """e.g. depth 3: fortis.services.evaluation <-> fortis.services.perturbation; depth 4:
    subpackages such as fortis.services.evaluation.stages <-> .runner."""
    mods = {m for m in graph.modules if m.startswith(ROOTS)}
    pkgs = {_package_of(m, depth) for m in mods}
    edges: dict[str, set[str]] = {}
    for m in mods:
        src = _package_of(m, depth)
        for i in graph.find_modules_directly_imported_by(m):
            if i in mods and _package_of(i, depth) != src:
                edges.setdefault(src, set()).add(_package_of(i, depth))
    cycles = _sccs(pkgs, edges)
    assert not cycles, "package cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_contracts_cover_every_service():
    """A new service package must be added to the independence contract."""
    import tomllib
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    independent = set(cfg["contracts"][0]["modules"])
    services = {f"fortis.services.{p.name}" for p in (ROOT / "services").iterdir()
                if p.is_dir() and (p / "__init__.py").exists() and p.name != "common"}
    assert services == independent, services ^ independent


def _imported_names(path: Path) -> list[str]:
    """Every module a file imports, at any depth (``from a import b`` gives ``a`` and ``a.b``:
    b may be a module)."""
    import ast
    out: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.append(node.module)
            out += [f"{node.module}.{a.name}" for a in node.names]
    return out


def test_core_imports_messages_never_grpc_stubs():
    """import-linter sees the generated stubs (fortis.<area>.v1) as one external package, so
    this holds the rest of the core contract: of the fortis namespace, core imports itself, the
    error model and the fortis.common.v1 messages, never a *_pb2_grpc module (they import
    grpc) nor another area's stubs."""
    allowed = ("fortis.core", "fortis.client.errors", "fortis.common.v1")
    bad = [f"{p.relative_to(ROOT)}: {name}" for p in sorted((ROOT / "core").rglob("*.py"))
           for name in _imported_names(p)
           if name.split(".")[-1].endswith("_pb2_grpc") or name.split(".")[0] == "grpc"
           or (name.startswith("fortis.") and not name.startswith(allowed))]
    assert not bad, "core imports what the domain kernel must not:\n" + "\n".join(bad)
