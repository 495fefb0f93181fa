"""Checkpoint-aware preemption on Kueue with a REAL node: the preempted Job's new pod is
restored from the kubelet checkpoint of the old one (issue 15, kubernetes-sigs/kueue#477).

The real node of ``tests/k8s/real_node.py`` (``scripts/k8s/real-node/real-node.sh``: a
kubelet with containerd 2.3 and CRIU beside the kwok nodes, and Kueue v0.17's manager, all
of ``scripts/k8s-cluster.sh``) runs a busybox counter as a Kueue-admitted Job.
``connectors.kueue.actions.preempt_with_checkpoint`` preempts it; its checkpoint callback
(connectors.kubernetes.node_agent.agent_checkpoint) calls the node agent — a real
``python -m agent api`` process for the real node, with the kubelet's serving CA, a client
certificate allowed to checkpoint, and the node's ``ctr`` and containerd socket — which
checkpoints the pod through the kubelet's API, imports the archive into the node's
containerd as a checkpoint image (agent.kubelet) and answers a ``checkpoint-image:``
pointer.
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
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from connectors.base import ConnectorError
from connectors.kubernetes import actions as kube_actions
from connectors.kubernetes.actions import PodOnNode
from connectors.kubernetes.config import KubernetesConnectorConfig
from connectors.kubernetes.node_agent import agent_checkpoint
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
    image_restore,
    serve,
)
from connectors.kueue import actions
from connectors.kueue.connector import KueueConnector
from tests.connectors.test_restore_webhook import post_review, tls_files
from tests.k8s.conftest import Kube, condition, wait_for
from tests.k8s.real_node import NODE, PORT_BASE, REPO, RealNode
from tests.k8s.test_real_node_restore import BUSYBOX, counter_pod, gone, running, state

pytestmark = pytest.mark.slow

WEBHOOK_PORT = PORT_BASE + 92  # the kubelet has +90 and +91
AGENT_PORT = PORT_BASE + 93  # the node agent's API; +94, +95 for agents set up wrong
AGENT_TOKEN = "real-node-agent-token"
WEBHOOK_CONFIG = (
    REPO / "deploy/kubernetes/components/checkpoint-restore/mutatingwebhookconfiguration.yaml"
)
NAMESPACE = "default"  # RealNode.counts reads the kubelet's logs of pods in default


@pytest.fixture(scope="module")
def webhook(real_node: RealNode) -> Iterator[bytes]:
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
def kube(real_node: RealNode) -> Kube:
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


@dataclass(frozen=True)
class NodeAgent:
    """A node agent's API process for the real node, and what it checkpoints with."""

    url: str
    env: dict[str, str]
    ctr: Path
    containerd: Path
    checkpoints: Path  # where the kubelet writes its archives

    def checkpoint(self) -> Callable[[list[PodOnNode]], str]:
        return agent_checkpoint(agent_url=lambda node: self.url, token=AGENT_TOKEN)

    def images(self) -> set[str]:
        listed = subprocess.run(
            [str(self.ctr), "--address", str(self.containerd), "-n", "k8s.io"]
            + ["images", "ls", "-q"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        # by name; the CRI also lists each image by its id (sha256:…)
        return {name for name in listed.stdout.split() if not name.startswith("sha256:")}

    def archives(self) -> list[Path]:
        return sorted(self.checkpoints.glob("*.tar"))


def agent_env(node: RealNode, state: Path) -> dict[str, str]:
    """The agent's settings (agent.settings) for the real node: its kubelet, verified
    against the kubelet's self-signed serving certificate under the node's name, the
    cluster admin's client certificate (allowed nodes/checkpoint and nodes/proxy), and
    its containerd."""
    binaries = Path(node.script("built"))
    (containerd,) = node.directory.glob("containerd-*/containerd.sock")
    pki = node.directory / "cluster" / "pki"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHAPER_")}
    return {
        **env,
        "SHAPER_AGENT_API_TOKEN": AGENT_TOKEN,
        "SHAPER_AGENT_STATE_DIR": str(state),
        "SHAPER_KUBELET_URL": f"https://127.0.0.1:{PORT_BASE + 90}",
        "SHAPER_KUBELET_CA": str(node.directory / "kubelet" / "pki-serving" / "kubelet.crt"),
        "SHAPER_KUBELET_CLIENT_CERT": str(pki / "admin.crt"),
        "SHAPER_KUBELET_CLIENT_KEY": str(pki / "admin.key"),
        "SHAPER_CTR": str(binaries / "ctr"),
        "SHAPER_CONTAINERD_ADDRESS": str(containerd),
        "PYTHONPATH": str(REPO),
    }


def start_agent(env: dict[str, str], port: int, log: Path) -> subprocess.Popen[bytes]:
    """``python -m agent api`` for the real node, once its /healthz answers."""
    with log.open("ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "agent", "api", "--node", NODE, "--port", str(port)],
            env=env,
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )

    def healthy() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"the agent exited {process.returncode}: {log.read_text()}")
        try:
            return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(f"the agent's API on port {port}", healthy)
    return process


def stop_agent(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.kill(process.pid, signal.SIGTERM)
        process.wait(timeout=30)


@pytest.fixture(scope="module")
def node_agent(real_node: RealNode) -> Iterator[NodeAgent]:
    state = real_node.directory / "agent"
    env = agent_env(real_node, state)
    process = start_agent(env, AGENT_PORT, real_node.directory / "logs" / "agent.log")
    try:
        yield NodeAgent(
            url=f"http://127.0.0.1:{AGENT_PORT}",
            env=env,
            ctr=Path(env["SHAPER_CTR"]),
            containerd=Path(env["SHAPER_CONTAINERD_ADDRESS"]),
            checkpoints=real_node.directory / "kubelet" / "root" / "checkpoints",
        )
    finally:
        stop_agent(process)


@dataclass
class Caught:
    """The checkpoint callback through the node agent, and what the counter had printed
    just before and just after the checkpoint."""

    node: RealNode
    agent: NodeAgent
    counts: list[int] = field(default_factory=list)
    pointer: str | None = None

    def checkpoint(self, pods: list[PodOnNode]) -> str:
        (pod,) = pods
        self.counts.append(self.node.counts(pod.pod)[-1])
        self.pointer = self.agent.checkpoint()(pods)
        self.counts.append(self.node.counts(pod.pod)[-1])
        return self.pointer

    @property
    def image(self) -> str:
        restore = image_restore(self.pointer)
        assert restore is not None and restore.node == NODE, self.pointer
        return restore.images["counter"]

    def imported(self) -> None:
        """The agent's checkpoint image is in the node's containerd, and the kubelet's
        archive is gone (the image carries it)."""
        assert self.image in self.agent.images()
        assert self.agent.archives() == []


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


def test_a_preempted_kueue_job_resumes_its_count_from_the_node_agents_checkpoint(
    real_node: RealNode,
    webhook: bytes,
    kube: Kube,
    node_agent: NodeAgent,
) -> None:
    node = real_node
    kube.batch.create_namespaced_job(NAMESPACE, counter_job("counter", queue="real"))
    wait_for("the counter admitted by Kueue", lambda: admitted(kube, "counter"))
    first = started(kube, node, "counter")
    workload = str(kube.workload_of_job("counter")["metadata"]["name"])  # type: ignore[index]

    caught = Caught(node, node_agent)
    pointer = actions.preempt_with_checkpoint(
        kube.api, namespace=NAMESPACE, workload=workload, checkpoint=caught.checkpoint
    )
    assert pointer is not None and pointer == caught.pointer
    caught.imported()
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


def test_the_kueue_connector_suspends_through_the_node_agent_when_given_its_url(
    real_node: RealNode,
    webhook: bytes,
    kube: Kube,
    node_agent: NodeAgent,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Production's path: the Kueue connector's ``suspend`` step with no pointer handed
    over, given the agents' URL (``node_agent_url``) and token, asks the pod's agent for
    the checkpoint; ``resume`` lets Kueue admit it again, and it counts on."""
    node = real_node
    monkeypatch.setenv("SHAPER_NODE_AGENT_TOKEN", AGENT_TOKEN)
    config = KubernetesConnectorConfig(
        cluster="real-node",
        kubeconfig=node.directory / "cluster" / "kubeconfig",
        namespaces=[NAMESPACE],
        include_cpu_only=True,
        node_agent_url=node_agent.url,
    )
    kube.batch.create_namespaced_job(NAMESPACE, counter_job("by-connector", queue="real"))
    wait_for("by-connector admitted by Kueue", lambda: admitted(kube, "by-connector"))
    first = started(kube, node, "by-connector")
    external_id = f"{NAMESPACE}/job/by-connector"
    images = node_agent.images()
    with KueueConnector(config) as connector:
        assert connector.wait_synced(30), [i.error for i in connector.informers.values()]
        wait_for("its Workload seen", lambda: connector.workload_of(external_id))
        before = node.counts(first.metadata.name)[-1]
        suspending = time.monotonic()
        connector.suspend(external_id)
        # The checkpoint was taken during the step; the counter prints once a second.
        bound = before + int(time.monotonic() - suspending) + 1
        pointer = kube.batch.read_namespaced_job("by-connector", NAMESPACE).metadata.annotations[
            RESUME_FROM
        ]
        caught = Caught(node, node_agent, counts=[before, bound], pointer=pointer)
        assert node_agent.images() - images == {caught.image}
        caught.imported()
        stopped_for_restore(kube, "by-connector", pointer)
        connector.resume(external_id)
    wait_for("by-connector admitted again", lambda: admitted(kube, "by-connector"))
    restored(kube, node, "by-connector", first, caught)
    kube.batch.delete_namespaced_job("by-connector", NAMESPACE, propagation_policy="Background")


def test_a_plain_job_suspended_to_resume_restores_from_the_node_agents_checkpoint(
    real_node: RealNode,
    webhook: bytes,
    node_agent: NodeAgent,
) -> None:
    """The same without Kueue: connectors.kubernetes.actions suspends the Job with the
    pointer the node agent's checkpoint gave (here taken just before) and resumes it."""
    node = real_node
    kube = Kube(node.core.api_client, NAMESPACE)
    kube.batch.create_namespaced_job(NAMESPACE, counter_job("plain", queue=None))
    first = started(kube, node, "plain")
    caught = Caught(node, node_agent)
    pointer = caught.checkpoint(
        [PodOnNode(NAMESPACE, first.metadata.name, first.spec.node_name, first.metadata.uid)]
    )
    caught.imported()
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
    real_node: RealNode,
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


def test_the_node_agent_refuses_what_it_cannot_checkpoint_and_leaves_nothing_behind(
    real_node: RealNode,
    node_agent: NodeAgent,
) -> None:
    """Each refusal names its cause, as the connector's callback reports it: a pod not on
    the node, a pod that is not the one meant, containerd's client missing, the kubelet
    refusing an agent without credentials. None takes a checkpoint or leaves an image."""
    node = real_node
    node.core.create_namespaced_pod(NAMESPACE, counter_pod("agent-refusals", BUSYBOX))
    pod = wait_for(
        lambda: "agent-refusals running: " + state(node, "agent-refusals"),
        lambda: running(node, "agent-refusals"),
    )
    on_node = PodOnNode(NAMESPACE, "agent-refusals", NODE, pod.metadata.uid)
    images = node_agent.images()
    checkpoint = node_agent.checkpoint()
    for asked, status, says in (
        (PodOnNode(NAMESPACE, "no-such-pod", NODE, "u-1"), 404, f"is not on node {NODE}"),
        (PodOnNode(NAMESPACE, "agent-refusals", NODE, "not-its-uid"), 409, "uid: pod"),
    ):
        with pytest.raises(ConnectorError) as refused:
            checkpoint([asked])
        assert f"HTTP {status}: " in str(refused.value) and says in str(refused.value)
        assert not refused.value.retryable

    # Agents set up wrong (an empty variable is an unset one).
    log = node.directory / "logs" / "agent-wrong.log"
    for port, change, status, says in (
        (AGENT_PORT + 1, {"SHAPER_CTR": str(node.directory / "no-ctr")}, 503, "not installed"),
        (
            AGENT_PORT + 2,
            {"SHAPER_KUBELET_CLIENT_CERT": "", "SHAPER_KUBELET_CLIENT_KEY": ""},
            502,
            "refused: HTTP 401",
        ),
    ):
        process = start_agent({**node_agent.env, **change}, port, log)
        try:
            url = f"http://127.0.0.1:{port}"
            wrong = agent_checkpoint(agent_url=lambda _node, url=url: url, token=AGENT_TOKEN)
            with pytest.raises(ConnectorError) as failed:
                wrong([on_node])
            assert f"HTTP {status}: " in str(failed.value) and says in str(failed.value)
            assert failed.value.retryable
        finally:
            stop_agent(process)

    # Nothing left behind; the counter was never frozen and counts on.
    assert node_agent.images() == images
    assert node_agent.archives() == []
    counted = len(node.counts("agent-refusals"))
    wait_for("the counter on", lambda: len(node.counts("agent-refusals")) > counted)
    assert node.counts("agent-refusals") == list(range(1, len(node.counts("agent-refusals")) + 1))
    node.core.delete_namespaced_pod("agent-refusals", NAMESPACE, grace_period_seconds=2)
    wait_for("agent-refusals deleted", lambda: gone(node, "agent-refusals"))


def client_certificate(node: RealNode, user: str) -> tuple[Path, Path]:
    """A client certificate for ``user``, signed by the cluster's CA (which the kubelet
    trusts for clients)."""
    pki = node.directory / "cluster" / "pki"
    ca = x509.load_pem_x509_certificate((pki / "ca.crt").read_bytes())
    ca_key = serialization.load_pem_private_key((pki / "ca.key").read_bytes(), None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, user)]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(hours=2))
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    cert, key_file = node.directory / f"{user}.crt", node.directory / f"{user}.key"
    cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    key_file.chmod(0o600)
    return cert, key_file


def test_the_node_agent_needs_only_nodes_checkpoint_and_nodes_pods(
    real_node: RealNode,
    node_agent: NodeAgent,
) -> None:
    """The kubelet client the agent needs: ``create nodes/checkpoint`` and ``get
    nodes/pods`` (the kubelet's fine-grained authorization of ``GET /pods``; no
    ``nodes/proxy``, which would allow exec). A user without them is refused by the
    kubelet (403, through the agent a retryable 502 naming it)."""
    node = real_node
    rbac = client.RbacAuthorizationV1Api(node.core.api_client)
    rbac.create_cluster_role(
        client.V1ClusterRole(
            metadata=client.V1ObjectMeta(name="shaper-node-agent"),
            rules=[
                client.V1PolicyRule(
                    api_groups=[""], resources=["nodes/checkpoint"], verbs=["create"]
                ),
                client.V1PolicyRule(api_groups=[""], resources=["nodes/pods"], verbs=["get"]),
            ],
        )
    )
    rbac.create_cluster_role_binding(
        client.V1ClusterRoleBinding(
            metadata=client.V1ObjectMeta(name="shaper-node-agent"),
            role_ref=client.V1RoleRef(
                api_group="rbac.authorization.k8s.io", kind="ClusterRole", name="shaper-node-agent"
            ),
            subjects=[
                client.RbacV1Subject(
                    api_group="rbac.authorization.k8s.io", kind="User", name="shaper-node-agent"
                )
            ],
        )
    )
    node.core.create_namespaced_pod(NAMESPACE, counter_pod("least", BUSYBOX))
    pod = wait_for(lambda: "least running: " + state(node, "least"), lambda: running(node, "least"))
    wait_for("least at 3", lambda: len(node.counts("least")) >= 3)
    on_node = [PodOnNode(NAMESPACE, "least", NODE, pod.metadata.uid)]
    log = node.directory / "logs" / "agent-least.log"
    for port, user, allowed in (
        (AGENT_PORT + 3, "shaper-agent-unbound", False),
        (AGENT_PORT + 4, "shaper-node-agent", True),
    ):
        cert, key = client_certificate(node, user)
        env = {
            **node_agent.env,
            "SHAPER_KUBELET_CLIENT_CERT": str(cert),
            "SHAPER_KUBELET_CLIENT_KEY": str(key),
        }
        process = start_agent(env, port, log)
        try:
            url = f"http://127.0.0.1:{port}"
            checkpoint = agent_checkpoint(agent_url=lambda _node, url=url: url, token=AGENT_TOKEN)
            if allowed:
                restore = image_restore(checkpoint(on_node))
                assert restore is not None and restore.images["counter"] in node_agent.images()
            else:
                with pytest.raises(ConnectorError, match="refused: HTTP 403") as refused:
                    checkpoint(on_node)
                assert refused.value.retryable
        finally:
            stop_agent(process)
    # The agents' logs name what they did, never a secret: the token, a client key.
    logged = log.read_text()
    assert "checkpointed pod default/least" in logged
    assert AGENT_TOKEN not in logged and key.read_text().splitlines()[1] not in logged
    node.core.delete_namespaced_pod("least", NAMESPACE, grace_period_seconds=2)
    wait_for("least deleted", lambda: gone(node, "least"))
