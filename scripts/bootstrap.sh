#!/usr/bin/env bash
# Create the virtualenv and install Shaper with its dev tools. Python >= 3.11 is needed;
# on Debian/Ubuntu the venv module comes from the python3-venv package.
set -euo pipefail
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}

if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "[bootstrap] $PYTHON is missing or older than 3.11" >&2; exit 1
fi
if [ ! -x "$VENV/bin/python" ]; then
  if ! "$PYTHON" -m venv "$VENV" 2>/dev/null; then
    echo "[bootstrap] installing python3-venv" >&2
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv python3-pip
    rm -rf "$VENV"; "$PYTHON" -m venv "$VENV"
  fi
fi
stamp="$VENV/.installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q -e '.[dev]'
  touch "$stamp"
fi
