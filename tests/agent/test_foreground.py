"""`shaper agent exec --wait` as the body of a batch job: follow, survive a checkpoint, resume
from a staged image on another node, pass the workload's exit status and stop it on SIGTERM.

Two state directories act as two nodes' agents; the steps run through the same
StepExecutor the agent worker uses, and every exec is a real separate process.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from agent import procs, resume
from agent.fencing import FenceStore
from agent.foreground import EXIT_RESTORE_FAILED
from agent.steps import StepExecutor
from agent.workload import WorkloadState, WorkloadStore
from tests.support.counter import WAIT_S, count_of, counter_command, next_count, progress_of
from tests.support.processes import Reaper
from wire.steps import AgentStep, AgentStepRequest, Outcome, StepReport


def _exec(
    reaper: Reaper, state_dir: Path, workload_id: str, *command: str, backend: str = "criu"
) -> subprocess.Popen[bytes]:
    return reaper.popen(
        [
            sys.executable,
            "-m",
            "agent",
            "exec",
            "--wait",
            "--backend",
            backend,
            "--id",
            workload_id,
            "--state-dir",
            str(state_dir),
            "--",
            *command,
        ]
    )


def _step(
    executor: StepExecutor, step: AgentStep, workload_id: str, generation: int, **args: Any
) -> StepReport:
    return executor.run(
        AgentStepRequest(
            action_id=1,
            key=f"test:{step.value}:{executor.name}:{generation}",
            step=step,
            workload_id=workload_id,
            generation=generation,
            args=args,
        )
    )


def _wait_counting(count_file: Path, job: subprocess.Popen[bytes], at_least: int = 5) -> None:
    assert procs.wait_until(lambda: count_of(count_file) >= at_least, timeout=WAIT_S), (
        f"the counter did not count (exec exit status {job.poll()})"
    )


def _move(
    backend: str, tmp_path: Path, reaper: Reaper, criu_binary: str | None
) -> tuple[subprocess.Popen[bytes], subprocess.Popen[bytes], Path, StepExecutor]:
    """Job on a checkpointed, image staged on b, job started again on b: both execs."""
    first, count_file, node_b, staged, started_at, at_checkpoint = _checkpoint_and_stage(
        backend, tmp_path, reaper, criu_binary
    )
    second = _exec(reaper, tmp_path / "b", "42", *counter_command(count_file, 20), backend=backend)

    assert next_count(count_file, at_checkpoint) > at_checkpoint  # continues, not from zero
    if backend == "criu":
        assert progress_of(count_file)["started_at"] == started_at  # the same process image
    confirm = _step(
        node_b,
        AgentStep.confirm,
        "42",
        1,
        wait_s=WAIT_S,
        resumed_from=staged.result["image_dir"] if backend == "criu" else None,
    )
    assert confirm.ok, confirm.error
    assert not resume.pointer_path(tmp_path / "b" / "images", "42").exists()  # consumed
    return first, second, count_file, node_b


def _checkpoint_and_stage(
    backend: str, tmp_path: Path, reaper: Reaper, criu_binary: str | None
) -> tuple[subprocess.Popen[bytes], Path, StepExecutor, StepReport, object, int]:
    """Job on a checkpointed and its image staged on b: a's exec, the count file, b's
    executor, the stage step's report, the counter's start time and its count then."""
    a_dir, b_dir, count_file = tmp_path / "a", tmp_path / "b", tmp_path / "count.json"
    options = {"criu": {"criu": criu_binary}} if criu_binary else None
    node_a = StepExecutor(
        store=WorkloadStore(a_dir), cluster="lab", node="a", backend_options=options
    )
    node_b = StepExecutor(
        store=WorkloadStore(b_dir), cluster="lab", node="b", backend_options=options
    )
    first = _exec(reaper, a_dir, "42", *counter_command(count_file, 20), backend=backend)
    _wait_counting(count_file, first)
    started_at = progress_of(count_file)["started_at"]

    checkpoint = _step(node_a, AgentStep.checkpoint, "42", 1)
    assert checkpoint.ok, checkpoint.error
    # The job's body stays: the workload stopped on purpose, the scheduler ends the job.
    assert not procs.wait_until(lambda: first.poll() is not None, timeout=1.0)
    assert WorkloadStore(a_dir).load("42").state is WorkloadState.checkpointed
    at_checkpoint = count_of(count_file)

    image = checkpoint.result["image"]
    transfer = _step(node_b, AgentStep.transfer, "42", 1, image=image)
    assert transfer.ok, transfer.error
    staged = _step(
        node_b, AgentStep.stage, "42", 1, image=image, image_dir=transfer.result["image_dir"]
    )
    assert staged.ok, staged.error
    return first, count_file, node_b, staged, started_at, at_checkpoint


@pytest.mark.parametrize("backend", ["criu", "signal"])
def test_a_checkpointed_job_resumes_on_another_node_when_started_there(
    backend: str, tmp_path: Path, reaper: Reaper, request: pytest.FixtureRequest
) -> None:
    criu_binary = request.getfixturevalue("criu_binary") if backend == "criu" else None
    first, second, count_file, _node_b = _move(backend, tmp_path, reaper, criu_binary)

    first.send_signal(signal.SIGTERM)  # the scheduler's requeue ends the old job body
    assert first.wait(timeout=WAIT_S) == 128 + signal.SIGTERM
    at = count_of(count_file)
    assert next_count(count_file, at) > at  # the moved workload is untouched by that

    restored = WorkloadStore(tmp_path / "b").load("42")
    second.send_signal(signal.SIGTERM)  # scancel: the workload goes with its job
    assert second.wait(timeout=WAIT_S) == 128 + signal.SIGTERM
    assert procs.wait_gone(restored.pid, timeout=WAIT_S)
    assert WorkloadStore(tmp_path / "b").load("42").state is WorkloadState.released


def test_a_stop_that_comes_while_the_workload_is_restored_stops_the_restored_process(
    tmp_path: Path, reaper: Reaper, criu_binary: str
) -> None:
    first, count_file, node_b, _staged, _started_at, _at = _checkpoint_and_stage(
        "criu", tmp_path, reaper, criu_binary
    )
    workdir = node_b.store.workload_dir("42")
    before = set(workdir.glob("restore-*.log"))
    second = _exec(reaper, tmp_path / "b", "42", *counter_command(count_file, 20))
    # CRIU is restoring (its log is there) when the scheduler cancels the job.
    assert procs.wait_until(
        lambda: bool(set(workdir.glob("restore-*.log")) - before),
        timeout=WAIT_S,
        interval=0.005,
    ), f"no restore began (exec exit status {second.poll()})"
    second.send_signal(signal.SIGTERM)
    assert second.wait(timeout=WAIT_S) == 128 + signal.SIGTERM

    record = node_b.store.load("42")
    assert record.state is WorkloadState.released and record.pid is not None
    assert procs.wait_gone(record.pid, timeout=WAIT_S)  # the restored counter went with it
    at = count_of(count_file)
    time.sleep(1.0)
    assert count_of(count_file) == at  # and nothing counts on
    first.send_signal(signal.SIGTERM)
    first.wait(timeout=WAIT_S)


def test_exec_exits_with_the_workload_status(tmp_path: Path, reaper: Reaper) -> None:
    job = _exec(reaper, tmp_path / "a", "7", "sh", "-c", "sleep 0.5; exit 7")
    assert job.wait(timeout=WAIT_S) == 7


def test_a_stale_staged_image_is_refused_not_resumed(
    tmp_path: Path, reaper: Reaper, criu_binary: str
) -> None:
    first, second, count_file, node_b = _move("criu", tmp_path, reaper, criu_binary)
    second.send_signal(signal.SIGTERM)
    second.wait(timeout=WAIT_S)
    first.send_signal(signal.SIGTERM)
    first.wait(timeout=WAIT_S)
    # A pointer from generation 1 appears on b after b was fenced at generation 2.
    pointer = resume.ResumePointer.model_validate_json(
        resume.pointer_path(tmp_path / "b" / "images", "42")
        .with_name(f"{resume.POINTER_NAME}.taken")
        .read_text()
    )
    fences = FenceStore(tmp_path / "b")
    with fences.hold("42") as fence:
        fence.generation = 2
        fences.save(fence)
    resume.stage(tmp_path / "b" / "images", pointer)

    third = _exec(reaper, tmp_path / "b", "42", *counter_command(count_file, 20))
    assert third.wait(timeout=WAIT_S) == EXIT_RESTORE_FAILED
    assert not resume.pointer_path(tmp_path / "b" / "images", "42").exists()
    assert node_b.store.load("42").state is WorkloadState.released  # nothing was restored


def test_a_confirm_answered_before_is_replayed_without_waiting(tmp_path: Path) -> None:
    node = StepExecutor(store=WorkloadStore(tmp_path), cluster="lab", node="b")
    first = _step(node, AgentStep.confirm, "43", 1, wait_s=0.2)
    assert not first.ok and not first.retryable  # never started here: journalled
    started = time.monotonic()
    again = _step(node, AgentStep.confirm, "43", 1, wait_s=60)
    # Replayed from the journal, not after another minute of waiting for the scheduler.
    assert again.outcome is Outcome.duplicate and again.error == first.error
    assert time.monotonic() - started < 30
