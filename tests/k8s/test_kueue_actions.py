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
from connectors.kubernetes.pins import LIFTING_PIN, RESTORE_LABEL
from connectors.kubernetes.pods import DEACTIVATED_BY_SHAPER, RESUME_FROM
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


def preempted_to_images_on(kube: Kube, node: str) -> tuple[str, str]:
    """Kueue Job ``pretrain`` runs on ``node`` (by a label of the node's own standing in for
    the restore webhook's hostname selector: the telemetry would read a hostname as a pin)
    and is preempted with a kubelet checkpoint to images there. Its Workload's name and the
    pointer."""
    kube.core.patch_node(node, {"metadata": {"labels": {"shaper-test/pool": "gone"}}})
    queue = gpu_queues(kube, gpus=8)
    job = gpu_job("pretrain", gpus=8, queue=queue)
    job.spec.template.spec.node_selector = {"shaper-test/pool": "gone"}
    kube.batch.create_namespaced_job(kube.namespace, job)
    (pod,) = wait_for("pretrain's pod to run", lambda: running_pods(kube, "pretrain"))
    assert pod.spec.node_name == node
    workload = workload_name(kube, "pretrain")

    def checkpoint(pods: list[PodOnNode]) -> str:
        return ImageRestore(node=pods[0].node, images={"train": "localhost/ckpt:1"}).pointer()

    pointer = actions.preempt_with_checkpoint(
        kube.api, namespace=kube.namespace, workload=workload, checkpoint=checkpoint
    )
    return workload, pointer


def pointer_gone(kube: Kube) -> bool:
    """Whether ``pretrain`` and its Workload's pod sets no longer carry a resume pointer or
    the restore label."""
    found = kube.batch.read_namespaced_job("pretrain", kube.namespace)
    template = found.spec.template.metadata
    workload = kube.workload_of_job("pretrain")
    assert workload is not None
    return (
        RESUME_FROM not in (found.metadata.annotations or {})
        and RESUME_FROM not in (template.annotations or {})
        and RESTORE_LABEL not in (template.labels or {})
        and not any(
            RESUME_FROM in (((ps["template"].get("metadata") or {}).get("annotations")) or {})
            or RESTORE_LABEL in (((ps["template"].get("metadata") or {}).get("labels")) or {})
            for ps in workload["spec"]["podSets"]
        )
    )


def test_a_held_workload_loses_its_pointer_to_images_gone_with_their_node(
    k8s_cluster: K8sCluster, kube: Kube, node_that_goes: str
) -> None:
    """A Kueue Job preempted with a kubelet checkpoint is held (its Workload deactivated) to
    resume from images on the node it ran on, and reported held there. Once that node is
    deleted, the Kueue connector's upkeep takes the pointer and the restore label off its
    pod sets and its Job; the Workload stays held, and the Job is reported held nowhere."""
    workload, pointer = preempted_to_images_on(kube, node_that_goes)
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
        assert pointer_gone(kube), pointer  # the Job's copy and the pod sets' too
        assert kube.batch.read_namespaced_job("pretrain", kube.namespace).spec.suspend
        held = kube.workload_of_job("pretrain")
        assert held is not None and not actions.is_active(held)  # still held
        wait_for("pretrain reported held nowhere", lambda: required() == [])
        assert connector.upkeep() == []


def unschedulable(kube: Kube, job: str) -> bool:
    return any(
        c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
        for pod in kube.pods_of_job(job)
        for c in pod.status.conditions or []
    )


def test_an_admitted_workload_waiting_for_images_gone_with_their_node_is_queued_again(
    k8s_cluster: K8sCluster, kube: Kube, node_that_goes: str
) -> None:
    """A Kueue Job held to resume from checkpoint images is let run (reactivated) after
    their node was deleted: admitted, its quota reserved and its pod sets frozen, its pod
    waits for that node for good. The upkeep lets the Workload go, takes the pointer off and
    queues it again; it is admitted again."""
    workload, _ = preempted_to_images_on(kube, node_that_goes)
    kube.core.delete_node(node_that_goes)
    actions.reactivate(kube.api, namespace=kube.namespace, workload=workload)
    wait_for("pretrain to be admitted again", lambda: admitted(kube, "pretrain"))
    wait_for("pretrain's pod to wait", lambda: unschedulable(kube, "pretrain"))
    config = KubernetesConnectorConfig(
        cluster="kueue-images", kubeconfig=k8s_cluster.kubeconfig, namespaces=[kube.namespace]
    )
    with KueueConnector(config) as connector:
        assert connector.wait_synced(30), [i.error for i in connector.informers.values()]
        lines: list[str] = []

        def queued_again() -> bool:
            lines.extend(connector.upkeep())
            found = kube.workload_of_job("pretrain")
            assert found is not None
            annotations = found["metadata"].get("annotations") or {}
            return (
                actions.is_active(found)
                and LIFTING_PIN not in annotations
                and DEACTIVATED_BY_SHAPER not in annotations
                and pointer_gone(kube)
            )

        wait_for("pretrain to be let go and queued again", queued_again, timeout=120)
        assert any(f"waited for node {node_that_goes}" in line for line in lines), lines
        assert workload_name(kube, "pretrain") == workload  # the same Workload, not a new one
        wait_for("pretrain to be admitted again", lambda: admitted(kube, "pretrain"))
        assert connector.upkeep() == []


@pytest.mark.parametrize("taken_over", [False, True], ids=["left-halfway", "a-hold-took-it-over"])
def test_a_let_go_left_halfway_is_finished_unless_a_step_took_the_workload_over(
    k8s_cluster: K8sCluster, kube: Kube, node_that_goes: str, taken_over: bool
) -> None:
    """The upkeep deactivated a Workload to let it go (marked) and stopped there (the
    connector restarted): the next upkeep finishes, queueing it again without the pointer.
    A plan's hold made meanwhile takes the mark off: the Workload stays held (its pointer
    still comes off, as any held Workload's does)."""
    workload, _ = preempted_to_images_on(kube, node_that_goes)  # held, deactivated
    mark = {"metadata": {"annotations": {LIFTING_PIN: f"images lost with node {node_that_goes}"}}}
    kube.custom.patch_namespaced_custom_object(
        "kueue.x-k8s.io", "v1beta2", kube.namespace, "workloads", workload, mark
    )
    if taken_over:
        actions.deactivate(kube.api, namespace=kube.namespace, workload=workload, step_key="hold")
    kube.core.delete_node(node_that_goes)
    config = KubernetesConnectorConfig(
        cluster="kueue-images", kubeconfig=k8s_cluster.kubeconfig, namespaces=[kube.namespace]
    )
    with KueueConnector(config) as connector:
        assert connector.wait_synced(30), [i.error for i in connector.informers.values()]

        def done() -> bool:
            connector.upkeep()
            return pointer_gone(kube)

        wait_for("the pointer to come off pretrain", done)
        found = kube.workload_of_job("pretrain")
        assert found is not None
        assert LIFTING_PIN not in (found["metadata"].get("annotations") or {})
        assert actions.is_active(found) is not taken_over
        assert connector.upkeep() == []
