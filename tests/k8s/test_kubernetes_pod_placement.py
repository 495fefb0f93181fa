"""Each pod of an elastic Indexed Job on the node the plan gives its index
(connectors.kubernetes.pod_placement), on the tests' real control plane: the Job's pods
are created behind a scheduling gate, and the connector names each pod's node as it lifts
the gate — in the step, and in its upkeep for a pod created later."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from connectors.actions import ConnectorStepExecutor
from connectors.kubernetes.config import KubernetesConnectorConfig
from connectors.kubernetes.connector import KubernetesConnector
from connectors.kubernetes.pod_placement import PLACEMENT_GATE, POD_NODES_ANNOTATION, encode
from tests.k8s.conftest import K8sCluster, Kube, wait_for
from tests.k8s.objects import elastic_training_job, gpu_pods_anywhere
from tests.k8s.test_kubernetes_steps import IMAGE_DIR, Steps, kwok_nodes, pods_by_index

pytestmark = pytest.mark.slow

CLUSTER = "k8s-placement"
HOST = "kubernetes.io/hostname"


@pytest.fixture
def placing(
    k8s_cluster: K8sCluster, kube: Kube, tmp_path: Path
) -> Iterator[tuple[KubernetesConnector, Steps]]:
    """A connector of the test's namespace with ``pod_placement``, and the executor of its
    steps."""
    config = KubernetesConnectorConfig(
        cluster=CLUSTER,
        kubeconfig=k8s_cluster.kubeconfig,
        namespaces=[kube.namespace],
        pod_placement=True,
    )
    connector = KubernetesConnector(config)
    try:
        assert connector.wait_synced(30), [i.error for i in connector.informers.values()]
        yield (
            connector,
            Steps(ConnectorStepExecutor(connector, cluster=CLUSTER, state_dir=tmp_path)),
        )
    finally:
        connector.close()


def _start_held(kube: Kube, steps: Steps, name: str, plan: dict[str, int]) -> dict[int, str]:
    """A held elastic Job of four 2-GPU pods started as ``plan`` says; where each index runs."""
    held = elastic_training_job(name, pods=4, gpus=2, suspend=True)
    held.spec.backoff_limit = 6  # a pod deleted below is replaced, not the Job failed
    kube.batch.create_namespaced_job(kube.namespace, held)
    job = f"{kube.namespace}/job/{name}"
    started = steps.run("start", job, nodes=sorted(plan), replicas=4, gpus=plan)
    assert started.ok, started.error
    steps.until_ok("confirm", job, expect="running", nodes=sorted(plan), exactly=True, replicas=4)
    wait_for(f"{name}'s 4 pods to run", lambda: len(pods_by_index(kube, name)) == 4)
    return {i: p.spec.node_name for i, p in pods_by_index(kube, name).items()}


def test_a_started_elastic_job_runs_each_pod_on_its_planned_node_and_a_replacement_too(
    kube: Kube, placing: tuple[KubernetesConnector, Steps]
) -> None:
    a, b, _ = kwok_nodes(kube)
    # Three pods on a, one on b, by index. Pinned to the two nodes as a set, the scheduler
    # chooses which pods go where (it scores CPU and memory, not GPUs).
    plan = {a: 6, b: 2}
    wait_for("the cluster's GPUs free", lambda: not gpu_pods_anywhere(kube))
    connector, steps = placing
    placed = _start_held(kube, steps, "placed", plan)
    assert placed == {0: a, 1: a, 2: a, 3: b}
    pods = pods_by_index(kube, "placed")
    assert all(not p.spec.scheduling_gates for p in pods.values())
    assert {i: p.spec.node_selector[HOST] for i, p in pods.items()} == placed
    job = kube.batch.read_namespaced_job("placed", kube.namespace)
    assert job.metadata.annotations[POD_NODES_ANNOTATION] == encode(placed)
    assert [g.name for g in job.spec.template.spec.scheduling_gates] == [PLACEMENT_GATE]

    # A pod lost and replaced by the Job controller comes gated; the upkeep lets it go to
    # its index's node.
    lost = pods[3].metadata.uid
    kube.core.delete_namespaced_pod(pods[3].metadata.name, kube.namespace, grace_period_seconds=0)

    def replacement_gated() -> bool:
        found = [
            p
            for p in kube.core.list_namespaced_pod(
                kube.namespace, label_selector="job-name=placed"
            ).items
            if p.metadata.annotations.get("batch.kubernetes.io/job-completion-index") == "3"
            and p.metadata.uid != lost
        ]
        return bool(found) and bool(found[0].spec.scheduling_gates) and not found[0].spec.node_name

    wait_for("index 3's replacement, gated", replacement_gated)
    wait_for(
        "the upkeep to let it go",
        lambda: any(f"→ {b}" in line for line in connector.upkeep()),
    )
    wait_for(
        "index 3 to run again on its node",
        lambda: (
            {i: p.spec.node_name for i, p in pods_by_index(kube, "placed").items()} == placed
            and pods_by_index(kube, "placed")[3].metadata.uid != lost
        ),
    )
    assert connector.upkeep() == []  # nothing left waiting

    # A move places the Job by its node set again: the gate and the map come off.
    moved = steps.run(
        "requeue",
        f"{kube.namespace}/job/placed",
        nodes=[a, b],
        hold=True,
        image={"image_dir": IMAGE_DIR, "backend": "signal"},
    )
    assert moved.ok, moved.error
    job = kube.batch.read_namespaced_job("placed", kube.namespace)
    assert job.spec.suspend and not job.spec.template.spec.scheduling_gates
    assert POD_NODES_ANNOTATION not in (job.metadata.annotations or {})
