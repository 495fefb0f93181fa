"""A federation group's plan moving a *running* job to another cluster (issue 16), on the
embedded default: two simulated clusters as in ``test_federation_moves``, the group's
planning and the move actions it proposes, on SQLite and on PostgreSQL.

``east`` has one 8-GPU node: a small checkpointable job runs on 2 of its GPUs and an 8-GPU
gang waits behind it. ``west``'s 8-GPU node has 4 GPUs free (a job that cannot checkpoint
holds the rest), room for the small job but not for the gang. The group plan moves the
small job from east1 to west1 so that the gang can start at east.

A running job lands only where the target's scheduler starts the resubmitted job pinned to
the node its checkpoint is staged on (``app.actions.recipes``); a simulated cluster's does
not, so the group never plans such a move onto one — the tests that check the actions a
plan proposes let ``west`` count as one that does (``planning.lands_pinned``). The saga of
a running move runs end to end on two real Slurm clusters
(``tests/connectors/test_slurm_federation.py``); on simulated ones it is refused.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine
from sqlmodel import Session, col, select

from app.actions import local, recipes, saga, tasks
from app.actions.models import ActionKind, ActionState, ActionStep
from app.clusters import service as cluster_service
from app.clusters.models import ClusterUpdate, ShapingMode
from app.federation import planning
from app.federation import service as federation_service
from app.federation.models import FederationGroupCreate
from app.jobs.models import Allocation
from tests.app.test_federation_moves import GROUP, T0, Clock, Group, Member, _report
from wire.telemetry import JobState


@pytest.fixture
def group_factory(
    committed_engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., Group]]:
    monkeypatch.setattr(tasks, "get_engine", lambda: committed_engine)
    monkeypatch.setattr(tasks, "_timings", lambda: {"step_timeout_s": 0.3, "start_wait_s": 5.0})
    monkeypatch.setattr(saga, "CONFIRM_POLL_S", 0.05)
    monkeypatch.setattr(saga, "RETRY_BACKOFF_S", (0.05,))
    registered: list[str] = []

    def make(
        mode: ShapingMode = ShapingMode.advise, *, west_pins: bool = True, **fields: object
    ) -> Group:
        if west_pins:
            monkeypatch.setattr(planning, "lands_pinned", lambda scheduler: True)
        clock = Clock()
        east = Member(committed_engine, tmp_path, "east", clock, mode)
        west = Member(committed_engine, tmp_path, "west", clock, mode)
        for member in (east, west):
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
        small = _report("small", 2).model_copy(update=fields)
        east.cluster.submit(small, timedelta(hours=10))
        east.cluster.submit(_report("gang", 8), timedelta(hours=1))
        # West's resident cannot checkpoint: it stays (moved to east, it would let the
        # gang start at west instead).
        resident = _report("resident", 4).model_copy(update={"checkpointable": False})
        west.cluster.submit(resident, timedelta(hours=10))
        clock.now = T0 + timedelta(hours=1)
        assert east.states() == {"small": "running", "gang": "pending"}
        assert west.states() == {"resident": "running"}
        return Group(committed_engine, east, west)

    yield make
    for prefix in registered:
        local.unregister(prefix)


def test_the_plan_proposes_moving_the_small_job_from_its_node_to_one_at_west(
    group_factory: Callable[..., Group],
) -> None:
    group = group_factory()
    outcome = group.plan()
    assert len(outcome.proposed) == 1 and outcome.approved == [], outcome
    action = group.action(outcome.proposed[0])
    assert action.kind == ActionKind.move and action.state == ActionState.proposed
    assert action.job_id == group.job("east", "small").id
    assert (action.source_node, action.target_node) == ("east1", "west1")
    assert action.target_cluster_id is not None and action.target_cluster_id != action.cluster_id
    assert action.decided_by is None
    assert "job small moves from east1 in east to west1 in west" in action.reason
    # Planned again before anyone decided: the same proposal, not a second one.
    again = group.plan()
    assert again.proposed == [] and again.kept == 1 and again.superseded == 0


def test_enforce_in_both_clusters_approves_it_and_observe_only_plans(
    group_factory: Callable[..., Group],
) -> None:
    group = group_factory(ShapingMode.observe)
    outcome = group.plan()
    assert outcome.proposed == outcome.approved == []
    assert outcome.skipped == {"east/small": "east is in observe mode: it only plans"}
    with Session(group.engine) as session:
        for name in ("east", "west"):
            cluster_service.update_cluster(
                session=session,
                name=name,
                cluster_in=ClusterUpdate(mode=ShapingMode.enforce),
                now=T0,
            )
    outcome = group.plan()
    assert outcome.proposed == [] and len(outcome.approved) == 1
    action = group.action(outcome.approved[0])
    assert action.state == ActionState.approved and action.decided_by == "shaper"
    assert (action.source_node, action.target_node) == ("east1", "west1")


def test_a_proposal_is_superseded_once_the_gang_no_longer_waits(
    group_factory: Callable[..., Group],
) -> None:
    group = group_factory()
    (action_id,) = group.plan().proposed
    group.east.cluster.cancel("gang")
    outcome = group.plan()
    assert outcome.superseded == 1 and outcome.proposed == []
    action = group.action(action_id)
    assert action.state == ActionState.cancelled
    assert (action.error or "").startswith("superseded")


def test_no_running_move_onto_a_cluster_whose_scheduler_does_not_pin_jobs(
    group_factory: Callable[..., Group],
) -> None:
    group = group_factory(west_pins=False)
    outcome = group.plan()
    assert outcome.proposed == outcome.approved == [] and outcome.skipped == {}


def test_a_job_that_cannot_checkpoint_is_not_moved(group_factory: Callable[..., Group]) -> None:
    group = group_factory(checkpointable=False)
    outcome = group.plan()
    assert outcome.proposed == outcome.approved == [] and outcome.skipped == {}


def test_the_simulated_clusters_refuse_to_carry_out_a_running_move(
    group_factory: Callable[..., Group],
) -> None:
    # Their scheduler does not start a job pinned to a node: the saga is refused before
    # any step runs, and the job keeps running at east.
    group = group_factory()
    (action_id,) = group.plan().proposed
    group.approve(action_id)
    group.run_sagas()
    action = group.action(action_id)
    assert action.state == ActionState.cancelled, (action.state, action.error)
    assert "west runs sim" in (action.error or "")
    assert group.steps(action_id) == []
    assert group.east.states()["small"] == "running"


def test_no_proposal_for_a_job_its_scheduler_moved_since_the_solve(
    group_factory: Callable[..., Group], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The solve saw the small job on east1; by the time the proposal is written it runs
    elsewhere (its scheduler requeued it after a node failed): the checkpoint would be asked
    of an agent where it no longer runs, so nothing is proposed, and the reason says so."""
    solve = planning.solve_group

    def seen_elsewhere(**kwargs: Any) -> planning.GroupSolve:
        solved = solve(**kwargs)
        for move in solved.moves:
            move.source_node = "east9"
        return solved

    monkeypatch.setattr("app.federation.moves.solve_group", seen_elsewhere)
    group = group_factory()
    outcome = group.plan()
    assert outcome.proposed == [] and outcome.approved == []
    assert outcome.skipped == {"east/small": "the job runs on east1 now, not on east9"}


@pytest.mark.parametrize(
    ("stuck", "queue", "left_at_home"),
    [
        ("cancel", "connector.east", "its copy at east was never confirmed cancelled"),
        (
            "release",
            "agent.east.east1",
            "its checkpoint image at the source (agent.east.east1) was never confirmed deleted",
        ),
    ],
)
def test_a_running_move_stuck_on_its_last_steps_at_home_can_be_abandoned_once_stuck(
    group_factory: Callable[..., Group],
    monkeypatch: pytest.MonkeyPatch,
    stuck: str,
    queue: str,
    left_at_home: str,
) -> None:
    """The running job's move carried out (west's scheduler counts as one that starts a job
    pinned to a node, ``recipes.places_itself``) up to one of its last steps at east —
    the cancel of the home copy, or the release of the checkpoint on east1 — which east
    never answers nor runs (cut off): it is resent for ever, so only an operator ends the
    move. Refused while the step has been sent fewer than MAX_ATTEMPTS times; then the
    action fails saying where the job runs and what to check at home, nothing more is
    sent, and the rows say the job is west's, running there, and no longer holds east's
    GPUs. (The pending job's case: test_federation_moves.)"""
    monkeypatch.setattr(recipes, "places_itself", lambda scheduler: True)
    group = group_factory()
    (action_id,) = group.plan().proposed
    home = group.east.cluster.jobs["small"]

    def unanswered(step: dict[str, Any]) -> dict[str, Any]:
        # Not run, and the answer that comes back is for no step the saga sent.
        return {
            "action_id": step["action_id"],
            "key": f"{step['key']}:never",
            "ok": True,
            "executor": queue,
            "generation": step["generation"],
        }

    group.east.faults[stuck] = unanswered
    group.approve(action_id)

    def sends() -> int:
        with Session(group.engine) as session:
            step = session.exec(
                select(ActionStep).where(
                    ActionStep.action_id == action_id,
                    ActionStep.name == stuck,
                    ActionStep.queue == queue,
                )
            ).first()  # no steps until the saga's first sweep
            return step.attempts if step is not None else 0

    refused_early = False
    deadline = time.monotonic() + 30
    while sends() < saga.MAX_ATTEMPTS and time.monotonic() < deadline:
        if sends() >= 1 and not refused_early:
            early = group.decide(action_id, "abandon")
            assert early.status_code == 409, early.text
            assert "only a compensating action, or a move waiting" in early.text
            refused_early = True
        tasks.sweep()
        time.sleep(0.05)
    assert refused_early and sends() >= saga.MAX_ATTEMPTS
    assert group.action(action_id).state == ActionState.running
    response = group.decide(action_id, "abandon")
    assert response.status_code == 200, response.text
    action = group.action(action_id)
    assert action.state == ActionState.failed
    assert f"unanswered sends of {stuck} to {queue}" in (action.error or "")
    assert "the job runs at west as job west-in1" in (action.error or "")
    assert left_at_home in (action.error or "")
    sent = group.east.seen.count(stuck)
    time.sleep(1.0)
    tasks.sweep()
    assert group.east.seen.count(stuck) == sent  # the saga stopped
    assert group.west.states() == {"resident": "running", "west-in1": "running"}
    assert home.state is not JobState.running  # checkpointed off east1: it runs once, at west
    again = group.decide(action_id, "abandon")
    assert again.status_code == 409  # failed now: nothing left to abandon
    moved, arrived = group.job("east", "small"), group.job("west", "west-in1")
    assert moved.state == JobState.cancelled
    assert moved.reason.startswith(f"moved to west as job west-in1 by action {action_id}")
    # Only a home copy whose cancel went unconfirmed is marked so (plans leave it alone).
    assert ("was never confirmed cancelled" in moved.reason) == (stuck == "cancel")
    assert arrived.generation >= action.fencing_token
    with Session(group.engine) as session:
        held_at_home = session.exec(
            select(Allocation).where(
                Allocation.job_id == moved.id, col(Allocation.released_at).is_(None)
            )
        ).all()
    assert held_at_home == []  # east's GPUs are free for the gang
