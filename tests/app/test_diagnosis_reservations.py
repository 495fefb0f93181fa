"""Plans' reservations in the why-idle diagnosis: a hand-built history whose reserved
GPU-hours are worked out by hand, for each way a reservation ends."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, select

from app.actions.messages import RESERVATION_TTL_S
from app.actions.models import Action, ActionKind, ActionState, ActionStep, StepState
from app.clusters.models import Cluster
from app.core.clock import FrozenClock
from app.core.lookup import row_id
from app.jobs.models import Job
from app.plans.models import Plan, PlanState
from tests.app.builders import job, node, running, snapshot
from tests.support.clock import T0
from wire.steps import StepPhase

URL = "/api/v1/diagnosis"
TELEMETRY = "/api/v1/clusters/alpha/telemetry"
WINDOW = {
    "cluster": "alpha",
    "since": T0.isoformat(),
    "until": (T0 + timedelta(hours=2)).isoformat(),
}
P_STARTS = T0 + timedelta(minutes=75)


def _at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


@dataclass(frozen=True)
class Ending:
    """How the reservation of job p's 4 GPUs on n2 (plan 1) ends, and the GPU-hours it
    holds in the window (4 GPUs × its hours there)."""

    reserved_at: datetime
    start_state: ActionState  # the plan's start of p
    start_finished: datetime | None
    unreserve: tuple[ActionState, datetime] | None
    reserved_gpu_hours: float


ENDINGS = {
    # p starts on n2 at 1:15: the scheduler spends the reservation (the start's own end,
    # at 1:20, comes later).
    "spent by the job's start": Ending(_at(30), ActionState.succeeded, _at(80), None, 4 * 0.75),
    # The plan gave it back at 1:00 (its unreserve's step finished then).
    "given back": Ending(
        _at(30), ActionState.succeeded, _at(80), (ActionState.succeeded, _at(60)), 4 * 0.5
    ),
    # The start was cancelled at 0:45 and nothing of the plan was left to run: the plan
    # ended then (the scheduler started p on its own later).
    "its plan ended": Ending(_at(30), ActionState.cancelled, _at(45), None, 4 * 0.25),
    # The give-back failed at 0:50: the plan ended with it, not with the failed give-back's
    # intent.
    "its plan ended, give-back failed": Ending(
        _at(30), ActionState.cancelled, _at(45), (ActionState.failed, _at(50)), 4 * (20 / 60)
    ),
    # Reserved 40 minutes before the window and never given back: it lapses after its
    # time to live, 20 minutes in.
    "lapsed": Ending(_at(-40), ActionState.running, None, None, 4 * (20 / 60)),
}


def _history(client: TestClient, auth: dict, clock: FrozenClock) -> None:
    """Two 8-GPU H100 nodes. Job a (team x) holds n1's GPUs 0-3 throughout; job p (team
    y, 4 GPUs) waits from 0:00 and starts on n2's GPUs 0-3 at 1:15. No samples: what is
    held counts busy."""
    created = client.post(
        "/api/v1/clusters", headers=auth["admin"], json={"name": "alpha", "scheduler": "sim"}
    )
    assert created.status_code == 201, created.text
    nodes = [node("n1"), node("n2")]
    a = running("a", "n1", [0, 1, 2, 3], team="x")
    waiting = job("p", team="y", gpus_requested=4)
    started = job(
        "p",
        team="y",
        gpus_requested=4,
        state="running",
        start_time=P_STARTS.isoformat(),
        allocations=[{"node": "n2", "gpu_indices": [0, 1, 2, 3]}],
    )
    for seq, (moment, jobs) in enumerate(
        [(T0, [a, waiting]), (P_STARTS, [a, started]), (_at(120), [a, started])], start=1
    ):
        clock.advance((moment - clock.now()).total_seconds())
        response = client.post(
            TELEMETRY,
            headers=auth["connector_alpha"],
            json=snapshot(seq, nodes=nodes, jobs=jobs),
        )
        assert response.status_code == 200, response.text


def _action(
    session: Session,
    plan: Plan,
    kind: ActionKind,
    state: ActionState,
    finished: datetime | None,
    *,
    step: str | None = None,
    placement: dict[str, int] | None = None,
) -> Action:
    """An action of ``plan`` on job p, ended at ``finished``; with ``step``, its one
    connector step, ended then too, as the saga records them."""
    p = session.exec(select(Job).where(Job.external_id == "p")).one()
    created = plan.created_at
    action = Action(
        plan_id=plan.id,
        cluster_id=p.cluster_id,
        job_id=row_id(p),
        kind=kind,
        state=state,
        idempotency_key=f"alpha:{plan.id}:p:{kind.value}",
        target_node=",".join(sorted(placement or {})) or None,
        target_placement=placement or {},
        created_at=created,
        updated_at=finished or created,
        decided_by="shaper",
        decided_at=created,
        finished_at=finished,
    )
    session.add(action)
    session.flush()
    if step is not None:
        session.add(
            ActionStep(
                action_id=row_id(action),
                seq=0,
                phase=StepPhase.forward,
                name=step,
                queue="connector.alpha",
                state=StepState.succeeded if state is ActionState.succeeded else StepState.failed,
                idempotency_key=f"{action.idempotency_key}:forward:{step}",
                attempts=1,
                sent_at=created,
                finished_at=finished,
            )
        )
    return action


def _plan(session: Session, ending: Ending) -> None:
    cluster_id = session.exec(select(Cluster.id).where(Cluster.name == "alpha")).one()
    created = ending.reserved_at - timedelta(minutes=1)
    plan = Plan(
        cluster_id=cluster_id,
        created_at=created,
        policy="shaper",
        engine="cp-sat",
        mode="enforce",
        status="OPTIMAL",
        state=PlanState.approved,
    )
    session.add(plan)
    session.flush()
    _action(
        session,
        plan,
        ActionKind.reserve,
        ActionState.succeeded,
        ending.reserved_at,
        step="reserve",
        placement={"n2": 4},
    )
    _action(session, plan, ActionKind.start, ending.start_state, ending.start_finished)
    if ending.unreserve is not None:
        state, at = ending.unreserve
        _action(
            session, plan, ActionKind.unreserve, state, at, step="unreserve", placement={"n2": 4}
        )
    session.commit()


def _causes(client: TestClient, auth: dict) -> dict:
    response = client.get(URL, headers=auth["viewer"], params=WINDOW)
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


@pytest.mark.parametrize("ending", list(ENDINGS.values()), ids=list(ENDINGS))
def test_reserved_gpu_hours_worked_out_by_hand(
    client: TestClient, auth: dict, clock: FrozenClock, session: Session, ending: Ending
) -> None:
    """With r reserved GPU-hours: capacity 32 (2 nodes × 8 × 2 h), busy 11 (a: 4 × 2 h,
    p: 4 × 0.75 h), idle 21. n1's 4 free GPUs wait on p until 1:15 (queue_order, 5) and
    then on nobody (no_demand, 3); n2's 8 until 1:15 are r reserved and 10 − r
    queue_order, its 4 free after that no_demand (3)."""
    assert RESERVATION_TTL_S == 3600  # the "lapsed" figures assume an hour
    _history(client, auth, clock)
    _plan(session, ending)
    body = _causes(client, auth)
    r = ending.reserved_gpu_hours
    causes = {c["cause"]: c["gpu_hours"] for c in body["causes"] if c["gpu_hours"]}
    assert causes == pytest.approx({"reservation": r, "queue_order": 15 - r, "no_demand": 6.0})
    assert (body["capacity_gpu_hours"], body["busy_gpu_hours"]) == (32.0, 11.0)
    assert sum(c["gpu_hours"] for c in body["causes"]) == pytest.approx(body["idle_gpu_hours"])
    assert body["idle_gpu_hours"] == pytest.approx(21.0)
    teams = {(t["key"], t["cause"]): t["gpu_hours"] for t in body["by_team"]}
    assert teams[("y", "reservation")] == pytest.approx(r)  # held for p's team


def test_without_a_succeeded_reservation_nothing_is_reserved(
    client: TestClient, auth: dict, clock: FrozenClock, session: Session
) -> None:
    """A reserve the connector refused holds nothing: n2's free GPUs wait on the queue."""
    _history(client, auth, clock)
    cluster_id = session.exec(select(Cluster.id).where(Cluster.name == "alpha")).one()
    plan = Plan(
        cluster_id=cluster_id,
        created_at=_at(20),
        policy="shaper",
        engine="cp-sat",
        mode="enforce",
        status="OPTIMAL",
        state=PlanState.finished,
    )
    session.add(plan)
    session.flush()
    _action(
        session,
        plan,
        ActionKind.reserve,
        ActionState.failed,
        _at(30),
        step="reserve",
        placement={"n2": 4},
    )
    session.commit()
    causes = {c["cause"]: c["gpu_hours"] for c in _causes(client, auth)["causes"]}
    assert causes["reservation"] == 0.0 and causes["queue_order"] == 15.0


def test_a_later_reservation_replaces_the_earlier_one(
    client: TestClient, auth: dict, clock: FrozenClock, session: Session
) -> None:
    """Plan 1 holds n2:4 for p from 0:30; plan 2 holds n1:4 for p from 1:00, which
    replaces it (a scheduler keeps one reservation per job). p starts on n2, not n1, so
    n1's lasts to the window's end (plan 2's start has not ended). Reserved: n2 4 × 0.5 h
    + n1 4 × 1 h = 6; n1's free GPUs wait on p for the first hour (queue_order 4), n2's
    8 until 1:15 less the reserved (10 − 2); no_demand: n2's 4 after 1:15 (3)."""
    _history(client, auth, clock)
    _plan(session, ENDINGS["spent by the job's start"])
    cluster_id = session.exec(select(Cluster.id).where(Cluster.name == "alpha")).one()
    later = Plan(
        cluster_id=cluster_id,
        created_at=_at(55),
        policy="shaper",
        engine="cp-sat",
        mode="enforce",
        status="OPTIMAL",
        state=PlanState.approved,
    )
    session.add(later)
    session.flush()
    _action(
        session,
        later,
        ActionKind.reserve,
        ActionState.succeeded,
        _at(60),
        step="reserve",
        placement={"n1": 4},
    )
    _action(session, later, ActionKind.start, ActionState.running, None)
    session.commit()
    body = _causes(client, auth)
    causes = {c["cause"]: c["gpu_hours"] for c in body["causes"] if c["gpu_hours"]}
    assert causes == pytest.approx({"reservation": 6.0, "queue_order": 12.0, "no_demand": 3.0})
    assert body["idle_gpu_hours"] == pytest.approx(21.0)
    models = {(m["key"], m["cause"]): m["gpu_hours"] for m in body["by_gpu_model"]}
    assert models[("H100", "reservation")] == pytest.approx(6.0)
