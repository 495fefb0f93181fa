from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from pydantic import TypeAdapter
from sqlmodel import Session

from app.clusters import service as cluster_service
from app.clusters.models import ClusterPublic
from app.core.paging import Page
from app.jobs import service as job_service
from app.jobs.models import JobPublic
from tests.app.builders import job, node, running, snapshot


@pytest.fixture
def populated(client: TestClient, auth: dict) -> None:
    client.post(
        "/api/v1/clusters", headers=auth["admin"], json={"name": "alpha", "scheduler": "slurm"}
    )
    jobs = [job(f"p{i}", priority=i, team="vision" if i % 2 else "nlp") for i in range(7)]
    jobs.append(running("r1", "n1", [0, 1, 2], priority=3, team="nlp"))
    nodes = [node("n1"), node("n2", gpu_model="A100-80G"), node("n3", state="draining")]
    body = snapshot(1, nodes=nodes, jobs=jobs)
    assert (
        client.post(
            "/api/v1/clusters/alpha/telemetry", headers=auth["connector_alpha"], json=body
        ).status_code
        == 200
    )


@pytest.mark.usefixtures("populated")
def test_jobs_filter_sort_paginate(client: TestClient, auth: dict) -> None:
    get = lambda **p: client.get("/api/v1/jobs", headers=auth["viewer"], params=p).json()  # noqa: E731
    first = get(sort="-priority", limit=3)
    assert first["total"] == 8 and first["limit"] == 3
    assert [j["external_id"] for j in first["items"]] == ["p6", "p5", "p4"]
    second = get(sort="-priority", limit=3, offset=3)
    assert [j["priority"] for j in second["items"]] == [3, 3, 2]
    assert {j["external_id"] for j in get(team="vision")["items"]} == {"p1", "p3", "p5"}
    assert [j["external_id"] for j in get(state="running")["items"]] == ["r1"]
    assert get(cluster="nowhere")["total"] == 0
    by_name = get(sort="external_id", limit=2)
    assert [j["external_id"] for j in by_name["items"]] == ["p0", "p1"]


@pytest.mark.usefixtures("populated")
def test_hot_lists_answer_what_fastapi_wrote(
    client: TestClient, auth: dict, session: Session
) -> None:
    """GET /jobs and GET /clusters write their answers themselves (issue 13): byte for
    byte what FastAPI wrote for the same values built as every other route builds them."""
    answer = client.get("/api/v1/jobs", headers=auth["viewer"], params={"limit": 5, "offset": 1})
    assert answer.headers["content-type"] == "application/json"
    ids = [item["id"] for item in answer.json()["items"]]
    items = [job_service.get_job(session=session, job_id=i) for i in ids]
    page = Page[JobPublic](items=items, total=8, limit=5, offset=1)
    assert answer.content == TypeAdapter(Page[JobPublic]).dump_json(page, by_alias=True)
    assert any(item.allocations for item in items)  # nested rows compared too

    answer = client.get("/api/v1/clusters", headers=auth["viewer"])
    clusters = cluster_service.to_public(
        session=session, clusters=cluster_service.list_clusters(session=session)
    )
    assert answer.content == TypeAdapter(list[ClusterPublic]).dump_json(clusters, by_alias=True)


@pytest.mark.usefixtures("populated")
def test_nodes_filter_and_sort(client: TestClient, auth: dict) -> None:
    get = lambda **p: client.get("/api/v1/nodes", headers=auth["viewer"], params=p).json()  # noqa: E731
    assert [n["name"] for n in get(gpu_model="A100-80G")["items"]] == ["n2"]
    assert [n["name"] for n in get(state="draining")["items"]] == ["n3"]
    busiest = get(sort="-gpus_allocated,name")["items"]
    assert [(n["name"], n["gpus_allocated"]) for n in busiest] == [("n1", 3), ("n2", 0), ("n3", 0)]


@pytest.mark.usefixtures("populated")
@pytest.mark.parametrize(
    ("path", "params", "field"),
    [
        ("/api/v1/jobs", {"sort": "-colour"}, "sort"),
        ("/api/v1/jobs", {"limit": "0"}, "limit"),
        ("/api/v1/jobs", {"limit": "5000"}, "limit"),
        ("/api/v1/jobs", {"offset": "-1"}, "offset"),
        ("/api/v1/jobs", {"state": "sleeping"}, "state"),
        ("/api/v1/nodes", {"sort": "rack"}, "sort"),
    ],
)
def test_bad_list_parameters(
    client: TestClient, auth: dict, path: str, params: dict, field: str
) -> None:
    response = client.get(path, headers=auth["viewer"], params=params)
    assert response.status_code == 422
    assert response.json()["error"]["field"] == field


@pytest.mark.usefixtures("populated")
def test_job_by_id(client: TestClient, auth: dict) -> None:
    running_job = client.get(
        "/api/v1/jobs", headers=auth["viewer"], params={"state": "running"}
    ).json()["items"][0]
    one = client.get(f"/api/v1/jobs/{running_job['id']}", headers=auth["viewer"]).json()
    assert one["external_id"] == "r1" and one["allocations"][0]["gpu_indices"] == [0, 1, 2]
    assert client.get("/api/v1/jobs/999999", headers=auth["viewer"]).status_code == 404
    assert client.get("/api/v1/jobs/abc", headers=auth["viewer"]).json()["error"]["field"] == (
        "job_id"
    )
