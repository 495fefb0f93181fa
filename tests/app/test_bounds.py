"""Every value the API takes is one both databases can store: out of bounds is a 422
naming the field, on PostgreSQL and SQLite alike, never a 500 from the driver."""

from __future__ import annotations

import re
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.core.types import INT32_MAX, MAX_GPUS, MAX_TEAMS
from app.main import create_app
from solver.policies import POLICY_NAMES

HUGE = [2**63, 2**64, INT32_MAX + 1, -(2**63) - 1]
STRING_PATH_VALUES = {"cluster": "alpha", "node": "n1", "name": "H100"}


def _integer_path_operations() -> list[tuple[str, str, str]]:
    schema = create_app().openapi()
    found = []
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            for parameter in operation.get("parameters", []):
                if parameter["in"] == "path" and parameter["schema"].get("type") == "integer":
                    found.append((method.upper(), path, parameter["name"]))
    return found


INTEGER_PATHS = _integer_path_operations()


def _url(path: str, integer: str) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: STRING_PATH_VALUES.get(m.group(1), integer), path)


def _error(response: Any) -> dict[str, Any]:
    assert response.status_code == 422, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["code"] == "invalid" and error["retryable"] is False
    return error


def test_every_integer_path_parameter_is_found() -> None:
    names = {name for _, _, name in INTEGER_PATHS}
    assert {"job_id", "plan_id", "action_id", "token_id", "version"} <= names


@pytest.mark.parametrize(("method", "path", "name"), INTEGER_PATHS, ids=lambda v: str(v))
def test_integer_path_parameters_beyond_the_columns_are_422(
    client: TestClient, auth: dict, method: str, path: str, name: str
) -> None:
    # Ids start at 1: 0 and below name no row either, and say so as the field at fault.
    for value in [*HUGE, 0, -1]:
        url = _url(path, str(value))
        response = client.request(method, url, headers=auth["admin"], json={})
        assert _error(response)["field"] == name, (url, response.text)
    in_range = _url(path, "1")
    assert client.request(method, in_range, headers=auth["admin"]).status_code != 422


@pytest.mark.parametrize(
    ("path", "name", "role"),
    [
        ("/api/v1/actions", "plan_id", "viewer"),
        ("/api/v1/actions", "offset", "viewer"),
        ("/api/v1/jobs", "offset", "viewer"),
        ("/api/v1/nodes", "offset", "viewer"),
        ("/api/v1/plans", "offset", "viewer"),
        ("/api/v1/audit", "offset", "admin"),
    ],
)
def test_integer_query_parameters_beyond_the_columns_are_422(
    client: TestClient, auth: dict, path: str, name: str, role: str
) -> None:
    for value in HUGE[:3]:
        response = client.get(path, params={name: str(value)}, headers=auth[role])
        assert _error(response)["field"] == name
    assert client.get(path, params={name: "0"}, headers=auth[role]).status_code == 200


def test_out_of_range_is_still_401_for_an_anonymous_caller(client: TestClient) -> None:
    assert client.get(f"/api/v1/jobs/{2**63}").status_code == 401


def test_nul_and_overlong_strings_in_path_and_query_are_422(client: TestClient, auth: dict) -> None:
    assert _error(client.get("/api/v1/clusters/al%00pha", headers=auth["viewer"]))["field"] == (
        "cluster"
    )
    assert _error(client.get("/api/v1/jobs?team=a%00b", headers=auth["viewer"]))["field"] == "team"
    long_name = "a" * 1025
    assert _error(client.get(f"/api/v1/policies/{long_name}", headers=auth["viewer"]))["field"] == (
        "name"
    )


def _policy(**team: Any) -> dict[str, Any]:
    return {"name": "research", "spec": {"teams": [{"team": "research", **team}]}}


@pytest.mark.parametrize(
    ("team", "field"),
    [
        ({"guaranteed_gpus": 10**30}, "spec.teams[0].guaranteed_gpus"),
        ({"guaranteed_gpus": MAX_GPUS + 1}, "spec.teams[0].guaranteed_gpus"),
        ({"borrowing_limit_gpus": 2**63}, "spec.teams[0].borrowing_limit_gpus"),
        ({"max_queue_wait_s": 2**63}, "spec.teams[0].max_queue_wait_s"),
        ({"max_migrations_per_day": 2**31}, "spec.teams[0].max_migrations_per_day"),
        ({"team": "re\x00search"}, "spec.teams[0].team"),
        ({"deadline": "2026-11-03T12:00:00"}, "spec.teams[0].deadline"),
    ],
)
def test_policy_bounds(client: TestClient, auth: dict, team: dict, field: str) -> None:
    response = client.post("/api/v1/policies", headers=auth["operator"], json=_policy(**team))
    assert _error(response)["field"] == field


def test_policy_sizes_are_bounded(client: TestClient, auth: dict) -> None:
    teams = [{"team": f"t{i}"} for i in range(MAX_TEAMS + 1)]
    body = {"name": "big", "spec": {"teams": teams}}
    assert _error(client.post("/api/v1/policies", headers=auth["operator"], json=body))[
        "field"
    ] == ("spec.teams")
    services = [{"service": "s", "min_replicas": 2**63}]
    body = {"name": "svc", "spec": {"services": services}}
    assert _error(client.post("/api/v1/policies", headers=auth["operator"], json=body))[
        "field"
    ] == ("spec.services[0].min_replicas")
    body = {"name": "ok", "spec": {"teams": teams[:MAX_TEAMS]}, "comment": "x\x00"}
    assert _error(client.post("/api/v1/policies", headers=auth["operator"], json=body))[
        "field"
    ] == ("comment")
    body["comment"] = "fine"
    assert client.post("/api/v1/policies", headers=auth["operator"], json=body).status_code == 201


def test_token_creation_refuses_naive_times_and_nul(client: TestClient, auth: dict) -> None:
    naive = {"name": "ci", "scopes": ["viewer"], "expires_at": "2027-01-01T00:00:00"}
    assert _error(client.post("/api/v1/tokens", headers=auth["admin"], json=naive))["field"] == (
        "expires_at"
    )
    nul = {"name": "c\x00i", "scopes": ["viewer"]}
    assert _error(client.post("/api/v1/tokens", headers=auth["admin"], json=nul))["field"] == (
        "name"
    )
    aware = {**naive, "expires_at": "2027-01-01T00:00:00+02:00"}
    created = client.post("/api/v1/tokens", headers=auth["admin"], json=aware)
    assert created.status_code == 201
    assert created.json()["expires_at"] == "2026-12-31T22:00:00Z"


def test_cluster_policy_must_be_one_the_planner_knows(client: TestClient, auth: dict) -> None:
    body = {"name": "alpha", "scheduler": "slurm", "policy": "bogus"}
    error = _error(client.post("/api/v1/clusters", headers=auth["admin"], json=body))
    assert error["field"] == "policy" and error["details"]["allowed"] == list(POLICY_NAMES)
    body["policy"] = "fifo"
    assert client.post("/api/v1/clusters", headers=auth["admin"], json=body).status_code == 201

    bogus = client.patch("/api/v1/clusters/alpha", headers=auth["operator"], json={"policy": "x"})
    assert _error(bogus)["field"] == "policy"
    assert client.get("/api/v1/clusters/alpha", headers=auth["viewer"]).json()["policy"] == "fifo"
    for name in POLICY_NAMES:
        patched = client.patch(
            "/api/v1/clusters/alpha", headers=auth["operator"], json={"policy": name}
        )
        assert patched.status_code == 200 and patched.json()["policy"] == name


def test_cluster_description_refuses_nul_on_both_backends(client: TestClient, auth: dict) -> None:
    body = {"name": "alpha", "scheduler": "slurm", "description": "a\x00b"}
    error = _error(client.post("/api/v1/clusters", headers=auth["admin"], json=body))
    assert error["field"] == "description"
