#!/usr/bin/env bash
# Make sure PostgreSQL and Redis answer on 127.0.0.1 (5432, 6379) for the test suite:
# start them when installed but stopped, install them from the OS packages when missing.
# Fails loudly when they cannot be had: the suite never skips for want of them.
set -euo pipefail

log() { printf '[services] %s\n' "$*" >&2; }
need_root() { [ "$(id -u)" -eq 0 ] || { log "need root (or sudo) to $1"; exit 1; }; }
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

pg_ready() { pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; }
redis_ready() { [ "$(redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null)" = "PONG" ]; }

apt_install() {
  command -v apt-get >/dev/null || { log "no apt-get: install $* yourself"; exit 1; }
  log "installing $* from the OS packages"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

ensure_postgres() {
  if pg_ready; then return; fi
  command -v pg_ctlcluster >/dev/null || apt_install postgresql postgresql-client
  local version
  version=$(ls /etc/postgresql | sort -V | tail -n1)
  [ -n "$version" ] || { log "PostgreSQL installed but no cluster in /etc/postgresql"; exit 1; }
  log "starting PostgreSQL $version"
  as_root pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
  for _ in $(seq 1 30); do pg_ready && break; sleep 1; done
  pg_ready || { log "PostgreSQL does not answer on 127.0.0.1:5432"; exit 1; }
  # The suite connects as the postgres role over TCP without a password (local trust).
  if ! psql -h 127.0.0.1 -U postgres -d postgres -tAc 'select 1' >/dev/null 2>&1; then
    local hba="/etc/postgresql/$version/main/pg_hba.conf"
    log "allowing local trust auth for the test role in $hba"
    as_root sed -i '1i host all all 127.0.0.1/32 trust\nhost all all ::1/128 trust' "$hba"
    as_root pg_ctlcluster --skip-systemctl-redirect "$version" main reload
    sleep 1
  fi
  psql -h 127.0.0.1 -U postgres -d postgres -tAc 'select 1' >/dev/null \
    || { log "cannot log in to PostgreSQL as postgres on 127.0.0.1"; exit 1; }
}

ensure_redis() {
  if redis_ready; then return; fi
  command -v redis-server >/dev/null || apt_install redis-server
  log "starting Redis"
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no
  for _ in $(seq 1 20); do redis_ready && break; sleep 0.5; done
  redis_ready || { log "Redis does not answer on 127.0.0.1:6379"; exit 1; }
}

command -v pg_isready >/dev/null || apt_install postgresql-client
command -v redis-cli >/dev/null || apt_install redis-tools
ensure_postgres
ensure_redis
log "PostgreSQL and Redis are up"
