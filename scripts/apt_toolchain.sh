# Sourced by the toolchain set-up scripts (setup_go.sh, setup_java.sh): install Debian packages
# once, idempotently, one installer at a time.
#
#   NAME=setup_x; PACKAGES=(...); ready() { ...; }; version() { ...; }
#   . "$(dirname "$0")/apt_toolchain.sh"; apt_toolchain
#
# ready: succeeds when the toolchain is complete; version: one line naming it. Exits 0 when
# ready (before or after installing), 1 with the reason otherwise.

apt_toolchain() {
  if ready; then
    echo "$NAME: ready ($(version))" >&2
    exit 0
  fi
  local sudo=""
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "$NAME: needs root or sudo for apt-get" >&2; exit 1; }
    sudo="sudo"
  fi
  command -v apt-get >/dev/null 2>&1 || { echo "$NAME: needs apt-get (Debian packages)" >&2; exit 1; }
  # One installer at a time (two test runs starting together wait for each other).
  if command -v flock >/dev/null 2>&1; then
    exec 9>"/tmp/fortis-$NAME.lock"
    flock 9
    if ready; then
      echo "$NAME: ready ($(version))" >&2
      exit 0
    fi
  fi
  echo "$NAME: installing ${PACKAGES[*]} from Debian ..." >&2
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq >/dev/null || true
  $sudo apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >/dev/null
  ready || { echo "$NAME: install finished but the toolchain is incomplete" >&2; exit 1; }
  echo "$NAME: ready ($(version))" >&2
}
