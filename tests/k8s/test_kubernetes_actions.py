"""connectors.kubernetes.actions against the real control plane of the tests (see conftest):
each action's effect as the API server, the controllers and the scheduler carry it out on
kwok nodes, its idempotent retry, and the refusals (404, 403, PodDisruptionBudget, a pod
that would lose its work)."""

from __future__ import annotations

import pytest
from kubernetes import client

from connectors.base import ConnectorError
from connectors.kubernetes import actions
from tests.k8s.conftest import Kube, wait_for
from tests.k8s.objects import bare_pod, gpu_job, resolved_env, running_pods

pytestmark = pytest.mark.slow


def kwok_nodes(kube: Kube) -> list[str]:
    return sorted(n.metadata.name for n in kube.core.list_node(label_selector="type=kwok").items)


def web_template(app: str) -> client.V1PodTemplateSpec:
    resources = {"cpu": "100m", "memory": "64Mi"}
    return client.V1PodTemplateSpec(
        metadata=client.V1ObjectMeta(labels={"app": app}),
        spec=client.V1PodSpec(
            containers=[
                client.V1Container(
                    name="serve",
                    image="registry.example/serve:1",
                    resources=client.V1ResourceRequirements(requests=resources),
                )
            ]
        ),
    )


def deployment(name: str, replicas: int) -> client.V1Deployment:
    return client.V1Deployment(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1DeploymentSpec(
            replicas=replicas,
            selector=client.V1LabelSelector(match_labels={"app": name}),
            template=web_template(name),
        ),
    )


def ready_replicas(kube: Kube, name: str, want: int) -> bool:
    status = client.AppsV1Api(kube.api).read_namespaced_deployment(name, kube.namespace).status
    return (status.ready_replicas or 0) == want and (status.replicas or 0) == want


def pod_on(kube: Kube, name: str) -> client.V1Pod | None:
    try:
        pod = kube.core.read_namespaced_pod(name, kube.namespace)
    except client.ApiException as error:
        if error.status == 404:
            return None
        raise
    running = pod.status.phase == "Running" and pod.metadata.deletion_timestamp is None
    return pod if running else None


def test_scale_sets_replicas_through_the_scale_subresource(kube: Kube) -> None:
    apps = client.AppsV1Api(kube.api)
    apps.create_namespaced_deployment(kube.namespace, deployment("infer", 1))
    wait_for("infer to have 1 ready replica", lambda: ready_replicas(kube, "infer", 1))

    for _ in range(2):  # the second call is a retry: nothing changes
        actions.scale(
            kube.api, namespace=kube.namespace, kind="deployment", name="infer", replicas=3
        )
    wait_for("infer to scale up to 3", lambda: ready_replicas(kube, "infer", 3))
    actions.scale(kube.api, namespace=kube.namespace, kind="deployment", name="infer", replicas=1)
    wait_for("infer to scale down to 1", lambda: ready_replicas(kube, "infer", 1))
    assert apps.read_namespaced_deployment("infer", kube.namespace).spec.replicas == 1

    apps.create_namespaced_stateful_set(
        kube.namespace,
        client.V1StatefulSet(
            metadata=client.V1ObjectMeta(name="cache"),
            spec=client.V1StatefulSetSpec(
                replicas=1,
                service_name="cache",
                selector=client.V1LabelSelector(match_labels={"app": "cache"}),
                template=web_template("cache"),
            ),
        ),
    )
    actions.scale(kube.api, namespace=kube.namespace, kind="statefulset", name="cache", replicas=2)
    wait_for(
        "cache to have 2 ready replicas",
        lambda: (
            apps.read_namespaced_stateful_set("cache", kube.namespace).status.ready_replicas == 2
        ),
    )

    with pytest.raises(ConnectorError) as missing:
        actions.scale(
            kube.api, namespace=kube.namespace, kind="deployment", name="nope", replicas=2
        )
    assert not missing.value.retryable
    assert "patch deployments/scale nope" in str(missing.value) and "404" in str(missing.value)


def test_evict_respects_the_disruption_budget_and_is_done_once_the_pod_is_gone(
    kube: Kube,
) -> None:
    client.AppsV1Api(kube.api).create_namespaced_deployment(kube.namespace, deployment("web", 2))
    wait_for("web to have 2 ready replicas", lambda: ready_replicas(kube, "web", 2))
    policy = client.PolicyV1Api(kube.api)
    policy.create_namespaced_pod_disruption_budget(
        kube.namespace,
        client.V1PodDisruptionBudget(
            metadata=client.V1ObjectMeta(name="web"),
            spec=client.V1PodDisruptionBudgetSpec(
                min_available=2, selector=client.V1LabelSelector(match_labels={"app": "web"})
            ),
        ),
    )
    wait_for(
        "the disruption controller to count web's healthy pods",
        lambda: (
            policy.read_namespaced_pod_disruption_budget(
                "web", kube.namespace
            ).status.current_healthy
            == 2
        ),
    )
    victim = kube.core.list_namespaced_pod(kube.namespace, label_selector="app=web").items[0]
    name, uid = victim.metadata.name, victim.metadata.uid

    with pytest.raises(ConnectorError) as refused:
        actions.evict(kube.api, namespace=kube.namespace, pod=name)
    assert refused.value.retryable, "a budget passes once another replica is ready"
    assert "disruption budget" in str(refused.value)
    assert f"create pods/eviction {name}" in str(refused.value)
    assert pod_on(kube, name) is not None

    policy.patch_namespaced_pod_disruption_budget(
        "web", kube.namespace, {"spec": {"minAvailable": 1}}
    )
    wait_for(
        "the budget to allow one disruption",
        lambda: (
            policy.read_namespaced_pod_disruption_budget(
                "web", kube.namespace
            ).status.disruptions_allowed
            == 1
        ),
    )
    actions.evict(kube.api, namespace=kube.namespace, pod=name, uid=uid)
    wait_for(f"{name} to be evicted", lambda: pod_on(kube, name) is None)
    # Retries: the pod is gone (404), or a pod of that name is another incarnation (uid).
    actions.evict(kube.api, namespace=kube.namespace, pod=name, uid=uid)
    actions.evict(kube.api, namespace=kube.namespace, pod="never-existed")
    # The Deployment replaced it; the budget holds again for the replacement.
    wait_for("web to have 2 ready replicas again", lambda: ready_replicas(kube, "web", 2))


def test_cordon_and_uncordon_are_idempotent(kube: Kube) -> None:
    node = kwok_nodes(kube)[-1]
    try:
        for _ in range(2):
            actions.cordon(kube.api, node=node)
        assert kube.core.read_node(node).spec.unschedulable is True
        # The scheduler leaves a cordoned node alone: a pod that can run only there waits.
        kube.core.create_namespaced_pod(kube.namespace, bare_pod("probe", gpus=1, node=node))
        wait_for(
            "the probe pod to be reported unschedulable",
            lambda: any(
                c.type == "PodScheduled" and c.reason == "Unschedulable"
                for c in kube.core.read_namespaced_pod("probe", kube.namespace).status.conditions
                or []
            ),
        )
    finally:
        for _ in range(2):
            actions.uncordon(kube.api, node=node)
    assert not kube.core.read_node(node).spec.unschedulable
    wait_for("the probe pod to run once uncordoned", lambda: pod_on(kube, "probe"))

    with pytest.raises(ConnectorError) as missing:
        actions.cordon(kube.api, node="no-such-node")
    assert not missing.value.retryable and "patch nodes no-such-node" in str(missing.value)


def test_an_identity_without_the_rbac_rule_is_refused_naming_verb_and_resource(
    kube: Kube,
) -> None:
    kube.core.create_namespaced_service_account(
        kube.namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="nobody"))
    )
    token = kube.core.create_namespaced_service_account_token(
        "nobody", kube.namespace, client.AuthenticationV1TokenRequest(spec={"audiences": []})
    ).status.token
    configuration = client.Configuration()
    configuration.host = kube.api.configuration.host
    configuration.ssl_ca_cert = kube.api.configuration.ssl_ca_cert
    configuration.api_key = {"authorization": f"Bearer {token}"}
    with client.ApiClient(configuration) as nobody:
        with pytest.raises(ConnectorError) as forbidden:
            actions.cordon(nobody, node=kwok_nodes(kube)[0])
    assert not forbidden.value.retryable
    assert "patch nodes" in str(forbidden.value) and "403" in str(forbidden.value)
    assert "RBAC" in str(forbidden.value)


def test_recreate_job_pinned_moves_a_jobs_pods_through_suspension(kube: Kube) -> None:
    kube.batch.create_namespaced_job(kube.namespace, gpu_job("train", gpus=2))
    (before,) = wait_for("train's pod to run", lambda: running_pods(kube, "train"))
    target = next(n for n in kwok_nodes(kube) if n != before.spec.node_name)

    actions.recreate_job_pinned(
        kube.api,
        namespace=kube.namespace,
        job="train",
        nodes=[target],
        resume_from="ckpt://train/3",
    )
    (after,) = wait_for(
        f"train's new pod to run on {target}",
        lambda: [p for p in running_pods(kube, "train") if p.spec.node_name == target],
    )
    assert after.metadata.uid != before.metadata.uid
    assert resolved_env(after, "SHAPER_RESUME_FROM") == "ckpt://train/3"
    job = kube.batch.read_namespaced_job("train", kube.namespace)
    assert job.spec.suspend is False

    # A retry finds it pinned there with that pointer and running, and leaves its pod alone.
    actions.recreate_job_pinned(
        kube.api,
        namespace=kube.namespace,
        job="train",
        nodes=[target],
        resume_from="ckpt://train/3",
    )
    assert [p.metadata.uid for p in running_pods(kube, "train")] == [after.metadata.uid]

    # A Job whose containers do not read the pointer would restart from scratch: refused.
    kube.batch.create_namespaced_job(kube.namespace, gpu_job("plain", gpus=1, resume_env=False))
    (plain,) = wait_for("plain's pod to run", lambda: running_pods(kube, "plain"))
    with pytest.raises(ConnectorError) as refused:
        actions.recreate_job_pinned(
            kube.api,
            namespace=kube.namespace,
            job="plain",
            nodes=[target],
            resume_from="ckpt://plain/1",
        )
    assert not refused.value.retryable and "SHAPER_RESUME_FROM" in str(refused.value)
    assert kube.batch.read_namespaced_job("plain", kube.namespace).spec.suspend is not True
    assert [p.metadata.uid for p in running_pods(kube, "plain")] == [plain.metadata.uid]

    # Held (suspended, no pod left) it has nothing to lose: a plan's start pins and resumes it.
    actions.suspend_job(kube.api, namespace=kube.namespace, job="plain")
    wait_for("plain's pod to go", lambda: not kube.pods_of_job("plain"))
    actions.recreate_job_pinned(
        kube.api, namespace=kube.namespace, job="plain", nodes=[target], resume_from=None
    )
    wait_for(
        f"plain to run on {target}",
        lambda: [p for p in running_pods(kube, "plain") if p.spec.node_name == target],
    )


def test_a_job_this_call_suspended_runs_again_when_its_template_cannot_be_prepared(
    kube: Kube,
) -> None:
    kube.batch.create_namespaced_job(kube.namespace, gpu_job("big", gpus=1))
    (before,) = wait_for("big's pod to run", lambda: running_pods(kube, "big"))
    # An annotation over the API server's 256 KiB limit: the template patch is refused
    # with 422 once the Job is suspended and its pods gone.
    oversized = "ckpt://" + "x" * 300_000
    with pytest.raises(ConnectorError) as refused:
        actions.suspend_job_to_resume(
            kube.api, namespace=kube.namespace, job="big", resume_from=oversized
        )
    assert not refused.value.retryable and "422" in str(refused.value)
    assert "let run again" in str(refused.value)
    # Not left suspended for ever: the Job runs again (new pods, from the old pointer).
    assert kube.batch.read_namespaced_job("big", kube.namespace).spec.suspend is False
    wait_for(
        "big to run again",
        lambda: [p for p in running_pods(kube, "big") if p.metadata.uid != before.metadata.uid],
    )

    # A Job that was suspended already is not this call's to let run: it stays suspended.
    actions.suspend_job(kube.api, namespace=kube.namespace, job="big")
    wait_for("big's pods to go", lambda: not kube.pods_of_job("big"))
    with pytest.raises(ConnectorError):
        actions.suspend_job_to_resume(
            kube.api, namespace=kube.namespace, job="big", resume_from=oversized
        )
    assert kube.batch.read_namespaced_job("big", kube.namespace).spec.suspend is True


def test_suspend_resume_and_delete_a_plain_job(kube: Kube) -> None:
    kube.batch.create_namespaced_job(kube.namespace, gpu_job("batch", gpus=1))
    wait_for("batch's pod to run", lambda: running_pods(kube, "batch"))

    for _ in range(2):
        actions.suspend_job(kube.api, namespace=kube.namespace, job="batch")
    wait_for("batch's pods to go", lambda: not kube.pods_of_job("batch"))
    assert kube.batch.read_namespaced_job("batch", kube.namespace).spec.suspend is True

    for _ in range(2):
        actions.resume_job(kube.api, namespace=kube.namespace, job="batch")
    wait_for("batch's pod to run again", lambda: running_pods(kube, "batch"))

    for _ in range(2):
        actions.delete_job(kube.api, namespace=kube.namespace, job="batch")
    wait_for(
        "batch and its pods to be deleted",
        lambda: (
            not kube.pods_of_job("batch")
            and not kube.batch.list_namespaced_job(kube.namespace).items
        ),
    )
    with pytest.raises(ConnectorError) as missing:
        actions.suspend_job(kube.api, namespace=kube.namespace, job="batch")
    assert not missing.value.retryable and "get jobs batch" in str(missing.value)
