"""Checkpoint-aware preemption on Kueue with a REAL node: the preempted Job's new pod is
restored from the kubelet checkpoint of the old one (issue 15, kubernetes-sigs/kueue#477).

The real node of ``test_real_node_restore`` (``scripts/k8s/real-node/real-node.sh``: a
kubelet with containerd 2.3 and CRIU beside the kwok nodes, and Kueue v0.17's manager, all
of ``scripts/k8s-cluster.sh``) runs a busybox counter as a Kueue-admitted Job.
``connectors.kueue.actions.preempt_with_checkpoint`` preempts it; its checkpoint callback
plays the node agent's part (agent/ has no kubelet backend yet): the kubelet's checkpoint
API, then the archive as a checkpoint image imported into the node's containerd
(``real-node.sh checkpoint`` and ``image``), answered as a ``checkpoint-image:`` pointer.
The action writes it and the label ``shaper.io/restore`` on the suspended Job's pod template
and Workload; once reactivated and admitted again, the Job controller creates a pod with the
counter's own image, the webhook (``connectors.kubernetes.restore_webhook``, served here on
127.0.0.1 with a CA of the test's, registered by the deploy component's own
MutatingWebhookConfiguration) swaps in the checkpoint image, and containerd restores the
process: the count goes on from the checkpoint, not from 1.
"""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from connectors.base import ConnectorError
from connectors.kubernetes import actions as kube_actions
from connectors.kubernetes.actions import PodOnNode
from connectors.kubernetes.pods import (
    CHECKPOINTABLE_ANNOTATION,
    QUEUE_LABEL,
    RESUME_FROM,
    RESUME_FROM_ENV,
    RESUME_FROM_FIELD,
)
from connectors.kubernetes.restore_webhook import (
    PATH,
    RESTORE_BY_IMAGE,
    RESTORE_LABEL,
    ImageRestore,
    serve,
)
from connectors.kueue import actions
from tests.connectors.test_restore_webhook import post_review, tls_files
from tests.k8s.conftest import Kube, condition, wait_for
from tests.k8s.test_real_node_restore import (  # noqa: F401 (fixtures)
    BUSYBOX,
    NODE,
    PORT_BASE,
    REPO,
    RealNode,
    _runnable,
    counter_pod,
    real_node,
    state,
)

pytestmark = pytest.mark.slow

WEBHOOK_PORT = PORT_BASE + 92  # the kubelet has +90 and +91
WEBHOOK_CONFIG = (
    REPO / "deploy/kubernetes/components/checkpoint-restore/mutatingwebhookconfiguration.yaml"
)
CHECKPOINT_IMAGE = "localhost/shaper/counter-preempted:test"
NAMESPACE = "default"  # RealNode.counts reads the kubelet's logs of pods in default


@pytest.fixture(scope="module")
def webhook(real_node: RealNode) -> Iterator[bytes]:  # noqa: F811 (the fixture)
    """The restore webhook served on 127.0.0.1 and registered with the node's API server by
    the deploy component's configuration, its Service swapped for that URL; yields the CA."""
    cert, key, ca = tls_files(real_node.directory)
    server = serve("127.0.0.1", WEBHOOK_PORT, certfile=str(cert), keyfile=str(key))
    config = yaml.safe_load(WEBHOOK_CONFIG.read_text())
    for hook in config["webhooks"]:
        hook["clientConfig"] = {
            "url": f"https://127.0.0.1:{WEBHOOK_PORT}{PATH}",
            "caBundle": base64.b64encode(ca).decode(),
        }
    admission = client.AdmissionregistrationV1Api(real_node.core.api_client)
    admission.create_mutating_webhook_configuration(config)
    try:
        yield ca
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def kube(real_node: RealNode) -> Kube:  # noqa: F811 (the fixture)
    """Kueue's queues for the real node: a flavor whose nodes are the real one (Kueue puts
    its label in the admitted pods' nodeSelector), a ClusterQueue, LocalQueue ``real``."""
    kube = Kube(real_node.core.api_client, NAMESPACE)
    kube.create_kueue(
        "resourceflavors",
        {
            "kind": "ResourceFlavor",
            "metadata": {"name": "real-node"},
            "spec": {"nodeLabels": {"shaper.io/real-node": "true"}},
        },
    )
    quota = [{"name": "cpu", "nominalQuota": "1"}, {"name": "memory", "nominalQuota": "1Gi"}]
    kube.create_kueue(
        "clusterqueues",
        {
            "kind": "ClusterQueue",
            "metadata": {"name": "real-node"},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "memory"],
                        "flavors": [{"name": "real-node", "resources": quota}],
                    }
                ],
            },
        },
    )
    kube.create_kueue(
        "localqueues",
        {
            "kind": "LocalQueue",
            "metadata": {"name": "real", "namespace": NAMESPACE},
            "spec": {"clusterQueue": "real-node"},
        },
    )
    wait_for(
        "the LocalQueue active",
        lambda: (
            (c := condition(kube.kueue("localqueues", "real", NAMESPACE), "Active"))
            and c["status"] == "True"
        ),
    )
    return kube


def counter_job(name: str, *, queue: str | None) -> client.V1Job:
    """The counter as a checkpointable Job (one pod, never restarted by the kubelet):
    Kueue's through LocalQueue ``queue`` (whose flavor puts it on the real node), else a
    plain Job with the real node in its nodeSelector."""
    counter = counter_pod(name, BUSYBOX).spec.containers[0]
    counter.resources = client.V1ResourceRequirements(requests={"cpu": "100m", "memory": "32Mi"})
    # The contract of connectors.kubernetes.pods.resume_blocker; a restored process keeps
    # the environment it was checkpointed with.
    field_ref = client.V1ObjectFieldSelector(field_path=RESUME_FROM_FIELD)
    counter.env = [
        client.V1EnvVar(name=RESUME_FROM_ENV, value_from=client.V1EnvVarSource(field_ref=field_ref))
    ]
    return client.V1Job(
        metadata=client.V1ObjectMeta(name=name, labels={QUEUE_LABEL: queue} if queue else None),
        spec=client.V1JobSpec(
            parallelism=1,
            completions=1,
            backoff_limit=0,
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(annotations={CHECKPOINTABLE_ANNOTATION: "true"}),
                spec=client.V1PodSpec(
                    host_network=True,
                    node_selector=None if queue else {"shaper.io/real-node": "true"},
                    termination_grace_period_seconds=2,
                    restart_policy="Never",
                    containers=[counter],
                ),
            ),
        ),
    )


def running_pod(kube: Kube, job: str) -> client.V1Pod | None:
    for pod in kube.pods_of_job(job):
        if pod.metadata.deletion_timestamp is None and pod.status.phase == "Running":
            return pod
    return None


def admitted(kube: Kube, job: str) -> bool:
    workload = kube.workload_of_job(job)
    return bool(workload and (c := condition(workload, "Admitted")) and c["status"] == "True")


def labelled_pod(name: str, annotations: dict[str, str]) -> client.V1Pod:
    """A counter pod as a restored Job's would be, labelled for the webhook."""
    pod = counter_pod(name, BUSYBOX)
    pod.metadata.labels = {RESTORE_LABEL: RESTORE_BY_IMAGE}
    pod.metadata.annotations = annotations
    return pod


@dataclass
class Caught:
    """The node agent's part, played here through the kubelet and containerd: checkpoint
    the pod's counter, import the archive as a checkpoint image, answer its pointer; and
    what the counter had printed just before and just after the checkpoint."""

    node: RealNode
    image: str
    counts: list[int] = field(default_factory=list)

    def checkpoint(self, pods: list[PodOnNode]) -> str:
        (pod,) = pods
        self.counts.append(self.node.counts(pod.pod)[-1])
        archive = self.node.script("checkpoint", pod.namespace, pod.pod, "counter")
        self.counts.append(self.node.counts(pod.pod)[-1])
        self.node.script("image", archive, self.image)
        return self.pointer(pod.node)

    def pointer(self, node: str = NODE) -> str:
        return ImageRestore(node=node, images={"counter": self.image}).pointer()


def started(kube: Kube, node: RealNode, job: str) -> client.V1Pod:
    """The Job's first pod, running on the real node with its own image, at 3 or more."""
    pod = wait_for(
        lambda: f"{job}'s pod running: {[p.status for p in kube.pods_of_job(job)]}",
        lambda: running_pod(kube, job),
    )
    assert pod.spec.node_name == NODE
    # A pod without the label is left alone: the Job's own image.
    assert pod.spec.containers[0].image == BUSYBOX
    assert RESTORE_LABEL not in (pod.metadata.labels or {})
    wait_for(f"{job} at 3", lambda: len(node.counts(pod.metadata.name)) >= 3)
    return pod


def stopped_for_restore(kube: Kube, job: str, pointer: str) -> None:
    """The Job suspended, its old pod gone, its template labelled with the pointer."""
    # the old pod terminates for its grace period
    wait_for(f"{job}'s old pod gone", lambda: not kube.pods_of_job(job))
    found = kube.batch.read_namespaced_job(job, NAMESPACE)
    assert found.spec.suspend is True
    assert found.spec.template.metadata.labels[RESTORE_LABEL] == RESTORE_BY_IMAGE
    assert found.spec.template.metadata.annotations[RESUME_FROM] == pointer


def restored(
    kube: Kube, node: RealNode, job: str, first: client.V1Pod, caught: Caught
) -> client.V1Pod:
    """The Job's new pod: the checkpoint image, on its node, counting on from the
    checkpoint (``since`` a moment before it was let run)."""
    since = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")
    pod = wait_for(
        lambda: (
            f"{job}'s restored pod running: "
            + "; ".join(state(node, p.metadata.name) for p in kube.pods_of_job(job))
        ),
        lambda: running_pod(kube, job),
        timeout=120,
    )
    assert pod.metadata.name != first.metadata.name
    assert pod.spec.node_name == NODE
    assert pod.spec.containers[0].image == caught.image  # the webhook's swap
    assert pod.spec.node_selector["kubernetes.io/hostname"] == NODE
    assert pod.status.container_statuses[0].restart_count == 0
    new = wait_for(
        f"{job}'s restored counter printing",
        lambda: (
            len(node.counts(pod.metadata.name, since)) >= 2
            and node.counts(pod.metadata.name, since)
        ),
    )
    # Progress kept: it counts on from where the checkpoint caught it, not from 1.
    before, after = caught.counts
    assert before < new[0] <= after + 1, (before, after, new)
    # its log: the old pod's up to the checkpoint, then on without a gap
    whole = node.counts(pod.metadata.name)
    assert whole == list(range(1, len(whole) + 1)), whole
    return pod


def test_a_preempted_kueue_job_resumes_its_count_from_the_kubelet_checkpoint(
    real_node: RealNode,  # noqa: F811 (the fixture)
    webhook: bytes,
    kube: Kube,
) -> None:
    node = real_node
    kube.batch.create_namespaced_job(NAMESPACE, counter_job("counter", queue="real"))
    wait_for("the counter admitted by Kueue", lambda: admitted(kube, "counter"))
    first = started(kube, node, "counter")
    workload = str(kube.workload_of_job("counter")["metadata"]["name"])  # type: ignore[index]

    caught = Caught(node, CHECKPOINT_IMAGE)
    pointer = actions.preempt_with_checkpoint(
        kube.api, namespace=NAMESPACE, workload=workload, checkpoint=caught.checkpoint
    )
    assert pointer == caught.pointer()
    stopped_for_restore(kube, "counter", pointer)

    actions.reactivate(kube.api, namespace=NAMESPACE, workload=workload)
    wait_for("the counter admitted again", lambda: admitted(kube, "counter"))
    again = restored(kube, node, "counter", first, caught)

    # A malformed checkpoint-image pointer is refused before anything stops.
    with pytest.raises(ConnectorError) as refused:
        actions.preempt_with_checkpoint(
            kube.api,
            namespace=NAMESPACE,
            workload=workload,
            checkpoint=lambda pods: "checkpoint-image:{not json",
        )
    assert not refused.value.retryable and "not JSON" in str(refused.value)
    assert running_pod(kube, "counter").metadata.uid == again.metadata.uid  # type: ignore[union-attr]
    kube.batch.delete_namespaced_job("counter", NAMESPACE, propagation_policy="Background")


def test_a_plain_job_suspended_to_resume_restores_from_the_kubelet_checkpoint(
    real_node: RealNode,  # noqa: F811 (the fixture)
    webhook: bytes,
) -> None:
    """The same without Kueue: connectors.kubernetes.actions suspends the Job with the
    pointer the saga's checkpoint step gave (here taken just before) and resumes it."""
    node = real_node
    kube = Kube(node.core.api_client, NAMESPACE)
    kube.batch.create_namespaced_job(NAMESPACE, counter_job("plain", queue=None))
    first = started(kube, node, "plain")
    caught = Caught(node, "localhost/shaper/plain-suspended:test")
    pointer = caught.checkpoint(
        [PodOnNode(NAMESPACE, first.metadata.name, first.spec.node_name, first.metadata.uid)]
    )
    kube_actions.suspend_job_to_resume(
        kube.api, namespace=NAMESPACE, job="plain", resume_from=pointer
    )
    stopped_for_restore(kube, "plain", pointer)
    kube_actions.resume_job(kube.api, namespace=NAMESPACE, job="plain")
    restored(kube, node, "plain", first, caught)

    # Refused before the Job stops: a malformed pointer, or nodes the images are not on.
    for resume_from, nodes, says in (
        ("checkpoint-image:{", None, "not JSON"),
        (pointer, ["kwok-gpu-1"], f"on node {NODE} only"),
    ):
        with pytest.raises(ConnectorError, match=says):
            kube_actions.suspend_job_to_resume(
                kube.api, namespace=NAMESPACE, job="plain", resume_from=resume_from, nodes=nodes
            )
    assert not kube.batch.read_namespaced_job("plain", NAMESPACE).spec.suspend
    kube.batch.delete_namespaced_job("plain", NAMESPACE, propagation_policy="Background")


def test_the_webhook_leaves_other_pods_alone_and_refuses_a_restore_it_cannot_do(
    real_node: RealNode,  # noqa: F811 (the fixture)
    webhook: bytes,
) -> None:
    node = real_node
    plain = node.core.api_client.sanitize_for_serialization(
        labelled_pod("plain", {RESUME_FROM: "s3://ckpt/step-9"})
    )
    plain["metadata"]["labels"] = {"app": "plain"}
    # Unlabelled (the API server would not even send it): allowed, no patch.
    assert post_review(webhook, WEBHOOK_PORT, plain) == {"uid": "u-1", "allowed": True}
    # Labelled but with a pointer that is no checkpoint image's: refused.
    plain["metadata"]["labels"] = {RESTORE_LABEL: RESTORE_BY_IMAGE}
    answer = post_review(webhook, WEBHOOK_PORT, plain)
    assert answer["allowed"] is False and "not a checkpoint image" in answer["status"]["message"]

    # Through the API server: a pod the webhook cannot restore is not created at all,
    # rather than started from its own image (which would count from 1).
    for pointer_annotations, says in (
        ({}, "is missing"),
        ({RESUME_FROM: "checkpoint-image:{not json"}, "not JSON"),
        (
            {RESUME_FROM: ImageRestore(node=NODE, images={"trainer": "x"}).pointer()},
            "container(s) trainer that the pod does not have",
        ),
    ):
        with pytest.raises(ApiException) as denied:
            node.core.create_namespaced_pod(NAMESPACE, labelled_pod("bad", pointer_annotations))
        assert denied.value.status == 422 and says in str(denied.value.body), denied.value.body

    # A checkpoint image that is not on the node: the pod is created, pinned there, and
    # waits with the kubelet's ErrImageNeverPull naming the image; nothing runs.
    missing = ImageRestore(node=NODE, images={"counter": "localhost/shaper/no-such:ckpt"})
    node.core.create_namespaced_pod(
        NAMESPACE, labelled_pod("lost", {RESUME_FROM: missing.pointer()})
    )

    def never_pulled() -> bool:
        pod = node.core.read_namespaced_pod("lost", NAMESPACE)
        statuses = pod.status.container_statuses or []
        waiting = statuses[0].state.waiting if statuses else None
        return bool(waiting and waiting.reason == "ErrImageNeverPull")

    wait_for(lambda: "ErrImageNeverPull; " + state(node, "lost"), never_pulled)
    pod = node.core.read_namespaced_pod("lost", NAMESPACE)
    assert pod.spec.node_name == NODE and pod.status.phase == "Pending"
    assert "localhost/shaper/no-such:ckpt" in pod.status.container_statuses[0].state.waiting.message
    assert node.counts("lost") == []
    node.core.delete_namespaced_pod("lost", NAMESPACE, grace_period_seconds=0)
