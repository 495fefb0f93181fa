#!/usr/bin/env bash
# Build the Kubernetes test control plane from Go modules, once per machine and version.
#
#   scripts/k8s-build.sh            build what is missing; print the bin folder
#   scripts/k8s-build.sh --print    print the bin folder, build nothing (exit 1 if incomplete)
#   scripts/k8s-build.sh --clean    remove this version's cache folder, then build
#
# Binaries (versions in scripts/k8s/versions.sh, modules in scripts/k8s/<name>/go.mod):
#   etcd                                       go.etcd.io/etcd/server/v3
#   kube-apiserver kube-controller-manager     k8s.io/kubernetes, every k8s.io/* staging
#   kube-scheduler kubectl                       module pinned to the matching v0.x
#   kwok                                       sigs.k8s.io/kwok/cmd/kwok
#   kueue                                      sigs.k8s.io/kueue/cmd/kueue
# and manifests/kueue.yaml: Kueue's release manifests (`kubectl kustomize config/default` of
# the same Kueue module: CRDs, RBAC, webhook configurations, …).
#
# Output: ${SHAPER_CACHE_DIR:-$HOME/.cache/shaper}/k8s/<versions>/{bin,manifests}, reused
# when present (a binary is rebuilt only when it is missing). build-times.txt there records
# how long each binary took. Needs Go ≥ 1.26 (GOTOOLCHAIN=auto fetches a newer one from the
# Go module proxy if a module asks for it) and the Go module proxy; about 5 GiB of Go build
# cache on the first build.
set -euo pipefail

# shellcheck source=k8s/versions.sh
source "$(dirname "${BASH_SOURCE[0]}")/k8s/versions.sh"

log() { printf 'k8s-build: %s\n' "$*" >&2; }
die() {
  printf 'k8s-build: ERROR: %s\n' "$*" >&2
  exit 1
}

MODE=build
case ${1:-} in
  "") ;;
  --print) MODE=print ;;
  --clean) MODE=clean ;;
  -h | --help)
    sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 0
    ;;
  *) die "unknown argument: $1" ;;
esac

complete() {
  local name
  for name in "${K8S_BINARIES[@]}"; do [[ -x $K8S_BIN/$name ]] || return 1; done
  [[ -s $K8S_MANIFESTS/kueue.yaml ]]
}

if [[ $MODE == print ]]; then
  complete || die "not built yet: $K8S_CACHE (run scripts/k8s-build.sh)"
  echo "$K8S_BIN"
  exit 0
fi

# --- Go -----------------------------------------------------------------------------------
GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
[[ -x $GO ]] || die "Go not found (install Go >= 1.26 or set GO=/path/to/go)"
export GOTOOLCHAIN=${SHAPER_GOTOOLCHAIN:-auto}
export CGO_ENABLED=0 # static binaries, as upstream releases them
export GOFLAGS="${GOFLAGS:-} -mod=readonly -buildvcs=false"

check_pin() { # check_pin MODULE VERSION DIR: versions.sh and the wrapper's go.mod agree
  grep -qE "^(require )?[[:space:]]*$1 $2( // indirect)?\$" "$K8S_SCRIPTS/$3/go.mod" ||
    die "scripts/k8s/$3/go.mod does not require $1 $2 (versions.sh); update both together"
}
check_pin k8s.io/kubernetes "$KUBERNETES_VERSION" kubernetes
check_pin go.etcd.io/etcd/server/v3 "$ETCD_VERSION" etcd
check_pin sigs.k8s.io/kwok "$KWOK_VERSION" kwok
check_pin sigs.k8s.io/kueue "$KUEUE_VERSION" kueue

mkdir -p "$K8S_CACHE_ROOT"
exec 9>"$K8S_CACHE_ROOT/.build.lock"
flock 9 || die "could not lock $K8S_CACHE_ROOT/.build.lock"

if [[ $MODE == clean ]]; then
  log "removing $K8S_CACHE"
  rm -rf "$K8S_CACHE"
fi
if complete; then
  echo "$K8S_BIN"
  exit 0
fi
mkdir -p "$K8S_BIN" "$K8S_MANIFESTS"

minor=${KUBERNETES_VERSION#v1.}
minor=${minor%%.*}
build_date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
k8s_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  k8s_ldflags+=" -X $pkg.gitVersion=$KUBERNETES_VERSION -X $pkg.gitMajor=1"
  k8s_ldflags+=" -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean -X $pkg.buildDate=$build_date"
done

build() { # build NAME WRAPPER PACKAGE LDFLAGS
  local name=$1 wrapper=$2 package=$3 ldflags=$4 started=$SECONDS buildlog
  [[ -x $K8S_BIN/$name ]] && return 0
  log "building $name from $package (scripts/k8s/$wrapper) …"
  buildlog=$K8S_CACHE/build-$name.log
  if ! (cd "$K8S_SCRIPTS/$wrapper" &&
    "$GO" build -trimpath -ldflags "$ldflags" -o "$K8S_BIN/.$name.tmp" "$package") \
    >"$buildlog" 2>&1; then
    tail -n 30 "$buildlog" | sed 's/^/    /' >&2
    rm -f "$K8S_BIN/.$name.tmp"
    die "building $name failed (full log: $buildlog)"
  fi
  mv "$K8S_BIN/.$name.tmp" "$K8S_BIN/$name"
  local took=$((SECONDS - started))
  printf '%s %ss %s\n' "$name" "$took" "$(date -u +%FT%TZ)" >>"$K8S_CACHE/build-times.txt"
  log "built $name in ${took}s"
}

all_started=$SECONDS
build etcd etcd go.etcd.io/etcd/server/v3 "-s -w"
for cmd in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
  build "$cmd" kubernetes "k8s.io/kubernetes/cmd/$cmd" "$k8s_ldflags"
done
build kwok kwok sigs.k8s.io/kwok/cmd/kwok "-s -w"
build kueue kueue sigs.k8s.io/kueue/cmd/kueue \
  "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION -X sigs.k8s.io/kueue/pkg/version.BuildDate=$build_date"

if [[ ! -s $K8S_MANIFESTS/kueue.yaml ]]; then
  kueue_dir=$(cd "$K8S_SCRIPTS/kueue" && "$GO" list -m -f '{{.Dir}}' sigs.k8s.io/kueue)
  [[ -d $kueue_dir/config/default ]] || die "Kueue's module has no config/default ($kueue_dir)"
  "$K8S_BIN/kubectl" kustomize "$kueue_dir/config/default" >"$K8S_MANIFESTS/.kueue.yaml.tmp" ||
    die "kubectl kustomize $kueue_dir/config/default failed"
  {
    echo "# Kueue $KUEUE_VERSION release manifests: kubectl kustomize config/default of"
    echo "# sigs.k8s.io/kueue@$KUEUE_VERSION (Apache-2.0), generated by scripts/k8s-build.sh."
    cat "$K8S_MANIFESTS/.kueue.yaml.tmp"
  } >"$K8S_MANIFESTS/kueue.yaml"
  rm -f "$K8S_MANIFESTS/.kueue.yaml.tmp"
fi

complete || die "build finished but $K8S_CACHE is incomplete"
log "all built in $((SECONDS - all_started))s; cache $(du -sh "$K8S_CACHE" | cut -f1) at $K8S_CACHE"
echo "$K8S_BIN"
