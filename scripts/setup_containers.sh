#!/usr/bin/env bash
# Idempotent set-up of the container tools that `make test` uses to build the Fortis image and
# run it (tests/deploy/test_image.py) and to run the Helm chart's pods (`podman kube play`):
# Debian's buildah, podman, mmdebstrap (the base image is a Debian rootfs: no Docker Hub here),
# fuse-overlayfs, runc, netavark and aardvark-dns (container networks with DNS names), and
# iptables, with which netavark writes a bridge network's rules (Debian's podman only recommends
# it; without it `podman kube play` fails "netavark: No such file or directory").
# Writes the containers.conf those tests use ($FORTIS_CONTAINERS_CONF, default
# /etc/containers/fortis-containers.conf): runc + cgroupfs, because crun, Debian's default, fails
# on hosts with hybrid cgroups (setrlimit), and a file events log (no journald in CI).
# Exits non-zero with a one-line reason when it cannot (not root, no apt-get).
set -euo pipefail

CONF="${FORTIS_CONTAINERS_CONF:-/etc/containers/fortis-containers.conf}"
PKGS=(buildah podman mmdebstrap fuse-overlayfs runc netavark aardvark-dns iptables)

[ "$(id -u)" = 0 ] || { echo "setup_containers: not root: rootful podman and mmdebstrap need root" >&2; exit 2; }

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  command -v apt-get >/dev/null 2>&1 || {
    echo "setup_containers: no apt-get to install ${missing[*]}" >&2; exit 2; }
  echo "setup_containers: installing ${missing[*]} (Debian) ..." >&2
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null || {
    echo "setup_containers: apt-get install ${missing[*]} failed" >&2; exit 2; }
fi

mkdir -p "$(dirname "$CONF")"
want='[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"'
if [ ! -f "$CONF" ] || [ "$(cat "$CONF")" != "$want" ]; then
  printf '%s\n' "$want" > "$CONF"
fi

# The check the tests rely on: podman answers with this configuration.
CONTAINERS_CONF="$CONF" podman info --format '{{.Host.OCIRuntime.Name}}' >/dev/null 2>&1 || {
  echo "setup_containers: podman does not run here (podman info failed with $CONF)" >&2; exit 2; }
echo "setup_containers: ok ($CONF)" >&2
