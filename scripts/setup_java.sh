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
NAME=setup_java
. "$(dirname "$0")/apt_toolchain.sh"
apt_toolchain
