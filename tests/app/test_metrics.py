"""GET /metrics: what a scrape says about a cluster the test built, label by label."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlmodel import Session

from app.core.clock import FrozenClock
from app.shaping.cycle import run_cycle
from tests.app.builders import T0, job, node, running, snapshot, util_sample


def _scrape(client: TestClient, auth: dict) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    response = client.get("/metrics", headers=auth["viewer"])
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    found: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            key = tuple(sorted(sample.labels.items()))
            found.setdefault(sample.name, {})[key] = sample.value
    return found


def _labels(**labels: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


def _site(client: TestClient, auth: dict) -> None:
    client.post(
        "/api/v1/clusters",
        headers=auth["admin"],
        json={"name": "alpha", "scheduler": "slurm", "mode": "advise"},
    )
    jobs: list[dict[str, Any]] = [
        running("j1", "n1", [0, 1, 2, 3], checkpointable=True, priority=10),
        running("j2", "n2", [0, 1, 2, 3], team="nlp", checkpointable=True, priority=10),
        job("big", gpus_requested=8, priority=50, sla_class="gold"),
        job("small", gpus_requested=1),
    ]
    response = client.post(
        "/api/v1/clusters/alpha/telemetry",
        headers=auth["connector_alpha"],
        json=snapshot(
            1,
            nodes=[node("n1"), node("n2"), node("n3", state="down")],
            jobs=jobs,
            samples=[util_sample("n1", T0, 0.25), util_sample("n2", T0, 0.75)],
        ),
    )
    assert response.status_code == 200, response.text


def test_metrics_need_a_viewer_token(client: TestClient, auth: dict) -> None:
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers=auth["connector_alpha"]).status_code == 403
    assert client.get("/metrics", headers=auth["viewer"]).status_code == 200


def test_a_scrape_shows_gpus_teams_queue_busy_plans_and_actions(
    client: TestClient, auth: dict, session: Session, clock: FrozenClock
) -> None:
    _site(client, auth)
    clock.advance(600)  # the queue has waited 10 minutes

    found = _scrape(client, auth)

    gpus = found["shaper_gpus"]
    assert gpus[_labels(cluster="alpha", gpu_model="H100", state="allocated")] == 8
    assert gpus[_labels(cluster="alpha", gpu_model="H100", state="free")] == 8
    assert gpus[_labels(cluster="alpha", gpu_model="H100", state="unavailable")] == 8  # n3
    teams = found["shaper_team_gpus_allocated"]
    assert teams == {
        _labels(cluster="alpha", team="vision"): 4,
        _labels(cluster="alpha", team="nlp"): 4,
    }
    jobs = found["shaper_jobs"]
    assert jobs[_labels(cluster="alpha", state="running")] == 2
    assert jobs[_labels(cluster="alpha", state="pending")] == 2
    queue = found["shaper_queue_jobs"]
    assert queue == {
        _labels(cluster="alpha", sla_class="gold"): 1,
        _labels(cluster="alpha", sla_class="standard"): 1,
    }
    assert found["shaper_queue_wait_seconds_max"][_labels(cluster="alpha", sla_class="gold")] == 600
    # The samples are 10 minutes old by now: outside the 5-minute busy window.
    assert found.get("shaper_gpu_busy_ratio", {}) == {}
    assert found["shaper_telemetry_age_seconds"] == {_labels(cluster="alpha"): 600}
    assert found["shaper_telemetry_last_seq"] == {_labels(cluster="alpha"): 1}

    result = run_cycle(session=session, cluster_name="alpha", now=clock.now(), policy="shaper")
    found = _scrape(client, auth)
    assert _labels(cluster="alpha") in found["shaper_plan_solve_seconds"]
    assert found["shaper_plan_age_seconds"] == {_labels(cluster="alpha"): 0}
    proposed = {
        dict(key)["kind"]: value
        for key, value in found["shaper_actions"].items()
        if dict(key)["state"] == "proposed"
    }
    assert sum(proposed.values()) == result.actions > 0
    assert not any("job" in name for labels in found["shaper_actions"] for name, _ in labels)


def test_busy_is_the_mean_of_recent_gpu_samples(
    client: TestClient, auth: dict, clock: FrozenClock
) -> None:
    _site(client, auth)
    clock.advance(60)
    busy = _scrape(client, auth)["shaper_gpu_busy_ratio"]
    assert busy == {_labels(cluster="alpha", gpu_model="H100"): 0.5}


def test_request_latency_is_labelled_by_route_template_not_by_path(
    client: TestClient, auth: dict
) -> None:
    _site(client, auth)
    assert client.get("/api/v1/jobs/999999", headers=auth["viewer"]).status_code == 404
    counts = _scrape(client, auth)["shaper_http_request_duration_seconds_count"]
    routes = {dict(key)["route"]: dict(key) for key in counts}
    assert (
        _labels(method="POST", route="/api/v1/clusters/{cluster}/telemetry", status="2xx") in counts
    )
    assert _labels(method="GET", route="/api/v1/jobs/{job_id}", status="4xx") in counts
    assert not any("999999" in route for route in routes)


def test_idle_gpu_hours_by_cause_are_the_last_hours_diagnosis(
    client: TestClient, auth: dict, clock: FrozenClock
) -> None:
    _site(client, auth)
    clock.advance(1800)
    idle = _scrape(client, auth)["shaper_idle_gpu_hours"]
    now = clock.now()
    response = client.get(
        "/api/v1/diagnosis",
        headers=auth["viewer"],
        params={
            "cluster": "alpha",
            "since": (now - timedelta(hours=1)).isoformat(),
            "until": now.isoformat(),
        },
    )
    assert response.status_code == 200, response.text
    diagnosis = response.json()
    assert diagnosis["idle_gpu_hours"] > 0
    assert idle == {
        _labels(cluster="alpha", gpu_model=cell["key"] or "none", cause=cell["cause"]): cell[
            "gpu_hours"
        ]
        for cell in diagnosis["by_gpu_model"]
    }
    assert sum(idle.values()) == pytest.approx(diagnosis["idle_gpu_hours"], abs=1e-5)
    causes = {dict(key)["cause"] for key in idle}
    assert causes <= {c["cause"] for c in diagnosis["causes"]}
    assert "draining_down" in causes  # n3 is down
