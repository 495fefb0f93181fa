"""Late steps: a copy of a step that reaches its executor after the saga gave up on it (its
executor cut off for longer than the saga's sends, then back with its queue intact), or
after compensation began. Each test here is a fault a review of late steps found (each
fails on the tree before its fix): the cluster must end as the control plane records it.

The sagas are driven by hand against simulated executors (tests.actions.by_hand)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import Session, col, select

import connectors.actions
from app.actions import saga
from app.actions import service as action_service
from app.actions.messages import Outgoing
from app.actions.models import Action, ActionKind, ActionState
from app.clusters.models import Cluster
from app.core.clock import FrozenClock
from app.core.errors import Conflict
from app.jobs.models import Allocation, Job
from app.plans.models import Plan, PlanState
from connectors.sim import SimCluster, SimExecutors, SiteSpec
from tests.actions.by_hand import (
    action_on,
    add_nodes,
    approved_action,
    deliver,
    given_up,
    outage,
    over,
    record,
    replicas,
    service_action,
    state,
    timed_out,
)
from wire.telemetry import JobKind, JobReport, JobState, SchedulerKind

# Two 8-GPU nodes under a scheduler that does not place jobs itself (sim): a migrate
# checkpoints, transfers and restores through the node agents.
LAB_SITE = SiteSpec(
    name="lab",
    nodes=(("a", "H100", 8), ("b", "H100", 8)),
    teams=("research",),
    kinds=(JobKind.training,),
    arrivals_per_hour=0,
)


@pytest.fixture
def reserve(session: Session, clock: FrozenClock) -> int:
    """The plan holds node a's two free GPUs for the service's growth."""
    return service_action(
        session,
        clock,
        ActionKind.reserve,
        source_placement={"a": 2, "b": 2},
        target_placement={"a": 2},
    )


# undo_resize gave up on a scheduler outage of seconds: a retryable answer to a
# compensation step failed it after MAX_ATTEMPTS sends (1 s and 4 s back-offs), and the
# service stayed shrunk. It has no fallback, so it waits the outage out.
def test_an_undo_resize_outlasts_a_brief_scheduler_outage(
    session: Session,
    clock: FrozenClock,
    service_cluster: tuple[SimCluster, SimExecutors],
    service_shrink: int,
) -> None:
    cluster, executors = service_cluster
    resize, after = given_up(session, clock, service_shrink)
    (undo,) = after
    assert deliver(executors, resize)["ok"] and replicas(cluster) == 3  # the late shrink
    outage(cluster, "resize")
    sends = [undo]
    for _ in range(3):
        answer = deliver(executors, sends[-1])
        assert not answer["ok"] and answer["retryable"], answer
        sends += record(session, clock, answer)
    over(cluster, "resize")  # the API is back five seconds later
    while len(sends) > 3 and state(session, service_shrink) == ActionState.compensating:
        sends += record(session, clock, deliver(executors, sends[-1]))
    assert state(session, service_shrink) == ActionState.compensated
    assert replicas(cluster) == 4


# A resize failed by a retryable answer while a resent copy was still queued was not
# undone (only an unanswered one was), and with no compensation the job's generation was
# not bumped: the copy ran later, the service shrank with the action recorded as failed.
# Now such a step "may have run" (recipes.may_have_run): the undo follows, whichever of it
# and the copy comes first.
@pytest.mark.parametrize("copy_first", [True, False])
def test_a_resize_failed_by_a_retryable_answer_with_a_copy_still_queued(
    session: Session,
    clock: FrozenClock,
    service_cluster: tuple[SimCluster, SimExecutors],
    service_shrink: int,
    copy_first: bool,
) -> None:
    cluster, executors = service_cluster
    (first,) = saga.advance(session=session, action_id=service_shrink, now=clock.now())
    (second,) = timed_out(session, clock, service_shrink)  # the first's answer is slow: resent
    outage(cluster, "resize_off")
    (third,) = record(session, clock, deliver(executors, first))  # "not now": resent
    (undo,) = record(session, clock, deliver(executors, second))  # attempts spent
    assert undo.kwargs["step"]["step"] == "undo_resize"
    assert state(session, service_shrink) == ActionState.compensating
    action = session.get(Action, service_shrink)
    assert action is not None and (action.error or "").startswith("resize on connector.svc failed")
    over(cluster, "resize_off")
    order = [third, undo] if copy_first else [undo, third]
    answers = [deliver(executors, message) for message in order]
    record(session, clock, answers[order.index(undo)])
    assert state(session, service_shrink) == ActionState.compensated
    assert replicas(cluster) == 4
    late = answers[order.index(third)]
    assert late["ok"] if copy_first else "stale generation" in late["error"], late


# A reserve given up and made later held node a's GPUs for RESERVATION_TTL_S (an hour) with
# no action left to give them back: it was not compensated, nor fenced. Now an unreserve at
# a new generation follows it, whichever of it and the late copy comes first.
@pytest.mark.parametrize("copy_first", [True, False])
def test_a_reserve_given_up_is_not_made_later(
    session: Session,
    clock: FrozenClock,
    service_cluster: tuple[SimCluster, SimExecutors],
    reserve: int,
    copy_first: bool,
) -> None:
    cluster, executors = service_cluster
    sent, after = given_up(session, clock, reserve)
    (unreserve,) = after
    assert unreserve.kwargs["step"]["step"] == "unreserve"
    assert unreserve.kwargs["step"]["generation"] > sent.kwargs["step"]["generation"]
    order = [sent, unreserve] if copy_first else [unreserve, sent]
    answers = [deliver(executors, message) for message in order]
    record(session, clock, answers[order.index(unreserve)])
    assert state(session, reserve) == ActionState.compensated
    assert "chat" not in cluster.reservations, (answers, cluster.reservations)


# undo_resize trusted the journal's answers, which are bounded
# (connectors.actions.MAX_REMEMBERED_STEPS, oldest forgotten first): a resize whose answer
# was forgotten before its undo arrived was taken for "never ran here", and the service
# stayed short. The last resize that ran is now kept per workload, apart from the answers.
def test_an_undo_resize_after_the_journal_forgot_the_resize(
    session: Session,
    clock: FrozenClock,
    service_cluster: tuple[SimCluster, SimExecutors],
    service_shrink: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cluster, executors = service_cluster
    monkeypatch.setattr(connectors.actions, "MAX_REMEMBERED_STEPS", 2)  # 10,000 in production
    resize, after = given_up(session, clock, service_shrink)
    (undo,) = after
    assert deliver(executors, resize)["ok"] and replicas(cluster) == 3
    for n in range(2):  # other steps answered meanwhile (another saga's)
        other = dict(resize.kwargs["step"], key=f"other-{n}", step="confirm")
        other["args"] = {"expect": "running"}
        assert executors.handle(resize.queue, other)["ok"]
    undone = deliver(executors, undo)
    record(session, clock, undone)
    assert state(session, service_shrink) == ActionState.compensated
    assert replicas(cluster) == 4, undone["result"]


# -- a migrate on a scheduler that does not place jobs itself ------------------------------


@pytest.fixture
def lab(clock: FrozenClock, tmp_path: Path) -> tuple[SimCluster, SimExecutors]:
    """Job "left" (4 GPUs, checkpointable) runs on node a."""
    cluster = SimCluster(LAB_SITE, start=clock.now(), seed=1, clock=clock.now)
    report = JobReport(
        external_id="left",
        team="research",
        kind=JobKind.training,
        gpus_requested=4,
        checkpointable=True,
        submit_time=clock.now(),
    )
    cluster.submit(report, timedelta(hours=4))
    if not cluster.runs_on("left", "a"):
        cluster.requeue("left", nodes=["a"])
    assert cluster.runs_on("left", "a")
    return cluster, SimExecutors(cluster, state_dir=tmp_path)


@pytest.fixture
def migrate(session: Session, clock: FrozenClock) -> int:
    """Move "left" from a to b."""
    left = {"external_id": "left", "gpus_requested": 4, "checkpointable": True}
    return approved_action(
        session,
        clock,
        ActionKind.migrate,
        cluster="lab",
        scheduler=SchedulerKind.sim,
        job=left,
        source_node="a",
        target_node="b",
    )


# A migrate whose job already ran, confirmed, at its target was compensated when the
# source's agent did not answer the last step (release@S): compensation stopped the job at
# the target and restored it at the source from the checkpoint, losing the work done since
# (with real agents the late release@S deleted that checkpoint first). The release is now
# sent until answered, as a move's last steps are (an operator may abandon it).
def test_a_migrate_confirmed_at_its_target_is_not_undone_for_a_silent_source(
    session: Session, clock: FrozenClock, lab: tuple[SimCluster, SimExecutors], migrate: int
) -> None:
    cluster, executors = lab
    (message,) = saga.advance(session=session, action_id=migrate, now=clock.now())
    while message.kwargs["step"]["step"] != "release":  # checkpoint, transfer, restore, confirm
        answer = deliver(executors, message)
        assert answer["ok"], answer
        (message,) = record(session, clock, answer)
    assert message.queue == "agent.lab.a" and cluster.runs_on("left", "b")
    sends = [message]  # node a's agent is cut off: release@a goes unanswered
    for _ in range(3):
        sends += timed_out(session, clock, migrate)
    # Node a comes back: its queue (the releases, then whatever compensation sent there)
    # and every other message the saga sends are delivered in order.
    while sends:
        answer = deliver(executors, sends.pop(0))
        sends += record(session, clock, answer)
    assert cluster.runs_on("left", "b") and not cluster.runs_on("left", "a")
    assert state(session, migrate) == ActionState.succeeded


def _owned_migrate(session: Session, clock: FrozenClock, migrate: int) -> None:
    """The lab's cluster recorded as Slurm's: the migrate stages at b and has the
    scheduler requeue the job there (recipes: a scheduler that places jobs itself)."""
    action = session.get(Action, migrate)
    assert action is not None
    cluster = session.get(Cluster, action.cluster_id)
    assert cluster is not None
    cluster.scheduler = SchedulerKind.slurm
    session.add(cluster)
    session.commit()


# A scheduler-placed migrate whose requeue failed by a retryable answer while a resent copy
# was still queued was compensated as if the requeue never reached the scheduler: the
# target released and the job restored at its source, with no step at the connector, whose
# fence stayed at the forward generation, so the late copy moved the job to the target
# while the record said it ran, restored, at the source. Now such a requeue "may have
# run": compensation sends the job home through the scheduler, at a new generation that
# refuses the copy.
def test_a_requeue_failed_by_a_retryable_answer_with_a_copy_still_queued(
    session: Session, clock: FrozenClock, lab: tuple[SimCluster, SimExecutors], migrate: int
) -> None:
    cluster, executors = lab
    _owned_migrate(session, clock, migrate)
    (message,) = saga.advance(session=session, action_id=migrate, now=clock.now())
    while message.kwargs["step"]["step"] != "requeue":  # checkpoint, transfer, stage
        answer = deliver(executors, message)
        assert answer["ok"], answer
        (message,) = record(session, clock, answer)
    first = message
    (second,) = timed_out(session, clock, migrate)
    outage(cluster, "requeue")
    (third,) = record(session, clock, deliver(executors, first))
    sends = record(session, clock, deliver(executors, second))  # attempts spent
    assert state(session, migrate) == ActionState.compensating
    over(cluster, "requeue")
    home = None
    while home is None:  # release@b, stage@a, then the scheduler's requeue home
        message = sends.pop(0)
        answer = deliver(executors, message)
        assert answer["ok"], answer
        if message.kwargs["step"]["step"] == "requeue":
            home = message
        else:
            sends += record(session, clock, answer)
    generation = home.kwargs["step"]["generation"]
    assert home.queue == "connector.lab" and generation > third.kwargs["step"]["generation"]
    assert home.kwargs["step"]["args"]["nodes"] == ["a"]
    late = deliver(executors, third)  # the connector's queue: the third forward requeue
    assert not late["ok"] and "stale generation" in late["error"], late


def test_a_migrate_waiting_on_a_source_gone_for_good_can_be_abandoned(
    session: Session, clock: FrozenClock, lab: tuple[SimCluster, SimExecutors], migrate: int
) -> None:
    """The source's release is sent until answered; when that node is gone for good an
    operator abandons the action, once the release has gone unanswered for its sends: it
    ends failed saying where the job runs and what to check at the source."""
    cluster, executors = lab
    (message,) = saga.advance(session=session, action_id=migrate, now=clock.now())
    while message.kwargs["step"]["step"] != "release":
        answer = deliver(executors, message)
        assert answer["ok"], answer
        (message,) = record(session, clock, answer)
    with pytest.raises(Conflict):
        action_service.abandon(session=session, action_id=migrate, by="ops", now=clock.now())
    session.rollback()
    for _ in range(3):
        (again,) = timed_out(session, clock, migrate)
        assert again.kwargs["step"]["key"] == message.kwargs["step"]["key"]
    assert state(session, migrate) == ActionState.running
    action = action_service.abandon(session=session, action_id=migrate, by="ops", now=clock.now())
    assert action.state == ActionState.failed
    assert "the job runs at b (its confirm there succeeded)" in (action.error or "")
    assert cluster.runs_on("left", "b")


def newer(session: Session, clock: FrozenClock, older: int, kind: ActionKind, **fields: Any) -> int:
    """A later plan's approved action on the same job as ``older`` (which has ended)."""
    before = session.get(Action, older)
    assert before is not None
    job = session.get(Job, before.job_id)
    assert job is not None
    return action_on(session, clock, job, kind, key=f"newer-{kind.value}-{older}", **fields)


def run_through(
    session: Session, clock: FrozenClock, executors: SimExecutors, action_id: int
) -> None:
    """The action's saga to its end, every message delivered at once."""
    sends: list[Outgoing] = saga.advance(session=session, action_id=action_id, now=clock.now())
    while sends:
        answer = deliver(executors, sends.pop(0))
        assert answer["ok"], answer
        sends += record(session, clock, answer)
    assert state(session, action_id) == ActionState.succeeded


# A reserve's compensating unreserve answered "not now" for its sends failed the
# compensation while a resent copy was still queued; a later plan's reserve of the job is
# sent at that same generation (a reserve bumps none), so the late copy was not stale and
# took off the newer action's reservation. An unreserve now waits "not now" out: once one
# copy has run, the others are answered from the connector's journal.
def test_a_late_unreserve_copy_leaves_a_newer_actions_reservation(
    session: Session,
    clock: FrozenClock,
    service_cluster: tuple[SimCluster, SimExecutors],
    reserve: int,
) -> None:
    cluster, executors = service_cluster
    _, after = given_up(session, clock, reserve)
    (first,) = after
    assert first.kwargs["step"]["step"] == "unreserve"
    (second,) = timed_out(session, clock, reserve)  # the first's answer is slow: resent
    outage(cluster, "unreserve")
    (third,) = record(session, clock, deliver(executors, first))  # "not now": resent
    (fourth,) = record(session, clock, deliver(executors, second))  # and again
    assert state(session, reserve) == ActionState.compensating
    over(cluster, "unreserve")
    assert record(session, clock, deliver(executors, third)) == []
    assert state(session, reserve) == ActionState.compensated
    later = newer(session, clock, reserve, ActionKind.reserve, target_placement={"a": 2})
    run_through(session, clock, executors, later)
    assert "chat" in cluster.reservations
    late = deliver(executors, fourth)  # the failed saga's last copy, queued behind
    assert late["outcome"] == "duplicate" and "chat" in cluster.reservations, late


# An abandoned compensation left the job at the compensation's generation, which the next
# saga of the job was sent at (a resize or reserve bumps none): a copy of the abandoned
# undo_resize delivered after a newer resize was not stale, and the connector undid the
# older resize, its journal still holding that one's answer. Now an abandon fences the job
# at a new generation, and an undo acts only on the last resize the connector ran.
def test_an_abandoned_undo_resize_delivered_late_leaves_a_newer_resize(
    session: Session,
    clock: FrozenClock,
    service_cluster: tuple[SimCluster, SimExecutors],
    service_shrink: int,
) -> None:
    cluster, executors = service_cluster
    shrink, after = given_up(session, clock, service_shrink)
    (undo,) = after
    assert deliver(executors, shrink)["ok"] and replicas(cluster) == 3  # the late shrink
    action_service.abandon(session=session, action_id=service_shrink, by="ops", now=clock.now())
    assert state(session, service_shrink) == ActionState.failed
    later = newer(session, clock, service_shrink, ActionKind.resize, target_replicas=2)
    run_through(session, clock, executors, later)
    assert replicas(cluster) == 2
    late = deliver(executors, undo)
    assert replicas(cluster) == 2, late


# The same with a reserve: the abandoned compensation's unreserve, delivered late, took
# off the reservation a newer reserve of the job made at the same generation.
def test_an_abandoned_unreserve_delivered_late_leaves_a_newer_reservation(
    session: Session,
    clock: FrozenClock,
    service_cluster: tuple[SimCluster, SimExecutors],
    reserve: int,
) -> None:
    cluster, executors = service_cluster
    _, after = given_up(session, clock, reserve)
    (unreserve,) = after
    action_service.abandon(session=session, action_id=reserve, by="ops", now=clock.now())
    later = newer(session, clock, reserve, ActionKind.reserve, target_placement={"a": 2})
    run_through(session, clock, executors, later)
    late = deliver(executors, unreserve)
    assert "chat" in cluster.reservations, late


# A migrate's source release is sent until answered. If the source's agent answered it once
# with "not now" and then went silent for good (the node removed), the step had an error,
# so it was not "stuck" and abandon refused: the action would run for ever, its job locked
# against every other action. Stuck now means MAX_ATTEMPTS sends more than answers.
def test_a_migrate_whose_source_said_not_now_then_vanished_can_be_abandoned(
    session: Session,
    clock: FrozenClock,
    lab: tuple[SimCluster, SimExecutors],  # noqa: F811
    migrate: int,  # noqa: F811
) -> None:
    _, executors = lab
    (message,) = saga.advance(session=session, action_id=migrate, now=clock.now())
    while message.kwargs["step"]["step"] != "release":
        answer = deliver(executors, message)
        assert answer["ok"], answer
        (message,) = record(session, clock, answer)
    step = message.kwargs["step"]
    busy = {
        "action_id": step["action_id"],
        "key": step["key"],
        "ok": False,
        "retryable": True,
        "error": "release: the image is busy",
        "executor": message.queue,
        "generation": step["generation"],
    }
    (again,) = record(session, clock, busy)
    for _ in range(3):  # node a gone for good: nothing answers any more
        (again,) = timed_out(session, clock, migrate)
    assert state(session, migrate) == ActionState.running
    action = action_service.abandon(session=session, action_id=migrate, by="ops", now=clock.now())
    assert action.state == ActionState.failed


# A migrate abandoned while its source's release went unanswered ended failed with its
# job's record as before it: the job held its GPUs on the source node and none on the
# target, where its confirm saw it run, so the next plan counted b's GPUs free (and a's
# taken) until the cluster's telemetry said otherwise. It is recorded at its target now,
# as a finished migrate is (app.actions.placements).
def test_an_abandoned_migrate_records_the_job_at_its_target(
    session: Session,
    clock: FrozenClock,
    lab: tuple[SimCluster, SimExecutors],  # noqa: F811
    migrate: int,  # noqa: F811
) -> None:
    _, executors = lab
    action = session.get(Action, migrate)
    assert action is not None and action.job_id is not None
    nodes = add_nodes(session, clock, action.cluster_id, ("a", "b"), 8)
    held = Allocation(
        job_id=action.job_id,
        node_id=nodes["a"],
        gpu_indices=[0, 1, 2, 3],
        gpu_count=4,
        started_at=clock.now(),
    )
    session.add(held)
    session.commit()
    (message,) = saga.advance(session=session, action_id=migrate, now=clock.now())
    while message.kwargs["step"]["step"] != "release":
        answer = deliver(executors, message)
        assert answer["ok"], answer
        (message,) = record(session, clock, answer)
    for _ in range(3):  # node a gone for good
        timed_out(session, clock, migrate)
    action_service.abandon(session=session, action_id=migrate, by="ops", now=clock.now())
    session.expire_all()
    open_on = set(
        session.exec(
            select(Allocation.node_id).where(
                Allocation.job_id == action.job_id, col(Allocation.released_at).is_(None)
            )
        ).all()
    )
    assert open_on == {nodes["b"]}


# Every action of a plan waits while a reserve of the plan is under way
# (action_service.waits_for_reservations). A reserve given up for want of an answer
# compensates with an unreserve sent until answered, and one to a connector still cut off
# kept every other group of the plan waiting, even those that never touch it, until it
# was back or an operator abandoned the reserve. A compensating reserve has failed: it
# holds up its own group only, as one that ended failed does.
def test_a_reserve_compensating_against_a_silent_connector_does_not_hold_up_its_plan(
    session: Session,
    clock: FrozenClock,
    service_cluster: tuple[SimCluster, SimExecutors],
    reserve: int,
) -> None:
    holding = session.get(Action, reserve)
    assert holding is not None
    plan = Plan(
        cluster_id=holding.cluster_id,
        created_at=clock.now(),
        policy="test",
        engine="test",
        mode="enforce",
        status="optimal",
        state=PlanState.approved,
    )
    session.add(plan)
    session.flush()
    other = Job(
        cluster_id=holding.cluster_id,
        external_id="batch",
        state=JobState.running,
        gpus_requested=2,
        updated_at=clock.now(),
    )
    session.add(other)
    session.flush()
    holding.plan_id = plan.id
    session.add(holding)
    elsewhere = action_on(
        session, clock, other, ActionKind.requeue, key="another-group", plan_id=plan.id
    )
    given_up(session, clock, reserve)  # the connector cut off
    for _ in range(5):  # ... and still: its unreserve goes unanswered
        timed_out(session, clock, reserve)
    assert state(session, reserve) == ActionState.compensating
    saga.advance(session=session, action_id=elsewhere, now=clock.now())
    assert state(session, elsewhere) == ActionState.running
