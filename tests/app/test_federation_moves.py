"""Moving a pending job to another cluster of its federation group, on the embedded default
(issue 16): two simulated clusters whose schedulers, connectors and step journals answer
in-process (as in ``shaper demo``), the group's planning, the API and the in-process saga
tasks, on SQLite and on PostgreSQL.

``east`` is full (one 8-GPU node held by a long job) and a 4-GPU job waits there;
``west`` is idle. The group plan moves the waiting job to ``west``: held at east,
submitted to west, confirmed there (west's scheduler holds its copy in a state it runs
from), cancelled at east. The faults are the ones a move must survive: a target that
refuses the job, one that takes it and then rejects it, or never says, answers lost on the
way back, a source that does not answer its cancel, a job that starts at home before the
hold takes effect, and one its user cancels at home mid-move.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine
from sqlmodel import Session, col, select

from app.actions import local, saga, tasks
from app.actions.models import Action, ActionKind, ActionState, ActionStep
from app.actions.router import get_dispatcher
from app.clusters import service as cluster_service
from app.clusters.models import ClusterCreate, ClusterUpdate, ShapingMode
from app.federation import service as federation_service
from app.federation.models import FederationGroupCreate
from app.federation.moves import propose_moves
from app.jobs.models import Job
from app.shaping.cycle import run_cycle
from app.telemetry import service as telemetry_service
from connectors.sim import SimCluster, SimExecutors, SiteSpec
from tests.support.live_server import app_on, tokens_for
from wire.steps import StepPhase
from wire.telemetry import JobKind, JobReport, JobState, SchedulerKind, TelemetrySnapshot

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
GROUP = "site"
LOST: dict[str, Any] = {}  # a fault's answer: the step runs, its answer is lost


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


class Member:
    """One simulated cluster of the group, wired as ``shaper demo`` wires its clusters."""

    def __init__(
        self, engine: Engine, tmp_path: Path, name: str, clock: Clock, mode: ShapingMode
    ) -> None:
        self.engine = engine
        self.name = name
        self.cluster = SimCluster(
            SiteSpec(
                name=name,
                nodes=((f"{name}1", "H100", 8),),
                teams=("research",),
                kinds=(JobKind.training,),
                arrivals_per_hour=0,
            ),
            start=T0,
            seed=1,
            clock=clock,
        )
        self.executors = SimExecutors(self.cluster, state_dir=tmp_path / name)
        self.seq = 0
        self.clock = clock
        # A step's fault: called with the step message; returns an answer to give instead
        # of running it (LOST: it ran, and its answer never arrives), or None to run it.
        self.faults: dict[str, Callable[[dict[str, Any]], dict[str, Any] | None]] = {}
        self.seen: list[str] = []
        with Session(engine) as session:
            cluster_service.register_cluster(
                session=session,
                now=T0,
                cluster_in=ClusterCreate(name=name, scheduler=SchedulerKind.sim, mode=mode),
            )

    def handle(self, queue: str, step: dict[str, Any]) -> dict[str, Any]:
        self.seen.append(step["step"])
        fault = self.faults.get(step["step"])
        if fault is not None:
            instead = fault(step)
            if instead is LOST:
                answer = self.executors.handle(queue, step)
                # Delivered in-process, an answer always arrives: one for a step the saga
                # never sent is what an answer that got lost leaves it (ignored, so the step
                # stays sent until it times out and is sent again).
                return {**answer, "key": f"{step['key']}:lost"}
            if instead is not None:
                return instead
        return self.executors.handle(queue, step)

    def push(self) -> None:
        self.seq += 1
        with Session(self.engine) as session:
            telemetry_service.ingest(
                session=session,
                cluster_name=self.name,
                push=TelemetrySnapshot.of(
                    self.cluster.read_state(), connector_session="test", seq=self.seq
                ),
                now=self.clock.now,
            )

    def states(self) -> dict[str, str]:
        return {j.external_id: j.state.value for j in self.cluster.read_state().jobs}


class Group:
    def __init__(self, engine: Engine, east: Member, west: Member) -> None:
        self.engine, self.east, self.west = engine, east, west

    def plan(self) -> Any:
        self.east.push()
        self.west.push()
        with Session(self.engine, expire_on_commit=False) as session:
            return propose_moves(session=session, group=GROUP, now=self.east.clock.now)

    def approve(self, action_id: int) -> None:
        response = self.decide(action_id, "approve")
        assert response.status_code == 200, response.text

    def decide(self, action_id: int, verb: str) -> Any:
        """An operator's POST /actions/{id}/{verb} through the API; its response."""
        with TestClient(app_on(self.engine)) as client:
            client.app.dependency_overrides[get_dispatcher] = lambda: lambda action_id: None  # type: ignore[attr-defined]
            with Session(self.engine) as session:
                token = tokens_for(session, T0, ["operator"])["operator"]
            return client.post(
                f"/api/v1/actions/{action_id}/{verb}",
                headers={"Authorization": f"Bearer {token}"},
            )

    def run_sagas(self, seconds: float = 20.0) -> None:
        """What the in-process beat does: sweep until nothing is left to advance (resends
        after a lost answer come back once their timeout has passed)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if tasks.sweep() == 0:
                return
            time.sleep(0.05)
        with Session(self.engine) as session:
            left = session.exec(select(Action)).all()
        raise AssertionError(f"sagas still running: {[(a.id, a.kind, a.state) for a in left]}")

    def action(self, action_id: int) -> Action:
        with Session(self.engine) as session:
            action = session.get(Action, action_id)
            assert action is not None
            return action

    def steps(self, action_id: int) -> list[tuple[str, str, str, str]]:
        with Session(self.engine) as session:
            rows = session.exec(
                select(ActionStep)
                .where(ActionStep.action_id == action_id)
                .order_by(col(ActionStep.seq))
            )
            return [(s.phase, s.name, s.queue, s.state) for s in rows]

    def job(self, cluster: str, external_id: str) -> Job:
        with Session(self.engine) as session:
            job = session.exec(select(Job).where(Job.external_id == external_id)).first()
            assert job is not None, f"{cluster}/{external_id} is not known"
            return job


def _report(job_id: str, gpus: int) -> JobReport:
    return JobReport(
        external_id=job_id,
        team="research",
        gpus_requested=gpus,
        checkpointable=True,
        priority=10,
        submit_time=T0,
    )


@pytest.fixture
def group_factory(
    committed_engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., Group]]:
    monkeypatch.setattr(tasks, "get_engine", lambda: committed_engine)
    # The simulated schedulers answer at once: resend lost steps and retry quickly.
    monkeypatch.setattr(tasks, "_timings", lambda: {"step_timeout_s": 0.3, "start_wait_s": 5.0})
    monkeypatch.setattr(saga, "CONFIRM_POLL_S", 0.05)
    monkeypatch.setattr(saga, "RETRY_BACKOFF_S", (0.05,))
    registered: list[str] = []

    def make(mode: ShapingMode = ShapingMode.advise, west_mode: ShapingMode | None = None) -> Group:
        clock = Clock()
        east = Member(committed_engine, tmp_path, "east", clock, mode)
        west = Member(committed_engine, tmp_path, "west", clock, west_mode or mode)
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
        east.cluster.submit(_report("busy", 8), timedelta(hours=10))
        east.cluster.submit(_report("waiting", 4), timedelta(hours=1))
        clock.now = T0 + timedelta(minutes=10)
        assert east.states() == {"busy": "running", "waiting": "pending"}
        return Group(committed_engine, east, west)

    yield make
    for prefix in registered:
        local.unregister(prefix)


def _one_move(group: Group) -> int:
    outcome = group.plan()
    assert len(outcome.proposed) == 1, outcome
    return int(outcome.proposed[0])


def test_the_waiting_job_moves_to_the_idle_cluster_and_its_home_copy_is_cancelled(
    group_factory: Callable[..., Group],
) -> None:
    group = group_factory()
    action_id = _one_move(group)
    action = group.action(action_id)
    assert action.kind == ActionKind.move and action.state == ActionState.proposed
    assert "east cannot start job waiting now; west has 4 GPUs for it" in action.reason
    # Planned again before anyone decided: the same proposal, not a second one.
    again = group.plan()
    assert again.proposed == [] and again.kept == 1

    group.approve(action_id)
    group.run_sagas()
    action = group.action(action_id)
    assert action.state == ActionState.succeeded, action.error
    assert group.steps(action_id) == [
        ("forward", "hold", "connector.east", "succeeded"),
        ("forward", "submit", "connector.west", "succeeded"),
        ("forward", "confirm", "connector.west", "succeeded"),
        ("forward", "cancel", "connector.east", "succeeded"),
    ]
    # Gone from east, running at west (its scheduler placed it): once, not twice.
    assert group.east.states() == {"busy": "running", "waiting": "cancelled"}
    assert group.west.states() == {"west-in1": "running"}
    moved = group.job("east", "waiting")
    assert moved.state == JobState.cancelled
    assert moved.reason == f"moved to west as job west-in1 by action {action_id}"

    # The job's row at west comes after the move in the fencing order (written ahead of
    # west's telemetry, which fills in the rest).
    assert group.job("west", "west-in1").generation == group.action(action_id).fencing_token == 1
    # The next plan sees the job at west, running: nothing more to move.
    after = group.plan()
    assert after.proposed == [] and after.approved == [] and after.kept == 0
    assert group.job("west", "west-in1").state == JobState.running


def test_the_api_lists_where_a_move_comes_from_and_goes_to(
    group_factory: Callable[..., Group], committed_engine: Engine
) -> None:
    group = group_factory()
    action_id = _one_move(group)
    with TestClient(app_on(committed_engine)) as client:
        with Session(committed_engine) as session:
            token = tokens_for(session, T0, ["viewer"])["viewer"]
        listed = client.get("/api/v1/actions", headers={"Authorization": f"Bearer {token}"}).json()[
            "items"
        ]
    (shown,) = (a for a in listed if a["id"] == action_id)
    assert (shown["cluster"], shown["target_cluster"], shown["kind"]) == ("east", "west", "move")
    assert shown["job_external_id"] == "waiting" and shown["target_node"] == "west1"


def test_a_target_that_refuses_the_job_leaves_it_pending_at_home_and_released(
    group_factory: Callable[..., Group],
) -> None:
    group = group_factory()
    action_id = _one_move(group)

    def refuse(step: dict[str, Any]) -> dict[str, Any]:
        return {
            "action_id": step["action_id"],
            "key": step["key"],
            "ok": False,
            "error": "submit: west cannot run it",
            "executor": "connector.west",
            "generation": step["generation"],
        }

    group.west.faults["submit"] = refuse
    group.approve(action_id)
    group.run_sagas()
    action = group.action(action_id)
    assert action.state == ActionState.compensated, action.error
    assert "submit on connector.west failed: submit: west cannot run it" in (action.error or "")
    assert [s for s in group.steps(action_id) if s[0] == StepPhase.compensate] == [
        ("compensate", "withdraw", "connector.west", "succeeded"),
        ("compensate", "release", "connector.east", "succeeded"),
    ]
    assert group.west.states() == {}
    assert group.east.states() == {"busy": "running", "waiting": "pending"}
    assert not group.east.cluster.jobs["waiting"].held  # back in east's queue as it was
    assert group.job("east", "waiting").generation == 2  # the move's, then compensation's


def _live_copies(group: Group) -> list[str]:
    """Where the moved job waits or runs: its home copy, and any copy a move brought west."""
    live = ("pending", "running", "suspended")
    home = [f"east/{i}" for i, s in group.east.states().items() if i == "waiting" and s in live]
    away = [
        f"west/{i}" for i, s in group.west.states().items() if i.startswith("west-in") and s in live
    ]
    return home + away


def _west_busy_after_the_plan(group: Group) -> None:
    """West's own user takes its free GPUs once the plan is made: a copy moved there waits
    in its queue (west's FIFO puts the earlier submission first)."""
    group.west.cluster.submit(_report("local", 8), timedelta(hours=3))
    assert group.west.states() == {"local": "running"}


def test_a_copy_the_target_rejects_after_taking_it_sends_the_job_back_home_released(
    group_factory: Callable[..., Group],
) -> None:
    """West answers the submit with the new job's id and then gives up on the copy before it
    ran (as Kueue does with a Workload it finds inadmissible, or Ray with a runtime
    environment it cannot build): the confirm finds it failed without having run, and the
    move is undone before east's copy is touched — released, never cancelled, the one copy."""
    group = group_factory()
    action_id = _one_move(group)
    _west_busy_after_the_plan(group)

    def west_rejects_its_copy(step: dict[str, Any]) -> None:
        group.west.cluster.refuse(step["workload_id"], "InvalidImage: no such image at west")
        return None  # and the confirm reads what west's scheduler says now

    group.west.faults["confirm"] = west_rejects_its_copy
    group.approve(action_id)
    group.run_sagas()
    action = group.action(action_id)
    assert action.state == ActionState.compensated, action.error
    assert (
        "confirm on connector.west failed: confirm: job west-in1 is failed (InvalidImage: no "
        "such image at west) without having run: the scheduler rejected the moved job"
    ) in (action.error or "")
    assert [s[1:] for s in group.steps(action_id)] == [
        ("hold", "connector.east", "succeeded"),
        ("submit", "connector.west", "succeeded"),
        ("confirm", "connector.west", "failed"),
        ("cancel", "connector.east", "skipped"),
        ("withdraw", "connector.west", "succeeded"),
        ("release", "connector.east", "succeeded"),
    ]
    assert "nothing to withdraw" in (action.error or "")  # it ended there without running
    assert "cancel" not in group.east.seen  # east's copy was never asked to go
    assert group.east.states() == {"busy": "running", "waiting": "pending"}
    assert not group.east.cluster.jobs["waiting"].held  # back in east's queue as it was
    assert group.west.states() == {"local": "running", "west-in1": "failed"}
    assert _live_copies(group) == ["east/waiting"]  # nothing lost, nothing twice
    home = group.job("east", "waiting")
    assert home.state == JobState.pending and home.generation == 2


def test_a_copy_waiting_in_the_targets_queue_is_confirmed_before_the_home_copy_is_cancelled(
    group_factory: Callable[..., Group],
) -> None:
    """West's scheduler queues the copy behind its own user's job: queued past its checks,
    it is a copy west will run, so the confirm accepts it, and only then is east's copy
    cancelled."""
    group = group_factory()
    action_id = _one_move(group)
    _west_busy_after_the_plan(group)
    west_had_seen: list[str] = []

    def note_what_west_had_done(step: dict[str, Any]) -> None:
        west_had_seen.extend(group.west.seen)
        return None

    group.east.faults["cancel"] = note_what_west_had_done
    group.approve(action_id)
    group.run_sagas()
    action = group.action(action_id)
    assert action.state == ActionState.succeeded, action.error
    assert west_had_seen == ["submit", "confirm"]
    with Session(group.engine) as session:
        confirm = session.exec(
            select(ActionStep).where(
                ActionStep.action_id == action_id, ActionStep.name == "confirm"
            )
        ).one()
    assert confirm.result["summary"] == "job west-in1 is pending (Resources)"
    assert confirm.result["workload_id"] == "west-in1" and confirm.attempts == 1
    assert group.east.states()["waiting"] == "cancelled"
    assert group.west.states() == {"local": "running", "west-in1": "pending"}
    assert _live_copies(group) == ["west/west-in1"]


@pytest.mark.parametrize("unknown_for", [3, None], ids=["then-seen", "never-seen"])
def test_a_copy_the_target_does_not_report_yet_is_asked_again_and_given_up_on_in_time(
    group_factory: Callable[..., Group], unknown_for: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """West's connector cannot tell yet (its scheduler does not list the new job: a watch
    that has not delivered it, a Workload Kueue has not created): "not yet" is asked again.
    Seen in time, the move goes on; never seen, the confirm gives up after its polls and the
    move is undone: west's copy withdrawn, east's released — one copy either way."""
    group = group_factory()
    # A short start wait, for the sweep and for the answers alike: the confirm polls its
    # fewest times (saga.CONFIRM_POLLS).
    monkeypatch.setattr(tasks, "_timings", lambda: {"step_timeout_s": 0.3, "start_wait_s": 0.5})
    settings = tasks.get_settings().model_copy(update={"scheduler_start_wait_s": 0.5})
    monkeypatch.setattr(tasks, "get_settings", lambda: settings)
    action_id = _one_move(group)
    asked = {"confirm": 0}

    def not_reported_yet(step: dict[str, Any]) -> dict[str, Any] | None:
        asked["confirm"] += 1
        if unknown_for is not None and asked["confirm"] > unknown_for:
            return None
        return {
            "action_id": step["action_id"],
            "key": step["key"],
            "ok": False,
            "error": f"confirm: the scheduler does not report job {step['workload_id']} yet",
            "retryable": True,
            "executor": "connector.west",
            "generation": step["generation"],
        }

    group.west.faults["confirm"] = not_reported_yet
    group.approve(action_id)
    group.run_sagas(seconds=30)
    action = group.action(action_id)
    if unknown_for is not None:
        assert action.state == ActionState.succeeded, action.error
        assert asked["confirm"] == unknown_for + 1
        assert _live_copies(group) == ["west/west-in1"]
        assert group.east.states()["waiting"] == "cancelled"
        return
    assert action.state == ActionState.compensated, action.error
    assert asked["confirm"] >= saga.CONFIRM_POLLS
    assert (action.error or "").startswith("confirm on connector.west failed")
    assert "cancel" not in group.east.seen
    assert group.west.states() == {"west-in1": "cancelled"}  # withdrawn: it ran there
    assert group.east.states()["waiting"] == "pending"
    assert not group.east.cluster.jobs["waiting"].held
    assert _live_copies(group) == ["east/waiting"]


def test_lost_answers_are_resent_and_the_job_arrives_once(
    group_factory: Callable[..., Group],
) -> None:
    """The submit runs at west and its answer is lost; the source's cancel goes unanswered
    more often than a forward step is tried (a cancel is never given up: given up, the job
    might wait in both clusters)."""
    group = group_factory()
    action_id = _one_move(group)
    lost = {"submit": 1, "cancel": saga.MAX_ATTEMPTS + 1}

    def lose(name: str) -> Callable[[dict[str, Any]], dict[str, Any] | None]:
        def fault(step: dict[str, Any]) -> dict[str, Any] | None:
            if lost[name] > 0:
                lost[name] -= 1
                return LOST
            return None

        return fault

    group.west.faults["submit"] = lose("submit")
    group.east.faults["cancel"] = lose("cancel")
    group.approve(action_id)
    group.run_sagas(seconds=30)
    action = group.action(action_id)
    assert action.state == ActionState.succeeded, action.error
    assert group.west.seen.count("submit") == 2
    assert group.east.seen.count("cancel") == saga.MAX_ATTEMPTS + 2
    assert group.west.states() == {"west-in1": "running"}  # one job, not two
    assert group.east.states()["waiting"] == "cancelled"


def test_a_move_whose_home_cancel_never_comes_back_can_be_abandoned_once_stuck(
    group_factory: Callable[..., Group],
) -> None:
    """East's connector never answers the cancel, nor runs it (its cluster cut off): the
    cancel is resent for ever, so only an operator ends the move. Refused while the cancel
    has been sent fewer than MAX_ATTEMPTS times; then the action fails saying where the job
    runs and what to check at home, nothing more is sent, the rows say the job is west's,
    and when east comes back with the held copy its plans never start it (twice)."""
    group = group_factory()
    action_id = _one_move(group)

    def unanswered(step: dict[str, Any]) -> dict[str, Any]:
        # Not run, and the answer that comes back is for no step the saga sent.
        return {
            "action_id": step["action_id"],
            "key": f"{step['key']}:never",
            "ok": True,
            "executor": "connector.east",
            "generation": step["generation"],
        }

    group.east.faults["cancel"] = unanswered
    group.approve(action_id)

    def cancel_sends() -> int:
        with Session(group.engine) as session:
            step = session.exec(
                select(ActionStep).where(
                    ActionStep.action_id == action_id, ActionStep.name == "cancel"
                )
            ).first()  # no steps until the saga's first sweep
            return step.attempts if step is not None else 0

    refused_early = False
    deadline = time.monotonic() + 30
    while cancel_sends() < saga.MAX_ATTEMPTS and time.monotonic() < deadline:
        if cancel_sends() >= 1 and not refused_early:
            early = group.decide(action_id, "abandon")
            assert early.status_code == 409, early.text
            assert "only a compensating action, or a move waiting" in early.text
            refused_early = True
        tasks.sweep()
        time.sleep(0.05)
    assert refused_early and cancel_sends() >= saga.MAX_ATTEMPTS
    assert group.action(action_id).state == ActionState.running
    response = group.decide(action_id, "abandon")
    assert response.status_code == 200, response.text
    action = group.action(action_id)
    assert action.state == ActionState.failed
    assert "the job runs at west as job west-in1" in (action.error or "")
    assert "its copy at east was never confirmed cancelled" in (action.error or "")
    sent = group.east.seen.count("cancel")
    time.sleep(1.0)
    tasks.sweep()
    assert group.east.seen.count("cancel") == sent  # the saga stopped
    assert group.west.states() == {"west-in1": "running"}
    again = group.decide(action_id, "abandon")
    assert again.status_code == 409  # failed now: nothing left to abandon
    home, arrived = group.job("east", "waiting"), group.job("west", "west-in1")
    assert home.state == JobState.cancelled
    assert "moved to west as job west-in1" in home.reason
    assert "was never confirmed cancelled" in home.reason
    assert arrived.generation >= action.fencing_token
    # East comes back, past the dwell: its held copy is still there, and east has room.
    assert group.east.states()["waiting"] == "pending"
    group.east.cluster.cancel("busy")
    # (The sagas ran on the real clock: past their dwell is a day past both clocks.)
    group.east.clock.now = max(group.east.clock.now, datetime.now(UTC)) + timedelta(days=1)
    group.east.push()
    with Session(group.engine, expire_on_commit=False) as session:
        run_cycle(session=session, cluster_name="east", now=group.east.clock.now)
    with Session(group.engine) as session:
        others = session.exec(
            select(Action).where(Action.job_id == home.id, Action.id != action_id)
        ).all()
    assert others == []  # no plan starts the home copy
    assert group.east.states()["waiting"] == "pending"


def test_a_job_its_user_cancels_at_home_mid_move_does_not_run_at_the_target(
    group_factory: Callable[..., Group],
) -> None:
    """The user cancels the held job at east while west takes the move's submit: east's
    cancel finds a job this move did not cancel and fails for good, and compensation
    withdraws west's copy: the job the user cancelled runs nowhere."""
    group = group_factory()
    action_id = _one_move(group)

    def user_cancels_at_home(step: dict[str, Any]) -> None:
        group.east.cluster.cancel("waiting")
        return None  # and west takes the submit

    group.west.faults["submit"] = user_cancels_at_home
    group.approve(action_id)
    group.run_sagas()
    action = group.action(action_id)
    assert action.state == ActionState.compensated, action.error
    assert "this move did not cancel it" in (action.error or "")
    assert [s[1:] for s in group.steps(action_id)] == [
        ("hold", "connector.east", "succeeded"),
        ("submit", "connector.west", "succeeded"),
        ("confirm", "connector.west", "succeeded"),
        ("cancel", "connector.east", "failed"),
        ("withdraw", "connector.west", "succeeded"),
        ("release", "connector.east", "succeeded"),
    ]
    assert group.west.states() == {"west-in1": "cancelled"}
    assert group.east.states()["waiting"] == "cancelled"


def test_a_job_that_started_at_home_before_the_hold_is_not_moved(
    group_factory: Callable[..., Group],
) -> None:
    group = group_factory()
    action_id = _one_move(group)
    group.east.cluster.cancel("busy")  # east frees up: its FIFO starts the waiting job
    assert group.east.states()["waiting"] == "running"
    group.approve(action_id)
    group.run_sagas()
    action = group.action(action_id)
    assert action.state == ActionState.compensated
    assert "job waiting is running: only a pending job is held for a move" in (action.error or "")
    # The hold was sent, so compensation asks for a release, which finds nothing held.
    steps = group.steps(action_id)
    assert [s[1:] for s in steps] == [
        ("hold", "connector.east", "failed"),
        ("submit", "connector.west", "skipped"),
        ("confirm", "connector.west", "skipped"),
        ("cancel", "connector.east", "skipped"),
        ("release", "connector.east", "succeeded"),
    ]
    assert "nothing to release" in (action.error or "")
    assert group.west.seen == []  # nothing was submitted
    assert group.east.states()["waiting"] == "running"
    assert not group.east.cluster.jobs["waiting"].held


def test_observe_mode_plans_no_move_and_enforce_approves_it(
    group_factory: Callable[..., Group],
) -> None:
    group = group_factory(ShapingMode.observe)
    outcome = group.plan()
    assert outcome.proposed == outcome.approved == []
    assert outcome.skipped == {"east/waiting": "east is in observe mode: it only plans"}
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
    group.run_sagas()
    assert group.action(outcome.approved[0]).state == ActionState.succeeded


def test_a_proposal_the_next_plan_no_longer_makes_is_cancelled(
    group_factory: Callable[..., Group],
) -> None:
    group = group_factory()
    action_id = _one_move(group)
    group.east.cluster.cancel("busy")  # the job starts at home after all
    outcome = group.plan()
    assert outcome.superseded == 1 and outcome.proposed == []
    action = group.action(action_id)
    assert action.state == ActionState.cancelled
    assert (action.error or "").startswith("superseded")


def test_a_move_whose_target_cluster_was_deleted_is_cancelled_saying_so(
    group_factory: Callable[..., Group],
) -> None:
    group = group_factory()
    action_id = _one_move(group)
    with Session(group.engine) as session:
        cluster_service.delete_cluster(session=session, name="west", now=T0)
    group.approve(action_id)
    group.run_sagas()
    action = group.action(action_id)
    assert action.state == ActionState.cancelled
    assert action.error == "move names no target cluster (or it was deleted)"
    assert group.east.states()["waiting"] == "pending"


def test_a_move_proposed_again_after_a_rejection_is_a_new_proposal(
    group_factory: Callable[..., Group], committed_engine: Engine
) -> None:
    group = group_factory()
    first = _one_move(group)
    with TestClient(app_on(committed_engine)) as client:
        with Session(committed_engine) as session:
            token = tokens_for(session, T0, ["operator"])["operator"]
        rejected = client.post(
            f"/api/v1/actions/{first}/reject", headers={"Authorization": f"Bearer {token}"}
        )
        assert rejected.status_code == 200, rejected.text
    second = _one_move(group)
    assert second != first
    assert group.action(first).idempotency_key != group.action(second).idempotency_key


def test_a_target_in_observe_mode_takes_no_move_and_advise_anywhere_asks_an_operator(
    group_factory: Callable[..., Group],
) -> None:
    group = group_factory(ShapingMode.enforce, west_mode=ShapingMode.observe)
    outcome = group.plan()
    assert outcome.proposed == outcome.approved == []
    assert outcome.skipped == {"east/waiting": "west is in observe mode: it only plans"}
    with Session(group.engine) as session:
        cluster_service.update_cluster(
            session=session,
            name="west",
            cluster_in=ClusterUpdate(mode=ShapingMode.advise),
            now=T0,
        )
    outcome = group.plan()
    assert len(outcome.proposed) == 1 and outcome.approved == []  # east enforces, west advises


def test_a_copy_that_already_ran_at_the_target_keeps_the_home_copy_from_running_again(
    group_factory: Callable[..., Group],
) -> None:
    """West runs the job to its end while none of its submit answers reach the control
    plane; the submit is given up, and compensation's withdraw finds the job already ran
    there: it fails for good rather than release east's copy to run a second time."""
    group = group_factory()
    action_id = _one_move(group)
    lost = {"submit": saga.MAX_ATTEMPTS}

    def lose(step: dict[str, Any]) -> dict[str, Any] | None:
        if lost["submit"] > 0:
            lost["submit"] -= 1
            if lost["submit"] == 0:  # west finishes it meanwhile
                group.west.clock.now += timedelta(hours=2)
            return LOST
        return None

    group.west.faults["submit"] = lose
    group.approve(action_id)
    group.run_sagas(seconds=30)
    action = group.action(action_id)
    assert action.state == ActionState.failed, action.error
    assert "already ran here and finished" in (action.error or "")
    # Compensation stopped at the withdraw: the release of east's copy was never sent.
    assert [s[1:] for s in group.steps(action_id) if s[0] == StepPhase.compensate] == [
        ("withdraw", "connector.west", "failed"),
        ("release", "connector.east", "pending"),
    ]
    assert group.west.states() == {"west-in1": "finished"}
    assert group.east.states()["waiting"] == "pending"
    assert group.east.cluster.jobs["waiting"].held  # held at home, not run a second time


# Row locks are PostgreSQL's (on SQLite a writer has the whole database): PostgreSQL only.
@pytest.mark.parametrize("committed_engine", ["postgres"], indirect=True)
def test_a_job_whose_row_another_transaction_holds_is_proposed_a_later_period(
    group_factory: Callable[..., Group], committed_engine: Engine
) -> None:
    """The home's ingest updates its push's jobs in the push's order, a proposal locks them
    in the solve's: had it waited for a job's row, the two could deadlock. It skips the
    job instead, keeps the job's standing proposal, and proposes it once the row is free."""
    assert committed_engine.dialect.name == "postgresql"
    group = group_factory()
    action_id = _one_move(group)
    group.east.push()
    group.west.push()
    with Session(committed_engine) as holder:
        # A transaction writing the waiting job's row (an ingest, a saga), not yet committed.
        holder.exec(
            select(Job).where(Job.external_id == "waiting").with_for_update(key_share=True)
        ).one()
        outcomes: list[Any] = []

        def propose() -> None:
            with Session(committed_engine, expire_on_commit=False) as session:
                outcomes.append(propose_moves(session=session, group=GROUP, now=T0))

        proposer = threading.Thread(target=propose, daemon=True)
        proposer.start()
        proposer.join(timeout=10)
        waited = proposer.is_alive()
        holder.rollback()
    proposer.join(timeout=10)
    assert not waited, "the proposal waited for a row another transaction holds"
    (outcome,) = outcomes
    assert outcome.skipped == {
        "east/waiting": "its row is being written (its cluster's telemetry, or a saga of it): "
        "a later period"
    }
    assert outcome.superseded == 0 and outcome.proposed == []
    assert group.action(action_id).state == ActionState.proposed  # it stands
    # Free again: the next period finds the proposal standing.
    assert group.plan().kept == 1
