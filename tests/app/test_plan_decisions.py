"""GET /plans/decisions: the latest plan's decisions for the jobs asked about (the queue
page's "why waiting"), not every decision of a large plan."""

from __future__ import annotations

from datetime import timedelta

from fastapi.testclient import TestClient
from sqlmodel import Session, select

from app.clusters.models import Cluster
from app.core.clock import FrozenClock
from tests.app.builders import migration_plan

WAITS = [
    {"job": "a", "action": "wait", "reason": "insufficient_capacity", "message": "full"},
    {"job": "b", "action": "wait", "reason": "quota", "message": "over guarantee"},
    {"job": "c", "action": "start", "reason": "placed", "message": "", "to": "n2"},
]


def test_the_latest_plans_decisions_for_the_jobs_named(
    client: TestClient, auth: dict, session: Session, clock: FrozenClock
) -> None:
    for name in ("alpha", "beta"):
        client.post(
            "/api/v1/clusters", headers=auth["admin"], json={"name": name, "scheduler": "slurm"}
        )
    alpha = session.exec(select(Cluster).where(Cluster.name == "alpha")).one()
    assert alpha.id is not None
    url = "/api/v1/plans/decisions"
    # No plan yet: no decisions, and no plan to name.
    none = client.get(url, headers=auth["viewer"], params={"cluster": "alpha", "job": "a"})
    assert none.status_code == 200, none.text
    assert none.json() == {"cluster": "alpha", "plan_id": None, "created_at": None, "decisions": []}

    migration_plan(session, cluster_id=alpha.id, now=clock.now() - timedelta(hours=1))
    latest, _ = migration_plan(session, cluster_id=alpha.id, now=clock.now(), decisions=WAITS)
    answer = client.get(
        url,
        headers=auth["viewer"],
        params=[("cluster", "alpha"), ("job", "c"), ("job", "a"), ("job", "x")],
    ).json()
    assert answer["plan_id"] == latest.id
    # In the plan's order; "x" is in no decision.
    assert answer["decisions"] == [WAITS[0], WAITS[2]]
    # The same as the plan's own, as GET /plans lists it first.
    listed = client.get("/api/v1/plans", headers=auth["viewer"], params={"cluster": "alpha"}).json()
    assert listed["items"][0]["id"] == latest.id

    beta = client.get(url, headers=auth["viewer"], params={"cluster": "beta", "job": "a"}).json()
    assert beta["plan_id"] is None

    missing = client.get(url, headers=auth["viewer"], params={"cluster": "nope", "job": "a"})
    assert missing.status_code == 404 and "nope" in missing.json()["error"]["message"]
    too_many = client.get(
        url,
        headers=auth["viewer"],
        params=[("cluster", "alpha"), *[("job", str(i)) for i in range(1001)]],
    )
    assert too_many.status_code == 422 and too_many.json()["error"]["field"] == "job"
    no_job = client.get(url, headers=auth["viewer"], params={"cluster": "alpha"})
    assert no_job.status_code == 422
    assert client.get(url, params={"cluster": "alpha", "job": "a"}).status_code == 401
    # A plan's id still reads as before.
    assert client.get(f"/api/v1/plans/{latest.id}", headers=auth["viewer"]).status_code == 200
