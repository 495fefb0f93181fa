#!/usr/bin/env bash
# A real Kubernetes control plane with Kueue and fake GPU nodes, as local processes on
# loopback, for development and tests (binaries from scripts/k8s-build.sh).
#
#   scripts/k8s-cluster.sh start  [--dir DIR] [--nodes N] [--gpus-per-node G]
#   scripts/k8s-cluster.sh stop   [--dir DIR]   stop every component by PID
#   scripts/k8s-cluster.sh status [--dir DIR]   components and nodes
#   scripts/k8s-cluster.sh restart COMPONENT [--dir DIR]   stop one component, start it again
#
# Components: etcd (TLS, client certificates), kube-apiserver (RBAC and Node authorization,
# the default admission plugins plus NodeRestriction, service-account signing keys),
# kube-controller-manager, kube-scheduler, Kueue's manager and kwok. Each component talks to
# the API server with its own client certificate: the controller manager and the scheduler
# as system:kube-controller-manager / system:kube-scheduler (Kubernetes' bootstrap RBAC),
# Kueue as its ServiceAccount kueue-system/kueue-controller-manager (the RBAC of Kueue's
# release), kwok (which plays the kubelet of every fake node) in system:masters.
#
# Kueue: its release manifests (CRDs, RBAC, webhook configurations) are applied, less the
# Deployment; the manager runs here with Kueue's internal certificate management, which
# issues the webhook certificate for kueue-webhook-service.kueue-system.svc and injects its
# CA into the webhook configurations and CRDs; this script plays the kubelet's part and
# copies that Secret (kueue-system/kueue-webhook-server-cert) into the manager's certDir,
# once per start (a rotation by Kueue while running is not followed). The webhook Service is
# an ExternalName for localhost (scripts/k8s/kueue-manifests.py says why), so the API server
# calls the webhooks on 127.0.0.1 with full TLS verification. Frameworks:
# SHAPER_KUEUE_FRAMEWORKS (default batch/job). Kueue's visibility API (an aggregated API
# server) is not registered, though the API server has its aggregation layer (front proxy).
#
# Nodes: N kwok nodes kwok-gpu-1..N (default 3), each with G (default 8) nvidia.com/gpu and
# the labels NVIDIA's GPU feature discovery sets (nvidia.com/gpu.product, .memory, .count,
# .family, .present …). More nodes: create a Node with the annotation
# kwok.x-k8s.io/node=fake and kwok runs it. Pods on them go Running and stay so until deleted;
# a Job's pod with the annotation pod-complete.stage.kwok.x-k8s.io/delay: "30s" succeeds
# after that delay (scripts/k8s/kwok-stages.yaml).
#
# Ports (127.0.0.1 only, from SHAPER_K8S_PORT_BASE, default 24400): etcd +0 (peer +1),
# kube-apiserver +43, kube-controller-manager +57, kube-scheduler +59, Kueue webhooks +44,
# Kueue health +81 and metrics +83, kwok +47. Everything else lives under DIR (default
# /var/lib/shaper-k8s): pki/, kubeconfigs, etcd data, logs, PID files, and `env` (source it
# for kubectl). Idempotent: `start` starts only what is not running; `stop` stops what is.
# Every failure prints the reason and the tail of the failing component's log.
#
# Environment: SHAPER_K8S_WAIT_S (seconds to wait for each component, default 120),
# SHAPER_CACHE_DIR / SHAPER_K8S_DIR (where scripts/k8s-build.sh put the binaries).
set -euo pipefail

# shellcheck source=k8s/versions.sh
source "$(dirname "${BASH_SOURCE[0]}")/k8s/versions.sh"
REPO=$(cd "$K8S_SCRIPTS/../.." && pwd)

PORT_BASE=${SHAPER_K8S_PORT_BASE:-24400}
readonly ETCD_PORT=$((PORT_BASE + 0)) ETCD_PEER_PORT=$((PORT_BASE + 1))
readonly API_PORT=$((PORT_BASE + 43)) KCM_PORT=$((PORT_BASE + 57)) SCHED_PORT=$((PORT_BASE + 59))
readonly KUEUE_WEBHOOK_PORT=$((PORT_BASE + 44)) KUEUE_HEALTH_PORT=$((PORT_BASE + 81))
readonly KUEUE_METRICS_PORT=$((PORT_BASE + 83)) KWOK_PORT=$((PORT_BASE + 47))
readonly SERVICE_CIDR=10.0.0.0/24 SERVICE_IP=10.0.0.1 POD_CIDR=10.244.0.0/16
readonly COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok kueue)
WAIT_S=${SHAPER_K8S_WAIT_S:-120}
KUEUE_FRAMEWORKS=${SHAPER_KUEUE_FRAMEWORKS:-batch/job}
NODES=3
GPUS_PER_NODE=8
GPU_PRODUCT=NVIDIA-H100-80GB-HBM3
GPU_MEMORY_MIB=81559
GPU_FAMILY=hopper
DIR=/var/lib/shaper-k8s

log() { printf 'k8s-cluster: %s\n' "$*" >&2; }
# alive, stop_daemons GRACE_S NAME...
# shellcheck source=lib/daemons.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/daemons.sh"
die() {
  printf 'k8s-cluster: ERROR: %s\n' "$*" >&2
  exit 1
}
usage() {
  sed -n '5,8p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

# --- arguments -------------------------------------------------------------------------
[[ $# -ge 1 ]] || usage
COMMAND=$1
shift
COMPONENT=
while [[ $# -gt 0 ]]; do
  case $1 in
    --dir | --nodes | --gpus-per-node)
      [[ $# -ge 2 ]] || die "$1 needs a value"
      case $1 in
        --dir) DIR=$2 ;;
        --nodes) NODES=$2 ;;
        --gpus-per-node) GPUS_PER_NODE=$2 ;;
      esac
      shift 2
      ;;
    --dir=*) DIR=${1#--dir=} && shift ;;
    --nodes=*) NODES=${1#--nodes=} && shift ;;
    --gpus-per-node=*) GPUS_PER_NODE=${1#--gpus-per-node=} && shift ;;
    -h | --help) usage ;;
    *)
      [[ $COMMAND == restart && -z $COMPONENT && $1 != -* ]] || die "unknown argument: $1"
      COMPONENT=$1
      shift
      ;;
  esac
done
case $COMMAND in start | stop | status | restart) ;; *) usage ;; esac
[[ $COMMAND != restart || -n $COMPONENT ]] || usage
[[ $NODES =~ ^[0-9]+$ && $GPUS_PER_NODE =~ ^[0-9]+$ ]] || die "--nodes and --gpus-per-node take numbers"
[[ $DIR == /* ]] || DIR=$(pwd)/$DIR
DIR=${DIR%/}

readonly PKI=$DIR/pki RUN=$DIR/run LOGS=$DIR/log ETC=$DIR/etc
readonly ADMIN_KUBECONFIG=$DIR/kubeconfig
KUBECTL=("$K8S_BIN/kubectl" --kubeconfig "$ADMIN_KUBECONFIG")

# --- PID helpers: a PID counts only while it still runs the expected program -----------
pid_of() { # pid_of NAME -> the live PID recorded for NAME, or nothing
  local name=$1 file=$RUN/$1.pid pid
  [[ -s $file ]] || return 0
  pid=$(tr -dc '0-9' <"$file")
  [[ -n $pid ]] && alive "$pid" || return 0
  # /proc/PID/comm holds the first 15 characters of the program's name.
  [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "${name:0:15}" ]] && echo "$pid"
  return 0
}

fail_with_log() { # fail_with_log MESSAGE COMPONENT
  local message=$1 logfile=$LOGS/$2.log
  if [[ -f $logfile ]]; then
    printf 'k8s-cluster: last lines of %s:\n' "$logfile" >&2
    tail -n 30 "$logfile" | cut -c1-400 | sed 's/^/    /' >&2
  fi
  die "$message"
}

port_free() { ! ss -Hltn "sport = :$1" | grep -q .; }
port_owner() { ss -Hltnp "sport = :$1" | awk '{print $NF}'; }

launch() { # launch NAME PORT ARGS...: start the binary NAME in its own session, record its PID
  local name=$1 port=$2
  shift 2
  port_free "$port" || die "port $port for $name is taken by another process: $(port_owner "$port")"
  printf '\n===== %s: starting %s\n' "$(date -u +%FT%TZ)" "$name" >>"$LOGS/$name.log"
  # setsid and env exec, so $! is the component itself; LAUNCH_ENV: NAME=VALUE for it.
  setsid env "${LAUNCH_ENV[@]}" "$K8S_BIN/$name" "$@" </dev/null >>"$LOGS/$name.log" 2>&1 &
  echo $! >"$RUN/$name.pid"
  LAUNCHED+=("$name")
}
LAUNCH_ENV=()
LAUNCHED=()
RELAUNCHED=()

silent_exit() { # silent_exit NAME: its log ends with the line launch wrote
  [[ $(tail -n 1 "$LOGS/$1.log" 2>/dev/null) == "===== "*": starting $1" ]]
}

still_exec_ing() { # still_exec_ing NAME: its recorded PID is alive and not yet the binary
  # Just after launch, on a loaded machine, the process may not have exec'd the binary yet:
  # /proc/PID/comm still says setsid or env, or, before even setsid was exec'd, this
  # script's own name (the forked subshell of `launch`), none of which is "exited". (That
  # last window, taken for an exit, failed a CI run: the log held only the start line.)
  local file=$RUN/$1.pid pid comm
  [[ -s $file ]] || return 1
  pid=$(tr -dc '0-9' <"$file")
  [[ -n $pid ]] && alive "$pid" || return 1
  comm=$(cat "/proc/$pid/comm" 2>/dev/null)
  [[ $comm == setsid || $comm == env || $comm == "$SELF_COMM" ]]
}
SELF_COMM=$(cat "/proc/$$/comm")

wait_until() { # wait_until NAME WHAT COMMAND...: poll COMMAND for WAIT_S while NAME runs
  local name=$1 what=$2 i
  shift 2
  for ((i = 0; i < WAIT_S * 5; i++)); do
    "$@" >/dev/null 2>&1 && return 0
    if [[ -z $(pid_of "$name") ]] && ! still_exec_ing "$name"; then
      if [[ " ${LAUNCHED[*]} " == *" $name "* ]]; then
        # One we started that is gone without a word (its log ends at our start line): seen
        # once in CI, kube-scheduler on a loaded machine, cause unknown. Started again, once;
        # an exit that says something, or a second one, fails with its log.
        if ! silent_exit "$name" || [[ " ${RELAUNCHED[*]} " == *" $name "* ]]; then
          fail_with_log "$name exited before $what" "$name"
        fi
        RELAUNCHED+=("$name")
        log "$name exited before $what without a line in its log; starting it again, once"
      else
        # The instance found running was on its way out (e.g. SIGTERM'd just before `start`):
        # start a new one, once.
        log "$name exited (it was stopping); starting it again"
      fi
      "launch_${name//-/_}"
    fi
    sleep 0.2
  done
  fail_with_log "$name: no $what within ${WAIT_S}s" "$name"
}

# --- certificates and kubeconfigs ------------------------------------------------------------
issue() { # issue NAME SUBJECT EXT_KEY_USAGE [SANS]: a P-256 key and a certificate from the CA
  local name=$1 subject=$2 usage=$3 sans=${4:-} ca=${CA_NAME:-ca}
  [[ -s $PKI/$name.crt && -s $PKI/$name.key ]] && return 0
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$PKI/$name.key" -out "$PKI/$name.csr" -subj "$subject" 2>/dev/null ||
    die "openssl could not make a key for $name"
  {
    echo "basicConstraints=critical,CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=$usage"
    [[ -n $sans ]] && echo "subjectAltName=$sans"
  } >"$PKI/$name.ext"
  openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/$ca.crt" -CAkey "$PKI/$ca.key" \
    -CAcreateserial -days 3650 -sha256 -extfile "$PKI/$name.ext" -out "$PKI/$name.crt" \
    2>/dev/null || die "openssl could not sign the certificate of $name"
  rm -f "$PKI/$name.csr" "$PKI/$name.ext"
  chmod 0600 "$PKI/$name.key"
}

write_pki() {
  mkdir -p "$PKI"
  chmod 0700 "$PKI"
  if [[ ! -s $PKI/ca.crt || ! -s $PKI/ca.key ]]; then
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 \
      -keyout "$PKI/ca.key" -out "$PKI/ca.crt" -subj "/CN=shaper-test-kubernetes-ca" \
      -addext "basicConstraints=critical,CA:TRUE" \
      -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" 2>/dev/null ||
      die "openssl could not make the CA"
    chmod 0600 "$PKI/ca.key"
  fi
  if [[ ! -s $PKI/sa.key ]]; then # service-account token signing key pair
    openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null || die "openssl genrsa failed"
    openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
    chmod 0600 "$PKI/sa.key"
  fi
  if [[ ! -s $PKI/front-proxy-ca.crt || ! -s $PKI/front-proxy-ca.key ]]; then
    # The aggregation layer's own CA: the API server proxies to aggregated API servers
    # with a client certificate from it (kubeadm's layout).
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 \
      -keyout "$PKI/front-proxy-ca.key" -out "$PKI/front-proxy-ca.crt" \
      -subj "/CN=shaper-test-front-proxy-ca" -addext "basicConstraints=critical,CA:TRUE" \
      -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" 2>/dev/null ||
      die "openssl could not make the front-proxy CA"
    chmod 0600 "$PKI/front-proxy-ca.key"
  fi
  CA_NAME=front-proxy-ca issue front-proxy-client "/CN=front-proxy-client" clientAuth
  issue etcd-server "/CN=etcd-server" serverAuth,clientAuth "DNS:localhost,IP:127.0.0.1"
  issue apiserver-etcd-client "/CN=kube-apiserver-etcd-client" clientAuth
  issue apiserver "/CN=kube-apiserver" serverAuth \
    "DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,IP:127.0.0.1,IP:$SERVICE_IP"
  issue admin "/O=system:masters/CN=shaper-admin" clientAuth
  issue kube-controller-manager "/CN=system:kube-controller-manager" clientAuth
  issue kube-scheduler "/CN=system:kube-scheduler" clientAuth
  issue kueue "/O=system:serviceaccounts/O=system:serviceaccounts:kueue-system/CN=system:serviceaccount:kueue-system:kueue-controller-manager" clientAuth
  issue kwok "/O=system:masters/CN=kwok-controller" clientAuth
}

write_kubeconfig() { # write_kubeconfig FILE CERT_NAME
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: shaper-test
  cluster:
    server: https://127.0.0.1:$API_PORT
    certificate-authority: $PKI/ca.crt
users:
- name: $2
  user:
    client-certificate: $PKI/$2.crt
    client-key: $PKI/$2.key
contexts:
- name: $2@shaper-test
  context: {cluster: shaper-test, user: $2}
current-context: $2@shaper-test
EOF
  chmod 0600 "$1"
}

write_config() {
  mkdir -p "$DIR" "$RUN" "$LOGS" "$ETC" "$DIR/etcd" "$DIR/kueue/certs"
  chmod 0700 "$DIR/etcd"
  write_pki
  write_kubeconfig "$ADMIN_KUBECONFIG" admin
  local name
  for name in kube-controller-manager kube-scheduler kueue kwok; do
    write_kubeconfig "$ETC/$name.kubeconfig" "$name"
  done
  cp "$K8S_SCRIPTS/kwok-stages.yaml" "$ETC/kwok-stages.yaml"

  local frameworks="" framework
  IFS=, read -ra framework_list <<<"$KUEUE_FRAMEWORKS"
  for framework in "${framework_list[@]}"; do frameworks+="    - \"$framework\""$'\n'; done
  cat >"$ETC/kueue-config.yaml" <<EOF
# Written by scripts/k8s-cluster.sh: Kueue's release configuration
# (config/components/manager/controller_manager_config.yaml) for a manager run on 127.0.0.1.
apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: kueue-system
health:
  healthProbeBindAddress: 127.0.0.1:$KUEUE_HEALTH_PORT
metrics:
  bindAddress: 127.0.0.1:$KUEUE_METRICS_PORT
webhook:
  host: 127.0.0.1
  port: $KUEUE_WEBHOOK_PORT
  certDir: $DIR/kueue/certs
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: true
  webhookServiceName: kueue-webhook-service
  webhookSecretName: kueue-webhook-server-cert
controller:
  groupKindConcurrency:
    Job.batch: 5
    Pod: 5
    Workload.kueue.x-k8s.io: 5
    LocalQueue.kueue.x-k8s.io: 1
    Cohort.kueue.x-k8s.io: 1
    ClusterQueue.kueue.x-k8s.io: 1
    ResourceFlavor.kueue.x-k8s.io: 1
clientConnection:
  qps: 50
  burst: 100
featureGates:
  VisibilityOnDemand: false
integrations:
  frameworks:
$frameworks
EOF

  cat >"$DIR/env" <<EOF
# source this file to use the cluster: kubectl, KUBECONFIG …
export KUBECONFIG=$ADMIN_KUBECONFIG
export PATH=$K8S_BIN:\$PATH
export SHAPER_K8S_API=https://127.0.0.1:$API_PORT
EOF
}

# --- components ------------------------------------------------------------------------------
# start_NAME launches the component when it is not running, then always waits until it is
# ready: `start` on a running cluster checks it.
curl_tls() { curl -fsS --max-time 5 --cacert "$PKI/ca.crt" "$@"; }

launch_etcd() {
  port_free "$ETCD_PEER_PORT" ||
    die "port $ETCD_PEER_PORT for etcd is taken: $(port_owner "$ETCD_PEER_PORT")"
  # --unsafe-no-fsync: a throwaway test store; fsync on every write slows the whole suite.
  launch etcd "$ETCD_PORT" --name shaper-test --data-dir "$DIR/etcd" \
    --listen-client-urls "https://127.0.0.1:$ETCD_PORT" \
    --advertise-client-urls "https://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "shaper-test=http://127.0.0.1:$ETCD_PEER_PORT" \
    --cert-file "$PKI/etcd-server.crt" --key-file "$PKI/etcd-server.key" \
    --client-cert-auth --trusted-ca-file "$PKI/ca.crt" \
    --unsafe-no-fsync --log-level warn
}

start_etcd() {
  [[ -n $(pid_of etcd) ]] || launch_etcd
  wait_until etcd "health on :$ETCD_PORT" curl_tls --cert "$PKI/apiserver-etcd-client.crt" \
    --key "$PKI/apiserver-etcd-client.key" "https://127.0.0.1:$ETCD_PORT/health"
  log "etcd $ETCD_VERSION ready on 127.0.0.1:$ETCD_PORT (pid $(pid_of etcd))"
}

api_ready() {
  curl_tls --cert "$PKI/admin.crt" --key "$PKI/admin.key" "https://127.0.0.1:$API_PORT/readyz"
}

launch_kube_apiserver() {
  # --endpoint-reconciler-type=none: the "kubernetes" Service's endpoints would be
  # 127.0.0.1, which endpoint validation refuses; nothing here needs them.
  launch kube-apiserver "$API_PORT" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$API_PORT" \
    --etcd-servers "https://127.0.0.1:$ETCD_PORT" --etcd-cafile "$PKI/ca.crt" \
    --etcd-certfile "$PKI/apiserver-etcd-client.crt" \
    --etcd-keyfile "$PKI/apiserver-etcd-client.key" \
    --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
    --client-ca-file "$PKI/ca.crt" \
    --requestheader-client-ca-file "$PKI/front-proxy-ca.crt" \
    --requestheader-allowed-names front-proxy-client \
    --requestheader-username-headers X-Remote-User --requestheader-group-headers X-Remote-Group \
    --requestheader-extra-headers-prefix X-Remote-Extra- \
    --proxy-client-cert-file "$PKI/front-proxy-client.crt" \
    --proxy-client-key-file "$PKI/front-proxy-client.key" \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
    --service-cluster-ip-range "$SERVICE_CIDR" \
    --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
    --allow-privileged=true --endpoint-reconciler-type none --profiling=false
}

start_apiserver() {
  [[ -n $(pid_of kube-apiserver) ]] || launch_kube_apiserver
  wait_until kube-apiserver "/readyz on :$API_PORT" api_ready
  log "kube-apiserver $KUBERNETES_VERSION ready on https://127.0.0.1:$API_PORT (pid $(pid_of kube-apiserver))"
}

launch_kube_controller_manager() {
  local kubeconfig=$ETC/kube-controller-manager.kubeconfig
  launch kube-controller-manager "$KCM_PORT" \
    --kubeconfig "$kubeconfig" --authentication-kubeconfig "$kubeconfig" \
    --authorization-kubeconfig "$kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$KCM_PORT" --leader-elect=false \
    --service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt" \
    --use-service-account-credentials=true \
    --cluster-signing-cert-file "$PKI/ca.crt" --cluster-signing-key-file "$PKI/ca.key" \
    --service-cluster-ip-range "$SERVICE_CIDR" --profiling=false
}

start_controller_manager() {
  [[ -n $(pid_of kube-controller-manager) ]] || launch_kube_controller_manager
  wait_until kube-controller-manager "/healthz on :$KCM_PORT" \
    curl -fsSk --max-time 5 "https://127.0.0.1:$KCM_PORT/healthz"
  log "kube-controller-manager ready (pid $(pid_of kube-controller-manager))"
}

launch_kube_scheduler() {
  local kubeconfig=$ETC/kube-scheduler.kubeconfig
  launch kube-scheduler "$SCHED_PORT" \
    --kubeconfig "$kubeconfig" --authentication-kubeconfig "$kubeconfig" \
    --authorization-kubeconfig "$kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$SCHED_PORT" --leader-elect=false --profiling=false
}

start_scheduler() {
  [[ -n $(pid_of kube-scheduler) ]] || launch_kube_scheduler
  wait_until kube-scheduler "/healthz on :$SCHED_PORT" \
    curl -fsSk --max-time 5 "https://127.0.0.1:$SCHED_PORT/healthz"
  log "kube-scheduler ready (pid $(pid_of kube-scheduler))"
}

launch_kwok() {
  launch kwok "$KWOK_PORT" --kubeconfig "$ETC/kwok.kubeconfig" \
    --config "$ETC/kwok-stages.yaml" \
    --manage-all-nodes=false --manage-nodes-with-annotation-selector kwok.x-k8s.io/node=fake \
    --node-ip 127.0.0.1 --node-port "$KWOK_PORT" --cidr "$POD_CIDR" \
    --server-address "127.0.0.1:$KWOK_PORT" --node-lease-duration-seconds 40
}

start_kwok() {
  [[ -n $(pid_of kwok) ]] || launch_kwok
  wait_until kwok "/healthz on :$KWOK_PORT" curl -fsS --max-time 5 "http://127.0.0.1:$KWOK_PORT/healthz"
  log "kwok $KWOK_VERSION ready (pid $(pid_of kwok))"
}

apply_kueue_manifests() {
  local python=python3
  [[ -x $REPO/.venv/bin/python ]] && python=$REPO/.venv/bin/python
  "$python" "$K8S_SCRIPTS/kueue-manifests.py" "$K8S_MANIFESTS/kueue.yaml" "$ETC/kueue.yaml" \
    "$KUEUE_WEBHOOK_PORT" 2>>"$LOGS/kubectl.log" ||
    fail_with_log "could not prepare Kueue's manifests (needs Python with PyYAML)" kubectl
  # Server-side: the Workload CRD is too large for client-side apply's annotation.
  "${KUBECTL[@]}" apply --server-side --force-conflicts --field-manager shaper-k8s-cluster \
    -f "$ETC/kueue.yaml" >>"$LOGS/kubectl.log" 2>&1 ||
    fail_with_log "kubectl apply of Kueue's manifests failed" kubectl
  "${KUBECTL[@]}" wait --for condition=Established --timeout "${WAIT_S}s" \
    crd -l app.kubernetes.io/name=kueue >>"$LOGS/kubectl.log" 2>&1 ||
    fail_with_log "Kueue's CRDs were not established" kubectl
}

sync_kueue_certs() {
  # The kubelet's part for Kueue's Deployment, which mounts the Secret that Kueue's
  # certificate management fills at the webhook server's certDir; Kueue waits for the files.
  local dir=$DIR/kueue/certs key value
  for key in tls.crt tls.key ca.crt; do
    value=$("${KUBECTL[@]}" -n kueue-system get secret kueue-webhook-server-cert \
      -o "jsonpath={.data.${key//./\\.}}" 2>/dev/null) || return 1
    [[ -n $value ]] || return 1
    base64 -d <<<"$value" >"$dir/.$key.tmp" || return 1
  done
  for key in tls.crt tls.key ca.crt; do
    chmod 0600 "$dir/.$key.tmp"
    cmp -s "$dir/.$key.tmp" "$dir/$key" && rm -f "$dir/.$key.tmp" && continue
    mv "$dir/.$key.tmp" "$dir/$key"
  done
}

webhook_answers() { # the API server reaches Kueue's job webhook (server-side dry run)
  "${KUBECTL[@]}" create --dry-run=server -f - <<'EOF'
apiVersion: batch/v1
kind: Job
metadata:
  name: shaper-webhook-probe
  namespace: default
  labels: {kueue.x-k8s.io/queue-name: shaper-webhook-probe}
spec:
  template:
    spec:
      restartPolicy: Never
      containers: [{name: c, image: busybox}]
EOF
}

launch_kueue() {
  apply_kueue_manifests
  local port
  for port in "$KUEUE_HEALTH_PORT" "$KUEUE_METRICS_PORT"; do
    port_free "$port" || die "port $port for Kueue is taken: $(port_owner "$port")"
  done
  sync_kueue_certs || true # certificates of an earlier run, if any
  # controller-runtime finds its kubeconfig through KUBECONFIG.
  LAUNCH_ENV=("KUBECONFIG=$ETC/kueue.kubeconfig")
  launch kueue "$KUEUE_WEBHOOK_PORT" --config "$ETC/kueue-config.yaml" --zap-log-level=2
  LAUNCH_ENV=()
}

start_kueue() {
  [[ -n $(pid_of kueue) ]] || launch_kueue
  wait_until kueue "webhook certificate in Secret kueue-system/kueue-webhook-server-cert" \
    sync_kueue_certs
  wait_until kueue "/readyz on :$KUEUE_HEALTH_PORT" \
    curl -fsS --max-time 5 "http://127.0.0.1:$KUEUE_HEALTH_PORT/readyz"
  wait_until kueue "webhooks reachable from the API server" webhook_answers
  log "Kueue $KUEUE_VERSION ready, webhooks on 127.0.0.1:$KUEUE_WEBHOOK_PORT (pid $(pid_of kueue))"
}

node_manifest() { # node_manifest NAME
  cat <<EOF
---
apiVersion: v1
kind: Node
metadata:
  name: $1
  annotations:
    kwok.x-k8s.io/node: fake
    node.alpha.kubernetes.io/ttl: "0"
  labels:
    type: kwok
    kubernetes.io/hostname: $1
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    node.kubernetes.io/instance-type: gpu-$GPUS_PER_NODE-$GPU_FAMILY
    nvidia.com/gpu.present: "true"
    nvidia.com/gpu.product: $GPU_PRODUCT
    nvidia.com/gpu.memory: "$GPU_MEMORY_MIB"
    nvidia.com/gpu.count: "$GPUS_PER_NODE"
    nvidia.com/gpu.family: $GPU_FAMILY
    nvidia.com/gpu.machine: kwok
    nvidia.com/mig.capable: "true"
    nvidia.com/cuda.driver.major: "570"
spec: {}
status:
  allocatable: {cpu: "64", memory: 1Ti, pods: "110", nvidia.com/gpu: "$GPUS_PER_NODE"}
  capacity: {cpu: "64", memory: 1Ti, pods: "110", nvidia.com/gpu: "$GPUS_PER_NODE"}
  nodeInfo:
    architecture: amd64
    operatingSystem: linux
    kubeletVersion: fake
    kubeProxyVersion: fake
    containerRuntimeVersion: kwok
EOF
}

create_nodes() {
  ((NODES > 0)) || return 0
  local i names=()
  for ((i = 1; i <= NODES; i++)); do names+=("kwok-gpu-$i"); done
  # create, not apply: a node that exists (a restart) keeps what the tests did to it.
  local missing=()
  for i in "${names[@]}"; do
    "${KUBECTL[@]}" get node "$i" >/dev/null 2>&1 || missing+=("$i")
  done
  if [[ ${#missing[@]} -gt 0 ]]; then
    for i in "${missing[@]}"; do node_manifest "$i"; done |
      "${KUBECTL[@]}" create -f - >>"$LOGS/kubectl.log" 2>&1 ||
      fail_with_log "could not create the kwok nodes" kubectl
  fi
  "${KUBECTL[@]}" wait --for condition=Ready --timeout "${WAIT_S}s" "${names[@]/#/node/}" \
    >>"$LOGS/kubectl.log" 2>&1 || fail_with_log "kwok nodes did not become Ready" kwok
  log "nodes ready: ${names[*]} ($GPUS_PER_NODE x $GPU_PRODUCT each)"
}

default_service_account() { "${KUBECTL[@]}" -n default get serviceaccount default; }

cmd_start() {
  local started=$SECONDS name
  for name in "${K8S_BINARIES[@]}"; do
    [[ -x $K8S_BIN/$name ]] ||
      die "$K8S_BIN/$name is missing: build the control plane first (scripts/k8s-build.sh, which make test runs)"
  done
  [[ -s $K8S_MANIFESTS/kueue.yaml ]] || die "$K8S_MANIFESTS/kueue.yaml is missing: run scripts/k8s-build.sh"
  command -v openssl >/dev/null || die "openssl is needed for the certificates"
  write_config
  start_etcd
  start_apiserver
  start_controller_manager
  start_scheduler
  wait_until kube-controller-manager "ServiceAccount default/default" default_service_account
  start_kwok
  create_nodes
  start_kueue
  log "cluster up in $((SECONDS - started)) s (source $DIR/env for kubectl)"
}

cmd_stop() {
  [[ -d $DIR ]] || {
    log "nothing to stop: $DIR does not exist"
    return 0
  }
  stop_daemons 15 kueue kwok
  stop_daemons 15 kube-scheduler kube-controller-manager
  stop_daemons 15 kube-apiserver
  stop_daemons 15 etcd
}

cmd_status() {
  local name pid rc=0
  for name in "${COMPONENTS[@]}"; do
    pid=$(pid_of "$name")
    if [[ -n $pid ]]; then
      printf '%-24s running (pid %s)\n' "$name" "$pid"
    else
      printf '%-24s stopped\n' "$name"
      rc=3
    fi
  done
  if [[ -n $(pid_of kube-apiserver) ]]; then
    "${KUBECTL[@]}" get nodes -L nvidia.com/gpu.product,nvidia.com/gpu.count || rc=3
  fi
  return $rc
}

cmd_restart() {
  # A component's outage as the tests need it (a watch that must survive an API server
  # restart): SIGTERM (its graceful shutdown, as a rolling upgrade does), then start it
  # again and wait until it is ready. Its state (etcd's data, certificates) is kept.
  local start
  case $COMPONENT in
    etcd) start=start_etcd ;;
    kube-apiserver) start=start_apiserver ;;
    kube-controller-manager) start=start_controller_manager ;;
    kube-scheduler) start=start_scheduler ;;
    kwok) start=start_kwok ;;
    kueue) start=start_kueue ;;
    *) die "restart: unknown component $COMPONENT (one of: ${COMPONENTS[*]})" ;;
  esac
  [[ -n $(pid_of "$COMPONENT") ]] || die "restart: $COMPONENT is not running in $DIR"
  # A short grace: the API server waits out its long-running requests (every watch)
  # longer than a test should; what is left is killed, as a crash would be.
  stop_daemons 5 "$COMPONENT"
  "$start"
}

case $COMMAND in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  restart) cmd_restart ;;
esac
