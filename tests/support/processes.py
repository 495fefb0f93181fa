"""What a test starts, killed afterwards by PID and process group; /proc reads."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from agent import procs
from agent.workload import RunningWorkload, kill_workload


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


def resident_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for PID {pid}")
