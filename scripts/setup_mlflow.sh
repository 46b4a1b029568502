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

# Pinned. 3.17.2: the newest MLflow whose mlflow-skinny/mlflow-tracing the package index here
# holds (mlflow 3.18.0's wheel is there, its mlflow-skinny==3.18.0 is not). The test models are
# numpy only (no torch: a second multi-GB install for nothing).
REQUIREMENTS=(
  "mlflow==3.17.2"
  "numpy>=1.26,<3"
)
NAME=mlflow BINARY=mlflow WHAT="MLflow 3.17.2"
CHECK=$(cat <<'PY'
import mlflow, mlflow.pyfunc, mlflow.pyfunc.scoring_server  # noqa: F401
assert mlflow.__version__ == "3.17.2", mlflow.__version__
PY
)
# shellcheck source=scripts/server_venv.sh
. scripts/server_venv.sh
server_venv
