"""The quick slice of the catalogue matrix (``tests/matrix/catalogue.py``; the whole matrix is
``bench/matrix.py``): every perturbation and every attack of the registries, generated from
them, on the full-score classifier at the default batch size; every query attack on the
label-only (decision-based) or top-3 (score-based) classifier at batch 1; every query attack
on the Haar face detector at the largest batch; a few on the U2-Net-p segmenter with and
without per-pixel probabilities. Each cell: the evaluation succeeds, no image exceeds Q_m
(the ledger), the stored uint8 images respect the bound where the attack is bound-limited,
every reported success is confirmed by the target model itself, the report renders.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.matrix.catalogue import TARGETS, CellResult, Matrix, quick_profile, summary

# the module's fixture runs the whole slice within the first test: its time is that test's
pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow,
              pytest.mark.timeout(3000)]


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory, vision_setup: None,
           fmnist_target, fmnist_surrogate) -> Iterator[tuple[Matrix, list[CellResult]]]:
    import time

    t0 = time.monotonic()
    m = Matrix(quick_profile(), Path(tmp_path_factory.mktemp("matrix")))
    try:
        results = m.run()
        print(json.dumps(summary(results, time.monotonic() - t0, m.profile))[:3000])
        yield m, results
    finally:
        m.close()


def test_the_cells_come_from_the_registries(matrix) -> None:
    """Every registry entry has a cell on the full-score classifier; every query attack has
    one on a weaker classifier signal and on the detector (nothing hand-listed)."""
    from fortis.services.perturbation.attacks.registry import ATTACKS
    from fortis.services.perturbation.registry import PERTURBATIONS

    m, _ = matrix
    on = {(c.target, c.entry) for c in m.cells}
    for p in PERTURBATIONS.values():
        assert ("cnn", p.id) in on, p.id
    for a in ATTACKS.values():
        if a.id != "pertknob":
            assert ("cnn", a.id) in on, a.id
        if a.is_query_attack and a.id != "pertknob":
            weaker = "cnn-label" if a.kind == "decision" else "cnn-top3"
            assert (weaker, a.id) in on, a.id
            if a.supports_task("detection"):
                assert ("haar", a.id) in on, a.id
    targeted = {c.entry for c in m.cells if c.name.endswith("-targeted")}
    assert targeted == {a.id for a in ATTACKS.values() if a.targeted and a.id != "pertknob"}
    assert {c.batch for c in m.cells} == {"default", "1", "max"}


@pytest.mark.parametrize("target", [t.key for t in TARGETS])
def test_every_cell_of_the_slice_passes(matrix, target: str) -> None:
    _, results = matrix
    mine = [r for r in results if r.cell.target == target]
    assert mine, f"no cell on {target}"
    bad = [f"{r.cell.id}: {'; '.join(r.problems)}" for r in mine if not r.ok]
    assert not bad, "\n".join(bad)


def test_the_checks_fail_on_tampered_results(matrix) -> None:
    """The checks have teeth: a stored adversarial pushed past the bound, a budget smaller
    than what the ledger recorded, and a model that confirms no success are each caught."""
    import io

    import numpy as np
    from fortis.services.perturbation.attacks.registry import ATTACKS

    from tests.matrix.catalogue import TENANT

    m, results = matrix
    run = m.runs[("cnn", "default", "attacks")]
    cell = next(r.cell for r in results if r.cell.id == "cnn/default/square")
    store = run.stack.manager.store.for_tenant(TENANT)
    key = "adversarial/square-00000.npz"
    original = store.artifact(run.eid, key)
    with np.load(io.BytesIO(original)) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["adversarial_uint8"] = np.clip(
        arrays["adversarial_uint8"].astype(np.int16) + 60, 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    store.put_artifact(run.eid, key, buf.getvalue())
    try:
        assert any("bound" in p for p in run.check(cell))
    finally:
        store.put_artifact(run.eid, key, original)
    assert run.check(cell) == []
    assert run._budget(cell, 1), "the ledger holds more than one query per image"
    ids, adv = run._adversarials("square")
    spec = ATTACKS["square"]
    node = run.report["metrics"]["attacks"]["square"]
    assert node["successes"] > 0
    judge = run.data.judge
    run.data.judge = lambda *a: False
    try:
        assert run._successes(cell, spec, node, ids, adv)
    finally:
        run.data.judge = judge


def test_bench_matrix_runs_in_parts_with_a_progress_file(tmp_path: Path, fmnist_target,
                                                         fmnist_surrogate) -> None:
    """The whole matrix is hours: ``bench/matrix.py --progress FILE`` records each finished
    evaluation, and a second run with the same FILE reruns only what FILE lacks (here: the
    evaluation whose cells changed), printing one document over every cell."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    progress = tmp_path / "progress.jsonl"

    def run(entries: str) -> tuple[dict, str]:
        r = subprocess.run([sys.executable, str(root / "bench" / "matrix.py"), "--targets",
                            "cnn", "--batches", "1", "--entries", entries,
                            "--progress", str(progress)], capture_output=True, text=True,
                           timeout=600, cwd=root)
        assert r.returncode == 0, r.stderr[-3000:]
        return json.loads(r.stdout), r.stderr

    first, _ = run("gaussian_noise,fgsm")
    assert (first["cells"], first["failing"]) == (2, 0)
    assert len(progress.read_text().splitlines()) == 2
    second, log = run("gaussian_noise,fgsm,square")
    assert (second["cells"], second["failing"]) == (3, 0)
    assert "cnn batch=1 perturb: recorded" in log and "attacks: recorded" not in log
    lines = [json.loads(x) for x in progress.read_text().splitlines()]
    assert [x["group"] for x in lines] == [["cnn", "1", "perturb"], ["cnn", "1", "attacks"],
                                           ["cnn", "1", "attacks"]]
    assert len({x["commit"] for x in lines}) == 1


def test_every_plan_of_the_whole_matrix_passes_validation(tmp_path: Path, vision_setup: None
                                                           ) -> None:
    """Every evaluation of the whole matrix (bench/matrix.py), generated from the registries,
    is a plan the evaluation service accepts: an entry a task's plans refuse (geometric
    corruptions on a detector or segmenter move the objects but not the ground truth) is not
    generated for that task, rather than failing a whole evaluation hours into the run."""
    from fortis.server.app.stack import local_catalogue
    from fortis.services.evaluation.plan import load_plan

    from tests.matrix.catalogue import (
        FULL,
        classification_data,
        detection_data,
        generate,
        plan_text,
        segmentation_data,
        target_kind,
    )

    (tmp_path / "d").mkdir()
    (tmp_path / "s").mkdir()
    datas = {"classification": classification_data(8), "detection": detection_data(tmp_path / "d"),
             "segmentation": segmentation_data(tmp_path / "s")}
    shapes = {k: max((im.shape for im in d.images.values()), key=lambda s: s[0] * s[1])
              for k, d in datas.items()}
    groups: dict[tuple[str, str, str], list] = {}
    for cell in generate(FULL, shapes, "sha256:" + "0" * 64):
        groups.setdefault((cell.target, cell.batch, cell.group), []).append(cell)
    assert len(groups) == 36
    catalogue = local_catalogue()
    refused = {}
    for (key, batch, group), cells in groups.items():
        t = target_kind(key)
        try:
            load_plan(plan_text(cells, t, datas[t.task], 4, batch), catalogue)
        except Exception as exc:  # noqa: BLE001 - every refusal is listed
            refused[(key, batch, group)] = str(exc)[:300]
    assert not refused, refused
