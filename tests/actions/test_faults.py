"""Faults mid-saga: a control worker killed, a target agent killed, the broker restarted.

In every case the job ends up running exactly once, where the action record says. The
control workers here are impatient (a step unanswered for 3 s is sent again), which is how
a lost message is recovered; the agents' journals make the resends harmless.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest
import redis

from agent import procs
from app.actions.models import ActionKind
from tests.actions.conftest import Api, Pipeline, Tracked, action_state
from tests.actions.helpers import (
    add_job,
    finish_jobs,
    propose,
    running_copies,
    start_counter,
    wait_for_action,
)
from tests.agent.helpers import count_of, next_count, progress_of

IMPATIENT = {"SHAPER_ACTION_STEP_TIMEOUT_S": "3"}


@pytest.fixture
def impatient(running_pipeline: Pipeline) -> Iterator[Pipeline]:
    """The pipeline with an impatient control worker; the usual one again afterwards."""
    pipeline = running_pipeline
    pipeline.stop("control")
    pipeline.start_control(**IMPATIENT)
    yield pipeline
    for name in ("agent-b",):
        worker = pipeline.workers.get(name)
        if worker is not None and worker.alive():
            os.kill(worker.process.pid, signal.SIGCONT)
    pipeline.stop("control")


def approve_migration(pipeline: Pipeline, api: Api, workload_id: str) -> int:
    job_id = add_job(pipeline.engine, workload_id, node="a")
    action_id = propose(
        pipeline.engine,
        job_id,
        ActionKind.migrate,
        source="a",
        target="b",
        key=f"test:{workload_id}",
    )
    assert api.post(f"/actions/{action_id}/approve", "operator").status_code == 200
    return action_id


def journalled(pipeline: Pipeline, node: str, workload_id: str, step: str) -> bool:
    return any(
        e["workload"] == workload_id and e["step"] == step and e["ok"]
        for e in pipeline.journal(node)
    )


def assert_runs_once_on_b(pipeline: Pipeline, workload_id: str, before: int) -> None:
    moved = pipeline.store("b").load(workload_id)
    assert moved.is_running()
    assert running_copies(workload_id) == [moved.pid]
    counts = pipeline.root / f"{workload_id}.count"
    assert next_count(counts, count_of(counts)) > before


def test_control_worker_killed_between_checkpoint_and_restore(
    impatient: Pipeline, api: Api, tracked: Tracked
) -> None:
    pipeline, workload_id = impatient, "ctr-kill-control"
    counts = start_counter(pipeline, tracked, workload_id, node="a", backend="criu", state_mb=20)
    started_at = progress_of(counts)["started_at"]
    target = pipeline.workers["agent-b"].process.pid
    os.kill(target, signal.SIGSTOP)  # b cannot take the image yet: the saga stops half way
    action_id = approve_migration(pipeline, api, workload_id)
    assert procs.wait_until(
        lambda: journalled(pipeline, "a", workload_id, "checkpoint"), timeout=60, interval=0.05
    ), pipeline.logs()
    before = count_of(counts)

    pipeline.stop("control", signal.SIGKILL)
    os.kill(target, signal.SIGCONT)
    pipeline.start_control(**IMPATIENT)

    assert wait_for_action(pipeline, action_id) == "succeeded", pipeline.logs()
    assert_runs_once_on_b(pipeline, workload_id, before)
    assert progress_of(counts)["started_at"] == started_at
    finish_jobs(pipeline.engine, workload_id)


def test_target_agent_killed_during_restore(
    impatient: Pipeline, api: Api, tracked: Tracked
) -> None:
    pipeline, workload_id = impatient, "ctr-kill-agent"
    counts = start_counter(pipeline, tracked, workload_id, node="a", backend="criu", state_mb=100)
    images_on_b = f"{pipeline.state_dir('b') / 'images' / workload_id}/"
    started_at = progress_of(counts)["started_at"]
    # Taken before the checkpoint: the copy killed with the agent may count past it for a
    # while, and the saga then restores the checkpoint again.
    before = count_of(counts)
    action_id = approve_migration(pipeline, api, workload_id)

    # The moment b's CRIU restore runs (its command line names b's copy of the image).
    def restoring() -> bool:
        return any(
            "restore" in _cmdline(pid) for pid in _processes_naming(images_on_b)
        ) or journalled(pipeline, "b", workload_id, "restore")

    assert procs.wait_until(restoring, timeout=60, interval=0.01), pipeline.logs()
    pipeline.stop("agent-b", signal.SIGKILL)  # the restore it started lives on, unrecorded
    pipeline.start_agent("b")

    assert wait_for_action(pipeline, action_id) == "succeeded", pipeline.logs()
    assert_runs_once_on_b(pipeline, workload_id, before)
    assert progress_of(counts)["started_at"] == started_at
    restore = next(s for s in action_state(pipeline.engine, action_id)[1] if s.name == "restore")
    assert restore.state == "succeeded"
    finish_jobs(pipeline.engine, workload_id)


def test_broker_restarted_mid_saga(impatient: Pipeline, api: Api, tracked: Tracked) -> None:
    pipeline, workload_id = impatient, "ctr-redis"
    counts = start_counter(pipeline, tracked, workload_id, node="a", backend="signal", state_mb=20)
    # b is down, so the transfer waits in the broker (not in a consumer's socket buffer).
    pipeline.stop("agent-b")
    action_id = approve_migration(pipeline, api, workload_id)
    broker = redis.Redis.from_url(pipeline.broker)

    def transfer_queued() -> bool:
        return bool(broker.llen("agent.lab.b"))

    assert procs.wait_until(transfer_queued, timeout=60, interval=0.05), pipeline.logs()
    broker.close()
    before = count_of(counts)
    assert pipeline.redis is not None
    pipeline.redis.restart()  # no persistence: the transfer message is gone with it
    pipeline.start_agent("b")

    assert wait_for_action(pipeline, action_id) == "succeeded", pipeline.logs()
    assert_runs_once_on_b(pipeline, workload_id, before)
    transfer = next(s for s in action_state(pipeline.engine, action_id)[1] if s.name == "transfer")
    assert transfer.attempts >= 2  # sent again after the loss
    finish_jobs(pipeline.engine, workload_id)


def _processes_naming(text: str) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and text in _cmdline(int(entry.name)):
            found.append(int(entry.name))
    return found


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as stream:
            return stream.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
