"""A federation group solved once per shaping period (issue 16,
``Settings.federation_solve_once``): each member's plan is its slice of the group's one
solve, so a job gets one decision — a start at home or a move — and the plans persisted
are the slices of that solve; a cluster outside the group is planned alone; one member's
failure leaves the others planned. On SQLite and on PostgreSQL, through the shaping task
(``app.shaping.tasks.run_shaping_cycles``) over simulated clusters (as
``tests/app/test_federation_moves.py`` wires them).

``east`` is full: one 8-GPU node held by a low-priority checkpointable job, and an urgent
4-GPU job waits there; ``west`` is idle. Planned alone, east would requeue its running job
to start the urgent one; the group moves the urgent one to west instead. ``solo``, outside
the group, holds the same jobs as east.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine
from sqlmodel import Session, col, select

from app.actions import local, saga
from app.actions import service as action_service
from app.actions import tasks as action_tasks
from app.actions.models import Action, ActionKind, ActionState
from app.clusters import service as cluster_service
from app.clusters.models import Cluster, ClusterUpdate, ShapingMode
from app.core.config import get_settings
from app.core.lookup import row_id
from app.federation import planning
from app.federation import service as federation_service
from app.federation.models import FederationGroupCreate
from app.federation.moves import propose_moves
from app.jobs.models import Job
from app.plans.models import Plan
from app.shaping import cycle, snapshot, tasks
from app.shaping.cycle import FEDERATION_GROUP_KEY
from connectors.sim import SimExecutors
from tests.app.test_federation_moves import GROUP, T0, Clock, Group, Member
from tests.app.test_federation_moves import _report as moves_report
from tests.app.test_node_drain import _sim as two_node_cluster
from wire.telemetry import JobReport


def _report(job_id: str, gpus: int, priority: int) -> JobReport:
    return moves_report(job_id, gpus).model_copy(update={"priority": priority})


class TwoNodes(Member):
    """A member with two 8-GPU nodes, so that a job can move to another node of it."""

    def __init__(
        self, engine: Engine, tmp_path: Path, name: str, clock: Clock, mode: ShapingMode
    ) -> None:
        super().__init__(engine, tmp_path, name, clock, mode)
        self.cluster = two_node_cluster(name, clock)
        self.executors = SimExecutors(self.cluster, state_dir=tmp_path / name)


def _fragmented(member: Member) -> None:
    """Half of each node held by a checkpointable job (``a`` on node 1, ``b`` on node 2)
    and an 8-GPU job waiting: it starts only once one of them moves to the other node."""
    cluster = member.cluster
    cluster.submit(_report("a", 4, 10), timedelta(hours=10))
    cluster.submit(_report("x", 4, 10), timedelta(hours=10))  # fills node 1 ...
    cluster.submit(_report("b", 4, 10), timedelta(hours=10))
    cluster.cancel("x")  # ... until b has gone to node 2
    cluster.submit(_report("gang", 8, 10), timedelta(hours=1))


class Site:
    """The group (east, west) and a cluster outside it (solo), planned by the shaping task."""

    def __init__(self, engine: Engine, members: dict[str, Member], clock: Clock) -> None:
        self.engine, self.members, self.clock = engine, members, clock
        # How far ahead of the system clock the shaping task plans (``later``).
        self.ahead = timedelta(0)

    def now(self) -> datetime:
        """The shaping task's clock: the system clock (the sagas' too), ``ahead``."""
        return datetime.now(UTC) + self.ahead

    def later(self, by: timedelta) -> None:
        """The next period comes ``by`` later (past the dwell time of what was acted on)."""
        self.ahead += by
        self.clock.now += by

    def cycle(self) -> dict[str, int]:
        for member in self.members.values():
            member.push()
        return tasks.run_shaping_cycles()

    def run_sagas(self) -> None:
        """What the in-process beat does for the approved actions: run them to the end."""
        Group(self.engine, self.members["east"], self.members["west"]).run_sagas()
        for member in self.members.values():
            member.push()

    def decide(self, action_id: int, to: ActionState) -> None:
        """An operator's decision on an action, now (what its POST /actions/{id}/... does)."""
        with Session(self.engine) as session:
            action_service.transition(
                session=session, action_id=action_id, to=to, by="operator", now=self.now()
            )

    def moves(self, cluster: str) -> list[Action]:
        with Session(self.engine) as session:
            return list(
                session.exec(
                    select(Action)
                    .join(Cluster, col(Cluster.id) == col(Action.cluster_id))
                    .where(Cluster.name == cluster, Action.kind == ActionKind.move)
                    .order_by(col(Action.id))
                )
            )

    def plan(self, plan_id: int) -> Plan:
        with Session(self.engine) as session:
            plan = session.get(Plan, plan_id)
            assert plan is not None
            return plan

    def actions(self, cluster: str) -> list[tuple[str, str]]:
        """(kind, job) of every live action of ``cluster``, moves included."""
        with Session(self.engine) as session:
            rows = session.exec(
                select(Action.kind, Job.external_id)
                .join(Job, col(Job.id) == col(Action.job_id))
                .join(Cluster, col(Cluster.id) == col(Action.cluster_id))
                .where(Cluster.name == cluster, Action.state != ActionState.cancelled)
                .order_by(col(Action.id))
            )
            return [(str(kind), job) for kind, job in rows]

    def decided(self, cluster: str, job: str) -> list[str]:
        """Every decision acted on for ``job``: its plan's actions on it, and its moves."""
        holds = (ActionKind.reserve, ActionKind.unreserve)  # a start's, not a decision
        return [k for k, external in self.actions(cluster) if external == job and k not in holds]


@pytest.fixture
def site_factory(
    committed_engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., Site]]:
    monkeypatch.setattr(tasks, "get_engine", lambda: committed_engine)
    # Enforce mode's sagas, run in-process (as ``test_federation_moves`` runs them).
    monkeypatch.setattr(action_tasks, "get_engine", lambda: committed_engine)
    monkeypatch.setattr(
        action_tasks, "_timings", lambda: {"step_timeout_s": 0.3, "start_wait_s": 5.0}
    )
    monkeypatch.setattr(saga, "CONFIRM_POLL_S", 0.05)
    monkeypatch.setattr(saga, "RETRY_BACKOFF_S", (0.05,))
    registered: list[str] = []
    solves: list[planning.GroupSolve] = []
    real_solve = planning.solve_group

    def solve_group(**kwargs: Any) -> planning.GroupSolve:
        solved = real_solve(**kwargs)
        solves.append(solved)
        return solved

    # Recorded, not replaced: the tests compare the plans with the solve they came from.
    monkeypatch.setattr(tasks, "solve_group", solve_group)
    monkeypatch.setattr("app.federation.moves.solve_group", solve_group)

    def make(
        *,
        once: bool = True,
        mode: ShapingMode = ShapingMode.advise,
        west_mode: ShapingMode | None = None,
        running: bool = False,
        west_full: bool = False,
        incoming: bool = False,
        fragmented: bool = False,
    ) -> Site:
        settings = get_settings().model_copy(update={"federation_solve_once": once})
        monkeypatch.setattr(tasks, "get_settings", lambda: settings)
        clock = Clock()
        modes = {"east": mode, "west": west_mode or mode, "solo": ShapingMode.advise}
        kinds = {"east": TwoNodes, "west": TwoNodes} if fragmented else {}
        members = {
            n: kinds.get(n, Member)(committed_engine, tmp_path, n, clock, m)
            for n, m in modes.items()
        }
        for member in members.values():
            for prefix in member.executors.queues():
                local.register(prefix, member.handle)
                registered.append(prefix)
        with Session(committed_engine) as session:
            federation_service.create_group(
                session=session, group_in=FederationGroupCreate(name=GROUP), now=T0, actor=None
            )
            for name in ("east", "west"):
                federation_service.add_cluster(
                    session=session, name=GROUP, cluster=name, now=T0, actor=None
                )
        east, west = members["east"].cluster, members["west"].cluster
        if fragmented:  # both members alike
            _fragmented(members["east"])
            _fragmented(members["west"])
        elif incoming:  # west full with an urgent job waiting; east's node held by low work
            east.submit(_report("low", 8, 0), timedelta(hours=10))
            full = _report("resident", 8, 10).model_copy(update={"checkpointable": False})
            west.submit(full, timedelta(hours=10))
            west.submit(_report("wurgent", 4, 1000), timedelta(hours=1))
        elif running:
            east.submit(_report("small", 2, 10), timedelta(hours=10))
            east.submit(_report("gang", 8, 10), timedelta(hours=1))
            resident = _report("resident", 4, 10).model_copy(update={"checkpointable": False})
            west.submit(resident, timedelta(hours=10))
        else:
            if west_full:  # nothing can go there
                full = _report("resident", 8, 10).model_copy(update={"checkpointable": False})
                west.submit(full, timedelta(hours=10))
            east.submit(_report("low", 8, 0), timedelta(hours=10))
            east.submit(_report("urgent", 4, 1000), timedelta(hours=1))
        members["solo"].cluster.submit(_report("low", 8, 0), timedelta(hours=10))
        members["solo"].cluster.submit(_report("urgent", 4, 1000), timedelta(hours=1))
        clock.now = T0 + timedelta(minutes=10)
        expected = (
            {"a": "running", "b": "running", "x": "cancelled", "gang": "pending"}
            if fragmented
            else {"low": "running"}
            if incoming
            else {"small": "running", "gang": "pending"}
            if running
            else {
                "low": "running",
                "urgent": "pending",
            }
        )
        assert members["east"].states() == expected
        site = Site(committed_engine, members, clock)
        monkeypatch.setattr(tasks, "SystemClock", lambda: site)
        site.solves = solves  # type: ignore[attr-defined]
        return site

    yield make
    for prefix in registered:
        local.unregister(prefix)


def _slice_decisions(solved: planning.GroupSolve, cluster: str) -> list[dict[str, Any]]:
    mine = planning.member_plan(solved, cluster)
    return cycle._decisions(mine.plan, dict(mine.held)) + mine.notes


def test_a_job_of_a_full_member_gets_one_decision_from_the_one_solve(
    site_factory: Callable[..., Site],
) -> None:
    site = site_factory()
    planned = site.cycle()
    solves: list[planning.GroupSolve] = site.solves  # type: ignore[attr-defined]
    assert len(solves) == 1  # the group once; its members not again
    (solved,) = solves
    # One decision for the urgent job: the group's move to west; east does not requeue
    # its running job for it.
    assert [(m.from_cluster, m.job, m.to_cluster) for m in solved.moves] == [
        ("east", "urgent", "west")
    ]
    assert site.decided("east", "urgent") == [ActionKind.move]
    assert site.decided("east", "low") == []
    # The members' plans are the solve's slices, and say so.
    for name in ("east", "west"):
        plan = site.plan(planned[name])
        assert plan.summary[FEDERATION_GROUP_KEY] == GROUP
        assert plan.status != "invalid", plan.summary["violations"]
        assert plan.decisions == _slice_decisions(solved, name)
    east = site.plan(planned["east"]).decisions
    assert [(d["job"], d["action"], d.get("cluster")) for d in east] == [("urgent", "move", "west")]
    # Outside the group, the same jobs are planned alone, as before: in its own cluster.
    solo = site.plan(planned["solo"])
    assert FEDERATION_GROUP_KEY not in solo.summary
    assert sorted((d["job"], d["action"]) for d in solo.decisions if d["action"] != "wait") == [
        ("low", "requeue"),
        ("urgent", "start"),
    ]


def test_planned_apart_the_full_member_decides_otherwise_than_its_group(
    site_factory: Callable[..., Site],
) -> None:
    """Today's way (the setting off): east's own solve requeues its running job to start
    the urgent one, the group's solve moves it; the move is dropped, the plan stands."""
    site = site_factory(once=False)
    planned = site.cycle()
    solves: list[planning.GroupSolve] = site.solves  # type: ignore[attr-defined]
    (solved,) = solves
    assert [(m.from_cluster, m.job) for m in solved.moves] == [("east", "urgent")]
    assert FEDERATION_GROUP_KEY not in site.plan(planned["east"]).summary
    assert sorted(site.decided("east", "low")) == [ActionKind.requeue]
    assert site.decided("east", "urgent") == [ActionKind.start]


def test_a_member_whose_cycle_fails_leaves_the_other_planned(
    site_factory: Callable[..., Site], monkeypatch: pytest.MonkeyPatch
) -> None:
    site = site_factory()
    real = snapshot.take_snapshot

    def take_snapshot(*, cluster_name: str, **kwargs: Any) -> Any:
        if cluster_name == "west":
            raise RuntimeError("west's snapshot failed")
        return real(cluster_name=cluster_name, **kwargs)

    monkeypatch.setattr("app.shaping.cycle.take_snapshot", take_snapshot)
    planned = site.cycle()
    assert sorted(planned) == ["east", "solo"]
    solves: list[planning.GroupSolve] = site.solves  # type: ignore[attr-defined]
    assert solves == []  # one member left: planned alone, nothing to move
    east = site.plan(planned["east"])
    assert FEDERATION_GROUP_KEY not in east.summary
    assert site.decided("east", "urgent") == [ActionKind.start]


def test_a_member_in_observe_mode_only_plans_and_receives_no_job(
    site_factory: Callable[..., Site],
) -> None:
    site = site_factory(west_mode=ShapingMode.observe)
    planned = site.cycle()
    solves: list[planning.GroupSolve] = site.solves  # type: ignore[attr-defined]
    (solved,) = solves
    assert solved.moves == []
    assert "west only plan (observe mode)" in solved.stays["east/urgent"]
    # East acts on its own slice: no move to a cluster that cannot take it.
    assert site.decided("east", "urgent") == [ActionKind.start]
    west = site.plan(planned["west"])
    assert west.summary[FEDERATION_GROUP_KEY] == GROUP and west.mode == ShapingMode.observe
    assert site.actions("west") == []


def test_a_start_on_gpus_a_running_move_frees_waits_for_the_move(
    site_factory: Callable[..., Site], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The group moves east's small running job to west so that an 8-GPU gang can start on
    its node (as in ``test_federation_running_moves``; west's scheduler counts as one that
    starts a job pinned to a node): east's plan does not start the gang before the move has
    freed the GPUs — it is deferred, naming the move — and its plan stays valid."""
    monkeypatch.setattr(planning, "lands_pinned", lambda scheduler: True)
    site = site_factory(running=True)
    planned = site.cycle()
    (solved,) = site.solves  # type: ignore[attr-defined]
    assert [(m.job, m.source_node, m.to_cluster) for m in solved.moves] == [
        ("small", "east1", "west")
    ]
    plan = site.plan(planned["east"])
    assert plan.status != "invalid", plan.summary["violations"]
    (gang,) = (d for d in plan.decisions if d["job"] == "gang")
    assert gang["action"] == "deferred"
    assert "GPUs on east1 free once job small moves to west" in gang["message"]
    assert site.decided("east", "small") == [ActionKind.move]
    assert site.decided("east", "gang") == []


def test_a_member_planning_with_its_own_policy_keeps_the_group_planned_apart(
    site_factory: Callable[..., Site],
) -> None:
    """West plans with ``fifo``: the group's one solve would plan it with shaper, so the
    group is planned as with the setting off — each member by its own solve, then the
    group's moves (east's own solve requeues and starts, the move is dropped)."""
    site = site_factory()
    with Session(site.engine) as session:
        cluster_service.update_cluster(
            session=session, name="west", cluster_in=ClusterUpdate(policy="fifo"), now=T0
        )
    planned = site.cycle()
    assert sorted(planned) == ["east", "solo", "west"]
    for name in ("east", "west"):
        assert FEDERATION_GROUP_KEY not in site.plan(planned[name]).summary
    assert site.plan(planned["west"]).policy == "fifo"
    assert site.decided("east", "urgent") == [ActionKind.start]
    assert site.decided("east", "low") == [ActionKind.requeue]


def _migrations_within(site: Site, plan_id: int, cluster: str) -> list[tuple[str, str, str]]:
    """(job, from, to) of every migration of the plan from a node of ``cluster`` to another."""
    nodes = {f"{cluster}1", f"{cluster}2"}
    return [
        (d["job"], d["from"], d["to"])
        for d in site.plan(plan_id).decisions
        if d["action"] == "migrate" and {d["from"], d["to"]} <= nodes
    ]


def test_a_member_whose_scheduler_cannot_pin_a_job_is_solved_with_its_group(
    site_factory: Callable[..., Site],
) -> None:
    """West's scheduler is Kueue, which cannot be told where a job goes: the group is still
    solved once, and migrations within its members go on where they can be made. Both
    members hold the same fragmented jobs (an 8-GPU job waits while two checkpointable
    4-GPU jobs hold half of each node): east moves one of its jobs to the other node and
    starts the waiting one; west's jobs are never moved within west (they are not
    ``migratable``: its scheduler would put a resubmitted job where it likes)."""
    site = site_factory(fragmented=True)
    with Session(site.engine) as session:
        west = session.exec(select(Cluster).where(Cluster.name == "west")).one()
        west.scheduler = "kueue"
        session.add(west)
        session.commit()
    planned = site.cycle()
    solves: list[planning.GroupSolve] = site.solves  # type: ignore[attr-defined]
    assert len(solves) == 1  # the group once; its members not again
    (solved,) = solves
    assert solved.instance.config.migration  # one config for the group: migrations on
    assert {j.migratable for j in solved.instance.jobs if j.id.startswith("west/")} == {False}
    assert {j.migratable for j in solved.instance.jobs if j.id.startswith("east/")} == {True}
    for name in ("east", "west"):
        plan = site.plan(planned[name])
        assert plan.summary[FEDERATION_GROUP_KEY] == GROUP
        assert plan.status != "invalid", plan.summary["violations"]
        assert plan.decisions == _slice_decisions(solved, name)
    # East still migrates within itself, to start its waiting job.
    (moved,) = _migrations_within(site, planned["east"], "east")
    assert moved[0] in ("a", "b")
    assert site.decided("east", "gang") == [ActionKind.start]
    assert site.decided("east", moved[0]) == [ActionKind.migrate]
    # West, alike, moves nothing within itself (and nothing of it moves to full east).
    assert _migrations_within(site, planned["west"], "west") == []
    assert ActionKind.migrate not in [kind for kind, _ in site.actions("west")]
    assert solved.moves == []


def test_a_member_s_proposal_from_the_group_is_kept_the_next_period(
    site_factory: Callable[..., Site],
) -> None:
    """West is full too: the group's solve requeues east's low-priority job and starts the
    urgent one at home — east's own plan, proposed. The next period's solve makes the same
    plan: the proposal is kept (same plan, same actions), not made again."""
    site = site_factory(west_full=True)
    first = site.cycle()
    east = site.plan(first["east"])
    assert east.summary[FEDERATION_GROUP_KEY] == GROUP and east.state == "proposed"
    assert site.decided("east", "low") == [ActionKind.requeue]
    assert site.decided("east", "urgent") == [ActionKind.start]
    site.clock.now += timedelta(seconds=30)
    second = site.cycle()
    assert second["east"] == first["east"]
    assert site.plan(second["east"]).checked_at > east.checked_at
    assert site.decided("east", "low") == [ActionKind.requeue]
    assert site.decided("east", "urgent") == [ActionKind.start]
    solves: list[planning.GroupSolve] = site.solves  # type: ignore[attr-defined]
    assert len(solves) == 2 and all(s.moves == [] for s in solves)


def test_a_stop_for_another_member_s_incoming_job_waits_for_it_to_arrive(
    site_factory: Callable[..., Site],
) -> None:
    """The group moves west's urgent job onto east's node and stops east's low work for it.
    The move is west's action, approved or dropped on its own: east's plan holds the stop
    (found by review: it ran in enforce mode even when the move never came)."""
    site = site_factory(incoming=True)
    planned = site.cycle()
    solves: list[planning.GroupSolve] = site.solves  # type: ignore[attr-defined]
    (solved,) = solves
    assert [(m.from_cluster, m.job, m.to_cluster) for m in solved.moves] == [
        ("west", "wurgent", "east")
    ]
    # The group plan stops low to make room; east's slice holds that stop.
    assert any(a.job_id == "east/low" for a in solved.plan.actions)
    mine = planning.member_plan(solved, "east")
    held = [mine.plan.actions[i] for i in mine.held]
    assert [(a.job_id, a.kind) for a in held if a.job_id == "east/low"]
    assert all("moves here" in why for why in dict(mine.held).values())
    assert site.decided("east", "low") == []
    assert site.decided("west", "wurgent") == [ActionKind.move]
    plan = site.plan(planned["east"])
    assert plan.status != "invalid", plan.summary["violations"]


def test_an_invalid_group_plan_leaves_its_members_planned_apart(
    site_factory: Callable[..., Site], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A violation in the group's one plan (one member's bad data) stalls no member: each is
    planned by its own solve this period, then the group's moves, as with the setting off."""
    site = site_factory()
    recorded = tasks.solve_group

    def invalid(**kwargs: Any) -> planning.GroupSolve:
        solved = recorded(**kwargs)
        if kwargs.get("for_members"):
            return dataclasses.replace(solved, violations=["a violation (forced by the test)"])
        return solved

    monkeypatch.setattr(tasks, "solve_group", invalid)
    planned = site.cycle()
    east = site.plan(planned["east"])
    assert FEDERATION_GROUP_KEY not in east.summary
    assert east.status != "invalid", east.summary["violations"]
    assert site.decided("east", "urgent") == [ActionKind.start]
    assert sorted(site.decided("east", "low")) == [ActionKind.requeue]


def _approve_mid_solve(
    site: Site, monkeypatch: pytest.MonkeyPatch, action_id: int
) -> list[planning.GroupSolve]:
    """The next group solve is followed, before anything of it is persisted, by an
    operator's approval of ``action_id`` (a move proposed by the period before)."""
    recorded = tasks.solve_group
    seen: list[planning.GroupSolve] = []

    def solve_then_approve(**kwargs: Any) -> planning.GroupSolve:
        solved = recorded(**kwargs)
        if kwargs.get("for_members") and not seen:
            site.decide(action_id, ActionState.approved)
        seen.append(solved)
        return solved

    monkeypatch.setattr(tasks, "solve_group", solve_then_approve)
    return seen


def test_a_move_approved_while_the_group_is_solved_holds_what_conflicts_with_it(
    site_factory: Callable[..., Site], monkeypatch: pytest.MonkeyPatch
) -> None:
    """East's urgent job's move to west is proposed; then west fills: a low job runs on
    west1 and an urgent 8-GPU job waits there. The next solve plans urgent at home (requeue
    low) and west's urgent job on west1 (requeue wlow), and the operator approves the old
    move while it runs. The move will run: east does not also start urgent at home, and
    west does not start its job on the GPUs the move goes to — both held, naming it."""
    site = site_factory()
    site.cycle()
    (move,) = site.moves("east")
    assert (move.state, move.target_node) == (ActionState.proposed, "west1")
    west = site.members["west"].cluster
    west.submit(_report("wlow", 4, 0), timedelta(hours=10))
    site.clock.now += timedelta(seconds=30)
    west.submit(_report("wurgent", 8, 1000), timedelta(hours=1))
    site.clock.now += timedelta(seconds=30)
    assert site.members["west"].states() == {"wlow": "running", "wurgent": "pending"}
    seen = _approve_mid_solve(site, monkeypatch, row_id(move))
    planned = site.cycle()
    (solved,) = seen
    # The solve did not see the approval: it plans both urgent jobs where they are.
    assert {(a.job_id, a.kind.value) for a in solved.plan.actions} >= {
        ("east/urgent", "start"),
        ("west/wurgent", "start"),
    }
    assert [a.state for a in site.moves("east")] == [ActionState.approved]
    assert site.decided("east", "urgent") == [ActionKind.move]
    assert site.decided("east", "low") == []
    assert site.decided("west", "wurgent") == []
    assert site.decided("west", "wlow") == []
    east, west_plan = site.plan(planned["east"]), site.plan(planned["west"])
    for plan in (east, west_plan):
        assert plan.status != "invalid", plan.summary["violations"]
    says = f"job urgent's move from east to west (action {move.id}) was approved while"
    (urgent,) = (d for d in east.decisions if d["job"] == "urgent" and d["action"] != "move")
    assert urgent["action"] == "deferred" and says in urgent["message"]
    (wurgent,) = (d for d in west_plan.decisions if d["job"] == "wurgent")
    assert wurgent["action"] == "deferred"
    assert f"GPUs on west1 go to {says}" in wurgent["message"]


def test_a_member_that_leaves_the_group_while_it_is_solved_is_planned_alone(
    site_factory: Callable[..., Site], monkeypatch: pytest.MonkeyPatch
) -> None:
    """East leaves the group after the solve has planned its urgent job's move to west:
    the move is not made, and east's plan is not the group's slice — east is planned
    alone this period (requeue, start), and the next period too."""
    site = site_factory()
    recorded = tasks.solve_group

    def solve_then_leave(**kwargs: Any) -> planning.GroupSolve:
        solved = recorded(**kwargs)
        with Session(site.engine) as session:
            federation_service.remove_cluster(
                session=session, name=GROUP, cluster="east", now=site.clock.now, actor=None
            )
        return solved

    monkeypatch.setattr(tasks, "solve_group", solve_then_leave)
    planned = site.cycle()
    solves: list[planning.GroupSolve] = site.solves  # type: ignore[attr-defined]
    (solved,) = solves
    assert [(m.job, m.to_cluster) for m in solved.moves] == [("urgent", "west")]
    assert site.moves("east") == []
    east = site.plan(planned["east"])
    assert FEDERATION_GROUP_KEY not in east.summary
    assert site.decided("east", "urgent") == [ActionKind.start]
    assert site.decided("east", "low") == [ActionKind.requeue]
    assert site.plan(planned["west"]).summary[FEDERATION_GROUP_KEY] == GROUP
    # The next period: a group of one is no group; east's own proposal is kept.
    site.clock.now += timedelta(seconds=30)
    after = site.cycle()
    assert len(solves) == 1
    assert after["east"] == planned["east"]
    assert FEDERATION_GROUP_KEY not in site.plan(after["west"]).summary


def test_a_rejected_move_is_not_made_again_and_the_job_is_planned_at_home(
    site_factory: Callable[..., Site],
) -> None:
    """An operator rejects the group's move of east's urgent job: the next solve does not
    move it to west again (that would leave it waiting, every period), east's slice starts
    it at home instead."""
    site = site_factory()
    site.cycle()
    (move,) = site.moves("east")
    site.decide(row_id(move), ActionState.rejected)
    site.clock.now += timedelta(seconds=30)
    planned = site.cycle()
    solves: list[planning.GroupSolve] = site.solves  # type: ignore[attr-defined]
    assert solves[-1].moves == []
    assert f"its move to west (action {move.id}) was rejected" in solves[-1].stays["east/urgent"]
    assert [a.state for a in site.moves("east")] == [ActionState.rejected]
    east = site.plan(planned["east"])
    assert east.summary[FEDERATION_GROUP_KEY] == GROUP and east.state == "proposed"
    assert site.decided("east", "urgent") == [ActionKind.move, ActionKind.start]
    assert site.decided("east", "low") == [ActionKind.requeue]


def _refuse(step: dict[str, Any]) -> dict[str, Any]:
    """West's answer to a submit: it cannot run the job."""
    answer = {key: step[key] for key in ("action_id", "key", "generation")}
    return {
        **answer,
        "ok": False,
        "error": "submit: west cannot run it",
        "executor": "connector.west",
    }


def test_enforced_a_move_that_fails_leaves_the_job_home_and_the_next_period_starts_it(
    site_factory: Callable[..., Site],
) -> None:
    """Both members enforce: the group's move of urgent to west is dispatched and west
    refuses the job. Meanwhile east's plan stopped nothing for it; the next period's solve
    does not move it there again, and east's slice, dispatched, starts it at home."""
    site = site_factory(mode=ShapingMode.enforce)
    site.members["west"].faults["submit"] = _refuse
    first = site.cycle()
    (move,) = site.moves("east")
    assert move.state == ActionState.approved and move.decided_by == "shaper"
    assert site.decided("east", "low") == []
    assert site.plan(first["east"]).status != "invalid"
    site.run_sagas()
    (move,) = site.moves("east")
    assert move.state == ActionState.compensated, move.error
    assert site.members["east"].states() == {"low": "running", "urgent": "pending"}
    site.later(timedelta(minutes=11))  # past the dwell of the failed move
    second = site.cycle()
    east = site.plan(second["east"])
    assert east.summary[FEDERATION_GROUP_KEY] == GROUP and east.state == "approved", (
        east.decisions,
        site.solves[-1].stays,  # type: ignore[attr-defined]
    )
    assert [a.state for a in site.moves("east")] == [ActionState.compensated]
    assert site.decided("east", "urgent") == [ActionKind.move, ActionKind.start]
    site.run_sagas()
    assert site.members["east"].states() == {"low": "pending", "urgent": "running"}


def test_enforced_a_job_moved_in_is_dispatched_and_the_stop_for_it_comes_once_it_is_there(
    site_factory: Callable[..., Site],
) -> None:
    """Both members enforce. West's urgent job is moved onto east's node, dispatched and
    carried out (held at west, submitted to east, confirmed, cancelled at west); east's
    stop of its low job for it is held meanwhile. Once the job has arrived, east's next
    slice requeues low and starts it, dispatched: it runs at east, once."""
    site = site_factory(mode=ShapingMode.enforce, incoming=True)
    site.cycle()
    (move,) = site.moves("west")
    assert move.state == ActionState.approved
    assert site.decided("east", "low") == []
    site.run_sagas()
    (move,) = site.moves("west")
    assert move.state == ActionState.succeeded, move.error
    assert site.members["west"].states() == {"resident": "running", "wurgent": "cancelled"}
    assert site.members["east"].states() == {"low": "running", "east-in1": "pending"}
    site.clock.now += timedelta(seconds=30)
    planned = site.cycle()
    east = site.plan(planned["east"])
    assert east.summary[FEDERATION_GROUP_KEY] == GROUP and east.state == "approved"
    assert site.decided("east", "low") == [ActionKind.requeue]
    assert site.decided("east", "east-in1") == [ActionKind.start]
    site.run_sagas()
    assert site.members["east"].states() == {"low": "pending", "east-in1": "running"}
    assert site.members["west"].states() == {"resident": "running", "wurgent": "cancelled"}


def test_a_kept_move_proposal_goes_where_the_latest_plan_puts_the_job(
    site_factory: Callable[..., Site],
) -> None:
    """A move still proposed is kept when the next plan makes it again, and follows that
    plan's target nodes: the members' slices of the plan leave those free for it, not the
    ones the period before planned (found on the demo's clusters: a kept move's node was
    given to a member's own start)."""
    site = site_factory()
    site.cycle()
    (move,) = site.moves("east")
    assert move.target_node == "west1"
    (solved,) = site.solves  # type: ignore[attr-defined]
    elsewhere = dataclasses.replace(
        solved, moves=[m.model_copy(update={"nodes": ["west2"]}) for m in solved.moves]
    )
    with Session(site.engine, expire_on_commit=False) as session:
        outcome = propose_moves(session=session, group=GROUP, now=site.now(), solved=elsewhere)
    assert outcome.kept == 1 and outcome.proposed == [] and outcome.superseded == 0
    (kept,) = site.moves("east")
    assert (kept.id, kept.state, kept.target_node) == (move.id, ActionState.proposed, "west2")
    assert "west has 4 GPUs for it on west2" in kept.reason


def test_no_new_move_overbooks_the_node_a_move_under_way_goes_to(
    site_factory: Callable[..., Site],
) -> None:
    """East's urgent job's move to west1 is approved and not carried out yet; west's
    snapshot does not show the job, so the next solve also moves east's new 8-GPU job onto
    west1. It is not made: west1 has 8 GPUs, not 12 (a move onto GPUs that fit is made)."""
    site = site_factory()
    site.cycle()
    (move,) = site.moves("east")
    site.decide(row_id(move), ActionState.approved)
    site.members["east"].cluster.submit(_report("big", 8, 1000), timedelta(hours=1))
    site.clock.now += timedelta(seconds=30)
    site.cycle()
    solves: list[planning.GroupSolve] = site.solves  # type: ignore[attr-defined]
    assert [(m.job, m.to_cluster, m.nodes) for m in solves[-1].moves] == [
        ("big", "west", ["west1"])
    ]
    assert [(a.id, a.state) for a in site.moves("east")] == [(move.id, ActionState.approved)]
    assert site.decided("west", "big") == [] and site.decided("east", "big") == []
