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
version() { go version; }
NAME=setup_go
. "$(dirname "$0")/apt_toolchain.sh"
apt_toolchain
