"""`shaper agent exec --wait -- CMD`: a managed workload as the body of a scheduler's job.

A batch script (Slurm's, say) runs exec in the foreground. exec starts CMD under the
agent's management — or, when the saga has staged a checkpoint of this job on this node
(agent.resume), restores it from that image instead — and then stays as long as the
workload does, so the scheduler sees the job running while it runs and finished when it
finishes, with its exit status.

What exec does when the workload's process is gone depends on why, which the workload's
record says (the node agent writes it):

* ``running`` and our child has exited: the workload ended; exit with its status.
* ``checkpointing``/``checkpointed``: the agent took it away on purpose. Keep the job
  alive until the scheduler requeues it (its signal ends exec) or the agent restores it
  here again (a compensating saga): then follow the restored process.
* ``released``: the agent let it go and nothing runs here; end the job (status 0 when the
  workload had been checkpointed first, 1 otherwise).

SIGTERM/SIGINT (scancel, a requeue, the end of the time limit) stop the workload first:
it runs in its own session, out of reach of the signal the scheduler sends to the script.
"""

from __future__ import annotations

import logging
import signal
import sys
import time
from collections.abc import Callable, Mapping
from types import FrameType
from typing import Any

from agent import procs, resume
from agent.backends import BackendError, create_backend
from agent.fencing import FenceStore
from agent.workload import (
    RunningWorkload,
    WorkloadState,
    WorkloadStore,
    kill_workload,
    start_workload,
)

log = logging.getLogger(__name__)
POLL_S = 0.2
EXIT_RESTORE_FAILED = 75  # EX_TEMPFAIL: the staged checkpoint could not be restored
EXIT_RELEASED = 1


class _Stop(Exception):
    def __init__(self, signum: int) -> None:
        self.signum = signum


def _say(message: str) -> None:
    print(f"shaper agent exec: {message}", file=sys.stderr, flush=True)


def start_or_resume(
    *,
    store: WorkloadStore,
    command: list[str],
    backend: str,
    workload_id: str,
    backend_options: Mapping[str, Mapping[str, Any]] | None = None,
) -> RunningWorkload:
    """Restore the workload from a checkpoint staged on this node, else start CMD afresh.

    backend_options: constructor options by backend name ({"criu": {"criu": path}})."""
    pointer = resume.take(FenceStore(store.state_dir), store.images_dir, workload_id)
    if pointer is None:
        return start_workload(
            store=store, command=command, backend=backend, workload_id=workload_id
        )
    _say(
        f"restoring {workload_id} from the checkpoint staged at {pointer.image_dir} "
        f"(generation {pointer.generation})"
    )
    image = pointer.image
    if image.workload.id != workload_id:
        # A job moved from another cluster has a new id here (the scheduler's); its image
        # names the one it had there. It runs, and is recorded, under the new one: that is
        # the id the saga's next steps here, and later sagas, name it by.
        _say(f"the checkpoint was taken as {image.workload.id} in another cluster")
        image = image.model_copy(
            update={"workload": image.workload.model_copy(update={"id": workload_id})}
        )
    options = (backend_options or {}).get(image.backend, {})
    backend_impl = create_backend(image.backend, store=store, **options)
    restored = backend_impl.restore(image, image_dir=pointer.image_dir)
    if not resume.still_wanted(FenceStore(store.state_dir), workload_id, pointer):
        kill_workload(restored, timeout=10)
        restored.state = WorkloadState.released
        store.save(restored)
        raise resume.StaleResume(
            f"workload {workload_id}: a newer saga fenced it off this node while it was "
            f"restored from generation {pointer.generation}; stopped again"
        )
    return restored


def _child_of_ours(workload: RunningWorkload) -> int | None:
    """The process whose exit status is the workload's: the holder of a CRIU restore
    (it exits with the restored tree's status) or the workload itself."""
    return workload.holder_pid or workload.pid


def follow(
    store: WorkloadStore,
    workload: RunningWorkload,
    *,
    poll_s: float = POLL_S,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Wait while the workload runs here; the exit status for the scheduler."""
    child = _child_of_ours(workload)
    said_checkpointed = False
    while True:
        status = procs.exit_code(child) if child is not None else None
        record = store.load(workload.id)
        state = record.state
        if state in (WorkloadState.checkpointing, WorkloadState.checkpointed):
            if state is WorkloadState.checkpointed and not said_checkpointed:
                _say(f"{workload.id} was checkpointed; waiting for the scheduler to requeue it")
                said_checkpointed = True
        elif state is WorkloadState.released:
            if record.is_running():
                kill_workload(record, timeout=10)
            _say(f"{workload.id} was released by the node agent; nothing runs here")
            return 0 if said_checkpointed else EXIT_RELEASED
        elif record.pid != workload.pid:
            # Restored here by the agent (a compensating saga): follow the new process.
            _say(f"{workload.id} was restored by the node agent as PID {record.pid}")
            workload, child, said_checkpointed = record, None, False
        elif status is not None:
            return status if status >= 0 else 128 - status
        elif child is None and not record.is_running():
            _say(f"{workload.id} ended; its exit status is unknown here (not our child)")
            return 0
        sleep(poll_s)


def run(
    *,
    store: WorkloadStore,
    command: list[str],
    backend: str,
    workload_id: str,
    backend_options: Mapping[str, Mapping[str, Any]] | None = None,
) -> int:
    """exec --wait: start or resume, follow, stop the workload when told to stop.

    A stop that comes while the workload is being started or restored waits until it
    runs and is recorded, then stops it: raised mid-restore, it left the restored process
    running with the record still naming the checkpointed one, so nothing stopped it."""
    starting = True
    deferred: list[int] = []

    def stop(signum: int, frame: FrameType | None) -> None:
        if starting and not deferred:  # a second stop does not wait (a hung restore)
            deferred.append(signum)
            return
        raise _Stop(signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, stop)
    try:
        try:
            workload = start_or_resume(
                store=store,
                command=command,
                backend=backend,
                workload_id=workload_id,
                backend_options=backend_options,
            )
        except (resume.StaleResume, BackendError) as error:
            _say(f"error: {error}")
            return 128 + deferred[0] if deferred else EXIT_RESTORE_FAILED
        finally:
            starting = False
        _say(f"{workload.id} runs as PID {workload.pid}")
        if deferred:
            raise _Stop(deferred[0])
        return follow(store, workload)
    except _Stop as stopped:
        try:
            record = store.load(workload_id)
        except KeyError:
            record = None
        if record is not None and record.state is WorkloadState.running and record.is_running():
            _say(f"{signal.Signals(stopped.signum).name}: stopping {workload_id}")
            kill_workload(record, timeout=10)
            record.state = WorkloadState.released
            store.save(record)
        return 128 + stopped.signum
