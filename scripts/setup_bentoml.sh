#!/usr/bin/env bash
# Idempotent set-up of .venv-bentoml: BentoML 1.4.40, the real server that
# tests/integration/test_bentoml.py runs (`bentoml serve` of tests/fixtures/bentoml/) and
# queries over its HTTP API (the bentoml:// target).
#
# A venv of its own so that BentoML's many dependencies (pydantic, starlette, uvicorn,
# opentelemetry, ...) never touch Fortis's .venv. The fixture service scores images with
# numpy, so no torch here. Called by scripts/setup.sh; safe to run again (a stamp file
# records what was installed; a changed list reinstalls).
#
#   scripts/setup_bentoml.sh            # create or update .venv-bentoml
#   PYTHON=python3.11 scripts/setup_bentoml.sh
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${BENTOML_VENV:-.venv-bentoml}

REQUIREMENTS=(
  "bentoml==1.4.40"
  "numpy>=1.26,<3"
  "pillow>=10"
)
NAME=bentoml BINARY=bentoml WHAT="BentoML 1.4.40"
export BENTOML_DO_NOT_TRACK=true   # the check below imports it
CHECK=$(cat <<'PY'
import bentoml, numpy, PIL  # noqa: F401
assert bentoml.__version__.startswith("1.4.40"), bentoml.__version__
PY
)
# shellcheck source=scripts/server_venv.sh
. scripts/server_venv.sh
server_venv
