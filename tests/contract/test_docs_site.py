"""The documentation: a short README that points into docs/, and a MkDocs site that builds.

Why: the README is a newcomer's first five minutes, so it stays short and every link in it must
lead somewhere; the detail lives in docs/, built as a site by MkDocs. Built with ``--strict``
and with every validation MkDocs offers raised to a warning (mkdocs.yml), a link between pages
that points nowhere, an anchor that no heading makes, or a page left out of the nav fails the
build, and so this test. The build runs MkDocs itself (``python -m mkdocs``), offline: the
built-in theme, no plugins.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
CONFIG = ROOT / "mkdocs.yml"
README_MAX_LINES = 200
#: The two set-up commands the README promises, exactly (Makefile runs them).
SETUP_LINES = (
    "make demo   # installs what it needs into .venv, then evaluates the demo plan -> "
    "demo-out/report.{json,html}",
    "make test   # installs what it needs into .venv, then runs the whole test suite",
)

#: A Markdown link or image: [text](target) / ![alt](target); the target up to a space or ")".
LINK = re.compile(r"!?\[(?:[^\]]|\n)*?\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
CODE_SPAN = re.compile(r"`[^`\n]*`")


def build(config: Path, site_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
         "--site-dir", str(site_dir)],
        cwd=config.parent, capture_output=True, text=True, timeout=300)


def warnings_of(result: subprocess.CompletedProcess[str]) -> list[str]:
    out = result.stdout + result.stderr
    return [line for line in out.splitlines() if line.startswith(("WARNING", "ERROR"))]


def nav_pages(nav: object) -> list[str]:
    """Every page file a nav names, however deep its sections."""
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [page for item in nav for page in nav_pages(item)]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in nav_pages(value)]
    return []


def links_in(markdown: str) -> list[str]:
    """Link targets of a Markdown text, leaving out fenced code and code spans (examples)."""
    text = CODE_SPAN.sub("", FENCE.sub("", markdown))
    return LINK.findall(text)


def _slugs(markdown: str) -> set[str]:
    """Anchors a heading makes, as GitHub writes them (the README's readers) and as MkDocs'
    toc extension does (the site's): both lower-case, drop punctuation, hyphenate spaces;
    MkDocs also folds runs of hyphens."""
    out: set[str] = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", FENCE.sub("", markdown), re.M):
        plain = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
        github = re.sub(r"[^\w\- ]", "", plain).replace(" ", "-")
        out.add(github)
        out.add(re.sub(r"-{2,}", "-", github))
    return out


def broken_relative_links(markdown_file: Path) -> list[str]:
    """Relative links of a Markdown file that lead to no file, or to no heading of it."""
    broken = []
    for target in links_in(markdown_file.read_text(encoding="utf-8")):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):      # http:, https:, mailto: ...
            continue
        path_part, _, anchor = target.partition("#")
        dest = (markdown_file.parent / path_part).resolve() if path_part else markdown_file
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _slugs(
                dest.read_text(encoding="utf-8")):
            broken.append(f"{target}: no heading makes #{anchor}")
    return broken


def test_readme_is_a_short_read() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) < README_MAX_LINES, (
        f"README.md has {len(lines)} lines; keep it under {README_MAX_LINES} and move the "
        "detail to a page under docs/")
    for command in SETUP_LINES:
        assert command in lines, f"the README's set-up command is gone or changed: {command}"


def test_every_relative_link_in_the_readme_resolves() -> None:
    assert not broken_relative_links(README), broken_relative_links(README)


def test_the_readme_link_check_catches_a_broken_link(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("# A page\n\n## Some section\n")
    readme = tmp_path / "README.md"
    readme.write_text(
        "[ok](docs/page.md) [ok too](docs/page.md#some-section) [web](https://example.org)\n"
        "`[in code](docs/gone.md)`\n\n```\n[in a fence](docs/gone.md)\n```\n"
        "[gone](docs/gone.md) [no anchor](docs/page.md#nowhere)\n")
    assert broken_relative_links(readme) == [
        "docs/gone.md: no such file", "docs/page.md#nowhere: no heading makes #nowhere"]


def test_every_page_under_docs_is_in_the_nav() -> None:
    config = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
    assert config["docs_dir"] == "docs"
    in_nav = nav_pages(config["nav"])
    on_disk = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
    assert sorted(set(in_nav)) == on_disk
    assert len(in_nav) == len(set(in_nav)), "a page is listed twice in the nav"
    # the checks that make a broken link fail the build must stay on (info would pass it)
    validation = config["validation"]
    for group, keys in (("nav", ("omitted_files", "not_found", "absolute_links")),
                        ("links", ("not_found", "anchors", "absolute_links",
                                   "unrecognized_links"))):
        for key in keys:
            assert validation[group][key] == "warn", f"validation.{group}.{key}"


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    result = build(CONFIG, tmp_path / "site")
    assert result.returncode == 0 and not warnings_of(result), (
        "mkdocs build --strict failed:\n" + "\n".join(warnings_of(result))
        + (result.stdout + result.stderr)[-3000:])
    assert (tmp_path / "site" / "index.html").is_file()


def test_a_broken_link_between_pages_fails_the_build(tmp_path: Path) -> None:
    """The same site with one page linking to a missing page and to a missing heading, and
    one page left out of the nav: the strict build must refuse each."""
    shutil.copytree(DOCS, tmp_path / "docs")
    shutil.copy(CONFIG, tmp_path / "mkdocs.yml")
    with (tmp_path / "docs" / "index.md").open("a", encoding="utf-8") as f:
        f.write("\n[gone](no-such-page.md) [no heading](features.md#no-such-heading)\n")
    (tmp_path / "docs" / "orphan.md").write_text("# Not in the nav\n")
    result = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert result.returncode != 0
    found = "\n".join(warnings_of(result))
    assert "no-such-page.md" in found, found
    assert "no-such-heading" in found, found
    assert 'not included in the "nav"' in found, found       # the pages are listed below it
    assert "- orphan.md" in result.stdout + result.stderr
