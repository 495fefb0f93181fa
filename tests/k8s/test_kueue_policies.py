"""Importing Kueue ClusterQueues as the cluster's SLA policy, for real: ClusterQueues on the
test control plane (real kube-apiserver and Kueue's webhooks and defaults), ``shaper
connector import-policies`` as a process with the admin kubeconfig, and the API over HTTP
on PostgreSQL."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlmodel import Session

from app.core import migrate
from app.core.db import make_engine
from tests.k8s.conftest import KUEUE_GROUP, KUEUE_VERSION, K8sCluster, Kube
from tests.support.live_server import app_on, serve, tokens_for

pytestmark = pytest.mark.slow

SHAPER = Path(sys.executable).parent / "shaper"
CLUSTER = "kueue-import"
GPU = "nvidia.com/gpu"


@pytest.fixture(scope="module")
def api(make_postgres_database: Any) -> Iterator[tuple[str, dict[str, str]]]:
    url = make_postgres_database("kueue_policies")
    migrate.upgrade(url)
    engine = make_engine(url)
    with Session(engine) as session:
        tokens = tokens_for(session, datetime.now(UTC), ["operator", "viewer"])
    try:
        with serve(app_on(engine)) as base:
            yield base, tokens
    finally:
        engine.dispose()


def cluster_queue(name: str, *, cohort: str, label: str, gpus: dict[str, int]) -> dict[str, Any]:
    return {
        "kind": "ClusterQueue",
        "metadata": {"name": name, "labels": {"shaper-test": label}},
        "spec": {
            "namespaceSelector": {},
            "cohortName": cohort,
            "fairSharing": {"weight": "2"} if name.startswith("train") else {},
            "preemption": {"withinClusterQueue": "LowerPriority"}
            if name.startswith("train")
            else {},
            "resourceGroups": [
                {
                    "coveredResources": ["cpu", GPU],
                    "flavors": [
                        {
                            "name": flavor,
                            "resources": [
                                {"name": "cpu", "nominalQuota": "64"},
                                {
                                    "name": GPU,
                                    "nominalQuota": str(count),
                                    **({"borrowingLimit": "4"} if name.startswith("train") else {}),
                                },
                            ],
                        }
                        for flavor, count in gpus.items()
                    ],
                }
            ],
        },
    }


def run_import(
    k8s: K8sCluster, base: str, token: str, label: str, *extra: str
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SHAPER_OPERATOR_TOKEN"}
    env["SHAPER_OPERATOR_TOKEN"] = token
    return subprocess.run(
        [
            str(SHAPER),
            "connector",
            "import-policies",
            "--kind",
            "kueue",
            "--cluster",
            CLUSTER,
            "--control-plane",
            base,
            "--set",
            f"kubeconfig={k8s.kubeconfig}",
            "--selector",
            f"shaper-test={label}",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )


def test_import_cluster_queues_as_policy(
    k8s_cluster: K8sCluster, kube: Kube, api: tuple[str, dict[str, str]]
) -> None:
    base, tokens = api
    label = uuid.uuid4().hex[:8]
    train, serve_q = f"train-{label}", f"serve-{label}"
    for flavor in ("h100", "a100"):
        kube.create_kueue(
            "resourceflavors",
            {"kind": "ResourceFlavor", "metadata": {"name": f"{flavor}-{label}"}, "spec": {}},
        )
    kube.create_kueue(
        "clusterqueues",
        cluster_queue(
            train, cohort=f"ml-{label}", label=label, gpus={f"h100-{label}": 16, f"a100-{label}": 8}
        ),
    )
    kube.create_kueue(
        "clusterqueues",
        cluster_queue(serve_q, cohort=f"ml-{label}", label=label, gpus={f"h100-{label}": 8}),
    )
    viewer = httpx.Client(
        base_url=base, headers={"Authorization": f"Bearer {tokens['viewer']}"}, timeout=30
    )

    dry = run_import(k8s_cluster, base, tokens["operator"], label, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert viewer.get(f"/api/v1/policies/{CLUSTER}").status_code == 404  # nothing written

    first = run_import(k8s_cluster, base, tokens["operator"], label)
    assert first.returncode == 0, first.stderr
    assert f"policy {CLUSTER}: version 1 written" in first.stdout
    policy = viewer.get(f"/api/v1/policies/{CLUSTER}").json()
    assert policy["version"] == 1
    teams = {t["team"]: t for t in policy["spec"]["teams"]}
    assert set(teams) == {train, serve_q}
    assert teams[train]["guaranteed_gpus"] == 24
    assert teams[train]["borrowing_limit_gpus"] == 8  # 4 + 4 within cohort ml-<label>
    assert teams[train]["priority_weight"] == 2.0
    assert teams[train]["preemptible"] is True  # withinClusterQueue: LowerPriority
    assert teams[serve_q]["guaranteed_gpus"] == 8
    assert teams[serve_q]["borrowing_limit_gpus"] is None  # Kueue: unlimited in the cohort
    assert teams[serve_q]["priority_weight"] == 1.0
    assert teams[serve_q]["preemptible"] is False  # Kueue's defaults: Never everywhere
    server = k8s_cluster.api_client().configuration.host
    assert policy["comment"].startswith(
        f"imported from Kueue ClusterQueues {serve_q}, {train} of context "
    )
    assert f"({server}) at 20" in policy["comment"] and policy["comment"].endswith("Z")
    assert policy["created_by"] == "operator"

    again = run_import(k8s_cluster, base, tokens["operator"], label)
    assert again.returncode == 0, again.stderr
    assert "up to date at version 1; nothing written" in again.stdout
    assert len(viewer.get(f"/api/v1/policies/{CLUSTER}/versions").json()) == 1

    def set_quota(gpus: int) -> None:
        queue = kube.kueue("clusterqueues", serve_q)
        queue["spec"]["resourceGroups"][0]["flavors"][0]["resources"][1]["nominalQuota"] = str(gpus)
        kube.custom.replace_cluster_custom_object(
            KUEUE_GROUP, KUEUE_VERSION, "clusterqueues", serve_q, queue
        )

    set_quota(12)
    changed = run_import(k8s_cluster, base, tokens["operator"], label)
    assert changed.returncode == 0, changed.stderr
    assert f"policy {CLUSTER}: version 2 written" in changed.stdout
    policy = viewer.get(f"/api/v1/policies/{CLUSTER}").json()
    assert policy["version"] == 2
    assert {t["team"]: t for t in policy["spec"]["teams"]}[serve_q]["guaranteed_gpus"] == 12

    set_quota(10)
    refused = run_import(k8s_cluster, base, tokens["viewer"], label)
    assert refused.returncode == 1
    assert "writing policy 'kueue-import': 403" in refused.stderr
    assert "needs a token with the operator scope" in refused.stderr
    assert tokens["viewer"] not in refused.stderr + refused.stdout
    assert viewer.get(f"/api/v1/policies/{CLUSTER}").json()["version"] == 2
    viewer.close()
