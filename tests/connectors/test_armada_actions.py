"""Saga steps on the Armada connector through its action executor
(connectors.actions.ConnectorStepExecutor), against the Armada test server
(tests/support/armada_server.py; not a real Armada, which cannot run here).

The step messages are the control plane's own: ``app.actions.recipes.forward_steps`` picks
the steps of an action on an Armada cluster and ``app.actions.messages.step_message``
builds each one's message from the results of the steps before it, exactly as the saga
does. The node agent's steps (checkpoint, stage) are not the connector's: their results
are given here as an agent reports them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.actions.messages import step_message
from app.actions.models import Action, ActionKind, ActionStep, StepState
from app.actions.recipes import forward_steps, job_set_steps
from app.clusters.models import Cluster
from app.jobs.models import Job
from connectors.actions import ConnectorStepExecutor
from connectors.armada import ArmadaConnector, NewJob
from connectors.armada.jobs import RESUME_FROM, RESUME_FROM_ENV, STOPPED_BY_STEP
from connectors.armada.moves import REPLACED_REASON
from connectors.base import ConnectorError
from tests.support.armada_server import ArmadaTestServer
from tests.support.armada_site import CLUSTER, HOLD_QUEUE, connector_for, start_server
from wire.queues import agent_queue, connector_queue
from wire.steps import AgentStep, ConnectorStep, Outcome, StepReport
from wire.telemetry import JobState, SchedulerKind

IMAGE_DIR = "/var/lib/shaper/images/train/1"
STAGED_DIR = "/var/lib/shaper/staged/train/1"


@pytest.fixture
def server() -> Iterator[ArmadaTestServer]:
    server = start_server()
    yield server
    server.stop()


@pytest.fixture
def connector(server: ArmadaTestServer) -> Iterator[ArmadaConnector]:
    with connector_for(server) as connector:
        yield connector


def checkpointable_job(connector: ArmadaConnector, server: ArmadaTestServer) -> str:
    job_id = connector.submit_job(
        "research",
        "train",
        NewJob(
            image="registry.local/train:1",
            gpus=4,
            annotations={"shaper.io/checkpointable": "true"},
            node_selector={"nvidia.com/gpu.product": "H100"},
        ),
    )
    assert server.schedule() == [job_id]
    (report,) = connector.read_state().jobs
    assert report.state is JobState.running and report.checkpointable
    return job_id


class Saga:
    """One action's forward steps, with their messages built as the control plane does."""

    def __init__(
        self,
        job_id: str,
        kind: ActionKind,
        generation: int,
        *,
        checkpointable: bool = True,
        gpus: int = 4,
        **fields: Any,
    ) -> None:
        self.action = Action(
            id=generation,
            cluster_id=1,
            kind=kind,
            idempotency_key=f"plan-{generation}:{kind.value}:{job_id}",
            **fields,
        )
        self.job = Job(
            cluster_id=1, external_id=job_id, checkpointable=checkpointable, gpus_requested=gpus
        )
        cluster = Cluster(id=1, name=CLUSTER, scheduler=SchedulerKind.armada)
        self.steps = forward_steps(self.action, self.job, cluster, generation)

    def step(self, name: str) -> ActionStep:
        return next(step for step in self.steps if step.name == name)

    def answered(self, name: str, result: dict[str, Any]) -> None:
        """An earlier step's answer, as its executor reported it."""
        step = self.step(name)
        step.state, step.result = StepState.succeeded, result

    def message(self, name: str) -> dict[str, Any]:
        outgoing = step_message(self.action, self.job, self.step(name), self.steps, 30.0)
        assert outgoing.queue == connector_queue(CLUSTER)
        message: dict[str, Any] = outgoing.kwargs["step"]
        return message


def run(executor: ConnectorStepExecutor, message: dict[str, Any]) -> StepReport:
    report = executor.handle(message)
    assert report is not None
    return report


def test_preempt_with_checkpoint_then_start_again(
    server: ArmadaTestServer, connector: ArmadaConnector, tmp_path: Path
) -> None:
    job_id = checkpointable_job(connector, server)
    executor = ConnectorStepExecutor(connector, cluster=CLUSTER, state_dir=tmp_path)

    preempt = Saga(job_id, ActionKind.preempt, 2, source_node="a1")
    assert [(s.name, s.queue) for s in preempt.steps] == [
        (AgentStep.checkpoint, agent_queue(CLUSTER, "a1")),
        (AgentStep.stage, agent_queue(CLUSTER, "a1")),
        (ConnectorStep.requeue, connector_queue(CLUSTER)),
    ]
    preempt.answered(AgentStep.checkpoint, {"image": {"image_dir": IMAGE_DIR, "size_bytes": 1}})
    preempt.answered(AgentStep.stage, {"image_dir": STAGED_DIR})
    requeue = preempt.message(ConnectorStep.requeue)
    assert requeue["args"]["hold"] and requeue["args"]["nodes"] == ["a1"]

    report = run(executor, requeue)
    assert report.ok and report.outcome is Outcome.executed, report.error
    assert report.result["resume_from"] == STAGED_DIR

    # Armada: the running job was cancelled and its pod submitted again into the cordoned
    # hold queue, pinned to the node that holds its image and told where to resume from.
    assert server.job(job_id).state == "cancelled"
    (held,) = server.jobs_of(HOLD_QUEUE, "train")
    pod = held.spec.pod_specs[0]
    assert dict(pod.nodeSelector) == {
        "nvidia.com/gpu.product": "H100",
        "kubernetes.io/hostname": "a1",
        "shaper.io/armada-executor": "exec-a",  # a node pin is also its executor's
    }
    assert {(e.name, e.value) for e in pod.containers[0].env} == {(RESUME_FROM_ENV, STAGED_DIR)}
    assert held.spec.annotations[RESUME_FROM] == STAGED_DIR
    assert held.spec.annotations[STOPPED_BY_STEP] == requeue["key"]
    assert server.schedule() == []  # a cordoned queue is never scheduled
    (report_now,) = connector.read_state().jobs
    assert (report_now.external_id, report_now.state, report_now.restart_count) == (
        job_id,
        JobState.pending,
        1,
    )
    assert report_now.reason.startswith("held by Shaper") and report_now.required_nodes == ["a1"]

    # The plan starts it again on a1: the start, then the confirm that polls for it.
    start = Saga(job_id, ActionKind.start, 3, target_node="a1", target_placement={"a1": 4})
    assert [s.name for s in start.steps] == [ConnectorStep.start, ConnectorStep.confirm]
    assert run(executor, start.message(ConnectorStep.start)).ok
    not_yet = run(executor, start.message(ConnectorStep.confirm))
    assert (not_yet.ok, not_yet.retryable) == (False, True)
    assert "pending" in (not_yet.error or "")
    assert len(server.schedule()) == 1
    confirmed = run(executor, start.message(ConnectorStep.confirm))
    assert confirmed.ok and confirmed.result["nodes"] == ["a1"], confirmed.error
    (resumed,) = [j for j in server.jobs.values() if j.state == "running"]
    assert (resumed.queue, resumed.node) == ("research", "a1")
    assert {(e.name, e.value) for e in resumed.spec.pod_specs[0].containers[0].env} == {
        (RESUME_FROM_ENV, STAGED_DIR)
    }


def test_a_resent_requeue_does_not_stop_the_work_again(
    server: ArmadaTestServer, connector: ArmadaConnector, tmp_path: Path
) -> None:
    job_id = checkpointable_job(connector, server)
    preempt = Saga(job_id, ActionKind.preempt, 2, source_node="a1")
    preempt.answered(AgentStep.checkpoint, {"image": {"image_dir": IMAGE_DIR, "size_bytes": 1}})
    preempt.answered(AgentStep.stage, {"image_dir": STAGED_DIR})
    requeue = preempt.message(ConnectorStep.requeue)

    first = run(ConnectorStepExecutor(connector, cluster=CLUSTER, state_dir=tmp_path), requeue)
    assert first.ok
    jobs_after_first = set(server.jobs)

    # Resent to the same connector: answered from its journal, Armada not touched.
    again = run(ConnectorStepExecutor(connector, cluster=CLUSTER, state_dir=tmp_path), requeue)
    assert again.outcome is Outcome.duplicate and again.result == first.result
    # Resent after the journal was lost (the connector died before it wrote the answer):
    # the step runs, finds its stamp on the workload's newest job and stops nothing.
    lost = run(
        ConnectorStepExecutor(connector, cluster=CLUSTER, state_dir=tmp_path / "new"), requeue
    )
    assert lost.ok and lost.outcome is Outcome.executed
    assert set(server.jobs) == jobs_after_first


def test_a_resend_after_a_crash_between_cancel_and_submit_finishes_the_step(
    server: ArmadaTestServer, connector: ArmadaConnector, tmp_path: Path
) -> None:
    job_id = checkpointable_job(connector, server)
    preempt = Saga(job_id, ActionKind.preempt, 2, source_node="a1")
    preempt.answered(AgentStep.checkpoint, {"image": {"image_dir": IMAGE_DIR, "size_bytes": 1}})
    preempt.answered(AgentStep.stage, {"image_dir": STAGED_DIR})
    requeue = preempt.message(ConnectorStep.requeue)
    connector.cancel(job_id)  # what the first delivery did before the connector died

    resent = run(ConnectorStepExecutor(connector, cluster=CLUSTER, state_dir=tmp_path), requeue)
    assert resent.ok, resent.error
    assert len(server.jobs_of(HOLD_QUEUE, "train")) == 1
    # And once more with the journal gone: Armada's client-id deduplication and the stamp
    # keep it at one resubmission.
    assert run(
        ConnectorStepExecutor(connector, cluster=CLUSTER, state_dir=tmp_path / "new"), requeue
    ).ok
    assert len(server.jobs_of(HOLD_QUEUE, "train")) == 1


def test_what_armada_cannot_do_is_refused_with_the_reason(
    server: ArmadaTestServer, tmp_path: Path
) -> None:
    with connector_for(server, hold_queue=None) as connector:
        job_id = checkpointable_job(connector, server)
        executor = ConnectorStepExecutor(connector, cluster=CLUSTER, state_dir=tmp_path)
        preempt = Saga(job_id, ActionKind.preempt, 2, source_node="a1")
        preempt.answered(AgentStep.checkpoint, {"image": {"image_dir": IMAGE_DIR}})
        preempt.answered(AgentStep.stage, {"image_dir": STAGED_DIR})
        no_hold = run(executor, preempt.message(ConnectorStep.requeue))
        assert (no_hold.ok, no_hold.retryable) == (False, False)
        assert "no hold_queue" in (no_hold.error or "")
        assert server.job(job_id).state == "running"  # refused before anything changed

        suspend = {
            "action_id": 9,
            "key": "k-suspend",
            "step": "suspend",
            "workload_id": job_id,
            "generation": 3,
        }
        refused = run(executor, suspend)
        assert refused.outcome is Outcome.refused
        assert "cannot suspend" in (refused.error or "")


def job_set_move(generation: int, executor: str = "exec-b") -> dict[str, Any]:
    """The ``move_job_set`` step of an operator's move of research/sweep, as the saga
    builds it (app.actions.recipes.job_set_steps, app.actions.messages.step_message)."""
    action = Action(
        id=generation,
        cluster_id=1,
        kind=ActionKind.move_job_set,
        idempotency_key=f"move_job_set-1-{generation}",
        job_set_queue="research",
        job_set="sweep",
        target_executor=executor,
    )
    cluster = Cluster(id=1, name=CLUSTER, scheduler=SchedulerKind.armada)
    (step,) = job_set_steps(action, cluster)
    assert (step.name, step.queue, step.generation) == (
        ConnectorStep.move_job_set,
        connector_queue(CLUSTER),
        generation,
    )
    outgoing = step_message(action, None, step, [step], 30.0)
    message: dict[str, Any] = outgoing.kwargs["step"]
    return message


def sweep_jobs(connector: ArmadaConnector, *pins: dict[str, str]) -> list[str]:
    return [
        connector.submit_job(
            "research",
            "sweep",
            NewJob(image="registry.local/train:1", gpus=2, node_selector=pin),
        )
        for pin in pins
    ]


def test_a_job_set_moves_once_however_often_its_step_comes(
    server: ArmadaTestServer, connector: ArmadaConnector, tmp_path: Path
) -> None:
    workloads = sweep_jobs(connector, {"kubernetes.io/hostname": "a1"}, {})
    message = job_set_move(7)
    assert message["workload_id"] == "job-set:research/sweep"
    assert {k: message["args"][k] for k in ("queue", "job_set", "executor")} == {
        "queue": "research",
        "job_set": "sweep",
        "executor": "exec-b",
    }

    first = run(ConnectorStepExecutor(connector, cluster=CLUSTER, state_dir=tmp_path), message)
    assert first.ok and first.outcome is Outcome.executed, first.error
    moved = first.result["moved"]
    assert set(moved) == set(workloads) and first.result["executor"] == "exec-b"
    for workload, new_id in moved.items():
        assert server.job(workload).state == "cancelled"
        new = server.job(new_id)
        assert dict(new.spec.pod_specs[0].nodeSelector) == {"shaper.io/armada-executor": "exec-b"}
        assert new.spec.annotations[STOPPED_BY_STEP] == message["key"]
    made = set(server.jobs)

    # Resent (its answer lost): the journal answers, Armada is not touched.
    again = run(ConnectorStepExecutor(connector, cluster=CLUSTER, state_dir=tmp_path), message)
    assert again.outcome is Outcome.duplicate and again.result == first.result
    # Resent after the journal was lost too, once the jobs have even started there: the
    # stamp on each job says it moved; nothing is cancelled or submitted again.
    assert sorted(server.schedule()) == sorted(moved.values())
    lost = run(
        ConnectorStepExecutor(connector, cluster=CLUSTER, state_dir=tmp_path / "new"), message
    )
    assert lost.ok and lost.outcome is Outcome.executed, lost.error
    assert lost.result["moved"] == moved and set(server.jobs) == made
    assert {server.job(new_id).node for new_id in moved.values()} == {"b1"}

    # A late step of an older move of the job set is refused.
    stale = run(
        ConnectorStepExecutor(connector, cluster=CLUSTER, state_dir=tmp_path), job_set_move(6)
    )
    assert stale.outcome is Outcome.refused and "stale generation" in (stale.error or "")


def test_a_job_set_move_cut_short_between_a_cancel_and_its_submit_is_finished_by_the_resend(
    server: ArmadaTestServer, connector: ArmadaConnector, tmp_path: Path
) -> None:
    workloads = sweep_jobs(connector, {}, {})
    message = job_set_move(7)
    submit = connector.api.submit
    calls: list[int] = []

    def dies_on_the_second_submit(*args: Any, **kwargs: Any) -> list[str]:
        calls.append(1)
        if len(calls) == 2:
            raise ConnectorError("armada: connection reset", retryable=True)
        return submit(*args, **kwargs)

    connector.api.submit = dies_on_the_second_submit  # type: ignore[method-assign]
    cut = run(ConnectorStepExecutor(connector, cluster=CLUSTER, state_dir=tmp_path), message)
    assert (cut.ok, cut.retryable) == (False, True), cut.error
    # One job moved, the other cancelled and not submitted again yet.
    assert {server.job(w).state for w in workloads} == {"cancelled"}
    assert len(server.jobs_of("research", "sweep")) == 3

    resent = run(ConnectorStepExecutor(connector, cluster=CLUSTER, state_dir=tmp_path), message)
    assert resent.ok, resent.error
    assert set(resent.result["moved"]) == set(workloads)
    queued = [j for j in server.jobs_of("research", "sweep") if j.state == "queued"]
    assert sorted(j.job_id for j in queued) == sorted(resent.result["moved"].values())
    assert len(server.jobs_of("research", "sweep")) == 4  # each workload moved once


def test_a_job_set_move_leaves_a_job_another_change_is_submitting_again_to_that_change(
    server: ArmadaTestServer, connector: ArmadaConnector, tmp_path: Path
) -> None:
    workloads = sweep_jobs(connector, {}, {})
    # A hold or a requeue of one job of the set has cancelled it to submit it again, and
    # its next job is not in the events yet.
    connector.catch_up()
    held_back = connector.workloads()[workloads[0]]
    connector._cancel_own(held_back, REPLACED_REASON)
    before = set(server.jobs)

    step = run(
        ConnectorStepExecutor(connector, cluster=CLUSTER, state_dir=tmp_path), job_set_move(7)
    )
    # Retried later, once that job is seen: moving it too would make a second live job of
    # its workload.
    assert (step.ok, step.retryable) == (False, True), step.error
    assert "not in its events yet" in (step.error or "")
    assert set(server.jobs) == before  # nothing cancelled or submitted by the move


def test_a_job_set_move_armada_cannot_make_is_refused_with_the_reason(
    server: ArmadaTestServer, connector: ArmadaConnector, tmp_path: Path
) -> None:
    executor = ConnectorStepExecutor(connector, cluster=CLUSTER, state_dir=tmp_path)
    empty = run(executor, job_set_move(3))
    assert (empty.ok, empty.retryable) == (False, False)
    assert "has no queued jobs to move" in (empty.error or "")
    (big,) = [
        connector.submit_job("research", "sweep", NewJob(image="registry.local/train:1", gpus=8))
    ]
    misfit = run(executor, job_set_move(4))
    assert (misfit.ok, misfit.retryable) == (False, False)
    assert f"{big}: needs 8 GPUs" in (misfit.error or "")
    assert server.job(big).state == "queued"  # refused before anything changed
    nowhere = run(executor, job_set_move(5, executor="exec-z"))
    assert "no node of it is declared" in (nowhere.error or "")
    # Another scheduler's connector has no job sets: the step is refused, not run.
    other = ConnectorStepExecutor(object(), cluster=CLUSTER, state_dir=tmp_path / "other")
    refused = run(other, job_set_move(6))
    assert refused.outcome is Outcome.refused and "cannot move job sets" in (refused.error or "")
