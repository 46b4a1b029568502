#!/usr/bin/env python3
"""Install the packages of pyproject.toml's ``[tool.fortis.no-deps]`` groups with
``pip install --no-deps``.

    python scripts/install_no_deps.py GROUP... [--python PY]

Their metadata asks for things that would break the environment (an ancient torch pin, a
second CUDA torch through torchvision, opencv-python beside opencv-python-headless), so they
cannot be requirements or extras; this script is the one way scripts/setup.sh,
scripts/setup_vision.sh and the Dockerfile install them. ``PY`` (default: this interpreter)
is the Python whose environment receives them. Idempotent: packages already installed at the
pinned version are not reinstalled, and nothing runs when all are. Standard library only, so
it runs before anything is installed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"

# Asks the target interpreter which versions it has, since PY may be another environment.
_PROBE = """
import json, sys
from importlib.metadata import PackageNotFoundError, version
out = {}
for name in sys.argv[1:]:
    try:
        out[name] = version(name)
    except PackageNotFoundError:
        out[name] = None
print(json.dumps(out))
"""


def groups(pyproject: Path = PYPROJECT) -> dict[str, list[str]]:
    """The ``[tool.fortis.no-deps]`` table: group -> requirement strings (``name==version``)."""
    with pyproject.open("rb") as f:
        table = tomllib.load(f).get("tool", {}).get("fortis", {}).get("no-deps", {})
    return {str(k): [str(r) for r in v] for k, v in table.items()}


def _pin(req: str) -> tuple[str, str]:
    """``name==version`` -> (name, version); every entry must be pinned exactly, so an
    installed version can be compared and nothing moves between installs."""
    name, sep, ver = req.partition("==")
    if not sep or not name.strip() or not ver.strip():
        raise SystemExit(f"install_no_deps: '{req}' in [tool.fortis.no-deps] is not pinned "
                         "as name==version")
    return name.strip(), ver.strip()


def installed(python: str, names: list[str]) -> dict[str, str | None]:
    out = subprocess.run([python, "-c", _PROBE, *names], capture_output=True, text=True,
                         check=False)
    if out.returncode != 0:
        raise SystemExit(f"install_no_deps: cannot run {python}: {out.stderr.strip()[-500:]}")
    return json.loads(out.stdout)


def main(argv: list[str] | None = None) -> int:
    table = groups()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("groups", nargs="+", metavar="GROUP",
                    help=f"one or more of: {', '.join(table)}")
    ap.add_argument("--python", default=sys.executable,
                    help="the interpreter whose environment receives them (default: this one)")
    ns = ap.parse_args(argv)
    unknown = [g for g in ns.groups if g not in table]
    if unknown:
        ap.error(f"unknown group(s) {', '.join(unknown)}; known: {', '.join(table)}")
    wanted = dict(_pin(r) for g in dict.fromkeys(ns.groups) for r in table[g])
    have = installed(ns.python, list(wanted))
    todo = [f"{n}=={v}" for n, v in wanted.items() if have.get(n) != v]
    if not todo:
        print(f"install_no_deps: {', '.join(ns.groups)}: already installed", file=sys.stderr)
        return 0
    print(f"install_no_deps: pip install --no-deps {' '.join(todo)}", file=sys.stderr)
    rc = subprocess.run([ns.python, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                         "--no-deps", *todo], check=False).returncode
    if rc != 0:
        return rc
    left = [n for n, v in installed(ns.python, list(wanted)).items() if v != wanted[n]]
    if left:
        print(f"install_no_deps: still not at the pinned version: {', '.join(left)}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
