#!/usr/bin/env bash
# Install a CRIU that works on this machine's kernel.
#
# Debian 12 ships criu 3.17, which fails on kernels >= 6.13 ("vdso: Unexpected rt vDSO
# area bounds"). Debian trixie's criu 4.1.x builds against bookworm's libraries, so we build
# its source package here and install only the binary to /usr/local/sbin/criu. Where the
# mirror serves the package's upstream tarball but not its Debian files (seen on some
# mirrors and caching proxies), that tarball alone is built; every file is checked against
# the SHA-256 in trixie's signed Sources index either way.
#
# Measured on this project's machine kind: about 30-100 s with the build deps present
# (2 shared cores), about 160 s on a fresh Debian 12 minbase (downloads ~100 MB of deps).
#
# Idempotent: does nothing when `criu check` already passes with a version >= 4.1.
# Needs root and Debian's package mirrors; nothing else from the network.
# The trixie deb-src index lives in a private apt state under the build directory, so the
# system's apt configuration and package lists stay bookworm-only, even if this is
# interrupted.
#
# Environment:
#   SHAPER_CRIU_BUILD_DIR   build directory (default /var/cache/shaper/criu-build)
#   SHAPER_CRIU_PREFIX      install prefix (default /usr/local; binary in $PREFIX/sbin)
#   SHAPER_DEBIAN_MIRROR    Debian mirror for the trixie source (default: the system's)
#   SHAPER_CRIU_FORCE=1     rebuild even when a working criu is present
set -euo pipefail

readonly MIN_MAJOR=4
readonly MIN_MINOR=1
readonly SOURCE_SUITE=trixie
BUILD_DIR=${SHAPER_CRIU_BUILD_DIR:-/var/cache/shaper/criu-build}
PREFIX=${SHAPER_CRIU_PREFIX:-/usr/local}
INSTALL_PATH="$PREFIX/sbin/criu"

# criu 4.1.x's build dependencies, as available in bookworm.
BUILD_DEPS=(
  build-essential dpkg-dev pkg-config libbsd-dev libcap-dev libgnutls28-dev libnet1-dev
  libnftables-dev libnl-3-dev libprotobuf-c-dev libprotobuf-dev protobuf-c-compiler
  protobuf-compiler uuid-dev python3-protobuf xz-utils ca-certificates
)

log() { printf 'install-criu: %s\n' "$*" >&2; }
die() {
  printf 'install-criu: ERROR: %s\n' "$*" >&2
  exit 1
}

started_at=$(date +%s)

# Prints "MAJOR MINOR" of a criu binary, or nothing.
criu_version() {
  "$1" --version 2>/dev/null | sed -n 's/^Version: *\([0-9]\+\)\.\([0-9]\+\).*/\1 \2/p'
}

# Succeeds when $1 is a criu >= MIN_MAJOR.MIN_MINOR whose `criu check` passes.
criu_works() {
  local binary=$1 version major minor
  [[ -x "$binary" ]] || return 1
  version=$(criu_version "$binary")
  [[ -n "$version" ]] || return 1
  read -r major minor <<<"$version"
  if ((major < MIN_MAJOR || (major == MIN_MAJOR && minor < MIN_MINOR))); then
    log "$binary is version $major.$minor; need >= $MIN_MAJOR.$MIN_MINOR"
    return 1
  fi
  "$binary" check >/dev/null 2>&1 || {
    log "$binary $major.$minor is installed but 'criu check' fails"
    return 1
  }
}

if [[ "${SHAPER_CRIU_FORCE:-0}" != 1 ]]; then
  for candidate in "$(command -v criu 2>/dev/null || true)" "$INSTALL_PATH"; do
    if [[ -n "$candidate" ]] && criu_works "$candidate"; then
      log "OK: $candidate ($("$candidate" --version | head -n1)) already works; nothing to do"
      exit 0
    fi
  done
fi

[[ $(id -u) -eq 0 ]] || die "must run as root (installs packages and $INSTALL_PATH)"
command -v apt-get >/dev/null || die "apt-get not found: this script supports Debian only"
# shellcheck source=/dev/null
[[ -r /etc/os-release ]] && . /etc/os-release
[[ "${ID:-}" == debian ]] || log "warning: not Debian (ID=${ID:-unknown}); trying anyway"

# The mirror the system already uses, so only Debian's own mirrors are contacted.
system_mirror() {
  local uri
  uri=$(grep -hsE '^\s*URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null |
    awk '{print $2}' | grep -E '/debian/?$' | head -n1 || true)
  if [[ -z "$uri" ]]; then
    uri=$(grep -hsE '^\s*deb\s' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
      awk '{for (i = 2; i <= NF; i++) if ($i ~ /^https?:/) {print $i; exit}}' |
      grep -E '/debian/?$' | head -n1 || true)
  fi
  echo "${uri:-http://deb.debian.org/debian}"
}
MIRROR=${SHAPER_DEBIAN_MIRROR:-$(system_mirror)}

# One build at a time: two runs (parallel `make test`s) would share the build directory.
mkdir -p "$BUILD_DIR"
exec 9>"$BUILD_DIR/.lock"
flock 9 || die "could not lock $BUILD_DIR/.lock"
if [[ "${SHAPER_CRIU_FORCE:-0}" != 1 ]] && criu_works "$INSTALL_PATH"; then
  log "OK: another run installed $INSTALL_PATH meanwhile; nothing to do"
  exit 0
fi

log "installing build dependencies from the system's suites"
export DEBIAN_FRONTEND=noninteractive
apt_log="$BUILD_DIR/apt.log"
apt-get update >"$apt_log" 2>&1 || {
  tail -n 20 "$apt_log" >&2
  die "apt-get update failed: are Debian's mirrors reachable? (log: $apt_log)"
}
apt-get install -y --no-install-recommends "${BUILD_DEPS[@]}" >>"$apt_log" 2>&1 || {
  tail -n 20 "$apt_log" >&2
  die "could not install build dependencies: ${BUILD_DEPS[*]} (log: $apt_log)"
}

# A private apt configuration holding only the trixie deb-src index.
APT_DIR="$BUILD_DIR/apt"
rm -rf "$APT_DIR"
mkdir -p "$APT_DIR/lists/partial" "$APT_DIR/sources.list.d" "$APT_DIR/cache/archives/partial"
cat >"$APT_DIR/sources.list.d/trixie-src.sources" <<EOF
Types: deb-src
URIs: $MIRROR
Suites: $SOURCE_SUITE
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
APT_OPTS=(
  -o "Dir::Etc::SourceList=/dev/null"
  -o "Dir::Etc::SourceParts=$APT_DIR/sources.list.d"
  -o "Dir::State::Lists=$APT_DIR/lists"
  -o "Dir::Cache=$APT_DIR/cache"
  -o "Dir::Cache::pkgcache=" -o "Dir::Cache::srcpkgcache="
  -o "APT::Sandbox::User=root"
)

log "fetching the $SOURCE_SUITE source index from $MIRROR"
apt-get "${APT_OPTS[@]}" update -qq --error-on=any ||
  die "could not fetch the $SOURCE_SUITE deb-src index from $MIRROR"

SRC_DIR="$BUILD_DIR/src"
rm -rf "$SRC_DIR"
mkdir -p "$SRC_DIR"
# Each line: 'URI' NAME SIZE SHA256:HASH, from the signed index.
source_uris=$(apt-get "${APT_OPTS[@]}" source --print-uris -qq "criu/$SOURCE_SUITE") ||
  die "criu has no source package in $SOURCE_SUITE at $MIRROR"
[[ -n "$source_uris" ]] || die "apt-get source --print-uris criu/$SOURCE_SUITE printed nothing"

# apt-helper verifies each file against the hash from the signed index. Fetch file by file
# (not `apt-get source`): some mirrors and proxies serve a package's upstream tarball but
# not its Debian files, and the upstream tarball alone is enough to build the binary.
log "downloading criu's $SOURCE_SUITE source files"
dsc="" orig="" missing=()
while read -r uri name _size hash; do
  uri=${uri//\'/}
  if /usr/lib/apt/apt-helper -o APT::Sandbox::User=root download-file \
    "$uri" "$SRC_DIR/$name" "$hash" >/dev/null 2>&1; then
    case "$name" in
    *.dsc) dsc="$SRC_DIR/$name" ;;
    *.orig.tar.*) orig="$SRC_DIR/$name" ;;
    esac
  else
    missing+=("$name")
  fi
done <<<"$source_uris"
rm -rf "$APT_DIR"

TREE="$SRC_DIR/criu"
if ((${#missing[@]} == 0)) && [[ -n "$dsc" ]]; then
  dpkg-source --no-check -x "$dsc" "$TREE" >/dev/null || die "dpkg-source -x $dsc failed"
  log "unpacked $(basename "$dsc") with Debian's patches"
elif [[ -n "$orig" ]]; then
  log "warning: the mirror did not serve ${missing[*]}; building the verified upstream" \
    "tarball $(basename "$orig") without Debian's patches"
  mkdir -p "$TREE"
  tar -xf "$orig" -C "$TREE" --strip-components=1 || die "could not unpack $orig"
else
  die "could not download criu's $SOURCE_SUITE source (missing: ${missing[*]}) from $MIRROR"
fi
[[ -f "$TREE/Makefile" ]] || die "no criu source tree in $TREE"

log "building criu from $TREE with $(nproc) jobs"
build_log="$BUILD_DIR/build.log"
if ! make -C "$TREE" -j"$(nproc)" criu >"$build_log" 2>&1; then
  tail -n 40 "$build_log" >&2
  die "make criu failed; full log in $build_log"
fi

install -D -m 0755 "$TREE/criu/criu" "$INSTALL_PATH"
criu_works "$INSTALL_PATH" || die "$INSTALL_PATH was built but 'criu check' fails: $(
  "$INSTALL_PATH" check 2>&1 | tail -n 5
)"

case ":$PATH:" in
*":$PREFIX/sbin:"*) ;;
*) log "warning: $PREFIX/sbin is not on PATH; add it or set SHAPER_CRIU=$INSTALL_PATH" ;;
esac
log "OK: installed $INSTALL_PATH ($("$INSTALL_PATH" --version | head -n1)) in $(($(date +%s) - started_at)) s"
