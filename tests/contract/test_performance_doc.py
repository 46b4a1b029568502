"""docs/performance.md is generated from the benchmarks' saved runs, never typed: the page in
the repository is exactly what ``scripts/performance_table.py`` writes from bench/results, and
the generator reads goals and ratios wherever a benchmark prints them."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _generator():
    spec = importlib.util.spec_from_file_location("performance_table",
                                                  ROOT / "scripts" / "performance_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_page_is_what_the_saved_runs_give():
    gen = _generator()
    assert gen.main(["--check"]) == 0, "run: python scripts/performance_table.py"


def test_every_benchmark_file_is_listed():
    gen = _generator()
    files = {p.stem for p in (ROOT / "bench").glob("*.py") if not p.stem.startswith("_")}
    commands = {argv[0].removeprefix("bench/").removesuffix(".py")
                for argv in gen.BENCHMARKS.values()}
    assert files <= commands, f"benchmarks missing from the table: {sorted(files - commands)}"


def test_goals_found_at_any_depth_and_named_after_their_row(tmp_path):
    gen = _generator()
    out = {"goals": [{"name": "a", "ratio": 0.5, "target": ">= 0.8", "met": False}],
           "rows": [{"row": "square", "budget": 500,
                     "goals": [{"name": "compute", "ratio": 0.9, "target": "<= 1", "met": True}]}]}
    goals = gen.goals_in(out)
    assert [(g["name"], g["met"]) for g in goals] == [("a", False), ("square 500: compute", True)]
    (tmp_path / "proxy").mkdir()
    for i, ratio in enumerate((0.25, 0.75)):
        doc = {"benchmark": "proxy", "command": "python bench/proxy.py", "measured_at": f"T{i}",
               "output": {"goals": [{"name": "g", "ratio": ratio, "target": ">= 0.5",
                                     "met": ratio >= 0.5}]}}
        (tmp_path / "proxy" / f"{i}.json").write_text(json.dumps(doc))
    text = gen.page(tmp_path)
    assert "| g | >= 0.5 | 0.25 | 0.75 | yes |" in text
    assert "| [proxy](#proxy) | 2 | 1 of 1 |" in text


def test_ratios_of_a_benchmark_without_goals_and_json_after_progress_lines():
    gen = _generator()
    assert gen._json_of('progress 1\nprogress 2\n{"x_ratio": 2.5, "y": 1}') == {
        "x_ratio": 2.5, "y": 1}
    assert gen.ratios_in({"x_ratio": 2.5, "y": 1, "sub": {"z_ratio": 0.5, "flag": True}}) == [
        ("x_ratio", 2.5), ("sub.z_ratio", 0.5)]
