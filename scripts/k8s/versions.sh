# Versions of the Kubernetes test control plane, shared by scripts/k8s-build.sh and
# scripts/k8s-cluster.sh (sourced, not run). Each one must match the `require` line of its
# wrapper module in scripts/k8s/<component>/go.mod; k8s-build.sh checks that they do.
# shellcheck shell=bash

KUBERNETES_VERSION=v1.37.2 # newest k8s.io/kubernetes release that builds with Go 1.26
ETCD_VERSION=v3.7.3        # go.etcd.io/etcd/server/v3
KWOK_VERSION=v0.8.0        # sigs.k8s.io/kwok
KUEUE_VERSION=v0.17.0      # sigs.k8s.io/kueue

K8S_SCRIPTS=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
K8S_CACHE_ROOT=${SHAPER_CACHE_DIR:-$HOME/.cache/shaper}/k8s
K8S_CACHE_KEY=kubernetes-$KUBERNETES_VERSION+etcd-$ETCD_VERSION+kwok-$KWOK_VERSION+kueue-$KUEUE_VERSION
# SHAPER_K8S_DIR overrides the whole cache folder (bin/ and manifests/ inside).
K8S_CACHE=${SHAPER_K8S_DIR:-$K8S_CACHE_ROOT/$K8S_CACHE_KEY}
K8S_BIN=$K8S_CACHE/bin
K8S_MANIFESTS=$K8S_CACHE/manifests
K8S_BINARIES=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok kueue)
