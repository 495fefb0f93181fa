"""Federation groups through the API: membership, audit, and the group what-if on live
telemetry (issue 16). The what-if is read-only: it says so in its answer."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, select

from app.actions.models import Action, ActionKind, ActionState, ActionStep, StepState
from app.clusters.models import Cluster
from app.jobs.models import Job
from tests.app.builders import job, node, running, snapshot
from tests.support.clock import T0

GROUPS = "/api/v1/federation-groups"


def _cluster(client: TestClient, auth: dict, name: str, scheduler: str = "sim") -> None:
    response = client.post(
        "/api/v1/clusters", headers=auth["admin"], json={"name": name, "scheduler": scheduler}
    )
    assert response.status_code == 201, response.text


@pytest.fixture
def two(client: TestClient, auth: dict) -> None:
    _cluster(client, auth, "alpha")
    _cluster(client, auth, "beta")


def _group(client: TestClient, auth: dict, *clusters: str, name: str = "site") -> dict[str, Any]:
    created = client.post(GROUPS, headers=auth["admin"], json={"name": name})
    assert created.status_code == 201, created.text
    body: dict[str, Any] = created.json()
    for cluster in clusters:
        added = client.put(f"{GROUPS}/{name}/clusters/{cluster}", headers=auth["admin"])
        assert added.status_code == 200, added.text
        body = added.json()
    return body


@pytest.mark.usefixtures("two")
def test_clusters_join_and_leave_a_group_and_every_change_is_audited(
    client: TestClient, auth: dict
) -> None:
    body = _group(client, auth, "alpha", "beta")
    assert body["clusters"] == ["alpha", "beta"]
    assert body["inter_cluster_bandwidth_mib_per_s"] == 100.0
    again = client.put(f"{GROUPS}/site/clusters/alpha", headers=auth["admin"])
    assert again.status_code == 200 and again.json()["clusters"] == ["alpha", "beta"]
    cluster = client.get("/api/v1/clusters/alpha", headers=auth["viewer"]).json()
    assert cluster["federation_group"] == "site"

    # One group per cluster: joining a second one is a conflict that names the first.
    client.post(GROUPS, headers=auth["admin"], json={"name": "other"})
    taken = client.put(f"{GROUPS}/other/clusters/alpha", headers=auth["admin"])
    assert taken.status_code == 409
    assert "is in federation group 'site'" in taken.json()["error"]["message"]

    left = client.delete(f"{GROUPS}/site/clusters/beta", headers=auth["admin"])
    assert left.status_code == 200 and left.json()["clusters"] == ["alpha"]
    patched = client.patch(
        f"{GROUPS}/site", headers=auth["admin"], json={"inter_cluster_bandwidth_mib_per_s": 250}
    )
    assert patched.json()["inter_cluster_bandwidth_mib_per_s"] == 250
    assert client.delete(f"{GROUPS}/site", headers=auth["admin"]).status_code == 204
    alpha = client.get("/api/v1/clusters/alpha", headers=auth["viewer"]).json()
    assert alpha["federation_group"] is None

    audit = client.get(
        "/api/v1/audit", headers=auth["admin"], params={"object_type": "federation_group"}
    ).json()
    verbs = [(r["action"], r["object_id"], r["changes"]) for r in audit["items"]]
    assert ("federation_group.update", "site", {"added": "alpha"}) in verbs
    assert ("federation_group.update", "site", {"removed": "beta"}) in verbs
    assert ("federation_group.delete", "site", {"clusters": ["alpha"]}) in verbs


@pytest.mark.usefixtures("two")
def test_bad_input_and_missing_scopes_are_refused_with_the_field(
    client: TestClient, auth: dict
) -> None:
    bad = client.post(GROUPS, headers=auth["admin"], json={"name": "Bad Name"})
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "name"
    slow = client.post(
        GROUPS, headers=auth["admin"], json={"name": "g", "inter_cluster_bandwidth_mib_per_s": 0}
    )
    assert slow.status_code == 422
    assert slow.json()["error"]["field"] == "inter_cluster_bandwidth_mib_per_s"
    assert client.post(GROUPS, headers=auth["operator"], json={"name": "g"}).status_code == 403
    assert client.get(GROUPS, headers=auth["viewer"]).json() == []
    _group(client, auth, name="g")
    missing = client.put(f"{GROUPS}/g/clusters/nowhere", headers=auth["admin"])
    assert missing.status_code == 404 and missing.json()["error"]["resource"] == "cluster"
    assert client.post(GROUPS, headers=auth["admin"], json={"name": "g"}).status_code == 409
    lonely = client.post(f"{GROUPS}/g/what-if", headers=auth["viewer"])
    assert lonely.status_code == 422
    assert "add at least two" in lonely.json()["error"]["message"]


def _push(client: TestClient, auth: dict, cluster: str, jobs: list[dict[str, Any]]) -> None:
    body = snapshot(1, nodes=[node("n1")], jobs=jobs)
    response = client.post(
        f"/api/v1/clusters/{cluster}/telemetry", headers=auth[f"connector_{cluster}"], json=body
    )
    assert response.status_code == 200, response.text


SPEC = {"scheduler": "sim", "native": {"gpus": 8, "runtime_s": 3600}}


@pytest.mark.usefixtures("two")
def test_the_what_if_starts_a_waiting_job_in_the_idle_cluster_and_changes_nothing(
    client: TestClient, auth: dict, session: Session
) -> None:
    _group(client, auth, "alpha", "beta")
    full = running("big", "n1", list(range(8)))
    waiting = job("waiting", gpus_requested=8, submit=SPEC)
    stuck = job("stuck", gpus_requested=8)  # its connector gave no spec: it stays home
    _push(client, auth, "alpha", [full, waiting, stuck])
    _push(client, auth, "beta", [])
    stored = session.exec(select(Job).where(Job.external_id == "waiting")).one()
    assert json.loads(stored.submit_spec or "") == {**SPEC, "portable": None}

    answer = client.post(f"{GROUPS}/site/what-if", headers=auth["viewer"])
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["clusters"] == ["alpha", "beta"]
    assert body["pending_jobs"] == 2 and body["movable_jobs"] == 1
    assert body["alone"]["pending_started"] == 0
    assert body["federated"]["pending_started"] == 1
    assert body["federated"]["objective"] > body["alone"]["objective"]
    assert body["moves"] == [
        {
            "job": "waiting",
            "from_cluster": "alpha",
            "to_cluster": "beta",
            "gpus": 8,
            "nodes": ["n1"],
            "running": False,
            "source_node": None,
        }
    ]
    assert body["dispatch"].startswith("what-if only")
    assert body["movable_running_jobs"] == 0
    assert body["running_held_examples"] == [
        {"job": "big", "cluster": "alpha", "why": "it cannot checkpoint: it would start over"}
    ]
    # The plan says why a job cannot go elsewhere.
    assert body["stays_home"] == 1
    assert body["stays_home_examples"] == [
        {"job": "stuck", "cluster": "alpha", "why": "alpha's connector gave no submit spec for it"}
    ]
    # Read-only: no plan, no action, the job still pending at home.
    assert client.get("/api/v1/plans", headers=auth["viewer"]).json()["total"] == 0
    assert client.get("/api/v1/actions", headers=auth["viewer"]).json()["total"] == 0


PORTABLE = {**SPEC, "portable": {"image": "train:1", "command": ["python", "t.py"], "gpus": 2}}


@pytest.mark.parametrize("target", ["slurm", "sim"])
def test_the_what_if_moves_a_running_job_away_to_start_a_gang_at_home(
    client: TestClient, auth: dict, target: str
) -> None:
    # A small running checkpointable job holds 2 of alpha's 8 GPUs; an 8-GPU gang waits
    # behind it at alpha (no spec: it may not leave). Beta is idle. A running job lands
    # only where the scheduler starts it pinned to its staged checkpoint's node (Slurm),
    # not on a simulated cluster's.
    _cluster(client, auth, "alpha")
    _cluster(client, auth, "beta", scheduler=target)
    _group(client, auth, "alpha", "beta")
    small = running("small", "n1", [0, 1], checkpointable=True, submit=PORTABLE)
    _push(client, auth, "alpha", [small, job("gang", gpus_requested=8)])
    _push(client, auth, "beta", [])
    body = client.post(f"{GROUPS}/site/what-if", headers=auth["viewer"]).json()
    if target == "sim":
        assert body["movable_running_jobs"] == 0 and body["moves"] == []
        (held,) = body["running_held_examples"]
        assert held["job"] == "small" and "starts a job pinned to a node" in held["why"]
        assert "beta runs sim" in held["why"]
        return
    assert body["movable_running_jobs"] == 1 and body["running_held_examples"] == []
    assert body["moves"] == [
        {
            "job": "small",
            "from_cluster": "alpha",
            "to_cluster": "beta",
            "gpus": 2,
            "nodes": ["n1"],
            "running": True,
            "source_node": "n1",
        }
    ]
    assert body["federated"]["objective"] > body["alone"]["objective"]
    assert body["link"]["egress_gpu_s_per_gib"] == 0.0

    # The sites bill the data that leaves: at a GPU-day a GiB, the image's egress (its
    # default 20,000 MiB) costs more than the gang gains, and the job stays. A negative
    # price is refused by field.
    priced = client.patch(
        f"{GROUPS}/site",
        headers=auth["admin"],
        json={"inter_cluster_egress_gpu_s_per_gib": 86_400},
    )
    assert priced.status_code == 200
    assert priced.json()["inter_cluster_egress_gpu_s_per_gib"] == 86_400
    body = client.post(f"{GROUPS}/site/what-if", headers=auth["viewer"]).json()
    assert body["link"]["egress_gpu_s_per_gib"] == 86_400
    assert body["moves"] == [] and body["federated"]["pending_started"] == 0
    bad = client.patch(
        f"{GROUPS}/site", headers=auth["admin"], json={"inter_cluster_egress_gpu_s_per_gib": -1}
    )
    assert bad.status_code == 422
    assert bad.json()["error"]["field"] == "inter_cluster_egress_gpu_s_per_gib"
    assert client.get("/api/v1/actions", headers=auth["viewer"]).json()["total"] == 0


@pytest.mark.usefixtures("two")
def test_a_job_whose_spec_the_other_scheduler_cannot_read_stays_home(
    client: TestClient, auth: dict
) -> None:
    _cluster(client, auth, "gamma", scheduler="slurm")
    client.post(GROUPS, headers=auth["admin"], json={"name": "mixed"})
    for cluster in ("alpha", "gamma"):
        client.put(f"{GROUPS}/mixed/clusters/{cluster}", headers=auth["admin"])
    _push(client, auth, "alpha", [running("big", "n1", list(range(8))), job("w", submit=SPEC)])
    body = client.post(f"{GROUPS}/mixed/what-if", headers=auth["viewer"]).json()
    assert body["movable_jobs"] == 0 and body["moves"] == []
    assert body["stays_home_examples"] == [
        {
            "job": "w",
            "cluster": "alpha",
            "why": "no other member runs sim and its spec has no portable form",
        }
    ]
    # A portable form lets it cross scheduler families.
    portable = {**SPEC, "portable": {"image": "train:1", "command": ["python", "t.py"], "gpus": 2}}
    again = snapshot(
        2,
        nodes=[node("n1")],
        jobs=[running("big", "n1", list(range(8))), job("w", submit=portable)],
    )
    pushed = client.post(
        "/api/v1/clusters/alpha/telemetry", headers=auth["connector_alpha"], json=again
    )
    assert pushed.status_code == 200, pushed.text
    body = client.post(f"{GROUPS}/mixed/what-if", headers=auth["viewer"]).json()
    assert body["movable_jobs"] == 1


@pytest.mark.usefixtures("two")
def test_a_resent_spec_with_spaces_in_its_script_writes_nothing_again(
    client: TestClient, auth: dict
) -> None:
    spec = {"scheduler": "slurm", "native": {"script": "#!/bin/sh\nsleep 600  # two spaces"}}
    url = "/api/v1/clusters/alpha/telemetry"
    first = client.post(
        url, headers=auth["connector_alpha"], json=snapshot(1, jobs=[job("w", submit=spec)])
    )
    again = client.post(
        url, headers=auth["connector_alpha"], json=snapshot(2, jobs=[job("w", submit=spec)])
    )
    assert first.json()["jobs_written"] == 1
    assert again.json()["jobs_written"] == 0
    changed = {**spec, "native": {"script": "#!/bin/sh\nsleep 601"}}
    third = client.post(
        url, headers=auth["connector_alpha"], json=snapshot(3, jobs=[job("w", submit=changed)])
    )
    assert third.json()["jobs_written"] == 1


@pytest.mark.usefixtures("two")
def test_a_spec_above_its_bound_is_refused_whole_naming_the_field(
    client: TestClient, auth: dict, session: Session
) -> None:
    spec = {"scheduler": "slurm", "native": {"script": "#!/bin/sh\n" + "x" * 70_000}}
    refused = client.post(
        "/api/v1/clusters/alpha/telemetry",
        headers=auth["connector_alpha"],
        json=snapshot(1, jobs=[job("w", submit=spec)]),
    )
    assert refused.status_code == 422
    assert refused.json()["error"]["field"].startswith("jobs[0].submit")
    assert "above 65536" in refused.json()["error"]["message"]
    assert session.exec(select(Job)).all() == []


@pytest.mark.usefixtures("two")
def test_a_team_goes_only_to_the_clusters_its_sla_policy_allows(
    client: TestClient, auth: dict
) -> None:
    _group(client, auth, "alpha", "beta")
    _push(client, auth, "alpha", [running("big", "n1", list(range(8))), job("w", submit=SPEC)])
    _push(client, auth, "beta", [])

    def policy(allowed: list[str] | None, version: int) -> None:
        team: dict[str, Any] = {"team": "vision", "allowed_clusters": allowed}
        body = {"name": "alpha", "spec": {"teams": [team]}}
        if version == 1:
            answer = client.post("/api/v1/policies", headers=auth["operator"], json=body)
        else:
            answer = client.put(
                "/api/v1/policies/alpha", headers=auth["operator"], json={"spec": body["spec"]}
            )
        assert answer.status_code in (200, 201), answer.text

    policy([], 1)  # data that may not leave alpha
    body = client.post(f"{GROUPS}/site/what-if", headers=auth["viewer"]).json()
    assert body["movable_jobs"] == 0 and body["moves"] == []
    assert [e["why"] for e in body["stays_home_examples"]] == [
        "team vision's SLA policy in alpha lets it go to none of beta "
        "(allowed_clusters, cluster_selector)"
    ]
    policy(["beta"], 2)
    body = client.post(f"{GROUPS}/site/what-if", headers=auth["viewer"]).json()
    assert [m["to_cluster"] for m in body["moves"]] == ["beta"]
    bad = client.put(
        "/api/v1/policies/alpha",
        headers=auth["operator"],
        json={"spec": {"teams": [{"team": "vision", "allowed_clusters": ["Not A Name"]}]}},
    )
    assert bad.status_code == 422
    assert "allowed_clusters" in bad.json()["error"]["field"]


@pytest.mark.usefixtures("two")
def test_a_job_may_ask_for_a_gpu_model_only_another_member_has(
    client: TestClient, auth: dict
) -> None:
    _group(client, auth, "alpha", "beta")
    # alpha has only A100s; the job accepts only H100s, which beta has, idle.
    a100 = node("n1", gpu_model="A100-80G")
    h100_only = job("w", gpus_requested=2, allowed_gpu_models=["H100"], submit=SPEC)
    body = snapshot(1, nodes=[a100], jobs=[h100_only])
    pushed = client.post(
        "/api/v1/clusters/alpha/telemetry", headers=auth["connector_alpha"], json=body
    )
    assert pushed.status_code == 200, pushed.text
    _push(client, auth, "beta", [])
    answer = client.post(f"{GROUPS}/site/what-if", headers=auth["viewer"]).json()
    assert answer["alone"]["pending_started"] == 0
    assert [(m["job"], m["to_cluster"]) for m in answer["moves"]] == [("w", "beta")]


@pytest.mark.usefixtures("two")
def test_members_whose_rules_for_a_team_differ_are_refused_naming_them(
    client: TestClient, auth: dict
) -> None:
    _group(client, auth, "alpha", "beta")
    for cluster, weight in (("alpha", 1.0), ("beta", 5.0)):
        spec = {"teams": [{"team": "vision", "priority_weight": weight}]}
        created = client.post(
            "/api/v1/policies", headers=auth["operator"], json={"name": cluster, "spec": spec}
        )
        assert created.status_code == 201, created.text
    _push(client, auth, "alpha", [job("w", submit=SPEC)])
    _push(client, auth, "beta", [job("v")])
    refused = client.post(f"{GROUPS}/site/what-if", headers=auth["viewer"])
    assert refused.status_code == 422
    message = refused.json()["error"]["message"]
    assert "team 'vision' has a different SLA policy in alpha and beta" in message


def test_the_what_if_holds_no_write_lock_while_it_solves(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a real SQLite file, as a POST's session has it (a write transaction begun):
    another writer must get the lock during every solve."""
    from datetime import UTC, datetime

    from app.clusters.models import Cluster
    from app.core import migrate
    from app.core.db import begin, make_engine
    from app.federation import planning
    from app.federation.models import FederationGroup
    from solver.policies import get_policy

    path = tmp_path / "shaper.db"
    migrate.upgrade(f"sqlite:///{path}")
    engine = make_engine(f"sqlite:///{path}", sqlite_busy_timeout_ms=100)
    now = datetime(2026, 12, 3, tzinfo=UTC)
    with Session(engine) as setup:
        group = FederationGroup(name="site", created_at=now)
        setup.add(group)
        setup.commit()
        for name in ("alpha", "beta"):
            setup.add(Cluster(name=name, federation_group_id=group.id, created_at=now))
        setup.commit()
    real = get_policy("shaper")
    other_writer: list[str] = []

    class Watching:
        def plan(self, instance: Any) -> Any:
            probe = sqlite3.connect(path, timeout=0.1)
            try:
                probe.execute("BEGIN IMMEDIATE")
                probe.execute("ROLLBACK")
                other_writer.append("ok")
            except sqlite3.OperationalError as error:
                other_writer.append(str(error))
            finally:
                probe.close()
            return real.plan(instance)

    monkeypatch.setattr(planning, "get_policy", lambda name: Watching())
    with Session(engine, expire_on_commit=False) as session:
        begin(session, writes=True)  # what SessionDep does for a POST
        answer = planning.plan_group(session=session, name="site", now=now)
    engine.dispose()
    assert answer.clusters == ["alpha", "beta"]
    assert other_writer == ["ok", "ok", "ok"]  # two clusters alone, then the group


@pytest.mark.usefixtures("two")
def test_a_start_away_is_priced_at_the_rate_the_groups_move_transfers_measured(
    client: TestClient, auth: dict, session: Session
) -> None:
    _group(client, auth, "alpha", "beta")
    _push(client, auth, "alpha", [running("big", "n1", list(range(8))), job("w", submit=SPEC)])
    _push(client, auth, "beta", [])
    body = client.post(f"{GROUPS}/site/what-if", headers=auth["viewer"]).json()
    assert body["link"] == {
        "bandwidth_mib_per_s": 100.0,
        "measured_transfers": 0,
        "egress_gpu_s_per_gib": 0.0,
    }

    alpha, beta = (
        session.exec(select(Cluster).where(Cluster.name == n)).one() for n in ("alpha", "beta")
    )
    mib = 1024 * 1024
    for index, (size, seconds) in enumerate([(200 * mib, 0.5), (100 * mib, 1.0), (mib, 0.0)]):
        move = Action(
            cluster_id=alpha.id,  # type: ignore[arg-type]
            target_cluster_id=beta.id,
            kind=ActionKind.move,
            state=ActionState.succeeded,
            idempotency_key=f"measured-{index}",
            created_at=T0,
            updated_at=T0,
        )
        session.add(move)
        session.flush()
        session.add(
            ActionStep(
                action_id=move.id,  # type: ignore[arg-type]
                seq=2,
                name="transfer",
                queue="agent.beta.n1",
                state=StepState.succeeded,
                idempotency_key=f"measured-{index}:forward:transfer",
                result={"bytes": size, "seconds": seconds},
                finished_at=T0,
            )
        )
    session.commit()
    body = client.post(f"{GROUPS}/site/what-if", headers=auth["viewer"]).json()
    # 300 MiB in 1.5 s; a copy that took no measurable time tells nothing of the link.
    assert body["link"] == {
        "bandwidth_mib_per_s": 200.0,
        "measured_transfers": 2,
        "egress_gpu_s_per_gib": 0.0,
    }
    assert [m["to_cluster"] for m in body["moves"]] == ["beta"]
