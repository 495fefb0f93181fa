"""Plans acting as one, on the embedded default: a simulated cluster (its scheduler, node
agents and connector answered in-process, as in ``shaper demo``), the real shaping cycle,
the API, and the in-process saga tasks, on SQLite and on PostgreSQL.

The cluster: two 8-GPU nodes, each half held by a checkpointable job, and an 8-GPU job
that strict FIFO cannot place. Shaper's plan moves one half-job next to the other and
starts the big job where it was. A rival job that FIFO would put first is submitted the
moment the move frees its GPUs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine
from sqlmodel import Session, col, select

from app.actions import local, saga, tasks
from app.actions import service as action_service
from app.actions.models import Action, ActionKind, ActionState, ActionStep
from app.actions.router import get_dispatcher
from app.clusters import service as cluster_service
from app.clusters.models import ClusterCreate, ShapingMode
from app.core.errors import Conflict
from app.jobs.models import Job
from app.plans import service as plan_service
from app.plans.models import Plan, PlanState
from app.shaping.cycle import run_cycle
from app.telemetry import service as telemetry_service
from connectors.sim import SimCluster, SimExecutors, SiteSpec
from connectors.sim.cluster import ServiceSpec
from tests.support.live_server import app_on, tokens_for
from wire.telemetry import JobKind, JobReport, SchedulerKind, TelemetrySnapshot

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
CLUSTER = "lab"


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


def _spec(*, honours_reservations: bool = True, services: tuple[ServiceSpec, ...] = ()) -> SiteSpec:
    return SiteSpec(
        name=CLUSTER,
        nodes=(("a", "H100", 8), ("b", "H100", 8)),
        teams=("research",),
        kinds=(JobKind.training,),
        services=services,
        arrivals_per_hour=0,
        honours_reservations=honours_reservations,
    )


def _report(job_id: str, gpus: int, *, submitted: datetime, priority: int = 10) -> JobReport:
    return JobReport(
        external_id=job_id,
        team="research",
        gpus_requested=gpus,
        checkpointable=True,
        priority=priority,
        submit_time=submitted,
    )


class Site:
    """One simulated cluster wired to the control plane as ``shaper demo`` wires it."""

    def __init__(self, engine: Engine, tmp_path: Path, spec: SiteSpec, mode: ShapingMode) -> None:
        self.engine = engine
        self.clock = Clock()
        self.cluster = SimCluster(spec, start=T0, seed=1, clock=self.clock)
        self.executors = SimExecutors(self.cluster, state_dir=tmp_path / "executors")
        self.seq = 0
        self.after_step: dict[str, Any] = {}
        with Session(engine) as session:
            cluster_service.register_cluster(
                session=session,
                now=T0,
                cluster_in=ClusterCreate(name=CLUSTER, scheduler=SchedulerKind.sim, mode=mode),
            )

    def handle(self, queue: str, step: dict[str, Any]) -> dict[str, Any]:
        answer = self.executors.handle(queue, step)
        hook = self.after_step.pop(step["step"], None)
        if hook is not None and answer["ok"]:
            hook()
        return answer

    def push(self) -> None:
        state = self.cluster.read_state()
        self.seq += 1
        with Session(self.engine) as session:
            telemetry_service.ingest(
                session=session,
                cluster_name=CLUSTER,
                push=TelemetrySnapshot.of(state, connector_session="test", seq=self.seq),
                now=self.clock.now,
            )

    def cycle(self, policy: str = "shaper") -> Any:
        self.push()
        with Session(self.engine, expire_on_commit=False) as session:
            return run_cycle(
                session=session, cluster_name=CLUSTER, now=self.clock.now, policy=policy
            )

    def run_sagas(self, rounds: int = 200) -> None:
        """What the in-process beat does: sweep until nothing is left to advance (a
        confirm's polls come back on timer threads meanwhile)."""
        for _ in range(rounds):
            self.clock.now += timedelta(seconds=5)
            if tasks.sweep() == 0:
                return
            time.sleep(0.02)
        with Session(self.engine) as session:
            left = session.exec(select(Action)).all()
        raise AssertionError(f"sagas still running: {[(a.id, a.kind, a.state) for a in left]}")

    def states(self) -> dict[str, tuple[str, list[str]]]:
        return {
            j.external_id: (j.state.value, sorted(a.node for a in j.allocations))
            for j in self.cluster.read_state().jobs
        }

    def actions(self, plan_id: int) -> list[Action]:
        with Session(self.engine) as session:
            return list(
                session.exec(
                    select(Action).where(Action.plan_id == plan_id).order_by(col(Action.id))
                )
            )


@pytest.fixture
def site_factory(
    committed_engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Any]:
    """Sites on the committed database; the in-process tasks use it too."""
    monkeypatch.setattr(tasks, "get_engine", lambda: committed_engine)
    # The simulated scheduler answers at once: poll and retry it quickly.
    monkeypatch.setattr(saga, "CONFIRM_POLL_S", 0.05)
    monkeypatch.setattr(saga, "RETRY_BACKOFF_S", (0.05,))
    registered: list[str] = []

    def make(mode: ShapingMode = ShapingMode.advise, **spec: Any) -> Site:
        site = Site(committed_engine, tmp_path, _spec(**spec), mode)
        for prefix in site.executors.queues():
            local.register(prefix, site.handle)
            registered.append(prefix)
        return site

    yield make
    for prefix in registered:
        local.unregister(prefix)


def _fragment(site: Site) -> None:
    site.cluster.submit(_report("left", 4, submitted=T0), timedelta(hours=4))
    site.cluster.submit(_report("right", 4, submitted=T0), timedelta(hours=4))
    site.cluster.requeue("right", nodes=["b"])  # first fit put both on a
    site.clock.now = T0 + timedelta(minutes=30)
    site.cluster.submit(
        _report("big", 8, submitted=site.clock.now, priority=50), timedelta(hours=2)
    )
    assert site.states()["big"] == ("pending", [])


def test_an_approved_plan_runs_in_dependency_order_and_keeps_the_freed_gpus(
    site_factory: Any, committed_engine: Engine
) -> None:
    site = site_factory()
    _fragment(site)
    result = site.cycle()
    actions = site.actions(result.plan_id)
    by_kind = {a.kind: [x for x in actions if x.kind == a.kind] for a in actions}
    (start,) = by_kind[ActionKind.start]
    (move,) = by_kind[ActionKind.migrate]
    assert {a.state for a in actions} == {ActionState.proposed}
    # The start waits for the move (it frees the GPUs) and for its reservation.
    assert move.id in start.depends_on
    holds = {a.job_id: a for a in by_kind[ActionKind.reserve]}
    assert holds[start.job_id].id in start.depends_on
    assert holds[start.job_id].id in move.depends_on  # held before anything frees them
    assert f"frees GPUs for big (start, action {start.id})" in move.reason
    assert move.reason.startswith(f"plan {result.plan_id}: ")
    moved = move.source_node
    assert moved is not None and start.target_node == moved

    # The worst moment: the move's checkpoint has just freed its GPUs; a rival that
    # strict FIFO puts ahead of the big job (submitted earlier) arrives.
    site.after_step["checkpoint"] = lambda: site.cluster.submit(
        _report("rival", 4, submitted=T0 - timedelta(hours=1)), timedelta(hours=1)
    )
    with TestClient(app_on(committed_engine)) as client:
        client.app.dependency_overrides[get_dispatcher] = lambda: lambda action_id: None  # type: ignore[attr-defined]
        with Session(committed_engine) as session:
            token = tokens_for(session, T0, ["operator"])["operator"]
        response = client.post(
            f"/api/v1/plans/{result.plan_id}/approve",
            headers={"Authorization": f"Bearer {token}"},
        )
        assert response.status_code == 200, response.text
        assert response.json()["state"] == "approved"
        site.run_sagas()
        listed = client.get(
            "/api/v1/actions",
            params={"plan_id": result.plan_id},
            headers={"Authorization": f"Bearer {token}"},
        ).json()["items"]

    assert {a["state"] for a in listed} == {"succeeded"}, listed
    for action in listed:
        assert action["created_at"] and action["decided_at"] and action["finished_at"]
        assert action["decided_by"] == "operator"
    finished = {a["id"]: a["finished_at"] for a in listed}
    for action in listed:
        for prerequisite in action["depends_on"]:
            assert finished[prerequisite] <= finished[action["id"]]
    states = site.states()
    assert states["big"] == ("running", [moved])  # where the plan put it
    assert states["rival"] == ("pending", [])  # the freed GPUs were not its to take
    (other,) = {"a", "b"} - {moved}
    assert states["left"] == states["right"] == ("running", [other])
    with Session(committed_engine) as session:
        moved_job = session.get(Job, move.job_id)
        assert moved_job is not None
    # The move kept its work: 30 minutes done before the checkpoint.
    assert site.cluster.jobs[moved_job.external_id].done >= timedelta(minutes=30)
    assert site.cluster.reservations == {}  # consumed when the jobs started

    site.push()
    with Session(committed_engine) as session:
        site.cycle()
        plan = session.get(Plan, result.plan_id)
        assert plan is not None and plan.state == PlanState.finished


def test_a_move_that_loses_target_and_source_leaves_no_job_stranded(
    site_factory: Any, committed_engine: Engine
) -> None:
    """The demo's case, on a scheduler that cannot hold GPUs (as the demo's could not):
    once the move's checkpoint frees them, a rival takes the target's GPUs and FIFO the
    source's. Neither restore can succeed; nothing claims success; the start that
    depended on the move is cancelled with the reason; the moved job goes back to its
    scheduler's queue with its checkpoint, shown as displaced, goes first, and runs again
    from its checkpoint."""
    site = site_factory(honours_reservations=False)
    _fragment(site)
    result = site.cycle()
    site.after_step["checkpoint"] = lambda: site.cluster.submit(
        _report("rival", 4, submitted=T0 - timedelta(hours=1)), timedelta(hours=1)
    )
    with Session(committed_engine) as session:
        plan_service.decide_plan(
            session=session, plan_id=result.plan_id, approve=True, by="operator", now=T0
        )
    site.run_sagas()
    actions = {a.kind: a for a in site.actions(result.plan_id)}
    start, move = actions[ActionKind.start], actions[ActionKind.migrate]
    with Session(committed_engine) as session:
        moved = session.get(Job, move.job_id)
        assert moved is not None
    states = site.states()
    assert move.state == ActionState.compensated, move.error
    assert "compensation restore" in (move.error or "") and "resume on connector.lab" in (
        move.error or ""
    )
    assert start.state == ActionState.cancelled
    assert f"action {move.id} (migrate) of the same plan is compensated" in (start.error or "")
    assert states[moved.external_id] == ("pending", [])  # queued, not suspended and forgotten
    assert moved.displaced_at is not None and "checkpoint" in (moved.displaced_reason or "")
    work_done = site.cluster.jobs[moved.external_id].done
    assert work_done >= timedelta(minutes=30)

    # The next plan puts it first; it runs again as soon as GPUs free, from its checkpoint.
    again = site.cycle()
    with Session(committed_engine) as session:
        plan = session.get(Plan, again.plan_id)
        assert plan is not None
    waits = [d for d in plan.decisions if d["job"] == moved.external_id]
    assert waits and waits[0]["message"].startswith("past its max queue wait"), waits
    site.clock.now += timedelta(hours=1, minutes=5)  # the rival ends
    site.cycle()
    site.run_sagas()
    site.clock.now += timedelta(minutes=1)
    site.cycle()
    assert site.states()[moved.external_id][0] == "running"
    assert site.cluster.jobs[moved.external_id].done >= work_done
    with Session(committed_engine) as session:
        back = session.get(Job, move.job_id)
        assert back is not None and back.displaced_at is None


def test_a_plan_holds_all_its_gpus_before_any_of_its_actions_lets_the_queue_move(
    site_factory: Any, committed_engine: Engine
) -> None:
    """The demo's first plan, small: its start of the job at the head of the FIFO queue
    unblocks the queue, and the native scheduler's next job takes free GPUs that another
    start of the same plan was given. Every reservation of a plan is in place before any
    of its other actions runs, whichever of its independent groups goes first."""
    site = site_factory(mode=ShapingMode.enforce)

    def submit(job_id: str, gpus: int, priority: int, *, then_minutes: int = 1) -> None:
        site.cluster.advance_to(site.clock.now)
        report = _report(job_id, gpus, submitted=site.clock.now, priority=priority)
        site.cluster.submit(report.model_copy(update={"checkpointable": False}), timedelta(hours=4))
        site.clock.now += timedelta(minutes=then_minutes)

    submit("bulk", 8, priority=10)  # first fit: all of a
    submit("steady", 4, priority=100, then_minutes=30)  # half of b
    submit("head", 8, priority=100)  # fits nowhere: blocks the queue
    submit("filler", 1, priority=10)  # behind it; the plan leaves it waiting
    submit("urgent", 4, priority=100)  # the plan starts it on b's free half
    assert site.states()["filler"] == ("pending", [])
    result = site.cycle()
    actions = site.actions(result.plan_id)
    takers = {a.job_id: a for a in actions if a.kind == ActionKind.start}
    with Session(committed_engine) as session:
        names = {j.id: j.external_id for j in session.exec(select(Job)).all()}
    starts = {names[job_id]: (a.target_node, a.id) for job_id, a in takers.items()}
    assert {job: node for job, (node, _) in starts.items()} == {"head": "a", "urgent": "b"}
    # The head's group alone first (its reservation, the preemption, its start), as the
    # sweep ran the demo's first groups before the later ones had held anything.
    head = {starts["head"][1]}
    head |= {p for a in actions if a.id in head for p in a.depends_on}
    head |= {p for a in actions if a.id in head for p in a.depends_on}
    assert sorted(a.kind for a in actions if a.id in head) == ["preempt", "reserve", "start"]
    for _ in range(20):
        for action_id in sorted(head):
            tasks.advance(action_id)
        site.clock.now += timedelta(seconds=5)
        time.sleep(0.02)
    site.run_sagas()
    done = {a.id: (a.kind, a.state, a.error) for a in site.actions(result.plan_id)}
    assert {state for _, state, _ in done.values()} == {ActionState.succeeded}, done
    states = site.states()
    assert states["head"] == ("running", ["a"])
    assert states["urgent"] == ("running", ["b"])
    assert states["filler"] == ("pending", [])  # the plan's GPUs were not its to take


@pytest.mark.parametrize("mode", [ShapingMode.enforce, ShapingMode.advise])
def test_a_services_replica_moves_off_a_node_for_a_gang_and_comes_back_after_it(
    site_factory: Any, committed_engine: Engine, mode: ShapingMode
) -> None:
    """A service runs one 2-GPU replica on each node; b also runs a 4-GPU job that cannot
    checkpoint, so the 8-GPU job fits only on a, once the service's replica there has
    gone. The plan moves that replica to b; carried out as the scheduler can: the service
    shrinks off a (the connector names the node), the big job starts there, then the
    service grows back to two replicas, which can only land on b. A cycle that runs before
    any of it has (the service still on a and b, where the growth back does not start
    from) leaves the plan standing."""
    site = site_factory(
        mode=mode,
        services=(ServiceSpec(name="svc", peak_replicas=2, gpus_per_replica=2),),
    )
    _service_in_the_way(site)

    result = site.cycle()
    actions = site.actions(result.plan_id)
    resizes = [a for a in actions if a.kind == ActionKind.resize]
    (start,) = [a for a in actions if a.kind == ActionKind.start]
    assert [(a.source_placement, a.target_placement, a.target_replicas) for a in resizes] == [
        ({"a": 2, "b": 2}, {"b": 2}, 1),
        ({"b": 2}, {"b": 4}, 2),
    ]
    shrink, back = resizes
    assert shrink.id in start.depends_on and start.target_node == "a"
    assert {shrink.id, start.id} <= set(back.depends_on)
    assert back.idempotency_key.endswith(":resize:2")

    site.clock.now += timedelta(seconds=30)
    site.cycle()
    assert {a.state for a in site.actions(result.plan_id)} == {
        ActionState.approved if mode is ShapingMode.enforce else ActionState.proposed
    }
    if mode is ShapingMode.advise:
        with Session(committed_engine) as session:
            plan_service.decide_plan(
                session=session, plan_id=result.plan_id, approve=True, by="operator", now=T0
            )
    site.run_sagas()
    done = {a.id: a for a in site.actions(result.plan_id)}
    assert {a.state for a in done.values()} == {ActionState.succeeded}, [
        (a.kind, a.state, a.error) for a in done.values()
    ]
    assert done[shrink.id].finished_at <= done[start.id].finished_at  # type: ignore[operator]
    assert done[start.id].finished_at <= done[back.id].finished_at  # type: ignore[operator]
    with Session(committed_engine) as session:
        confirmed = session.exec(
            select(ActionStep).where(
                ActionStep.action_id == shrink.id, ActionStep.name == "confirm"
            )
        ).one()
    # The shrink's confirm read the GPUs the service left on a, not only its nodes.
    assert "(GPUs a: 0)" in confirmed.result["summary"], confirmed.result
    states = site.states()
    assert states["big"] == ("running", ["a"])
    assert states["svc"] == ("running", ["b"])  # back to two replicas, both on b
    assert site.cluster.jobs["svc"].report.replicas == 2
    assert len(site.cluster.jobs["svc"].placement["b"]) == 4


def _service_in_the_way(site: Site) -> None:
    """The service's replicas one on a and one on b; b also runs a 4-GPU job that cannot
    checkpoint; an 8-GPU job waits."""
    service = site.cluster.jobs["svc"]
    service.resized = True  # its own autoscaler leaves it to Shaper from now on
    service.placement = {"a": [0, 1], "b": [0, 1]}
    fixed = _report("fixed", 4, submitted=T0).model_copy(update={"checkpointable": False})
    site.cluster.submit(fixed, timedelta(hours=8))
    site.cluster.requeue("fixed", nodes=["b"])
    site.clock.now = T0 + timedelta(minutes=30)
    site.cluster.submit(
        _report("big", 8, submitted=site.clock.now, priority=50), timedelta(hours=2)
    )
    assert site.states()["fixed"] == ("running", ["b"])
    assert site.states()["big"] == ("pending", [])


@pytest.mark.parametrize("approved", [ActionKind.start, ActionKind.resize])
def test_approving_part_of_a_replica_move_approves_the_growth_back_too(
    site_factory: Any, committed_engine: Engine, approved: ActionKind
) -> None:
    """An operator who approves the big job's start (or the service's shrink) approves what
    it waits for and the service's growth back: approved alone, the shrink would leave the
    service short until the proposal expired."""
    site = site_factory(services=(ServiceSpec(name="svc", peak_replicas=2, gpus_per_replica=2),))
    _service_in_the_way(site)
    result = site.cycle()
    first = next(a for a in site.actions(result.plan_id) if a.kind == approved)
    with Session(committed_engine) as session:
        action_service.transition(
            session=session, action_id=first.id, to=ActionState.approved, by="operator", now=T0
        )
    assert {(a.kind, a.state) for a in site.actions(result.plan_id)} == {
        (ActionKind.resize, ActionState.approved),
        (ActionKind.start, ActionState.approved),
        (ActionKind.reserve, ActionState.approved),
    }
    site.run_sagas()
    assert {a.state for a in site.actions(result.plan_id)} == {ActionState.succeeded}
    assert site.states()["big"] == ("running", ["a"])
    assert site.cluster.jobs["svc"].report.replicas == 2


def test_two_operators_approving_two_parts_of_one_move_at_once_do_not_deadlock(
    site_factory: Any, committed_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One operator approves the start while another approves the shrink. Each approval
    locks the other's action too (it approves the whole move): holding their own first,
    they waited for each other and PostgreSQL aborted one with a deadlock. The plan is now
    locked first, so the second waits for the first and finds its action approved."""
    site = site_factory(services=(ServiceSpec(name="svc", peak_replicas=2, gpus_per_replica=2),))
    _service_in_the_way(site)
    result = site.cycle()
    actions = site.actions(result.plan_id)
    start = next(a for a in actions if a.kind == ActionKind.start)
    shrink = next(a for a in actions if a.kind == ActionKind.resize)
    # Both hold their own action before either reaches for the other's (without the plan
    # lock); with it, the second never gets there while the first waits here.
    both_locked = threading.Barrier(2)
    with_followers = action_service._with_followers

    def after_a_pause(session: Session, action: Action) -> list[Action]:
        try:
            both_locked.wait(timeout=2)
        except threading.BrokenBarrierError:
            pass
        return with_followers(session, action)

    monkeypatch.setattr(action_service, "_with_followers", after_a_pause)
    outcomes: dict[int, str] = {}

    def approve(action_id: int) -> None:
        with Session(committed_engine) as session:
            try:
                action_service.transition(
                    session=session,
                    action_id=action_id,
                    to=ActionState.approved,
                    by=f"operator-{action_id}",
                    now=T0,
                )
                outcomes[action_id] = "approved"
            except Conflict as exc:
                outcomes[action_id] = f"conflict: {exc}"
            except Exception as exc:  # the deadlock, or anything else unexpected
                outcomes[action_id] = f"error: {type(exc).__name__}: {exc}"

    threads = [threading.Thread(target=approve, args=(a.id,)) for a in (start, shrink)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not [o for o in outcomes.values() if o.startswith("error")], outcomes
    # One approved the whole move; the other found its action already approved.
    assert sorted(o.split(":")[0] for o in outcomes.values()) == ["approved", "conflict"]
    assert {(a.kind, a.state) for a in site.actions(result.plan_id)} == {
        (ActionKind.resize, ActionState.approved),
        (ActionKind.start, ActionState.approved),
        (ActionKind.reserve, ActionState.approved),
    }


def test_a_moved_service_grows_back_when_the_start_it_made_room_for_is_withdrawn(
    site_factory: Any, committed_engine: Engine
) -> None:
    """The operator withdraws the start while the shrink runs (the job was deleted, or
    they changed their mind). The growth back fell with it and the service stayed short
    until a later plan grew it again (in advise mode, until an operator approved one);
    it now runs once the shrink is done."""
    site = site_factory(services=(ServiceSpec(name="svc", peak_replicas=2, gpus_per_replica=2),))
    _service_in_the_way(site)
    result = site.cycle()
    start = next(a for a in site.actions(result.plan_id) if a.kind == ActionKind.start)
    with Session(committed_engine) as session:
        plan_service.decide_plan(
            session=session, plan_id=result.plan_id, approve=True, by="operator", now=T0
        )

    def withdraw_the_start() -> None:  # once the shrink's first step is done
        with Session(committed_engine) as session:
            action_service.transition(
                session=session, action_id=start.id, to=ActionState.cancelled, by="ops", now=T0
            )

    site.after_step["resize"] = withdraw_the_start
    site.run_sagas()
    outcome = {(a.kind, a.state) for a in site.actions(result.plan_id)}
    assert (ActionKind.start, ActionState.cancelled) in outcome
    resizes = [a for a in site.actions(result.plan_id) if a.kind == ActionKind.resize]
    assert [a.state for a in resizes] == [ActionState.succeeded, ActionState.succeeded]
    assert site.cluster.jobs["svc"].report.replicas == 2
    # (big may start all the same: its scheduler starts it on the GPUs the shrink freed.)
