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

REQUIREMENTS=(
  "ray[serve]==2.60.0"
  "numpy>=1.26,<3"
  "pillow>=10"
)
NAME=rayserve BINARY=serve WHAT="Ray Serve 2.60.0"
CHECK=$(cat <<'PY'
import numpy, PIL, starlette  # noqa: F401
import ray
from ray import serve  # noqa: F401
assert ray.__version__ == "2.60.0", ray.__version__
PY
)
# shellcheck source=scripts/server_venv.sh
. scripts/server_venv.sh
server_venv
