#!/usr/bin/env bash
# Make sure a headless Chromium is available for the dashboard tests (Debian's package;
# Playwright drives it, since `playwright install` cannot download browsers here).
set -euo pipefail
if command -v chromium >/dev/null; then exit 0; fi
command -v apt-get >/dev/null || { echo "[browser] no apt-get: install Chromium yourself" >&2; exit 1; }
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
echo "[browser] installing chromium from the OS packages" >&2
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
command -v chromium >/dev/null || { echo "[browser] chromium did not install" >&2; exit 1; }
