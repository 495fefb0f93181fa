"""The fleet overview's figures, computed by hand from a small cluster."""

from __future__ import annotations

from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, select

from app.clusters.models import Cluster
from app.core.clock import FrozenClock
from app.plans.models import PlanState
from tests.app.builders import job, migration_plan, node, running, snapshot, util_sample

URL = "/api/v1/clusters/alpha/telemetry"


@pytest.fixture
def alpha(client: TestClient, auth: dict, clock: FrozenClock) -> None:
    """alpha: n1 (8 GPUs, up; job a holds 4, measured 5 % busy), n2 (8, up; job b holds 2,
    no sample), n3 (8, draining; job c holds 1, 90 % busy), n4 (8, down). Pending: a block
    job of 6 GPUs and an elastic service of 2 GPUs × min 3 replicas."""
    for name in ("alpha", "beta"):
        created = client.post(
            "/api/v1/clusters", headers=auth["admin"], json={"name": name, "scheduler": "sim"}
        )
        assert created.status_code == 201, created.text
    now = clock.now()
    nodes = [node("n1"), node("n2"), node("n3", state="draining"), node("n4", state="down")]
    jobs = [
        running("a", "n1", [0, 1, 2, 3]),
        running("b", "n2", [0, 1]),
        running("c", "n3", [0]),
        job("p1", gpus_requested=6),
        job(
            "s1",
            shape="elastic",
            kind="realtime_inference",
            gpus_requested=2,
            min_replicas=3,
            max_replicas=5,
        ),
    ]
    samples = [
        util_sample("n1", now - timedelta(minutes=5), 0.04),
        util_sample("n1", now - timedelta(minutes=1), 0.06),
        util_sample("n3", now - timedelta(minutes=2), 0.9),
        # Too old to count: n2 stays unmeasured.
        util_sample("n2", now - timedelta(hours=2), 0.9),
    ]
    response = client.post(
        URL,
        headers=auth["connector_alpha"],
        json=snapshot(1, nodes=nodes, jobs=jobs, samples=samples),
    )
    assert response.status_code == 200, response.text


@pytest.mark.usefixtures("alpha")
def test_figures_per_cluster_and_for_the_fleet(
    client: TestClient, auth: dict, session: Session, clock: FrozenClock
) -> None:
    cluster = session.exec(select(Cluster).where(Cluster.name == "alpha")).one()
    assert cluster.id is not None
    migration_plan(
        session, cluster_id=cluster.id, now=clock.now(), moves=2, state=PlanState.proposed
    )

    response = client.get("/api/v1/overview", headers=auth["viewer"])
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["busy_threshold"] == 0.1 and body["recent_s"] == 900
    by_name = {c["cluster"]: c for c in body["clusters"]}
    assert list(by_name) == ["alpha", "beta"]
    alpha = {k: v for k, v in by_name["alpha"].items() if k not in ("cluster", "mode")}
    assert alpha == {
        "gpus": 24,  # n4 is down
        "gpus_down": 8,
        "allocated": 7,
        "free": 4 + 6,  # n3's unheld GPUs are draining, not free
        "idle_allocated": 4,  # n1: 5 % busy
        "unmeasured_allocated": 2,  # n2: its only sample is too old
        "pending_jobs": 2,
        "pending_gpus": 6 + 2 * 3,
        "awaiting_approval_actions": 2,
        "awaiting_approval_plans": 1,
    }
    assert body["fleet"] == alpha  # beta has nothing yet
    assert by_name["beta"]["gpus"] == 0

    # The figures agree with the listings they summarize.
    nodes = client.get("/api/v1/nodes", headers=auth["viewer"], params={"cluster": "alpha"})
    assert sum(n["gpus_allocated"] for n in nodes.json()["items"]) == alpha["allocated"]


@pytest.mark.usefixtures("alpha")
def test_threshold_and_window_are_parameters(client: TestClient, auth: dict) -> None:
    params = {"busy_threshold": "0.95", "recent_s": "10800"}
    response = client.get("/api/v1/overview", headers=auth["viewer"], params=params)
    assert response.status_code == 200, response.text
    alpha = response.json()["clusters"][0]
    # n2's old sample now counts; every node is under 95 % busy.
    assert alpha["idle_allocated"] == 7 and alpha["unmeasured_allocated"] == 0
    bad = client.get("/api/v1/overview", headers=auth["viewer"], params={"busy_threshold": "0"})
    assert bad.status_code == 422
    assert bad.json()["error"]["field"] == "busy_threshold"


def test_free_gpus_samples_do_not_make_a_busy_job_idle(
    client: TestClient, auth: dict, clock: FrozenClock
) -> None:
    """Per-GPU samples: job a on GPU 0 at 70 %, the node's seven free GPUs at 0 % (a node
    mean of 9 %); job b on GPUs 0-3 of another node at 2 % beside job c on GPUs 4-7 at
    100 %. Only b's four GPUs are idle."""
    created = client.post(
        "/api/v1/clusters", headers=auth["admin"], json={"name": "alpha", "scheduler": "sim"}
    )
    assert created.status_code == 201, created.text
    now = clock.now() - timedelta(minutes=1)

    def gpu_sample(node_name: str, index: int, value: float) -> dict:
        return {**util_sample(node_name, now, value), "gpu_index": index}

    samples = [gpu_sample("n1", 0, 0.7), *(gpu_sample("n1", i, 0.0) for i in range(1, 8))]
    samples += [gpu_sample("n2", i, 0.02) for i in range(4)]
    samples += [gpu_sample("n2", i, 1.0) for i in range(4, 8)]
    jobs = [
        running("a", "n1", [0]),
        running("b", "n2", [0, 1, 2, 3]),
        running("c", "n2", [4, 5, 6, 7]),
    ]
    response = client.post(
        URL,
        headers=auth["connector_alpha"],
        json=snapshot(1, nodes=[node("n1"), node("n2")], jobs=jobs, samples=samples),
    )
    assert response.status_code == 200, response.text
    alpha = client.get("/api/v1/overview", headers=auth["viewer"]).json()["clusters"][0]
    assert (alpha["allocated"], alpha["idle_allocated"], alpha["unmeasured_allocated"]) == (
        9,
        4,
        0,
    )


def test_needs_a_viewer_token(client: TestClient) -> None:
    assert client.get("/api/v1/overview").status_code == 401
