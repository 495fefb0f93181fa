"""A job's history as the job page reads it: the actions on it (GET /actions?job_id=) and
what the latest plans of its cluster decided about it (GET /plans/decisions/history)."""

from __future__ import annotations

from datetime import timedelta

from fastapi.testclient import TestClient
from sqlmodel import Session, select

from app.clusters.models import Cluster
from app.core.clock import FrozenClock
from app.jobs.models import Job
from app.plans.models import PlanState
from tests.app.builders import job, migration_plan, registered_with, snapshot

HISTORY = "/api/v1/plans/decisions/history"


def _jobs(session: Session, clock: FrozenClock) -> tuple[int, dict[str, int]]:
    registered_with(
        session,
        "alpha",
        snapshot(1, jobs=[job("a"), job("b")]),
        now=clock.now(),
    )
    cluster = session.exec(select(Cluster).where(Cluster.name == "alpha")).one()
    jobs = session.exec(select(Job).where(Job.cluster_id == cluster.id)).all()
    assert cluster.id is not None
    return cluster.id, {j.external_id: j.id for j in jobs if j.id is not None}


def test_the_actions_on_one_job(
    client: TestClient, auth: dict, session: Session, clock: FrozenClock
) -> None:
    cluster_id, ids = _jobs(session, clock)
    _, actions = migration_plan(session, cluster_id=cluster_id, now=clock.now(), moves=3)
    for action, name in zip(actions, ("a", "b", "a"), strict=True):
        action.job_id = ids[name]
        session.add(action)
    session.commit()

    listed = client.get("/api/v1/actions", headers=auth["viewer"], params={"job_id": ids["a"]})
    assert listed.status_code == 200, listed.text
    body = listed.json()
    assert body["total"] == 2
    # Newest first, each naming its job by id and external id.
    assert [a["id"] for a in body["items"]] == [actions[2].id, actions[0].id]
    assert {(a["job_id"], a["job_external_id"]) for a in body["items"]} == {(ids["a"], "a")}
    # Without the filter every action says whose it is.
    every = client.get("/api/v1/actions", headers=auth["viewer"]).json()["items"]
    assert {a["id"]: a["job_id"] for a in every} == {
        actions[0].id: ids["a"],
        actions[1].id: ids["b"],
        actions[2].id: ids["a"],
    }
    unknown = client.get("/api/v1/actions", headers=auth["viewer"], params={"job_id": 999_999})
    assert unknown.json()["total"] == 0
    bad = client.get("/api/v1/actions", headers=auth["viewer"], params={"job_id": 0})
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "job_id"
    assert client.get("/api/v1/actions", params={"job_id": ids["a"]}).status_code == 401


def test_what_the_latest_plans_decided_about_one_job(
    client: TestClient, auth: dict, session: Session, clock: FrozenClock
) -> None:
    cluster_id, ids = _jobs(session, clock)
    # Oldest first: three plans that decided about "a", one that did not.
    made = [
        migration_plan(
            session,
            cluster_id=cluster_id,
            now=clock.now() - timedelta(minutes=10 * (4 - i)),
            decisions=decisions,
            **fields,
        )[0]
        for i, (decisions, fields) in enumerate(
            [
                ([{"job": "a", "action": "wait", "reason": "quota", "message": "over"}], {}),
                ([{"job": "b", "action": "wait", "reason": "quota"}], {}),
                (
                    [
                        {"job": "b", "action": "start", "reason": "placed", "to": "n1"},
                        {"job": "a", "action": "wait", "reason": "insufficient_capacity"},
                    ],
                    {"mode": "observe", "state": PlanState.observed},
                ),
                (
                    [{"job": "a", "action": "start", "reason": "placed", "to": "n2"}],
                    {"state": PlanState.rejected},
                ),
            ]
        )
    ]
    answer = client.get(HISTORY, headers=auth["viewer"], params={"job_id": ids["a"]})
    assert answer.status_code == 200, answer.text
    history = answer.json()
    assert [h["plan_id"] for h in history] == [made[3].id, made[2].id, made[0].id]
    assert history[0]["decision"] == {"job": "a", "action": "start", "reason": "placed", "to": "n2"}
    assert history[0]["plan_state"] == "rejected" and history[0]["mode"] == "advise"
    assert history[1]["decision"]["reason"] == "insufficient_capacity"
    assert history[1]["plan_state"] == "observed" and history[1]["mode"] == "observe"
    # Only the latest plans are read.
    latest_two = client.get(
        HISTORY, headers=auth["viewer"], params={"job_id": ids["a"], "plans": 2}
    ).json()
    assert [h["plan_id"] for h in latest_two] == [made[3].id, made[2].id]

    missing = client.get(HISTORY, headers=auth["viewer"], params={"job_id": 999_999})
    assert missing.status_code == 404 and "999999" in missing.json()["error"]["message"]
    for params, field in (({"job_id": "x"}, "job_id"), ({"job_id": 1, "plans": 0}, "plans")):
        refused = client.get(HISTORY, headers=auth["viewer"], params=params)
        assert refused.status_code == 422 and refused.json()["error"]["field"] == field
    assert client.get(HISTORY, headers=auth["viewer"]).status_code == 422
    assert client.get(HISTORY, params={"job_id": ids["a"]}).status_code == 401
