"""PDF export of ``report.html`` with headless Chromium's print-to-PDF.

The report page carries its own print stylesheet (A4, no navigation, figures kept whole);
this module prints a copy of it in which every collapsed ``<details>`` block (test
definitions, plan text, long tables) is opened, so the PDF holds the whole report. Chromium
runs headless with a throw-away profile, no network and no sandbox (it runs as the user
that asked, on a local file); the PDF is written next to its destination and renamed into
place, so a failed export never leaves a half-written file.

Debian's package is ``chromium`` (``apt-get install chromium``); ``FORTIS_CHROMIUM`` names
another binary (``google-chrome``, ``chromium-browser``).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Final

__all__ = ["PdfExportError", "chromium_binary", "export_pdf"]

#: Binaries tried in order when FORTIS_CHROMIUM is not set.
_CANDIDATES: Final = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
_DETAILS: Final = re.compile(r"<details(?=[\s>])(?![^>]*\sopen[\s>=])")


class PdfExportError(RuntimeError):
    """The PDF could not be made; the message says why and what to do."""


def chromium_binary() -> str | None:
    """The Chromium (or Chrome) binary to print with, or None when there is none."""
    named = os.environ.get("FORTIS_CHROMIUM")
    if named:
        return shutil.which(named) or (named if os.access(named, os.X_OK) else None)
    for name in _CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None


def _opened(html: str) -> str:
    """The page with every ``<details>`` open (the page's own text is escaped, so each
    ``<details`` is the template's markup)."""
    return _DETAILS.sub("<details open", html)


def export_pdf(html_path: Path, pdf_path: Path, *, timeout_s: float = 120) -> Path:
    """Print ``html_path`` (a report.html) to ``pdf_path`` with headless Chromium; returns
    ``pdf_path``. Raises :class:`PdfExportError` when Chromium is missing, fails, runs past
    ``timeout_s`` seconds or writes no PDF."""
    html_path, pdf_path = Path(html_path), Path(pdf_path)
    binary = chromium_binary()
    if binary is None:
        raise PdfExportError(
            "PDF export needs Chromium: install it (Debian/Ubuntu: apt-get install chromium) "
            "or set FORTIS_CHROMIUM to a Chromium or Chrome binary; report.html itself is "
            "complete and prints from any browser")
    try:
        html = html_path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PdfExportError(f"cannot read {html_path}: {exc}") from None
    pdf_path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="fortis-pdf-") as tmp:
        page = Path(tmp) / "report.html"
        page.write_text(_opened(html), encoding="utf-8")
        fd, name = tempfile.mkstemp(dir=pdf_path.parent, prefix=f".{pdf_path.name}.",
                                    suffix=".tmp")
        os.close(fd)
        out = Path(name)
        cmd = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
               "--no-default-browser-check", "--disable-background-networking",
               "--disable-extensions", "--disable-sync", "--mute-audio",
               f"--user-data-dir={Path(tmp) / 'profile'}", "--no-pdf-header-footer",
               f"--print-to-pdf={out}", page.as_uri()]
        try:
            _run(cmd, timeout_s, binary)
            data = out.read_bytes()[:5] if out.exists() else b""
            if data != b"%PDF-":
                raise PdfExportError(f"{binary} wrote no PDF for {html_path}")
            os.replace(out, pdf_path)
        finally:
            out.unlink(missing_ok=True)
    return pdf_path


def _run(cmd: list[str], timeout_s: float, binary: str) -> None:
    """Run Chromium in its own process group; on timeout the whole group is killed (the
    browser forks helpers that would outlive a killed parent)."""
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
    except OSError as exc:
        raise PdfExportError(f"cannot start {binary}: {exc}") from None
    try:
        _, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise PdfExportError(f"{binary} did not finish printing within {timeout_s:g} s") \
            from None
    if proc.returncode != 0:
        tail = err.decode("utf-8", "replace").strip().splitlines()[-5:]
        raise PdfExportError(f"{binary} failed (exit {proc.returncode}): " + " | ".join(tail))
