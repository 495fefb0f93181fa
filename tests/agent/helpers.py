"""Helpers for the node agent's tests: the example counter, cleanup by PID, /proc reads."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from agent import procs
from agent.workload import RunningWorkload, WorkloadStore, kill_workload, start_workload

COUNTER = Path(__file__).resolve().parents[2] / "agent" / "examples" / "counter.py"
WAIT_S = 30.0


class Reaper:
    """Tracks what a test starts and kills it afterwards, by PID and process group."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.workloads: list[RunningWorkload] = []
        self.processes: list[subprocess.Popen[bytes]] = []

    def track(self, workload: RunningWorkload) -> RunningWorkload:
        self.workloads.append(workload)
        return workload

    def popen(self, command: list[str]) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(command, start_new_session=True)
        self.processes.append(process)
        return process

    def cleanup(self) -> None:
        for workload in self.workloads:
            kill_workload(workload, timeout=10)
        for process in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
        # Anything else this test started names its tmp_path on its command line
        # (restored counters, CRIU holders): kill those too.
        for pid in processes_mentioning(f"{self.tmp_path}/"):
            procs.kill_group(pid)
            procs.wait_gone(pid, timeout=10)


def processes_mentioning(text: str) -> list[int]:
    """Running processes whose command line contains text."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if text in cmdline and procs.is_running(int(entry.name)):
            found.append(int(entry.name))
    return found


def counter_command(count_file: Path, state_mb: float) -> list[str]:
    """The example counter's command line."""
    return [
        sys.executable,
        str(COUNTER),
        "--count-file",
        str(count_file),
        "--state-mb",
        str(state_mb),
    ]


def start_counter(
    *,
    store: WorkloadStore,
    reaper: Reaper,
    count_file: Path,
    backend: str,
    state_mb: float,
    workload_id: str = "counter",
) -> RunningWorkload:
    """Start the example counter and wait until it has counted a little."""
    workload = reaper.track(
        start_workload(
            store=store,
            command=counter_command(count_file, state_mb),
            backend=backend,
            workload_id=workload_id,
        )
    )
    assert procs.wait_until(lambda: count_of(count_file) >= 10, timeout=WAIT_S), (
        f"counter did not start counting; log:\n{procs.read_tail(Path(workload.spec.log_path))}"
    )
    return workload


def progress_of(count_file: Path) -> dict[str, object]:
    try:
        return json.loads(count_file.read_text())
    except FileNotFoundError:
        return {}


def count_of(count_file: Path) -> int:
    return int(progress_of(count_file).get("count", -1))  # type: ignore[call-overload]


def next_count(count_file: Path, after: int) -> int:
    """The first count written after `after` was: a continuing counter writes after + k."""
    assert procs.wait_until(lambda: count_of(count_file) != after, timeout=WAIT_S), (
        f"the count stayed at {after}: the workload does not run"
    )
    return count_of(count_file)


def resident_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for PID {pid}")
