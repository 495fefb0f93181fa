"""Preempt-with-checkpoint on Armada with a real process, a real CRIU checkpoint and a real
restore (issue 17).

The Armada test server (tests/support/armada_server.py; not a real Armada, which cannot
run here) runs its jobs' pods as local processes (tests/support/armada_pods.py): each
running job's container command runs under ``shaper agent exec --wait`` in its node's
agent state directory, as a batch job's body would. The job is the example counter.

The saga is the control plane's own, step by step: ``recipes.forward_steps`` picks the
steps of a ``preempt`` of the checkpointable job and then of the ``start`` that brings it
back, ``messages.step_message`` builds each message from the results before it, and each
goes to its executor — the node agent of a1 (agent.steps.StepExecutor, CRIU) or the Armada
connector's step executor. The node agent checkpoints the counter and stages its image,
the connector cancels the Armada job and submits it again, held and pinned to a1 with the
resume pointer; a plan's start releases it, Armada runs it on a1 again, and its body
restores the counter from the checkpoint: it counts on from where it stopped.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agent import procs
from agent.steps import StepExecutor
from agent.workload import WorkloadState, WorkloadStore
from app.actions.messages import step_message
from app.actions.models import Action, ActionKind, ActionStep, StepState
from app.actions.recipes import forward_steps
from app.clusters.models import Cluster
from app.jobs.models import Job
from connectors.actions import ConnectorStepExecutor
from connectors.armada import ArmadaConnector, NewJob
from connectors.armada.jobs import RESUME_FROM_ENV
from tests.agent.conftest import criu_binary  # noqa: F401  (the fixture: CRIU works here)
from tests.support.armada_pods import LocalPods
from tests.support.armada_server import ArmadaTestServer
from tests.support.armada_site import CLUSTER, HOLD_QUEUE, connector_for, start_server
from tests.support.counter import WAIT_S, count_of, counter_command, next_count, progress_of
from wire.queues import agent_queue, connector_queue
from wire.steps import StepReport
from wire.telemetry import JobState, SchedulerKind


@pytest.fixture
def pods(tmp_path: Path) -> Iterator[LocalPods]:
    """The Armada test site's server, its pods run here (their state under tmp_path)."""
    tmp_path.chmod(0o755)
    server = start_server()
    pods = LocalPods(server, tmp_path)
    try:
        yield pods
    finally:
        pods.close()
        server.stop()


def _log(pods: LocalPods) -> str:
    return "\n".join(f"--- {job}:\n{procs.read_tail(log)}" for job, log in pods.logs.items())


def _run(
    action: Action,
    job: Job,
    generation: int,
    executors: dict[str, Callable[[dict[str, Any]], StepReport | None]],
    between: Callable[[], None],
) -> list[ActionStep]:
    """The action's forward steps, one after another as the saga sends them; a step that
    answers "not yet" (a confirm) is asked again after ``between``."""
    cluster = Cluster(id=1, name=CLUSTER, scheduler=SchedulerKind.armada)
    steps = forward_steps(action, job, cluster, generation)
    for step in steps:
        report: StepReport | None = None
        for _ in range(int(WAIT_S / 0.2)):
            outgoing = step_message(action, job, step, steps, WAIT_S)
            report = executors[outgoing.queue](outgoing.kwargs["step"])
            assert report is not None
            if report.ok or not report.retryable:
                break
            between()
            time.sleep(0.2)
        assert report is not None and report.ok, (step.name, report and report.error)
        step.state, step.result = StepState.succeeded, report.result
    return steps


def test_a_preempted_armada_job_resumes_from_its_criu_checkpoint(
    pods: LocalPods,
    tmp_path: Path,
    criu_binary: str,  # noqa: F811
) -> None:
    with connector_for(pods.server) as connector:
        _preempt_and_resume(pods.server, connector, pods, tmp_path, criu_binary)


def _preempt_and_resume(
    server: ArmadaTestServer,
    connector: ArmadaConnector,
    pods: LocalPods,
    tmp_path: Path,
    criu: str,
) -> None:
    count_file = tmp_path / "count.json"
    workload = connector.submit_job(
        "research",
        "train",
        NewJob(
            image="registry.local/counter:1",  # run here as the local command below
            command=counter_command(count_file, 8),
            gpus=4,
            annotations={"shaper.io/checkpointable": "true"},
            node_selector={"nvidia.com/gpu.product": "H100"},
        ),
    )
    assert server.schedule() == [workload] and server.job(workload).node == "a1"
    pods.sync()
    assert procs.wait_until(lambda: count_of(count_file) >= 5, timeout=WAIT_S), _log(pods)
    started_at = progress_of(count_file)["started_at"]
    (report,) = connector.read_state().jobs
    assert report.checkpointable and report.state is JobState.running

    agent = StepExecutor(
        store=WorkloadStore(pods.state_dir("a1")),
        cluster=CLUSTER,
        node="a1",
        backend_options={"criu": {"criu": criu}},
    )
    armada = ConnectorStepExecutor(connector, cluster=CLUSTER, state_dir=tmp_path / "journal")
    executors = {agent_queue(CLUSTER, "a1"): agent.handle, connector_queue(CLUSTER): armada.handle}
    job = Job(cluster_id=1, external_id=workload, checkpointable=True, gpus_requested=4)

    def executor_round() -> None:
        server.schedule()
        pods.sync()

    preempt = Action(
        id=2, cluster_id=1, kind=ActionKind.preempt, idempotency_key="p-2", source_node="a1"
    )
    steps = _run(preempt, job, 2, executors, executor_round)
    assert [(s.name, s.queue) for s in steps] == [
        ("checkpoint", agent_queue(CLUSTER, "a1")),
        ("stage", agent_queue(CLUSTER, "a1")),
        ("requeue", connector_queue(CLUSTER)),
    ]
    stopped_at = count_of(count_file)
    staged = steps[1].result["image_dir"]
    # Armada: the job was cancelled (its pod is stopped) and submitted again, held in the
    # cordoned queue, pinned to a1 and told where to resume from.
    assert server.job(workload).state == "cancelled"
    pods.sync()
    (held,) = server.jobs_of(HOLD_QUEUE, "train")
    env = {e.name: e.value for e in held.spec.pod_specs[0].containers[0].env}
    assert env[RESUME_FROM_ENV] == staged
    assert server.schedule() == []  # held: nothing runs it
    assert count_of(count_file) == stopped_at  # nothing counts while it is held

    # A plan starts it again on a1; Armada runs it there and its body restores it.
    start = Action(
        id=3,
        cluster_id=1,
        kind=ActionKind.start,
        idempotency_key="s-3",
        target_node="a1",
        target_placement={"a1": 4},
    )
    _run(start, job, 2, executors, executor_round)
    # It counts on from its checkpoint (a fresh start would count from 0). The counter ticks
    # every 20 ms, as often as next_count polls, so under load the first count seen may be
    # a tick or two past the next one (one clean clone saw 11 after 9).
    resumed = next_count(count_file, stopped_at)
    assert stopped_at < resumed <= stopped_at + 10, _log(pods)
    assert progress_of(count_file)["started_at"] == started_at  # the same process, restored

    # The body has recorded the restored process as its workload (and so stops it when
    # Armada stops the pod; stopped while it is still restoring, it would leave it behind).
    def recorded() -> bool:
        record = agent.store.load(workload)
        return (
            record.state is WorkloadState.running
            # CRIU restores the tree in a PID namespace of its own: the counter's own PID
            and progress_of(count_file).get("pid") in (record.pid, record.namespace_pid)
            and record.is_running()
        )

    assert procs.wait_until(recorded, timeout=WAIT_S), _log(pods)
    (running,) = [j for j in server.jobs.values() if j.state == "running"]
    assert (running.queue, running.node) == ("research", "a1")
    (now,) = connector.read_state().jobs
    assert (now.external_id, now.state, now.restart_count) == (workload, JobState.running, 2)
