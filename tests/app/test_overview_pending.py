"""The overview's pending figures against the jobs themselves: per cluster, the pending jobs
and the GPUs they ask for (a block job its gpus_requested; an elastic service that many per
replica, min_replicas of them, at least one), summed by hand from what was pushed, and
again after jobs leave the queue, start or change their minimum."""

from __future__ import annotations

import random
from typing import Any

from fastapi.testclient import TestClient

from tests.app.builders import job, node, running, snapshot


def _pending_jobs(rng: random.Random, prefix: str, n: int) -> list[dict[str, Any]]:
    jobs = []
    for i in range(n):
        gpus = rng.choice([1, 2, 4, 8])
        if rng.random() < 0.4:
            low = rng.choice([0, 1, 2, 3])
            jobs.append(
                job(
                    f"{prefix}-{i}",
                    shape="elastic",
                    kind="realtime_inference",
                    gpus_requested=gpus,
                    min_replicas=low,
                    max_replicas=low + rng.choice([0, 2]),
                )
            )
        else:
            jobs.append(job(f"{prefix}-{i}", gpus_requested=gpus))
    return jobs


def _asked(jobs: list[dict[str, Any]]) -> tuple[int, int]:
    """(pending jobs, GPUs they ask for), by hand."""
    pending = [j for j in jobs if j["state"] == "pending"]
    gpus = sum(
        j["gpus_requested"]
        * (max(j.get("min_replicas", 0), 1) if j.get("shape") == "elastic" else 1)
        for j in pending
    )
    return len(pending), gpus


def _pending_figures(client: TestClient, auth: dict) -> dict[str, tuple[int, int]]:
    response = client.get("/api/v1/overview", headers=auth["viewer"])
    assert response.status_code == 200, response.text
    body = response.json()
    figures = {c["cluster"]: (c["pending_jobs"], c["pending_gpus"]) for c in body["clusters"]}
    fleet = body["fleet"]
    assert (fleet["pending_jobs"], fleet["pending_gpus"]) == tuple(
        map(sum, zip(*figures.values(), strict=True))
    )
    return figures


def test_pending_figures_follow_the_jobs(client: TestClient, auth: dict) -> None:
    rng = random.Random(18)
    pushed: dict[str, list[dict[str, Any]]] = {}
    for name in ("alpha", "beta"):
        created = client.post(
            "/api/v1/clusters", headers=auth["admin"], json={"name": name, "scheduler": "sim"}
        )
        assert created.status_code == 201, created.text
        pushed[name] = [running(f"{name}-r", "n1", [0, 1])] + _pending_jobs(rng, name, 40)
        response = client.post(
            f"/api/v1/clusters/{name}/telemetry",
            headers=auth[f"connector_{name}"],
            json=snapshot(1, nodes=[node("n1"), node("n2")], jobs=pushed[name]),
        )
        assert response.status_code == 200, response.text
    assert _pending_figures(client, auth) == {n: _asked(j) for n, j in pushed.items()}

    # alpha's queue moves: some jobs start, some finish, some elastic services change their
    # minimum (to none, or more); beta's stays. The figures follow.
    moved = []
    nodes = [node(f"n{k}") for k in range(1, 12)]
    for i, j in enumerate(pushed["alpha"]):
        j = dict(j)
        if j["state"] == "pending" and i % 5 == 1:
            where = [{"node": f"n{2 + i // 5}", "gpu_indices": [0]}]
            j.update(state="running", start_time=j["submit_time"], allocations=where,
                     gpus_requested=1, shape="block", min_replicas=0, max_replicas=0)  # fmt: skip
        elif j["state"] == "pending" and i % 5 == 2:
            j.update(state="finished", end_time=j["submit_time"])
        elif j.get("shape") == "elastic" and i % 5 == 3:
            low = 0 if j["min_replicas"] else 3
            j.update(min_replicas=low, max_replicas=max(low, j["max_replicas"]))
        moved.append(j)
    pushed["alpha"] = moved
    response = client.post(
        "/api/v1/clusters/alpha/telemetry",
        headers=auth["connector_alpha"],
        json=snapshot(2, nodes=nodes, jobs=moved),
    )
    assert response.status_code == 200, response.text
    before = _asked(pushed["beta"])
    assert _pending_figures(client, auth) == {"alpha": _asked(moved), "beta": before}
    assert _asked(moved)[0] < 40
