#!/usr/bin/env bash
# Build the Fortis images from the repo's Dockerfile with podman, without a registry: the
# `full` target (every service, torch, the built-in models) and the `slim` one (proxy, scoring
# and report without torch); then start the full image as a pod would (read-only root, no
# capabilities) and run its gRPC health check. Prints one JSON line with what was measured.
# tests/deploy/test_image.py runs it (with --no-check: the test checks more) in `make test`.
#
#   bash scripts/build_image.sh [--target full|slim|all] [--no-check] [TAG]
#       TAG: the full image (default localhost/fortis:VERSION, VERSION from pyproject.toml);
#       the slim one is tagged NAME-slim:same tag. Run as root (scripts/setup_containers.sh
#       installs the tools and writes the containers.conf this uses).
#
# Offline machine shape: no Docker Hub, so the base image is a Debian bookworm rootfs made with
# mmdebstrap (Python 3.11 from Debian), imported as localhost/fortis-base:bookworm and pinned
# in the build by its digest (recorded in the org.opencontainers.image.base.* labels); the
# build's pip reaches PyPI with the host's CA bundle mounted; torch's CPU wheel comes from a
# local wheel folder (FORTIS_WHEELS, default /opt/wheels) when it has one, else from
# download.pytorch.org/whl/cpu. podman's layer cache is kept: a rebuild after a source change
# redoes only the layers after the sources are copied (FORTIS_NO_CACHE=1 forces a cold build).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VERSION="$(python3 -c "import tomllib; print(tomllib.load(open('$ROOT/pyproject.toml', 'rb'))['project']['version'])")"
TARGET=all
CHECK=1
TAG=""
while [ $# -gt 0 ]; do
  case "$1" in
    --target) TARGET="$2"; shift 2 ;;
    --no-check) CHECK=0; shift ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) TAG="$1"; shift ;;
  esac
done
case "$TARGET" in full|slim|all) ;; *) echo "build_image.sh: --target full|slim|all" >&2; exit 2 ;; esac
TAG="${TAG:-localhost/fortis:$VERSION}"
SLIM_TAG="${TAG%:*}-slim:${TAG##*:}"
BASE="${FORTIS_BASE_IMAGE:-localhost/fortis-base:bookworm}"
WHEELS="${FORTIS_WHEELS:-/opt/wheels}"
CA="${FORTIS_HOST_CA:-/etc/ssl/certs/ca-certificates.crt}"
WORK="$(mktemp -d /tmp/fortis-image.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT

for tool in podman mmdebstrap runc; do
  command -v "$tool" >/dev/null || {
    echo "build_image.sh: $tool is missing: run scripts/setup_containers.sh as root" >&2
    exit 2; }
done
[ "$(id -u)" = 0 ] || { echo "build_image.sh: run as root (rootful podman; mmdebstrap)" >&2; exit 2; }

# The default OCI runtime crun fails on hosts with hybrid cgroups (setrlimit): runc + cgroupfs.
if [ -z "${CONTAINERS_CONF:-}" ]; then
  CONTAINERS_CONF=/etc/containers/fortis-containers.conf
  if [ ! -f "$CONTAINERS_CONF" ]; then
    CONTAINERS_CONF="$WORK/containers.conf"
    printf '%s\n' '[containers]' 'default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]' \
      '[engine]' 'runtime = "runc"' 'cgroup_manager = "cgroupfs"' 'events_logger = "file"' \
      > "$CONTAINERS_CONF"
  fi
fi
export CONTAINERS_CONF

now() { date +%s.%N; }
t0=$(now)
if ! podman image exists "$BASE"; then
  # python3 + venv + the `python` name the Dockerfile's stages use (as python:*-slim has)
  mmdebstrap --quiet --variant=minbase \
    --include=python3,python3-venv,python-is-python3,ca-certificates bookworm "$WORK/base.tar"
  podman import --quiet "$WORK/base.tar" "$BASE" >/dev/null
  rm -f "$WORK/base.tar"
fi
base_digest="$(podman image inspect --format '{{.Digest}}' "$BASE")"
t_base=$(now)

revision="$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)"
if [ "$revision" != unknown ] && [ -n "$(git -C "$ROOT" status --porcelain --untracked-files=no 2>/dev/null)" ]; then
  revision="$revision-dirty"      # built from uncommitted changes: say so
fi
source_url="${FORTIS_IMAGE_SOURCE:-$(git -C "$ROOT" remote get-url origin 2>/dev/null || echo "file://$ROOT")}"
build_args=(--build-arg "PYTHON_IMAGE=${BASE%:*}@$base_digest"
            --build-arg "BASE_NAME=$BASE" --build-arg "BASE_DIGEST=$base_digest"
            --build-arg "FORTIS_VERSION=$VERSION" --build-arg "VCS_REF=$revision"
            --build-arg "SOURCE_URL=$source_url"
            --build-arg "BUILD_DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
            --build-arg "PIP_CERT=/run/host-ca.crt" -v "$CA:/run/host-ca.crt:ro")
if ls "$WHEELS"/torch-2.13.0+cpu-*.whl >/dev/null 2>&1; then
  # the local +cpu wheel: pip finds nothing else named torch==2.13.0+cpu on PyPI
  build_args+=(--build-arg "TORCH_INDEX_URL=https://pypi.org/simple"
               --build-arg "PIP_FIND_LINKS=/wheels" -v "$WHEELS:/wheels:ro")
fi

build() {   # target tag
  # --format docker keeps HEALTHCHECK (the OCI image format has no such field)
  podman build ${FORTIS_NO_CACHE:+--no-cache} --layers --format docker --network host \
    "${build_args[@]}" --target "$1" -f "$ROOT/Dockerfile" -t "$2" "$ROOT" \
    > "$WORK/build-$1.log" 2>&1 || {
    echo "build_image.sh: building --target $1 failed; the end of its log:" >&2
    tail -40 "$WORK/build-$1.log" >&2; exit 1; }
}
size_full=0; size_slim=0; t_full=$t_base
if [ "$TARGET" != slim ]; then
  build full "$TAG"
  size_full=$(podman image inspect --format '{{.Size}}' "$TAG")
fi
t_full=$(now)
if [ "$TARGET" != full ]; then
  build slim "$SLIM_TAG"
  size_slim=$(podman image inspect --format '{{.Size}}' "$SLIM_TAG")
fi
t_slim=$(now)

report() {
  python3 - "$@" <<'EOF'
import json, sys
a = dict(zip(sys.argv[1::2], sys.argv[2::2]))
out = {"image": a["tag"], "slim_image": a["slim_tag"], "target": a["target"],
       "base": a["base"], "revision": a["revision"], "size_mb": round(int(a["size_full"]) / 1e6, 1),
       "slim_size_mb": round(int(a["size_slim"]) / 1e6, 1),
       "base_s": round(float(a["t_base"]) - float(a["t0"]), 1),
       "build_full_s": round(float(a["t_full"]) - float(a["t_base"]), 1),
       "build_slim_s": round(float(a["t_slim"]) - float(a["t_full"]), 1)}
for k in ("start_to_serving_s", "fortis_health", "podman_healthcheck", "uid", "root_filesystem"):
    if k in a:
        out[k] = a[k]
print(json.dumps(out))
EOF
}
common=(tag "$TAG" slim_tag "$SLIM_TAG" target "$TARGET" base "${BASE%:*}@$base_digest" revision "$revision"
        size_full "$size_full" size_slim "$size_slim" t0 "$t0" t_base "$t_base"
        t_full "$t_full" t_slim "$t_slim")
if [ "$CHECK" = 0 ] || [ "$TARGET" = slim ]; then
  report "${common[@]}"
  exit 0
fi

# Run it as a pod would: read-only root, non-root (the image's USER), /tmp on a tmpfs and the
# state and cache folders on the image's VOLUMEs (anonymous volumes owned by 10001, as
# fsGroup makes them in a pod), no network but its own loopback, no capabilities.
name="fortis-check-$$"
podman run -d --name "$name" --read-only --network none --cap-drop ALL \
  --security-opt no-new-privileges --tmpfs /tmp:rw,mode=1777 "$TAG" \
  serve --address 0.0.0.0:50051 --no-auth --no-default-targets >/dev/null
cleanup() { podman rm -f -v "$name" >/dev/null 2>&1 || true; rm -rf "$WORK"; }
trap cleanup EXIT
t_run=$(now)
health="not SERVING"
for _ in $(seq 1 120); do
  if out=$(podman exec "$name" fortis health --address 127.0.0.1:50051 2>&1); then
    health="$out"; break
  fi
  [ "$(podman inspect --format '{{.State.Running}}' "$name")" = true ] || break
  sleep 1
done
t_healthy=$(now)
hc=$(podman healthcheck run "$name" >/dev/null 2>&1 && echo healthy || echo unhealthy)
user=$(podman exec "$name" id -u 2>/dev/null || echo "?")
ro=$(podman exec "$name" sh -c 'touch /opt/x 2>/dev/null && echo writable || echo read-only' 2>/dev/null || echo "?")
[ "$hc" = healthy ] || podman logs "$name" 2>&1 | tail -5 >&2
report "${common[@]}" start_to_serving_s "$(python3 -c "print(round($t_healthy - $t_run, 1))")" \
  fortis_health "$(echo "$health" | tr -d '\n')" podman_healthcheck "$hc" uid "$user" \
  root_filesystem "$ro"
[ "$hc" = healthy ]
