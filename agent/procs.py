"""Process plumbing for the node agent: start detached, find, wait for, reap and kill.

Everything here works on host PIDs read from /proc. A zombie counts as gone: on machines
whose init never reaps (containers, microVMs) an orphan's zombie can stay for good, and it
no longer runs or holds memory. Children that this process started are reaped, so their
PIDs are really free again.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

# Children started through spawn_detached(), by PID, so they can be reaped and their exit
# status read. A process that this agent did not start is watched through /proc only.
_children: dict[int, subprocess.Popen[bytes]] = {}


def spawn_detached(
    command: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str | os.PathLike[str],
    log_path: Path,
) -> subprocess.Popen[bytes]:
    """Start a command in its own session, stdin from /dev/null, output appended to a log.

    A session of its own (setsid) and no terminal are what CRIU needs to dump the tree
    without --shell-job, and what lets the agent signal the whole process group.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            list(command),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(env),
            cwd=cwd,
            start_new_session=True,
            close_fds=True,
        )
    _children[process.pid] = process
    _exit_codes.pop(process.pid, None)
    return process


# Exit statuses of reaped children, newest last, bounded so a long-lived agent stays small.
_exit_codes: dict[int, int] = {}
_MAX_EXIT_CODES = 4096


def exit_code(pid: int) -> int | None:
    """The exit status of a child started here once it has ended, else None."""
    _reap(pid)
    return _exit_codes.get(pid)


def _reap(pid: int) -> bool:
    """Reap a child started here if it has ended; True when it has."""
    process = _children.get(pid)
    if process is None:
        return False
    status = process.poll()
    if status is None:
        return False
    del _children[pid]
    _exit_codes[pid] = status
    while len(_exit_codes) > _MAX_EXIT_CODES:
        del _exit_codes[next(iter(_exit_codes))]
    return True


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name, or None when PID does not exist."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name may hold spaces and parentheses; it ends at the last ')'.
    return raw[raw.rindex(")") + 2 :].split()


def is_running(pid: int) -> bool:
    """True when PID exists and is not a zombie."""
    if _reap(pid):
        return False
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def start_ticks(pid: int) -> int | None:
    """When PID started, in clock ticks since boot: with the PID, a unique process id."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields is not None else None


def is_same_process(pid: int, started: int | None) -> bool:
    """True when PID runs and is the process that started at `started` (not a reused PID)."""
    return is_running(pid) and (started is None or start_ticks(pid) == started)


def parent_pid(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[1]) if fields is not None else None


def namespace_pids(pid: int) -> list[int]:
    """PID of a process in each PID namespace, outermost (this one) first."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return [int(value) for value in line.split()[1:]]
    except (FileNotFoundError, ProcessLookupError):
        return []
    return []


def _running_where(field: int, value: int) -> list[int]:
    """Running processes whose /proc/PID/stat field (index after the name) equals value."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        fields = _stat_fields(pid)
        if fields is not None and int(fields[field]) == value and fields[0] not in ("Z", "X"):
            found.append(pid)
    return found


def children_of(pid: int) -> list[int]:
    """Running children of PID, found by scanning /proc (no /proc/PID/task/*/children)."""
    return _running_where(1, pid)


def group_members(pgid: int) -> list[int]:
    """Running processes of process group pgid."""
    return _running_where(2, pgid)


def wait_until(
    condition: Callable[[], bool],
    *,
    timeout: float,
    interval: float = 0.02,
    clock: Callable[[], float] = time.monotonic,
) -> bool:
    """Poll condition until it holds or timeout seconds pass; returns the last result."""
    deadline = clock() + timeout
    while True:
        if condition():
            return True
        if clock() >= deadline:
            return condition()
        time.sleep(interval)


def wait_gone(pid: int, *, timeout: float) -> bool:
    """Wait until PID has exited (or is a zombie); True when it has."""
    return wait_until(lambda: not is_running(pid), timeout=timeout)


def wait_group_gone(pgid: int, *, timeout: float) -> bool:
    """Wait until no process of group pgid runs; True when none does."""
    return wait_until(lambda: not group_members(pgid), timeout=timeout)


def kill_group(pid: int, sig: int = signal.SIGKILL) -> int | None:
    """Signal PID's process group, or PID alone when it leads none; ignore the gone.

    Returns the process group that was signalled, if any.
    """
    try:
        group = os.getpgid(pid)
    except ProcessLookupError:
        return None
    try:
        if group == pid:
            os.killpg(group, sig)
            return group
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
    return None


def read_tail(path: Path, *, lines: int = 15) -> str:
    """The last lines of a log, for error messages; empty when there is no log."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
