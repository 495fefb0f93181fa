"""A checkpoint step whose agent dies after the process stopped and before the image was
recorded: the redelivered step recovers the image from the dump, or says the job is lost.

The agent's death is a BaseException raised where the backend seals the image (the
checksum: seconds for a large image) or where the step writes ``image.json``; a new
StepExecutor over the same state directory then gets the same step again, as after a
redelivery (acks_late).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent import procs
from agent.backends import criu as criu_module
from agent.backends import signal as signal_module
from agent.backends.base import CheckpointFailed, CheckpointImage, CheckpointLost
from agent.backends.criu import CriuBackend
from agent.backends.signal import CHECKPOINT_NAME, SignalBackend
from agent.backends.sim import SimBackend
from agent.steps import StepExecutor
from agent.workload import RunningWorkload, WorkloadState, WorkloadStore, start_workload
from tests.support.counter import count_of, next_count, progress_of, start_counter
from tests.support.processes import Reaper
from wire.steps import AgentStep, AgentStepRequest, Outcome, StepReport


class AgentDied(BaseException):
    """The agent is killed here: nothing the code under test catches stops it."""


def die(*_args: Any, **_kwargs: Any) -> Any:
    raise AgentDied


def checkpoint(
    store: WorkloadStore, generation: int = 1, *, criu_binary: str | None = None
) -> StepReport:
    """Deliver checkpoint step `generation` to a freshly built agent over `store`."""
    options = {"criu": {"criu": criu_binary}} if criu_binary else {}
    agent = StepExecutor(store=store, cluster="lab", node="a", backend_options=options)
    return agent.run(
        AgentStepRequest(
            action_id=1,
            key=f"m{generation}:checkpoint",
            step=AgentStep.checkpoint,
            workload_id="counter",
            generation=generation,
        )
    )


def image_dir(store: WorkloadStore, generation: int = 1) -> Path:
    return store.images_dir / "counter" / f"g{generation}" / "image"


def torn(
    store: WorkloadStore,
    monkeypatch: pytest.MonkeyPatch,
    target: object,
    name: str,
    generation: int = 1,
    criu_binary: str | None = None,
) -> None:
    """Deliver the checkpoint with the agent dying at target.name."""
    with monkeypatch.context() as patch:
        patch.setattr(target, name, die)
        with pytest.raises(AgentDied):
            checkpoint(store, generation, criu_binary=criu_binary)
    assert not (image_dir(store, generation).parent / "image.json").exists()


# -- CRIU -------------------------------------------------------------------------------


def test_criu_dump_torn_while_sealed_is_recovered_and_restores(
    tmp_path: Path,
    store: WorkloadStore,
    criu_binary: str,
    reaper: Reaper,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    count_file = tmp_path / "count.json"
    workload = start_counter(
        store=store, reaper=reaper, count_file=count_file, backend="criu", state_mb=5
    )
    started_at = progress_of(count_file)["started_at"]
    criu = CriuBackend(store=store, criu=criu_binary)

    for generation in (1, 2):  # the second round dumps a restored, namespaced workload
        torn(store, monkeypatch, criu_module, "seal_image", generation, criu_binary)
        assert not workload.is_running()
        assert store.load("counter").state is WorkloadState.checkpointing
        assert (
            "Dumping finished successfully"
            in (image_dir(store, generation) / "dump.log").read_text()
        )
        at_dump = count_of(count_file)

        report = checkpoint(store, generation, criu_binary=criu_binary)

        assert report.ok and report.outcome is Outcome.executed, report.error
        assert "recovered" in report.result["summary"]
        image = CheckpointImage.model_validate(report.result["image"])
        assert image.details["recovered"] is True
        assert image.details["root_pid"] == (workload.namespace_pid or workload.pid)
        assert any(name.startswith("pages-") for name in image.files)
        recorded = image_dir(store, generation).parent / "image.json"
        assert CheckpointImage.model_validate_json(recorded.read_text()) == image
        assert store.load("counter").state is WorkloadState.checkpointed

        workload = reaper.track(criu.restore(image))
        assert next_count(count_file, at_dump) > at_dump
        # The same process, memory and all: the recovered dump was the real state.
        assert progress_of(count_file)["started_at"] == started_at


def test_criu_dump_that_did_not_finish_is_reported_lost_and_kept(
    tmp_path: Path,
    store: WorkloadStore,
    criu_binary: str,
    reaper: Reaper,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    workload = start_counter(
        store=store, reaper=reaper, count_file=tmp_path / "count.json", backend="criu", state_mb=1
    )
    torn(store, monkeypatch, criu_module, "seal_image", criu_binary=criu_binary)
    assert not workload.is_running()
    # As if the dump had been cut short: its log lacks CRIU's last line.
    log = image_dir(store) / "dump.log"
    lines = log.read_text().splitlines(keepends=True)
    log.write_text("".join(line for line in lines if "Dumping finished" not in line))
    files_before = sorted(p.name for p in image_dir(store).iterdir())

    report = checkpoint(store, criu_binary=criu_binary)

    assert not report.ok and not report.retryable
    assert "the workload's state is lost" in (report.error or "")
    assert "Dumping finished successfully" in (report.error or "")
    assert sorted(p.name for p in image_dir(store).iterdir()) == files_before  # kept
    assert checkpoint(store, criu_binary=criu_binary).outcome is Outcome.duplicate


# -- signal -----------------------------------------------------------------------------


def test_signal_checkpoint_torn_while_sealed_is_recovered(
    tmp_path: Path, store: WorkloadStore, reaper: Reaper, monkeypatch: pytest.MonkeyPatch
) -> None:
    count_file = tmp_path / "count.json"
    workload = start_counter(
        store=store, reaper=reaper, count_file=count_file, backend="signal", state_mb=1
    )
    torn(store, monkeypatch, signal_module, "seal_image")
    assert not workload.is_running()
    assert (image_dir(store) / CHECKPOINT_NAME).exists()
    at_checkpoint = count_of(count_file)

    report = checkpoint(store)

    assert report.ok and "recovered" in report.result["summary"], report.error
    image = CheckpointImage.model_validate(report.result["image"])
    assert set(image.files) == {CHECKPOINT_NAME}
    assert store.load("counter").state is WorkloadState.checkpointed
    reaper.track(SignalBackend(store=store).restore(image))
    assert next_count(count_file, at_checkpoint) > at_checkpoint


def test_signal_checkpoint_saved_but_not_moved_is_recovered(
    tmp_path: Path, store: WorkloadStore, reaper: Reaper, monkeypatch: pytest.MonkeyPatch
) -> None:
    count_file = tmp_path / "count.json"
    workload = start_counter(
        store=store, reaper=reaper, count_file=count_file, backend="signal", state_mb=1
    )
    torn(store, monkeypatch, signal_module.shutil, "move")
    assert Path(workload.checkpoint_path or "").exists()
    assert not (image_dir(store) / CHECKPOINT_NAME).exists()

    report = checkpoint(store)

    assert report.ok, report.error
    assert (image_dir(store) / CHECKPOINT_NAME).exists()
    assert not Path(workload.checkpoint_path or "").exists()


def test_a_checkpoint_torn_after_the_backend_recorded_it_is_recovered(
    tmp_path: Path, store: WorkloadStore, reaper: Reaper, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dead between the backend's return (workload CHECKPOINTED) and ``image.json``."""
    start_counter(
        store=store, reaper=reaper, count_file=tmp_path / "count.json", backend="signal", state_mb=1
    )
    from agent import steps

    torn(store, monkeypatch, steps, "_write_atomically")
    assert store.load("counter").state is WorkloadState.checkpointed

    report = checkpoint(store)

    assert report.ok and "recovered" in report.result["summary"], report.error


def test_a_workload_that_died_without_saving_is_reported_lost(
    tmp_path: Path, store: WorkloadStore, reaper: Reaper
) -> None:
    # sleep does not handle SIGUSR1: its default action ends it, with no checkpoint.
    reaper.track(
        start_workload(
            store=store, command=["sleep", "600"], backend="signal", workload_id="counter"
        )
    )
    first = checkpoint(store)
    assert not first.ok and first.retryable  # CheckpointFailed: tried again, as a retry would

    again = checkpoint(store)

    assert not again.ok and not again.retryable
    assert "the workload's state is lost" in (again.error or "")
    assert image_dir(store).is_dir()  # kept for inspection


@pytest.mark.parametrize("state", [WorkloadState.running, WorkloadState.checkpointing])
def test_a_stale_directory_of_a_running_workload_is_replaced(
    tmp_path: Path, store: WorkloadStore, reaper: Reaper, state: WorkloadState
) -> None:
    """A checkpoint that died before it stopped the process: checkpoint afresh."""
    workload = start_counter(
        store=store, reaper=reaper, count_file=tmp_path / "count.json", backend="signal", state_mb=1
    )
    workload.state = state
    store.save(workload)
    image_dir(store).mkdir(parents=True)
    (image_dir(store) / "partial").write_text("left by a dead agent")

    report = checkpoint(store)

    assert report.ok and report.result["summary"].endswith(" s"), report.error
    assert not (image_dir(store) / "partial").exists()
    assert not procs.is_running(workload.pid or 0)


def test_signal_recovery_refuses_a_running_workload(
    tmp_path: Path, store: WorkloadStore, reaper: Reaper
) -> None:
    workload = start_counter(
        store=store, reaper=reaper, count_file=tmp_path / "count.json", backend="signal", state_mb=1
    )
    with pytest.raises(CheckpointFailed, match="still runs"):
        SignalBackend(store=store).recover_checkpoint(workload, tmp_path / "image")


# -- sim --------------------------------------------------------------------------------


def test_sim_recovers_only_a_dump_it_finished(tmp_path: Path) -> None:
    sim = SimBackend()
    workload = sim.start(workload_id="train-1", memory_bytes=1_000)
    with pytest.raises(CheckpointFailed, match="still runs"):
        sim.recover_checkpoint(workload, tmp_path)

    image = sim.checkpoint(workload, tmp_path)
    recovered = sim.recover_checkpoint(workload, tmp_path)

    assert recovered.model_dump(exclude={"created_at"}) == image.model_dump(exclude={"created_at"})
    assert workload.state is WorkloadState.checkpointed

    never = RunningWorkload(
        spec=workload.spec.model_copy(update={"id": "other"}),
        backend="sim",
        started_at=workload.started_at,
    )
    with pytest.raises(CheckpointLost, match="never finished its dump"):
        sim.recover_checkpoint(never, tmp_path)

    sim.restore(image)  # running again: the old dump is no longer its state
    sim.release(sim.running()[0])
    with pytest.raises(CheckpointLost):
        sim.recover_checkpoint(workload, tmp_path)
