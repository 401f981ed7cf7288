# Sourced by tests/run.sh and tools/schemathesis.sh (bash).
#   ensure_venv DIR REQUIREMENTS
# Makes a Python virtual environment at DIR with REQUIREMENTS installed, reusing it while
# the requirements file is unchanged. Needs python3 >= 3.11 with venv; where `python3 -m
# venv` lacks ensurepip (Debian/Ubuntu without python3-venv) and we are root, installs
# the python3-venv package with apt-get first.

ensure_venv() {
  local dir=$1 req=$2 py=${PYTHON:-python3} stamp want
  command -v "$py" >/dev/null || { echo "ensure_venv: $py is required" >&2; return 1; }
  if ! "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "ensure_venv: $("$py" --version 2>&1) is too old; the pinned clients need Python >= 3.11" >&2
    return 1
  fi
  want=$(sha256sum "$req" | cut -d' ' -f1)
  stamp="$dir/.requirements.sha256"
  if [[ -x $dir/bin/python && -f $stamp && $(cat "$stamp") == "$want" ]]; then
    return 0
  fi
  if [[ ! -x $dir/bin/python ]]; then
    rm -rf "$dir"
    if ! "$py" -m venv "$dir" 2>/dev/null; then
      rm -rf "$dir"
      if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
        local minor
        minor=$("$py" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
        echo "ensure_venv: installing python3-venv with apt-get" >&2
        apt-get update -qq >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >&2 ||
          DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "python$minor-venv" >&2
        "$py" -m venv "$dir"
      else
        echo "ensure_venv: \`$py -m venv\` failed; install python3-venv" >&2
        return 1
      fi
    fi
  fi
  "$dir/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req"
  echo "$want" >"$stamp"
}
