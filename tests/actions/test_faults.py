"""Faults mid-saga: a control worker killed, a target agent killed, the broker restarted,
the target agent partitioned from the control plane (a network namespace of its own), the
agents' clocks skewed.

In every case the job ends up running exactly once, where the action record says. The
control workers here are impatient (a step unanswered for 3 s is sent again), which is how
a lost message is recovered; the agents' journals make the resends harmless.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis

from agent import procs
from app.actions import saga
from app.actions.models import ActionKind
from tests.actions.conftest import Api, Tracked
from tests.actions.fault_model import TALLY
from tests.actions.helpers import (
    add_job,
    finish_jobs,
    propose,
    running_copies,
    start_counter,
    wait_for_action,
)
from tests.support.counter import count_of, next_count, progress_of
from tests.support.pipeline import Pipeline
from tests.support.plans import action_state

# A step unanswered for 3 s is sent again at the next sweep, within a second (5 s by default).
IMPATIENT = {"SHAPER_ACTION_STEP_TIMEOUT_S": "3", "SHAPER_ACTION_SWEEP_PERIOD_S": "1"}


def real_fault() -> None:
    """Count a fault done to real processes in the session's tally (fault_model.TALLY)."""
    TALLY["faults injected"] += 1
    TALLY["faults to real processes"] += 1


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
    real_fault()
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
    real_fault()
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
    real_fault()
    pipeline.start_agent("b")

    assert wait_for_action(pipeline, action_id) == "succeeded", pipeline.logs()
    assert_runs_once_on_b(pipeline, workload_id, before)
    transfer = next(s for s in action_state(pipeline.engine, action_id)[1] if s.name == "transfer")
    assert transfer.attempts >= 2  # sent again after the loss
    finish_jobs(pipeline.engine, workload_id)


class Partition:
    """A network namespace for one agent, joined to the host by a veth pair (10.231.0.0/30):
    the agent reaches the broker only through it. cut() takes the host's end down: packets
    vanish and connections stall, as in a real partition; heal() brings it back."""

    def __init__(self) -> None:
        tag = f"{os.getpid() % 100000}"
        self.namespace, self.host_end, self.agent_end = f"shaper-{tag}", f"shp{tag}h", f"shp{tag}a"
        self.host_address, self.agent_address = "10.231.0.1", "10.231.0.2"
        self.created = False
        self._ip("netns", "add", self.namespace)
        self.created = True
        self._ip("link", "add", self.host_end, "type", "veth", "peer", "name", self.agent_end)
        self._ip("link", "set", self.agent_end, "netns", self.namespace)
        self._ip("addr", "add", f"{self.host_address}/30", "dev", self.host_end)
        self._ip("link", "set", self.host_end, "up")
        inside = ("-n", self.namespace)
        self._ip(*inside, "addr", "add", f"{self.agent_address}/30", "dev", self.agent_end)
        self._ip(*inside, "link", "set", self.agent_end, "up")
        self._ip(*inside, "link", "set", "lo", "up")

    @staticmethod
    def _ip(*args: str) -> None:
        done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, f"ip {' '.join(args)}: {done.stderr}"

    def wrapper(self) -> tuple[str, ...]:
        return ("ip", "netns", "exec", self.namespace)

    def cut(self) -> None:
        self._ip("link", "set", self.host_end, "down")

    def heal(self) -> None:
        self._ip("link", "set", self.host_end, "up")

    def close(self) -> None:
        if self.created:
            subprocess.run(["ip", "link", "del", self.host_end], capture_output=True, timeout=30)
            subprocess.run(["ip", "netns", "del", self.namespace], capture_output=True, timeout=30)


@pytest.mark.slow
def test_target_agent_partitioned_longer_than_every_resend(
    impatient: Pipeline, api: Api, tracked: Tracked
) -> None:
    """b's agent, in a namespace of its own, is cut off before the migration starts and
    for longer than the transfer's three attempts: the saga compensates, and must keep
    sending b's fencing release (not give up, which would leave the job stopped at a)
    until b is back; b then gets every message it missed, and the job runs once, at a."""
    pipeline, workload_id = impatient, "ctr-partition"
    assert pipeline.redis is not None
    broker = redis.Redis.from_url(pipeline.broker)
    partition = Partition()
    try:
        broker.config_set("bind", f"127.0.0.1 {partition.host_address}")
        broker.config_set("protected-mode", "no")
        pipeline.stop("agent-b")
        pipeline.start_agent(
            "b",
            wrapper=partition.wrapper(),
            broker=f"redis://{partition.host_address}:{pipeline.redis.port}/0",
        )
        counts = start_counter(
            pipeline, tracked, workload_id, node="a", backend="signal", state_mb=1
        )
        partition.cut()
        real_fault()
        action_id = approve_migration(pipeline, api, workload_id)

        def compensating() -> bool:
            return action_state(pipeline.engine, action_id)[0] == "compensating"

        assert procs.wait_until(compensating, timeout=90, interval=0.2), pipeline.logs()

        def fence_resent_past_the_limit() -> bool:
            state, steps = action_state(pipeline.engine, action_id)
            release = [s for s in steps if s.phase == "compensate" and s.name == "release"]
            return state != "compensating" or release[0].attempts > saga.MAX_ATTEMPTS

        assert procs.wait_until(fence_resent_past_the_limit, timeout=120, interval=0.5)
        assert action_state(pipeline.engine, action_id)[0] == "compensating", pipeline.logs()
        assert running_copies(workload_id) == []  # checkpointed at a, held until b is fenced
        before = count_of(counts)
        partition.heal()

        assert wait_for_action(pipeline, action_id) == "compensated", pipeline.logs()
        home = pipeline.store("a").load(workload_id)
        assert home.is_running() and running_copies(workload_id) == [home.pid]
        assert next_count(counts, before) > before  # it counts on from its checkpoint
    finally:
        if partition.created:
            partition.heal()
        pipeline.stop("agent-b")
        partition.close()
        broker.config_set("bind", "127.0.0.1")
        broker.close()
    finish_jobs(pipeline.engine, workload_id)


SKEWED_CLOCK = Path(__file__).parent / "skewed_clock"  # its sitecustomize shifts wall time


@pytest.mark.slow
def test_agents_with_skewed_clocks(impatient: Pipeline, api: Api, tracked: Tracked) -> None:
    """a's agent an hour fast, b's an hour slow (their wall clocks, as on hosts whose time
    is wrong): a migration between them still runs each step once and ends with the job
    running once on b. Nothing in a step's outcome may depend on an agent's clock; the
    journals show the skew was in effect."""
    pipeline, workload_id = impatient, "ctr-skew"
    skews = {"a": 3600.0, "b": -3600.0}
    try:
        for node, skew in skews.items():
            pipeline.stop(f"agent-{node}")
            pipeline.start_agent(
                node,
                env={"PYTHONPATH": str(SKEWED_CLOCK), "SHAPER_TEST_CLOCK_SKEW_S": str(skew)},
            )
            real_fault()
        counts = start_counter(
            pipeline, tracked, workload_id, node="a", backend="signal", state_mb=1
        )
        before = count_of(counts)
        action_id = approve_migration(pipeline, api, workload_id)

        assert wait_for_action(pipeline, action_id) == "succeeded", pipeline.logs()
        assert_runs_once_on_b(pipeline, workload_id, before)
        for node, skew in skews.items():
            entries = [e for e in pipeline.journal(node) if e["workload"] == workload_id]
            assert entries and all(e["outcome"] == "executed" for e in entries), entries
            offset = (datetime.fromisoformat(entries[-1]["at"]) - datetime.now(UTC)).total_seconds()
            assert abs(offset - skew) < 600, (node, offset)
    finally:
        for node in skews:
            pipeline.stop(f"agent-{node}")  # the next test gets agents with true clocks
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
