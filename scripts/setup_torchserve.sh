#!/usr/bin/env bash
# Idempotent set-up of .venv-torchserve: PyTorch TorchServe 0.12.0 and torch-model-archiver
# 0.12.0 with CPU torch 2.13.0, the real server tests/integration/test_torchserve.py archives
# a tiny model for and queries over its inference API (the torchserve:// target).
#
# A venv of its own so that TorchServe's dependencies never touch Fortis's .venv. The
# frontend is Java: a Java 11+ runtime must be on PATH (Debian default-jre-headless; the
# JDK that scripts/setup_java.sh installs has one). Called by scripts/setup.sh; safe to run
# again (a stamp file records what was installed; a changed list reinstalls).
#
#   scripts/setup_torchserve.sh            # create or update .venv-torchserve
#   PYTHON=python3.11 scripts/setup_torchserve.sh
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${TORCHSERVE_VENV:-.venv-torchserve}

# Everything pinned: torch must never float (an unpinned torch pulls a multi-GB CUDA build).
REQUIREMENTS=(
  "torchserve==0.12.0"
  "torch-model-archiver==0.12.0"
  "torch==2.13.0"
  "numpy>=1.26,<3"
  "pillow>=10"
  # The model workers import yaml (ts/async_service.py), which torchserve does not declare.
  "pyyaml>=6,<7"
)

java_ok() {
  command -v java >/dev/null 2>&1 || return 1
  local v
  v=$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n 1)
  [ -n "$v" ] && [ "$v" -ge 11 ]
}
if ! java_ok; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup_torchserve: installing default-jre-headless (Debian) ..." >&2
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq default-jre-headless >/dev/null
  else
    echo "setup_torchserve: TorchServe needs Java 11+: sudo apt-get install default-jre-headless" >&2
    exit 1
  fi
fi
NAME=torchserve BINARY=torchserve WHAT="TorchServe 0.12.0 and torch 2.13.0"
CHECK=$(cat <<'PY'
from importlib.metadata import version
import torch, ts, model_archiver, yaml  # noqa: F401
import ts.model_service_worker  # noqa: F401  (what each model worker runs)
assert version("torchserve") == "0.12.0", version("torchserve")
assert version("torch-model-archiver") == "0.12.0", version("torch-model-archiver")
assert torch.__version__.startswith("2.13.0"), torch.__version__
PY
)
# shellcheck source=scripts/server_venv.sh
. scripts/server_venv.sh
server_venv
