"""Why-idle diagnosis over a tiny history whose causes are worked out by hand."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from rich.console import Console

from app.core.clock import FrozenClock
from app.diagnosis.models import IdleDiagnosis
from app.diagnosis.report import print_diagnosis
from tests.app.builders import job, node, running, snapshot, util_sample
from tests.support.clock import T0

URL = "/api/v1/diagnosis"
TELEMETRY = "/api/v1/clusters/alpha/telemetry"
WINDOW = {
    "cluster": "alpha",
    "since": T0.isoformat(),
    "until": (T0 + timedelta(hours=2)).isoformat(),
}


def _demand(job_id: str, minute: int, value: float) -> dict:
    at = T0 + timedelta(minutes=minute)
    return {"at": at.isoformat(), "metric": "demand_replicas", "job": job_id, "value": value}


@pytest.fixture
def history(
    client: TestClient, auth: dict, clock: FrozenClock, request: pytest.FixtureRequest
) -> None:
    """Three 8-GPU nodes: n1 H100, n2 A100-80G, n3 H100 down throughout.

    First hour: job a (team x) holds n1's GPUs 0-3, measured at 5 % busy; job q (team x,
    4 GPUs) waits, but x may hold 4 GPUs at most (guaranteed 4, borrowing 0).
    Second hour: a and q are gone; job b (team y) holds 2 GPUs of n2, service s (team
    inference) 2 replicas of 1 GPU on n2 for a demand of 1; gang g (team y) of 2 × 8 GPUs
    waits: n1 could take one member, n2 (4 free) none.
    """
    client.post(
        "/api/v1/clusters", headers=auth["admin"], json={"name": "alpha", "scheduler": "sim"}
    )
    policy = {
        "name": "alpha",
        "spec": {"teams": [{"team": "x", "guaranteed_gpus": 4, "borrowing_limit_gpus": 0}]},
    }
    assert client.post("/api/v1/policies", headers=auth["operator"], json=policy).status_code == 201
    if getattr(request, "param", None) == "policy deleted":
        deleted = client.delete("/api/v1/policies/alpha", headers=auth["operator"])
        assert deleted.status_code == 204
    nodes = [node("n1"), node("n2", gpu_model="A100-80G"), node("n3", state="down")]
    later = (T0 + timedelta(hours=1)).isoformat()
    a = running("a", "n1", [0, 1, 2, 3], team="x")
    q = job("q", team="x", gpus_requested=4)
    b = job(
        "b",
        team="y",
        state="running",
        submit_time=later,
        start_time=later,
        allocations=[{"node": "n2", "gpu_indices": [0, 1]}],
    )
    s = job(
        "s",
        team="inference",
        shape="elastic",
        state="running",
        submit_time=later,
        start_time=later,
        gpus_requested=1,
        min_replicas=1,
        max_replicas=4,
        replicas=2,
        allocations=[{"node": "n2", "gpu_indices": [2, 3]}],
    )
    g = job("g", team="y", gpus_requested=16, gang_size=2, submit_time=later)
    steps = [
        (0, [a, q], [util_sample("n1", T0, 0.05)]),
        (60, [b, s, g], [_demand("s", 60, 1.0)]),
        (120, [b, s, g], []),
    ]
    for seq, (minute, jobs, samples) in enumerate(steps, start=1):
        clock.advance(minute * 60 - (clock.now() - T0).total_seconds())
        response = client.post(
            TELEMETRY,
            headers=auth["connector_alpha"],
            json=snapshot(seq, nodes=nodes, jobs=jobs, samples=samples),
        )
        assert response.status_code == 200, response.text


def _diagnosis(client: TestClient, auth: dict) -> dict:
    response = client.get(URL, headers=auth["viewer"], params=WINDOW)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.usefixtures("history")
def test_causes_worked_out_by_hand(client: TestClient, auth: dict) -> None:
    body = _diagnosis(client, auth)
    causes = {c["cause"]: c["gpu_hours"] for c in body["causes"] if c["gpu_hours"]}
    assert causes == {
        "draining_down": 16.0,  # n3, 8 GPUs × 2 h
        "allocated_idle": 4.0,  # a's 4 GPUs at 5 % for an hour
        "quota": 12.0,  # n1's 4 + n2's 8 free in the first hour: only q waits, x is at 4
        "gang_waiting": 8.0,  # n1 in the second hour: one member of g fits
        "fragmentation": 4.0,  # n2's 4 free GPUs in the second hour: no member fits
        "reservation": 1.0,  # s holds 2 replicas for a demand of 1
    }
    assert (body["capacity_gpu_hours"], body["busy_gpu_hours"]) == (48.0, 3.0)
    assert body["idle_gpu_hours"] == pytest.approx(sum(causes.values()))
    teams = {(t["key"], t["cause"]): t["gpu_hours"] for t in body["by_team"]}
    assert teams == {
        (None, "draining_down"): 16.0,
        ("x", "allocated_idle"): 4.0,
        ("x", "quota"): 12.0,
        ("y", "gang_waiting"): 8.0,
        ("y", "fragmentation"): 4.0,
        ("inference", "reservation"): 1.0,
    }
    models = {(m["key"], m["cause"]): m["gpu_hours"] for m in body["by_gpu_model"]}
    assert models[("A100-80G", "quota")] == 8.0 and models[("H100", "quota")] == 4.0
    first_hour = {
        b["cause"]: b["gpu_hours"] for b in body["by_bucket"] if b["start"] == body["since"]
    }
    assert first_hour == {"draining_down": 8.0, "allocated_idle": 4.0, "quota": 12.0}


@pytest.mark.parametrize("history", ["policy deleted"], indirect=True)
@pytest.mark.usefixtures("history")
def test_a_deleted_policy_caps_no_team(client: TestClient, auth: dict) -> None:
    """The same history with x's cap deleted before it: q fits the free GPUs and waits on
    the scheduler's order, not on a quota (the deletion keeps the last spec on record)."""
    causes = {c["cause"]: c["gpu_hours"] for c in _diagnosis(client, auth)["causes"]}
    assert causes["quota"] == 0.0 and causes["queue_order"] == 12.0


@pytest.mark.usefixtures("history")
def test_idle_hours_agree_with_utilization(client: TestClient, auth: dict) -> None:
    """Without a busy threshold in play (it is lowered below a's 5 %), the busy GPU-hours
    of the diagnosis are the allocated GPU-hours of /utilization minus the service's
    replica above demand: two independent readings of the same history."""
    body = client.get(URL, headers=auth["viewer"], params={**WINDOW, "busy_threshold": 0.01}).json()
    utilization = client.get(
        "/api/v1/utilization",
        headers=auth["viewer"],
        params={"since": WINDOW["since"], "until": WINDOW["until"], "bucket_s": 3600},
    ).json()
    (alpha,) = utilization["series"]
    allocated = sum(p["allocated_gpus"] for p in alpha["points"])  # 1-h buckets: GPU-hours
    assert body["busy_gpu_hours"] == pytest.approx(allocated - 1.0)
    assert sum(c["gpu_hours"] for c in body["causes"]) == pytest.approx(body["idle_gpu_hours"])


def test_needs_a_viewer_token(client: TestClient, auth: dict) -> None:
    assert client.get(URL, params=WINDOW).status_code == 401
    refused = client.get(URL, headers=auth["connector_alpha"], params=WINDOW)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden"


def test_window_is_checked(client: TestClient, auth: dict) -> None:
    client.post(
        "/api/v1/clusters", headers=auth["admin"], json={"name": "alpha", "scheduler": "sim"}
    )
    too_long = {**WINDOW, "since": (T0 - timedelta(days=32)).isoformat()}
    response = client.get(URL, headers=auth["viewer"], params=too_long)
    assert response.status_code == 422 and response.json()["error"]["field"] == "since"
    backwards = {**WINDOW, "until": WINDOW["since"]}
    response = client.get(URL, headers=auth["viewer"], params=backwards)
    assert response.status_code == 422 and response.json()["error"]["field"] == "until"
    response = client.get(URL, headers=auth["viewer"], params={**WINDOW, "cluster": "nope"})
    assert response.status_code == 404


@pytest.mark.usefixtures("history")
def test_the_report_prints_every_cause_by_model_and_team(client: TestClient, auth: dict) -> None:
    diagnosis = IdleDiagnosis.model_validate(_diagnosis(client, auth))
    console = Console(record=True, width=200)
    print_diagnosis(diagnosis, console)
    lines = console.export_text().splitlines()

    def row(first: str) -> list[str]:
        (found,) = [line for line in lines if line.strip("│ ").startswith(first + " ")]
        return [cell.strip() for cell in found.strip("│").split("│")]

    # quota: 12 of 45 idle GPU-hours, of 48.
    assert row("quota") == ["quota", "12.0", "26.7 %", "25.0 %"]
    assert row("no_demand") == ["no_demand", "0.0", "0.0 %", "0.0 %"]
    assert row("A100-80G")[-1] == "13.0"  # quota 8, fragmentation 4, reservation 1
    assert row("(none)")[-1] == "16.0"  # the down node belongs to no team


def test_the_cli_names_an_unknown_cluster(tmp_path: Path) -> None:
    env = {**os.environ, "SHAPER_DATA_DIR": str(tmp_path)}
    env.pop("SHAPER_DATABASE_URL", None)
    done = subprocess.run(
        [sys.executable, "-m", "app", "diagnose", "--cluster", "nope", "--hours", "2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2 and "'nope' is not registered" in done.stderr
