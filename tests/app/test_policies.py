from __future__ import annotations

from fastapi.testclient import TestClient

SPEC = {
    "teams": [
        {
            "team": "vision",
            "priority_weight": 2,
            "guaranteed_gpus": 16,
            "borrowing_limit_gpus": 8,
            "max_queue_wait_s": 3600,
        }
    ],
    "services": [{"service": "chat-api", "min_replicas": 2}],
}


def test_policies_are_versioned(client: TestClient, auth: dict) -> None:
    created = client.post(
        "/api/v1/policies",
        headers=auth["operator"],
        json={"name": "default", "spec": SPEC, "comment": "first"},
    )
    assert created.status_code == 201 and created.json()["version"] == 1
    edited = {**SPEC, "teams": [{**SPEC["teams"][0], "guaranteed_gpus": 32}]}
    v2 = client.put(
        "/api/v1/policies/default",
        headers=auth["operator"],
        json={"spec": edited, "comment": "more for vision"},
    )
    assert v2.status_code == 200 and v2.json()["version"] == 2
    assert v2.json()["created_by"] == "operator"
    latest = client.get("/api/v1/policies/default", headers=auth["viewer"]).json()
    assert latest["spec"]["teams"][0]["guaranteed_gpus"] == 32
    first = client.get("/api/v1/policies/default/versions/1", headers=auth["viewer"]).json()
    assert first["spec"]["teams"][0]["guaranteed_gpus"] == 16
    versions = client.get("/api/v1/policies/default/versions", headers=auth["viewer"]).json()
    assert [v["version"] for v in versions] == [1, 2]
    assert [
        p["version"] for p in client.get("/api/v1/policies", headers=auth["viewer"]).json()
    ] == [2]
    dup = client.post(
        "/api/v1/policies", headers=auth["operator"], json={"name": "default", "spec": SPEC}
    )
    assert dup.status_code == 409


def test_bad_policies_are_refused(client: TestClient, auth: dict) -> None:
    twice = {"teams": [{"team": "a"}, {"team": "a"}]}
    response = client.post(
        "/api/v1/policies", headers=auth["operator"], json={"name": "p", "spec": twice}
    )
    assert response.status_code == 422 and "appears twice" in response.json()["error"]["message"]
    negative = {"teams": [{"team": "a", "guaranteed_gpus": -1}]}
    response = client.post(
        "/api/v1/policies", headers=auth["operator"], json={"name": "p", "spec": negative}
    )
    assert response.json()["error"]["field"] == "spec.teams[0].guaranteed_gpus"
    assert (
        client.put(
            "/api/v1/policies/nope", headers=auth["operator"], json={"spec": SPEC}
        ).status_code
        == 404
    )
    assert client.get("/api/v1/policies", headers=auth["viewer"]).json() == []
