#!/usr/bin/env bash
# Idempotent set-up of .venv-mlflow: MLflow 3.17.2 (its pyfunc scoring server, `mlflow models
# serve`, the /invocations endpoint) as a real counterpart for the mlflow+http target tests.
#
# A venv of its own: MLflow pins pandas, pyarrow, scikit-learn, Flask, alembic, ... apart from
# Fortis's, and it is never a run-time dependency of Fortis (the adapter speaks plain HTTP/JSON).
# Called by scripts/setup.sh and by tests/integration/test_mlflow_pyfunc.py on first use; safe to
# run again (a stamp file records what was installed; changed requirements reinstall).
#
#   scripts/setup_mlflow.sh            # create or update .venv-mlflow
#   PYTHON=python3.11 scripts/setup_mlflow.sh
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${MLFLOW_VENV:-.venv-mlflow}
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3

# Pinned. 3.17.2: the newest MLflow whose mlflow-skinny/mlflow-tracing the package index here
# holds (mlflow 3.18.0's wheel is there, its mlflow-skinny==3.18.0 is not). The test models are
# numpy only (no torch: a second multi-GB install for nothing).
REQUIREMENTS=(
  "mlflow==3.17.2"
  "numpy>=1.26,<3"
)
want="$(printf '%s\n' "${REQUIREMENTS[@]}")"
stamp="$VENV/.fortis-mlflow-installed"

ready() { [ -x "$VENV/bin/mlflow" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; }
if ready; then
  echo "setup_mlflow: $VENV ready" >&2
  exit 0
fi
# One installer at a time (two test runs starting together wait for each other).
mkdir -p "$VENV"
if command -v flock >/dev/null 2>&1; then
  exec 9>"$VENV/.setup.lock"
  flock 9
  if ready; then
    echo "setup_mlflow: $VENV ready" >&2
    exit 0
  fi
fi
if [ ! -x "$VENV/bin/python" ]; then
  echo "setup_mlflow: creating $VENV ..." >&2
  "$PY" -m venv "$VENV"
fi
echo "setup_mlflow: installing MLflow 3.17.2 into $VENV ..." >&2
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "${REQUIREMENTS[@]}"
# Check the install really works before stamping it.
"$VENV/bin/python" - <<'PY'
import mlflow, mlflow.pyfunc, mlflow.pyfunc.scoring_server  # noqa: F401
assert mlflow.__version__ == "3.17.2", mlflow.__version__
PY
printf '%s' "$want" > "$stamp"
echo "setup_mlflow: $VENV ready" >&2
