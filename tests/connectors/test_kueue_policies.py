"""Kueue ClusterQueues → Shaper SLA policy (connectors.kueue.policies) and the import's
create / version / up-to-date logic against a stand-in of the policy API
(connectors.import_policies). The real API and Kueue: tests/k8s/test_kueue_policies.py."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from app.policies.models import SlaPolicySpec
from connectors.import_policies import ControlPlane, ImportFailed, comment_for, import_policy
from connectors.kueue.policies import import_cluster_queues, merged_spec, policy_spec

DATA = Path(__file__).parent / "data" / "kueue-v0.17.0"
NOW = datetime(2026, 9, 1, 12, 0, 0, tzinfo=UTC)


def cluster_queues(name: str) -> list[dict[str, Any]]:
    with (DATA / name).open() as stream:
        return [d for d in yaml.safe_load_all(stream) if d and d["kind"] == "ClusterQueue"]


def teams(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["team"]: t for t in spec["teams"]}


def test_gpu_quotas_borrowing_weights_and_preemption() -> None:
    imported = import_cluster_queues(cluster_queues("gpu-cluster-queues.yaml"))
    by_team = teams(imported.spec)
    assert imported.teams == ["batch", "inference", "research"]
    research, inference, batch = by_team["research"], by_team["inference"], by_team["batch"]
    # Σ nominalQuota of nvidia.com/gpu over both flavors ("16" and 8); cpu is not counted.
    assert research["guaranteed_gpus"] == 24
    assert research["borrowing_limit_gpus"] == 12  # "8" + 4: every GPU flavor has a limit
    assert research["priority_weight"] == 2.0
    # inference's reclaimWithinCohort: Any can take back what research borrows.
    assert research["preemptible"] is True
    assert inference["guaranteed_gpus"] == 8
    assert inference["borrowing_limit_gpus"] is None  # cohort, no borrowingLimit: unlimited
    assert inference["priority_weight"] == 0.5  # "500m"
    assert inference["preemptible"] is False  # nothing in Kueue preempts its workloads
    assert batch["guaranteed_gpus"] == 4
    assert batch["borrowing_limit_gpus"] == 0  # no cohort: Kueue lets it borrow nothing
    assert batch["priority_weight"] == 0.001  # weight 0 clamped into Shaper's range
    assert batch["preemptible"] is False
    assert any("research: lendingLimit not mapped" in n for n in imported.notes)
    assert any("batch: fairSharing weight 0" in n for n in imported.notes)
    # The control plane's own schema accepts it, and stores it unchanged (idempotence).
    stored = SlaPolicySpec.model_validate(imported.spec).model_dump(mode="json")
    assert stored == imported.spec


def test_kueue_example_cohort_preemption() -> None:
    """Kueue's own kueueviz example: one cohort with several preemption policies; its
    accelerator resource is ``gpu``, which is not ``nvidia.com/gpu``."""
    by_team = teams(policy_spec(cluster_queues("kueueviz-01-cluster-queues.yaml")))
    assert set(by_team) == {
        "agi-cluster-queue",
        "emergency-cluster-queue",
        "llm-cluster-queue",
        "unused-cluster-queue",
    }
    assert all(t["guaranteed_gpus"] == 0 for t in by_team.values())
    assert all(t["borrowing_limit_gpus"] == 0 for t in by_team.values())  # no GPU listed
    assert by_team["emergency-cluster-queue"]["preemptible"] is True  # withinClusterQueue
    assert by_team["agi-cluster-queue"]["preemptible"] is True  # peers reclaim
    assert by_team["llm-cluster-queue"]["preemptible"] is True
    assert by_team["unused-cluster-queue"]["preemptible"] is False  # no cohort, no policy


def test_cpu_only_cluster_queue_and_selection() -> None:
    spec = policy_spec(cluster_queues("admin_single-clusterqueue-setup.yaml"))
    assert spec["teams"] == [
        {
            "team": "cluster-queue",
            "priority_weight": 1.0,
            "guaranteed_gpus": 0,
            "borrowing_limit_gpus": 0,
            "max_queue_wait_s": None,
            "preemptible": False,
            "max_migrations_per_day": 4,
            "deadline": None,
            "allowed_clusters": None,
            "cluster_selector": None,
        }
    ]
    # Only inference imported, but research still counts as its cohort peer.
    gpu = cluster_queues("gpu-cluster-queues.yaml")
    only = import_cluster_queues(gpu, only={"research"})
    assert only.teams == ["research"]
    assert only.spec["teams"][0]["preemptible"] is True  # inference (not imported) reclaims


def test_fractional_quota_and_mixed_borrowing() -> None:
    queue = {
        "metadata": {"name": "q"},
        "spec": {
            "cohortName": "c",
            "resourceGroups": [
                {
                    "flavors": [
                        {
                            "name": "a",
                            "resources": [
                                {
                                    "name": "nvidia.com/gpu",
                                    "nominalQuota": "1500m",
                                    "borrowingLimit": 2,
                                }
                            ],
                        },
                        {
                            "name": "b",
                            "resources": [{"name": "nvidia.com/gpu", "nominalQuota": "1k"}],
                        },
                    ]
                }
            ],
        },
    }
    imported = import_cluster_queues([queue])
    team = imported.spec["teams"][0]
    assert team["guaranteed_gpus"] == 1001  # 1.5 + 1000, floored
    assert team["borrowing_limit_gpus"] is None  # flavor b may borrow without limit
    assert any("rounded" in n for n in imported.notes)


def test_merge_keeps_shaper_only_fields_other_teams_and_services() -> None:
    imported = policy_spec(cluster_queues("gpu-cluster-queues.yaml"))
    current = {
        "teams": [
            {
                **teams(imported)["research"],
                "guaranteed_gpus": 1,
                "max_queue_wait_s": 600.0,
                "allowed_clusters": [],  # data that may not leave this cluster
                "cluster_selector": {"region": "eu"},
            },
            {"team": "hand-made", "guaranteed_gpus": 2},
        ],
        "services": [{"service": "chat", "min_replicas": 2, "demand_target": 1.0}],
        "speed_profiles": [{"kind": "training", "speeds": {"H100": 3.4}}],
    }
    merged = merged_spec(current, imported)
    assert [t["team"] for t in merged["teams"]] == ["research", "hand-made", "batch", "inference"]
    research = merged["teams"][0]
    assert research["guaranteed_gpus"] == 24 and research["max_queue_wait_s"] == 600.0
    assert research["allowed_clusters"] == [] and research["cluster_selector"] == {"region": "eu"}
    assert merged["services"] == current["services"]
    assert merged["speed_profiles"] == current["speed_profiles"]  # Kueue has no word for them
    assert merged_spec(merged, imported) == merged  # a second import changes nothing
    assert merged_spec(current, imported, replace=True) == imported


class PolicyApi:
    """The policy endpoints' contract: GET (viewer), POST/PUT (operator), versions."""

    def __init__(self, scopes: dict[str, str]) -> None:
        self.scopes = scopes
        self.versions: list[dict[str, Any]] = []
        self.authorizations: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        authorization = request.headers.get("authorization", "")
        self.authorizations.append(authorization)
        scope = self.scopes.get(authorization.removeprefix("Bearer "))
        if scope is None:
            return httpx.Response(401, json={"error": {"message": "bad token"}})
        if request.method == "GET":
            if not self.versions:
                return httpx.Response(404, json={"error": {"message": "no such policy"}})
            return httpx.Response(200, json=self.versions[-1])
        if scope != "operator":
            return httpx.Response(
                403, json={"error": {"code": "forbidden", "message": "needs scope operator"}}
            )
        body = json.loads(request.content)
        if request.method == "POST" and self.versions:
            return httpx.Response(409, json={"error": {"message": "exists"}})
        version = {"version": len(self.versions) + 1, "spec": body["spec"]}
        self.versions.append({**version, "comment": body["comment"]})
        return httpx.Response(201 if request.method == "POST" else 200, json=self.versions[-1])


def test_import_creates_then_keeps_then_versions() -> None:
    api = PolicyApi({"op-token": "operator", "view-token": "viewer"})
    plane = ControlPlane("http://cp", "op-token", transport=httpx.MockTransport(api))
    queues = cluster_queues("gpu-cluster-queues.yaml")
    where = "context admin (https://127.0.0.1:6443)"

    first = import_policy(
        plane, name="gpu-a", imported=import_cluster_queues(queues), where=where, now=NOW
    )
    assert (first.written, first.version) == (True, 1)
    assert api.versions[0]["comment"] == (
        "imported from Kueue ClusterQueues batch, inference, research of "
        "context admin (https://127.0.0.1:6443) at 2026-09-01T12:00:00Z"
    )
    again = import_policy(
        plane, name="gpu-a", imported=import_cluster_queues(queues), where=where, now=NOW
    )
    assert (again.written, again.version) == (False, 1)
    assert len(api.versions) == 1

    queues[2]["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"] = "6"
    changed = import_policy(
        plane, name="gpu-a", imported=import_cluster_queues(queues), where=where, now=NOW
    )
    assert (changed.written, changed.version) == (True, 2)
    assert teams(api.versions[1]["spec"])["batch"]["guaranteed_gpus"] == 6

    viewer = ControlPlane("http://cp", "view-token", transport=httpx.MockTransport(api))
    queues[2]["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"] = "7"
    with pytest.raises(ImportFailed, match="403 needs scope operator.*operator scope"):
        import_policy(
            viewer, name="gpu-a", imported=import_cluster_queues(queues), where=where, now=NOW
        )
    assert len(api.versions) == 2


def test_comment_shortens_many_names() -> None:
    names = [f"queue-{i:04d}-{'x' * 40}" for i in range(100)]
    comment = comment_for(names, "in-cluster (https://10.0.0.1:443)", NOW)
    assert len(comment) <= 1024
    assert comment.startswith("imported from Kueue ClusterQueues queue-0000-")
    assert comment.endswith("more of in-cluster (https://10.0.0.1:443) at 2026-09-01T12:00:00Z")
