from __future__ import annotations

from fastapi.testclient import TestClient
from sqlmodel import Session, select

from app.clusters.models import Cluster
from app.core.clock import FrozenClock
from app.core.lookup import row_id
from app.nodes.models import Node
from wire.telemetry import NodeState


def test_register_list_get_update_delete(client: TestClient, auth: dict) -> None:
    created = client.post(
        "/api/v1/clusters",
        headers=auth["admin"],
        json={"name": "alpha", "scheduler": "slurm", "description": "A"},
    )
    assert created.status_code == 201, created.text
    assert created.json()["connector_status"] == "never_seen"
    assert created.json()["mode"] == "observe"

    listed = client.get("/api/v1/clusters", headers=auth["viewer"]).json()
    assert [c["name"] for c in listed] == ["alpha"]

    patched = client.patch(
        "/api/v1/clusters/alpha", headers=auth["operator"], json={"mode": "advise"}
    )
    assert patched.status_code == 200 and patched.json()["mode"] == "advise"
    assert client.get("/api/v1/clusters/alpha", headers=auth["viewer"]).json()["mode"] == "advise"

    assert client.delete("/api/v1/clusters/alpha", headers=auth["admin"]).status_code == 204
    missing = client.get("/api/v1/clusters/alpha", headers=auth["viewer"])
    assert missing.status_code == 404
    assert missing.json()["error"] == {
        "code": "not_found",
        "message": "cluster 'alpha' is not registered",
        "resource": "cluster",
        "id": "alpha",
        "retryable": False,
    }


def test_duplicate_and_invalid_names(client: TestClient, auth: dict) -> None:
    body = {"name": "alpha", "scheduler": "slurm"}
    assert client.post("/api/v1/clusters", headers=auth["admin"], json=body).status_code == 201
    again = client.post("/api/v1/clusters", headers=auth["admin"], json=body)
    assert again.status_code == 409 and again.json()["error"]["field"] == "name"

    bad = client.post(
        "/api/v1/clusters", headers=auth["admin"], json={"name": "Has Spaces", "scheduler": "slurm"}
    )
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "name"
    kind = client.post(
        "/api/v1/clusters", headers=auth["admin"], json={"name": "beta", "scheduler": "pbs"}
    )
    assert kind.status_code == 422 and kind.json()["error"]["field"] == "scheduler"
    assert [c["name"] for c in client.get("/api/v1/clusters", headers=auth["viewer"]).json()] == [
        "alpha"
    ]


def test_health_needs_no_token(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").json() == {"status": "ok"}


def test_gpu_catalogue(client: TestClient, auth: dict) -> None:
    models = {m["name"]: m for m in client.get("/api/v1/gpu-models", headers=auth["viewer"]).json()}
    assert "fp8" in models["H100"]["precisions"] and "fp8" not in models["A100-80G"]["precisions"]
    created = client.post(
        "/api/v1/gpu-models",
        headers=auth["admin"],
        json={
            "name": "MI300X",
            "vendor": "amd",
            "memory_gib": 192,
            "relative_speed": 2.5,
            "precisions": ["fp16", "bf16", "fp8"],
        },
    )
    assert created.status_code == 201
    assert created.json()["precisions"] == ["bf16", "fp16", "fp8"]
    dup = client.post(
        "/api/v1/gpu-models",
        headers=auth["admin"],
        json={"name": "MI300X", "memory_gib": 192, "precisions": ["fp16"]},
    )
    assert dup.status_code == 409
    bad = client.post(
        "/api/v1/gpu-models",
        headers=auth["admin"],
        json={"name": "X1", "memory_gib": -1, "precisions": ["fp16"]},
    )
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "memory_gib"
    assert client.get("/api/v1/gpu-models/MI300X", headers=auth["viewer"]).status_code == 200
    assert client.get("/api/v1/gpu-models/nope", headers=auth["viewer"]).status_code == 404


def test_the_list_shows_each_cluster_as_its_own_page_does(
    client: TestClient, auth: dict, session: Session, clock: FrozenClock
) -> None:
    """GET /clusters reads its columns in one statement (``list_public``); GET
    /clusters/{name} goes through ``to_public``: the two must agree, counts (down nodes
    left out), labels and federation group included."""
    for name in ("beta", "alpha", "gamma"):
        body = {"name": name, "scheduler": "sim", "labels": {"region": f"r-{name}"}}
        assert client.post("/api/v1/clusters", headers=auth["admin"], json=body).status_code == 201
    alpha = session.exec(select(Cluster).where(Cluster.name == "alpha")).one()
    for index, state in enumerate([NodeState.up, NodeState.up, NodeState.down]):
        session.add(
            Node(
                cluster_id=row_id(alpha),
                name=f"n{index}",
                gpu_count=8,
                state=state,
                updated_at=clock.now(),
            )
        )
    session.flush()
    group = {"name": "site"}
    assert client.post("/api/v1/federation-groups", headers=auth["admin"], json=group).is_success
    joined = client.put("/api/v1/federation-groups/site/clusters/alpha", headers=auth["admin"])
    assert joined.is_success, joined.text

    listed = client.get("/api/v1/clusters", headers=auth["viewer"]).json()
    assert [c["name"] for c in listed] == ["alpha", "beta", "gamma"]
    for cluster in listed:
        one = client.get(f"/api/v1/clusters/{cluster['name']}", headers=auth["viewer"])
        assert cluster == one.json()
    assert (listed[0]["node_count"], listed[0]["gpu_count"]) == (2, 16)
    assert listed[0]["federation_group"] == "site"
    assert (listed[1]["node_count"], listed[1]["federation_group"]) == (0, None)
