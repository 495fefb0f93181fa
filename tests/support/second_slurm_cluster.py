"""A second real Slurm cluster on this host, beside the test cluster of
scripts/slurm-cluster.sh, for federation tests (two clusters, one group).

Its own ClusterName, slurmctld port, node names, node ports, partition, state and logs, all
under one directory; it shares the first cluster's munged (the same key authenticates
both, as a site's clusters usually do), so it needs no daemon of its own for that. No
slurmrestd: its connector reads it through the CLI. Started and stopped by PID, like the
script does for the first; every failure says which daemon and shows its log's tail.

The defaults keep clear of the first cluster's ports (6817, 17001-17003, 6820).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

START_WAIT_S = 60.0


class SecondClusterError(RuntimeError):
    """The second cluster did not start or stop; the message says why."""


@dataclass(frozen=True)
class SecondClusterLayout:
    """What the second cluster is: names, ports, GPUs, and where it lives."""

    directory: Path
    munge_socket: Path
    cluster_name: str = "shaper-b"
    ctld_port: int = 6917
    nodes: tuple[str, ...] = ("bnode1", "bnode2")
    node_ports: tuple[int, ...] = (17101, 17102)
    # Not the first cluster's "debug": a moved job's partition must be translated.
    partition: str = "batch"
    gpu_type: str = "h100"
    gpus_per_node: int = 2

    @property
    def conf(self) -> Path:
        return self.directory / "etc" / "slurm.conf"

    @property
    def run_dir(self) -> Path:
        return self.directory / "run"

    @property
    def log_dir(self) -> Path:
        return self.directory / "log"

    def pid_file(self, daemon: str) -> Path:
        return self.run_dir / f"{daemon}.pid"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}


def write_config(layout: SecondClusterLayout) -> None:
    """slurm.conf and gres.conf: the first cluster's settings, this cluster's names."""
    if len(layout.nodes) != len(layout.node_ports):
        raise ValueError("one port per node")
    root = layout.directory
    for sub in ("etc", "run", "log", "state", "spool", "dev"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "state").chmod(0o700)
    for index in range(layout.gpus_per_node):
        device = root / "dev" / f"nvidia{index}"
        if not device.is_symlink():
            device.symlink_to("/dev/null")
    lines = [
        "# Written by tests/support/second_slurm_cluster.py",
        f"ClusterName={layout.cluster_name}",
        "SlurmctldHost=localhost(127.0.0.1)",
        f"SlurmctldPort={layout.ctld_port}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        f"AuthInfo=cred_expire=5,socket={layout.munge_socket}",
        "CryptoType=crypto/munge",
        f"StateSaveLocation={root}/state",
        f"SlurmdSpoolDir={root}/spool/%n",
        f"SlurmctldPidFile={layout.run_dir}/slurmctld.pid",
        f"SlurmdPidFile={layout.run_dir}/slurmd-%n.pid",
        f"SlurmctldLogFile={layout.log_dir}/slurmctld.log",
        f"SlurmdLogFile={layout.log_dir}/slurmd-%n.log",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        "SlurmdParameters=config_overrides",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "MpiDefault=none",
        "SwitchType=switch/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        "DefMemPerCPU=500",
        "GresTypes=gpu",
        "SchedulerType=sched/backfill",
        "SchedulerParameters=bf_interval=1,sched_interval=1",
        "ReturnToService=2",
        "KillWait=2",
        "MinJobAge=300",
        "MessageTimeout=5",
        "SlurmdTimeout=30",
        "SlurmctldTimeout=30",
        "InactiveLimit=0",
    ]
    for node, port in zip(layout.nodes, layout.node_ports, strict=True):
        lines.append(
            f"NodeName={node} NodeHostname=localhost NodeAddr=127.0.0.1 Port={port} CPUs=4 "
            f"RealMemory=4000 Gres=gpu:{layout.gpu_type}:{layout.gpus_per_node} "
            f"Features={layout.gpu_type} State=UNKNOWN"
        )
    lines.append(
        f"PartitionName={layout.partition} Nodes={','.join(layout.nodes)} Default=YES "
        "MaxTime=INFINITE State=UP"
    )
    layout.conf.write_text("\n".join(lines) + "\n")
    devices = f"{root}/dev/nvidia[0-{layout.gpus_per_node - 1}]"
    gres = ["AutoDetect=off"] + [
        f"NodeName={node} Name=gpu Type={layout.gpu_type} File={devices}" for node in layout.nodes
    ]
    (root / "etc" / "gres.conf").write_text("\n".join(gres) + "\n")


def _port_taken(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _log_tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no log at {path})"


def _pid(layout: SecondClusterLayout, daemon: str) -> int | None:
    """The live PID recorded for ``daemon``, if it still runs that program (not a PID
    the kernel has given to another process since)."""
    try:
        pid = int(layout.pid_file(daemon).read_text().strip())
        program = Path(f"/proc/{pid}/comm").read_text().strip()
    except (OSError, ValueError):
        return None
    return pid if _alive(pid) and program == daemon.split("-", 1)[0] else None


def _start_daemon(layout: SecondClusterLayout, daemon: str, command: Sequence[str]) -> None:
    log = layout.log_dir / f"{daemon}.log"
    # Both daemons fork and write their own PID file once they are up. Their output goes
    # to the log, not to pipes: a forked daemon holding a pipe would keep run() waiting.
    with open(log, "a") as output:
        result = subprocess.run(
            list(command),
            env=layout.env,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            timeout=30,
            check=False,
        )
    deadline = time.monotonic() + 10
    while _pid(layout, daemon) is None:
        if result.returncode != 0 or time.monotonic() > deadline:
            raise SecondClusterError(
                f"{daemon} of {layout.cluster_name} did not start (exit {result.returncode}); "
                f"last lines of {log}:\n{_log_tail(log)}"
            )
        time.sleep(0.1)


def _nodes_idle(layout: SecondClusterLayout) -> str:
    result = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%N %t"],
        env=layout.env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return result.stdout if result.returncode == 0 else result.stderr


def start(layout: SecondClusterLayout) -> None:
    """Configure and start slurmctld and one slurmd per node; return once all are idle."""
    if not layout.munge_socket.exists():
        raise SecondClusterError(
            f"no munged socket at {layout.munge_socket}: start the first cluster first"
        )
    for port in (layout.ctld_port, *layout.node_ports):
        if _port_taken(port):
            raise SecondClusterError(
                f"port {port} for {layout.cluster_name} is taken by another process "
                "(another test run's second cluster?)"
            )
    write_config(layout)
    # -c: a fresh cluster, nothing recovered from an earlier run in the same directory.
    _start_daemon(layout, "slurmctld", ["slurmctld", "-c", "-f", str(layout.conf)])
    for node in layout.nodes:
        (layout.directory / "spool" / node).mkdir(parents=True, exist_ok=True)
        _start_daemon(layout, f"slurmd-{node}", ["slurmd", "-f", str(layout.conf), "-N", node])
    deadline = time.monotonic() + START_WAIT_S
    while True:
        states = _nodes_idle(layout)
        rows = [line.split() for line in states.splitlines() if line.strip()]
        if len(rows) == len(layout.nodes) and all(row[1] == "idle" for row in rows):
            return
        if time.monotonic() > deadline:
            log = layout.log_dir / "slurmctld.log"
            raise SecondClusterError(
                f"the nodes of {layout.cluster_name} did not become idle in {START_WAIT_S} s "
                f"(sinfo: {states.strip()!r}); last lines of {log}:\n{_log_tail(log)}"
            )
        time.sleep(0.2)


def stop(layout: SecondClusterLayout, *, grace_s: float = 10.0) -> None:
    """Cancel its jobs, then stop its slurmds and its slurmctld by PID (SIGTERM, then
    SIGKILL after ``grace_s``). Idempotent."""
    if _pid(layout, "slurmctld") is not None:
        subprocess.run(["scancel", "--user=root"], env=layout.env, capture_output=True, check=False)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            running = subprocess.run(
                ["squeue", "-h", "-t", "running,completing,suspended,configuring", "-o", "%i"],
                env=layout.env,
                capture_output=True,
                text=True,
                check=False,
            )
            if running.returncode != 0 or not running.stdout.strip():
                break
            time.sleep(0.2)
    for group in ([f"slurmd-{node}" for node in layout.nodes], ["slurmctld"]):
        pids = [pid for pid in (_pid(layout, daemon) for daemon in group) if pid is not None]
        for pid in pids:
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        for daemon in group:
            layout.pid_file(daemon).unlink(missing_ok=True)
