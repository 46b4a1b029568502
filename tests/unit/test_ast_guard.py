"""``ast_guard``: parses from several threads never fail (CPython 3.11, gh-106905).

The failure is reproduced as it happened in a resumed evaluation (fresh-clone CI): four
threads parse while the garbage collector runs finalizers that let another thread in. Each
case runs in its own interpreter (the guard patches ``ast.parse`` process-wide). Without the
guard this interpreter raises ``SystemError: AST constructor recursion depth mismatch``
(checked here, so the test shows the guard is what removes it); with it, never.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RACE = """
import ast, gc, json, sys, threading, time
if sys.argv[1] == "guarded":
    from fortis.services.common import ast_guard
    ast_guard.install()
    ast_guard.install()                              # idempotent
src = "\\n".join(f"def f{i}(a, b=[1, {{'k': (3, 4)}}]):\\n    return [x for x in a if x > b[0]]"
                for i in range(20))
class Yield:
    def __init__(self):
        self.me = self                               # a cycle: only the collector frees it
    def __del__(self):
        time.sleep(0)                                # lets another thread run
gc.set_threshold(50, 1, 1)
errors = []
def work():
    for _ in range(300):
        junk = [Yield() for _ in range(20)]
        del junk
        try:
            ast.parse(src)
            ast.literal_eval("{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }")
        except SystemError as exc:
            errors.append(str(exc))
            return
threads = [threading.Thread(target=work) for _ in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps(errors))
"""


def _race(mode: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", RACE, mode], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    return list(json.loads(out.stdout))


@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="reproduced on CPython 3.11, the "
                    "version Fortis runs on")
def test_the_race_is_real_on_this_interpreter():
    assert any("recursion depth mismatch" in e for e in _race("bare"))


def test_guarded_parses_never_fail():
    assert _race("guarded") == []
