"""The real Kubernetes control plane of the tests (see conftest), seen through the official
client: kwok GPU nodes, and a Job going through Kueue's quota, admission and the scheduler."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from tests.k8s.conftest import (
    GPU_PRODUCT,
    GPUS_PER_NODE,
    NODES,
    Kube,
    condition,
    wait_for,
)
from tests.k8s.objects import admitted, gpu_job, gpu_queues

pytestmark = pytest.mark.slow

GPU = "nvidia.com/gpu"


def running_pod(kube: Kube, job: str) -> client.V1Pod | None:
    for pod in kube.pods_of_job(job):
        if pod.spec.node_name and pod.status.phase == "Running":
            return pod
    return None


def test_kwok_nodes_advertise_gpus_with_feature_discovery_labels(kube: Kube) -> None:
    nodes = kube.core.list_node(label_selector="type=kwok").items
    assert len(nodes) >= NODES
    for node in nodes:
        labels = node.metadata.labels
        assert labels["nvidia.com/gpu.product"] == GPU_PRODUCT
        assert labels["nvidia.com/gpu.memory"] == "81559"
        assert labels["nvidia.com/gpu.count"] == str(GPUS_PER_NODE)
        assert node.status.capacity[GPU] == str(GPUS_PER_NODE)
        assert node.status.allocatable[GPU] == str(GPUS_PER_NODE)
        ready = next(c for c in node.status.conditions if c.type == "Ready")
        assert ready.status == "True", f"{node.metadata.name} is not Ready: {ready}"
        assert not node.spec.unschedulable


def test_kueue_admits_within_quota_and_holds_the_job_beyond_it(kube: Kube) -> None:
    node_names = {n.metadata.name for n in kube.core.list_node(label_selector="type=kwok").items}
    queue = gpu_queues(kube, gpus=GPUS_PER_NODE)

    # Within quota: Kueue suspends the Job on creation (its webhook), creates a Workload,
    # admits it, unsuspends the Job; the Job controller makes the pod, the scheduler binds
    # it to a kwok node, kwok runs it.
    first = kube.batch.create_namespaced_job(
        kube.namespace, gpu_job("train-a", queue=queue, gpus=8)
    )
    assert first.spec.suspend is True, "Kueue's mutating webhook did not suspend the Job"
    workload = wait_for(
        lambda: f"the Workload of train-a to be admitted: {kube.workload_of_job('train-a')}",
        lambda: admitted(kube, "train-a"),
    )
    assert workload["spec"]["queueName"] == queue
    assert condition(workload, "QuotaReserved")["status"] == "True"
    pod = wait_for(
        lambda: f"train-a's pod to run on a kwok node: {kube.pods_of_job('train-a')}",
        lambda: running_pod(kube, "train-a"),
    )
    assert kube.batch.read_namespaced_job("train-a", kube.namespace).spec.suspend is False
    assert pod.spec.node_name in node_names
    # The flavor's node labels reach the pod as a node selector.
    assert pod.spec.node_selector == {"nvidia.com/gpu.product": GPU_PRODUCT}
    assert pod.spec.containers[0].resources.requests[GPU] == "8"

    # Beyond quota: the second Job stays suspended, its Workload pending with Kueue's reason.
    kube.batch.create_namespaced_job(kube.namespace, gpu_job("train-b", queue=queue, gpus=8))

    def pending_reason() -> dict[str, Any] | None:
        workload = kube.workload_of_job("train-b")
        reserved = workload and condition(workload, "QuotaReserved")
        return reserved if reserved and reserved["status"] == "False" else None

    reserved = wait_for("train-b's Workload to report why it waits", pending_reason)
    assert reserved["reason"] == "Pending"
    assert "insufficient unused quota" in reserved["message"]
    assert GPU in reserved["message"]
    assert kube.batch.read_namespaced_job("train-b", kube.namespace).spec.suspend is True
    assert kube.pods_of_job("train-b") == []
    assert admitted(kube, "train-b") is None

    # Quota freed: deleting the first Job lets Kueue admit the second.
    kube.batch.delete_namespaced_job("train-a", kube.namespace, propagation_policy="Background")
    wait_for(
        lambda: f"train-b to be admitted once train-a is gone: {kube.workload_of_job('train-b')}",
        lambda: admitted(kube, "train-b"),
    )
    pod = wait_for(
        lambda: f"train-b's pod to run: {kube.pods_of_job('train-b')}",
        lambda: running_pod(kube, "train-b"),
    )
    assert pod.spec.node_name in node_names
