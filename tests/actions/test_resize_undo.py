"""A service's resize that runs after its saga gave up on it is undone (compensation's
``undo_resize``): the saga on a real database, the connector's executor and a simulated
cluster's service as a deployed connector runs them, the messages handed over by hand so
that the connector can be cut off and its queue delivered late, in either order."""

from __future__ import annotations

import pytest
from sqlmodel import Session

from app.actions import saga
from app.actions.models import Action, ActionState, ActionStep, StepState
from app.actions.recipes import NO_ANSWER, compensation_steps, forward_steps
from app.clusters.models import Cluster
from app.core.clock import FrozenClock
from app.jobs.models import Job
from connectors.sim import SimCluster, SimExecutors
from tests.actions.by_hand import (
    deliver,
    given_up,
    record,
    replicas,
    state,
)
from wire.steps import StepPhase
from wire.telemetry import JobShape, SchedulerKind


def test_a_shrink_delivered_after_the_saga_gave_up_is_undone(
    session: Session,
    clock: FrozenClock,
    service_cluster: tuple[SimCluster, SimExecutors],
    service_shrink: int,
) -> None:
    cluster, executors = service_cluster
    resize, (undo,) = given_up(session, clock, service_shrink)
    step = undo.kwargs["step"]
    assert (undo.queue, step["step"], step["phase"]) == (
        "connector.svc",
        "undo_resize",
        "compensate",
    )
    assert step["generation"] > resize.kwargs["step"]["generation"]
    assert step["args"]["undo_key"] == resize.kwargs["step"]["key"]
    assert step["args"]["back_to"] == 4
    action = session.get(Action, service_shrink)
    assert action is not None and action.state == ActionState.compensating
    assert (
        action.error
        == "resize on connector.svc failed: no answer from connector.svc after 3 attempts"
    )

    # The connector comes back: the shrink queued before the undo runs first …
    late = deliver(executors, resize)
    assert late["ok"] and replicas(cluster) == 3
    assert cluster.jobs["chat"].placement["a"] == [0]
    # … its two resent copies are answered from the journal …
    assert deliver(executors, resize)["outcome"] == "duplicate"
    # … and the undo sizes the service back to where the failed action found it.
    undone = deliver(executors, undo)
    assert undone["ok"] and undone["result"]["undone"] is True, undone
    assert replicas(cluster) == 4
    record(session, clock, undone)
    assert state(session, service_shrink) == ActionState.compensated
    assert "compensated: undo_resize on connector.svc" in (action.error or "")


def test_a_shrink_that_arrives_after_its_undo_is_refused(
    session: Session,
    clock: FrozenClock,
    service_cluster: tuple[SimCluster, SimExecutors],
    service_shrink: int,
) -> None:
    cluster, executors = service_cluster
    resize, (undo,) = given_up(session, clock, service_shrink)
    undone = deliver(executors, undo)
    assert undone["ok"] and undone["result"]["undone"] is False, undone
    assert "never ran here" in undone["result"]["summary"]
    stale = deliver(executors, resize)
    assert not stale["ok"] and stale["outcome"] == "refused", stale
    assert "stale generation" in stale["error"]
    assert replicas(cluster) == 4 and cluster.jobs["chat"].placement == {"a": [0, 1], "b": [2, 3]}
    record(session, clock, undone)
    action = session.get(Action, service_shrink)
    assert action is not None and action.state == ActionState.compensated


def test_a_shrink_the_connector_refused_is_not_undone(
    session: Session,
    clock: FrozenClock,
    service_cluster: tuple[SimCluster, SimExecutors],
    service_shrink: int,
) -> None:
    """A refusal is an answer: nothing ran, so the action fails as before, with no undo."""
    (resize,) = saga.advance(session=session, action_id=service_shrink, now=clock.now())
    resize.kwargs["step"]["args"]["leave"] = {"a": 3}  # more than it has there: refused
    refused = deliver(service_cluster[1], resize)
    assert not refused["ok"] and not refused["retryable"], refused
    assert "has 2 replicas on a, not the 3" in refused["error"]
    assert replicas(service_cluster[0]) == 4
    record(session, clock, refused)
    action = session.get(Action, service_shrink)
    assert action is not None and action.state == ActionState.failed


def _steps(action: Action, job: Job, resize: StepState, confirm: StepState) -> list[ActionStep]:
    cluster = Cluster(
        id=1, name="svc", scheduler=SchedulerKind.kubernetes, created_at=action.created_at
    )
    steps = forward_steps(action, job, cluster, 0)
    for step, outcome in zip(steps, (resize, confirm), strict=False):
        step.state = outcome
        step.error = (
            f"{NO_ANSWER} from connector.svc after 3 attempts"
            if outcome == StepState.failed
            else None
        )
    return steps


@pytest.mark.parametrize(
    ("resize", "confirm", "undone"),
    [
        (StepState.failed, StepState.pending, True),  # unanswered: it may still run
        (StepState.succeeded, StepState.failed, True),  # ran, then its confirm gave up
        (StepState.pending, StepState.pending, False),  # never sent
    ],
)
def test_which_failed_resizes_are_undone(
    session: Session,
    clock: FrozenClock,
    service_shrink: int,
    resize: StepState,
    confirm: StepState,
    undone: bool,
) -> None:
    action = session.get(Action, service_shrink)
    assert action is not None and action.job_id is not None
    job = session.get(Job, action.job_id)
    assert job is not None
    steps = _steps(action, job, resize, confirm)
    undo = compensation_steps(action, steps, "svc", 1, job)
    assert [(s.name, s.phase) for s in undo] == (
        [("undo_resize", StepPhase.compensate)] if undone else []
    )
    # An elastic training job's resize is not undone this way (it may have restarted).
    training = job.model_copy(update={"shape": JobShape.block})
    assert compensation_steps(action, steps, "svc", 1, training) == []
