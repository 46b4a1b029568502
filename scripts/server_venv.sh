# Sourced by scripts/setup_<server>.sh: the idempotent install of one test counterpart (a model
# server the adapters are tested against) into a venv of its own, never .venv.
#
# The caller sets NAME (the script's name in messages and the stamp), VENV, BINARY (a file in
# $VENV/bin that exists once installed), WHAT (what is installed, for the message),
# REQUIREMENTS (an array, everything pinned), optionally NO_DEPS (an array installed with
# --no-deps), and CHECK (Python run in the venv before the stamp is written, so a broken
# install is never taken for a ready one); then calls server_venv. A stamp records what was
# installed (a changed list reinstalls); one installer at a time (two test runs starting
# together wait for each other).
server_venv() {
  local py=${PYTHON:-python3.11} want stamp="$VENV/.fortis-$NAME-installed"
  command -v "$py" >/dev/null 2>&1 || py=python3
  local -a no_deps=()
  if declare -p NO_DEPS >/dev/null 2>&1; then no_deps=("${NO_DEPS[@]}"); fi
  if [ "${#no_deps[@]}" -gt 0 ]; then
    want="$(printf '%s\n' "${REQUIREMENTS[@]}" "--no-deps" "${no_deps[@]}")"
  else
    want="$(printf '%s\n' "${REQUIREMENTS[@]}")"
  fi
  _ready() { [ -x "$VENV/bin/$BINARY" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; }
  if _ready; then
    echo "setup_$NAME: $VENV ready" >&2
    return 0
  fi
  mkdir -p "$VENV"
  if command -v flock >/dev/null 2>&1; then
    exec 9>"$VENV/.setup.lock"
    flock 9
    if _ready; then
      echo "setup_$NAME: $VENV ready" >&2
      return 0
    fi
  fi
  if [ ! -x "$VENV/bin/python" ]; then
    echo "setup_$NAME: creating $VENV ..." >&2
    "$py" -m venv "$VENV"
  fi
  echo "setup_$NAME: installing $WHAT into $VENV ..." >&2
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "${REQUIREMENTS[@]}"
  if [ "${#no_deps[@]}" -gt 0 ]; then
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps "${no_deps[@]}"
  fi
  "$VENV/bin/python" -c "$CHECK"
  printf '%s' "$want" > "$stamp"
  echo "setup_$NAME: $VENV ready" >&2
}
