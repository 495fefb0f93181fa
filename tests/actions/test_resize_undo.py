"""A service's resize that runs after its saga gave up on it is undone (compensation's
``undo_resize``): the saga on a real database, the connector's executor and a simulated
cluster's service as a deployed connector runs them, the messages handed over by hand so
that the connector can be cut off and its queue delivered late, in either order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlmodel import Session

from app.actions import saga
from app.actions.models import Action, ActionKind, ActionState, ActionStep, StepState
from app.actions.recipes import NO_ANSWER, compensation_steps, forward_steps
from app.clusters.models import Cluster
from app.core.clock import FrozenClock
from app.core.security import Principal
from app.jobs.models import Job
from connectors.sim import SimCluster, SimExecutors
from tests.connectors.test_sim_cluster import SERVICE_SPEC
from wire.steps import StepPhase, StepReport
from wire.telemetry import JobShape, JobState, SchedulerKind

OPERATOR = Principal(token_id=0, name="admin", scopes=frozenset({"admin"}))
# Two 4-GPU nodes and a service of up to 6 one-GPU replicas, no arrivals.
SITE = SERVICE_SPEC


@pytest.fixture
def site(clock: FrozenClock, tmp_path: Path) -> tuple[SimCluster, SimExecutors]:
    """The service at four replicas, two on each node."""
    cluster = SimCluster(SITE, start=clock.now(), seed=1, clock=clock.now)
    chat = cluster.jobs["chat"]
    chat.resized = True
    chat.placement = {"a": [0, 1], "b": [2, 3]}
    chat.report = chat.report.model_copy(update={"replicas": 4})
    return cluster, SimExecutors(cluster, state_dir=tmp_path)


@pytest.fixture
def shrink(session: Session, clock: FrozenClock) -> int:
    """The plan's shrink of the service off a (a replica move's first half): 4 → 3."""
    cluster = Cluster(name="svc", scheduler=SchedulerKind.kubernetes, created_at=clock.now())
    session.add(cluster)
    session.flush()
    job = Job(
        cluster_id=cluster.id,  # type: ignore[arg-type]
        external_id="chat",
        shape=JobShape.elastic,
        state=JobState.running,
        gpus_requested=1,
        replicas_movable=True,
        updated_at=clock.now(),
    )
    session.add(job)
    session.flush()
    action = Action(
        cluster_id=cluster.id,  # type: ignore[arg-type]
        job_id=job.id,
        kind=ActionKind.resize,
        state=ActionState.approved,
        idempotency_key="shrink",
        source_placement={"a": 2, "b": 2},
        target_placement={"a": 1, "b": 2},
        target_replicas=3,
        created_at=clock.now(),
        updated_at=clock.now(),
    )
    session.add(action)
    session.commit()
    return action.id  # type: ignore[return-value]


def _given_up(session: Session, clock: FrozenClock, action_id: int) -> tuple[Any, Any]:
    """The shrink sent three times and never answered (its connector cut off): the saga
    gives it up and sends the undo. Returns (the shrink's message, the undo's)."""
    (resize,) = saga.advance(session=session, action_id=action_id, now=clock.now())
    for _ in range(2):
        clock.advance(31)
        (again,) = saga.advance(
            session=session, action_id=action_id, now=clock.now(), step_timeout_s=30
        )
        assert again.kwargs["step"]["key"] == resize.kwargs["step"]["key"]
    clock.advance(31)
    (undo,) = saga.advance(session=session, action_id=action_id, now=clock.now(), step_timeout_s=30)
    return resize, undo


def _deliver(executors: SimExecutors, message: Any) -> dict[str, Any]:
    return executors.handle(message.queue, message.kwargs["step"])


def _record(session: Session, clock: FrozenClock, answer: dict[str, Any]) -> None:
    saga.record_report(
        session=session, report=StepReport(**answer), now=clock.now(), reporter=OPERATOR
    )


def _replicas(cluster: SimCluster) -> int:
    chat = next(j for j in cluster.read_state().jobs if j.external_id == "chat")
    return chat.replicas


def test_a_shrink_delivered_after_the_saga_gave_up_is_undone(
    session: Session, clock: FrozenClock, site: tuple[SimCluster, SimExecutors], shrink: int
) -> None:
    cluster, executors = site
    resize, undo = _given_up(session, clock, shrink)
    step = undo.kwargs["step"]
    assert (undo.queue, step["step"], step["phase"]) == (
        "connector.svc",
        "undo_resize",
        "compensate",
    )
    assert step["generation"] > resize.kwargs["step"]["generation"]
    assert step["args"]["undo_key"] == resize.kwargs["step"]["key"]
    assert step["args"]["back_to"] == 4
    action = session.get(Action, shrink)
    assert action is not None and action.state == ActionState.compensating
    assert (
        action.error
        == "resize on connector.svc failed: no answer from connector.svc after 3 attempts"
    )

    # The connector comes back: the shrink queued before the undo runs first …
    late = _deliver(executors, resize)
    assert late["ok"] and _replicas(cluster) == 3
    assert cluster.jobs["chat"].placement["a"] == [0]
    # … its two resent copies are answered from the journal …
    assert _deliver(executors, resize)["outcome"] == "duplicate"
    # … and the undo sizes the service back to where the failed action found it.
    undone = _deliver(executors, undo)
    assert undone["ok"] and undone["result"]["undone"] is True, undone
    assert _replicas(cluster) == 4
    _record(session, clock, undone)
    session.refresh(action)
    assert action.state == ActionState.compensated
    assert action.error is not None and "compensated: undo_resize on connector.svc" in action.error


def test_a_shrink_that_arrives_after_its_undo_is_refused(
    session: Session, clock: FrozenClock, site: tuple[SimCluster, SimExecutors], shrink: int
) -> None:
    cluster, executors = site
    resize, undo = _given_up(session, clock, shrink)
    undone = _deliver(executors, undo)
    assert undone["ok"] and undone["result"]["undone"] is False, undone
    assert "never ran here" in undone["result"]["summary"]
    stale = _deliver(executors, resize)
    assert not stale["ok"] and stale["outcome"] == "refused", stale
    assert "stale generation" in stale["error"]
    assert _replicas(cluster) == 4 and cluster.jobs["chat"].placement == {"a": [0, 1], "b": [2, 3]}
    _record(session, clock, undone)
    action = session.get(Action, shrink)
    assert action is not None and action.state == ActionState.compensated


def test_a_shrink_the_connector_refused_is_not_undone(
    session: Session, clock: FrozenClock, site: tuple[SimCluster, SimExecutors], shrink: int
) -> None:
    """A refusal is an answer: nothing ran, so the action fails as before, with no undo."""
    (resize,) = saga.advance(session=session, action_id=shrink, now=clock.now())
    resize.kwargs["step"]["args"]["leave"] = {"a": 3}  # more than it has there: refused
    refused = _deliver(site[1], resize)
    assert not refused["ok"] and not refused["retryable"], refused
    assert "has 2 replicas on a, not the 3" in refused["error"]
    assert _replicas(site[0]) == 4
    _record(session, clock, refused)
    action = session.get(Action, shrink)
    assert action is not None and action.state == ActionState.failed


def _steps(action: Action, job: Job, resize: StepState, confirm: StepState) -> list[ActionStep]:
    cluster = Cluster(
        id=1, name="svc", scheduler=SchedulerKind.kubernetes, created_at=action.created_at
    )
    steps = forward_steps(action, job, cluster, 0)
    for step, state in zip(steps, (resize, confirm), strict=False):
        step.state = state
        step.error = (
            f"{NO_ANSWER} from connector.svc after 3 attempts"
            if state == StepState.failed
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
    shrink: int,
    resize: StepState,
    confirm: StepState,
    undone: bool,
) -> None:
    action = session.get(Action, shrink)
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
