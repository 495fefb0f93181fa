"""A checkpoint backend for simulated clusters: no processes, no files.

It keeps the same rules as the real backends, so sagas driven against simulated nodes
fail where real ones would: only a running workload can be checkpointed, a workload never
runs twice on one node, an image of another backend is refused, and an interrupted
checkpoint is recovered only if this node finished the dump. Checkpoint time and
image size follow the workload's memory and a configured disk bandwidth.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from agent.backends.base import (
    CheckpointFailed,
    CheckpointImage,
    RestoreFailed,
    WorkloadNotRunning,
    checkpoint_lost,
)
from agent.workload import RunningWorkload, WorkloadSpec, WorkloadState, utc_now

DEFAULT_BANDWIDTH = 300_000_000  # bytes/s: CRIU's measured dump rate on this machine kind


class SimBackend:
    name = "sim"

    def __init__(
        self,
        *,
        bandwidth_bytes_per_s: float = DEFAULT_BANDWIDTH,
        now: Callable[[], datetime] = utc_now,
    ) -> None:
        if bandwidth_bytes_per_s <= 0:
            raise ValueError("bandwidth_bytes_per_s must be positive")
        self.bandwidth_bytes_per_s = bandwidth_bytes_per_s
        self._now = now
        self._running: dict[str, RunningWorkload] = {}
        self._memory_bytes: dict[str, int] = {}
        # Workloads whose dump this node finished, until they run again: the mark that
        # recover_checkpoint() goes by, as CRIU's dump.log for the criu backend.
        self._dumped: set[str] = set()

    def start(self, *, workload_id: str, memory_bytes: int) -> RunningWorkload:
        """Start a simulated workload holding memory_bytes of state."""
        if workload_id in self._running:
            raise RestoreFailed(f"workload {workload_id} already runs on this simulated node")
        spec = WorkloadSpec(id=workload_id, command=["sim"], env={}, cwd="/", log_path="/dev/null")
        return self._run(spec, memory_bytes=memory_bytes, resumed_from=None)

    def running(self) -> list[RunningWorkload]:
        return list(self._running.values())

    def checkpoint(self, workload: RunningWorkload, image_dir: Path) -> CheckpointImage:
        if self._running.get(workload.id) is not workload:
            raise WorkloadNotRunning(
                f"workload {workload.id} is not running on this simulated node"
            )
        del self._running[workload.id]
        self._dumped.add(workload.id)
        return self._image(workload, image_dir)

    def recover_checkpoint(self, workload: RunningWorkload, image_dir: Path) -> CheckpointImage:
        if self._running.get(workload.id) is not None:
            raise CheckpointFailed(
                f"workload {workload.id} still runs on this simulated node; checkpoint it again"
            )
        if workload.id not in self._dumped:
            raise checkpoint_lost(workload, image_dir, "this node never finished its dump")
        return self._image(workload, image_dir)

    def _image(self, workload: RunningWorkload, image_dir: Path) -> CheckpointImage:
        memory_bytes = self._memory_bytes[workload.id]
        workload.state = WorkloadState.checkpointed
        return CheckpointImage(
            workload=workload.spec,
            backend=self.name,
            image_dir=str(image_dir),
            files={},
            size_bytes=memory_bytes,
            duration_s=memory_bytes / self.bandwidth_bytes_per_s,
            created_at=self._now(),
            details={"memory_bytes": memory_bytes},
        )

    def restore(
        self, image: CheckpointImage, *, image_dir: str | Path | None = None
    ) -> RunningWorkload:
        if image.backend != self.name:
            raise RestoreFailed(
                f"workload {image.workload.id}: a {image.backend!r} image cannot be restored "
                "by the sim backend"
            )
        if image.workload.id in self._running:
            raise RestoreFailed(
                f"workload {image.workload.id} already runs on this simulated node; "
                "restoring it again would run it twice"
            )
        return self._run(
            image.workload,
            memory_bytes=int(image.details["memory_bytes"]),
            resumed_from=str(image_dir or image.image_dir),
        )

    def release(self, workload: RunningWorkload, *, timeout: float = 10.0) -> None:
        if self._running.get(workload.id) is workload:
            del self._running[workload.id]
        workload.state = WorkloadState.released

    def _run(
        self, spec: WorkloadSpec, *, memory_bytes: int, resumed_from: str | None
    ) -> RunningWorkload:
        workload = RunningWorkload(
            spec=spec, backend=self.name, started_at=self._now(), resumed_from=resumed_from
        )
        self._running[spec.id] = workload
        self._memory_bytes[spec.id] = memory_bytes
        self._dumped.discard(spec.id)
        return workload
