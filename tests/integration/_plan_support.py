"""Shared by the tests that run a whole plan (all five services) against one target scheme,
reusing the model server their module already started: a manifest of drawn images written
under the stack's data root, the plan, its run through the client SDK, and the ledger rows
of the sessions the plan opened, read back from the proxy.

The truth in each manifest is written by the test, image by image, from how it drew the
image; a few images are deliberately given a truth the target cannot match (another class,
a box elsewhere), so the clean accuracy the report must show is a fraction the test works out
from its own labels -- not 1.0, and not a number read from a previous run.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fortis.services.common.codec import encode_png
from google.rpc import code_pb2

from tests.conftest import API_KEY

Box = tuple[int, int, int, int]  # x1, y1, x2, y2 in pixels, x2 and y2 exclusive


def start_stack_with_data(state_dir: Path, data_root: Path, targets: dict[str, str]) -> Any:
    """All five services on one port, with ``targets`` and a data root for manifest plans."""
    from fortis.server.app.stack import StackSettings, TargetConfig, start_stack

    data_root.mkdir(parents=True, exist_ok=True)
    return start_stack(
        StackSettings(
            state_dir=state_dir,
            api_keys={API_KEY: "tenant-a"},
            data_root=data_root,
            targets=[TargetConfig.parse(f"{name}={url}") for name, url in targets.items()],
        )
    )


def _write_images(root: Path, folder: str, images: dict[str, np.ndarray]) -> None:
    (root / folder).mkdir(parents=True, exist_ok=True)
    for image_id, img in images.items():
        (root / folder / f"{image_id}.png").write_bytes(encode_png(img))


def _write_rows(root: Path, name: str, rows: list[dict[str, Any]]) -> str:
    (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return f"{name}.jsonl"


def classification_manifest(
    root: Path, name: str, items: Sequence[tuple[str, np.ndarray, int]]
) -> str:
    """PNGs and a JSON-lines manifest under ``root`` (image id, image, its truth label);
    returns the manifest's path relative to ``root``."""
    _write_images(root, name, {i: img for i, img, _ in items})
    rows = [{"id": i, "image": f"{name}/{i}.png", "labels": [label]} for i, _, label in items]
    return _write_rows(root, name, rows)


def detection_manifest(
    root: Path, name: str, items: Sequence[tuple[str, np.ndarray, list[tuple[int, Box]]]]
) -> str:
    """As :func:`classification_manifest`, with each image's truth objects (label, xyxy box)."""
    _write_images(root, name, {i: img for i, img, _ in items})
    rows = [
        {
            "id": i,
            "image": f"{name}/{i}.png",
            "box_format": "xyxy",
            "boxes": [list(b) for _, b in objects],
            "labels": [c for c, _ in objects],
        }
        for i, _, objects in items
    ]
    return _write_rows(root, name, rows)


#: One corruption at one severity: every image is sent once clean and once corrupted.
CORRUPTION = "corruptions: [{id: gaussian_noise, severities: [2]}]"
CORRUPTED_ORIGIN = "gaussian_noise@2"  # what the ledger records as who asked

#: IEEE-C4 for drawn boxes: a box the detector returns exactly matches at any IoU, one
#: elsewhere matches at none.
DETECTION = (
    "detection: {mode: threshold, iou_threshold: 0.9, confidence_threshold: 0.5, aggregate: all}"
)


def plan(name: str, target: str, task: str, manifest: str, extra: str = "") -> str:
    return (
        f"name: {name}\nseed: 11\n"
        "roles: {tester: {name: pytest, organisation: Fortis CI}}\n"
        f"target: {{name: {target}, task: {task}}}\n"
        f"dataset: {{source: manifest, path: {manifest}}}\n"
        f"{CORRUPTION}\n{extra}\n"
    )


@dataclass(frozen=True)
class PlanRun:
    evaluation_id: str
    report: dict[str, Any]
    #: report.json and report.html as written
    report_text: str
    #: The proxy's ledger rows of the plan's clean and corruption sessions.
    clean: list[Any]
    corrupted: list[Any]


def run_plan(address: str, plan_text: str, out_dir: Path, timeout_s: float = 120) -> PlanRun:
    """Submit ``plan_text``, wait for it to end, and require it to have SUCCEEDED (the
    evaluation's own error message otherwise); its report and its sessions' ledger rows."""
    from fortis.client import FortisClient, progress_of

    with FortisClient(address, api_key=API_KEY) as fc:
        ev = fc.submit(plan_text)
        final = fc.wait(ev.evaluation_id, timeout_s=timeout_s)
        assert progress_of(final).state == "SUCCEEDED", final.error.message
        js, html = fc.write_report(ev.evaluation_id, out_dir)
        eid = ev.evaluation_id
        return PlanRun(
            evaluation_id=eid,
            report=json.loads(js.read_text()),
            report_text=js.read_text() + html.read_text(),
            clean=list(fc.iter_ledger_entries(f"{eid}/clean")),
            corrupted=list(fc.iter_ledger_entries(f"{eid}/corruptions")),
        )


def check_ledger(run: PlanRun, target: str, image_ids: Sequence[str]) -> None:
    """The proxy's ledger holds exactly the queries the plan sent -- each image once clean and
    once corrupted (no other rows, no retries), all answered by ``target`` -- and the report
    counts the same two sessions and queries."""
    n = len(image_ids)
    for rows in (run.clean, run.corrupted):
        assert len(rows) == n, [r.image_id for r in rows]
        assert {r.target for r in rows} == {target}
        assert {(r.status, r.attempts) for r in rows} == {(code_pb2.OK, 1)}, [
            (r.image_id, r.status, r.error) for r in rows
        ]
    want = sorted(image_ids)
    assert sorted((r.image_id, r.origin) for r in run.clean) == [(i, "clean") for i in want]
    assert sorted((r.image_id, r.origin) for r in run.corrupted) == [
        (i, CORRUPTED_ORIGIN) for i in want
    ]
    eid = run.evaluation_id
    assert run.report["ledger"]["sessions"] == {f"{eid}/clean": n, f"{eid}/corruptions": n}


def check_no_secrets(run: PlanRun, secrets: Sequence[str]) -> None:
    """No credential the target was reached with is in the report or the ledger rows."""
    assert secrets, "no secrets to look for"
    rows = repr([r.raw for r in run.clean + run.corrupted])
    for x in secrets:
        assert x not in run.report_text and x not in rows


def check_accuracy(run: PlanRun, answered_right: Sequence[bool]) -> None:
    """The report's clean accuracy is the share of images whose truth the target's known
    answer matches (IEEE-M1 over all ``len(answered_right)`` images)."""
    acc = run.report["metrics"]["accuracy"]
    assert (acc["m"], acc["correct"]) == (len(answered_right), sum(answered_right)), acc
    assert acc["value"] == pytest.approx(sum(answered_right) / len(answered_right)), acc


# ---------------------------------------------------------------------------------------------
# The colour models of TorchServe, BentoML and Ray Serve (tests/fixtures/*: flat colours and
# coloured squares on black, classes in COLOURS order)
# ---------------------------------------------------------------------------------------------


def colour_classification_items() -> list[tuple[str, np.ndarray, int, bool]]:
    """(image id, flat-colour image, truth label, whether the colour model's answer -- the
    drawn colour -- matches it): two of six are labelled with another colour."""
    from tests.integration._model_server_support import COLOURS, flat

    names = list(COLOURS)
    truth = {
        "red": "red",
        "green": "green",
        "blue": "blue",
        "yellow": "yellow",
        "cyan": "blue",
        "magenta": "white",
    }
    return [(f"flat-{c}", flat(c), names.index(t), c == t) for c, t in truth.items()]


def colour_detection_items() -> list[tuple[str, np.ndarray, list[tuple[int, Box]], bool]]:
    """(image id, a coloured square on black, truth objects, whether the colour detector's
    answer -- the drawn square and its colour -- matches them): one truth box is elsewhere,
    one names another colour."""
    from tests.integration._model_server_support import COLOURS, square

    names = list(COLOURS)
    drawn: list[tuple[str, str, Box, str, Box]] = [
        ("sq-red", "red", (5, 7, 30, 40), "red", (5, 7, 30, 40)),
        ("sq-green", "green", (40, 2, 64, 12), "green", (40, 2, 64, 12)),
        ("sq-blue", "blue", (10, 20, 50, 46), "blue", (10, 20, 50, 46)),
        ("sq-elsewhere", "yellow", (2, 2, 20, 20), "yellow", (40, 26, 60, 46)),
        ("sq-other", "magenta", (30, 10, 60, 30), "cyan", (30, 10, 60, 30)),
    ]
    return [
        (i, square(c, box), [(names.index(tc), tbox)], (c, box) == (tc, tbox))
        for i, c, box, tc, tbox in drawn
    ]


def check_colour_plans(
    address: str,
    data_root: Path,
    out_dir: Path,
    classifier: str,
    detector: str,
    secrets: Sequence[str] = (),
) -> None:
    """A classification plan against ``classifier`` and a detection plan against
    ``detector``, each over the colour items above: both succeed, score what the drawn
    truth implies, leave exactly their queries in the ledger, and show none of ``secrets``."""
    cls = colour_classification_items()
    manifest = classification_manifest(
        data_root, f"{classifier}-cls", [(i, img, lab) for i, img, lab, _ in cls]
    )
    run = run_plan(
        address, plan(f"{classifier}-plan", classifier, "classification", manifest), out_dir / "c"
    )
    check_accuracy(run, [right for *_, right in cls])
    check_ledger(run, classifier, [i for i, *_ in cls])
    if secrets:
        check_no_secrets(run, secrets)

    det = colour_detection_items()
    manifest = detection_manifest(
        data_root, f"{detector}-det", [(i, img, objs) for i, img, objs, _ in det]
    )
    run = run_plan(
        address,
        plan(f"{detector}-plan", detector, "detection", manifest, DETECTION),
        out_dir / "d",
    )
    check_accuracy(run, [right for *_, right in det])
    check_ledger(run, detector, [i for i, *_ in det])
    if secrets:
        check_no_secrets(run, secrets)
