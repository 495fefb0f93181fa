"""The node agent's manifests (deploy/kubernetes/components/node-agent) on the real API
server of the tests.

A site overlay of overlays/kueue with the component (image, token, the agent's TLS
Secret, its CA for the connector) is rendered with ``kubectl kustomize``; the agent's own
objects (namespace shaper-node, its ServiceAccount, ClusterRole and binding, DaemonSet,
Secret) are applied with ``kubectl apply``, and then:

* ``kubectl auth can-i --as=system:serviceaccount:shaper-node:shaper-node-agent``: the
  agent's kubelet identity may create nodes/checkpoint and get nodes/pods, the two
  kubelet calls it makes, and none of a set of things beyond (nodes/proxy, exec, Secrets,
  the API server's own objects);
* the DaemonSet puts its pod on a node labelled shaper.io/kubelet-checkpoint=true and on
  no other, admitted by its namespace (Pod Security "privileged"); a namespace that
  enforces "baseline" refuses that pod. The nodes are kwok's: the pod is bound and shown
  Running, but no container runs (a DaemonSet runs real processes only on real nodes;
  tests/k8s/test_real_node_checkpoint_gc.py runs the agent under this identity against
  a real kubelet);
* the connector's Deployment is wired to the agents: node_agent_url, the CA and the
  token from the Secret the component generates in shaper-system;
* its ValidatingAdmissionPolicy refuses a pod that names another namespace's checkpoint
  image (containerd on that node would restore the other tenant's process) and admits
  one naming its own.

The connector's own objects are not applied here (tests/k8s/test_deploy.py does, and
deletes its namespace in the background when it ends).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.k8s.conftest import K8sCluster, wait_for
from tests.k8s.test_deploy import DEPLOY, _id, kubectl_path

pytestmark = pytest.mark.slow

NAMESPACE = "shaper-node"
AGENT = f"system:serviceaccount:{NAMESPACE}:shaper-node-agent"
LABEL = "shaper.io/kubelet-checkpoint"
POLICY = "shaper-checkpoint-images"  # the ValidatingAdmissionPolicy and its binding
# Never real secrets: the site's overlay stands for what a site keeps out of git.
SITE_ENV = "token=test-placeholder-not-a-real-token\n"
PLACEHOLDER_PEM = "-----BEGIN CERTIFICATE-----\nnot-a-real-certificate\n-----END CERTIFICATE-----\n"


def write_site(directory: Path) -> None:
    """overlays/kueue with components/node-agent, the site's image and the agent's token
    in a Secret in each of the two namespaces, as the component asks of a site."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "agent.env").write_text(SITE_ENV)
    relative = os.path.relpath(DEPLOY, directory)
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [f"{relative}/overlays/kueue"],
        "components": [f"{relative}/components/node-agent"],
        "images": [{"name": "shaper", "newName": "registry.example/shaper", "newTag": "test"}],
        "secretGenerator": [
            {
                "name": "shaper-node-agent",
                "namespace": ns,
                "envs": ["agent.env"],
            }
            for ns in (NAMESPACE, "shaper-system")
        ],
    }
    (directory / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))


def rendered(directory: Path) -> list[dict[str, Any]]:
    built = subprocess.run(
        [str(kubectl_path()), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    return [document for document in yaml.safe_load_all(built.stdout) if document]


def the_agents(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The component's objects for the node: in its namespace, or named for the agent."""
    return [
        obj
        for obj in objects
        if obj["metadata"].get("namespace") == NAMESPACE
        or obj["metadata"]["name"] in (NAMESPACE, "shaper-node-agent", POLICY)
    ]


@dataclass
class Applied:
    cluster: K8sCluster
    objects: list[dict[str, Any]]

    def kubectl(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(kubectl_path()), "--kubeconfig", str(self.cluster.kubeconfig), *args],
            capture_output=True,
            text=True,
            input=stdin,
            timeout=60,
            check=False,
        )

    def can_i(self, verb: str, resource: str, *options: str) -> bool:
        done = self.kubectl("auth", "can-i", verb, resource, f"--as={AGENT}", *options)
        answer = done.stdout.strip().splitlines()[-1:] or [""]
        if done.returncode not in (0, 1) or answer[0] not in ("yes", "no"):
            raise AssertionError(f"kubectl auth can-i {verb} {resource} {options}: {done.stderr}")
        return answer[0] == "yes"


@pytest.fixture(scope="module")
def applied(k8s_cluster: K8sCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Applied]:
    directory = tmp_path_factory.mktemp("shaper-node-agent-site")
    write_site(directory)
    objects = rendered(directory)
    site = Applied(k8s_cluster, objects)
    manifest = yaml.safe_dump_all(the_agents(objects))
    done = site.kubectl(
        "apply", "--server-side", "--field-manager=shaper-test", "-f", "-", stdin=manifest
    )
    assert done.returncode == 0, done.stderr
    # The agent's serving certificate, as the site provides it (the kubelet would refuse to
    # start the pod without it; kwok does not look).
    core = client.CoreV1Api(k8s_cluster.api_client())
    core.create_namespaced_secret(
        NAMESPACE,
        client.V1Secret(
            metadata=client.V1ObjectMeta(name="shaper-node-agent-tls"),
            type="kubernetes.io/tls",
            string_data={"tls.crt": PLACEHOLDER_PEM, "tls.key": PLACEHOLDER_PEM},
        ),
    )
    try:
        wait_for(
            "the agent's ClusterRole to take effect",
            lambda: site.can_i("create", "nodes", "--subresource=checkpoint"),
        )
        yield site
    finally:
        site.kubectl("delete", "--ignore-not-found", "--wait=false", "-f", "-", stdin=manifest)


# (verb, resource, options): the kubelet calls of agent/kubelet.py (GET /pods, POST
# /checkpoint/...), as the kubelet's fine-grained authorization asks for them.
ALLOWED = [
    ("create", "nodes", ("--subresource=checkpoint",)),
    ("get", "nodes", ("--subresource=pods",)),
]

REFUSED = [
    ("get", "nodes", ("--subresource=proxy",)),  # exec, attach, port-forward via the kubelet
    ("create", "nodes", ("--subresource=proxy",)),
    ("get", "nodes", ("--subresource=log",)),
    ("get", "nodes", ("--subresource=stats",)),
    ("get", "nodes", ("--subresource=metrics",)),
    ("get", "nodes", ("--subresource=configz",)),
    ("create", "nodes", ("--subresource=pods",)),
    ("get", "nodes", ("--subresource=checkpoint",)),
    ("get", "nodes", ()),
    ("list", "nodes", ()),
    ("patch", "nodes", ()),
    ("get", "pods", ("--all-namespaces",)),
    ("list", "pods", ("--all-namespaces",)),
    ("create", "pods", ("--subresource=exec", "-n", "default")),
    ("create", "pods", ("--subresource=attach", "-n", "default")),
    ("delete", "pods", ("-n", "default")),
    ("get", "secrets", ("-n", NAMESPACE)),  # not even its own token's Secret
    ("list", "secrets", ("--all-namespaces",)),
    ("get", "configmaps", ("-n", "kube-system")),
    ("create", "serviceaccounts", ("--subresource=token", "-n", NAMESPACE)),
    ("patch", "jobs.batch", ("-n", "default")),
    ("patch", "workloads.kueue.x-k8s.io", ("-n", "default")),
    ("create", "clusterrolebindings.rbac.authorization.k8s.io", ()),
    ("impersonate", "users", ()),
    ("*", "*", ("--all-namespaces",)),
]


@pytest.mark.parametrize("check", ALLOWED, ids=[_id(c) for c in ALLOWED])
def test_the_node_agent_can_make_its_kubelet_calls(
    applied: Applied, check: tuple[str, str, tuple[str, ...]]
) -> None:
    verb, resource, options = check
    assert applied.can_i(verb, resource, *options), f"the agent may not {_id(check)}"


@pytest.mark.parametrize("check", REFUSED, ids=[_id(c) for c in REFUSED])
def test_the_node_agent_can_do_nothing_more(
    applied: Applied, check: tuple[str, str, tuple[str, ...]]
) -> None:
    verb, resource, options = check
    assert not applied.can_i(verb, resource, *options), f"the agent may {_id(check)}"


def test_the_component_grants_exactly_two_kubelet_rights(applied: Applied) -> None:
    (role,) = [
        obj
        for obj in applied.objects
        if obj["kind"] == "ClusterRole" and obj["metadata"]["name"] == "shaper-node-agent"
    ]
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes/checkpoint"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["nodes/pods"], "verbs": ["get"]},
    ]
    # Nothing else of the component grants anything: one role, bound to the agent only.
    bindings = [obj for obj in the_agents(applied.objects) if obj["kind"] == "ClusterRoleBinding"]
    assert [b["subjects"] for b in bindings] == [
        [{"kind": "ServiceAccount", "name": "shaper-node-agent", "namespace": NAMESPACE}]
    ]


def agent_pods(core: client.CoreV1Api) -> list[client.V1Pod]:
    return list(
        core.list_namespaced_pod(
            NAMESPACE, label_selector="app.kubernetes.io/name=shaper-node-agent"
        ).items
    )


def test_the_daemonset_runs_on_labelled_nodes_only_in_a_privileged_namespace(
    applied: Applied,
) -> None:
    core = client.CoreV1Api(applied.cluster.api_client())
    daemonset = client.AppsV1Api(applied.cluster.api_client()).read_namespaced_daemon_set(
        "shaper-node-agent", NAMESPACE
    )
    spec = daemonset.spec.template.spec
    assert spec.host_network is True and spec.automount_service_account_token is False
    (container,) = spec.containers
    assert container.image == "registry.example/shaper:test"
    assert container.security_context.capabilities.drop == ["ALL"]
    env = {e.name: e for e in container.env}
    secret = env["SHAPER_AGENT_API_TOKEN"].value_from.secret_key_ref.name
    assert core.read_namespaced_secret(secret, NAMESPACE).data.keys() == {"token"}
    mounts = {m.mount_path for m in container.volume_mounts}
    assert {
        "/var/lib/kubelet/checkpoints",
        "/run/containerd/containerd.sock",
        "/var/lib/kubelet/pki/kubelet.crt",
    } <= mounts
    assert "/var/lib/kubelet" not in mounts and "/var/lib/kubelet/pki" not in mounts
    # No node is labelled: no pod.
    assert agent_pods(core) == []

    nodes = [n.metadata.name for n in core.list_node().items]
    labelled = nodes[0]
    core.patch_node(labelled, {"metadata": {"labels": {LABEL: "true"}}})
    try:
        pod = wait_for(
            lambda: f"the agent's pod on {labelled}: {[p.status.phase for p in agent_pods(core)]}",
            lambda: next((p for p in agent_pods(core) if p.spec.node_name), None),
        )
        assert pod.spec.node_name == labelled
        assert [p.spec.node_name for p in agent_pods(core)] == [labelled]
    finally:
        core.patch_node(labelled, {"metadata": {"labels": {LABEL: None}}})
    wait_for("the agent's pod gone with the label", lambda: not agent_pods(core))

    # The same pod in a namespace that enforces "baseline" is refused: the host network and
    # hostPath volumes need the privileged namespace of its own.
    probe = "shaper-node-baseline-probe"
    core.create_namespace(
        client.V1Namespace(
            metadata=client.V1ObjectMeta(
                name=probe, labels={"pod-security.kubernetes.io/enforce": "baseline"}
            )
        )
    )
    try:
        template = daemonset.spec.template
        pod_body = client.V1Pod(
            metadata=client.V1ObjectMeta(name="agent-probe", labels=template.metadata.labels),
            spec=template.spec,
        )
        core.create_namespaced_service_account(
            probe, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="shaper-node-agent"))
        )
        with pytest.raises(ApiException) as refused:
            core.create_namespaced_pod(probe, pod_body, dry_run="All")
        assert refused.value.status == 403 and "PodSecurity" in refused.value.body
        assert "hostNetwork" in refused.value.body and "hostPath" in refused.value.body
    finally:
        core.delete_namespace(probe)


def test_the_connector_is_wired_to_the_agents(applied: Applied) -> None:
    deployment = next(
        obj
        for obj in applied.objects
        if obj["kind"] == "Deployment" and obj["metadata"]["name"] == "shaper-connector"
    )
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert "--set=node_agent_url=https://{node}:8470" in container["args"]
    assert "--set=node_agent_ca=/etc/shaper/node-agent-ca/ca.crt" in container["args"]
    env = {e["name"]: e for e in container["env"]}
    secret = env["SHAPER_NODE_AGENT_TOKEN"]["valueFrom"]["secretKeyRef"]["name"]
    generated = next(
        obj
        for obj in applied.objects
        if obj["kind"] == "Secret"
        and obj["metadata"]["name"] == secret
        and obj["metadata"]["namespace"] == "shaper-system"
    )
    # The site's token reached both Secrets (the connector's and the agent's).
    agents = next(
        obj
        for obj in the_agents(applied.objects)
        if obj["kind"] == "Secret" and obj["metadata"]["name"].startswith("shaper-node-agent-")
    )
    assert generated["data"]["token"] == agents["data"]["token"] != ""
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["node-agent-ca"]["configMap"]["name"] == "shaper-node-agent-ca"


def test_a_pod_may_name_only_its_own_namespace_s_checkpoint_images(applied: Applied) -> None:
    core = client.CoreV1Api(applied.cluster.api_client())
    kinds = {(obj["kind"], obj["metadata"]["name"]) for obj in applied.objects}
    assert {
        ("ValidatingAdmissionPolicy", POLICY),
        ("ValidatingAdmissionPolicyBinding", POLICY),
    } <= kinds
    mine, theirs = "ckpt-tenant-a", "ckpt-tenant-b"
    for name in (mine, theirs):
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))

    def pod(image: str, *, init: bool = False) -> client.V1Pod:
        container = client.V1Container(name="c", image=image, image_pull_policy="Never")
        busybox = client.V1Container(name="b", image="busybox:1.36")
        return client.V1Pod(
            metadata=client.V1ObjectMeta(generate_name="ckpt-"),
            spec=client.V1PodSpec(
                containers=[busybox] if init else [container],
                init_containers=[container] if init else None,
            ),
        )

    other = f"localhost/shaper/checkpoint/{mine}/p/c:ckpt-20261205T070000000Z"

    def refused_in_theirs() -> str | None:
        try:
            core.create_namespaced_pod(theirs, pod(other), dry_run="All")
        except ApiException as error:
            return error.body if error.status in (403, 422) and POLICY in error.body else None
        return None

    try:
        # The policy takes effect once the API server has compiled it.
        body = wait_for("the checkpoint image policy to refuse", refused_in_theirs)
        assert f"a pod of {theirs} may run only localhost/shaper/checkpoint/{theirs}/" in body
        with pytest.raises(ApiException) as as_init:  # an init container alike
            core.create_namespaced_pod(theirs, pod(other, init=True), dry_run="All")
        assert POLICY in as_init.value.body
        # Its own namespace's checkpoint image, and any other image: admitted.
        core.create_namespaced_pod(mine, pod(other), dry_run="All")
        core.create_namespaced_pod(theirs, pod("busybox:1.36"), dry_run="All")
    finally:
        for name in (mine, theirs):
            core.delete_namespace(name)
