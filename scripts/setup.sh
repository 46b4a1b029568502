#!/usr/bin/env bash
# Idempotent set-up of a fresh machine for Fortis: data from Debian packages, a local venv
# with Fortis and its pinned dependencies, and buf (npm) for the contract lint.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3

# 1. Offline data: Fashion-MNIST and the darknet test photos (Debian packages).
if [ ! -f /usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz ] || [ ! -f /usr/share/darknet/data/eagle.jpg ]; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing dataset-fashion-mnist and darknet (Debian) ..." >&2
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist darknet >/dev/null
  else
    echo "setup: please run: sudo apt-get install dataset-fashion-mnist darknet" >&2
  fi
fi

# 1b. Redis (Debian redis-server): proxy replicas share rate limits and budgets through it
#     so limits hold across replicas; the tests start their own server on a free loopback port. Not needed by
#     `fortis serve` / `make demo`.
if ! command -v redis-server >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing redis-server (Debian) ..." >&2
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  else
    echo "setup: please run: sudo apt-get install redis-server" >&2
  fi
fi

# 1c. PostgreSQL (Debian postgresql): the evaluation store and proxy ledger at scale
#     (--database-url); the tests start their own cluster (initdb as the postgres user) on a free
#     loopback port. Not needed by `fortis serve` / `make demo` (SQLite files).
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing postgresql (Debian) ..." >&2
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
  else
    echo "setup: please run: sudo apt-get install postgresql" >&2
  fi
fi

# 1d. Chromium (Debian chromium): the report's PDF export (`fortis run --pdf`) and the tests
#     that open report.html in a real headless browser. Not needed by `make demo`.
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing chromium (Debian) ..." >&2
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "setup: please run: sudo apt-get install chromium" >&2
  fi
fi

# 1e. Container tools (Debian buildah, podman, mmdebstrap, runc): `make test` builds the image
#     and runs it, and runs the Helm chart's pods with `podman kube play`
#     (scripts/setup_containers.sh; skipped with a visible reason where they cannot run).
if [ -f scripts/setup_containers.sh ]; then
  bash scripts/setup_containers.sh || echo "setup: container tools unavailable; the image tests will skip" >&2
fi

# 2. Python venv with both distributions (editable) and their pinned dependencies (torch==2.13.0
#    CPU): fortis-client (clients/python: fortis.client + the contract stubs; grpcio + protobuf
#    only) and fortis (the server: services, adapters, the CLI), which depends on the former.
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv ..." >&2
  "$PY" -m venv .venv
fi
stamp=.venv/.fortis-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ setup.py -nt "$stamp" ] \
   || [ clients/python/pyproject.toml -nt "$stamp" ] || [ scripts/install_no_deps.py -nt "$stamp" ]; then
  echo "setup: installing Python dependencies into .venv ..." >&2
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  # One resolve for both, so fortis's requirement fortis-client==X is met by the local copy;
  # builtin-models: what the built-in targets and surrogates import (as the Dockerfile does).
  .venv/bin/python -m pip install -q -e ./clients/python -e ".[dev,builtin-models]"
  # The packages whose metadata would break this environment (an ancient torch pin, torchvision
  # and its CUDA torch, opencv-python beside our headless build): pyproject.toml's
  # [tool.fortis.no-deps] table, run time and the tests' references.
  .venv/bin/python scripts/install_no_deps.py --python .venv/bin/python runtime reference
  touch "$stamp"
fi

# 3. buf (protobuf lint/breaking/curl) from npm.
if command -v npm >/dev/null 2>&1 && [ ! -x node_modules/.bin/buf ]; then
  echo "setup: installing buf (npm) ..." >&2
  npm install --no-audit --no-fund --silent >/dev/null 2>&1 || npm install --no-audit --no-fund
fi
# 4. s3rver (npm, its own folder .s3rver/): the S3-compatible server the S3 dataset store tests
#    read from (scripts/setup_s3rver.sh; an emulator, as no real S3 server installs offline).
if command -v npm >/dev/null 2>&1; then
  bash scripts/setup_s3rver.sh >/dev/null || echo "setup: s3rver did not install; the S3 dataset tests will fail" >&2
fi
# 5. The model servers the target adapters are tested against, each in its own venv (never
#    .venv), installed side by side (mostly downloads, so together they take about as long as
#    the longest alone): MLServer 1.7.1 (OIP), MLflow 3.17.2, TorchServe 0.12.0 with CPU torch
#    (Java frontend: a JRE, from Debian if missing), BentoML 1.4.40 and Ray Serve 2.60.0. Not
#    needed by `fortis serve` / `make demo`: elsewhere a failure is reported and those tests skip,
#    naming the script; in CI (CI set) it fails the set-up, so the tests run there.
pids=()
for server in mlserver mlflow torchserve bentoml rayserve; do
  bash "scripts/setup_$server.sh" > ".setup-$server.log" 2>&1 &
  pids+=("$!:$server")
done
failed=""
for p in "${pids[@]}"; do
  if wait "${p%%:*}"; then
    rm -f ".setup-${p#*:}.log"
  else
    echo "setup: scripts/setup_${p#*:}.sh failed (its output: .setup-${p#*:}.log); its tests will skip" >&2
    failed=1
  fi
done
[ -z "$failed" ] || [ -z "${CI:-}" ] || exit 1
echo "setup: ready" >&2
