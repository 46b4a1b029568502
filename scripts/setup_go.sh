#!/usr/bin/env bash
# Idempotent set-up of the Go toolchain that compiles a Go client of Fortis's contracts
# (clients/go/): go 1.19, protoc, protoc-gen-go, protoc-gen-go-grpc and grpc-go/protobuf-go
# sources, all from Debian (no Go module proxy is reachable from the build machines).
# Called by tests/contract/test_other_languages.py on first use; safe to run again.
#
#   scripts/setup_go.sh        # install what is missing (needs root or sudo and apt)
set -euo pipefail

PACKAGES=(golang-go protobuf-compiler protoc-gen-go protoc-gen-go-grpc
          golang-google-grpc-dev golang-google-protobuf-dev golang-github-golang-protobuf-1-5-dev)

ready() {
  command -v go >/dev/null 2>&1 && command -v protoc-gen-go >/dev/null 2>&1 \
    && command -v protoc-gen-go-grpc >/dev/null 2>&1 \
    && [ -d /usr/share/gocode/src/google.golang.org/grpc ] \
    && [ -d /usr/share/gocode/src/google.golang.org/protobuf ]
}
if ready; then
  echo "setup_go: ready ($(go version))" >&2
  exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null 2>&1 || { echo "setup_go: needs root or sudo for apt-get" >&2; exit 1; }
  SUDO="sudo"
fi
# One installer at a time (two test runs starting together wait for each other).
LOCK=/tmp/fortis-setup-go.lock
if command -v flock >/dev/null 2>&1; then
  exec 9>"$LOCK"
  flock 9
  if ready; then
    echo "setup_go: ready ($(go version))" >&2
    exit 0
  fi
fi
echo "setup_go: installing ${PACKAGES[*]} from Debian ..." >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >/dev/null || true
$SUDO apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >/dev/null
ready || { echo "setup_go: install finished but the toolchain is incomplete" >&2; exit 1; }
echo "setup_go: ready ($(go version))" >&2
