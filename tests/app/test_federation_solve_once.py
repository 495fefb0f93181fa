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
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine
from sqlmodel import Session, col, select

from app.actions.models import Action, ActionKind, ActionState
from app.clusters import service as cluster_service
from app.clusters.models import Cluster, ClusterUpdate, ShapingMode
from app.core.config import get_settings
from app.federation import planning
from app.federation import service as federation_service
from app.federation.models import FederationGroupCreate
from app.jobs.models import Job
from app.plans.models import Plan
from app.shaping import cycle, snapshot, tasks
from app.shaping.cycle import FEDERATION_GROUP_KEY
from tests.app.test_federation_moves import GROUP, T0, Clock, Member
from tests.app.test_federation_moves import _report as moves_report
from wire.telemetry import JobReport


def _report(job_id: str, gpus: int, priority: int) -> JobReport:
    return moves_report(job_id, gpus).model_copy(update={"priority": priority})


class Site:
    """The group (east, west) and a cluster outside it (solo), planned by the shaping task."""

    def __init__(self, engine: Engine, members: dict[str, Member], clock: Clock) -> None:
        self.engine, self.members, self.clock = engine, members, clock

    def cycle(self) -> dict[str, int]:
        for member in self.members.values():
            member.push()
        return tasks.run_shaping_cycles()

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
        west_mode: ShapingMode = ShapingMode.advise,
        running: bool = False,
        west_full: bool = False,
        incoming: bool = False,
    ) -> Site:
        settings = get_settings().model_copy(update={"federation_solve_once": once})
        monkeypatch.setattr(tasks, "get_settings", lambda: settings)
        clock = Clock()
        modes = {"east": ShapingMode.advise, "west": west_mode, "solo": ShapingMode.advise}
        members = {n: Member(committed_engine, tmp_path, n, clock, m) for n, m in modes.items()}
        with Session(committed_engine) as session:
            federation_service.create_group(
                session=session, group_in=FederationGroupCreate(name=GROUP), now=T0, actor=None
            )
            for name in ("east", "west"):
                federation_service.add_cluster(
                    session=session, name=GROUP, cluster=name, now=T0, actor=None
                )
        east, west = members["east"].cluster, members["west"].cluster
        if incoming:  # west full with an urgent job waiting; east's node held by low work
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
            {"low": "running"}
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
        site.solves = solves  # type: ignore[attr-defined]
        return site

    yield make


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
