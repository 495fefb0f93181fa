"""The audit log: one record per change made through the API, in the change's own
transaction; none for a refused change; readable by admins only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, select

from app.actions.router import get_dispatcher
from app.audit.models import Actor, AuditRecord
from app.clusters import service as cluster_service
from app.clusters.models import Cluster, ClusterCreate, ClusterUpdate
from app.core.clock import FrozenClock
from app.tokens.models import ApiToken
from tests.app.builders import migration_plan
from tests.app.test_policies import SPEC

AUDIT = "/api/v1/audit"


def _records(session: Session) -> list[AuditRecord]:
    return list(session.exec(select(AuditRecord).order_by(AuditRecord.id)))  # type: ignore[arg-type]


def _token_id(session: Session, name: str) -> int:
    return session.exec(select(ApiToken.id).where(ApiToken.name == name)).one()  # type: ignore[return-value]


def _plan_with_actions(session: Session, clock: FrozenClock, count: int) -> tuple[int, list[int]]:
    cluster = Cluster(name="alpha", scheduler="slurm", created_at=clock.now())
    session.add(cluster)
    session.commit()
    plan, actions = migration_plan(
        session,
        cluster_id=cluster.id,  # type: ignore[arg-type]
        now=clock.now(),
        moves=count,
        reason="defragment",
        state="proposed",
        decisions=[],
    )
    return plan.id, [a.id for a in actions]  # type: ignore[misc, return-value]


@pytest.fixture
def no_dispatch(client: TestClient) -> list[int]:
    dispatched: list[int] = []
    client.app.dependency_overrides[get_dispatcher] = lambda: dispatched.append  # type: ignore[attr-defined]
    return dispatched


def test_each_change_leaves_one_record_naming_its_actor(
    client: TestClient, auth: dict, session: Session, clock: FrozenClock, no_dispatch: list[int]
) -> None:
    admin, operator = auth["admin"], auth["operator"]
    plan_id, (first, second) = _plan_with_actions(session, clock, 2)
    other_plan = client.post("/api/v1/clusters", headers=admin, json={"name": "beta"})
    steps: list[tuple[str, dict[str, str], str, str, tuple[str, str]]] = []

    def did(response: Any, role: str, action: str, object_id: str | int) -> None:
        assert response.status_code < 300, response.text
        steps.append((role, auth[role], action, str(object_id), (action, str(object_id))))

    did(other_plan, "admin", "cluster.create", "beta")
    did(
        client.patch("/api/v1/clusters/beta", headers=operator, json={"mode": "advise"}),
        "operator",
        "cluster.update",
        "beta",
    )
    did(
        client.post("/api/v1/gpu-models", headers=admin, json=_gpu_model("X1")),
        "admin",
        "gpu_model.create",
        "X1",
    )
    did(
        client.post("/api/v1/policies", headers=operator, json={"name": "p", "spec": SPEC}),
        "operator",
        "sla_policy.create",
        "p",
    )
    did(
        client.put("/api/v1/policies/p", headers=operator, json={"spec": {"teams": []}}),
        "operator",
        "sla_policy.update",
        "p",
    )
    created = client.post(
        "/api/v1/tokens", headers=admin, json={"name": "ci", "scopes": ["viewer"]}
    )
    new_id = created.json()["id"]
    did(created, "admin", "token.create", new_id)
    did(client.delete(f"/api/v1/tokens/{new_id}", headers=admin), "admin", "token.revoke", new_id)
    did(
        client.post(f"/api/v1/actions/{first}/approve", headers=operator),
        "operator",
        "action.approve",
        first,
    )
    did(
        client.post(f"/api/v1/actions/{first}/cancel", headers=operator),
        "operator",
        "action.cancel",
        first,
    )
    did(
        client.post(f"/api/v1/plans/{plan_id}/reject", headers=operator),
        "operator",
        "plan.reject",
        plan_id,
    )
    did(client.delete("/api/v1/clusters/beta", headers=admin), "admin", "cluster.delete", "beta")

    records = _records(session)
    assert [(r.action, r.object_id) for r in records] == [s[4] for s in steps]
    for record, (role, _, _, _, _) in zip(records, steps, strict=True):
        assert record.actor_name == role
        assert record.actor_token_id == _token_id(session, role)
        assert record.actor_scopes == [role]
        assert record.at == clock.now()
    by_action = {r.action: r for r in records}
    assert by_action["cluster.update"].changes == {"mode": ["observe", "advise"]}
    assert by_action["action.approve"].changes == {"state": ["proposed", "approved"]}
    assert by_action["plan.reject"].changes == {
        "state": ["proposed", "rejected"],
        "actions": [second],
    }
    assert by_action["sla_policy.update"].changes["version"] == [1, 2]
    assert by_action["sla_policy.update"].changes["teams"] == [["vision"], []]
    assert by_action["token.create"].changes["scopes"] == ["viewer"]


def test_a_token_record_carries_no_secret(client: TestClient, auth: dict, session: Session) -> None:
    created = client.post(
        "/api/v1/tokens",
        headers={**auth["admin"], "X-Request-ID": "req-42"},
        json={"name": "ci", "scopes": ["viewer"]},
    ).json()
    (record,) = _records(session)
    stored = json.dumps({c: getattr(record, c) for c in AuditRecord.model_fields}, default=str)
    token = session.get(ApiToken, created["id"])
    assert token is not None
    secret = created["token"].split("_", 2)[2]
    assert secret not in stored and token.secret_digest not in stored
    assert record.request_id == "req-42"
    assert record.changes["key_id"] == created["key_id"]


def test_a_no_op_change_is_not_recorded(client: TestClient, auth: dict, session: Session) -> None:
    client.post("/api/v1/clusters", headers=auth["admin"], json={"name": "beta"})
    same = client.patch("/api/v1/clusters/beta", headers=auth["operator"], json={"mode": "observe"})
    assert same.status_code == 200
    token_id = _token_id(session, "viewer")
    for _ in range(2):
        assert client.delete(f"/api/v1/tokens/{token_id}", headers=auth["admin"]).status_code == 200
    assert [r.action for r in _records(session)] == ["cluster.create", "token.revoke"]


def test_refused_changes_leave_no_record(
    client: TestClient, auth: dict, session: Session, clock: FrozenClock, no_dispatch: list[int]
) -> None:
    plan_id, (action_id,) = _plan_with_actions(session, clock, 1)
    refused = [
        client.post("/api/v1/clusters", headers=auth["admin"], json={"name": "alpha"}),  # 409
        client.post("/api/v1/clusters", headers=auth["viewer"], json={"name": "gamma"}),  # 403
        client.patch("/api/v1/clusters/nope", headers=auth["operator"], json={"mode": "advise"}),
        client.patch("/api/v1/clusters/alpha", headers=auth["operator"], json={"policy": "bogus"}),
        client.put("/api/v1/policies/nope", headers=auth["operator"], json={"spec": SPEC}),
        client.post("/api/v1/policies", headers=auth["operator"], json={"name": "p", "spec": 1}),
        client.delete("/api/v1/tokens/4242", headers=auth["admin"]),
        client.post("/api/v1/tokens", headers=auth["admin"], json={"name": "x", "scopes": ["r"]}),
        client.post(f"/api/v1/actions/{action_id}/approve", headers=auth["viewer"]),
        client.post("/api/v1/actions/4242/approve", headers=auth["operator"]),
        client.post("/api/v1/plans/4242/approve", headers=auth["operator"]),
        client.post("/api/v1/gpu-models", headers=auth["admin"], json=_gpu_model("H100")),
    ]
    assert [r.status_code for r in refused] == [
        409, 403, 404, 422, 404, 422, 404, 422, 403, 404, 404, 409,
    ]  # fmt: skip
    operator = auth["operator"]
    assert client.post(f"/api/v1/plans/{plan_id}/approve", headers=operator).status_code == 200
    assert client.post(f"/api/v1/plans/{plan_id}/approve", headers=operator).status_code == 409
    assert client.post(f"/api/v1/actions/{action_id}/reject", headers=operator).status_code == 409
    assert [r.action for r in _records(session)] == ["plan.approve"]


def test_the_record_rolls_back_with_its_change(session: Session, clock: FrozenClock) -> None:
    """Written in the change's transaction: a commit that fails takes both away."""
    cluster_service.register_cluster(
        session=session,
        cluster_in=ClusterCreate(name="alpha"),
        now=clock.now(),
    )
    actor = Actor(token_id=None, name="test", scopes=("admin",))
    real_commit = session.commit

    def failing_commit() -> None:
        session.flush()  # the change and its record reach the database …
        raise RuntimeError("disk full")  # … and the transaction then fails

    session.commit = failing_commit  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        cluster_service.update_cluster(
            session=session,
            name="alpha",
            cluster_in=ClusterUpdate(mode="enforce"),  # type: ignore[arg-type]
            now=clock.now(),
            actor=actor,
        )
    session.rollback()
    session.commit = real_commit  # type: ignore[method-assign]
    assert _records(session) == []
    assert cluster_service.get_cluster(session=session, name="alpha").mode == "observe"


def test_only_admins_read_the_log(client: TestClient, auth: dict) -> None:
    for role in ("viewer", "operator", "connector_alpha", "agent_alpha_n1"):
        assert client.get(AUDIT, headers=auth[role]).status_code == 403, role
    assert client.get(AUDIT).status_code == 401
    assert client.get(AUDIT, headers=auth["admin"]).json() == {
        "items": [],
        "total": 0,
        "limit": 100,
        "offset": 0,
    }


def test_filters_and_paging(
    client: TestClient, auth: dict, session: Session, clock: FrozenClock
) -> None:
    admin = auth["admin"]
    client.post("/api/v1/clusters", headers=admin, json={"name": "a1"})
    clock.advance(60)
    client.post("/api/v1/clusters", headers=admin, json={"name": "a2"})
    clock.advance(60)
    client.patch("/api/v1/clusters/a1", headers=auth["operator"], json={"mode": "advise"})
    client.post("/api/v1/tokens", headers=admin, json={"name": "ci", "scopes": ["viewer"]})

    def ids(**params: Any) -> list[str]:
        page = client.get(AUDIT, headers=admin, params=params)
        assert page.status_code == 200, page.text
        return [f"{i['action']}:{i['object_id']}" for i in page.json()["items"]]

    everything = ids()
    assert everything[0].startswith("token.create:") and everything[1:] == [
        "cluster.update:a1",
        "cluster.create:a2",
        "cluster.create:a1",
    ]
    assert ids(object_type="cluster", object_id="a1") == ["cluster.update:a1", "cluster.create:a1"]
    assert ids(actor="operator") == ["cluster.update:a1"]
    assert ids(actor_token_id=_token_id(session, "admin"), object_type="cluster") == [
        "cluster.create:a2",
        "cluster.create:a1",
    ]
    start = clock.now() - timedelta(minutes=2)
    assert ids(since=(start + timedelta(minutes=1)).isoformat(), object_type="cluster") == [
        "cluster.update:a1",
        "cluster.create:a2",
    ]
    assert ids(until=(start + timedelta(minutes=1)).isoformat()) == ["cluster.create:a1"]
    page = client.get(AUDIT, headers=admin, params={"limit": 2, "offset": 1}).json()
    assert page["total"] == 4 and len(page["items"]) == 2
    assert [i["object_id"] for i in page["items"]] == ["a1", "a2"]


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"object_type": "node"}, "object_type"),
        ({"since": "2026-11-02T12:00:00"}, "since"),  # naive: which zone?
        ({"since": "yesterday"}, "since"),
        ({"since": "2026-11-02T12:00:00Z", "until": "2026-11-02T11:00:00Z"}, "until"),
        ({"limit": 0}, "limit"),
        ({"limit": 1001}, "limit"),
        ({"offset": -1}, "offset"),
        ({"actor_token_id": 0}, "actor_token_id"),
        ({"actor_token_id": 2**40}, "actor_token_id"),
        ({"object_id": ""}, "object_id"),
        ({"actor": "x" * 129}, "actor"),
    ],
)
def test_bad_filters_are_refused_naming_the_field(
    client: TestClient, auth: dict, params: dict[str, Any], field: str
) -> None:
    response = client.get(AUDIT, headers=auth["admin"], params=params)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == field


def test_the_cli_lists_the_log_and_records_its_own_token(tmp_path: Path) -> None:
    env = {**os.environ, "SHAPER_DATA_DIR": str(tmp_path)}
    env.pop("SHAPER_DATABASE_URL", None)

    def shaper(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "app", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    created = shaper("token", "create", "--scope", "admin", "--name", "root")
    assert created.returncode == 0, created.stderr
    listed = shaper("audit", "--type", "token")
    assert listed.returncode == 0, listed.stderr
    (line,) = listed.stdout.splitlines()
    at, who, action, object_id, changes = line.split("\t")
    assert who.startswith("-:cli:") and action == "token.create" and object_id == "1"
    assert json.loads(changes)["name"] == "root"
    secret = created.stdout.strip().split("_", 2)[2]
    assert secret not in listed.stdout
    assert shaper("audit", "--type", "node").returncode == 2


def _gpu_model(name: str) -> dict[str, Any]:
    return {"name": name, "memory_gib": 80, "relative_speed": 1.0, "precisions": ["bf16"]}
