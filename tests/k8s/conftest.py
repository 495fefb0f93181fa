"""A real Kubernetes control plane with Kueue and kwok GPU nodes, for the Kubernetes tests.

Started once per session with ``scripts/k8s-cluster.sh start --dir <tmp>`` (etcd,
kube-apiserver, kube-controller-manager, kube-scheduler, Kueue's manager and kwok as local
processes on 127.0.0.1, from the binaries ``scripts/k8s-build.sh`` builds and caches) and
stopped at the end. If it cannot start, every test that needs it fails with the script's
own reason; it is never skipped.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from kubernetes import client
from kubernetes import config as kube_config
from kubernetes.client.exceptions import ApiException

if TYPE_CHECKING:
    from tests.k8s.real_node import RealNode

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "k8s-cluster.sh"
BUILD_SCRIPT = REPO / "scripts" / "k8s-build.sh"
NODES = 3
GPUS_PER_NODE = 8
GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"
# Generous ceiling for what the control plane does in a second or two.
WAIT_S = 60.0
KUEUE_GROUP, KUEUE_VERSION = "kueue.x-k8s.io", "v1beta2"


@dataclass
class K8sCluster:
    directory: Path
    api_clients: list[client.ApiClient] = field(default_factory=list)

    @property
    def kubeconfig(self) -> Path:
        return self.directory / "kubeconfig"

    def script(self, command: str, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(SCRIPT), command, "--dir", str(self.directory), *args],
            capture_output=True,
            text=True,
            timeout=480,
            check=False,
        )

    def api_client(self) -> client.ApiClient:
        """A client of the admin kubeconfig (system:masters), closed at the session's end."""
        api = kube_config.new_client_from_config(config_file=str(self.kubeconfig))
        self.api_clients.append(api)
        return api

    def close(self) -> None:
        while self.api_clients:
            self.api_clients.pop().close()


@dataclass
class Kube:
    """Typed APIs on one admin client, and a namespace of the test's own."""

    api: client.ApiClient
    namespace: str
    cluster_objects: list[tuple[str, str]] = field(default_factory=list)

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    @property
    def apps(self) -> client.AppsV1Api:
        return client.AppsV1Api(self.api)

    @property
    def batch(self) -> client.BatchV1Api:
        return client.BatchV1Api(self.api)

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    def create_kueue(self, plural: str, body: dict[str, Any]) -> dict[str, Any]:
        """Create a Kueue object; cluster-scoped ones are deleted when the test ends."""
        body = {"apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}", **body}
        namespace = body["metadata"].get("namespace")
        if namespace:
            return self.custom.create_namespaced_custom_object(
                KUEUE_GROUP, KUEUE_VERSION, namespace, plural, body
            )
        created = self.custom.create_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, plural, body)
        self.cluster_objects.append((plural, body["metadata"]["name"]))
        return created

    def kueue(self, plural: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        if namespace:
            return self.custom.get_namespaced_custom_object(
                KUEUE_GROUP, KUEUE_VERSION, namespace, plural, name
            )
        return self.custom.get_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, plural, name)

    def workloads(self) -> list[dict[str, Any]]:
        listed = self.custom.list_namespaced_custom_object(
            KUEUE_GROUP, KUEUE_VERSION, self.namespace, "workloads"
        )
        return list(listed["items"])

    def workload_of_job(self, job_name: str) -> dict[str, Any] | None:
        for workload in self.workloads():
            owners = workload["metadata"].get("ownerReferences", [])
            if any(o["kind"] == "Job" and o["name"] == job_name for o in owners):
                return workload
        return None

    def pods_of_job(self, job_name: str) -> list[client.V1Pod]:
        return list(
            self.core.list_namespaced_pod(
                self.namespace, label_selector=f"batch.kubernetes.io/job-name={job_name}"
            ).items
        )

    def cleanup(self) -> None:
        # Background deletion: the namespace controller and Kueue finish it while the next
        # test runs; the whole cluster goes at the end of the session.
        try:
            self.core.delete_namespace(self.namespace, propagation_policy="Background")
        except ApiException as exc:
            if exc.status != 404:
                raise
        for plural, name in reversed(self.cluster_objects):
            try:
                self.custom.delete_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, plural, name)
            except ApiException as exc:
                if exc.status != 404:
                    raise


def wait_for(
    what: str | Callable[[], str], condition: Callable[[], Any], timeout: float = WAIT_S
) -> Any:
    """Poll ``condition`` until it returns something true; fail saying ``what`` otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            description = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout} s waiting for {description}")
        time.sleep(0.2)


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for cond in obj.get("status", {}).get("conditions", []) or []:
        if cond["type"] == kind:
            return dict(cond)
    return None


@pytest.fixture(scope="session")
def k8s_cluster() -> Iterator[K8sCluster]:
    directory = Path(tempfile.mkdtemp(prefix="shaper-k8s-test-", dir="/tmp"))
    cluster = K8sCluster(directory)
    started = cluster.script("start", "--nodes", str(NODES), "--gpus-per-node", str(GPUS_PER_NODE))
    if started.returncode != 0:
        cluster.script("stop")
        shutil.rmtree(directory, ignore_errors=True)
        pytest.fail(
            "the Kubernetes test cluster did not start (scripts/k8s-cluster.sh start; the "
            f"binaries come from {BUILD_SCRIPT.relative_to(REPO)}, which make test runs):\n"
            f"{started.stderr}{started.stdout}",
            pytrace=False,
        )
    try:
        yield cluster
    finally:
        cluster.close()
        stopped = cluster.script("stop")
        shutil.rmtree(directory, ignore_errors=True)
        if stopped.returncode != 0:
            raise RuntimeError(f"stopping the Kubernetes test cluster failed:\n{stopped.stderr}")


@pytest.fixture
def kube(k8s_cluster: K8sCluster) -> Iterator[Kube]:
    """Admin APIs and a fresh namespace, deleted with the test's cluster-scoped objects."""
    api = k8s_cluster.api_client()
    namespace = f"t-{uuid.uuid4().hex[:8]}"
    kube = Kube(api, namespace)
    kube.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    try:
        yield kube
    finally:
        kube.cleanup()


# --- the real node of the test_real_node_* modules (tests/k8s/real_node.py) ------------------


GONE = "pins-gone-1"


@pytest.fixture
def node_that_goes(kube: Kube) -> Iterator[str]:
    """A kwok GPU node of this test's own (``GONE``, 8 GPUs), Ready: one a test may delete (the
    checkpoint images on it go with it); deleted after the test if it is still there."""
    resources = {"cpu": "32", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "8"}
    node = client.V1Node(
        metadata=client.V1ObjectMeta(
            name=GONE,
            annotations={"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            labels={
                "kubernetes.io/hostname": GONE,
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": GPU_PRODUCT,
            },
        ),
        status=client.V1NodeStatus(allocatable=resources, capacity=resources),
    )
    kube.core.create_node(node)
    try:
        wait_for(
            f"{GONE} to be Ready",
            lambda: any(
                c.type == "Ready" and c.status == "True"
                for c in kube.core.read_node(GONE).status.conditions or []
            ),
        )
        yield GONE
    finally:
        try:
            kube.core.delete_node(GONE)
        except ApiException as error:
            if error.status != 404:
                raise


@pytest.fixture(scope="package")
def real_node_started() -> Iterator[RealNode]:
    """One real node for every module here that uses it (starting one takes 20-25 s),
    stopped after the last of them (they are the package's last modules)."""
    from tests.k8s import real_node

    try:
        with real_node.started() as node:
            yield node
    except real_node.RealNodeUnavailable as unavailable:
        pytest.fail(str(unavailable), pytrace=False)


@pytest.fixture(scope="module")
def real_node(real_node_started: RealNode) -> Iterator[RealNode]:
    """The real node, left by the module as it found it: whatever the module added to it
    (webhook configurations, RBAC, namespaces, Kueue objects, Jobs and pods, checkpoint
    images and archives) is removed when it ends, after its own fixtures' teardown (its
    agents and webhook server stopped)."""
    from tests.k8s.real_node import inventory, remove_added

    before = inventory(real_node_started)
    yield real_node_started
    remove_added(real_node_started, before)
