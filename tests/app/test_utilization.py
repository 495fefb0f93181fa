"""Utilization figures computed by hand from a tiny history."""

from __future__ import annotations

from datetime import timedelta

import pytest
from fastapi.testclient import TestClient

from app.core.clock import FrozenClock
from tests.app.builders import job, node, running, snapshot, util_sample
from tests.support.clock import T0

URL = "/api/v1/clusters/alpha/telemetry"


@pytest.fixture
def history(client: TestClient, auth: dict, clock: FrozenClock) -> None:
    """n1 (8 × H100) and n2 (8 × A100-80G). From T0 to T0+1h job a (team x) holds 4 GPUs of
    n1; from T0+30min to T0+2h job b (team y) holds 2 GPUs of n2."""
    client.post(
        "/api/v1/clusters", headers=auth["admin"], json={"name": "alpha", "scheduler": "sim"}
    )
    nodes = [node("n1"), node("n2", gpu_model="A100-80G")]
    a = running("a", "n1", [0, 1, 2, 3], team="x")
    b = running("b", "n2", [0, 1], team="y")
    steps = [
        (0, [a, job("b", team="y")], [util_sample("n1", T0, 0.4), util_sample("n1", T0, 0.6)]),
        (30, [a, b], []),
        (60, [b], [util_sample("n2", T0 + timedelta(minutes=60), 0.2)]),
        (120, [], []),
    ]
    for seq, (minute, jobs, samples) in enumerate(steps, start=1):
        clock.advance(minute * 60 - (clock.now() - T0).total_seconds())
        response = client.post(
            URL,
            headers=auth["connector_alpha"],
            json=snapshot(seq, nodes=nodes, jobs=jobs, samples=samples),
        )
        assert response.status_code == 200, response.text
    clock.advance(3600)


def _series(client: TestClient, auth: dict, group_by: str) -> dict[str, dict]:
    params = {
        "group_by": group_by,
        "since": T0.isoformat(),
        "until": (T0 + timedelta(hours=2)).isoformat(),
        "bucket_s": "1800",
    }
    response = client.get("/api/v1/utilization", headers=auth["viewer"], params=params)
    assert response.status_code == 200, response.text
    return {s["key"]: s for s in response.json()["series"]}


@pytest.mark.usefixtures("history")
def test_by_cluster(client: TestClient, auth: dict) -> None:
    alpha = _series(client, auth, "cluster")["alpha"]
    assert alpha["capacity_gpus"] == 16
    # GPUs allocated per 30-min bucket: 4, 4+2, 2, 2  → shares of 16.
    assert [p["allocated_gpus"] for p in alpha["points"]] == [4, 6, 2, 2]
    assert [p["allocated_share"] for p in alpha["points"]] == [0.25, 0.375, 0.125, 0.125]
    assert [p["measured_util"] for p in alpha["points"]] == [0.5, None, 0.2, None]


@pytest.mark.usefixtures("history")
def test_by_gpu_model_and_team(client: TestClient, auth: dict) -> None:
    models = _series(client, auth, "gpu_model")
    assert [p["allocated_share"] for p in models["H100"]["points"]] == [0.5, 0.5, 0, 0]
    assert [p["allocated_share"] for p in models["A100-80G"]["points"]] == [0, 0.25, 0.25, 0.25]
    teams = _series(client, auth, "team")
    assert [p["allocated_gpus"] for p in teams["x"]["points"]] == [4, 4, 0, 0]
    assert [p["allocated_gpus"] for p in teams["y"]["points"]] == [0, 2, 2, 2]
    assert teams["y"]["capacity_gpus"] == 16


def test_bad_windows(client: TestClient, auth: dict) -> None:
    params = {"since": T0.isoformat(), "until": T0.isoformat()}
    same = client.get("/api/v1/utilization", headers=auth["viewer"], params=params)
    assert same.status_code == 422 and same.json()["error"]["field"] == "until"
    naive = client.get(
        "/api/v1/utilization", headers=auth["viewer"], params={"since": "2026-01-01T00:00:00"}
    )
    assert naive.status_code == 422 and naive.json()["error"]["field"] == "since"
    many = client.get(
        "/api/v1/utilization",
        headers=auth["viewer"],
        params={
            "since": (T0 - timedelta(days=365)).isoformat(),
            "until": T0.isoformat(),
            "bucket_s": "60",
        },
    )
    assert many.status_code == 422 and many.json()["error"]["field"] == "bucket_s"
