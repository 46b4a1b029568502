"""The report page in a real browser: a Fashion-MNIST plan with corruptions, a transfer attack
at two epsilons, a query attack, a degradation operator and acceptance criteria runs through the
real services on loopback; its report.html is opened in Debian's headless Chromium, driven over
the DevTools protocol (a websocket, no mocks):

- the page loads with no console error, no exception and no blocked resource (the page's
  Content-Security-Policy forbids everything but inline styles and data: images);
- every in-page link (``#anchor``) resolves to an element, and the page links nowhere else;
- every ``<img>`` decodes (``naturalWidth > 0``): the figures (IEEE-P4) and the example
  images (corruptions at each severity, attack triplets, DEG-4 failure points);
- the verdict and the key figures sit in the first screen (1400 x 900);
- under print media the navigation is hidden and collapsed sections print open;
- the PDF export (``fortis.server.cli.pdf.export_pdf``) writes a PDF with pages.

Screenshots of the top of the report and of one attack section are written to
``FORTIS_REPORT_SCREENSHOTS`` (a folder) when set; ``python -m tests.e2e.test_report_browser
REPORT.html OUT_DIR`` takes them of any report.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fortis.server.cli.pdf import chromium_binary, export_pdf

pytestmark = pytest.mark.usefixtures("one_thread")

WIDTH, HEIGHT = 1400, 900

PLAN = """
name: report-in-a-browser
seed: 7
roles:
  requester: {name: QA lead, organisation: Example Corp}
  tester: {name: pytest, organisation: Fortis CI}
  provider: {name: fmnist-cnn service, organisation: Example Corp}
target: {name: fmnist-cnn, task: classification}
dataset: {source: fashion-mnist, split: test, limit: 40}
correctness: {mode: top1}
acceptance:
  accuracy: ">= 0.5"
  corruptions.fog.mean: ">= 0.2"
  attacks.square.success_rate: "<= 0.95"
corruptions:
  - {id: gaussian_noise, severities: [1, 3, 5]}
  - {id: fog, severities: [1, 3, 5]}
degradation:
  - {id: global_blur, levels: [1, 4, 10, 20]}
attacks:
  - {id: fgsm, name: fgsm, surrogate: fmnist-surrogate, params: {epsilon: 0.1}}
  - {id: fgsm, name: fgsm_small, surrogate: fmnist-surrogate, params: {epsilon: 0.03}}
  - {id: square, params: {epsilon: 0.1, max_queries: 40}, limit: 8}
execution: {batch_size: 16}
"""


# --------------------------------------------------------------------------------------------
# a tiny DevTools-protocol client
# --------------------------------------------------------------------------------------------


class Chromium:
    """Headless Chromium with a throw-away profile, driven over the DevTools protocol
    (``--remote-debugging-port=0``; the port is read from ``DevToolsActivePort``)."""

    def __init__(self, binary: str, profile: Path, timeout_s: float = 60.0) -> None:
        import websocket  # websocket-client (a dependency of the kubernetes client)

        self.timeout_s = timeout_s
        self.proc = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--no-default-browser-check", "--disable-background-networking",
             "--disable-extensions", "--hide-scrollbars", "--mute-audio",
             f"--user-data-dir={profile}", "--remote-debugging-port=0",
             f"--window-size={WIDTH},{HEIGHT}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            start_new_session=True)
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + timeout_s
        while not (port_file.exists() and len(port_file.read_text().split()) >= 2):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError("Chromium did not open its DevTools port")
            time.sleep(0.1)
        port, path = port_file.read_text().split()[:2]
        self.ws = websocket.create_connection(f"ws://127.0.0.1:{port}{path}",
                                              timeout=timeout_s, suppress_origin=True)
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def send(self, method: str, params: dict[str, Any] | None = None,
             session: str | None = None) -> dict[str, Any]:
        self.next_id += 1
        msg: dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        self.ws.send(json.dumps(msg))
        while True:
            reply = json.loads(self.ws.recv())
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return dict(reply.get("result") or {})
            if "method" in reply:
                self.events.append(reply)

    def wait_for(self, method: str, session: str) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout_s
        seen = len(self.events)
        while time.monotonic() < deadline:
            for ev in self.events[seen:]:
                if ev.get("method") == method and ev.get("sessionId") == session:
                    return ev
            seen = len(self.events)
            self.events.append(json.loads(self.ws.recv()))
        raise TimeoutError(method)

    def open_page(self) -> str:
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.send(f"{domain}.enable", session=session)
        self.send("Emulation.setDeviceMetricsOverride",
                  {"width": WIDTH, "height": HEIGHT, "deviceScaleFactor": 1, "mobile": False},
                  session)
        return session

    def load(self, session: str, url: str) -> None:
        self.send("Page.navigate", {"url": url}, session)
        self.wait_for("Page.loadEventFired", session)

    def js(self, session: str, expression: str) -> Any:
        res = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                             "awaitPromise": True}, session)
        if "exceptionDetails" in res:
            raise RuntimeError(f"{expression[:60]}: {res['exceptionDetails']}")
        return res["result"].get("value")

    def screenshot(self, session: str, path: Path, clip: dict[str, float]) -> None:
        shot = self.send("Page.captureScreenshot",
                         {"format": "png", "clip": {**clip, "scale": 1},
                          "captureBeyondViewport": True}, session)
        path.write_bytes(base64.b64decode(shot["data"]))

    def errors(self, session: str) -> list[str]:
        """Console errors, uncaught exceptions and error log entries (a CSP violation, a
        resource that failed to load) of one page."""
        out = []
        for ev in self.events:
            if ev.get("sessionId") != session:
                continue
            method, p = ev.get("method"), ev.get("params") or {}
            if method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append("console: " + " ".join(str(a.get("value", a.get("description")))
                                                  for a in p.get("args") or []))
            elif method == "Runtime.exceptionThrown":
                out.append("exception: " + str(p.get("exceptionDetails", {}).get("text")))
            elif method == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                out.append("log: " + str(p["entry"].get("text")))
        return out

    def close(self) -> None:
        try:
            if getattr(self, "ws", None) is not None:
                try:
                    self.send("Browser.close")
                except Exception:  # noqa: BLE001 - the browser may already be gone
                    pass
                self.ws.close()
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def take_screenshots(browser: Chromium, session: str, out_dir: Path) -> dict[str, Path]:
    """report-top.png (the first screen) and report-attack.png (the first attack section,
    with its original / adversarial / difference images) of the page loaded in ``session``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    top = out_dir / "report-top.png"
    browser.js(session, "window.scrollTo(0, 0)")
    browser.screenshot(session, top, {"x": 0, "y": 0, "width": WIDTH, "height": HEIGHT})
    shots = {"top": top}
    box = browser.js(session, """(() => { const e = document.getElementById('attack-0');
        if (!e) return null; const r = e.getBoundingClientRect();
        return {y: r.top + window.scrollY, h: r.height}; })()""")
    if box:
        attack = out_dir / "report-attack.png"
        browser.screenshot(session, attack, {"x": 0, "y": max(0.0, box["y"] - 8),
                                             "width": WIDTH, "height": min(box["h"] + 16, 1600)})
        shots["attack"] = attack
    return shots


# --------------------------------------------------------------------------------------------
# the test
# --------------------------------------------------------------------------------------------


@pytest.fixture()
def browser(tmp_path: Path) -> Iterator[Chromium]:
    binary = chromium_binary()
    if binary is None:
        pytest.skip("Chromium is not installed (Debian: apt-get install chromium); the "
                    "browser checks of report.html need it")
    b = Chromium(binary, tmp_path / "profile")
    yield b
    b.close()


def _pdf_pages(data: bytes) -> int:
    """Page objects in a PDF (``/Type /Page``, not ``/Pages``)."""
    return len(re.findall(rb"/Type\s*/Page(?![a-zA-Z])", data))


def _run_plan(stack: Any) -> tuple[dict[str, Any], str]:
    from fortis.client import FortisClient, progress_of

    from tests.conftest import API_KEY

    with FortisClient(stack.address, api_key=API_KEY) as fc:
        ev = fc.submit(PLAN)
        final = fc.wait(ev.evaluation_id)
        assert progress_of(final).state == "SUCCEEDED", final.error.message
        report_json, report_html = fc.report_files(ev.evaluation_id)[:2]
    return json.loads(report_json), report_html


def test_report_in_a_real_browser(stack, browser: Chromium, tmp_path: Path) -> None:
    """IEEE-P4 report: loads clean, links resolve, images decode,
    verdict in the first screen, prints and exports to a PDF with pages."""
    report, html = _run_plan(stack)
    # the plan's parts are in the report (what the page below must show)
    m = report["metrics"]
    assert set(m["corruptions"]) == {"gaussian_noise", "fog"}
    assert {a["kind"] for a in m["attacks"].values()} >= {"transfer", "query"}
    assert "global_blur" in m.get("degradation", {})
    criteria = report.get("verdict", {}).get("criteria") or []
    assert len(criteria) == 3, report.get("verdict")
    page = tmp_path / "report.html"
    page.write_text(html, encoding="utf-8")

    session = browser.open_page()
    browser.load(session, page.as_uri())
    assert browser.errors(session) == []

    # every link is in-page and resolves; the nav lists only sections that exist
    links = browser.js(session, "Array.from(document.querySelectorAll('a[href]'))"
                                ".map(a => a.getAttribute('href'))")
    assert links and all(h.startswith("#") for h in links), links
    missing = browser.js(session, "Array.from(document.querySelectorAll('a[href^=\"#\"]'))"
                                  ".map(a => a.getAttribute('href').slice(1))"
                                  ".filter(id => !document.getElementById(id))")
    assert missing == []
    nav = browser.js(session, "Array.from(document.querySelectorAll('nav a'))"
                              ".map(a => a.getAttribute('href'))")
    for anchor in ("#summary", "#corruptions", "#attacks", "#degradation", "#tests"):
        assert anchor in nav, nav

    # every image decodes: figures and example images alike
    images = browser.js(session, """Promise.all(Array.from(document.images).map(i =>
        i.decode().then(() => [i.alt, i.naturalWidth, i.naturalHeight],
                        () => [i.alt, -1, -1])))""")
    assert images, "no images on the page"
    bad = [i for i in images if i[1] <= 0 or i[2] <= 0]
    assert not bad, bad
    alts = " ".join(i[0] for i in images)
    assert "Robustness against severity" in alts          # the corruption overview
    assert "Degradation profile of global_blur" in alts    # DEG-2..4
    assert "epsilon" in alts                               # fgsm at two epsilons
    if report.get("examples"):                             # example images (when produced)
        kinds = {e["kind"] for e in report["examples"]}
        assert "attack" in kinds and "corruption" in kinds
        assert sum("adversarial image" in i[0] for i in images) >= 1
        assert sum(" at severity " in i[0] for i in images) >= 1

    # the verdict and the key figures in the first screen at 1400 px
    browser.js(session, "window.scrollTo(0, 0)")
    boxes = browser.js(session, """['verdict', 'key-figures'].map(id => {
        const r = document.getElementById(id).getBoundingClientRect();
        return [id, r.top, r.bottom, r.width]; })""")
    for name, top, bottom, width in boxes:
        assert 0 <= top < bottom <= HEIGHT and width > 0, (name, top, bottom)
    verdict_text = browser.js(session, "document.getElementById('verdict').innerText")
    assert re.search(r"PASS|FAIL", verdict_text), verdict_text
    worst = browser.js(session, "document.querySelector('.callout').innerText")
    assert "Worst corruption" in worst

    shots = take_screenshots(browser, session,
                             Path(os.environ.get("FORTIS_REPORT_SCREENSHOTS") or tmp_path))
    assert shots["top"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # print media: no navigation, collapsed test definitions print open
    browser.send("Emulation.setEmulatedMedia", {"media": "print"}, session)
    printed = browser.js(session, """[getComputedStyle(document.querySelector('nav')).display,
        document.querySelector('details.test table').getBoundingClientRect().height]""")
    assert printed[0] == "none" and printed[1] > 0, printed
    assert browser.errors(session) == []

    # the PDF export
    pdf = export_pdf(page, tmp_path / "report.pdf")
    data = pdf.read_bytes()
    assert data[:5] == b"%PDF-" and _pdf_pages(data) >= 2


def test_pdf_export_refuses_clearly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No Chromium, or a page that is not there: a PdfExportError saying what to do, and
    no PDF left behind."""
    from fortis.server.cli.pdf import PdfExportError

    page = tmp_path / "report.html"
    page.write_text("<!DOCTYPE html><title>t</title><p>x</p>")
    monkeypatch.setenv("FORTIS_CHROMIUM", str(tmp_path / "no-such-browser"))
    with pytest.raises(PdfExportError, match="apt-get install chromium"):
        export_pdf(page, tmp_path / "out.pdf")
    assert not (tmp_path / "out.pdf").exists()
    monkeypatch.delenv("FORTIS_CHROMIUM")
    with pytest.raises(PdfExportError, match="cannot read"):
        export_pdf(tmp_path / "missing.html", tmp_path / "out.pdf")
    if chromium_binary() is None:
        pytest.skip("Chromium is not installed")
    pdf = export_pdf(page, tmp_path / "sub" / "out.pdf")
    assert _pdf_pages(pdf.read_bytes()) == 1
    assert [p.name for p in (tmp_path / "sub").iterdir()] == ["out.pdf"]


def main(argv: list[str]) -> int:
    """``python -m tests.e2e.test_report_browser REPORT.html OUT_DIR``: screenshots of a
    report (the first screen and the first attack section)."""
    if len(argv) != 2:
        print(main.__doc__, file=sys.stderr)
        return 2
    binary = chromium_binary()
    if binary is None:
        print("Chromium is not installed", file=sys.stderr)
        return 1
    profile = Path(tempfile.mkdtemp(prefix="fortis-shots-"))
    b = Chromium(binary, profile)
    try:
        session = b.open_page()
        b.load(session, Path(argv[0]).resolve().as_uri())
        for name, path in take_screenshots(b, session, Path(argv[1])).items():
            print(name, path)
        for e in b.errors(session):
            print("error:", e, file=sys.stderr)
    finally:
        b.close()
        shutil.rmtree(profile, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
