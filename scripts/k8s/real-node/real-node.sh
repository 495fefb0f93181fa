#!/usr/bin/env bash
# One REAL Kubernetes node on this machine (kubelet + containerd + runc) joined to the test
# control plane of scripts/k8s-cluster.sh, next to its kwok nodes, so pods run real processes
# that CRIU checkpoints and restores into a new pod (issue 15; see README.md beside it).
#
#   real-node.sh build          install the OS packages it needs and build every binary into
#                               the cache (make test runs it; nothing when all are there)
#   real-node.sh start          build what is missing, start containerd, the control plane
#                               and the kubelet; wait until the Node is Ready; advertise GPUs
#   real-node.sh built          exit 0 when every binary is in the cache, else name the missing
#   real-node.sh checkpoint NS POD CONTAINER
#                               the kubelet's checkpoint API; prints the archive's path
#   real-node.sh image ARCHIVE NAME
#                               that archive as a checkpoint OCI image NAME, imported into
#                               containerd's k8s.io namespace (a pod with image NAME restores it)
#   real-node.sh restore-demo   counter pod → checkpoint → delete → new pod from the
#                               checkpoint image; prints the counts before and after
#   real-node.sh demo           two busybox pods (one with 2 GPUs), a kubelet checkpoint of one
#   real-node.sh stop           stop the kubelet, the pods' containers, containerd, the
#                               control plane
#
# Needs: root; Debian packages runc containernetworking-plugins busybox-static (installed
# by build and start when missing), gcc (pause image), openssl; criu >= 4 (scripts/install-criu.sh); Go (kubelet from the same wrapper
# module pins as scripts/k8s-build.sh, containerd from the Go module proxy); cgroup v1
# hierarchies cpu cpuacct cpuset memory (kubelet flag failCgroupV1=false).
#
# Binaries are cached in ${SHAPER_CACHE_DIR:-~/.cache/shaper}/k8s/real-node-<versions>/bin
# (built once, like scripts/k8s-build.sh's); the run's state (control plane, containerd,
# kubelet, pod logs, images) lives under $EXP (default /tmp/kubelet-exp). Beside this
# script: mkimage.py (OCI archive writer), fakegpu/main.go (device plugin), pods.yaml (demo).
#
# containerd: v2.3.7 by default, the newest release whose CRI restores a container from a
# checkpoint image (CreateContainer with an image whose manifest carries
# org.criu.checkpoint.container.name; opt-in since 2.3.x with
# enable_experimental_restore_via_create, removed in 2.4 in favour of the RestorePod RPC of
# KEP-5823, which 2.4.2 does not have yet). CONTAINERD_VERSION=v2.4.2 checkpoints but cannot
# restore; CONTAINERD_VERSION=deb uses Debian's 1.6.20 (no CRI checkpoint at all).
#
# Measured on this machine (2 shared cores; figures in README.md beside this script):
#   first build  scripts/k8s-build.sh 3184 s; kubelet 348 s; containerd 2.3.7 + shim + ctr
#                209 s (2.4.2's Go build cache warm)
#   cached start 24-51 s; restore-demo 15-17 s (checkpoint 0.6-1.8 s, checkpoint image
#                0.6-1.0 s, restored pod Running 0.9-1.2 s after it is created); stop 6-10 s
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=${REPO:-$(cd "$HERE/../../.." && pwd)}
EXP=${EXP:-/tmp/kubelet-exp}
export SHAPER_K8S_PORT_BASE=${SHAPER_K8S_PORT_BASE:-25600}
NODE=${NODE:-shaper-real-1}
GPUS=${GPUS:-8}
CLUSTER_DIR=$EXP/cluster
KUBELET_PORT=$((SHAPER_K8S_PORT_BASE + 90))
KUBELET_HEALTHZ_PORT=$((SHAPER_K8S_PORT_BASE + 91))
CTRD=$EXP/containerd-${CONTAINERD_VERSION:-v2.3.7}
SOCK=$CTRD/containerd.sock
KLET=$EXP/kubelet
BUSYBOX_IMAGE=docker.io/shaper/busybox:local
PAUSE_IMAGE=registry.k8s.io/pause:3.10

# shellcheck source=/work/main/scripts/k8s/versions.sh
source "$REPO/scripts/k8s/versions.sh"
CONTAINERD_VERSION=${CONTAINERD_VERSION:-v2.3.7} # "deb" = Debian's containerd 1.6.20
# the node's binaries, cached like the control plane's (SHAPER_REAL_NODE_DIR overrides)
RN_CACHE=${SHAPER_REAL_NODE_DIR:-$K8S_CACHE_ROOT/real-node-kubernetes-$KUBERNETES_VERSION+containerd-$CONTAINERD_VERSION}
BIN=$RN_CACHE/bin
MOD=$RN_CACHE/kmod
log() { printf 'real-node: %s (t=%ss)\n' "$*" "$SECONDS" >&2; }
die() {
  printf 'real-node: ERROR: %s\n' "$*" >&2
  exit 1
}
KUBECTL=("$K8S_BIN/kubectl" --kubeconfig "$CLUSTER_DIR/kubeconfig")

build_kubelet() { # the kubelet from k8s.io/kubernetes at KUBERNETES_VERSION, same pins
  [[ -x $BIN/kubelet ]] && return 0
  local mod=$MOD minor=${KUBERNETES_VERSION#v1.}
  minor=${minor%%.*}
  mkdir -p "$mod" "$BIN"
  cp "$REPO/scripts/k8s/kubernetes/go.mod" "$REPO/scripts/k8s/kubernetes/go.sum" "$mod/"
  sed -i 's#^module .*#module shaper.local/kubelet-exp#; s#^\tk8s.io/kubernetes/cmd/kubectl$#&\n\tk8s.io/kubernetes/cmd/kubelet#' "$mod/go.mod"
  (cd "$mod" && GOFLAGS=-buildvcs=false go mod tidy) # adds 3 modules the kubelet needs
  local ld="-s -w" pkg
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $pkg.gitVersion=$KUBERNETES_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
  done
  log "building kubelet"
  (cd "$mod" && CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false" \
    go build -trimpath -ldflags "$ld" -o "$BIN/kubelet.part" k8s.io/kubernetes/cmd/kubelet)
  mv "$BIN/kubelet.part" "$BIN/kubelet"
}

build_images() { # busybox (the pods) and pause (the sandbox), single-layer OCI archives
  local img=$EXP/images links
  mkdir -p "$img"
  if [[ ! -s $img/pause.tar ]]; then
    gcc -Os -static -DVERSION=3.10-shaper -o "$img/pause" \
      "$(go env GOMODCACHE)/k8s.io/kubernetes@$KUBERNETES_VERSION/build/pause/linux/pause.c"
    python3 "$HERE/mkimage.py" "$img/pause.tar" "$PAUSE_IMAGE" '["/pause"]' '[]' "$img/pause:/pause"
  fi
  if [[ ! -s $img/busybox.tar ]]; then
    links=$(/bin/busybox --list | grep -v '^busybox$' | sed 's#^#/bin/#' | paste -sd,)
    python3 "$HERE/mkimage.py" "$img/busybox.tar" "$BUSYBOX_IMAGE" '[]' '["/bin/sh"]' \
      "/bin/busybox:/bin/busybox:$links"
  fi
}

CONTAINERD_BIN=$BIN/containerd
CTR=$BIN/ctr
if [[ $CONTAINERD_VERSION == deb ]]; then CONTAINERD_BIN=containerd CTR=ctr; fi

build_containerd() { # containerd 2 (CRI CheckpointContainer, RuntimeConfig) from the Go proxy
  [[ $CONTAINERD_VERSION == deb ]] && return 0
  [[ -x $BIN/containerd && -x $BIN/containerd-shim-runc-v2 && -x $BIN/ctr ]] && return 0
  log "building containerd $CONTAINERD_VERSION"
  # $EXP too: on a fresh machine nothing has made it yet (a cold cache stopped here)
  mkdir -p "$BIN" "$EXP"
  (cd "$EXP" && GOFLAGS=-buildvcs=false GOBIN=$BIN CGO_ENABLED=0 go install \
    -tags "no_btrfs no_devmapper no_zfs no_aufs" \
    "github.com/containerd/containerd/v2/cmd/containerd@$CONTAINERD_VERSION" \
    "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION" \
    "github.com/containerd/containerd/v2/cmd/ctr@$CONTAINERD_VERSION")
}

restore_option() { # CRI restore from a checkpoint image: an opt-in in 2.3.x, gone in 2.4
  case $CONTAINERD_VERSION in
    v2.2.* | v2.3.*) echo '  enable_experimental_restore_via_create = true' ;;
  esac
}

containerd_config() {
  # restrict_oom_score_adj: this machine's root lacks CAP_SYS_RESOURCE, so runc cannot lower
  # oom_score_adj (the kubelet asks -998 for sandboxes) and every sandbox fails with "runc
  # create failed: unable to start container process: can't get final child's PID from
  # pipe: EOF". Clamp to containerd's own score instead.
  if [[ $CONTAINERD_VERSION == deb ]]; then
    cat <<EOF
version = 2
root = "$CTRD/root"
state = "$CTRD/state"
[grpc]
  address = "$SOCK"
[ttrpc]
  address = "$SOCK.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "/usr/sbin/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$CTRD/cni-conf"
EOF
  else
    cat <<EOF
version = 3
root = "$CTRD/root"
state = "$CTRD/state"
[grpc]
  address = "$SOCK"
[ttrpc]
  address = "$SOCK.ttrpc"
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "$PAUSE_IMAGE"
[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
$(restore_option)
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "/usr/sbin/runc"
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "$CTRD/cni-conf"
EOF
  fi
}

start_containerd() {
  mkdir -p "$CTRD"/{root,state,cni-conf} "$EXP/logs"
  containerd_config >"$CTRD/config.toml"
  # A CNI network, only so that containerd reports NetworkReady (else the Node stays
  # NotReady); the pods here use hostNetwork and never call it.
  cat >"$CTRD/cni-conf/10-shaper.conflist" <<EOF
{"cniVersion":"1.0.0","name":"shaper-exp","plugins":[
 {"type":"bridge","bridge":"shaperexp0","isGateway":true,"ipMasq":false,
  "ipam":{"type":"host-local","ranges":[[{"subnet":"10.88.0.0/16"}]],"dataDir":"$CTRD/cni-ipam"}}]}
EOF
  if ! { [[ -s $EXP/containerd.pid ]] && kill -0 "$(cat "$EXP/containerd.pid")" 2>/dev/null; }; then
    # PATH: containerd finds its shim (containerd-shim-runc-v2) and criu there
    PATH=$BIN:$PATH "$CONTAINERD_BIN" --config "$CTRD/config.toml" \
      >>"$EXP/logs/containerd.log" 2>&1 </dev/null &
    echo $! >"$EXP/containerd.pid"
    disown
  fi
  local i
  for ((i = 0; i < 100; i++)); do "$CTR" --address "$SOCK" version >/dev/null 2>&1 && break; sleep 0.1; done
  "$CTR" --address "$SOCK" -n k8s.io images import "$EXP/images/busybox.tar" >/dev/null
  "$CTR" --address "$SOCK" -n k8s.io images import "$EXP/images/pause.tar" >/dev/null
  log "containerd $("$CONTAINERD_BIN" --version | awk '{print $3}') ready, images imported"
}

node_credentials() { # client certificate system:node:NODE / system:nodes from the cluster CA
  local pki=$CLUSTER_DIR/pki
  mkdir -p "$KLET/pki"
  if [[ ! -s $KLET/pki/node.crt ]]; then
    openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
      -keyout "$KLET/pki/node.key" -out "$KLET/pki/node.csr" \
      -subj "/O=system:nodes/CN=system:node:$NODE" 2>/dev/null
    printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n' >"$KLET/pki/node.ext"
    openssl x509 -req -in "$KLET/pki/node.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" \
      -CAcreateserial -days 3650 -sha256 -extfile "$KLET/pki/node.ext" -out "$KLET/pki/node.crt" 2>/dev/null
    chmod 0600 "$KLET/pki/node.key"
  fi
  cat >"$KLET/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: shaper-test
  cluster: {server: "https://127.0.0.1:$((SHAPER_K8S_PORT_BASE + 43))", certificate-authority: $pki/ca.crt}
users:
- name: node
  user: {client-certificate: $KLET/pki/node.crt, client-key: $KLET/pki/node.key}
contexts:
- name: node
  context: {cluster: shaper-test, user: node}
current-context: node
EOF
  cat >"$KLET/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false          # the machine has cgroup v1 controllers only
cgroupDriver: cgroupfs       # no systemd
failSwapOn: false
containerRuntimeEndpoint: unix://$SOCK
imageServiceEndpoint: unix://$SOCK
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ_PORT
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $pki/ca.crt}
authorization: {mode: Webhook}
podLogsDir: $EXP/pod-logs
resolvConf: /etc/resolv.conf
registerNode: true
rotateCertificates: false
serverTLSBootstrap: false
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
EOF
}

start_kubelet() {
  # The kubelet sets vm.overcommit_memory, kernel.panic, kernel.panic_on_oops …
  # (setupKernelTunables); keep the machine's values and put them back once it is up.
  [[ -s $EXP/sysctl.orig ]] || for k in vm.overcommit_memory vm.panic_on_oom kernel.panic \
    kernel.panic_on_oops kernel.keys.root_maxkeys kernel.keys.root_maxbytes; do
    echo "$k=$(sysctl -n "$k")"
  done >"$EXP/sysctl.orig"
  if ! { [[ -s $EXP/kubelet.pid ]] && kill -0 "$(cat "$EXP/kubelet.pid")" 2>/dev/null; }; then
    PATH=$BIN:$PATH "$BIN/kubelet" --config "$KLET/config.yaml" --kubeconfig "$KLET/kubeconfig" \
      --root-dir "$KLET/root" --cert-dir "$KLET/pki-serving" --hostname-override "$NODE" \
      --node-labels "shaper.io/real-node=true,nvidia.com/gpu.present=true,nvidia.com/gpu.count=$GPUS" \
      -v 2 >>"$EXP/logs/kubelet.log" 2>&1 </dev/null &
    echo $! >"$EXP/kubelet.pid"
    disown
  fi
  local i # `kubectl wait` fails at once while the Node does not exist yet
  for ((i = 0; i < 600; i++)); do
    [[ $("${KUBECTL[@]}" get node "$NODE" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null) == True ]] && break
    kill -0 "$(cat "$EXP/kubelet.pid")" 2>/dev/null || die "kubelet exited; see $EXP/logs/kubelet.log"
    sleep 0.2
  done
  ((i < 600)) || die "node $NODE not Ready within 120 s; see $EXP/logs/kubelet.log"
  sysctl -q -p "$EXP/sysctl.orig"
  log "node $NODE Ready (kubelet $("$BIN/kubelet" --version | awk '{print $2}'))"
}

advertise_gpus() {
  if [[ ${GPU_MODE:-plugin} == plugin ]]; then
    # A device plugin over the kubelet's registration socket (always
    # /var/lib/kubelet/device-plugins/kubelet.sock, whatever --root-dir says): the kubelet
    # then allocates device IDs to pods (NVIDIA_VISIBLE_DEVICES=gpu-0,gpu-1 in the container).
    build_fakegpu
    if ! { [[ -s $EXP/fakegpu.pid ]] && kill -0 "$(cat "$EXP/fakegpu.pid")" 2>/dev/null; }; then
      "$BIN/fakegpu" --gpus "$GPUS" >>"$EXP/logs/fakegpu.log" 2>&1 </dev/null &
      echo $! >"$EXP/fakegpu.pid"
      disown
    fi
  else
    # extended resource through the Node status (as the kwok nodes have it); the kubelet
    # keeps it but allocates no device IDs
    "${KUBECTL[@]}" patch node "$NODE" --subresource=status --type=merge \
      -p "{\"status\":{\"capacity\":{\"nvidia.com/gpu\":\"$GPUS\"},\"allocatable\":{\"nvidia.com/gpu\":\"$GPUS\"}}}" >/dev/null
  fi
  local i
  for ((i = 0; i < 150; i++)); do
    [[ $("${KUBECTL[@]}" get node "$NODE" -o 'jsonpath={.status.allocatable.nvidia\.com/gpu}') == "$GPUS" ]] && break
    sleep 0.2
  done
  log "node $NODE advertises nvidia.com/gpu=$GPUS (${GPU_MODE:-plugin})"
}

build_fakegpu() { # the device plugin, built in the kubelet's module (its go.mod has what it needs)
  [[ -x $BIN/fakegpu ]] && return 0
  build_kubelet
  mkdir -p "$MOD/fakegpu"
  cp "$HERE/fakegpu/main.go" "$MOD/fakegpu/"
  (cd "$MOD" && CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false" \
    go build -trimpath -ldflags "-s -w" -o "$BIN/fakegpu" ./fakegpu)
}

install_packages() { # runc, the CNI bridge plugin, a static busybox (the pods' image)
  command -v runc >/dev/null && [[ -x /usr/lib/cni/bridge && -x /bin/busybox ]] && return 0
  command -v apt-get >/dev/null ||
    die "install runc, the CNI plugins (containernetworking-plugins) and a static busybox"
  local sudo=""
  [[ $(id -u) -eq 0 ]] || sudo=sudo
  log "installing runc, containernetworking-plugins and busybox-static from the OS packages"
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq runc \
    containernetworking-plugins busybox-static >/dev/null
}

cmd_build() { # everything the node needs, into the cache by version (make test runs it)
  install_packages
  "$REPO/scripts/k8s-build.sh" >/dev/null
  build_kubelet
  build_containerd
  build_fakegpu
  cmd_built >/dev/null
}

cmd_start() {
  install_packages
  [[ $CONTAINERD_VERSION != deb ]] || command -v containerd >/dev/null ||
    die "apt-get install containerd (CONTAINERD_VERSION=deb)"
  command -v criu >/dev/null || die "no criu: scripts/install-criu.sh (containerd's CRI checkpoints and restores with it)"
  "$REPO/scripts/k8s-build.sh" >/dev/null
  build_kubelet
  build_containerd
  build_images
  start_containerd
  "$REPO/scripts/k8s-cluster.sh" start --dir "$CLUSTER_DIR"
  node_credentials
  start_kubelet
  advertise_gpus
  log "up"
}

stop_pid() { # stop_pid FILE
  local pid
  [[ -s $1 ]] || return 0
  pid=$(cat "$1")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$1"
}

cmd_stop() {
  # the node's pods first, so the kubelet stops them and unmounts their volumes
  "${KUBECTL[@]}" delete pods -A --field-selector "spec.nodeName=$NODE" --grace-period 2 \
    --wait=true --timeout 60s >/dev/null 2>&1 || true
  "${KUBECTL[@]}" delete node "$NODE" --wait=false >/dev/null 2>&1 || true
  stop_pid "$EXP/fakegpu.pid"
  stop_pid "$EXP/kubelet.pid"
  if [[ -S $SOCK ]]; then # the pods' containers and sandboxes (their shims outlive containerd)
    local id
    for id in $("$CTR" --address "$SOCK" -n k8s.io tasks ls -q 2>/dev/null); do
      "$CTR" --address "$SOCK" -n k8s.io tasks kill -s KILL "$id" >/dev/null 2>&1 || true
    done
    sleep 1
    for id in $("$CTR" --address "$SOCK" -n k8s.io tasks ls -q 2>/dev/null); do
      "$CTR" --address "$SOCK" -n k8s.io tasks rm -f "$id" >/dev/null 2>&1 || true
    done
  fi
  stop_pid "$EXP/containerd.pid"
  # the kubelet's bind mount of its root dir, pod volumes (projected tokens), sandbox /dev/shm
  findmnt -rn -o TARGET | grep "^$EXP/" | sort -r | xargs -r umount || true
  "$REPO/scripts/k8s-cluster.sh" stop --dir "$CLUSTER_DIR" || true
  [[ -s $EXP/sysctl.orig ]] && sysctl -q -p "$EXP/sysctl.orig"
  # kubepods cgroups the kubelet made (empty once the containers are gone)
  find /sys/fs/cgroup/*/kubepods -depth -type d -exec rmdir {} + 2>/dev/null || true
  # the device manager's files (a fixed folder, whatever --root-dir says): the kubelet's
  # registration socket and allocation checkpoint, the plugin's socket
  rm -f /var/lib/kubelet/device-plugins/{kubelet.sock,kubelet_internal_checkpoint,shaper-fakegpu.sock}
  rmdir /var/lib/kubelet/device-plugins /var/lib/kubelet 2>/dev/null || true
  # the CNI bridge, made by the first pod not on the host network, and CNI's cache folders
  ip link del shaperexp0 2>/dev/null || true
  rmdir /var/lib/cni/results /var/lib/cni 2>/dev/null || true
}

cmd_demo() { # a hostNetwork busybox counter and a 2-GPU one; checkpoint the first via the kubelet
  "${KUBECTL[@]}" apply -f "$HERE/pods.yaml" >/dev/null
  "${KUBECTL[@]}" wait --for condition=Ready --timeout 60s pod/counter pod/gpu-counter >/dev/null
  log "pods Running"
  "${KUBECTL[@]}" get pods -o wide
  sleep 3
  ps -eo pid,ppid,cmd | grep '[w]hile true' | cut -c1-110
  cat "$EXP"/pod-logs/default_gpu-counter_*/counter/*.log
  # the kubelet's ContainerCheckpoint API (CRI CheckpointContainer: containerd >= 2 only)
  curl -sS -k --cert "$CLUSTER_DIR/pki/admin.crt" --key "$CLUSTER_DIR/pki/admin.key" -X POST \
    "https://127.0.0.1:$KUBELET_PORT/checkpoint/default/counter/counter?timeout=60"
  echo
  log "checkpointed default/counter/counter"
  "${KUBECTL[@]}" delete pod counter gpu-counter --wait=true --timeout 60s >/dev/null
  log "pods deleted"
}

cmd_built() { # every binary the node needs is in the cache (builds nothing)
  local missing=() name
  for name in kubelet containerd containerd-shim-runc-v2 ctr; do
    [[ $CONTAINERD_VERSION == deb && $name != kubelet ]] && continue
    [[ -x $BIN/$name ]] || missing+=("$name")
  done
  [[ ${GPU_MODE:-plugin} == plugin && ! -x $BIN/fakegpu ]] && missing+=(fakegpu)
  "$REPO/scripts/k8s-build.sh" --print >/dev/null 2>&1 || missing+=("the control plane (scripts/k8s-build.sh)")
  ((${#missing[@]} == 0)) || die "not built in $BIN: ${missing[*]} (real-node.sh start builds them)"
  echo "$BIN"
}

cmd_checkpoint() { # NS POD CONTAINER: the kubelet's checkpoint API; prints the archive path
  (($# == 3)) || die "usage: $0 checkpoint NAMESPACE POD CONTAINER"
  local out
  out=$(curl -sS --fail-with-body -k --cert "$CLUSTER_DIR/pki/admin.crt" \
    --key "$CLUSTER_DIR/pki/admin.key" -X POST \
    "https://127.0.0.1:$KUBELET_PORT/checkpoint/$1/$2/$3?timeout=60") || die "checkpoint failed: $out"
  python3 -c 'import json,sys; print(json.load(sys.stdin)["items"][0])' <<<"$out"
}

cmd_image() { # ARCHIVE NAME: the archive as checkpoint image NAME in containerd (k8s.io)
  (($# == 2)) || die "usage: $0 image ARCHIVE NAME"
  local oci=$EXP/images/checkpoint-$$.tar container
  mkdir -p "$EXP/images"
  # the container's name, as the kubelet's archive records it (config.dump)
  container=$(tar -xOf "$1" config.dump | python3 -c 'import json,sys; print(json.load(sys.stdin)["name"])')
  python3 "$HERE/mkimage.py" --checkpoint "$oci" "$2" "$1" "$container"
  "$CTR" --address "$SOCK" -n k8s.io images rm --sync "$2" >/dev/null 2>&1 || true
  "$CTR" --address "$SOCK" -n k8s.io images import "$oci" >/dev/null
  rm -f "$oci"
}

counter_pod() { # NAME IMAGE: the counter (prints 1, 2, 3, … one a second) on the real node
  cat <<EOF
{"apiVersion":"v1","kind":"Pod","metadata":{"name":"$1","namespace":"default"},
 "spec":{"hostNetwork":true,"nodeSelector":{"shaper.io/real-node":"true"},
  "terminationGracePeriodSeconds":2,"restartPolicy":"Never",
  "containers":[{"name":"counter","image":"$2","imagePullPolicy":"Never",
   "command":["sh","-c","i=0; while true; do i=\$((i+1)); echo \$i; sleep 1; done"]}]}}
EOF
}

ms() { echo $(($(date +%s%N) / 1000000)); }
since_ms() { # T0: seconds since T0 (from ms), to the hundredth
  local d=$(($(ms) - $1))
  printf '%d.%02d' $((d / 1000)) $((d % 1000 / 10))
}

counts() { # POD [SINCE]: the numbers the pod's counter printed (since SINCE, a UTC second)
  local uid f
  uid=$("${KUBECTL[@]}" get pod "$1" -o jsonpath='{.metadata.uid}')
  f=$(find "$EXP/pod-logs/default_$1_$uid/counter/" -name '*.log' | sort | tail -1)
  # CRI log lines: "<RFC 3339 time> stdout F <text>"
  awk -v since="${2:-}" 'NF == 4 && substr($1, 1, 19) >= since {print $4}' "$f"
}

cmd_restore_demo() { # counter → kubelet checkpoint → pod deleted → new pod restores it
  local t0 archive before after since first now image=localhost/shaper/counter-checkpoint:demo
  "${KUBECTL[@]}" delete pod counter counter-restored --ignore-not-found --wait=true >/dev/null
  counter_pod counter "$BUSYBOX_IMAGE" | "${KUBECTL[@]}" apply -f - >/dev/null
  "${KUBECTL[@]}" wait --for condition=Ready --timeout 60s pod/counter >/dev/null
  sleep 5
  before=$(counts counter | tail -1)
  t0=$(ms)
  archive=$(cmd_checkpoint default counter counter)
  after=$(counts counter | tail -1)
  log "checkpointed at count $before..$after in $(since_ms "$t0") s: $archive ($(du -h "$archive" | cut -f1))"
  "${KUBECTL[@]}" delete pod counter --wait=true --timeout 60s >/dev/null
  log "pod counter deleted"
  t0=$(ms)
  cmd_image "$archive" "$image"
  log "checkpoint image $image imported in $(since_ms "$t0") s"
  t0=$(ms)
  since=$(date -u +%Y-%m-%dT%H:%M:%S)
  counter_pod counter-restored "$image" | "${KUBECTL[@]}" apply -f - >/dev/null
  "${KUBECTL[@]}" wait --for condition=Ready --timeout 120s pod/counter-restored >/dev/null
  log "pod counter-restored Ready $(since_ms "$t0") s after apply"
  sleep 3
  # the new pod's log begins with the old one's up to the checkpoint (containerd restores
  # the container log from the archive), then what the restored process prints
  log "restored pod's log: $(counts counter-restored | paste -sd' ')"
  first=$(counts counter-restored "$since" | head -1)
  now=$(counts counter-restored | tail -1)
  log "restored counter: first count after the restore $first, now $now (checkpoint taken at $before..$after)"
  ((first > before && first <= after + 1)) || die "the counter did not continue: $first after $before..$after"
  "${KUBECTL[@]}" delete pod counter-restored --wait=true --timeout 60s >/dev/null
}

case ${1:-} in
  build) cmd_build ;;
  start) cmd_start ;;
  stop) cmd_stop ;;
  built) cmd_built ;;
  checkpoint) cmd_checkpoint "${@:2}" ;;
  image) cmd_image "${@:2}" ;;
  demo) cmd_demo ;;
  restore-demo) cmd_restore_demo ;;
  *) die "usage: $0 build|start|built|checkpoint NS POD CONTAINER|image ARCHIVE NAME|restore-demo|demo|stop" ;;
esac
