#!/usr/bin/env bash
# Idempotent set-up of .venv-rayserve: Ray 2.60.0 with Serve, the real server that
# tests/integration/test_rayserve.py runs (serve.run of tests/fixtures/rayserve/ on a local
# two-CPU Ray cluster) and queries over Serve's HTTP proxy (the rayserve:// target).
#
# A venv of its own so that Ray's dependencies (its own grpcio and protobuf, pydantic,
# starlette, uvicorn, ...) never touch Fortis's .venv. The fixture deployments score images
# with numpy, so no torch here. Safe to run again (a stamp file records what was installed; a
# changed list reinstalls). Run by scripts/setup.sh beside the other model servers (from a cold
# pip cache about 105 s on a loaded two-core machine).
#
#   scripts/setup_rayserve.sh            # create or update .venv-rayserve
#   PYTHON=python3.11 scripts/setup_rayserve.sh
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${RAYSERVE_VENV:-.venv-rayserve}
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3

REQUIREMENTS=(
  "ray[serve]==2.60.0"
  "numpy>=1.26,<3"
  "pillow>=10"
)
want="$(printf '%s\n' "${REQUIREMENTS[@]}")"
stamp="$VENV/.fortis-rayserve-installed"

ready() { [ -x "$VENV/bin/serve" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; }
if ready; then
  echo "setup_rayserve: $VENV ready" >&2
  exit 0
fi
# One installer at a time (two test runs starting together wait for each other).
mkdir -p "$VENV"
if command -v flock >/dev/null 2>&1; then
  exec 9>"$VENV/.setup.lock"
  flock 9
  if ready; then
    echo "setup_rayserve: $VENV ready" >&2
    exit 0
  fi
fi
if [ ! -x "$VENV/bin/python" ]; then
  echo "setup_rayserve: creating $VENV ..." >&2
  "$PY" -m venv "$VENV"
fi
echo "setup_rayserve: installing Ray Serve 2.60.0 into $VENV ..." >&2
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "${REQUIREMENTS[@]}"
# Check the install really works before stamping it.
"$VENV/bin/python" - <<'PY'
import numpy, PIL, starlette  # noqa: F401
import ray
from ray import serve  # noqa: F401
assert ray.__version__ == "2.60.0", ray.__version__
PY
printf '%s' "$want" > "$stamp"
echo "setup_rayserve: $VENV ready" >&2
