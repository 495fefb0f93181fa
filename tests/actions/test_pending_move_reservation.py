"""A pending job's move to a Slurm cluster holds the node it was planned onto (issue 16):
the saga on a real database (both backends), driven step by step as the two clusters'
connectors would answer it.

Cluster ``a`` holds job 41, pending; the group plan sends it to node ``bnode1`` of cluster
``b``. Between the plan and B's scheduler starting the copy, B's own queue could take
bnode1, and the job would wait at B instead of at home; so B's copy is submitted held and
pinned, bnode1 is reserved for it, and only then is it let go, into the reservation. A
refused reservation (B's queue took the node meanwhile) ends the move with the job
pending at home as it was.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from sqlmodel import Session

from app.actions import saga
from app.actions.models import Action, ActionKind, ActionState
from app.actions.recipes import MAX_ATTEMPTS
from app.clusters.models import Cluster
from app.core.clock import FrozenClock
from app.core.lookup import row_id
from app.core.security import Principal
from app.jobs.models import Job
from wire.steps import StepReport
from wire.telemetry import JobState, SchedulerKind

OPERATOR = Principal(token_id=0, name="admin", scopes=frozenset({"admin"}))
SPEC = json.dumps({"scheduler": "slurm", "native": {"script": "#!/bin/sh\nrun\n"}})
ARRIVED = {"external_id": "9001"}


@pytest.fixture
def move(session: Session, clock: FrozenClock) -> int:
    """An approved move of a's pending job 41 (2 GPUs) to b's node bnode1."""
    home = Cluster(name="a", scheduler=SchedulerKind.slurm, created_at=clock.now())
    target = Cluster(name="b", scheduler=SchedulerKind.slurm, created_at=clock.now())
    session.add(home)
    session.add(target)
    session.flush()
    job = Job(
        cluster_id=row_id(home),
        external_id="41",
        state=JobState.pending,
        gpus_requested=2,
        submit_spec=SPEC,
        updated_at=clock.now(),
    )
    session.add(job)
    session.flush()
    action = Action(
        cluster_id=row_id(home),
        target_cluster_id=row_id(target),
        job_id=row_id(job),
        kind=ActionKind.move,
        state=ActionState.approved,
        idempotency_key="move:a:41:b",
        target_node="bnode1",
        created_at=clock.now(),
        updated_at=clock.now(),
    )
    session.add(action)
    session.commit()
    return row_id(action)


def only(outgoing: list[saga.Outgoing]) -> saga.Outgoing:
    assert len(outgoing) == 1, outgoing
    return outgoing[0]


def step_of(message: saga.Outgoing) -> dict[str, Any]:
    return message.kwargs["step"]  # type: ignore[no-any-return]


def where(message: saga.Outgoing) -> tuple[str, str, str | None]:
    step = step_of(message)
    return message.queue, step["step"], step["workload_id"]


def answer(
    session: Session, clock: FrozenClock, message: saga.Outgoing, ok: bool = True, **fields: Any
) -> list[saga.Outgoing]:
    step = step_of(message)
    report = StepReport(action_id=step["action_id"], key=step["key"], ok=ok, **fields)
    return saga.record_report(session=session, report=report, now=clock.now(), reporter=OPERATOR)


def action_of(session: Session, action_id: int) -> Action:
    action = session.get(Action, action_id)
    assert action is not None
    session.refresh(action)
    return action


def steps_of(session: Session, action_id: int) -> list[tuple[str, str, str]]:
    return [
        (s.phase, s.name, s.state) for s in saga.list_steps(session=session, action_id=action_id)
    ]


def to_the_reserve(session: Session, clock: FrozenClock, action_id: int) -> saga.Outgoing:
    hold = only(saga.advance(session=session, action_id=action_id, now=clock.now()))
    assert where(hold) == ("connector.a", "hold", "41")
    submit = only(answer(session, clock, hold))
    assert where(submit) == ("connector.b", "submit", "41")
    assert step_of(submit)["args"]["hold"] is True
    assert step_of(submit)["args"]["nodes"] == ["bnode1"]
    reserve = only(answer(session, clock, submit, result=ARRIVED))
    assert where(reserve) == ("connector.b", "reserve", "9001")
    assert step_of(reserve)["args"]["gpus"] == {"bnode1": 2}
    return reserve


def test_the_planned_node_is_held_for_bs_copy_before_it_may_start_and_given_back_after(
    session: Session, clock: FrozenClock, move: int
) -> None:
    reserve = to_the_reserve(session, clock, move)
    release = only(answer(session, clock, reserve, result={"gpus": {"bnode1": 2}}))
    # B's held copy is let go once bnode1 is held for it (Slurm's connector puts it in its
    # reservation); A's copy is still there, held.
    assert where(release) == ("connector.b", "release", "9001")
    assert "if_held" not in step_of(release)["args"]
    confirm = only(answer(session, clock, release))
    assert where(confirm) == ("connector.b", "confirm", "9001")
    # B's connector says "not yet" while the copy waits in its reservation: asked again,
    # under the same key, and A's copy is not cancelled meanwhile.
    waiting = "job 9001 is PENDING (None): it has not started yet on bnode1"
    again = only(answer(session, clock, confirm, ok=False, error=waiting, retryable=True))
    assert step_of(again)["key"] == step_of(confirm)["key"]
    assert where(again) == ("connector.b", "confirm", "9001")
    cancel = only(answer(session, clock, again, result={"summary": "job 9001 is RUNNING"}))
    assert where(cancel) == ("connector.a", "cancel", "41")
    assert step_of(cancel)["args"]["moved_away"] is True
    unreserve = only(answer(session, clock, cancel))
    assert where(unreserve) == ("connector.b", "unreserve", "9001")
    assert action_of(session, move).state == "running"
    assert answer(session, clock, unreserve) == []

    assert action_of(session, move).state == "succeeded"
    assert [name for _, name, state in steps_of(session, move) if state == "succeeded"] == [
        "hold",
        "submit",
        "reserve",
        "release",
        "confirm",
        "cancel",
        "unreserve",
    ]


def test_a_refused_reservation_withdraws_bs_copy_and_leaves_the_job_pending_at_home(
    session: Session, clock: FrozenClock, move: int
) -> None:
    reserve = to_the_reserve(session, clock, move)
    refused = "cannot hold 2 GPUs on bnode1 for 9001: held by 77 (2)"
    withdraw = only(answer(session, clock, reserve, ok=False, error=refused))

    # B's queue took bnode1 since the plan: nothing of the move is left anywhere, A's copy
    # is released (if still held) and waits at home as it did; nothing was cancelled there.
    assert action_of(session, move).state == "compensating"
    assert where(withdraw) == ("connector.b", "withdraw", "41")
    assert step_of(withdraw)["args"]["name"] == f"shaper-{move}-41"
    unreserve = only(answer(session, clock, withdraw, result=ARRIVED))
    assert where(unreserve) == ("connector.b", "unreserve", "9001")
    release = only(answer(session, clock, unreserve))
    assert where(release) == ("connector.a", "release", "41")
    assert step_of(release)["args"]["if_held"] is True
    assert answer(session, clock, release) == []

    action = action_of(session, move)
    assert action.state == "compensated"
    assert action.error is not None and action.error.startswith(
        f"reserve on connector.b failed: {refused}; compensated: withdraw on connector.b"
    )
    assert steps_of(session, move) == [
        ("forward", "hold", "succeeded"),
        ("forward", "submit", "succeeded"),
        ("forward", "reserve", "failed"),
        ("forward", "release", "skipped"),
        ("forward", "confirm", "skipped"),
        ("forward", "cancel", "skipped"),
        ("forward", "unreserve", "skipped"),
        ("compensate", "withdraw", "succeeded"),
        ("compensate", "unreserve", "succeeded"),
        ("compensate", "release", "succeeded"),
    ]
    job = session.get(Job, action.job_id)
    assert job is not None and job.state == JobState.pending  # not recorded as moved


def test_a_reserve_whose_answer_is_lost_is_resent_under_its_key_then_given_back(
    session: Session, clock: FrozenClock, move: int
) -> None:
    reserve = to_the_reserve(session, clock, move)

    def after(seconds: float) -> list[saga.Outgoing]:
        clock.advance(seconds)
        return saga.advance(session=session, action_id=move, now=clock.now(), step_timeout_s=30)

    resent = [only(after(31)) for _ in range(MAX_ATTEMPTS - 1)]
    assert {step_of(m)["key"] for m in resent} == {step_of(reserve)["key"]}
    # Never answered: the reservation may have been made all the same, so it is given
    # back after B's copy is withdrawn, before A's copy is released.
    withdraw = only(after(31))
    assert where(withdraw) == ("connector.b", "withdraw", "41")
    unreserve = only(answer(session, clock, withdraw, result=ARRIVED))
    assert where(unreserve) == ("connector.b", "unreserve", "9001")
    # A late answer of the abandoned reserve changes nothing.
    assert answer(session, clock, reserve, result={"gpus": {"bnode1": 2}}) == []
    release = only(answer(session, clock, unreserve))
    assert where(release) == ("connector.a", "release", "41")
    assert answer(session, clock, release) == []
    assert action_of(session, move).state == "compensated"


def test_the_last_give_back_is_resent_until_answered_and_never_undoes_the_move(
    session: Session, clock: FrozenClock, move: int
) -> None:
    reserve = to_the_reserve(session, clock, move)
    release = only(answer(session, clock, reserve))
    confirm = only(answer(session, clock, release))
    cancel = only(answer(session, clock, confirm))
    unreserve = only(answer(session, clock, cancel))
    assert where(unreserve) == ("connector.b", "unreserve", "9001")

    for _ in range(MAX_ATTEMPTS + 2):  # B's connector cut off: sent again, not given up
        clock.advance(31)
        again = only(
            saga.advance(session=session, action_id=move, now=clock.now(), step_timeout_s=30)
        )
        assert step_of(again)["key"] == step_of(unreserve)["key"]
    assert action_of(session, move).state == "running"
    assert answer(session, clock, again) == []
    assert action_of(session, move).state == "succeeded"
    assert all(phase == "forward" for phase, _, _ in steps_of(session, move))  # nothing undone
