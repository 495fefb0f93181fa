#!/usr/bin/env bash
# Build a current Slurm (24.11) from Debian's source package, once per machine and version.
#
#   scripts/slurm-build.sh            build it when missing; print its prefix
#   scripts/slurm-build.sh --print    print the prefix, build nothing (exit 1 if not built)
#   scripts/slurm-build.sh --prefix   print where the prefix is (built or not)
#   scripts/slurm-build.sh --clean    remove this version's cache folder, then build
#
# The test suite runs the Slurm connector against two real Slurms: Debian 12's packages
# (22.05, JSON API v0.0.36-v0.0.38; scripts/slurm-cluster.sh installs them) and this one
# (24.11, JSON API v0.0.40-v0.0.42: what Debian 13, Ubuntu 25.04 and most sites run now),
# which no Debian 12 package provides. The source is Debian trixie's orig tarball (SchedMD's
# release, GPL-2.0+), fetched from Debian's mirror and checked against its SHA-256.
#
# Output: ${SHAPER_SLURM_CACHE_DIR:-/var/cache/shaper/slurm}/<version>/{bin,sbin,lib,…},
# reused when its `built` marker is there; build-<version>.log beside it. About 4-5 minutes
# on 2 cores. Not under $HOME: slurmrestd runs as an unprivileged user, who must be able to
# load the libraries (root's home is not searchable by others).
# Needs root for the build dependencies (apt) when they are missing.
set -euo pipefail
# The prefix must be readable by the unprivileged user slurmrestd runs as, whatever root's
# umask is.
umask 022

readonly VERSION=24.11.5
readonly TARBALL=slurm-wlm_${VERSION}.orig.tar.gz
readonly SHA256=e1a5547edd212c38b5e3230a284133f777b32746551f094aaa81cc4af375e332
readonly MIRROR=${SHAPER_DEBIAN_MIRROR:-http://deb.debian.org/debian}
readonly URL=$MIRROR/pool/main/s/slurm-wlm/$TARBALL
# What the daemons, the CLI's JSON and slurmrestd (JWT) need; nothing optional beyond.
# (--enable-multiple-slurmd below: the test cluster runs one slurmd per node on one host.)
readonly BUILD_DEPS=(build-essential libmunge-dev libjson-c-dev libjwt-dev libhttp-parser-dev
  libyaml-dev munge curl)
readonly CACHE=${SHAPER_SLURM_CACHE_DIR:-/var/cache/shaper/slurm}
readonly PREFIX=$CACHE/$VERSION

log() { printf 'slurm-build: %s\n' "$*" >&2; }
die() {
  printf 'slurm-build: ERROR: %s\n' "$*" >&2
  exit 1
}

MODE=build
case ${1:-} in
  "") ;;
  --print) MODE=print ;;
  --prefix)
    echo "$PREFIX"
    exit 0
    ;;
  --clean) MODE=clean ;;
  -h | --help)
    sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 0
    ;;
  *) die "unknown argument: $1" ;;
esac

built() {
  [[ -f $PREFIX/built && -x $PREFIX/sbin/slurmctld && -x $PREFIX/sbin/slurmd &&
    -x $PREFIX/sbin/slurmrestd && -x $PREFIX/bin/squeue ]]
}

if [[ $MODE == print ]]; then
  built || die "not built yet: $PREFIX (run scripts/slurm-build.sh)"
  echo "$PREFIX"
  exit 0
fi
if [[ $MODE == build ]] && built; then
  echo "$PREFIX"
  exit 0
fi

mkdir -p "$CACHE"
chmod 0755 "$CACHE"
# One build at a time: two CI runs on one machine would race on the prefix and on dpkg.
exec 9>"$CACHE/.lock-$VERSION"
flock 9
if [[ $MODE == clean ]]; then
  rm -rf "$PREFIX" "$CACHE/src-$VERSION"
fi
if built; then
  echo "$PREFIX"
  exit 0
fi

missing=()
for package in "${BUILD_DEPS[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed' ||
    missing+=("$package")
done
if [[ ${#missing[@]} -gt 0 ]]; then
  [[ $EUID -eq 0 ]] || die "missing build dependencies ${missing[*]}: run as root to install them"
  log "installing ${missing[*]}"
  apt-get update -qq || die "apt-get update failed"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" \
    >/tmp/shaper-slurm-build-apt.log 2>&1 ||
    die "apt-get install ${missing[*]} failed (log: /tmp/shaper-slurm-build-apt.log)"
fi

started=$SECONDS
src=$CACHE/src-$VERSION
rm -rf "$src" "$PREFIX"
mkdir -p "$src"
if [[ ! -s $CACHE/$TARBALL ]] || ! echo "$SHA256  $CACHE/$TARBALL" | sha256sum -c --quiet 2>/dev/null; then
  log "fetching $URL"
  curl -fsS --retry 3 -m 600 -o "$CACHE/$TARBALL.part" "$URL" ||
    die "could not fetch $URL (Debian keeps a source tarball in its pool while a release ships it; set SHAPER_DEBIAN_MIRROR to another mirror)"
  echo "$SHA256  $CACHE/$TARBALL.part" | sha256sum -c --quiet ||
    die "$TARBALL does not match its SHA-256 $SHA256"
  mv "$CACHE/$TARBALL.part" "$CACHE/$TARBALL"
fi
tar -xzf "$CACHE/$TARBALL" -C "$src" --strip-components=1
buildlog=$CACHE/build-$VERSION.log
log "building Slurm $VERSION into $PREFIX (log: $buildlog)"
if ! (cd "$src" &&
  ./configure --prefix="$PREFIX" --sysconfdir="$PREFIX/etc" --disable-debug \
    --enable-multiple-slurmd --with-munge --with-jwt --with-json --with-http-parser --with-yaml \
    --without-hdf5 --without-pmix --without-ucx --without-rdkafka --without-nvml \
    --without-rsmi --without-freeipmi --without-lua &&
  make -j"$(nproc)" && make install) >"$buildlog" 2>&1; then
  tail -n 30 "$buildlog" | sed 's/^/    /' >&2
  die "building Slurm $VERSION failed (full log: $buildlog)"
fi
"$PREFIX/sbin/slurmctld" -V >/dev/null || die "the built slurmctld does not run"
rm -rf "$src"
date -u +%FT%TZ >"$PREFIX/built"
log "built Slurm $VERSION in $((SECONDS - started)) s at $PREFIX"
echo "$PREFIX"
