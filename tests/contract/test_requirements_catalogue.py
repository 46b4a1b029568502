"""docs/requirements.md is the catalogue of the requirement IDs the repository cites.

Why: code, tests, protos, report templates and notes cite requirements by ID, but the document
that defined the IDs does not ship with Fortis. The catalogue is the one place a reader can
look an ID up, so it must cover every ID cited anywhere, and it must not list an ID that is not
a requirement (a typo there would send readers after a requirement that does not exist).

Plain text scanning only: no import of the services, so it stays fast and runs even where the
heavy dependencies are missing.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CATALOGUE = ROOT / "docs" / "requirements.md"

#: Where IDs are cited: the product's source, contracts, tests, benchmarks and notes.
SCAN_DIRS = ("core", "infra", "services", "server", "adapters", "clients", "tests", "bench", "protos", "docs")
SCAN_FILES = ("README.md",)
SCAN_SUFFIXES = (".py", ".md", ".proto", ".j2", ".yaml")
#: Installed or generated trees that are not ours to cite from.
SKIP_DIRS = {"node_modules", "__pycache__", ".venv", ".git", ".mypy_cache", ".pytest_cache",
             ".ruff_cache", ".hypothesis"}

#: The requirement IDs that exist: prefix -> highest number (each runs from 1). Kept here
#: because the defining document is not in the repository; a new requirement is added here
#: and in the catalogue together.
KNOWN_RANGES: Mapping[str, int] = {
    "IEEE-P": 6, "IEEE-M": 8, "IEEE-C": 5, "IEEE-A": 9,
    "DEG-": 5, "RANK-": 3, "CAN-": 10, "PER-": 5,
}
KNOWN: frozenset[str] = frozenset(f"{prefix}{n}" for prefix, top in KNOWN_RANGES.items()
                                  for n in range(1, top + 1))

#: A cited ID, as code and notes write it. Shorthands such as "IEEE-M2, M7" or "CAN-1..4"
#: count only their first, fully written ID. The lookahead changes no match (every ID starts
#: with one of those letters); it lets the regex engine skip ahead, halving the scan time.
CITED = re.compile(
    r"(?=[CDIPR])\b(IEEE-[PMCA][0-9]+|DEG-[0-9]+|RANK-[0-9]+|CAN-[0-9]+|PER-[0-9]+)\b")
#: Anything that looks like an ID in the place an entry's ID goes, so that a misspelt prefix
#: is caught as well as a wrong number.
_ID = r"[A-Z][A-Z0-9]*(?:-[A-Z]+)?-?[0-9]+"
ENTRY_ROW = re.compile(rf"^\|\s*[`*]*({_ID})[`*]*\s*\|")
ENTRY_HEADING = re.compile(rf"^#{{1,6}}\s+[`*]*({_ID})\b")


def _scanned_files() -> Iterable[Path]:
    for name in SCAN_FILES:
        path = ROOT / name
        if path.is_file():
            yield path
    for top in SCAN_DIRS:
        for dirpath, dirnames, filenames in os.walk(ROOT / top):
            dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
            for filename in filenames:
                if filename.endswith(SCAN_SUFFIXES):
                    yield Path(dirpath) / filename


def cited_ids(files: Iterable[Path], exclude: Path = CATALOGUE) -> dict[str, str]:
    """Cited ID -> the first place citing it ("path:line"), the catalogue itself left out
    (its own mentions are what the citations are checked against)."""
    where: dict[str, str] = {}
    for path in sorted(files):
        if path == exclude:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        # The whole text at once, a line number only for an ID's first hit: a per-line scan
        # costs more than the rest of the test together.
        for match in CITED.finditer(text):
            rid = match.group(1)
            if rid not in where:
                lineno = text.count("\n", 0, match.start()) + 1
                where[rid] = f"{path.relative_to(ROOT)}:{lineno}"
    return where


def catalogue_entries(text: str) -> dict[str, list[int]]:
    """ID -> the line numbers of its entries (a table row starting with the ID, or a heading)."""
    entries: dict[str, list[int]] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        match = ENTRY_ROW.match(line) or ENTRY_HEADING.match(line)
        if match:
            entries.setdefault(match.group(1), []).append(lineno)
    return entries


def missing_from_catalogue(cited: Mapping[str, str], entries: Mapping[str, object]) -> list[str]:
    """One line per cited ID without an entry, naming a file that cites it."""
    return [f"{rid} (cited in {cited[rid]}{'' if rid in KNOWN else '; not a known requirement'})"
            for rid in sorted(set(cited) - set(entries))]


def _entries() -> dict[str, list[int]]:
    return catalogue_entries(CATALOGUE.read_text(encoding="utf-8"))


def test_every_cited_id_has_a_catalogue_entry() -> None:
    missing = missing_from_catalogue(cited_ids(_scanned_files()), _entries())
    assert not missing, ("requirement IDs cited but not catalogued in docs/requirements.md "
                         "(add an entry, or fix the citation):\n  " + "\n  ".join(missing))


def test_every_catalogue_entry_is_a_known_requirement() -> None:
    unknown = [f"{rid} (docs/requirements.md:{lines[0]})"
               for rid, lines in sorted(_entries().items()) if rid not in KNOWN]
    assert not unknown, ("docs/requirements.md lists IDs that are not requirements "
                         "(a typo?):\n  " + "\n  ".join(unknown))


def test_catalogue_lists_every_requirement_once() -> None:
    entries = _entries()
    absent = sorted(KNOWN - set(entries))
    repeated = [f"{rid} (lines {', '.join(map(str, lines))})"
                for rid, lines in sorted(entries.items()) if len(lines) > 1]
    assert not absent, f"requirements without an entry in docs/requirements.md: {absent}"
    assert not repeated, f"requirements with more than one entry: {repeated}"


def test_every_id_the_catalogue_mentions_is_known() -> None:
    """Cross-references inside the catalogue's prose must point at real requirements too."""
    text = CATALOGUE.read_text(encoding="utf-8")
    bad = sorted({m.group(1) for m in CITED.finditer(text)} - KNOWN)
    assert not bad, f"docs/requirements.md mentions unknown IDs: {bad}"
