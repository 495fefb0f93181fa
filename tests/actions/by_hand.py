"""Sagas driven by hand against simulated executors: the saga on a real database (the
``session``/``clock`` fixtures), its messages handed to connectors.sim's SimExecutors (the
connector's executor and simulated node agents) one by one, so that an executor can be
cut off, and its queue delivered late, in any order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlmodel import Session

from app.actions import saga
from app.actions.messages import Outgoing
from app.actions.models import Action, ActionKind, ActionState
from app.clusters.models import Cluster
from app.core.clock import FrozenClock
from app.core.security import Principal
from app.jobs.models import Job
from app.nodes.models import Node
from connectors.base import ConnectorError
from connectors.sim import SimCluster, SimExecutors
from tests.connectors.test_sim_cluster import SERVICE_SPEC
from wire.steps import StepReport
from wire.telemetry import JobShape, JobState, SchedulerKind

# Admin tokens may answer any step (operators of the control plane).
OPERATOR = Principal(token_id=0, name="admin", scopes=frozenset({"admin"}))


def service_site(clock: FrozenClock, tmp_path: Path) -> tuple[SimCluster, SimExecutors]:
    """Two 4-GPU nodes and the service "chat" (one GPU a replica) at four replicas, two on
    each node."""
    cluster = SimCluster(SERVICE_SPEC, start=clock.now(), seed=1, clock=clock.now)
    chat = cluster.jobs["chat"]
    chat.resized = True
    chat.placement = {"a": [0, 1], "b": [2, 3]}
    chat.report = chat.report.model_copy(update={"replicas": 4})
    return cluster, SimExecutors(cluster, state_dir=tmp_path)


def add_nodes(
    session: Session, clock: FrozenClock, cluster_id: int, names: str | tuple[str, ...], gpus: int
) -> dict[str, int]:
    """Nodes of ``gpus`` GPUs each on the cluster, flushed: their ids by name."""
    ids = {}
    for name in names:
        node = Node(cluster_id=cluster_id, name=name, gpu_count=gpus, updated_at=clock.now())
        session.add(node)
        session.flush()
        assert node.id is not None
        ids[name] = node.id
    return ids


def approved_action(
    session: Session,
    clock: FrozenClock,
    kind: ActionKind,
    *,
    cluster: str,
    scheduler: SchedulerKind,
    job: dict[str, Any],
    **fields: Any,
) -> int:
    """A cluster, a running job of it (``job``: its fields) and an approved action on it
    (``fields``); the action's id."""
    row = Cluster(name=cluster, scheduler=scheduler, created_at=clock.now())
    session.add(row)
    session.flush()
    subject = Job(
        cluster_id=row.id,  # type: ignore[arg-type]
        state=JobState.running,
        updated_at=clock.now(),
        **job,
    )
    session.add(subject)
    session.flush()
    return action_on(session, clock, subject, kind, key=f"by-hand-{kind.value}", **fields)


def action_on(
    session: Session, clock: FrozenClock, job: Job, kind: ActionKind, *, key: str, **fields: Any
) -> int:
    """An approved action on ``job`` (``fields``: its own), committed; its id."""
    action = Action(
        cluster_id=job.cluster_id,
        job_id=job.id,
        kind=kind,
        state=ActionState.approved,
        idempotency_key=key,
        created_at=clock.now(),
        updated_at=clock.now(),
        **fields,
    )
    session.add(action)
    session.commit()
    return action.id  # type: ignore[return-value]


def service_action(session: Session, clock: FrozenClock, kind: ActionKind, **fields: Any) -> int:
    """An approved action on :func:`service_site`'s service."""
    chat = {
        "external_id": "chat",
        "shape": JobShape.elastic,
        "gpus_requested": 1,
        "replicas_movable": True,
    }
    return approved_action(
        session,
        clock,
        kind,
        cluster="svc",
        scheduler=SchedulerKind.kubernetes,
        job=chat,
        **fields,
    )


def shrink_off_a(session: Session, clock: FrozenClock) -> int:
    """The plan's shrink of the service off node a (a replica move's first half): 4 → 3."""
    return service_action(
        session,
        clock,
        ActionKind.resize,
        source_placement={"a": 2, "b": 2},
        target_placement={"a": 1, "b": 2},
        target_replicas=3,
    )


def deliver(executors: SimExecutors, message: Outgoing) -> dict[str, Any]:
    """The executor's answer to a message (the wire dict)."""
    return executors.handle(message.queue, message.kwargs["step"])


def record(session: Session, clock: FrozenClock, answer: dict[str, Any]) -> list[Outgoing]:
    """The answer recorded; the messages the saga sends next."""
    return saga.record_report(
        session=session, report=StepReport(**answer), now=clock.now(), reporter=OPERATOR
    )


def timed_out(session: Session, clock: FrozenClock, action_id: int) -> list[Outgoing]:
    """The sweep after the step's timeout: a resend, or what follows giving it up."""
    clock.advance(31)
    return saga.advance(session=session, action_id=action_id, now=clock.now(), step_timeout_s=30)


def given_up(session: Session, clock: FrozenClock, action_id: int) -> tuple[Outgoing, list[Any]]:
    """The action's first step sent three times, never answered: (its message, what the
    saga sends once it has given it up)."""
    (first,) = saga.advance(session=session, action_id=action_id, now=clock.now())
    for _ in range(2):
        (again,) = timed_out(session, clock, action_id)
        assert again.kwargs["step"]["key"] == first.kwargs["step"]["key"]
    return first, timed_out(session, clock, action_id)


def replicas(cluster: SimCluster) -> int:
    """The service's replicas as its scheduler reports them."""
    chat = next(j for j in cluster.read_state().jobs if j.external_id == "chat")
    return chat.replicas


def state(session: Session, action_id: int) -> ActionState:
    session.expire_all()
    action = session.get(Action, action_id)
    assert action is not None
    return ActionState(action.state)


def outage(cluster: SimCluster, method: str) -> None:
    """The scheduler's API down for ``method`` (a retryable error) until :func:`over`."""

    def down(*_: Any, **__: Any) -> None:
        raise ConnectorError("the scheduler's API is unavailable", retryable=True)

    setattr(cluster, method, down)


def over(cluster: SimCluster, method: str) -> None:
    delattr(cluster, method)  # the instance's patch gone: the class's method again
