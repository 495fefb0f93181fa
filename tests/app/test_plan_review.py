"""Why a proposal expires (``app.shaping.review`` through the cycle): each reason names the
job that changed, and is written on the action that failed a check; the rest of its
dependency group falls naming that action.

The demo showed the start of a job still pending cancelled with "expired: its job has
ended or left the cluster": the job that had ended was the one the plan would preempt to
make room, which finished on its own. The start fell with the preemption (one group
stands or falls whole), but the reason, written first on the start, read as its own.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from sqlmodel import Session, select

from app.actions.models import Action, ActionKind, ActionState
from app.clusters import service as cluster_service
from app.clusters.models import ClusterCreate, ShapingMode
from app.jobs.models import Job
from app.nodes.models import Node
from app.plans.models import Plan, PlanState
from app.shaping import review
from app.shaping.cycle import run_cycle
from app.shaping.snapshot import ClusterSnapshot, JobRow
from app.telemetry import service as telemetry_service
from tests.app.builders import job, node, running, snapshot
from tests.support.clock import T0
from wire.telemetry import NodeState, SchedulerKind, TelemetrySnapshot

LOW = running("low", "n1", list(range(8)), priority=10)
URGENT = job("urgent", gpus_requested=8, priority=100)


def _push(session: Session, seq: int, jobs: list[dict[str, Any]]) -> None:
    push = TelemetrySnapshot.model_validate(snapshot(seq, nodes=[node("n1")], jobs=jobs))
    telemetry_service.ingest(
        session=session, cluster_name="alpha", push=push, now=T0 + timedelta(seconds=seq)
    )


def _actions(session: Session, plan_id: int) -> dict[tuple[str, ActionKind], Action]:
    rows = session.exec(
        select(Action, Job.external_id)
        .join(Job)
        .where(Action.plan_id == plan_id)
        .execution_options(populate_existing=True)
    )
    return {(name, ActionKind(action.kind)): action for action, name in rows}


@pytest.fixture
def proposal(session: Session) -> tuple[int, dict[tuple[str, ActionKind], Action]]:
    """An advise-mode plan that preempts ``low`` (all of n1) to start ``urgent`` there."""
    cluster_service.register_cluster(
        session=session,
        now=T0,
        cluster_in=ClusterCreate(
            name="alpha", scheduler=SchedulerKind.slurm, mode=ShapingMode.advise
        ),
    )
    _push(session, 1, [LOW, URGENT])
    result = run_cycle(session=session, cluster_name="alpha", now=T0 + timedelta(seconds=1))
    actions = _actions(session, result.plan_id)
    assert set(actions) == {
        ("urgent", ActionKind.start),
        ("urgent", ActionKind.reserve),
        ("low", ActionKind.preempt),
    }
    assert {ActionState(a.state) for a in actions.values()} == {ActionState.proposed}
    return result.plan_id, actions


def test_a_start_that_falls_with_a_preemption_whose_job_ended_names_that_job(
    session: Session, proposal: tuple[int, dict[tuple[str, ActionKind], Action]]
) -> None:
    plan_id, _ = proposal
    _push(session, 2, [URGENT])  # low ends on its own: it leaves the scheduler's view
    run_cycle(session=session, cluster_name="alpha", now=T0 + timedelta(seconds=2))

    states = session.exec(select(Job.external_id, Job.state).order_by(Job.external_id)).all()
    assert [tuple(row) for row in states] == [("low", "finished"), ("urgent", "pending")]
    actions = _actions(session, plan_id)
    assert {ActionState(a.state) for a in actions.values()} == {ActionState.cancelled}
    preempt = actions["low", ActionKind.preempt]
    assert preempt.error == "expired: job low has ended or left the cluster"
    for kind in (ActionKind.start, ActionKind.reserve):
        error = actions["urgent", kind].error or ""
        # Not "its job has ended": urgent is pending; it falls with the preemption.
        assert error.startswith(f"action {preempt.id} (preempt) of the same plan is cancelled")
        assert error.endswith("expired: job low has ended or left the cluster")
    plan = session.get(Plan, plan_id)
    assert plan is not None
    session.refresh(plan)
    assert plan.state == PlanState.expired
    assert plan.state_reason == "job low has ended or left the cluster"
    # The next plan starts urgent on the GPUs low left, without preempting anything.
    fresh = session.exec(select(Plan).where(Plan.id != plan_id)).one()
    assert {kind for _, kind in _actions(session, fresh.id or 0)} == {
        ActionKind.start,
        ActionKind.reserve,
    }


def test_a_start_whose_own_job_ended_says_so_and_its_group_falls_naming_it(
    session: Session, proposal: tuple[int, dict[tuple[str, ActionKind], Action]]
) -> None:
    plan_id, _ = proposal
    _push(session, 2, [LOW])  # urgent is withdrawn from the queue: it leaves the view
    run_cycle(session=session, cluster_name="alpha", now=T0 + timedelta(seconds=2))

    actions = _actions(session, plan_id)
    start = actions["urgent", ActionKind.start]
    assert start.error == "expired: job urgent has ended or left the cluster"
    for key in (("urgent", ActionKind.reserve), ("low", ActionKind.preempt)):
        error = actions[key].error or ""
        assert error.startswith(f"action {start.id} (start) of the same plan is cancelled")
        assert error.endswith("expired: job urgent has ended or left the cluster")


@pytest.mark.parametrize(
    ("shrink_state", "held", "applies"),
    [
        # Not started: the service must still be where the shrink starts from.
        (ActionState.approved, {"a": 2, "b": 2, "c": 2}, True),
        (ActionState.approved, {"a": 2, "c": 2}, False),
        # Under way (Kubernetes deletes the chosen pods one by one): any step between.
        (ActionState.running, {"a": 2, "c": 2}, True),
        (ActionState.running, {"a": 2}, True),
        # Something else took it elsewhere: no step of the shrink.
        (ActionState.running, {"a": 2, "d": 2}, False),
        (ActionState.running, {"a": 4}, False),
    ],
)
def test_a_moved_services_growth_back_follows_its_shrink_under_way(
    shrink_state: ActionState, held: dict[str, int], applies: bool
) -> None:
    """The growth back of a moved service starts from what its shrink keeps (``a:2``); a
    cycle that runs before or while the shrink runs finds the service on the way there."""
    shrink = Action(
        id=1,
        kind=ActionKind.resize,
        state=shrink_state,
        source_placement={"a": 2, "b": 2, "c": 2},
        target_placement={"a": 2},
    )
    growth = Action(
        id=2,
        kind=ActionKind.resize,
        state=ActionState.approved,
        source_placement={"a": 2},
        target_placement={"a": 2, "d": 4},
    )
    row = _service_row(held)
    problem = review._job_check(growth, row, "svc", [shrink])
    assert (problem is None) is applies, problem


def _service_row(held: dict[str, int]) -> JobRow:
    """A running 2-GPU-replica service holding ``held`` (node → GPUs)."""
    return JobRow(
        id=7,
        external_id="svc",
        team="serving",
        kind="realtime_inference",
        shape="elastic",
        priority=0,
        gpus_requested=2,
        allowed_gpu_models=(),
        min_gpu_memory_gib=0.0,
        required_precision=None,
        gang_size=1,
        checkpointable=False,
        min_replicas=1,
        max_replicas=8,
        replicas=sum(held.values()) // 2,
        submit_time=None,
        start_time=None,
        placement=tuple((n, tuple(range(g)), g) for n, g in held.items()),
        demand_history=(),
        migrations_today=0,
        preemptions_today=0,
        last_moved_at=None,
    )


@pytest.mark.parametrize(
    ("service_held", "expired"),
    [
        # The connector has not pushed since the shrink succeeded: the snapshot still shows
        # the service on a. The start and the growth back still apply.
        ({"a": 2, "b": 2}, set()),
        # Pushed: the service is where the shrink left it.
        ({"b": 2}, set()),
        # Somewhere the shrink never put it: the growth back (and the start, one group
        # with it) no longer applies.
        ({"a": 4, "b": 2}, {2, 3}),
    ],
)
def test_a_done_shrink_not_yet_in_the_telemetry_keeps_its_move(
    service_held: dict[str, int], expired: set[int]
) -> None:
    """A resize's success records nothing: until its connector's next push the snapshot
    has the service where it was. A cycle in that window expired the growth back (the
    service "now holds" a:2 where the plan found it on b:2) and the start on a (6 GPUs to
    be had, 8 needed), leaving the service short with the GPUs freed for nothing."""
    nodes = tuple(
        Node(cluster_id=1, name=name, gpu_count=8, state=NodeState.up, updated_at=T0)
        for name in "ab"
    )
    service = replace(_service_row(service_held), id=7)
    big = replace(
        _service_row({}), id=8, external_id="big", shape="block", gpus_requested=8, replicas=1
    )
    snap = ClusterSnapshot(
        cluster="lab",
        cluster_id=1,
        mode="advise",
        policy="shaper",
        scheduler="kubernetes",
        taken_at=T0,
        gpu_models=(),
        nodes=nodes,
        jobs=(service, big),
        sla={},
    )
    # (id, job, kind, state, from, to, after): the shrink done, the start and the growth
    # back approved, waiting.
    shrink, start, growth = (
        Action(
            id=i,
            cluster_id=1,
            idempotency_key=f"action-{i}",
            job_id=job,
            kind=kind,
            state=state,
            source_placement=source,
            target_placement=target,
            depends_on=after,
        )
        for i, job, kind, state, source, target, after in (
            (1, 7, ActionKind.resize, ActionState.succeeded, {"a": 2, "b": 2}, {"b": 2}, []),
            (2, 8, ActionKind.start, ActionState.approved, {}, {"a": 8}, [1]),
            (3, 7, ActionKind.resize, ActionState.approved, {"b": 2}, {"b": 4}, [2]),
        )
    )
    outcome = review.review_plan(snap, [shrink, start, growth])
    assert set(outcome.expired) == expired, outcome.expired
