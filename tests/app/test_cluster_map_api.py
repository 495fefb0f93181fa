"""GET /nodes/map, the dashboard's cluster map: every node's GPUs with who holds each and
what was measured on it, and the moves of the cluster's latest open plan, on both backends."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, select

from app.actions.models import ActionState
from app.clusters.models import Cluster
from app.core.clock import FrozenClock
from app.core.config import Settings
from app.gpu_models import service as gpu_model_service
from app.jobs.models import Job
from app.nodes import cluster_map
from app.plans.models import PlanState
from app.telemetry import service as telemetry_service
from tests.app.builders import (
    delta,
    job,
    migration_plan,
    node,
    registered_with,
    running,
    snapshot,
)
from wire.telemetry import TelemetryDelta

MAP = "/api/v1/nodes/map"


@pytest.fixture(params=[False, True], ids=["window", "latest"])
def settings(request: pytest.FixtureRequest) -> Settings:
    """Every test here on both of the map's reads: every sample of the window, or
    ``gpu_latest_samples`` (``Settings.map_from_latest_samples``)."""
    return Settings(
        environment="test", max_body_bytes=256 * 1024, map_from_latest_samples=request.param
    )


def _sample(
    at: datetime, metric: str, node_name: str, value: float, gpu: int | None = None
) -> dict[str, Any]:
    sample = {"at": at.isoformat(), "metric": metric, "node": node_name, "value": value}
    return sample if gpu is None else {**sample, "gpu_index": gpu}


def _cluster(session: Session, clock: FrozenClock) -> tuple[int, dict[str, int]]:
    at = clock.now() - timedelta(minutes=1)
    stale = clock.now() - timedelta(hours=1)
    gpu_model_service.ensure_default_catalogue(session=session)  # H100 and L40S
    registered_with(
        session,
        "alpha",
        snapshot(
            1,
            nodes=[node("n1"), node("n2", state="draining"), node("n3", gpu_model="L40S")],
            jobs=[
                running("a", "n1", [0, 1], team="vision"),
                running("b", "n1", [5], team="nlp", sla_class="premium"),
                # A scheduler that only counts: drawn on n2's first GPUs.
                job(
                    "c",
                    state="running",
                    team="nlp",
                    start_time=clock.now().isoformat(),
                    gpus_requested=3,
                    allocations=[{"node": "n2", "gpu_count": 3}],
                ),
                job("waiting", gpus_requested=2),
            ],
            samples=[
                _sample(at, "gpu_util", "n1", 0.9, gpu=0),
                _sample(stale, "gpu_util", "n1", 0.2, gpu=1),
                _sample(at, "gpu_mem_used_gib", "n1", 41.5, gpu=0),
                # Node-wide: every GPU of n2 reads it.
                _sample(stale, "gpu_util", "n2", 0.1),
                _sample(at, "gpu_util", "n2", 0.4),
            ],
        ),
        now=clock.now(),
    )
    cluster = session.exec(select(Cluster).where(Cluster.name == "alpha")).one()
    assert cluster.id is not None
    ids = {j.external_id: j.id for j in session.exec(select(Job)).all() if j.id is not None}
    return cluster.id, ids


def _cells(body: dict[str, Any]) -> dict[str, list[str | None]]:
    jobs = body["jobs"]
    return {
        n["name"]: [None if h is None else jobs[h]["external_id"] for h in n["holders"]]
        for n in body["nodes"]
    }


def test_the_map_holds_every_gpu_with_its_job_and_measurements(
    client: TestClient, auth: dict, session: Session, clock: FrozenClock
) -> None:
    _, ids = _cluster(session, clock)
    response = client.get(MAP, headers=auth["viewer"], params={"cluster": "alpha"})
    assert response.status_code == 200, response.text
    body = response.json()
    free: list[str | None] = [None] * 8
    assert _cells(body) == {
        "n1": ["a", "a", None, None, None, "b", None, None],
        "n2": ["c", "c", "c", *free[:5]],
        "n3": free,
    }
    assert {j["external_id"]: (j["id"], j["team"]) for j in body["jobs"]} == {
        "a": (ids["a"], "vision"),
        "b": (ids["b"], "nlp"),
        "c": (ids["c"], "nlp"),
    }
    assert [(n["name"], n["state"], n["gpu_model"]) for n in body["nodes"]] == [
        ("n1", "up", "H100"),
        ("n2", "draining", "H100"),
        ("n3", "up", "L40S"),
    ]
    assert body["nodes"][0]["gpu_memory_gib"] == 80
    n1, n2, n3 = body["nodes"]
    assert (n1["util"][0], n1["mem_used_gib"][0]) == (0.9, 41.5)
    # Older than the window: not measured now.
    assert (n1["util"][1], n1["mem_used_gib"][1]) == (None, None)
    # The node's latest average, on each of its GPUs.
    assert n2["util"] == [0.4] * 8 and n2["mem_used_gib"] == [None] * 8
    assert n3["util"] == [None] * 8
    assert body["plan"] is None and body["moves"] == []


def test_the_map_draws_the_latest_open_plans_moves(
    client: TestClient, auth: dict, session: Session, clock: FrozenClock
) -> None:
    cluster_id, ids = _cluster(session, clock)
    # An older open plan and a newer rejected one: the map draws the newest open plan.
    plan, (move, done) = migration_plan(
        session, cluster_id=cluster_id, now=clock.now(), moves=2, state=PlanState.approved
    )
    migration_plan(
        session,
        cluster_id=cluster_id,
        now=clock.now() + timedelta(minutes=1),
        state=PlanState.rejected,
    )
    move.job_id = ids["a"]
    move.source_placement = {"n1": 2}
    move.target_placement = {"n3": 2}
    # Ended: where its job is now, no longer a planned move.
    done.state = ActionState.succeeded
    session.add_all([move, done])
    session.commit()
    body = client.get(MAP, headers=auth["viewer"], params={"cluster": "alpha"}).json()
    assert body["plan"]["id"] == plan.id and body["plan"]["state"] == "approved"
    (drawn,) = body["moves"]
    assert drawn["action_id"] == move.id
    assert (drawn["kind"], drawn["job"], drawn["job_id"]) == ("migrate", "a", ids["a"])
    assert drawn["source"] == [{"node": "n1", "gpus": 2, "gpu_indices": [0, 1], "exact": True}]
    # The plan stored no GPU indices: n3's first free GPUs stand for the count.
    assert drawn["target"] == [{"node": "n3", "gpus": 2, "gpu_indices": [0, 1], "exact": False}]


def test_the_map_refuses_what_it_cannot_answer(
    client: TestClient, auth: dict, session: Session, clock: FrozenClock
) -> None:
    _cluster(session, clock)
    unknown = client.get(MAP, headers=auth["viewer"], params={"cluster": "nowhere"})
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "not_found"
    missing = client.get(MAP, headers=auth["viewer"])
    assert missing.status_code == 422 and missing.json()["error"]["field"] == "cluster"
    assert client.get(MAP, params={"cluster": "alpha"}).status_code == 401
    # Agents and connectors read nothing here.
    refused = client.get(MAP, headers=auth["connector_alpha"], params={"cluster": "alpha"})
    assert refused.status_code == 403


def test_both_reads_of_the_measurements_give_the_same_reply(
    session: Session, clock: FrozenClock
) -> None:
    """The map read from ``gpu_latest_samples`` is byte for byte the map read from every
    sample of the window, whatever order the samples came in: late ones, several at one
    instant, one stamped ahead of the clock, node-wide ones beside a GPU's own."""
    _cluster(session, clock)
    now = clock.now()
    pushes = [
        [
            _sample(now - timedelta(minutes=5), "gpu_util", "n1", 0.3, gpu=0),  # late
            _sample(now - timedelta(seconds=30), "gpu_util", "n1", 0.6, gpu=2),
            # Two at one instant: the later written is the latest.
            _sample(now - timedelta(seconds=20), "gpu_util", "n3", 0.1, gpu=4),
            _sample(now - timedelta(seconds=20), "gpu_util", "n3", 0.2, gpu=4),
            _sample(now - timedelta(seconds=20), "gpu_mem_used_gib", "n3", 12.0),
        ],
        [
            # Ahead of the clock: not the window's latest; the one before it is.
            _sample(now + timedelta(minutes=3), "gpu_util", "n3", 0.9, gpu=4),
            _sample(now - timedelta(seconds=10), "gpu_mem_used_gib", "n2", 30.0, gpu=7),
            _sample(now - timedelta(minutes=12), "gpu_mem_used_gib", "n2", 1.0, gpu=6),
        ],
    ]
    for seq, samples in enumerate(pushes, start=2):
        push = TelemetryDelta.model_validate(delta(seq, samples=samples))
        telemetry_service.ingest(session=session, cluster_name="alpha", push=push, now=now)

    def both(at: datetime) -> tuple[str, str]:
        window, latest = (
            cluster_map.cluster_map(session=session, cluster="alpha", now=at, from_latest=mode)
            for mode in (False, True)
        )
        return window.model_dump_json(), latest.model_dump_json()

    window, latest = both(now)
    assert latest == window
    n3 = next(
        n
        for n in cluster_map.cluster_map(
            session=session, cluster="alpha", now=now, from_latest=True
        ).nodes
        if n.name == "n3"
    )
    assert (n3.util[4], n3.mem_used_gib) == (0.2, [12.0] * 8)
    # Later on, the sample stamped ahead is in the window, and then it is the latest.
    for minutes in (4, 9, 11, 14):
        window, latest = both(now + timedelta(minutes=minutes))
        assert latest == window, minutes
