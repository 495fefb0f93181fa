"""What the plan page reads besides the plan and its actions, on SQLite and PostgreSQL: the
plan's placement before and after, node by node (GET /plans/{id}/placement), and every
saga step of its actions in one reply (GET /plans/{id}/steps); and who may decide a plan.

The cluster is ``test_plans_embedded``'s: two 8-GPU nodes, each holding one 4-GPU
checkpointable job, and an 8-GPU job waiting. The plan moves one half-job next to the
other and starts the big job on the node it frees.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine
from sqlmodel import Session, select

from app.actions import local, saga, tasks
from app.actions.models import ActionKind
from app.actions.router import get_dispatcher
from app.clusters import service as cluster_service
from app.clusters.models import Cluster, ClusterCreate, ShapingMode
from app.jobs.models import Job
from tests.app.builders import migration_plan
from tests.app.test_plans_embedded import T0, Site, _fragment, _spec
from tests.support.live_server import app_on, tokens_for
from wire.telemetry import SchedulerKind


@pytest.fixture
def site(
    committed_engine: Engine, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Site]:
    monkeypatch.setattr(tasks, "get_engine", lambda: committed_engine)
    monkeypatch.setattr(saga, "CONFIRM_POLL_S", 0.05)
    monkeypatch.setattr(saga, "RETRY_BACKOFF_S", (0.05,))
    made = Site(committed_engine, tmp_path, _spec(), ShapingMode.advise)
    prefixes = made.executors.queues()
    for prefix in prefixes:
        local.register(prefix, made.handle)
    yield made
    for prefix in prefixes:
        local.unregister(prefix)


@pytest.fixture
def client(committed_engine: Engine) -> Iterator[TestClient]:
    with TestClient(app_on(committed_engine)) as client:
        # The test runs the sagas itself (what the in-process beat would do).
        client.app.dependency_overrides[get_dispatcher] = lambda: lambda action_id: None  # type: ignore[attr-defined]
        yield client


@pytest.fixture
def auth(committed_engine: Engine) -> dict[str, dict[str, str]]:
    with Session(committed_engine) as session:
        tokens = tokens_for(session, T0, ("viewer", "operator"))
    return {scope: {"Authorization": f"Bearer {token}"} for scope, token in tokens.items()}


def _placement(nodes: list[dict[str, Any]]) -> dict[str, tuple[dict[str, int], dict[str, int]]]:
    return {
        n["node"]: (
            {j["job"]: j["gpus"] for j in n["before"]},
            {j["job"]: j["gpus"] for j in n["after"]},
        )
        for n in nodes
    }


def test_a_plans_placement_is_stored_with_it_and_its_steps_come_in_one_reply(
    site: Site, client: TestClient, auth: dict[str, dict[str, str]], committed_engine: Engine
) -> None:
    _fragment(site)
    result = site.cycle()
    actions = site.actions(result.plan_id)
    (move,) = [a for a in actions if a.kind == ActionKind.migrate]
    with Session(committed_engine) as session:
        ids = {j.external_id: j.id for j in session.exec(select(Job)).all()}
    moved = next(name for name, job_id in ids.items() if job_id == move.job_id)
    (stays,) = {"left", "right"} - {moved}
    source, target = move.source_node, move.target_node
    assert source is not None and target is not None

    answer = client.get(f"/api/v1/plans/{result.plan_id}/placement", headers=auth["viewer"])
    assert answer.status_code == 200, answer.text
    placement = answer.json()
    assert placement["plan_id"] == result.plan_id and placement["cluster"] == "lab"
    assert placement["complete"] is True
    assert _placement(placement["nodes"]) == {
        source: ({moved: 4}, {"big": 8}),
        target: ({stays: 4}, {stays: 4, moved: 4}),
    }
    for node in placement["nodes"]:
        assert (node["gpu_model"], node["gpus"]) == ("H100", 8)
        for job in (*node["before"], *node["after"]):
            assert job["job_id"] == ids[job["job"]]
        # Which GPUs: the scheduler's before, the plan's after; never one GPU twice.
        for side in ("before", "after"):
            held = [i for job in node[side] for i in job["gpu_indices"]]
            assert len(held) == len(set(held)) == sum(j["gpus"] for j in node[side])
            assert set(held) <= set(range(8))
    (kept,) = [n for n in placement["nodes"] if n["node"] == target]
    indices = {
        side: {j["job"]: j["gpu_indices"] for j in kept[side]} for side in ("before", "after")
    }
    assert indices["before"][stays] == indices["after"][stays]  # it stays where it was
    # The list of plans does not carry it (a page of plans stays small).
    plan = client.get(f"/api/v1/plans/{result.plan_id}", headers=auth["viewer"]).json()
    assert "placement" not in plan["summary"] and plan["summary"]["jobs"] == 3
    assert client.get(f"/api/v1/plans/{result.plan_id}/steps", headers=auth["viewer"]).json() == []

    # A viewer may read the plan but not decide it; an operator approves it whole, once.
    refused = client.post(f"/api/v1/plans/{result.plan_id}/approve", headers=auth["viewer"])
    assert refused.status_code == 403, refused.text
    assert refused.json()["error"]["code"] == "forbidden"
    approved = client.post(f"/api/v1/plans/{result.plan_id}/approve", headers=auth["operator"])
    assert approved.status_code == 200 and approved.json()["state"] == "approved"
    again = client.post(f"/api/v1/plans/{result.plan_id}/reject", headers=auth["operator"])
    assert again.status_code == 409 and again.json()["error"]["details"] == {"state": "approved"}
    site.run_sagas()

    steps = client.get(f"/api/v1/plans/{result.plan_id}/steps", headers=auth["viewer"]).json()
    by_action: dict[int, list[dict[str, Any]]] = {}
    for step in steps:
        by_action.setdefault(step["action_id"], []).append(step)
    assert set(by_action) == {a.id for a in actions}
    for action in actions:
        one = client.get(f"/api/v1/actions/{action.id}/steps", headers=auth["viewer"]).json()
        assert [{**s, "action_id": action.id} for s in one] == by_action[action.id]
    assert {s["state"] for s in steps} == {"succeeded"}
    # Delivered in-process, every send had its answer: none of its copies is still out.
    assert all(s["answers"] == s["attempts"] >= 1 for s in steps), steps
    assert site.states()["big"] == ("running", [source])
    # The stored placement is what the plan decided: it does not follow the cluster.
    later = client.get(f"/api/v1/plans/{result.plan_id}/placement", headers=auth["viewer"])
    assert later.json() == placement


def test_a_plan_stored_without_its_placement_is_rebuilt_from_its_actions(
    client: TestClient, auth: dict[str, dict[str, str]], committed_engine: Engine
) -> None:
    with Session(committed_engine) as session:
        cluster_service.register_cluster(
            session=session,
            now=T0,
            cluster_in=ClusterCreate(name="old", scheduler=SchedulerKind.slurm),
        )
        cluster_id = session.exec(select(Cluster.id).where(Cluster.name == "old")).one()
        assert cluster_id is not None
        plan, (action,) = migration_plan(session, cluster_id=cluster_id, now=T0)
        action.source_placement, action.target_placement = {"n1": 2}, {"n2": 2}
        session.add(action)
        session.commit()
        plan_id, label = plan.id, f"action {action.id}"
    answer = client.get(f"/api/v1/plans/{plan_id}/placement", headers=auth["viewer"]).json()
    assert answer["complete"] is False
    # No job row: the action names the job; the nodes' sizes are unknown (no node rows).
    assert _placement(answer["nodes"]) == {"n1": ({label: 2}, {}), "n2": ({}, {label: 2})}
    assert [(n["gpus"], n["gpu_model"]) for n in answer["nodes"]] == [(None, None)] * 2


@pytest.mark.parametrize("what", ["placement", "steps"])
def test_an_unknown_plan_is_404(
    client: TestClient, auth: dict[str, dict[str, str]], what: str
) -> None:
    answer = client.get(f"/api/v1/plans/4242/{what}", headers=auth["viewer"])
    assert answer.status_code == 404
    assert answer.json()["error"]["message"] == "plan 4242 does not exist"
