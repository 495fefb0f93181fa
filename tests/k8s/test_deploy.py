"""The connector's manifests (deploy/kubernetes) applied to the real API server of the tests.

A site overlay like the one deploy/kubernetes/README.md describes (the kueue overlay, the
site's image, cluster, control plane and token) goes in with ``kubectl apply -k``; then:

* ``kubectl auth can-i --as=system:serviceaccount:shaper-system:shaper-connector``: the
  connector may do each thing its code does, and none of a set of things beyond that;
* a token of that ServiceAccount (TokenRequest), used by the official client, is allowed
  to read and to make dry-run writes it needs, and is refused (403) the rest: the API
  server's own authorization, not only its answer to a question about it;
* the Deployment is accepted and its pod admitted in a namespace that enforces Pod
  Security "restricted" (kwok plays the node: no container runs).
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

from tests.k8s.conftest import REPO, K8sCluster, wait_for

pytestmark = pytest.mark.slow

DEPLOY = REPO / "deploy" / "kubernetes"
NAMESPACE = "shaper-system"
SERVICE_ACCOUNT = f"system:serviceaccount:{NAMESPACE}:shaper-connector"
# Never a real token: the test's site overlay stands for what a site writes out of git.
SITE_ENV = "token=test-placeholder-not-a-real-token\nbroker-url=redis://127.0.0.1:9/0\n"


def kubectl_path() -> Path:
    """kubectl of the cache scripts/k8s-build.sh filled (scripts/k8s/versions.sh's K8S_BIN)."""
    versions = REPO / "scripts" / "k8s" / "versions.sh"
    found = subprocess.run(
        ["bash", "-c", f'source "{versions}" && printf %s "$K8S_BIN"'],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(found.stdout) / "kubectl"


@dataclass
class Site:
    """The manifests as applied, and a kubectl on the test cluster's admin kubeconfig."""

    cluster: K8sCluster
    directory: Path
    kubectl_binary: Path

    def kubectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [str(self.kubectl_binary), "--kubeconfig", str(self.cluster.kubeconfig), *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed:\n{done.stderr}{done.stdout}")
        return done

    def can_i(self, verb: str, resource: str, *options: str) -> bool:
        """``kubectl auth can-i`` as the connector's ServiceAccount: exit 0 yes, 1 no."""
        done = self.kubectl(
            "auth", "can-i", verb, resource, f"--as={SERVICE_ACCOUNT}", *options, check=False
        )
        answer = done.stdout.strip().splitlines()[-1:] or [""]
        if done.returncode not in (0, 1) or answer[0] not in ("yes", "no"):
            raise AssertionError(f"kubectl auth can-i {verb} {resource} {options}: {done.stderr}")
        return answer[0] == "yes"


def write_site(directory: Path) -> None:
    """A site overlay on overlays/kueue: image, cluster, control plane and token."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "connector.env").write_text(SITE_ENV)
    # kustomize refuses absolute paths to other kustomizations.
    relative = os.path.relpath(DEPLOY, directory)
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [f"{relative}/overlays/kueue"],
        "images": [{"name": "shaper", "newName": "registry.example/shaper", "newTag": "test"}],
        "configMapGenerator": [
            {
                "name": "shaper-connector",
                "namespace": NAMESPACE,
                "behavior": "merge",
                "literals": ["cluster=test-k8s", "control-plane=http://127.0.0.1:9"],
            }
        ],
        "secretGenerator": [
            {
                "name": "shaper-connector",
                "namespace": NAMESPACE,
                "behavior": "merge",
                "envs": ["connector.env"],
            }
        ],
    }
    (directory / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))


@pytest.fixture(scope="module")
def site(k8s_cluster: K8sCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    directory = tmp_path_factory.mktemp("shaper-site")
    write_site(directory)
    applied = Site(k8s_cluster, directory, kubectl_path())
    applied.kubectl("apply", "-k", str(directory))
    try:
        # The RBAC authorizer reads roles from an informer: moments after the apply.
        wait_for(
            "the connector's ClusterRole to take effect", lambda: applied.can_i("list", "nodes")
        )
        yield applied
    finally:
        # Every object of the site, cluster-scoped ones too; the namespace goes in the
        # background with what the Deployment made in it.
        applied.kubectl("delete", "-k", str(directory), "--ignore-not-found", "--wait=false")


# (verb, resource, extra options): what the connector's code does (deploy/kubernetes says
# which part needs which). Reads are checked across all namespaces, as the informers list.
ALLOWED = [
    ("list", "nodes", ()),
    ("watch", "nodes", ()),
    ("get", "nodes", ()),
    ("list", "pods", ("--all-namespaces",)),
    ("watch", "pods", ("--all-namespaces",)),
    ("get", "pods", ("-n", "default")),
    ("delete", "pods", ("-n", "default")),
    ("list", "deployments.apps", ("--all-namespaces",)),
    ("watch", "statefulsets.apps", ("--all-namespaces",)),
    ("patch", "deployments.apps", ("--subresource=scale", "-n", "default")),
    ("patch", "statefulsets.apps", ("--subresource=scale", "-n", "default")),
    ("watch", "jobs.batch", ("--all-namespaces",)),
    ("patch", "jobs.batch", ("-n", "default")),
    ("delete", "jobs.batch", ("-n", "default")),
    ("list", "priorityclasses.scheduling.k8s.io", ()),
    ("watch", "priorityclasses.scheduling.k8s.io", ()),
    ("watch", "workloads.kueue.x-k8s.io", ("--all-namespaces",)),
    ("patch", "workloads.kueue.x-k8s.io", ("-n", "default")),
    ("update", "workloads.kueue.x-k8s.io", ("-n", "default")),
    ("list", "clusterqueues.kueue.x-k8s.io", ()),
    ("watch", "localqueues.kueue.x-k8s.io", ("--all-namespaces",)),
    ("list", "resourceflavors.kueue.x-k8s.io", ()),
]

# Owners of gang pods whose CRDs the test cluster does not serve: kubectl cannot name a
# resource that discovery does not know (it would ask about group ""), so these go to the
# API server as the SubjectAccessReview that ``kubectl auth can-i`` sends.
ALLOWED_UNSERVED = [
    ("jobset.x-k8s.io", "jobsets"),
    ("leaderworkerset.x-k8s.io", "leaderworkersets"),
    ("ray.io", "rayclusters"),
]

# Beyond what it needs: each would let a compromised connector do harm it has no use for.
REFUSED = [
    ("create", "deployments.apps", ("-n", "default")),  # run its own workloads
    ("update", "deployments.apps", ("-n", "default")),  # change an image, not only replicas
    ("patch", "deployments.apps", ("-n", "default")),
    ("delete", "deployments.apps", ("-n", "default")),
    ("create", "jobs.batch", ("-n", "default")),
    ("update", "deployments.apps", ("--subresource=scale", "-n", "default")),
    ("patch", "pods", ("-n", "default")),
    ("create", "priorityclasses.scheduling.k8s.io", ()),
    ("update", "pods", ("-n", "default")),  # relabel a pod out of its ReplicaSet
    ("create", "pods", ("--subresource=exec", "-n", "default")),
    ("delete", "nodes", ()),
    ("patch", "nodes", ("--subresource=status",)),  # fake a node's capacity
    # Rights an earlier role granted for what no saga step does: cordon (patch nodes), evict
    # (library functions no plan drives yet), move a bare pod (delete and create: a pod
    # lost for good if the connector failed in between), and reads nothing watches.
    ("patch", "nodes", ()),
    ("create", "pods", ("-n", "default")),
    ("create", "pods", ("--subresource=eviction", "-n", "default")),
    ("list", "replicasets.apps", ("--all-namespaces",)),
    ("list", "workloadpriorityclasses.kueue.x-k8s.io", ()),
    ("watch", "cohorts.kueue.x-k8s.io", ()),
    ("get", "secrets", ("-n", NAMESPACE)),  # not even its own token's Secret
    ("list", "secrets", ("--all-namespaces",)),
    ("get", "configmaps", ("-n", "kube-system")),
    ("create", "serviceaccounts", ("--subresource=token", "-n", NAMESPACE)),
    ("delete", "namespaces", ()),
    ("create", "clusterrolebindings.rbac.authorization.k8s.io", ()),
    ("escalate", "clusterroles.rbac.authorization.k8s.io", ()),
    ("bind", "clusterroles.rbac.authorization.k8s.io", ()),
    ("impersonate", "users", ()),
    ("patch", "clusterqueues.kueue.x-k8s.io", ()),  # a site's quotas stay its own
    ("create", "workloads.kueue.x-k8s.io", ("-n", "default")),
    ("patch", "workloads.kueue.x-k8s.io", ("--subresource=status", "-n", "default")),
    ("delete", "workloads.kueue.x-k8s.io", ("-n", "default")),
    ("*", "*", ("--all-namespaces",)),
]


def _id(check: tuple[str, str, tuple[str, ...]]) -> str:
    verb, resource, options = check
    return " ".join([verb, resource, *options])


@pytest.mark.parametrize("check", ALLOWED, ids=[_id(c) for c in ALLOWED])
def test_the_connector_can_do_what_its_code_does(
    site: Site, check: tuple[str, str, tuple[str, ...]]
) -> None:
    verb, resource, options = check
    assert site.can_i(verb, resource, *options), f"the connector may not {_id(check)}"


@pytest.mark.parametrize(("group", "resource"), ALLOWED_UNSERVED)
@pytest.mark.parametrize("verb", ["list", "watch"])
def test_the_connector_can_read_gang_owners_not_installed_here(
    site: Site, verb: str, group: str, resource: str
) -> None:
    review = client.V1SubjectAccessReview(
        spec=client.V1SubjectAccessReviewSpec(
            user=SERVICE_ACCOUNT,
            groups=["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}"],
            resource_attributes=client.V1ResourceAttributes(
                verb=verb, group=group, resource=resource
            ),
        )
    )
    answer = client.AuthorizationV1Api(site.cluster.api_client()).create_subject_access_review(
        review
    )
    assert answer.status.allowed, f"the connector may not {verb} {resource}.{group}"


@pytest.mark.parametrize("check", REFUSED, ids=[_id(c) for c in REFUSED])
def test_the_connector_can_do_nothing_more(
    site: Site, check: tuple[str, str, tuple[str, ...]]
) -> None:
    verb, resource, options = check
    assert not site.can_i(verb, resource, *options), f"the connector may {_id(check)}"


def service_account_client(site: Site, admin: client.ApiClient) -> client.ApiClient:
    """The official client on a fresh token of the connector's ServiceAccount, as the
    in-cluster config would build it from the projected token."""
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=600)
    )
    token = client.CoreV1Api(admin).create_namespaced_service_account_token(
        "shaper-connector", NAMESPACE, request
    )
    configuration = client.Configuration()
    configuration.host = admin.configuration.host
    configuration.ssl_ca_cert = admin.configuration.ssl_ca_cert
    configuration.api_key = {"authorization": f"Bearer {token.status.token}"}
    api = client.ApiClient(configuration)
    site.cluster.api_clients.append(api)
    return api


def forbidden(call: Any) -> bool:
    try:
        call()
    except ApiException as error:
        if error.status == 403:
            return True
        raise
    return False


def test_a_service_account_token_is_authorized_as_the_role_says(site: Site) -> None:
    admin = site.cluster.api_client()
    api = service_account_client(site, admin)
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    custom = client.CustomObjectsApi(api)
    who = client.AuthenticationV1Api(api).create_self_subject_review(client.V1SelfSubjectReview())
    assert who.status.user_info.username == SERVICE_ACCOUNT

    # Reads, cluster-wide, as the informers make them.
    assert core.list_node(limit=10).items
    core.list_pod_for_all_namespaces(limit=10)
    custom.list_cluster_custom_object("kueue.x-k8s.io", "v1beta2", "clusterqueues")
    # Writes it needs, as server-side dry runs (authorization comes first, nothing changes).
    node = core.list_node(limit=1).items[0].metadata.name
    apps.patch_namespaced_deployment_scale(
        "shaper-connector", NAMESPACE, {"spec": {"replicas": 1}}, dry_run="All"
    )

    # And nothing beyond: refused whether or not the object exists.
    assert forbidden(lambda: core.delete_namespace("default", dry_run="All"))
    assert forbidden(lambda: core.list_namespaced_secret(NAMESPACE))
    assert forbidden(lambda: core.delete_node(node, dry_run="All"))
    # Cordon is a library function no saga step calls: the role does not grant it.
    assert forbidden(
        lambda: core.patch_node(node, {"spec": {"unschedulable": True}}, dry_run="All")
    )
    assert forbidden(
        lambda: apps.patch_namespaced_deployment(
            "shaper-connector",
            NAMESPACE,
            {"spec": {"template": {"spec": {"serviceAccountName": "default"}}}},
            dry_run="All",
        )
    )
    assert forbidden(
        lambda: custom.patch_cluster_custom_object(
            "kueue.x-k8s.io", "v1beta2", "clusterqueues", "any", {"spec": {}}, dry_run="All"
        )
    )
    assert forbidden(
        lambda: client.RbacAuthorizationV1Api(api).create_cluster_role_binding(
            client.V1ClusterRoleBinding(
                metadata=client.V1ObjectMeta(name="shaper-connector-escalation"),
                role_ref=client.V1RoleRef(
                    api_group="rbac.authorization.k8s.io", kind="ClusterRole", name="cluster-admin"
                ),
                subjects=[
                    client.RbacV1Subject(
                        kind="ServiceAccount", name="shaper-connector", namespace=NAMESPACE
                    )
                ],
            ),
            dry_run="All",
        )
    )


def test_the_deployment_is_accepted_and_its_pod_admitted_as_restricted(site: Site) -> None:
    admin = site.cluster.api_client()
    core, apps = client.CoreV1Api(admin), client.AppsV1Api(admin)
    deployment = apps.read_namespaced_deployment("shaper-connector", NAMESPACE)
    assert deployment.spec.replicas == 1
    assert deployment.spec.strategy.type == "Recreate"
    container = deployment.spec.template.spec.containers[0]
    assert container.image == "registry.example/shaper:test"
    env = {variable.name: variable for variable in container.env}
    # The generated (hash-suffixed) names are the ones the Deployment refers to.
    secret = env["SHAPER_CONNECTOR_TOKEN"].value_from.secret_key_ref.name
    assert secret.startswith("shaper-connector-")
    assert core.read_namespaced_secret(secret, NAMESPACE).data.keys() == {"token", "broker-url"}

    # The namespace enforces "restricted": a privileged pod is refused there...
    privileged = client.V1Pod(
        metadata=client.V1ObjectMeta(name="privileged-probe"),
        spec=client.V1PodSpec(
            containers=[
                client.V1Container(
                    name="c",
                    image="busybox",
                    security_context=client.V1SecurityContext(privileged=True),
                )
            ]
        ),
    )
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_pod(NAMESPACE, privileged, dry_run="All")
    assert refused.value.status == 403 and "PodSecurity" in refused.value.body
    # ...and the connector's pod was admitted and scheduled onto a (kwok) node.
    selector = "app.kubernetes.io/name=shaper-connector"

    def scheduled_pod() -> client.V1Pod | None:
        pods = core.list_namespaced_pod(NAMESPACE, label_selector=selector).items
        return next((pod for pod in pods if pod.spec.node_name), None)

    def pod_events() -> str:
        events = core.list_namespaced_event(NAMESPACE).items
        return "the connector's pod; events: " + "; ".join(
            f"{e.involved_object.kind} {e.reason}: {e.message}" for e in events
        )

    pod = wait_for(pod_events, scheduled_pod)
    assert pod.spec.security_context.run_as_non_root is True
    assert pod.spec.containers[0].security_context.read_only_root_filesystem is True


def render(*parts: str, tmp_path: Path) -> list[dict[str, Any]]:
    """``kubectl kustomize`` of an overlay made of ``parts`` (kustomizations or components)."""
    relative = os.path.relpath(DEPLOY, tmp_path)
    resources = [f"{relative}/{part}" for part in parts if not part.startswith("components/")]
    components = [f"{relative}/{part}" for part in parts if part.startswith("components/")]
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump({"resources": resources, "components": components})
    )
    built = subprocess.run(
        [str(kubectl_path()), "kustomize", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return [document for document in yaml.safe_load_all(built.stdout) if document]


def test_the_kubernetes_overlay_grants_no_kueue_rights(tmp_path: Path) -> None:
    objects = render("overlays/kubernetes", tmp_path=tmp_path)
    rules = [rule for obj in objects if obj["kind"] == "ClusterRole" for rule in obj["rules"]]
    assert rules, "the kubernetes overlay has no ClusterRole"
    assert all("kueue.x-k8s.io" not in rule["apiGroups"] for rule in rules)
    config = next(obj for obj in objects if obj["kind"] == "ConfigMap")
    assert config["data"]["kind"] == "kubernetes"


def test_the_persistent_journal_component_puts_the_journal_on_a_claim(tmp_path: Path) -> None:
    objects = render("overlays/kueue", "components/persistent-journal", tmp_path=tmp_path)
    claim = next(obj for obj in objects if obj["kind"] == "PersistentVolumeClaim")
    deployment = next(obj for obj in objects if obj["kind"] == "Deployment")
    volumes = {
        volume["name"]: volume for volume in deployment["spec"]["template"]["spec"]["volumes"]
    }
    assert volumes["journal"]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    mounts = {mount["name"]: mount["mountPath"] for mount in container["volumeMounts"]}
    state_dir = next(
        e["value"] for e in container["env"] if e["name"] == "SHAPER_CONNECTOR_STATE_DIR"
    )
    assert state_dir.startswith(mounts["journal"] + "/")


def test_the_federation_target_component_adds_only_creating_jobs(tmp_path: Path) -> None:
    """A cluster that takes jobs moved in from its federation group creates them
    (connectors/kubernetes/moves.py); the base role, checked above, still may not."""
    (tmp_path / "plain").mkdir()
    (tmp_path / "target").mkdir()
    plain = render("overlays/kueue", tmp_path=tmp_path / "plain")
    target = render("overlays/kueue", "components/federation-target", tmp_path=tmp_path / "target")
    added = [obj for obj in target if obj not in plain]
    role = next(obj for obj in added if obj["kind"] == "ClusterRole")
    assert role["rules"] == [{"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create"]}]
    binding = next(obj for obj in added if obj["kind"] == "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "shaper-connector", "namespace": NAMESPACE}
    ]
    assert {obj["kind"] for obj in added} == {"ClusterRole", "ClusterRoleBinding"}


def test_the_node_drain_component_adds_only_patching_nodes(tmp_path: Path) -> None:
    """An operator's drain cordons the node (connectors/kubernetes/capabilities.py); the
    base role, checked above, may only read nodes."""
    (tmp_path / "plain").mkdir()
    (tmp_path / "drain").mkdir()
    plain = render("overlays/kueue", tmp_path=tmp_path / "plain")
    drain = render("overlays/kueue", "components/node-drain", tmp_path=tmp_path / "drain")
    added = [obj for obj in drain if obj not in plain]
    role = next(obj for obj in added if obj["kind"] == "ClusterRole")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"]}]
    binding = next(obj for obj in added if obj["kind"] == "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "shaper-connector", "namespace": NAMESPACE}
    ]
    assert {obj["kind"] for obj in added} == {"ClusterRole", "ClusterRoleBinding"}


def test_the_pod_placement_component_adds_patching_pods_within_its_policy(
    tmp_path: Path,
) -> None:
    """Each pod of an elastic Job on its planned node (connectors/kubernetes/pod_placement.py)
    and a Deployment's replicas moved off named nodes (connectors/kubernetes/actions.py
    resize_deployment_off): the right to patch pods, the admission policy that holds it to
    lifting the connector's gate or setting a ReplicaSet's pod's deletion cost
    (tests/k8s/test_kubernetes_pod_placement.py and test_kubernetes_replica_moves.py run
    it), and the connector told to use it."""
    (tmp_path / "plain").mkdir()
    (tmp_path / "placing").mkdir()
    plain = render("overlays/kubernetes", tmp_path=tmp_path / "plain")
    placing = render(
        "overlays/kubernetes", "components/pod-placement", tmp_path=tmp_path / "placing"
    )
    added = [obj for obj in placing if obj not in plain]
    role = next(obj for obj in added if obj["kind"] == "ClusterRole")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]}]
    binding = next(obj for obj in added if obj["kind"] == "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "shaper-connector", "namespace": NAMESPACE}
    ]
    policy = next(obj for obj in added if obj["kind"] == "ValidatingAdmissionPolicy")
    assert "':shaper-connector'" in policy["spec"]["matchConditions"][0]["expression"]
    assert policy["spec"]["failurePolicy"] == "Fail"
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["pods"] and rule["operations"] == ["UPDATE"]
    # The two kinds of update it allows, and whose pods a deletion cost may go on.
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    assert variables["gate"] == "'shaper.io/placement'"
    assert variables["cost"] == "'controller.kubernetes.io/pod-deletion-cost'"
    assert "'ReplicaSet'" in variables["ofAReplicaSet"]
    validations = [v["expression"] for v in policy["spec"]["validations"]]
    assert validations[0] == "variables.lift || variables.deletionCost"
    policy_binding = next(obj for obj in added if obj["kind"] == "ValidatingAdmissionPolicyBinding")
    assert policy_binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert policy_binding["spec"]["validationActions"] == ["Deny"]
    (deployment,) = [obj for obj in added if obj["kind"] == "Deployment"]
    assert (
        "--set=pod_placement=true"
        in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    )
    assert {obj["kind"] for obj in added} == {
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "Deployment",
    }
