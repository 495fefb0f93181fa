"""Each pod of an elastic Indexed Job on the node the plan gives its index
(connectors.kubernetes.pod_placement, pod_gates), on the tests' real control plane: the
Job's pods are created behind a scheduling gate, and the connector names each pod's node
as it lifts the gate — in the step, and in its upkeep for a pod created later. And
deploy/kubernetes/components/pod-placement: the connector's ServiceAccount may take its
gate off a pod and name the pod's node in the same patch, and change nothing else of any
pod — the admission policy that holds the component's ``patch pods`` to that; and the
connector's own checks before it gates (may it patch pods?) and lifts (does the policy
hold it?).

The connector's ServiceAccount is impersonated by the admin: RBAC and admission see that
ServiceAccount. The base role (deploy/kubernetes/base) is applied beside the component,
as a site's overlay does, and everything is deleted after each test (test_deploy checks
that the base role alone may not patch pods)."""

from __future__ import annotations

import itertools
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes import config as kube_config
from kubernetes.client.exceptions import ApiException

from connectors.actions import ConnectorStepExecutor
from connectors.kubernetes import pod_gates
from connectors.kubernetes.config import KubernetesConnectorConfig
from connectors.kubernetes.connector import KubernetesConnector
from connectors.kubernetes.pod_placement import (
    PLACEMENT_GATE,
    POD_NODES_ANNOTATION,
    encode,
    ungate_patch,
)
from tests.k8s.conftest import REPO, K8sCluster, Kube, wait_for
from tests.k8s.objects import bare_pod, elastic_training_job, gpu_pods_anywhere
from tests.k8s.test_deploy import SERVICE_ACCOUNT, kubectl_path
from tests.k8s.test_kubernetes_steps import IMAGE_DIR, Steps, kwok_nodes, pods_by_index

pytestmark = pytest.mark.slow

DEPLOY = REPO / "deploy" / "kubernetes"
BASE = [DEPLOY / "base" / name for name in ("clusterrole.yaml", "clusterrolebinding.yaml")]
COMPONENT = DEPLOY / "components" / "pod-placement"
RIGHTS = [COMPONENT / name for name in ("clusterrole.yaml", "clusterrolebinding.yaml")]
POLICY = [COMPONENT / "pod-placement-policy.yaml"]
SITE_GATE = "site.example/quota"
JSON_PATCH = "application/json-patch+json"
OWN_GATE_ONLY = "may only take its own scheduling gate"
CLUSTER = "k8s-placement"
HOST = "kubernetes.io/hostname"


def _kubectl(cluster: K8sCluster, verb: str, files: list[Path], *options: str) -> None:
    arguments = [arg for path in files for arg in ("-f", str(path))]
    subprocess.run(
        [str(kubectl_path()), "--kubeconfig", str(cluster.kubeconfig), verb, *options, *arguments],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )


@pytest.fixture
def apply(k8s_cluster: K8sCluster) -> Iterator[Callable[[list[Path]], None]]:
    """``apply(files)``; whatever was applied is deleted when the test ends."""
    applied: list[Path] = []

    def put(files: list[Path]) -> None:
        _kubectl(k8s_cluster, "apply", files)
        applied.extend(files)

    yield put
    if applied:
        _kubectl(k8s_cluster, "delete", applied, "--ignore-not-found")
    if any(path in RIGHTS for path in applied):
        # The next module may check that the connector cannot patch pods (test_deploy):
        # wait until the authorizer's cache has let the right go.
        wait_for("patch pods to be taken back", lambda: not _can_patch_pods(k8s_cluster))


def _can_patch_pods(cluster: K8sCluster) -> bool:
    done = subprocess.run(
        [
            str(kubectl_path()),
            "--kubeconfig",
            str(cluster.kubeconfig),
            "auth",
            "can-i",
            "patch",
            "pods",
            f"--as={SERVICE_ACCOUNT}",
            "-n",
            "default",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done.stdout.strip().endswith("yes")


@pytest.fixture
def as_connector(k8s_cluster: K8sCluster) -> Iterator[client.ApiClient]:
    configuration = client.Configuration()
    kube_config.load_kube_config(
        config_file=str(k8s_cluster.kubeconfig), client_configuration=configuration
    )
    api = client.ApiClient(configuration)
    api.set_default_header("Impersonate-User", SERVICE_ACCOUNT)
    api.set_default_header("Impersonate-Group", "system:serviceaccounts")
    try:
        yield api
    finally:
        api.close()


names = itertools.count(1)


def _gated(kube: Kube, *gates: str) -> client.V1Pod:
    pod = bare_pod(f"gated-{next(names)}", gpus=1)
    pod.spec.scheduling_gates = [client.V1PodSchedulingGate(name=g) for g in gates]
    return kube.core.create_namespaced_pod(kube.namespace, pod)


def _patch(api: client.ApiClient, kube: Kube, pod: client.V1Pod, patch: list[Any]) -> None:
    client.CoreV1Api(api).patch_namespaced_pod(
        pod.metadata.name, kube.namespace, patch, _content_type=JSON_PATCH
    )


def _refused(api: client.ApiClient, kube: Kube, pod: client.V1Pod, patch: list[Any]) -> str:
    """The policy's message for a patch it refuses."""
    with pytest.raises(ApiException) as refused:
        _patch(api, kube, pod, patch)
    assert refused.value.status == 403, refused.value.body
    body = str(refused.value.body)
    assert "ValidatingAdmissionPolicy 'shaper-pod-placement'" in body, body
    return body


def _lift(kube: Kube, pod: client.V1Pod, node: str | None) -> list[dict[str, Any]]:
    patch = ungate_patch(kube.api.sanitize_for_serialization(pod), node)
    assert patch is not None
    return patch


def _policy_in_force(api: client.ApiClient, kube: Kube) -> None:
    """Admission reads policies from an informer: moments after the apply. Then its
    status says every expression type-checked against the Pod schema (one that did not
    would deny every request)."""
    canary = _gated(kube, PLACEMENT_GATE)
    values = itertools.count()

    def refused() -> bool:
        label = [{"op": "add", "path": "/metadata/labels/try", "value": str(next(values))}]
        try:
            _patch(api, kube, canary, label)
        except ApiException as error:
            return error.status == 403 and "shaper-pod-placement" in str(error.body)
        return False

    wait_for("the policy to be in force", refused)
    admission = client.AdmissionregistrationV1Api(kube.api)
    checked = wait_for(
        "the policy's type checking",
        lambda: getattr(
            admission.read_validating_admission_policy("shaper-pod-placement").status,
            "type_checking",
            None,
        ),
    )
    assert not (checked.expression_warnings or [])


def test_the_connector_may_lift_its_gate_and_name_the_node_and_nothing_more(
    kube: Kube, as_connector: client.ApiClient, apply: Callable[[list[Path]], None]
) -> None:
    apply([*BASE, *RIGHTS, *POLICY])
    node = kwok_nodes(kube)[0]
    _policy_in_force(as_connector, kube)

    # Beside its own lift, each change the connector has no use for is refused.
    pod = _gated(kube, SITE_GATE, PLACEMENT_GATE)
    lift = _lift(kube, pod, node)
    node_affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["x"]}]}
                ]
            }
        }
    }
    image = [{"op": "replace", "path": "/spec/containers/0/image", "value": "evil.example/x:1"}]
    refusals = [  # (part of the policy's message, the change)
        ("labels, annotations", [{"op": "add", "path": "/metadata/labels/app", "value": "x"}]),
        ("labels, annotations", [{"op": "add", "path": "/metadata/annotations", "value": {}}]),
        ("containers", image),
        (
            "tolerations",
            [{"op": "add", "path": "/spec/tolerations/-", "value": {"operator": "Exists"}}],
        ),
        ("deadlines", [{"op": "add", "path": "/spec/activeDeadlineSeconds", "value": 1}]),
        ("affinity", [{"op": "add", "path": "/spec/affinity", "value": node_affinity}]),
        (
            "only add kubernetes.io/hostname",
            [{"op": "add", "path": "/spec/nodeSelector/pool", "value": "x"}],
        ),
    ]
    for message, change in refusals:
        assert message in _refused(as_connector, kube, pod, [*lift, *change]), message
    site_gate = [{"op": "remove", "path": "/spec/schedulingGates/0"}]
    assert OWN_GATE_ONLY in _refused(as_connector, kube, pod, site_gate)  # not its to lift

    # Its own lift, with the node: taken; the site's gate stays, ours is gone.
    _patch(as_connector, kube, pod, lift)
    after = kube.core.read_namespaced_pod(pod.metadata.name, kube.namespace)
    assert [g.name for g in after.spec.scheduling_gates] == [SITE_GATE]
    assert after.spec.node_selector == {"kubernetes.io/hostname": node}

    # With no gate of its own left, the pod is not the connector's to change at all.
    assert OWN_GATE_ONLY in _refused(as_connector, kube, after, image)
    # The policy binds the connector alone: the site's admin lifts its own gate.
    kube.core.patch_namespaced_pod(
        pod.metadata.name, kube.namespace, site_gate, _content_type=JSON_PATCH
    )
    wait_for(
        "the pod to run on its node",
        lambda: (
            kube.core.read_namespaced_pod(pod.metadata.name, kube.namespace).spec.node_name == node
        ),
    )


def _gated_job(kube: Kube, name: str, node: str) -> client.V1Job:
    """A running Job of two 1-GPU pods created behind the gate, both planned on ``node``."""
    job = elastic_training_job(name, pods=2, gpus=1)
    job.metadata.annotations[POD_NODES_ANNOTATION] = encode({0: node, 1: node})
    job.spec.template.spec.scheduling_gates = [client.V1PodSchedulingGate(name=PLACEMENT_GATE)]
    kube.batch.create_namespaced_job(kube.namespace, job)

    def both_gated() -> bool:
        pods = kube.core.list_namespaced_pod(kube.namespace, label_selector=f"job-name={name}")
        return len(pods.items) == 2 and all(p.spec.scheduling_gates for p in pods.items)

    wait_for(f"{name}'s pods, gated", both_gated)
    return kube.batch.read_namespaced_job(name, kube.namespace)


def test_the_connector_gates_only_where_it_may_lift_and_notices_a_missing_guard(
    kube: Kube, as_connector: client.ApiClient, apply: Callable[[list[Path]], None]
) -> None:
    node = kwok_nodes(kube)[1]
    apply(BASE)

    def may_list_pods() -> bool:
        try:
            client.CoreV1Api(as_connector).list_namespaced_pod(kube.namespace)
        except ApiException as error:
            assert error.status == 403, error.body
            return False
        return True

    wait_for("the base role to take effect", may_list_pods)
    # (An earlier test's component, deleted, may take a moment to leave the authorizer's
    # and the admission plugin's caches: hence waits, not single looks.)
    wait_for(
        "no patch pods with the base role",
        lambda: not pod_gates.may_patch_pods(as_connector, kube.namespace),
    )

    # The right without the policy: the connector may lift, and finds it unguarded; the
    # pods are let go all the same.
    apply(RIGHTS)
    wait_for("patch pods", lambda: pod_gates.may_patch_pods(as_connector, kube.namespace))
    # No pod in the namespace to try the guard on: unknown (so nothing is gated yet).
    assert pod_gates.check_guard(as_connector, kube.namespace) is pod_gates.Guard.unknown
    unguarded = _gated_job(kube, "unguarded", node)
    wait_for(
        "the guard found missing",
        lambda: pod_gates.check_guard(as_connector, kube.namespace) is pod_gates.Guard.missing,
    )
    found = pod_gates.ungate_pods(as_connector, unguarded)
    assert len(found.let_go) == 2 and found.waiting == 0

    # With the policy: held; each pod goes to its node, and the probe changed nothing.
    apply(POLICY)
    _policy_in_force(as_connector, kube)
    guarded = _gated_job(kube, "guarded", node)
    assert pod_gates.check_guard(as_connector, kube.namespace) is pod_gates.Guard.held
    found = pod_gates.ungate_pods(as_connector, guarded)
    assert len(found.let_go) == 2 and found.waiting == 0 and found.pods == 2
    pods = kube.core.list_namespaced_pod(kube.namespace, label_selector="job-name=guarded").items
    assert all(p.spec.node_selector == {"kubernetes.io/hostname": node} for p in pods)
    assert all(pod_gates.PROBE_LABEL not in (p.metadata.labels or {}) for p in pods)
    wait_for(
        "both pods to run on their node",
        lambda: (
            {
                p.spec.node_name
                for p in kube.core.list_namespaced_pod(
                    kube.namespace, label_selector="job-name=guarded"
                ).items
            }
            == {node}
        ),
    )


@pytest.fixture
def placing(
    k8s_cluster: K8sCluster,
    kube: Kube,
    tmp_path: Path,
    apply: Callable[[list[Path]], None],
    as_connector: client.ApiClient,
) -> Iterator[tuple[KubernetesConnector, Steps]]:
    """A connector of the test's namespace with ``pod_placement``, as deployed with the
    component, and the executor of its steps."""
    apply([*BASE, *RIGHTS, *POLICY])
    _policy_in_force(as_connector, kube)
    config = KubernetesConnectorConfig(
        cluster=CLUSTER,
        kubeconfig=k8s_cluster.kubeconfig,
        namespaces=[kube.namespace],
        pod_placement=True,
    )
    connector = KubernetesConnector(config, api=as_connector)
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

    # A resize that keeps other pods than Kubernetes would restarts the running Job at its
    # new size, each pod on its planned node again.
    job = f"{kube.namespace}/job/placed"
    resized = steps.run("resize", job, replicas=2, nodes=[b], gpus={b: 4})
    assert resized.ok, resized.error
    steps.until_ok("confirm", job, expect="running", nodes=[b], exactly=True, replicas=2)
    wait_for("2 pods to run", lambda: len(pods_by_index(kube, "placed")) == 2)
    assert {i: p.spec.node_name for i, p in pods_by_index(kube, "placed").items()} == {0: b, 1: b}
    current = kube.batch.read_namespaced_job("placed", kube.namespace)
    assert current.metadata.annotations[POD_NODES_ANNOTATION] == encode({0: b, 1: b})

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
