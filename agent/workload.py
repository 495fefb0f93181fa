"""Workloads under the agent's management, and the state directory that records them.

`shaper agent exec -- CMD` calls start_workload(): the command starts detached (its own
session, stdin from /dev/null, output to a log in the state directory), and a JSON state
file records what is needed to checkpoint it later and to start it again: PID, command,
environment, working directory, log path.

State directory layout (agent.settings: $SHAPER_AGENT_STATE_DIR, default /var/lib/shaper/agent):

    workloads/<id>.json        one RunningWorkload per managed workload
    workloads/<id>/output.log  the workload's stdout and stderr
    workloads/<id>/...         backend files (CRIU restore logs, pidfiles)
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, Field

from agent import procs

# A checkpoint-capable workload writes its cooperative checkpoint here on SIGUSR1...
CHECKPOINT_PATH_ENV = "SHAPER_CHECKPOINT_PATH"
# ...and, when started again, reads it back from here.
RESUME_FROM_ENV = "SHAPER_RESUME_FROM"
WORKLOAD_ID_ENV = "SHAPER_WORKLOAD_ID"

_WORKLOAD_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def utc_now() -> datetime:
    return datetime.now(UTC)


class WorkloadState(StrEnum):
    running = "running"
    # The agent is taking a checkpoint: the process is about to stop, on purpose.
    checkpointing = "checkpointing"
    checkpointed = "checkpointed"
    released = "released"


class WorkloadSpec(BaseModel):
    """What it takes to start a workload again: the same on every node."""

    id: str = Field(max_length=128, pattern=_WORKLOAD_ID.pattern)
    command: list[str] = Field(min_length=1)
    env: dict[str, str]
    cwd: str
    log_path: str


class RunningWorkload(BaseModel):
    """A managed workload as this node's agent knows it."""

    spec: WorkloadSpec
    backend: str
    state: WorkloadState = WorkloadState.running
    # Host PID of the workload's root process; None for simulated workloads.
    pid: int | None = None
    # Its start time in ticks since boot, so a reused PID is never taken for it.
    pid_started: int | None = None
    # Its PID inside its own PID namespace, when it was restored into one.
    namespace_pid: int | None = None
    # A process that holds the workload (CRIU restore's namespace init); killing it ends
    # the workload. None when the workload is a plain child of the agent.
    holder_pid: int | None = None
    holder_started: int | None = None
    started_at: datetime
    resumed_from: str | None = None
    # Where a cooperative workload was told to write its checkpoint on SIGUSR1.
    checkpoint_path: str | None = None

    @property
    def id(self) -> str:
        return self.spec.id

    def is_running(self) -> bool:
        """True while the workload's root process (not a later owner of its PID) runs."""
        return self.pid is not None and procs.is_same_process(self.pid, self.pid_started)


class WorkloadStore:
    """JSON state files, one per workload, in the agent's state directory."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = Path(state_dir)
        self.workloads_dir = self.state_dir / "workloads"
        # Checkpoint images this node wrote or received (agent steps, `agent exec --wait`).
        self.images_dir = self.state_dir / "images"
        self.workloads_dir.mkdir(parents=True, exist_ok=True, mode=0o700)

    def workload_dir(self, workload_id: str) -> Path:
        path = self.workloads_dir / _checked_id(workload_id)
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        return path

    def save(self, workload: RunningWorkload) -> None:
        path = self.workloads_dir / f"{workload.id}.json"
        temporary = path.with_suffix(".json.tmp")
        temporary.write_text(workload.model_dump_json(indent=2))
        os.replace(temporary, path)

    def load(self, workload_id: str) -> RunningWorkload:
        path = self.workloads_dir / f"{_checked_id(workload_id)}.json"
        try:
            return RunningWorkload.model_validate_json(path.read_text())
        except FileNotFoundError:
            raise KeyError(f"workload {workload_id!r} has no state file at {path}") from None

    def all(self) -> list[RunningWorkload]:
        return [
            RunningWorkload.model_validate_json(path.read_text())
            for path in sorted(self.workloads_dir.glob("*.json"))
        ]


def _checked_id(workload_id: str) -> str:
    """The id itself, once it is safe as a file name; else ValueError."""
    if not _WORKLOAD_ID.fullmatch(workload_id):
        raise ValueError(f"workload id {workload_id!r} must match {_WORKLOAD_ID.pattern}")
    return workload_id


def new_workload_id() -> str:
    return f"w-{uuid.uuid4().hex[:12]}"


def start_process(
    *,
    store: WorkloadStore,
    spec: WorkloadSpec,
    backend: str,
    extra_env: Mapping[str, str] | None = None,
    resumed_from: str | None = None,
    now: Callable[[], datetime] = utc_now,
) -> RunningWorkload:
    """Start spec's command detached and record it; extra_env is for this start only."""
    checkpoint_path = str(store.workload_dir(spec.id) / "checkpoint")
    env = {
        **spec.env,
        WORKLOAD_ID_ENV: spec.id,
        CHECKPOINT_PATH_ENV: checkpoint_path,
        **(extra_env or {}),
    }
    try:
        process = procs.spawn_detached(
            spec.command, env=env, cwd=spec.cwd, log_path=Path(spec.log_path)
        )
    except OSError as error:
        raise WorkloadStartFailed(
            f"workload {spec.id}: cannot start {spec.command[0]!r}: {error}"
        ) from error
    workload = RunningWorkload(
        spec=spec,
        backend=backend,
        pid=process.pid,
        pid_started=procs.start_ticks(process.pid),
        started_at=now(),
        resumed_from=resumed_from,
        checkpoint_path=checkpoint_path,
    )
    store.save(workload)
    return workload


def start_workload(
    *,
    store: WorkloadStore,
    command: Sequence[str],
    backend: str = "criu",
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    workload_id: str | None = None,
    now: Callable[[], datetime] = utc_now,
) -> RunningWorkload:
    """Start a workload under management so that `backend` can checkpoint it later.

    The full environment is recorded (the caller's own when env is None), so that a
    cooperative restart on another node sees what the first start saw.
    """
    if not command:
        raise ValueError("command must not be empty")
    workload_id = _checked_id(workload_id or new_workload_id())
    spec = WorkloadSpec(
        id=workload_id,
        command=list(command),
        env=dict(os.environ if env is None else env),
        cwd=str(Path(cwd or os.getcwd()).resolve()),
        log_path=str(store.workload_dir(workload_id) / "output.log"),
    )
    return start_process(store=store, spec=spec, backend=backend, now=now)


def kill_workload(workload: RunningWorkload, *, timeout: float) -> bool:
    """SIGKILL the workload's process group and its holder's; True once all are gone."""
    pids = [
        pid
        for pid, started in (
            (workload.holder_pid, workload.holder_started),
            (workload.pid, workload.pid_started),
        )
        if pid is not None and procs.is_same_process(pid, started)
    ]
    groups = [group for pid in pids if (group := procs.kill_group(pid)) is not None]
    gone = all(procs.wait_gone(pid, timeout=timeout) for pid in pids)
    return gone and all(procs.wait_group_gone(group, timeout=timeout) for group in groups)


class WorkloadStartFailed(RuntimeError):
    """The command could not be started (missing binary, bad working directory)."""
