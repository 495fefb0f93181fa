"""Cooperative checkpoint/restore: the workload saves itself when asked.

Contract with the workload (agent/examples/counter.py follows it):
- it is started with $SHAPER_CHECKPOINT_PATH; on SIGUSR1 it writes its checkpoint there
  (a file or a directory, atomically: write elsewhere, then rename) and exits with 0;
- it is started again with $SHAPER_RESUME_FROM=<path of that checkpoint> and resumes
  from it.

The agent moves the checkpoint into the image directory and checksums it like any image.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from agent import procs
from agent.backends.base import (
    CheckpointFailed,
    CheckpointImage,
    RestoreFailed,
    WorkloadNotRunning,
    checkpoint_lost,
    fresh_image_dir,
    release_process,
    require_gone,
    require_running,
    seal_image,
    verify_image,
)
from agent.workload import (
    CHECKPOINT_PATH_ENV,
    RESUME_FROM_ENV,
    RunningWorkload,
    WorkloadStartFailed,
    WorkloadState,
    WorkloadStore,
    start_process,
    utc_now,
)

CHECKPOINT_NAME = "checkpoint"


class SignalBackend:
    name = "signal"

    def __init__(
        self,
        *,
        store: WorkloadStore,
        checkpoint_signal: int = signal.SIGUSR1,
        checkpoint_timeout: float = 120.0,
        now: Callable[[], datetime] = utc_now,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """checkpoint_timeout: how long the workload may take to save itself and exit."""
        self.store = store
        self.checkpoint_signal = checkpoint_signal
        self.checkpoint_timeout = checkpoint_timeout
        self._now = now
        self._clock = clock

    def checkpoint(self, workload: RunningWorkload, image_dir: Path) -> CheckpointImage:
        pid = require_running(workload)
        if workload.checkpoint_path is None:
            raise CheckpointFailed(
                f"workload {workload.id} was not started with ${CHECKPOINT_PATH_ENV}; "
                "it cannot checkpoint cooperatively"
            )
        image_dir = fresh_image_dir(workload, image_dir)
        saved_to = Path(workload.checkpoint_path)
        _remove(saved_to)  # a stale one from an earlier round must not pass for a new one

        started = self._clock()
        try:
            os.kill(pid, self.checkpoint_signal)
        except ProcessLookupError:
            raise WorkloadNotRunning(
                f"workload {workload.id}: process {pid} exited before the checkpoint signal"
            ) from None
        if not procs.wait_gone(pid, timeout=self.checkpoint_timeout):
            raise CheckpointFailed(
                f"workload {workload.id}: did not save and exit within "
                f"{self.checkpoint_timeout} s of {signal.Signals(self.checkpoint_signal).name}; "
                "it keeps running"
            )
        saved = self._clock()
        status = procs.exit_code(pid)
        if not saved_to.exists():
            raise CheckpointFailed(
                f"workload {workload.id}: exited (status {_describe(status)}) without writing "
                f"its checkpoint to {saved_to}; it is no longer running"
            )
        if status not in (None, 0):
            raise CheckpointFailed(
                f"workload {workload.id}: exited with status {_describe(status)} after "
                f"{signal.Signals(self.checkpoint_signal).name}; its checkpoint at {saved_to} "
                "is not trusted and it is no longer running"
            )
        shutil.move(saved_to, image_dir / CHECKPOINT_NAME)
        moved = self._clock()
        return self._seal(
            workload,
            image_dir,
            started=started,
            phases={"save_and_exit": saved - started, "move": moved - saved},
        )

    def recover_checkpoint(self, workload: RunningWorkload, image_dir: Path) -> CheckpointImage:
        """Seal the checkpoint a workload saved before its agent died, wherever it got to.

        The workload writes its checkpoint atomically (write elsewhere, then rename) and the
        agent removes any earlier one before the signal, so a checkpoint at its path, or
        already moved into the image, is this round's and complete. Its exit status died
        with the agent; like checkpoint(), an unknown status is not held against it.
        """
        require_gone(workload)
        image_dir = Path(image_dir).resolve()
        started = self._clock()
        moved_to = image_dir / CHECKPOINT_NAME
        saved_to = Path(workload.checkpoint_path) if workload.checkpoint_path else None
        if saved_to is not None and saved_to.exists():
            # Not moved yet, or only partly copied (a move across file systems copies).
            _remove(moved_to)
            shutil.move(saved_to, moved_to)
        elif not moved_to.exists():
            raise checkpoint_lost(
                workload,
                image_dir,
                f"the workload exited without saving a checkpoint to {saved_to}",
            )
        moved = self._clock()
        return self._seal(workload, image_dir, started=started, phases={"move": moved - started})

    def _seal(
        self,
        workload: RunningWorkload,
        image_dir: Path,
        *,
        started: float,
        phases: dict[str, float],
    ) -> CheckpointImage:
        image = seal_image(
            backend=self.name,
            workload=workload,
            image_dir=image_dir,
            started=started,
            phases=phases,
            clock=self._clock,
            created_at=self._now(),
        )
        workload.state = WorkloadState.checkpointed
        self.store.save(workload)
        return image

    def restore(
        self, image: CheckpointImage, *, image_dir: str | Path | None = None
    ) -> RunningWorkload:
        if image.backend != self.name:
            raise RestoreFailed(
                f"workload {image.workload.id}: a {image.backend!r} image cannot be restored "
                "by the signal backend"
            )
        image_dir = Path(image_dir or image.image_dir).resolve()
        verify_image(image, image_dir)
        resume_from = image_dir / CHECKPOINT_NAME
        try:
            return start_process(
                store=self.store,
                spec=image.workload,
                backend=self.name,
                extra_env={RESUME_FROM_ENV: str(resume_from)},
                resumed_from=str(resume_from),
                now=self._now,
            )
        except WorkloadStartFailed as error:
            raise RestoreFailed(str(error)) from error

    def release(self, workload: RunningWorkload, *, timeout: float = 10.0) -> None:
        release_process(self.store, workload, timeout=timeout)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _describe(status: int | None) -> str:
    if status is None:
        return "unknown"
    if status < 0:
        return f"killed by {signal.Signals(-status).name}"
    return str(status)
