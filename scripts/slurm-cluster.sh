#!/usr/bin/env bash
# A real multi-node Slurm cluster on this one host, for development and tests.
#
#   scripts/slurm-cluster.sh start  [--dir DIR] [--version V]   install if missing, configure, start, wait
#   scripts/slurm-cluster.sh stop   [--dir DIR] [--version V]   cancel jobs, stop the daemons by PID
#   scripts/slurm-cluster.sh status [--dir DIR] [--version V]   daemons, nodes and partitions
#
# --version 22.05 (the default): Debian 12's packages (JSON API v0.0.36-v0.0.38).
# --version 24.11: Slurm 24.11 built from source by scripts/slurm-build.sh (JSON API
# v0.0.40-v0.0.42), on its own ports (slurmctld 6827, slurmd 17011-17013, slurmrestd 6830),
# so that both run at once; default DIR /var/lib/shaper-slurm-24.11.
#
# Three nodes (node1..node3) with 4 CPUs, 4000 MiB and two fake H100 GPUs each (gres files
# are symlinks to /dev/null, so jobs see CUDA_VISIBLE_DEVICES); partitions `debug` (default,
# PriorityTier=1) and `high` (PriorityTier=10), preemption by partition priority with
# PreemptMode=REQUEUE; `AuthInfo=cred_expire=5` (the least Slurm accepts) so requeued jobs
# may run again after ~6 s instead of 120 s, and `sched_interval=1` (main scheduler) and
# `bf_interval=1` (backfill) so they start then: a job whose begin time passes is no event
# that wakes the scheduler, and it waited 8-14 s more for the next pass (60 s by default);
# slurmrestd with JWT auth on 127.0.0.1:6820 as an unprivileged user.
# Everything lives under DIR (default /var/lib/shaper-slurm): config, its own munged socket
# and key, state, spool, logs, PID files, and `env` (source it to use the cluster's CLI).
#
# Idempotent: `start` starts only the daemons that are not running; `stop` stops those that
# are. Every failure prints the reason and the tail of the relevant log, and exits non-zero.
# Needs root and Debian's package mirrors (only when Slurm is not installed yet).
#
# Environment:
#   SHAPER_SLURM_REST_USER   unprivileged user for slurmrestd (default shaper-rest; created)
#   SHAPER_SLURM_CLUSTER     Slurm ClusterName (default shaper)
#   SHAPER_SLURM_WAIT_S      seconds to wait for nodes/slurmrestd (default 60)
set -euo pipefail

readonly NODES=(node1 node2 node3)
readonly GPU_TYPE=h100
readonly GPUS_PER_NODE=2
readonly PACKAGES=(slurmctld slurmd slurm-client slurmrestd slurm-wlm-jwt-plugin munge)
REST_USER=${SHAPER_SLURM_REST_USER:-shaper-rest}
CLUSTER_NAME=${SHAPER_SLURM_CLUSTER:-shaper}
WAIT_S=${SHAPER_SLURM_WAIT_S:-60}
DIR=
VERSION=22.05

log() { printf 'slurm-cluster: %s\n' "$*" >&2; }
# alive, stop_daemons GRACE_S NAME...
# shellcheck source=lib/daemons.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/daemons.sh"
die() {
  printf 'slurm-cluster: ERROR: %s\n' "$*" >&2
  exit 1
}
usage() {
  sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

# --- arguments -------------------------------------------------------------------------
[[ $# -ge 1 ]] || usage
COMMAND=$1
shift
while [[ $# -gt 0 ]]; do
  case $1 in
    --dir)
      [[ $# -ge 2 ]] || die "--dir needs a value"
      DIR=$2
      shift 2
      ;;
    --dir=*)
      DIR=${1#--dir=}
      shift
      ;;
    --version)
      [[ $# -ge 2 ]] || die "--version needs a value"
      VERSION=$2
      shift 2
      ;;
    --version=*)
      VERSION=${1#--version=}
      shift
      ;;
    -h | --help) usage ;;
    *) die "unknown argument: $1" ;;
  esac
done
case $COMMAND in start | stop | status) ;; *) usage ;; esac
case $VERSION in
  22.05)
    NODE_PORTS=(17001 17002 17003)
    CTLD_PORT=6817
    REST_ADDR=127.0.0.1:6820
    REST_API=v0.0.38
    DIR=${DIR:-/var/lib/shaper-slurm}
    ;;
  24.11)
    NODE_PORTS=(17011 17012 17013)
    CTLD_PORT=6827
    REST_ADDR=127.0.0.1:6830
    REST_API=v0.0.42
    DIR=${DIR:-/var/lib/shaper-slurm-24.11}
    ;;
  *) die "--version: 22.05 or 24.11, not $VERSION" ;;
esac
readonly NODE_PORTS CTLD_PORT REST_ADDR REST_API VERSION
[[ $DIR == /* ]] || DIR=$(pwd)/$DIR
DIR=${DIR%/}

readonly CONF=$DIR/etc/slurm.conf
readonly RUN=$DIR/run
readonly LOGS=$DIR/log
readonly MUNGE_SOCKET=$DIR/munge/munge.socket.2
export SLURM_CONF=$CONF
SLURM_BIN=
if [[ $VERSION != 22.05 ]]; then
  # start builds it when missing; stop and status only look where it is.
  if [[ $COMMAND == start ]]; then
    SLURM_PREFIX=$("$(dirname "${BASH_SOURCE[0]}")/slurm-build.sh") || die "scripts/slurm-build.sh failed"
  else
    SLURM_PREFIX=$("$(dirname "${BASH_SOURCE[0]}")/slurm-build.sh" --prefix)
  fi
  SLURM_BIN=$SLURM_PREFIX/bin
  export PATH=$SLURM_PREFIX/bin:$SLURM_PREFIX/sbin:$PATH
fi
readonly SLURM_BIN

# --- PID helpers: a PID counts only while it still runs the expected program -----------
pid_of() { # pid_of NAME -> prints the live PID recorded for NAME, or nothing
  local name=$1 file=$RUN/$1.pid pid exe
  [[ -s $file ]] || return 0
  pid=$(tr -dc '0-9' <"$file")
  [[ -n $pid ]] && alive "$pid" || return 0
  exe=$(cat "/proc/$pid/comm" 2>/dev/null || true)
  case $name in
    munged) [[ $exe == munged ]] ;;
    slurmctld) [[ $exe == slurmctld ]] ;;
    slurmrestd) [[ $exe == slurmrestd ]] ;;
    slurmd-*) [[ $exe == slurmd ]] ;;
    *) false ;;
  esac && echo "$pid"
  return 0
}

fail_with_log() { # fail_with_log MESSAGE LOGFILE
  local message=$1 logfile=$2
  if [[ -f $logfile ]]; then
    printf 'slurm-cluster: last lines of %s:\n' "$logfile" >&2
    tail -n 25 "$logfile" | sed 's/^/    /' >&2
  fi
  die "$message"
}

wait_for_pidfile() { # wait_for_pidfile NAME LOGFILE: daemons that fork write their own
  local name=$1 logfile=$2 i
  for ((i = 0; i < 100; i++)); do
    [[ -n $(pid_of "$name") ]] && return 0
    sleep 0.1
  done
  fail_with_log "$name did not start (no live PID in $RUN/$name.pid after 10 s)" "$logfile"
}

# --- install ------------------------------------------------------------------------------
install_packages() {
  local missing=() package packages=("${PACKAGES[@]}")
  # 24.11: munged from Debian's packages, Slurm itself from scripts/slurm-build.sh.
  [[ $VERSION == 22.05 ]] || packages=(munge)
  for package in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed' ||
      missing+=("$package")
  done
  if [[ ${#missing[@]} -gt 0 ]]; then
    log "installing ${missing[*]}"
    apt-get update -qq || die "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" \
      >"/tmp/shaper-slurm-apt.log" 2>&1 ||
      fail_with_log "apt-get install ${missing[*]} failed" /tmp/shaper-slurm-apt.log
  fi
  local version
  version=$(slurmctld -V | awk '{print $2}')
  [[ $version == "$VERSION".* ]] || log "warning: expected Slurm $VERSION, found $version"
}

ensure_rest_user() {
  id -u "$REST_USER" >/dev/null 2>&1 && return 0
  log "creating system user $REST_USER for slurmrestd"
  useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin \
    "$REST_USER" || die "could not create user $REST_USER"
}

# --- configuration ------------------------------------------------------------------------
write_config() {
  local node i
  mkdir -p "$DIR"/{etc,run,log,state,spool,dev,munge}
  # slurmrestd runs unprivileged and must read slurm.conf; nothing secret lives in etc/.
  chmod 0755 "$DIR" "$DIR/etc"
  chmod 0700 "$DIR/munge" "$DIR/state"

  for ((i = 0; i < GPUS_PER_NODE; i++)); do
    ln -sfn /dev/null "$DIR/dev/nvidia$i"
  done
  if [[ ! -s $DIR/munge/munge.key ]]; then
    dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
  fi
  chmod 0400 "$DIR/munge/munge.key"
  if [[ ! -s $DIR/state/jwt_hs256.key ]]; then
    dd if=/dev/urandom of="$DIR/state/jwt_hs256.key" bs=32 count=1 status=none
  fi
  chmod 0600 "$DIR/state/jwt_hs256.key"

  local conf_tmp=$CONF.tmp CRED_LINE SWITCH_LINE
  # Slurm 23.11 renamed CryptoType to CredType and dropped switch/none (no SwitchType: none).
  if [[ $VERSION == 22.05 ]]; then
    CRED_LINE=CryptoType=crypto/munge
    SWITCH_LINE=SwitchType=switch/none
  else
    CRED_LINE=CredType=cred/munge
    SWITCH_LINE="# SwitchType: none"
  fi
  {
    cat <<EOF
# Written by scripts/slurm-cluster.sh; rewritten on every start.
ClusterName=$CLUSTER_NAME
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=cred_expire=5,socket=$MUNGE_SOCKET
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key=$DIR/state/jwt_hs256.key
$CRED_LINE
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
${SWITCH_LINE}
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=500
GresTypes=gpu
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,sched_interval=1
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
ReturnToService=2
KillWait=2
MinJobAge=300
MessageTimeout=5
SlurmdTimeout=30
SlurmctldTimeout=30
InactiveLimit=0
EOF
    for i in "${!NODES[@]}"; do
      node=${NODES[$i]}
      printf 'NodeName=%s NodeHostname=localhost NodeAddr=127.0.0.1 Port=%s CPUs=4 ' \
        "$node" "${NODE_PORTS[$i]}"
      printf 'RealMemory=4000 Gres=gpu:%s:%s Features=%s State=UNKNOWN\n' \
        "$GPU_TYPE" "$GPUS_PER_NODE" "$GPU_TYPE"
    done
    local node_list
    node_list=$(
      IFS=,
      echo "${NODES[*]}"
    )
    echo "PartitionName=debug Nodes=$node_list Default=YES MaxTime=INFINITE State=UP" \
      "PriorityTier=1 PreemptMode=REQUEUE"
    echo "PartitionName=high Nodes=$node_list MaxTime=INFINITE State=UP" \
      "PriorityTier=10 PreemptMode=REQUEUE"
  } >"$conf_tmp"
  mv "$conf_tmp" "$CONF"
  {
    echo "AutoDetect=off"
    echo "NodeName=node[1-${#NODES[@]}] Name=gpu Type=$GPU_TYPE File=$DIR/dev/nvidia[0-$((GPUS_PER_NODE - 1))]"
  } >"$DIR/etc/gres.conf"
  chmod 0644 "$CONF" "$DIR/etc/gres.conf"

  cat >"$DIR/env" <<EOF
# source this file to use the cluster's CLI: squeue, sinfo, sbatch, scontrol ...
export SLURM_CONF=$CONF
export SHAPER_SLURMRESTD_URL=http://$REST_ADDR
export SHAPER_SLURMRESTD_USER=root
export SHAPER_SLURM_API=$REST_API
EOF
  [[ -z $SLURM_BIN ]] || echo "export PATH=$SLURM_BIN:\$PATH" >>"$DIR/env"
}

# --- daemons -------------------------------------------------------------------------------
start_munged() {
  [[ -n $(pid_of munged) ]] && return 0
  rm -f "$MUNGE_SOCKET" "$MUNGE_SOCKET.lock"
  munged --force --socket="$MUNGE_SOCKET" --key-file="$DIR/munge/munge.key" \
    --pid-file="$RUN/munged.pid" --log-file="$LOGS/munged.log" \
    --seed-file="$DIR/munge/munged.seed" >>"$LOGS/munged.log" 2>&1 ||
    fail_with_log "munged failed to start" "$LOGS/munged.log"
  wait_for_pidfile munged "$LOGS/munged.log"
  log "munged running (pid $(pid_of munged))"
}

start_slurmctld() {
  [[ -n $(pid_of slurmctld) ]] && return 0
  port_free "$CTLD_PORT" || die "port $CTLD_PORT is taken by another process: $(port_owner "$CTLD_PORT")"
  # Without -c slurmctld recovers jobs from StateSaveLocation, so a restart keeps them.
  slurmctld -f "$CONF" >>"$LOGS/slurmctld.log" 2>&1 ||
    fail_with_log "slurmctld failed to start" "$LOGS/slurmctld.log"
  wait_for_pidfile slurmctld "$LOGS/slurmctld.log"
  log "slurmctld running (pid $(pid_of slurmctld))"
}

start_slurmds() {
  local i node started=()
  for i in "${!NODES[@]}"; do
    node=${NODES[$i]}
    [[ -n $(pid_of "slurmd-$node") ]] && continue
    started+=("$node")
    port_free "${NODE_PORTS[$i]}" ||
      die "port ${NODE_PORTS[$i]} for $node is taken: $(port_owner "${NODE_PORTS[$i]}")"
    mkdir -p "$DIR/spool/$node"
    slurmd -f "$CONF" -N "$node" >>"$LOGS/slurmd-$node.log" 2>&1 ||
      fail_with_log "slurmd for $node failed to start" "$LOGS/slurmd-$node.log"
  done
  [[ ${#started[@]} -gt 0 ]] || return 0
  for node in "${started[@]}"; do
    wait_for_pidfile "slurmd-$node" "$LOGS/slurmd-$node.log"
  done
  log "slurmd running for ${started[*]}"
}

start_slurmrestd() {
  [[ -n $(pid_of slurmrestd) ]] && return 0
  local port=${REST_ADDR##*:} uid gid REST_PLUGINS=openapi/slurmctld
  [[ $VERSION != 22.05 ]] || REST_PLUGINS=openapi/v0.0.38,openapi/v0.0.37,openapi/v0.0.36
  port_free "$port" || die "port $port for slurmrestd is taken: $(port_owner "$port")"
  uid=$(id -u "$REST_USER")
  gid=$(id -g "$REST_USER")
  setpriv --reuid="$uid" --regid="$gid" --clear-groups test -r "$CONF" ||
    die "user $REST_USER cannot read $CONF; every directory above $DIR must be searchable (o+x)"
  # slurmrestd does not fork: record the PID of the process we start. setpriv execs, so $! is
  # slurmrestd itself.
  SLURM_JWT=daemon setsid setpriv --reuid="$uid" --regid="$gid" --clear-groups \
    "$(command -v slurmrestd)" -f "$CONF" -a rest_auth/jwt -s "$REST_PLUGINS" "$REST_ADDR" \
    </dev/null >>"$LOGS/slurmrestd.log" 2>&1 &
  local started=$! i token
  echo "$started" >"$RUN/slurmrestd.pid"
  # Ready means the whole JWT path works: a token from slurmctld, accepted by slurmrestd.
  token=$(scontrol token username=root lifespan=120 | sed -n 's/^SLURM_JWT=//p')
  [[ -n $token ]] || fail_with_log "scontrol token gave no JWT" "$LOGS/slurmctld.log"
  for ((i = 0; i < WAIT_S * 10; i++)); do
    # Still starting counts as running: the PID is setsid's, then setpriv's, until they
    # have exec'd slurmrestd (on a loaded machine the first check can come before that,
    # which pid_of, asking for slurmrestd by name, took for an exit with an empty log).
    alive "$started" && [[ $(cat "/proc/$started/comm" 2>/dev/null) =~ ^(setsid|setpriv|slurmrestd)$ ]] ||
      fail_with_log "slurmrestd exited" "$LOGS/slurmrestd.log"
    curl -fsS -o /dev/null -H "X-SLURM-USER-NAME: root" -H "X-SLURM-USER-TOKEN: $token" \
      "http://$REST_ADDR/slurm/$REST_API/ping" 2>/dev/null && break
    sleep 0.1
  done
  ((i < WAIT_S * 10)) || fail_with_log "slurmrestd did not answer on $REST_ADDR" \
    "$LOGS/slurmrestd.log"
  log "slurmrestd running as $REST_USER on $REST_ADDR (pid $(pid_of slurmrestd))"
}

port_free() { ! ss -Hltn "sport = :$1" | grep -q .; }
port_owner() { ss -Hltnp "sport = :$1" | awk '{print $NF}'; }

wait_for_nodes() {
  # A node is usable once it responds: idle (or mixed/allocated with recovered jobs), without
  # the '*' of "not responding" and without down/unknown/inval.
  local i states bad
  for ((i = 0; i < WAIT_S * 5; i++)); do
    states=$(sinfo -h -N -p debug -o '%N %t' 2>/dev/null || true)
    if [[ -n $states ]]; then
      bad=$(awk '$2 !~ /^(idle|mix|alloc|comp)$/' <<<"$states")
      [[ -z $bad ]] && return 0
      # A node left down by an earlier run (e.g. killed slurmd) is returned to service.
      if grep -qE 'down|drain' <<<"$bad" && ((i % 10 == 5)); then
        awk '$2 ~ /down|drain/ && $2 !~ /\*/ {print $1}' <<<"$bad" | while read -r node; do
          scontrol update NodeName="$node" State=RESUME >/dev/null 2>&1 || true
        done
      fi
    fi
    sleep 0.2
  done
  printf 'slurm-cluster: node states:\n%s\n' "$states" >&2
  fail_with_log "nodes did not become idle within ${WAIT_S}s" "$LOGS/slurmctld.log"
}

cmd_start() {
  [[ $EUID -eq 0 ]] || die "run as root (installs packages, starts Slurm's daemons)"
  local started=$SECONDS
  install_packages
  ensure_rest_user
  mkdir -p "$DIR"
  write_config
  start_munged
  start_slurmctld
  start_slurmds
  wait_for_nodes
  start_slurmrestd
  log "cluster up in $((SECONDS - started)) s: ${NODES[*]} (source $DIR/env for the CLI)"
}

cancel_jobs() {
  [[ -n $(pid_of slurmctld) ]] || return 0
  local i ids
  ids=$(squeue -h -t pending,running,suspended,configuring -o %i 2>/dev/null | tr '\n' ' ' || true)
  [[ -n ${ids// /} ]] || return 0
  # shellcheck disable=SC2086 # one job id per word
  scancel $ids >/dev/null 2>&1 || true
  # KillWait=2: steps end within a few seconds; wait so their processes do not outlive us.
  for ((i = 0; i < 75; i++)); do
    [[ -z $(squeue -h -t running,suspended,completing,configuring -o %i 2>/dev/null) ]] && return 0
    sleep 0.2
  done
  log "some jobs did not end within 15 s of scancel; their processes are killed below"
}

kill_leftover_steps() {
  # Job processes outlive slurmd when it stops first (or died): find the slurmstepd that
  # belong to this cluster (open files or cwd under $DIR) and kill their sessions, by PID.
  local pid sid member
  for pid in $(pgrep -x slurmstepd || true); do
    if [[ $(readlink "/proc/$pid/cwd" 2>/dev/null) == "$DIR"/* ]] ||
      find "/proc/$pid/fd" -maxdepth 1 -lname "$DIR/*" 2>/dev/null | grep -q .; then
      sid=$(awk '{print $6}' "/proc/$pid/stat" 2>/dev/null || true)
      [[ -n $sid && $sid -gt 1 ]] || continue
      for member in $(ps -o pid= -s "$sid" 2>/dev/null || true); do
        kill -KILL "$member" 2>/dev/null || true
      done
      log "killed the leftover job session $sid (slurmstepd pid $pid)"
    fi
  done
}

cmd_stop() {
  [[ -d $DIR ]] || {
    log "nothing to stop: $DIR does not exist"
    return 0
  }
  cancel_jobs
  stop_daemons 10 slurmrestd "${NODES[@]/#/slurmd-}"
  stop_daemons 10 slurmctld
  kill_leftover_steps
  stop_daemons 10 munged
}

cmd_status() {
  local name pid rc=0
  for name in munged slurmctld "${NODES[@]/#/slurmd-}" slurmrestd; do
    pid=$(pid_of "$name")
    if [[ -n $pid ]]; then
      printf '%-14s running (pid %s)\n' "$name" "$pid"
    else
      printf '%-14s stopped\n' "$name"
      rc=3
    fi
  done
  if [[ -n $(pid_of slurmctld) ]]; then
    sinfo -N -o '%N %P %t %G %c %m' || rc=3
  fi
  return $rc
}

case $COMMAND in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
esac
