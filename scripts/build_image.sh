#!/usr/bin/env bash
# Build the Fortis image from the repo's Dockerfile with podman, without a registry, then start
# it with a read-only root filesystem and run its gRPC health check (issue 10, "A container
# image"). Not part of `make test` (minutes). Prints one JSON line with what was measured.
#
#   bash scripts/build_image.sh [TAG]          (default localhost/fortis:0.1.0; run as root)
#
# Offline machine shape (see /work/shared/DESIGN.md section 4): no Docker Hub, so the base
# image is a Debian bookworm rootfs made with mmdebstrap (Python 3.11 from Debian) and imported
# as localhost/fortis-base:bookworm; the build's pip reaches PyPI with the host's CA bundle
# mounted; torch's CPU wheel comes from a local wheel folder (FORTIS_WHEELS, default
# /opt/wheels) when it has one, else from download.pytorch.org/whl/cpu. The default OCI runtime
# crun fails here (hybrid cgroups, setrlimit), so a containers.conf selects runc + cgroupfs.
set -euo pipefail

TAG="${1:-localhost/fortis:0.1.0}"
BASE="${FORTIS_BASE_IMAGE:-localhost/fortis-base:bookworm}"
WHEELS="${FORTIS_WHEELS:-/opt/wheels}"
CA="${FORTIS_HOST_CA:-/etc/ssl/certs/ca-certificates.crt}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
WORK="$(mktemp -d /tmp/fortis-image.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT

for tool in podman mmdebstrap runc; do
  command -v "$tool" >/dev/null || {
    echo "build_image.sh: $tool is missing: apt-get install -y buildah podman mmdebstrap fuse-overlayfs runc" >&2
    exit 2; }
done
[ "$(id -u)" = 0 ] || { echo "build_image.sh: run as root (rootful podman; mmdebstrap)" >&2; exit 2; }

cat > "$WORK/containers.conf" <<'EOF'
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
export CONTAINERS_CONF="$WORK/containers.conf"

t0=$(date +%s.%N)
if ! podman image exists "$BASE"; then
  # python3 + venv + the `python` name the Dockerfile's stages use (as python:*-slim has)
  mmdebstrap --quiet --variant=minbase \
    --include=python3,python3-venv,python-is-python3,ca-certificates bookworm "$WORK/base.tar"
  podman import --quiet "$WORK/base.tar" "$BASE" >/dev/null
fi
t_base=$(date +%s.%N)

build_args=(--build-arg "PYTHON_IMAGE=$BASE" --build-arg "PIP_CERT=/run/host-ca.crt"
            -v "$CA:/run/host-ca.crt:ro")
if ls "$WHEELS"/torch-2.13.0+cpu-*.whl >/dev/null 2>&1; then
  build_args+=(--build-arg "TORCH_INDEX_URL=https://pypi.org/simple"
               --build-arg "PIP_FIND_LINKS=/wheels" -v "$WHEELS:/wheels:ro")
fi
# --format docker keeps HEALTHCHECK (the OCI image format has no such field)
podman build ${FORTIS_NO_CACHE:+--no-cache} --format docker --network host "${build_args[@]}" \
  -f "$ROOT/Dockerfile" -t "$TAG" "$ROOT" > "$WORK/build.log" 2>&1 || {
  tail -40 "$WORK/build.log" >&2; exit 1; }
t_build=$(date +%s.%N)
size=$(podman image inspect --format '{{.Size}}' "$TAG")

# Run it as a pod would: read-only root, non-root (the image's USER), /tmp on a tmpfs and the
# state and cache folders on the image's VOLUMEs (anonymous volumes owned by 10001, as
# fsGroup makes them in a pod), no network but its own loopback, no capabilities.
name="fortis-check-$$"
podman run -d --name "$name" --read-only --network none --cap-drop ALL \
  --security-opt no-new-privileges --tmpfs /tmp:rw,mode=1777 "$TAG" \
  serve --address 0.0.0.0:50051 --no-auth --no-default-targets >/dev/null
cleanup() { podman rm -f -v "$name" >/dev/null 2>&1 || true; rm -rf "$WORK"; }
trap cleanup EXIT
t_run=$(date +%s.%N)
health="not SERVING"
for _ in $(seq 1 120); do
  if out=$(podman exec "$name" fortis health --address 127.0.0.1:50051 2>&1); then
    health="$out"; break
  fi
  [ "$(podman inspect --format '{{.State.Running}}' "$name")" = true ] || break
  sleep 1
done
t_healthy=$(date +%s.%N)
hc=$(podman healthcheck run "$name" >/dev/null 2>&1 && echo healthy || echo unhealthy)
user=$(podman exec "$name" id -u)
ro=$(podman exec "$name" sh -c 'touch /opt/x 2>/dev/null && echo writable || echo read-only')
logs=$(podman logs "$name" 2>&1 | tail -3)

python3 - "$TAG" "$size" "$t0" "$t_base" "$t_build" "$t_run" "$t_healthy" "$health" "$hc" \
  "$user" "$ro" "$logs" <<'EOF'
import json, sys
tag, size, t0, tb, tbu, tr, th, health, hc, user, ro, logs = sys.argv[1:]
print(json.dumps({
    "image": tag, "size_mb": round(int(size) / 1e6, 1),
    "base_s": round(float(tb) - float(t0), 1), "build_s": round(float(tbu) - float(tb), 1),
    "start_to_serving_s": round(float(th) - float(tr), 1),
    "fortis_health": health.strip(), "podman_healthcheck": hc, "uid": user.strip(),
    "root_filesystem": ro.strip(), "logs_tail": logs.strip().splitlines()[-3:]}))
EOF
[ "$hc" = healthy ]
