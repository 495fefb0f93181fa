"""Faults of the node agent's own step handling (agent.steps, agent.foreground) that a
review found, where a job could run twice, a job or its checkpoint could be lost, or the
agent's answer could misstate what happened; each test fails on the tree before its fix.

Each test calls StepExecutor.run() directly with the signal backend over a temporary state
directory, as the saga's messages would arrive. An "agent death" or a full disk is an
exception raised where the agent would meet it.
"""

from __future__ import annotations

import errno
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from agent import foreground, procs
from agent import steps as steps_module
from agent.backends import signal as signal_module
from agent.backends.base import CheckpointImage, checksum_image, image_size
from agent.steps import StepExecutor
from agent.workload import (
    RunningWorkload,
    WorkloadSpec,
    WorkloadState,
    WorkloadStore,
    start_process,
    start_workload,
)
from tests.support.counter import start_counter
from tests.support.processes import Reaper
from wire.steps import AgentStep, AgentStepRequest, StepReport

WORKLOAD = "counter"


def agent(store: WorkloadStore) -> StepExecutor:
    """A freshly built agent over the store's state directory (as after a restart)."""
    return StepExecutor(store=store, cluster="lab", node="a", confirm_grace_s=0.2)


def step(
    store: WorkloadStore,
    name: AgentStep,
    generation: int,
    *,
    phase: str = "forward",
    **args: Any,
) -> StepReport:
    """Deliver step `name` of the saga at `generation`, keyed as the saga keys it."""
    return agent(store).run(
        AgentStepRequest(
            action_id=generation,
            key=f"a{generation}:{phase}:{name.value}",
            step=name,
            workload_id=WORKLOAD,
            generation=generation,
            args=args,
        )
    )


def disk_full(*_args: Any, **_kwargs: Any) -> Any:
    raise OSError(errno.ENOSPC, "No space left on device")


def counter(tmp_path: Path, store: WorkloadStore, reaper: Reaper) -> RunningWorkload:
    return start_counter(
        store=store, reaper=reaper, count_file=tmp_path / "count.json", backend="signal", state_mb=1
    )


# -- a failed checkpoint that never stopped the process --------------------------------


def test_an_oserror_before_the_signal_leaves_the_running_workload_recorded_running(
    tmp_path: Path, store: WorkloadStore, reaper: Reaper, monkeypatch: pytest.MonkeyPatch
) -> None:
    """steps.checkpoint reset the record to RUNNING only for a BackendError; an OSError
    (here: the image directory cannot be made, disk full) left CHECKPOINTING on a process
    that was never signalled, which `agent exec` and a later restore read as stopped."""
    workload = counter(tmp_path, store, reaper)
    monkeypatch.setattr(signal_module, "fresh_image_dir", disk_full)

    report = step(store, AgentStep.checkpoint, 1)

    assert not report.ok
    assert workload.is_running()
    assert store.load(WORKLOAD).state is WorkloadState.running


def test_the_compensating_restore_does_not_kill_a_workload_that_still_runs(
    tmp_path: Path, store: WorkloadStore, reaper: Reaper, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The saga compensates a failed checkpoint with restore@S (generation G+1, no image):
    "a no-op when the job still runs at S". With the record left CHECKPOINTING,
    restore's _reap_unrecorded took the recorded, running process for an unrecorded copy
    (its environment carries this node's checkpoint path), killed it, and then failed for
    want of an image: the job was killed and lost. A running process is now already
    running, whatever its record says."""
    workload = counter(tmp_path, store, reaper)
    with monkeypatch.context() as patch:
        patch.setattr(signal_module, "fresh_image_dir", disk_full)
        assert not step(store, AgentStep.checkpoint, 1).ok

    assert_compensating_restore_keeps_it_running(store, workload)


def test_a_restore_after_an_agent_died_before_the_signal_keeps_the_workload(
    tmp_path: Path, store: WorkloadStore, reaper: Reaper
) -> None:
    """The same through a crash: the agent died between recording CHECKPOINTING and
    signalling the workload; the saga gave up the checkpoint and compensates."""
    workload = counter(tmp_path, store, reaper)
    workload.state = WorkloadState.checkpointing
    store.save(workload)

    assert_compensating_restore_keeps_it_running(store, workload)


def assert_compensating_restore_keeps_it_running(
    store: WorkloadStore, workload: RunningWorkload
) -> None:
    """The saga's compensating restore (generation 2) finds the job still running: it
    answers ok, and the job is not killed."""
    restore = step(store, AgentStep.restore, 2, phase="compensate")

    assert workload.is_running(), f"the running job was killed; restore said {restore.error}"
    assert restore.ok, restore.error


# -- a checkpoint of a process that already exited --------------------------------------


def test_a_checkpoint_of_an_exited_workload_does_not_record_it_checkpointing(
    tmp_path: Path, store: WorkloadStore, reaper: Reaper
) -> None:
    """A job that ended on its own is not "taken away on purpose": CHECKPOINTING kept its
    `agent exec --wait` waiting for a requeue for ever instead of ending the batch job."""
    workload = reaper.track(
        start_workload(store=store, command=["true"], backend="signal", workload_id=WORKLOAD)
    )
    assert procs.wait_gone(workload.pid or 0, timeout=10)

    report = step(store, AgentStep.checkpoint, 1)

    assert not report.ok and not report.retryable
    assert store.load(WORKLOAD).state is not WorkloadState.checkpointing


# -- a checkpoint taken, but answered as failed -----------------------------------------


def test_a_checkpoint_whose_record_could_not_be_written_is_not_journalled_as_failed(
    tmp_path: Path, store: WorkloadStore, reaper: Reaper, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process stopped and the image was sealed, then writing image.json failed (disk
    full: the image just filled it). The OSError was journalled as a final failure, so the
    retry was answered from the journal and never reached _recover: the saga compensated
    with no image, and the job's only state sat unused on disk. It is retryable now."""
    workload = counter(tmp_path, store, reaper)
    with monkeypatch.context() as patch:
        patch.setattr(steps_module, "_write_atomically", disk_full)
        first = step(store, AgentStep.checkpoint, 1)
    assert not first.ok and not workload.is_running()

    again = step(store, AgentStep.checkpoint, 1)

    assert again.ok and "image" in again.result, (
        f"first: retryable={first.retryable} {first.error}; again: {again.outcome} {again.error}"
    )


def test_a_restore_without_the_image_finds_the_checkpoint_taken_here(
    tmp_path: Path, store: WorkloadStore, reaper: Reaper
) -> None:
    """Checkpoint G was queued behind a dead agent; the saga gave it up and compensates with
    restore@S G+1, built without an image (the checkpoint never answered). The agent
    comes back and runs the queue in order: the checkpoint (not stale yet) stops the job,
    then the restore said there was no checkpoint, though image.json of G is on its disk.
    It restores from the last image taken here when that checkpoint is the last thing
    that happened to the workload here."""
    workload = counter(tmp_path, store, reaper)
    late = step(store, AgentStep.checkpoint, 1)
    assert late.ok and not workload.is_running(), late.error

    restore = step(store, AgentStep.restore, 2, phase="compensate")

    assert restore.ok, restore.error
    reaper.track(store.load(WORKLOAD))
    assert store.load(WORKLOAD).is_running()


# -- exec resuming a staged image while the agent releases the node ----------------------


def hand_made_image(tmp_path: Path) -> CheckpointImage:
    """A signal image of a job whose command ignores its checkpoint (sleep)."""
    image_dir = tmp_path / "source" / "image"
    image_dir.mkdir(parents=True)
    (image_dir / signal_module.CHECKPOINT_NAME).write_text("state")
    files = checksum_image(image_dir)
    spec = WorkloadSpec(
        id=WORKLOAD,
        command=["/bin/sleep", "600"],
        env={},
        cwd=str(tmp_path),
        log_path=str(tmp_path / "job.log"),
    )
    return CheckpointImage(
        workload=spec,
        backend="signal",
        image_dir=str(image_dir),
        files=files,
        size_bytes=image_size(files),
        duration_s=0.0,
        created_at=datetime.now(UTC),
    )


def test_a_release_while_exec_restores_the_staged_image_leaves_nothing_running(
    tmp_path: Path, store: WorkloadStore, reaper: Reaper, monkeypatch: pytest.MonkeyPatch
) -> None:
    """resume.take holds the fence only while it takes the pointer; the restore runs after.
    A compensating release@T (generation G+1) that lands in between finds nothing to stop
    and answers "released", and exec then started the job here anyway: it ran at T after
    T was fenced off, and again at S where compensation sends it. exec now reads the fence
    again once restored, and stops the copy when a newer saga has moved it."""
    image = hand_made_image(tmp_path)
    transfer = step(store, AgentStep.transfer, 1, image=image.model_dump(mode="json"))
    assert transfer.ok, transfer.error
    staged = step(
        store,
        AgentStep.stage,
        1,
        image=image.model_dump(mode="json"),
        image_dir=transfer.result["image_dir"],
    )
    assert staged.ok, staged.error
    released: list[StepReport] = []

    def release_first(**kwargs: Any) -> RunningWorkload:
        released.append(step(store, AgentStep.release, 2, phase="compensate", delete_image=True))
        return reaper.track(start_process(**kwargs))

    monkeypatch.setattr(signal_module, "start_process", release_first)

    try:
        workload = foreground.start_or_resume(
            store=store, command=["/bin/false"], backend="signal", workload_id=WORKLOAD
        )
    except Exception:  # noqa: BLE001 - refusing to start is the sound outcome
        workload = None
    time.sleep(0.2)

    assert released and released[0].ok, released
    running = workload is not None and workload.is_running()
    assert not running, f"the job runs here after release at generation 2: {released[0].result}"
