"""connectors.kueue.actions against the real Kueue v0.17 manager and control plane of the
tests (see conftest): holding a Workload out of admission and letting it back, starting one
that FIFO admission left waiting, and preemption that keeps the work (kueue#477)."""

from __future__ import annotations

import time

import pytest

from connectors.base import ConnectorError
from connectors.kubernetes import actions as kube_actions
from connectors.kubernetes.actions import PodOnNode
from connectors.kubernetes.config import KubernetesConnectorConfig
from connectors.kubernetes.pins import RESTORE_LABEL
from connectors.kubernetes.pods import RESUME_FROM
from connectors.kueue import actions
from connectors.kueue.connector import KueueConnector
from tests.k8s.conftest import K8sCluster, Kube, condition, wait_for
from tests.k8s.objects import (
    admitted,
    gpu_job,
    gpu_queues,
    pending,
    resolved_env,
    running_pods,
    workload_name,
)
from wire.checkpoint_image import ImageRestore

pytestmark = pytest.mark.slow


def evicted_by_deactivation(kube: Kube, job: str) -> bool:
    workload = kube.workload_of_job(job)
    if workload is None or actions.is_active(workload):
        return False
    evicted = condition(workload, "Evicted")
    return bool(evicted and evicted["status"] == "True" and evicted["reason"] == "Deactivated")


def stays(what: str, check: object, seconds: float = 3.0) -> None:
    """Assert that ``check()`` holds for ``seconds``: Kueue had time to act, and did not."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert check() if callable(check) else check, f"{what} no longer holds"
        time.sleep(0.2)


def test_deactivate_holds_an_admitted_workload_and_reactivate_lets_it_back(kube: Kube) -> None:
    queue = gpu_queues(kube, gpus=8)
    kube.batch.create_namespaced_job(kube.namespace, gpu_job("serve", gpus=4, queue=queue))
    wait_for("serve to be admitted", lambda: admitted(kube, "serve"))
    (first,) = wait_for("serve's pod to run", lambda: running_pods(kube, "serve"))
    workload = workload_name(kube, "serve")

    for _ in range(2):  # the retry is a no-op
        actions.deactivate(kube.api, namespace=kube.namespace, workload=workload)
    wait_for(
        lambda: f"serve's Workload to be evicted as Deactivated: {kube.workload_of_job('serve')}",
        lambda: evicted_by_deactivation(kube, "serve"),
    )
    wait_for("serve's pods to go", lambda: not kube.pods_of_job("serve"))
    wait_for("serve's quota to be released", lambda: pending(kube, "serve"))
    assert kube.batch.read_namespaced_job("serve", kube.namespace).spec.suspend is True
    stays("serve held out of admission", lambda: admitted(kube, "serve") is None)

    for _ in range(2):
        actions.reactivate(kube.api, namespace=kube.namespace, workload=workload)
    wait_for("serve to be admitted again", lambda: admitted(kube, "serve"))
    (again,) = wait_for("serve's pod to run again", lambda: running_pods(kube, "serve"))
    assert again.metadata.uid != first.metadata.uid

    # Kueue owns spec.suspend of the Jobs it manages: the Kubernetes action refuses them.
    with pytest.raises(ConnectorError) as refused:
        kube_actions.suspend_job(kube.api, namespace=kube.namespace, job="serve")
    assert not refused.value.retryable and "deactivate its Workload" in str(refused.value)

    with pytest.raises(ConnectorError) as missing:
        actions.deactivate(kube.api, namespace=kube.namespace, workload="no-such-workload")
    assert not missing.value.retryable
    assert "patch workloads.kueue.x-k8s.io no-such-workload" in str(missing.value)


def test_a_workload_strict_fifo_left_behind_a_large_one_is_started_by_holding_the_blocker(
    kube: Kube,
) -> None:
    """StrictFIFO orders a ClusterQueue's Workloads by creation time and admits none past
    the head while the head does not fit: with 8 GPUs of quota and 4 in use, an 8-GPU Job
    at the head blocks a 2-GPU Job that would fit. (BestEffortFIFO would admit the small
    one on its own, skipping the head; StrictFIFO is what sites choose so that large jobs
    are not starved, and what leaves GPUs idle.) Shaper's plan starts the small one by
    holding the blocker (deactivate); when it lets the blocker back (reactivate), the
    blocker queues again for the quota."""
    queue = gpu_queues(kube, gpus=8, strategy="StrictFIFO")
    kube.batch.create_namespaced_job(kube.namespace, gpu_job("running", gpus=4, queue=queue))
    wait_for("running to be admitted", lambda: admitted(kube, "running"))
    kube.batch.create_namespaced_job(kube.namespace, gpu_job("large", gpus=8, queue=queue))
    wait_for("large to wait for quota", lambda: pending(kube, "large"))
    # Kueue orders by the Workloads' creation times, which have a resolution of a second:
    # created within the same second as large, small could tie with it at the head.
    time.sleep(1.1)
    kube.batch.create_namespaced_job(kube.namespace, gpu_job("small", gpus=2, queue=queue))
    wait_for("small's Workload", lambda: kube.workload_of_job("small"))
    stays("small blocked behind large", lambda: admitted(kube, "small") is None)

    large = workload_name(kube, "large")
    actions.deactivate(kube.api, namespace=kube.namespace, workload=large)
    wait_for("small to be admitted once large is held", lambda: admitted(kube, "small"))
    wait_for("small's pod to run", lambda: running_pods(kube, "small"))

    actions.reactivate(kube.api, namespace=kube.namespace, workload=large)
    wait_for(
        lambda: f"large to queue again for quota: {kube.workload_of_job('large')}",
        lambda: (wl := pending(kube, "large")) is not None and actions.is_active(wl),
    )
    assert admitted(kube, "running") and admitted(kube, "small")


def test_checkpoint_aware_preemption_resumes_from_the_checkpoint_on_readmission(
    kube: Kube,
) -> None:
    queue = gpu_queues(kube, gpus=8)
    kube.batch.create_namespaced_job(kube.namespace, gpu_job("pretrain", gpus=8, queue=queue))
    wait_for("pretrain to be admitted", lambda: admitted(kube, "pretrain"))
    (before,) = wait_for("pretrain's pod to run", lambda: running_pods(kube, "pretrain"))
    assert resolved_env(before, "SHAPER_RESUME_FROM") is None  # a fresh start
    workload = workload_name(kube, "pretrain")

    checkpointed: list[list[PodOnNode]] = []

    def checkpoint(pods: list[PodOnNode]) -> str:
        # The node agent's part: the pods must still run when it is asked.
        assert all(kube.core.read_namespaced_pod(p.pod, p.namespace) for p in pods)
        checkpointed.append(pods)
        return "ckpt://pretrain/step-1200"

    pointer = actions.preempt_with_checkpoint(
        kube.api, namespace=kube.namespace, workload=workload, checkpoint=checkpoint
    )
    assert pointer == "ckpt://pretrain/step-1200"
    assert checkpointed == [
        [
            PodOnNode(
                namespace=kube.namespace,
                pod=before.metadata.name,
                node=before.spec.node_name,
                uid=before.metadata.uid,
            )
        ]
    ]
    assert evicted_by_deactivation(kube, "pretrain")
    assert not kube.pods_of_job("pretrain")
    job = kube.batch.read_namespaced_job("pretrain", kube.namespace)
    assert job.spec.suspend is True
    assert job.metadata.annotations[RESUME_FROM] == pointer

    # A retry (the saga's resend) checkpoints nothing again and answers the same pointer.
    again = actions.preempt_with_checkpoint(
        kube.api, namespace=kube.namespace, workload=workload, checkpoint=checkpoint
    )
    assert again == pointer and len(checkpointed) == 1
    stays("pretrain held while preempted", lambda: admitted(kube, "pretrain") is None)

    actions.reactivate(kube.api, namespace=kube.namespace, workload=workload)
    wait_for("pretrain to be admitted again", lambda: admitted(kube, "pretrain"))
    (after,) = wait_for("pretrain's new pod to run", lambda: running_pods(kube, "pretrain"))
    assert after.metadata.uid != before.metadata.uid
    # Progress kept: the new pod resumes from the checkpoint instead of starting over.
    assert resolved_env(after, "SHAPER_RESUME_FROM") == pointer
    # The same Workload came back, not a new one in its place.
    assert workload_name(kube, "pretrain") == workload


def test_preemption_refuses_a_workload_that_would_lose_its_work(kube: Kube) -> None:
    queue = gpu_queues(kube, gpus=8)
    job = gpu_job("eval", gpus=2, queue=queue, checkpointable=False)
    kube.batch.create_namespaced_job(kube.namespace, job)
    wait_for("eval to be admitted", lambda: admitted(kube, "eval"))
    (before,) = wait_for("eval's pod to run", lambda: running_pods(kube, "eval"))
    workload = workload_name(kube, "eval")
    asked: list[list[PodOnNode]] = []

    def checkpoint(pods: list[PodOnNode]) -> str:
        asked.append(pods)
        return "never"

    with pytest.raises(ConnectorError) as refused:
        actions.preempt_with_checkpoint(
            kube.api, namespace=kube.namespace, workload=workload, checkpoint=checkpoint
        )
    assert not refused.value.retryable and "not checkpointable" in str(refused.value)
    assert asked == []
    assert admitted(kube, "eval")
    assert [p.metadata.uid for p in running_pods(kube, "eval")] == [before.metadata.uid]

    # A policy that allows a restart may preempt it: held, no checkpoint, nothing to resume.
    pointer = actions.preempt_with_checkpoint(
        kube.api,
        namespace=kube.namespace,
        workload=workload,
        checkpoint=checkpoint,
        allow_restart=True,
    )
    assert pointer is None and asked == []
    assert evicted_by_deactivation(kube, "eval") and not kube.pods_of_job("eval")

    with pytest.raises(ConnectorError) as missing:
        actions.preempt_with_checkpoint(
            kube.api, namespace=kube.namespace, workload="no-such-workload", checkpoint=checkpoint
        )
    assert not missing.value.retryable and "404" in str(missing.value)


def test_a_held_workload_loses_its_pointer_to_images_gone_with_their_node(
    k8s_cluster: K8sCluster, kube: Kube, node_that_goes: str
) -> None:
    """A Kueue Job preempted with a kubelet checkpoint is held (its Workload deactivated) to
    resume from images on the node it ran on, and reported held there. Once that node is
    deleted, the Kueue connector's upkeep takes the pointer and the restore label off its
    pod sets and its Job; the Workload stays held, and the Job is reported held nowhere."""
    # A label of the node's own (not its hostname, which the telemetry would read as a pin).
    kube.core.patch_node(node_that_goes, {"metadata": {"labels": {"shaper-test/pool": "gone"}}})
    queue = gpu_queues(kube, gpus=8)
    job = gpu_job("pretrain", gpus=8, queue=queue)
    job.spec.template.spec.node_selector = {"shaper-test/pool": "gone"}
    kube.batch.create_namespaced_job(kube.namespace, job)
    (pod,) = wait_for("pretrain's pod to run", lambda: running_pods(kube, "pretrain"))
    assert pod.spec.node_name == node_that_goes
    workload = workload_name(kube, "pretrain")

    def checkpoint(pods: list[PodOnNode]) -> str:
        return ImageRestore(node=pods[0].node, images={"train": "localhost/ckpt:1"}).pointer()

    pointer = actions.preempt_with_checkpoint(
        kube.api, namespace=kube.namespace, workload=workload, checkpoint=checkpoint
    )
    config = KubernetesConnectorConfig(
        cluster="kueue-images", kubeconfig=k8s_cluster.kubeconfig, namespaces=[kube.namespace]
    )
    with KueueConnector(config) as connector:
        assert connector.wait_synced(30), [i.error for i in connector.informers.values()]
        wanted = f"{kube.namespace}/job/pretrain"

        def required() -> list[str]:
            return next(
                j.required_nodes for j in connector.read_state().jobs if j.external_id == wanted
            )

        wait_for(
            f"pretrain reported held to {node_that_goes}", lambda: required() == [node_that_goes]
        )
        for _ in range(3):
            assert connector.upkeep() == []  # the node is there: its images may be too

        kube.core.delete_node(node_that_goes)
        lines: list[str] = []

        def forgotten() -> bool:
            lines.extend(connector.upkeep())
            found = kube.batch.read_namespaced_job("pretrain", kube.namespace)
            return RESUME_FROM not in (found.spec.template.metadata.annotations or {})

        wait_for("the pointer to come off pretrain", forgotten)
        assert any(f"went with node {node_that_goes}" in line for line in lines), lines
        found = kube.batch.read_namespaced_job("pretrain", kube.namespace)
        assert RESUME_FROM not in (found.metadata.annotations or {})
        assert RESTORE_LABEL not in (found.spec.template.metadata.labels or {})
        assert found.spec.suspend
        held = kube.workload_of_job("pretrain")
        assert held is not None and not actions.is_active(held)  # still held
        for pod_set in held["spec"]["podSets"]:
            metadata = pod_set["template"].get("metadata") or {}
            assert RESUME_FROM not in (metadata.get("annotations") or {}), pointer
            assert RESTORE_LABEL not in (metadata.get("labels") or {})
        wait_for("pretrain reported held nowhere", lambda: required() == [])
        assert connector.upkeep() == []
