"""Builders of the Kubernetes and Kueue objects the action tests submit, and reads of what
the control plane made of them."""

from __future__ import annotations

import uuid
from typing import Any

from kubernetes import client

from connectors.kubernetes.pods import (
    CHECKPOINTABLE_ANNOTATION,
    QUEUE_LABEL,
    RESUME_FROM_ENV,
    RESUME_FROM_FIELD,
)
from tests.k8s.conftest import GPU_PRODUCT, Kube, condition, wait_for

GPU = "nvidia.com/gpu"


def trainer(*, gpus: int, resume_env: bool) -> client.V1Container:
    """A training container; ``resume_env``: it reads SHAPER_RESUME_FROM from the
    ``shaper.io/resume-from`` annotation (the Downward API), as checkpointable Jobs do."""
    resources = {"cpu": "1", "memory": "1Gi", GPU: str(gpus)}
    env = (
        [
            client.V1EnvVar(
                name=RESUME_FROM_ENV,
                value_from=client.V1EnvVarSource(
                    field_ref=client.V1ObjectFieldSelector(field_path=RESUME_FROM_FIELD)
                ),
            )
        ]
        if resume_env
        else None
    )
    return client.V1Container(
        name="train",
        image="registry.example/train:1",
        command=["python", "train.py"],
        env=env,
        resources=client.V1ResourceRequirements(requests=resources, limits=resources),
    )


def gpu_job(
    name: str,
    *,
    gpus: int,
    queue: str | None = None,
    checkpointable: bool = True,
    resume_env: bool = True,
) -> client.V1Job:
    """A one-pod Job asking for ``gpus`` GPUs; through Kueue when ``queue`` names a
    LocalQueue, else a plain Job that Kueue leaves alone."""
    labels = {QUEUE_LABEL: queue} if queue else None
    annotations = {CHECKPOINTABLE_ANNOTATION: "true"} if checkpointable else None
    return client.V1Job(
        metadata=client.V1ObjectMeta(name=name, labels=labels),
        spec=client.V1JobSpec(
            parallelism=1,
            completions=1,
            backoff_limit=0,
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(annotations=annotations),
                spec=client.V1PodSpec(
                    restart_policy="Never",
                    containers=[trainer(gpus=gpus, resume_env=resume_env)],
                ),
            ),
        ),
    )


def elastic_training_job(
    name: str, *, pods: int, gpus: int, low: int = 1, high: int = 4, suspend: bool = False
) -> client.V1Job:
    """An elastic training job: an Indexed Job of ``pods`` pods (completions =
    parallelism) of ``gpus`` GPUs each, its range in Shaper's annotations."""
    job = gpu_job(name, gpus=gpus)
    job.metadata.annotations = {
        "shaper.io/min-replicas": str(low),
        "shaper.io/max-replicas": str(high),
    }
    job.spec.completion_mode = "Indexed"
    job.spec.completions = job.spec.parallelism = pods
    job.spec.suspend = suspend
    return job


def gpu_pods_anywhere(kube: Kube) -> list[str]:
    """GPU pods bound to a node in any namespace (an earlier test's may still be going:
    namespaces are deleted in the background)."""
    return [
        f"{p.metadata.namespace}/{p.metadata.name}"
        for p in kube.core.list_pod_for_all_namespaces().items
        if p.spec.node_name
        and p.status.phase not in ("Succeeded", "Failed")
        and any(GPU in (c.resources.requests or {}) for c in p.spec.containers if c.resources)
    ]


def bare_pod(
    name: str, *, gpus: int, checkpointable: bool = True, node: str | None = None
) -> client.V1Pod:
    annotations = {CHECKPOINTABLE_ANNOTATION: "true"} if checkpointable else None
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, annotations=annotations, labels={"app": name}),
        spec=client.V1PodSpec(
            restart_policy="Never",
            node_selector={"kubernetes.io/hostname": node} if node else None,
            containers=[trainer(gpus=gpus, resume_env=False)],
        ),
    )


def gpu_queues(kube: Kube, *, gpus: int, strategy: str = "BestEffortFIFO") -> str:
    """A ResourceFlavor for the H100 nodes, a ClusterQueue with ``gpus`` GPUs of quota
    ordered by ``strategy`` and a LocalQueue in the test's namespace; returns its name."""
    suffix = uuid.uuid4().hex[:6]
    flavor, cluster_queue = f"h100-{suffix}", f"gpu-cq-{suffix}"
    kube.create_kueue(
        "resourceflavors",
        {
            "kind": "ResourceFlavor",
            "metadata": {"name": flavor},
            "spec": {"nodeLabels": {"nvidia.com/gpu.product": GPU_PRODUCT}},
        },
    )
    quota = [
        {"name": "cpu", "nominalQuota": "64"},
        {"name": "memory", "nominalQuota": "256Gi"},
        {"name": GPU, "nominalQuota": str(gpus)},
    ]
    kube.create_kueue(
        "clusterqueues",
        {
            "kind": "ClusterQueue",
            "metadata": {"name": cluster_queue},
            "spec": {
                "namespaceSelector": {},
                "queueingStrategy": strategy,
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "memory", GPU],
                        "flavors": [{"name": flavor, "resources": quota}],
                    }
                ],
            },
        },
    )
    kube.create_kueue(
        "localqueues",
        {
            "kind": "LocalQueue",
            "metadata": {"name": "team-a", "namespace": kube.namespace},
            "spec": {"clusterQueue": cluster_queue},
        },
    )

    def active(plural: str, name: str, namespace: str | None = None) -> bool:
        found = condition(kube.kueue(plural, name, namespace), "Active")
        return bool(found and found["status"] == "True")

    wait_for(
        f"ClusterQueue {cluster_queue} to be Active", lambda: active("clusterqueues", cluster_queue)
    )
    wait_for(
        "LocalQueue team-a to be Active", lambda: active("localqueues", "team-a", kube.namespace)
    )
    return "team-a"


def workload_name(kube: Kube, job: str) -> str:
    workload = wait_for(f"the Workload of {job}", lambda: kube.workload_of_job(job))
    return str(workload["metadata"]["name"])


def admitted(kube: Kube, job: str) -> dict[str, Any] | None:
    workload = kube.workload_of_job(job)
    if workload and (c := condition(workload, "Admitted")) and c["status"] == "True":
        return workload
    return None


def pending(kube: Kube, job: str) -> dict[str, Any] | None:
    """The Workload of ``job`` when Kueue reports it waiting for quota."""
    workload = kube.workload_of_job(job)
    reserved = workload and condition(workload, "QuotaReserved")
    return workload if reserved and reserved["status"] == "False" else None


def running_pods(kube: Kube, job: str) -> list[client.V1Pod]:
    return [
        pod
        for pod in kube.pods_of_job(job)
        if pod.spec.node_name
        and pod.status.phase == "Running"
        and pod.metadata.deletion_timestamp is None
    ]


def resolved_env(pod: client.V1Pod, name: str) -> str | None:
    """What the kubelet would put in the container's environment as ``name`` (kwok runs no
    containers): a literal value, or an annotation through the Downward API."""
    for var in pod.spec.containers[0].env or []:
        if var.name != name:
            continue
        if var.value is not None:
            return str(var.value)
        field_path = var.value_from.field_ref.field_path
        prefix = "metadata.annotations['"
        assert field_path.startswith(prefix), field_path
        return (pod.metadata.annotations or {}).get(field_path[len(prefix) : -2])
    return None


def inference_deployment(
    name: str, *, replicas: int, gpus: int = 1, min_replicas: int = 1, max_replicas: int = 4
) -> client.V1Deployment:
    """An elastic inference service: ``gpus`` GPUs a replica, its range in Shaper's
    annotations, pods labelled ``app=<name>``."""
    resources = {"cpu": "1", "memory": "1Gi", GPU: str(gpus)}
    labels = {"app": name}
    return client.V1Deployment(
        metadata=client.V1ObjectMeta(
            name=name,
            annotations={
                "shaper.io/min-replicas": str(min_replicas),
                "shaper.io/max-replicas": str(max_replicas),
            },
        ),
        spec=client.V1DeploymentSpec(
            replicas=replicas,
            selector=client.V1LabelSelector(match_labels=labels),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels),
                spec=client.V1PodSpec(
                    containers=[
                        client.V1Container(
                            name="serve",
                            image="registry.example/serve:1",
                            resources=client.V1ResourceRequirements(
                                requests=resources, limits=resources
                            ),
                        )
                    ]
                ),
            ),
        ),
    )
