"""A saga step ending an action and an operator's decision on another action of the same
plan, at the same moment, on a committed database (SQLite and PostgreSQL): they lock the
plan's actions in different orders, so both lock the plan first.

The saga's step that ends an action locks it, then every action of its plan
(``action_service.ended``); approving an action locks it, then its prerequisites. With an
action ending while an operator approves one that depends on it, each held one and
waited for the other's: PostgreSQL aborted one with a deadlock.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import Engine
from sqlmodel import Session

from app.actions import saga
from app.actions import service as action_service
from app.actions.models import Action, ActionKind, ActionState
from app.clusters.models import Cluster
from app.core.lookup import row_id
from app.jobs.models import Job
from tests.support.at_once import at_once, pause
from tests.support.plans import stored_plan
from wire.telemetry import JobState

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def _plan_in_part_approved(engine: Engine) -> dict[str, int]:
    """A proposal an operator approved in part: ``hold`` (a reservation, cancelled) and
    ``move`` (approved, waiting for ``hold``), and ``start``, still proposed, that waits
    for ``move``. The next saga step of ``move`` ends it (its prerequisite can no longer
    run) and withdraws ``start`` with it."""
    with Session(engine) as session:
        cluster = Cluster(name="lab", created_at=T0)
        session.add(cluster)
        session.flush()
        for name, job_state in (("small", JobState.running), ("big", JobState.pending)):
            session.add(
                Job(
                    cluster_id=row_id(cluster),
                    external_id=name,
                    checkpointable=True,
                    state=job_state,
                    updated_at=T0,
                )
            )
        session.commit()
    nodes = {"source_node": "a", "target_node": "b"}
    _plan, *ids = stored_plan(
        engine,
        [
            {"job": "big", "kind": ActionKind.reserve, "state": ActionState.cancelled, **nodes},
            {
                "job": "small",
                "kind": ActionKind.migrate,
                "state": ActionState.approved,
                "after": [0],
                **nodes,
            },
            {"job": "big", "kind": ActionKind.start, "after": [1], **nodes},
        ],
        tag="lock-order",
    )
    return dict(zip(("hold", "move", "start"), ids, strict=True))


def test_a_saga_ending_an_action_and_an_operator_approving_its_dependant_do_not_deadlock(
    committed_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = _plan_in_part_approved(committed_engine)
    # Each side pauses once it holds its own action, before reaching for the other's (as
    # without the plan lock both would); with it, the second waits at the plan instead.
    both_locked = threading.Barrier(2)

    def pausing(function: Any) -> Any:
        def paused(*args: Any, **kwargs: Any) -> Any:
            pause(both_locked)
            return function(*args, **kwargs)

        return paused

    monkeypatch.setattr(action_service, "ended", pausing(action_service.ended))
    monkeypatch.setattr(action_service, "_with_followers", pausing(action_service._with_followers))

    def saga_step(session: Session) -> None:
        saga.advance(session=session, action_id=ids["move"], now=T0)

    def approval(session: Session) -> None:
        action_service.transition(
            session=session, action_id=ids["start"], to=ActionState.approved, by="ops", now=T0
        )

    outcomes = at_once(committed_engine, {"saga": saga_step, "operator": approval})
    assert not [o for o in outcomes.values() if o.startswith("error")], outcomes
    # The saga ended the move (its reservation can no longer run) whichever came first;
    # the operator was told the start can no longer run (its prerequisite ended) or that
    # it was withdrawn with the move.
    assert outcomes["saga"] == "done"
    assert outcomes["operator"].startswith("conflict"), outcomes
    with Session(committed_engine) as session:
        states = {name: session.get_one(Action, i).state for name, i in ids.items()}
    assert states == {
        "hold": ActionState.cancelled,
        "move": ActionState.cancelled,
        "start": ActionState.cancelled,
    }
