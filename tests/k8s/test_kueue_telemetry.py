"""The Kueue connector's telemetry against the real control plane (see conftest): three GPU
node types and 40 Jobs submitted through Kueue, some admitted and running, some waiting;
what the connector reports matches what the API server says."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from connectors.kubernetes import KubernetesConnector, KubernetesConnectorConfig
from connectors.kueue import KueueConnector
from tests.k8s.conftest import GPU_PRODUCT, K8sCluster, Kube, condition, wait_for
from wire.telemetry import ClusterState, JobState, NodeState

pytestmark = pytest.mark.slow

GPU = "nvidia.com/gpu"
# GFD product → the catalogue name the connector must report.
MODELS = {
    GPU_PRODUCT: "H100",
    "NVIDIA-A100-SXM4-40GB": "A100-40G",
    "NVIDIA-L4": "L4",
}
EXTRA_NODES = {  # name → (product, GPU memory MiB, GPUs)
    "tele-a100-1": ("NVIDIA-A100-SXM4-40GB", "40960", 4),
    "tele-a100-2": ("NVIDIA-A100-SXM4-40GB", "40960", 4),
    "tele-l4-1": ("NVIDIA-L4", "23034", 2),
    "tele-l4-2": ("NVIDIA-L4", "23034", 2),
}
JOBS = 40
GPUS_PER_POD = 2  # divides every node's GPUs: admitted pods always fit, no fragmentation


def kwok_node(name: str, product: str, memory: str, gpus: int) -> client.V1Node:
    """A kwok GPU node with GFD labels; not labelled type=kwok, which the control-plane
    smoke test reserves for the script's H100 nodes."""
    resources = {"cpu": "32", "memory": "256Gi", "pods": "110", GPU: str(gpus)}
    return client.V1Node(
        metadata=client.V1ObjectMeta(
            name=name,
            annotations={"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            labels={
                "shaper-test": "telemetry",
                "kubernetes.io/hostname": name,
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": product,
                "nvidia.com/gpu.memory": memory,
                "nvidia.com/gpu.count": str(gpus),
            },
        ),
        status=client.V1NodeStatus(allocatable=resources, capacity=resources),
    )


@pytest.fixture
def gpu_zoo(kube: Kube) -> Iterator[list[str]]:
    """Two more GPU types (A100-40GB ×4, L4 ×2) next to the H100 nodes, Ready."""
    for name, (product, memory, gpus) in EXTRA_NODES.items():
        kube.core.create_node(kwok_node(name, product, memory, gpus))
    try:

        def ready() -> bool:
            for name in EXTRA_NODES:
                conditions = kube.core.read_node(name).status.conditions or []
                if not any(c.type == "Ready" and c.status == "True" for c in conditions):
                    return False
            return True

        wait_for("the extra kwok nodes to be Ready", ready)
        yield list(EXTRA_NODES)
    finally:
        for name in EXTRA_NODES:
            kube.core.delete_node(name)


def three_flavor_queue(kube: Kube) -> str:
    """One ClusterQueue over three GPU flavors, quota = the GPUs of each type; returns the
    LocalQueue's name."""
    suffix = uuid.uuid4().hex[:6]
    quotas = {GPU_PRODUCT: 24, "NVIDIA-A100-SXM4-40GB": 8, "NVIDIA-L4": 4}
    flavors = []
    for product, gpus in quotas.items():
        flavor = f"{MODELS[product].lower()}-{suffix}"
        kube.create_kueue(
            "resourceflavors",
            {
                "kind": "ResourceFlavor",
                "metadata": {"name": flavor},
                "spec": {"nodeLabels": {"nvidia.com/gpu.product": product}},
            },
        )
        flavors.append(
            {
                "name": flavor,
                "resources": [
                    {"name": "cpu", "nominalQuota": "1000"},
                    {"name": GPU, "nominalQuota": str(gpus)},
                ],
            }
        )
    cluster_queue = f"tele-cq-{suffix}"
    kube.create_kueue(
        "clusterqueues",
        {
            "kind": "ClusterQueue",
            "metadata": {"name": cluster_queue},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [{"coveredResources": ["cpu", GPU], "flavors": flavors}],
            },
        },
    )
    kube.create_kueue(
        "localqueues",
        {
            "kind": "LocalQueue",
            "metadata": {"name": "research", "namespace": kube.namespace},
            "spec": {"clusterQueue": cluster_queue},
        },
    )
    wait_for(
        "the LocalQueue to be Active",
        lambda: (
            (c := condition(kube.kueue("localqueues", "research", kube.namespace), "Active"))
            and c["status"] == "True"
        ),
    )
    return cluster_queue


def queued_job(name: str, pods: int) -> client.V1Job:
    resources = {"cpu": "1", GPU: str(GPUS_PER_POD)}
    container = client.V1Container(
        name="train",
        image="registry.example/train:1",
        resources=client.V1ResourceRequirements(requests=resources, limits=resources),
    )
    return client.V1Job(
        metadata=client.V1ObjectMeta(name=name, labels={"kueue.x-k8s.io/queue-name": "research"}),
        spec=client.V1JobSpec(
            parallelism=pods,
            completions=pods,
            backoff_limit=0,
            template=client.V1PodTemplateSpec(
                spec=client.V1PodSpec(restart_policy="Never", containers=[container])
            ),
        ),
    )


def api_view(kube: Kube) -> dict[str, Any]:
    """What the API server says, in the connector's terms: per node (model, GPUs), per
    job (state, GPUs per node, gang size); None when the cluster is still settling."""
    nodes = {
        n.metadata.name: (
            MODELS[n.metadata.labels["nvidia.com/gpu.product"]],
            int(n.status.allocatable[GPU]),
        )
        for n in kube.core.list_node().items
        if GPU in (n.status.allocatable or {})
    }
    pods_by_job: dict[str, list[client.V1Pod]] = {}
    for pod in kube.core.list_namespaced_pod(kube.namespace).items:
        pods_by_job.setdefault(pod.metadata.labels["batch.kubernetes.io/job-name"], []).append(pod)
    workloads = {w["metadata"]["ownerReferences"][0]["name"]: w for w in kube.workloads()}
    jobs: dict[str, Any] = {}
    for job in kube.batch.list_namespaced_job(kube.namespace).items:
        name = job.metadata.name
        workload = workloads.get(name)
        if workload is None:
            return {"settling": f"no Workload for {name} yet"}
        admitted = (c := condition(workload, "Admitted")) and c["status"] == "True"
        pods = pods_by_job.get(name, [])
        if admitted:
            if len(pods) != job.spec.parallelism or any(p.status.phase != "Running" for p in pods):
                return {"settling": f"{name} admitted, pods not all running"}
            held = Counter(p.spec.node_name for p in pods)
            jobs[name] = ("running", {n: c * GPUS_PER_POD for n, c in held.items()})
        else:
            reserved = condition(workload, "QuotaReserved")
            if not reserved or reserved["status"] != "False" or pods:
                return {"settling": f"{name} neither admitted nor waiting"}
            jobs[name] = ("pending", {})
        jobs[name] += (job.spec.parallelism,)
    return {"nodes": nodes, "jobs": jobs}


def connector_view(state: ClusterState, namespace: str) -> dict[str, Any]:
    nodes = {n.name: (n.gpu_model, n.gpu_count) for n in state.nodes if n.gpu_count}
    jobs = {
        job.name: (
            job.state.value,
            {a.node: a.gpus for a in job.allocations},
            job.gang_size,
        )
        for job in state.jobs
        if job.external_id.startswith(f"{namespace}/job/")
    }
    return {"nodes": nodes, "jobs": jobs}


def test_forty_kueue_jobs_on_three_gpu_types_match_the_api_server(
    k8s_cluster: K8sCluster, kube: Kube, gpu_zoo: list[str]
) -> None:
    cluster_queue = three_flavor_queue(kube)
    for i in range(JOBS):
        kube.batch.create_namespaced_job(kube.namespace, queued_job(f"job-{i:02d}", 1 + i % 2))

    def settled() -> dict[str, Any] | None:
        view = api_view(kube)
        return view if "settling" not in view and len(view["jobs"]) == JOBS else None

    expected = wait_for(lambda: f"the 40 Jobs to settle: {api_view(kube)}", settled, 120)
    states = Counter(state for state, _, _ in expected["jobs"].values())
    assert states["running"] > 0 and states["pending"] > 0, states
    assert {model for model, _ in expected["nodes"].values()} == {"H100", "A100-40G", "L4"}

    config = KubernetesConnectorConfig(
        cluster="k8s-test", kubeconfig=k8s_cluster.kubeconfig, namespaces=[kube.namespace]
    )
    with KueueConnector(config) as connector:
        last: list[dict[str, Any]] = []

        def matches() -> ClusterState | None:
            state = connector.read_state()
            last[:] = [connector_view(state, kube.namespace)]
            return state if last[0] == expected else None

        state = wait_for(lambda: f"the connector to match: {last} != {expected}", matches, 30)
        # This API server offers streaming lists: every collection was listed by one.
        assert all(i.stream_list and i.lists >= 1 for i in connector.informers.values())

    by_name = {job.name: job for job in state.jobs}
    for name, (job_state, _, pods) in expected["jobs"].items():
        job = by_name[name]
        assert job.external_id == f"{kube.namespace}/job/{name}"
        assert job.queue == "research" and job.team == cluster_queue
        assert job.gpus_requested == pods * GPUS_PER_POD
        if job_state == "pending":
            assert "insufficient unused quota" in job.reason, job.reason
            assert job.allowed_gpu_models == ["A100-40G", "H100", "L4"]
        else:
            assert job.reason == "" and job.start_time is not None
            assert len(job.allowed_gpu_models) == 1
            # The admitted flavor's model is where its pods run.
            models = {
                state_node.gpu_model
                for state_node in state.nodes
                if state_node.name in {a.node for a in job.allocations}
            }
            assert models == set(job.allowed_gpu_models)
    nodes = {node.name: node for node in state.nodes}
    assert nodes["tele-a100-1"].labels["nvidia.com/gpu.memory"] == "40960"
    assert all(nodes[name].state is NodeState.up for name in gpu_zoo)

    # The plain Kubernetes connector sees the same pods; Kueue's held Jobs are suspended.
    # It lists in pages of 7, the way it lists a server without streaming lists.
    paged = config.model_copy(update={"stream_list": False, "page_size": 7})
    with KubernetesConnector(paged) as plain:
        assert plain.wait_synced(30)
        assert plain.informers["pods"].lists == 1 and not plain.informers["pods"].stream_list
        jobs = {job.name: job for job in plain.read_state().jobs}
    for name, (job_state, held, _) in expected["jobs"].items():
        assert jobs[name].state is JobState(job_state)
        assert {a.node: a.gpus for a in jobs[name].allocations} == held
        if job_state == "pending":
            assert jobs[name].reason == "suspended"
