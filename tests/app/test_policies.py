from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session

from app.core.clock import FrozenClock
from app.policies import service
from app.policies.models import SlaPolicySpec
from app.shaping.snapshot import take_snapshot

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
# As stored: every field of the spec, defaults included.
SPEC_JSON: dict[str, Any] = SlaPolicySpec.model_validate(SPEC).model_dump(mode="json")


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


def test_a_deleted_policy_stops_applying_and_keeps_its_history(
    client: TestClient, auth: dict, session: Session, clock: FrozenClock
) -> None:
    client.post(
        "/api/v1/clusters",
        headers=auth["admin"],
        json={"name": "alpha", "scheduler": "sim"},
    )
    client.post("/api/v1/policies", headers=auth["operator"], json={"name": "alpha", "spec": SPEC})
    assert take_snapshot(session=session, cluster_name="alpha", now=clock.now()).sla == SPEC_JSON

    assert client.delete("/api/v1/policies/alpha", headers=auth["viewer"]).status_code == 403
    assert client.delete("/api/v1/policies/alpha", headers=auth["operator"]).status_code == 204
    gone = client.get("/api/v1/policies/alpha", headers=auth["viewer"])
    assert gone.status_code == 404 and "was deleted" in gone.json()["error"]["message"]
    assert client.get("/api/v1/policies", headers=auth["viewer"]).json() == []
    versions = client.get("/api/v1/policies/alpha/versions", headers=auth["viewer"]).json()
    assert [(v["version"], v["deleted"]) for v in versions] == [(1, False), (2, True)]
    assert versions[1]["spec"] == versions[0]["spec"]  # the last terms, for the record
    session.expire_all()
    assert take_snapshot(session=session, cluster_name="alpha", now=clock.now()).sla == {}

    # Deleting again, or editing what is deleted, finds nothing; creating continues history.
    assert client.delete("/api/v1/policies/alpha", headers=auth["operator"]).status_code == 404
    assert (
        client.put("/api/v1/policies/alpha", headers=auth["operator"], json={"spec": SPEC})
    ).status_code == 404
    again = client.post(
        "/api/v1/policies", headers=auth["operator"], json={"name": "alpha", "spec": SPEC}
    )
    assert again.status_code == 201 and again.json()["version"] == 3
    assert [p["name"] for p in client.get("/api/v1/policies", headers=auth["viewer"]).json()] == [
        "alpha"
    ]
    audit = client.get(
        "/api/v1/audit", params={"object_type": "sla_policy"}, headers=auth["admin"]
    ).json()
    assert [e["action"] for e in audit["items"]].count("sla_policy.delete") == 1


def test_an_edit_racing_another_is_a_conflict_not_a_server_error(
    client: TestClient, auth: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    client.post("/api/v1/policies", headers=auth["operator"], json={"name": "race", "spec": SPEC})
    first = service.get_policy
    read: list[Any] = []

    def stale(**kwargs: Any) -> Any:
        # What a concurrent edit read: version 1, before the other wrote version 2.
        read.append(first(**kwargs))
        return read[0]

    assert (
        client.put("/api/v1/policies/race", headers=auth["operator"], json={"spec": SPEC}).json()[
            "version"
        ]
        == 2
    )
    monkeypatch.setattr(service, "get_policy", lambda **kwargs: stale(**{**kwargs, "version": 1}))
    raced = client.put("/api/v1/policies/race", headers=auth["operator"], json={"spec": SPEC})
    assert raced.status_code == 409, raced.text
    assert raced.json()["error"]["code"] == "conflict"
    monkeypatch.undo()
    versions = client.get("/api/v1/policies/race/versions", headers=auth["viewer"]).json()
    assert [v["version"] for v in versions] == [1, 2]


PROFILES = [
    {"kind": "batch_inference", "team": "serving", "speeds": {"H100": 1.0, "A100-80G": 1.0}},
    {"kind": "batch_inference", "speeds": {"L40S": 2.0}},
]


def test_speed_profiles_are_stored_and_bad_ones_refused_by_field(
    client: TestClient, auth: dict
) -> None:
    """A profile names catalogue models (spelt as it spells them: a stored spec is
    compared as written with the next import of the same document) and speeds in
    [0.01, 100]; a spec without profiles is stored as before the field."""
    created = client.post(
        "/api/v1/policies",
        headers=auth["operator"],
        json={"name": "p", "spec": {**SPEC, "speed_profiles": PROFILES}},
    )
    assert created.status_code == 201, created.text
    assert created.json()["spec"]["speed_profiles"] == [
        {
            "kind": "batch_inference",
            "team": "serving",
            "queue": None,
            "speeds": PROFILES[0]["speeds"],
        },
        {"kind": "batch_inference", "team": None, "queue": None, "speeds": {"L40S": 2.0}},
    ]
    assert "speed_profiles" not in SPEC_JSON
    for speeds, field, words in (
        ({"B300": 2.0}, "spec.speed_profiles[0].speeds.B300", "unknown GPU model 'B300'"),
        ({"h100": 2.0}, "spec.speed_profiles[0].speeds.h100", "the catalogue spells it 'H100'"),
        ({"H100": 0.001}, "spec.speed_profiles[0].speeds.H100", "greater than or equal to 0.01"),
        ({}, "spec.speed_profiles[0].speeds", "at least 1 item"),
    ):
        response = client.put(
            "/api/v1/policies/p",
            headers=auth["operator"],
            json={"spec": {"speed_profiles": [{"kind": "training", "speeds": speeds}]}},
        )
        assert response.status_code == 422, (speeds, response.text)
        error = response.json()["error"]
        assert error["field"] == field and words in error["message"], error
    versions = client.get("/api/v1/policies/p/versions", headers=auth["viewer"]).json()
    assert len(versions) == 1  # nothing written
    # Creating one is checked alike, and so is an import's preview (a CI job that checks a
    # file with the preview must not pass one the import refuses).
    created = client.post(
        "/api/v1/policies",
        headers=auth["operator"],
        json={"name": "q", "spec": {"speed_profiles": [{"speeds": {"B300": 2.0}}]}},
    )
    assert created.status_code == 422
    assert created.json()["error"]["field"] == "spec.speed_profiles[0].speeds.B300"
    assert client.get("/api/v1/policies/q", headers=auth["viewer"]).status_code == 404
    preview = client.post(
        "/api/v1/policies/p/import/preview",
        headers={**auth["viewer"], "Content-Type": "application/yaml"},
        content="speed_profiles:\n- kind: training\n  speeds: {h100: 2.0}\n",
    )
    assert preview.status_code == 422, preview.text
    assert preview.json()["error"]["field"] == "spec.speed_profiles[0].speeds.h100"
