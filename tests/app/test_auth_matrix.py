"""Walks every operation in the OpenAPI schema and proves who may call it."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session

from app.core.clock import FrozenClock
from app.main import create_app
from app.tokens import service as token_service
from app.tokens.models import ApiTokenCreate

PUBLIC = {("GET", "/healthz"), ("GET", "/readyz")}
PATH_VALUES = {
    "cluster": "alpha",
    "node": "n1",
    "name": "H100",
    "job_id": "1",
    "plan_id": "1",
    "action_id": "1",
    "token_id": "1",
    "version": "1",
    "group": "site",
    "run_id": "0123456789ab",
    "queue": "research",
    "job_set": "sweep",
}
# Who is refused (403) for each required scope, and who is let through.
REFUSED = {
    "viewer": ["connector_alpha", "agent_alpha_n1"],
    "operator": ["viewer", "connector_alpha"],
    "admin": ["operator", "viewer", "connector_alpha"],
    "connector:{cluster}": ["connector_beta", "viewer", "operator", "agent_alpha_n1"],
    "agent:{cluster}/{node}": ["connector_alpha", "viewer", "operator"],
}
ALLOWED = {
    "viewer": "viewer",
    "operator": "operator",
    "admin": "admin",
    "connector:{cluster}": "connector_alpha",
    "authenticated": "agent_alpha_n1",
    "agent:{cluster}/{node}": "agent_alpha_n1",
}


def _operations() -> list[tuple[str, str, str | None]]:
    schema = create_app().openapi()
    return [
        (method.upper(), path, operation.get("x-required-scope"))
        for path, item in schema["paths"].items()
        for method, operation in item.items()
    ]


OPERATIONS = _operations()


def _url(path: str) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: PATH_VALUES[m.group(1)], path)


def test_every_operation_declares_a_scope_or_is_health() -> None:
    assert len(OPERATIONS) > 25
    for method, path, scope in OPERATIONS:
        assert (scope is None) == ((method, path) in PUBLIC), (method, path, scope)
        if scope is not None:
            assert scope in ALLOWED, f"{method} {path} needs a scope this test knows: {scope}"


@pytest.mark.parametrize(
    ("method", "path", "scope"),
    [op for op in OPERATIONS if op[2]],
    ids=[f"{m} {p}" for m, p, s in OPERATIONS if s],
)
def test_route_denies_and_allows(
    client: TestClient,
    auth: dict,
    tokens: dict,
    session: Session,
    clock: FrozenClock,
    method: str,
    path: str,
    scope: str,
) -> None:
    assert (
        client.post(
            "/api/v1/clusters", headers=auth["admin"], json={"name": "alpha", "scheduler": "slurm"}
        ).status_code
        == 201
    )
    url = _url(path)

    missing = client.request(method, url)
    assert missing.status_code == 401, (missing.status_code, missing.text)
    assert missing.headers["www-authenticate"] == "Bearer"
    for bad in ("nonsense", "shp_000000000000_" + "A" * 43, tokens["viewer"][:-1] + "x"):
        garbage = client.request(method, url, headers={"Authorization": f"Bearer {bad}"})
        assert garbage.status_code == 401, bad

    expired = token_service.create_token(
        session=session,
        now=clock.now(),
        token_in=ApiTokenCreate(
            name="old", scopes=["admin"], expires_at=clock.now() + timedelta(seconds=1)
        ),
    )
    clock.advance(2)
    gone = client.request(method, url, headers={"Authorization": f"Bearer {expired.token}"})
    assert gone.status_code == 401 and gone.json()["error"]["message"] == "token expired"

    for role in REFUSED.get(scope, []):
        refused = client.request(method, url, headers=auth[role])
        assert refused.status_code == 403, (role, refused.status_code, refused.text)
        assert refused.json()["error"]["code"] == "forbidden"

    allowed = client.request(method, url, headers=auth[ALLOWED[scope]])
    assert allowed.status_code not in (401, 403), (allowed.status_code, allowed.text)
    assert allowed.status_code < 500


def test_revoked_token_is_refused(client: TestClient, auth: dict, tokens: dict) -> None:
    listed = client.get("/api/v1/tokens", headers=auth["admin"]).json()
    viewer_id = next(t["id"] for t in listed if t["name"] == "viewer")
    assert all("token" not in t and "secret_digest" not in t for t in listed)
    assert client.get("/api/v1/clusters", headers=auth["viewer"]).status_code == 200
    assert client.delete(f"/api/v1/tokens/{viewer_id}", headers=auth["admin"]).status_code == 200
    revoked = client.get("/api/v1/clusters", headers=auth["viewer"])
    assert revoked.status_code == 401 and revoked.json()["error"]["message"] == "token revoked"


def test_connector_token_is_bound_to_its_cluster(client: TestClient, auth: dict) -> None:
    for name in ("alpha", "beta"):
        client.post(
            "/api/v1/clusters", headers=auth["admin"], json={"name": name, "scheduler": "sim"}
        )
    body = {"kind": "snapshot", "connector_session": "s", "seq": 1}
    assert (
        client.post(
            "/api/v1/clusters/alpha/telemetry", headers=auth["connector_alpha"], json=body
        ).status_code
        == 200
    )
    refused = client.post(
        "/api/v1/clusters/beta/telemetry", headers=auth["connector_alpha"], json=body
    )
    assert refused.status_code == 403
    assert refused.json()["error"]["details"] == {"required_scope": "connector:beta"}


def test_created_token_is_shown_once_and_works(client: TestClient, auth: dict) -> None:
    created = client.post(
        "/api/v1/tokens",
        headers=auth["admin"],
        json={"name": "ci", "scopes": ["viewer", "connector:alpha"]},
    )
    assert created.status_code == 201
    plaintext = created.json()["token"]
    whoami = client.get("/api/v1/whoami", headers={"Authorization": f"Bearer {plaintext}"})
    assert whoami.json() == {"name": "ci", "scopes": ["connector:alpha", "viewer"]}
    bad = client.post(
        "/api/v1/tokens", headers=auth["admin"], json={"name": "x", "scopes": ["root"]}
    )
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "scopes"


def test_bad_bodies_are_not_judged_before_the_token(client: TestClient, auth: dict) -> None:
    client.post(
        "/api/v1/clusters", headers=auth["admin"], json={"name": "alpha", "scheduler": "sim"}
    )
    url = "/api/v1/clusters/alpha/telemetry"
    broken = {"content": b'{"kind": ', "headers": {"Content-Type": "application/json"}}
    assert client.post(url, **broken).status_code == 401
    wrong = client.post(
        url,
        content=b'{"kind": ',
        headers={"Content-Type": "application/json", **auth["connector_beta"]},
    )
    assert wrong.status_code == 403
    right = client.post(
        url,
        content=b'{"kind": ',
        headers={"Content-Type": "application/json", **auth["connector_alpha"]},
    )
    assert right.status_code == 400
    assert client.post("/api/v1/clusters", json={"name": 5}).status_code == 401
