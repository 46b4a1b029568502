#!/usr/bin/env bash
# Idempotent set-up of the Java toolchain that compiles a Java client of Fortis's contracts
# (clients/java/): a JDK, protoc with the grpc-java plugin, and the protobuf-java/grpc-java
# jars with what they need (guava, perfmark, javax.annotation to compile; Netty for grpc-netty,
# the transport of a plaintext or TLS channel, at run time), all from Debian (Maven Central is
# not reachable from the build machines; the jars land in /usr/share/java).
# Called by tests/integration/test_java.py on first use; safe to run again.
#
#   scripts/setup_java.sh        # install what is missing (needs root or sudo and apt)
set -euo pipefail

PACKAGES=(default-jdk-headless protobuf-compiler protobuf-compiler-grpc-java-plugin
          libgrpc-java libprotobuf-java libperfmark-java libguava-java
          libgeronimo-annotation-1.3-spec-java libnetty-java)
# Every jar tests/integration/test_java.py compiles and runs with (keep the two lists alike).
JARS=(protobuf grpc-api grpc-core grpc-stub grpc-protobuf grpc-protobuf-lite grpc-context guava
      perfmark-api geronimo-annotation-1.3-spec grpc-netty netty-buffer netty-codec
      netty-codec-http netty-codec-http2 netty-common netty-handler netty-resolver
      netty-transport)

ready() {
  command -v javac >/dev/null 2>&1 && command -v java >/dev/null 2>&1 \
    && command -v protoc >/dev/null 2>&1 && [ -x /usr/bin/grpc_java_plugin ] || return 1
  local jar
  for jar in "${JARS[@]}"; do
    [ -e "/usr/share/java/$jar.jar" ] || return 1
  done
}
version() { javac -version 2>&1 | head -n 1; }
if ready; then
  echo "setup_java: ready ($(version))" >&2
  exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null 2>&1 || { echo "setup_java: needs root or sudo for apt-get" >&2; exit 1; }
  SUDO="sudo"
fi
command -v apt-get >/dev/null 2>&1 || { echo "setup_java: needs apt-get (Debian packages)" >&2; exit 1; }
# One installer at a time (two test runs starting together wait for each other).
LOCK=/tmp/fortis-setup-java.lock
if command -v flock >/dev/null 2>&1; then
  exec 9>"$LOCK"
  flock 9
  if ready; then
    echo "setup_java: ready ($(version))" >&2
    exit 0
  fi
fi
echo "setup_java: installing ${PACKAGES[*]} from Debian ..." >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >/dev/null || true
$SUDO apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >/dev/null
ready || { echo "setup_java: install finished but the toolchain is incomplete" >&2; exit 1; }
echo "setup_java: ready ($(version))" >&2
