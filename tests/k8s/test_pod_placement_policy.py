"""deploy/kubernetes/components/pod-placement on the tests' real API server: the
connector's ServiceAccount may take its placement gate off a pod and name the pod's node
in the same patch (connectors.kubernetes.actions.ungate_pods), and change nothing else of
any pod — the admission policy that holds the component's ``patch pods`` to that."""

from __future__ import annotations

import itertools
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes import config as kube_config
from kubernetes.client.exceptions import ApiException

from connectors.kubernetes.pod_placement import PLACEMENT_GATE, ungate_patch
from tests.k8s.conftest import REPO, K8sCluster, Kube, wait_for
from tests.k8s.objects import bare_pod
from tests.k8s.test_deploy import SERVICE_ACCOUNT, kubectl_path
from tests.k8s.test_kubernetes_steps import kwok_nodes

pytestmark = pytest.mark.slow

COMPONENT = REPO / "deploy" / "kubernetes" / "components" / "pod-placement"
FILES = ("clusterrole.yaml", "clusterrolebinding.yaml", "pod-placement-policy.yaml")
SITE_GATE = "site.example/quota"
JSON_PATCH = "application/json-patch+json"


def _kubectl(cluster: K8sCluster, *args: str) -> None:
    subprocess.run(
        [str(kubectl_path()), "--kubeconfig", str(cluster.kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )


@pytest.fixture(scope="module")
def as_connector(k8s_cluster: K8sCluster) -> Iterator[client.CoreV1Api]:
    """The component applied; the core API as the connector's ServiceAccount (the admin
    impersonating it: RBAC and admission see that ServiceAccount)."""
    files = [arg for name in FILES for arg in ("-f", str(COMPONENT / name))]
    _kubectl(k8s_cluster, "apply", *files)
    configuration = client.Configuration()
    kube_config.load_kube_config(
        config_file=str(k8s_cluster.kubeconfig), client_configuration=configuration
    )
    api = client.ApiClient(configuration)
    api.set_default_header("Impersonate-User", SERVICE_ACCOUNT)
    api.set_default_header("Impersonate-Group", "system:serviceaccounts")
    try:
        yield client.CoreV1Api(api)
    finally:
        api.close()
        # Cluster-wide: test_deploy checks that the base role alone may not patch pods.
        _kubectl(k8s_cluster, "delete", "--ignore-not-found", *files)


names = itertools.count(1)


def _gated(kube: Kube, *gates: str) -> client.V1Pod:
    pod = bare_pod(f"gated-{next(names)}", gpus=1)
    pod.spec.scheduling_gates = [client.V1PodSchedulingGate(name=g) for g in gates]
    return kube.core.create_namespaced_pod(kube.namespace, pod)


def _patch(core: client.CoreV1Api, kube: Kube, pod: client.V1Pod, patch: list[Any]) -> None:
    core.patch_namespaced_pod(pod.metadata.name, kube.namespace, patch, _content_type=JSON_PATCH)


def _refused(core: client.CoreV1Api, kube: Kube, pod: client.V1Pod, patch: list[Any]) -> str:
    with pytest.raises(ApiException) as refused:
        _patch(core, kube, pod, patch)
    assert refused.value.status == 403, refused.value.body
    return str(refused.value.body)


def _lift(kube: Kube, pod: client.V1Pod, node: str | None) -> list[dict[str, Any]]:
    patch = ungate_patch(kube.api.sanitize_for_serialization(pod), node)
    assert patch is not None
    return patch


def test_the_connector_may_lift_its_gate_and_name_the_node_and_nothing_more(
    kube: Kube, as_connector: client.CoreV1Api
) -> None:
    core = as_connector
    node = kwok_nodes(kube)[0]
    # Admission reads policies from an informer: moments after the apply.
    canary = _gated(kube, PLACEMENT_GATE)
    values = itertools.count()

    def labels_refused() -> bool:
        try:
            _patch(
                core,
                kube,
                canary,
                [{"op": "add", "path": "/metadata/labels/try", "value": str(next(values))}],
            )
        except ApiException as error:
            return error.status == 403 and "shaper-pod-placement" in str(error.body)
        return False

    wait_for("the policy to be in force", labels_refused)
    # Its policy's status: every expression type-checked against the Pod schema (an
    # expression that does not would deny every request).
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

    # Beside its own lift, each change the connector has no use for is refused.
    pod = _gated(kube, SITE_GATE, PLACEMENT_GATE)
    lift = _lift(kube, pod, node)
    assert "labels" in _refused(
        core, kube, pod, [*lift, {"op": "add", "path": "/metadata/labels/app", "value": "other"}]
    )
    image = {"op": "replace", "path": "/spec/containers/0/image", "value": "evil.example/x:1"}
    assert "containers" in _refused(core, kube, pod, [*lift, image])
    other_key = {"op": "add", "path": "/spec/nodeSelector/pool", "value": "x"}
    assert "nodeSelector" in _refused(core, kube, pod, [*lift, other_key])
    site_gate = [{"op": "remove", "path": "/spec/schedulingGates/0"}]
    assert "gate" in _refused(core, kube, pod, site_gate)  # not its gate to lift

    # Its own lift, with the node: taken; the site's gate stays, ours is gone.
    _patch(core, kube, pod, lift)
    after = kube.core.read_namespaced_pod(pod.metadata.name, kube.namespace)
    assert [g.name for g in after.spec.scheduling_gates] == [SITE_GATE]
    assert after.spec.node_selector == {"kubernetes.io/hostname": node}

    # With no gate of its own left, the pod is not the connector's to change at all.
    assert "gate" in _refused(core, kube, after, [image])
    # The policy binds the connector alone: the site's admin lifts its own gate.
    kube.core.patch_namespaced_pod(
        pod.metadata.name,
        kube.namespace,
        [{"op": "remove", "path": "/spec/schedulingGates/0"}],
        _content_type=JSON_PATCH,
    )
    wait_for(
        "the pod to run on its node",
        lambda: (
            kube.core.read_namespaced_pod(pod.metadata.name, kube.namespace).spec.node_name == node
        ),
    )
