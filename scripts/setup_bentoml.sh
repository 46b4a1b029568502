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
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3

REQUIREMENTS=(
  "bentoml==1.4.40"
  "numpy>=1.26,<3"
  "pillow>=10"
)
want="$(printf '%s\n' "${REQUIREMENTS[@]}")"
stamp="$VENV/.fortis-bentoml-installed"

ready() { [ -x "$VENV/bin/bentoml" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; }
if ready; then
  echo "setup_bentoml: $VENV ready" >&2
  exit 0
fi
# One installer at a time (two test runs starting together wait for each other).
mkdir -p "$VENV"
if command -v flock >/dev/null 2>&1; then
  exec 9>"$VENV/.setup.lock"
  flock 9
  if ready; then
    echo "setup_bentoml: $VENV ready" >&2
    exit 0
  fi
fi
if [ ! -x "$VENV/bin/python" ]; then
  echo "setup_bentoml: creating $VENV ..." >&2
  "$PY" -m venv "$VENV"
fi
echo "setup_bentoml: installing BentoML 1.4.40 into $VENV ..." >&2
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "${REQUIREMENTS[@]}"
# Check the install really works before stamping it.
BENTOML_DO_NOT_TRACK=true "$VENV/bin/python" - <<'PY'
import bentoml, numpy, PIL  # noqa: F401
assert bentoml.__version__.startswith("1.4.40"), bentoml.__version__
PY
printf '%s' "$want" > "$stamp"
echo "setup_bentoml: $VENV ready" >&2
