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
# The dashboard is built with Node.js 18 or newer and npm (`make web`); Debian 12's own
# packages are enough.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  command -v apt-get >/dev/null || { echo "[bootstrap] install Node.js >= 18 and npm" >&2; exit 1; }
  echo "[bootstrap] installing nodejs and npm" >&2
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
fi
if ! node -e 'process.exit(Number(process.versions.node.split(".")[0]) < 18 ? 1 : 0)'; then
  echo "[bootstrap] Node.js $(node --version) is older than 18" >&2; exit 1
fi
stamp="$VENV/.installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q -e '.[dev]'
  touch "$stamp"
fi
