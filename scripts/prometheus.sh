#!/usr/bin/env bash
# Make sure a Prometheus server binary is available for the metrics tests (Debian's
# package; the tests start it as a plain process with their own config, no service).
set -euo pipefail
if command -v prometheus >/dev/null; then exit 0; fi
command -v apt-get >/dev/null || { echo "[prometheus] no apt-get: install Prometheus yourself" >&2; exit 1; }
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
echo "[prometheus] installing prometheus from the OS packages" >&2
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
# The package's service is not started here (no systemd); only its binary is used.
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
command -v prometheus >/dev/null || { echo "[prometheus] prometheus did not install" >&2; exit 1; }
