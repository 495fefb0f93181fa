from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, select

from app.actions.models import TRANSITIONS, ActionState
from app.clusters.models import Cluster
from app.core.clock import FrozenClock
from tests.app.builders import migration_plan


@pytest.fixture
def proposed(client: TestClient, auth: dict, session: Session, clock: FrozenClock) -> int:
    client.post(
        "/api/v1/clusters", headers=auth["admin"], json={"name": "alpha", "scheduler": "slurm"}
    )
    cluster = session.exec(select(Cluster).where(Cluster.name == "alpha")).one()
    _plan, (action,) = migration_plan(
        session,
        cluster_id=cluster.id,  # type: ignore[arg-type]
        now=clock.now(),
        objective=10.0,
        best_bound=10.0,
        wall_time_s=0.2,
    )
    return action.id  # type: ignore[return-value]


def test_plans_and_actions_are_listed(client: TestClient, auth: dict, proposed: int) -> None:
    plans = client.get("/api/v1/plans", headers=auth["viewer"]).json()
    assert plans["total"] == 1 and plans["items"][0]["decisions"][0]["reason"] == "defragment n1"
    plan_id = plans["items"][0]["id"]
    assert client.get(f"/api/v1/plans/{plan_id}", headers=auth["viewer"]).json()["engine"] == (
        "cp-sat"
    )
    actions = client.get(
        "/api/v1/actions", headers=auth["viewer"], params={"plan_id": plan_id}
    ).json()
    assert [a["id"] for a in actions["items"]] == [proposed]
    assert actions["items"][0]["state"] == "proposed"
    assert client.get("/api/v1/actions/4242", headers=auth["viewer"]).status_code == 404


def test_approval_is_recorded_and_illegal_moves_conflict(
    client: TestClient, auth: dict, proposed: int
) -> None:
    approved = client.post(f"/api/v1/actions/{proposed}/approve", headers=auth["operator"])
    assert approved.status_code == 200
    assert approved.json()["state"] == "approved"
    assert approved.json()["decided_by"] == "operator"
    again = client.post(f"/api/v1/actions/{proposed}/reject", headers=auth["operator"])
    assert again.status_code == 409
    assert again.json()["error"]["details"] == {"state": "approved"}
    cancelled = client.post(f"/api/v1/actions/{proposed}/cancel", headers=auth["operator"])
    assert cancelled.json()["state"] == "cancelled"


def test_state_machine_has_no_way_out_of_terminal_states() -> None:
    for state in (
        ActionState.succeeded,
        ActionState.rejected,
        ActionState.compensated,
        ActionState.cancelled,
    ):
        assert TRANSITIONS[state] == frozenset()
    assert set(TRANSITIONS) == set(ActionState)


def test_a_compensating_action_can_be_abandoned_and_nothing_else(
    client: TestClient, auth: dict, session: Session, clock: FrozenClock, proposed: int
) -> None:
    """A compensation whose executor is gone for good is resent for ever (app.actions.saga);
    an operator ends it, failed, saying so; its saga then sends nothing more."""
    from app.actions import saga
    from app.actions.models import Action

    url = f"/api/v1/actions/{proposed}/abandon"
    assert client.post(url, headers=auth["operator"]).status_code == 409  # proposed
    action = session.get(Action, proposed)
    assert action is not None
    action.state, action.error = ActionState.compensating, "restore on n2 unanswered"
    session.add(action)
    session.commit()
    assert client.post(url, headers=auth["viewer"]).status_code == 403
    abandoned = client.post(url, headers=auth["operator"])
    assert abandoned.status_code == 200, abandoned.text
    body = abandoned.json()
    assert body["state"] == "failed" and body["finished_at"] is not None
    assert body["error"].startswith("abandoned by operator while compensating")
    assert "restore on n2 unanswered" in body["error"]
    session.expire_all()
    assert saga.advance(session=session, action_id=proposed, now=clock.now()) == []
    assert client.post(url, headers=auth["operator"]).status_code == 409  # failed now
