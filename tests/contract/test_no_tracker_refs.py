"""Comments, docstrings and docs say why, not which ticket asked: the issue tracker's numbers
and a design document that does not ship with Fortis mean nothing to a reader of the
repository, and history belongs in git. Requirement IDs (IEEE-M1, CAN-7, ...) are the
exception: docs/requirements.md defines every one (tests/contract/test_requirements_catalogue.py).

Plain text scanning only, like the catalogue check."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCAN_DIRS = ("core", "infra", "services", "server", "adapters", "clients", "scripts", "bench", "tests", "protos", "docs",
             "deploy")
SCAN_FILES = ("README.md", "Dockerfile", "Makefile")
SUFFIXES = (".py", ".md", ".proto", ".yaml", ".yml", ".j2", ".sh")
SKIP_DIRS = {"node_modules", "__pycache__", ".venv", ".git", "build", ".mypy_cache",
             ".pytest_cache", ".ruff_cache", ".hypothesis"}
#: "issue" or "finding" followed by a number, or the design document's name (the name is split
#: so that the pattern's own text does not match it)
REF = re.compile(r"\b(?:[Ii]ssues? #?\d+|[Ff]indings? #?\d+|DESIGN" + r"\.md)")


def _files() -> list[Path]:
    out = [ROOT / f for f in SCAN_FILES if (ROOT / f).exists()]
    for d in SCAN_DIRS:
        for p in (ROOT / d).rglob("*"):
            if (p.is_file() and p.suffix in SUFFIXES and not SKIP_DIRS & set(p.parts)
                    and p.resolve() != Path(__file__).resolve()):     # its own examples
                out.append(p)
    return out


def test_no_tracker_numbers_or_missing_design_doc_are_cited() -> None:
    hits = []
    for path in _files():
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if REF.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:120]}")
    assert not hits, "say why instead of citing the tracker:\n" + "\n".join(hits[:50])


def test_the_pattern_catches_what_it_is_for() -> None:
    for text in ("(issue 9)", "Issue 10: x", "finding 8", "issues 9 and 10", "DESIGN" + ".md"):
        assert REF.search(text), text
    for text in ("IEEE-M1", "an issuer", "findings", "test_bad_input_finding8.py"):
        assert not REF.search(text), text
