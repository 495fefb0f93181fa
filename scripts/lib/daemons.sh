# Process handling shared by the scripts that run test clusters as plain processes
# (scripts/slurm-cluster.sh, scripts/k8s-cluster.sh). Sourced, not run. The caller defines
# log MESSAGE, pid_of NAME (the live PID recorded for NAME, checked against the program it
# should be running) and RUN (the folder of NAME.pid files).
# shellcheck shell=bash

alive() { # alive PID: running and not a zombie waiting to be reaped
  local state
  state=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
  [[ -n $state && $state != Z ]]
}

stop_daemons() { # stop_daemons GRACE_S NAME...: SIGTERM to all at once, wait, then SIGKILL
  local grace_s=$1 name pid i names=() pids=()
  shift
  for name in "$@"; do
    pid=$(pid_of "$name")
    if [[ -n $pid ]]; then
      kill -TERM "$pid" 2>/dev/null || true
      names+=("$name")
      pids+=("$pid")
    fi
  done
  for ((i = 0; i < grace_s * 10; i++)); do
    local running=0
    for pid in "${pids[@]}"; do alive "$pid" && running=1; done
    ((running)) || break
    sleep 0.1
  done
  for i in "${!pids[@]}"; do
    if alive "${pids[$i]}"; then
      log "${names[$i]} (pid ${pids[$i]}) ignored SIGTERM for $grace_s s; sending SIGKILL"
      kill -KILL "${pids[$i]}" 2>/dev/null || true
    fi
    log "stopped ${names[$i]} (pid ${pids[$i]})"
  done
  for name in "$@"; do rm -f "$RUN/$name.pid"; done
}
