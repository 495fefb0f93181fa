"""A Deployment's replicas moved off named nodes (connectors.kubernetes.capabilities
``resize_off``, connectors.kubernetes.actions ``resize_deployment_off``) on the tests' real
control plane: the connector marks the pods leaving each node with the lowest
pod-deletion-cost and scales the Deployment, and the ReplicaSet controller deletes those.
And the admission policy of deploy/kubernetes/components/pod-placement that lets the
connector's ServiceAccount set that annotation, alone, on a ReplicaSet's pod, besides
lifting its gate.

The connector runs as its ServiceAccount (impersonated by the admin) with the base role and
the component applied, as a site's overlay does (tests/k8s/test_kubernetes_pod_placement.py
has the fixtures); everything is deleted after each test."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from connectors.base import ConnectorError, SupportsReplicaMoves
from connectors.kubernetes import pod_gates
from connectors.kubernetes.actions import DELETION_COST, MOVE_COST
from connectors.kubernetes.connector import KubernetesConnector
from connectors.kubernetes.pod_placement import PLACEMENT_GATE, ungate_patch
from tests.k8s import test_kubernetes_pod_placement as placement
from tests.k8s.conftest import Kube, wait_for
from tests.k8s.objects import bare_pod, gpu_job, gpu_pods_anywhere, inference_deployment
from tests.k8s.test_kubernetes_steps import Steps, held_gpus, kwok_nodes
from wire.telemetry import JobReport

pytestmark = pytest.mark.slow

# The fixtures of the pod placement tests: the component applied, the connector's client.
apply = placement.apply
as_connector = placement.as_connector
COMPONENT = [*placement.BASE, *placement.RIGHTS, *placement.POLICY]
MERGE_PATCH = "application/merge-patch+json"
POLICY_NAME = "ValidatingAdmissionPolicy 'shaper-pod-placement'"
COST_PATH = DELETION_COST.replace("/", "~1")  # as a JSON pointer spells it


# A connector of the test's namespace with ``pod_placement``, as deployed with the
# component, and the executor of its steps (the pod placement tests' fixture).
placing = placement.placing


def spread_service(name: str, *, replicas: int) -> client.V1Deployment:
    """An elastic service of one-GPU replicas, one on each kwok node (as many as there are
    nodes: a topology spread of skew 1 over the kwok nodes, which it is kept to)."""
    service = inference_deployment(name, replicas=replicas, max_replicas=replicas)
    spec = service.spec.template.spec
    spec.node_selector = {"type": "kwok"}
    spec.termination_grace_period_seconds = 1
    spec.topology_spread_constraints = [
        client.V1TopologySpreadConstraint(
            max_skew=1,
            topology_key="kubernetes.io/hostname",
            when_unsatisfiable="DoNotSchedule",
            label_selector=client.V1LabelSelector(match_labels={"app": name}),
        )
    ]
    return service


def placed(kube: Kube, name: str) -> dict[str, str]:
    """Pod → node of the service's running pods, not being deleted."""
    pods = kube.core.list_namespaced_pod(kube.namespace, label_selector=f"app={name}").items
    return {
        p.metadata.name: p.spec.node_name
        for p in pods
        if p.spec.node_name and p.status.phase == "Running" and not p.metadata.deletion_timestamp
    }


def ready_pods(kube: Kube, name: str, want: int) -> dict[str, str] | None:
    """:func:`placed` once the service has ``want`` ready replicas and no other pod."""
    status = kube.apps.read_namespaced_deployment(name, kube.namespace).status
    pods = kube.core.list_namespaced_pod(kube.namespace, label_selector=f"app={name}").items
    settled = (status.ready_replicas or 0) == want and len(pods) == want
    return placed(kube, name) if settled and len(placed(kube, name)) == want else None


def test_a_deployment_shrinks_off_the_nodes_the_plan_names(
    kube: Kube, placing: tuple[KubernetesConnector, Steps]
) -> None:
    connector, steps = placing
    assert isinstance(connector, SupportsReplicaMoves)
    a, b, c = kwok_nodes(kube)
    wait_for("the cluster's GPUs free", lambda: not gpu_pods_anywhere(kube))
    kube.apps.create_namespaced_deployment(kube.namespace, spread_service("llm", replicas=3))
    before = wait_for("llm's 3 replicas, one a node", lambda: ready_pods(kube, "llm", 3))
    assert sorted(before.values()) == [a, b, c]
    service = f"{kube.namespace}/deployment/llm"

    def reported() -> JobReport | None:
        found = [j for j in connector.read_state().jobs if j.external_id == service]
        return found[0] if found and held_gpus(found[0]) == 3 else None

    assert wait_for("llm's report, holding 3 GPUs", reported).replicas_movable

    # 3 → 2, the replica on a leaving: the two others stay where they are.
    connector.resize_off(service, replicas=2, leave={a: 1})
    assert kube.apps.read_namespaced_deployment("llm", kube.namespace).spec.replicas == 2
    left = {pod: node for pod, node in before.items() if node != a}
    assert placed(kube, "llm") == left  # resize_off returned once the pod on a was deleted
    assert all(
        DELETION_COST not in (p.metadata.annotations or {})
        for p in kube.core.list_namespaced_pod(kube.namespace, label_selector="app=llm").items
    )

    # A resent step finds it done and changes nothing.
    connector.resize_off(service, replicas=2, leave={a: 1})
    assert wait_for("llm at 2", lambda: ready_pods(kube, "llm", 2)) == left

    # A node without a replica of it: refused for good, nothing changed.
    with pytest.raises(ConnectorError) as refused:
        connector.resize_off(service, replicas=1, leave={a: 1})
    assert not refused.value.retryable
    assert f"node {a} runs 0 of its replicas, not 1" in str(refused.value)
    assert kube.apps.read_namespaced_deployment("llm", kube.namespace).spec.replicas == 2

    # 2 → 1 off c, as the saga sends it (a resize step with args.leave, through the
    # connector's executor): the replica on b stays (the ReplicaSet's own choice is not asked).
    report = steps.run("resize", service, replicas=1, leave={c: 1})
    assert report.ok, report.error
    assert report.result["leave"] == {c: 1} and f"off {c} (1)" in report.result["summary"]
    last = {pod: node for pod, node in left.items() if node == b}
    assert placed(kube, "llm") == last

    # A delivery cut short after its scale (the pod marked, the Deployment scaled, the wait
    # not done): its resend waits on the marked pod and leaves the rest.
    kube.apps.patch_namespaced_deployment_scale("llm", kube.namespace, {"spec": {"replicas": 2}})
    again = wait_for("llm back at 2", lambda: ready_pods(kube, "llm", 2))
    ((new, there),) = [(pod, node) for pod, node in again.items() if pod not in last]
    kube.core.patch_namespaced_pod(
        new, kube.namespace, {"metadata": {"annotations": {DELETION_COST: MOVE_COST}}}
    )
    kube.apps.patch_namespaced_deployment_scale("llm", kube.namespace, {"spec": {"replicas": 1}})
    connector.resize_off(service, replicas=1, leave={there: 1})
    assert placed(kube, "llm") == last
    assert new not in {
        p.metadata.name
        for p in kube.core.list_namespaced_pod(kube.namespace, label_selector="app=llm").items
    }

    # A StatefulSet drops its highest ordinals: nobody chooses which replicas leave.
    with pytest.raises(ConnectorError, match="StatefulSet drops its highest ordinals") as no:
        connector.resize_off(f"{kube.namespace}/statefulset/db", replicas=1, leave={a: 1})
    assert not no.value.retryable


def test_a_pod_the_move_no_longer_takes_gets_the_sites_own_deletion_cost_back(
    kube: Kube, placing: tuple[KubernetesConnector, Steps]
) -> None:
    """A site that ranks its replicas by their pod-deletion-cost (set in the pod template)
    keeps that ranking: a pod an earlier delivery marked, and which the step no longer
    takes, gets the template's cost back, not none."""
    connector, _ = placing
    a, b, _c = kwok_nodes(kube)
    wait_for("the cluster's GPUs free", lambda: not gpu_pods_anywhere(kube))
    service = spread_service("ranked", replicas=3)
    service.spec.template.metadata.annotations = {DELETION_COST: "100"}
    kube.apps.create_namespaced_deployment(kube.namespace, service)
    before = wait_for("ranked's 3 replicas, one a node", lambda: ready_pods(kube, "ranked", 3))
    on_a = next(pod for pod, node in before.items() if node == a)
    # An earlier delivery's mark, on a node this step does not name.
    kube.core.patch_namespaced_pod(
        on_a, kube.namespace, {"metadata": {"annotations": {DELETION_COST: MOVE_COST}}}
    )
    connector.resize_off(f"{kube.namespace}/deployment/ranked", replicas=2, leave={b: 1})
    assert placed(kube, "ranked") == {pod: node for pod, node in before.items() if node != b}
    costs = {
        p.metadata.name: (p.metadata.annotations or {}).get(DELETION_COST)
        for p in kube.core.list_namespaced_pod(kube.namespace, label_selector="app=ranked").items
        if not p.metadata.deletion_timestamp
    }
    assert costs[on_a] == "100" and set(costs.values()) == {"100"}


# Holds a deleted pod in the API, stopping, as a long grace period does (kwok's pods stop
# at once otherwise).
HOLD = "shaper.test/hold"


def test_a_shrink_returns_while_its_replica_stops_and_the_confirm_waits_for_its_gpu(
    kube: Kube, placing: tuple[KubernetesConnector, Steps]
) -> None:
    """An inference server may take minutes to stop (its grace period drains requests).
    The step returns once the ReplicaSet is deleting the pod leaving, and the confirm that
    follows answers "not yet" while that pod still holds its GPU, and passes once it is
    gone. The step used to wait for the pod to be gone: a minute a try, then it failed
    the move after its retries."""
    connector, steps = placing
    a, _b, _c = kwok_nodes(kube)
    wait_for("the cluster's GPUs free", lambda: not gpu_pods_anywhere(kube))
    service = spread_service("draining", replicas=3)
    service.spec.template.metadata.finalizers = [HOLD]
    kube.apps.create_namespaced_deployment(kube.namespace, service)
    try:
        before = wait_for("3 replicas, one a node", lambda: ready_pods(kube, "draining", 3))
        on_a = next(pod for pod, node in before.items() if node == a)
        name = f"{kube.namespace}/deployment/draining"
        wait_for(
            "its report", lambda: [j for j in connector.read_state().jobs if j.external_id == name]
        )

        connector.resize_off(name, replicas=2, leave={a: 1})
        stopping = kube.core.read_namespaced_pod(on_a, kube.namespace)
        assert stopping.metadata.deletion_timestamp is not None  # deleted, still stopping
        held = steps.run("confirm", name, expect="running", gpus_at_most={a: 0})
        assert not held.ok and held.retryable
        assert f"(GPUs {a}: 1)" in (held.error or "")

        _release(kube, on_a)
        report = steps.until_ok("confirm", name, expect="running", gpus_at_most={a: 0})
        assert f"(GPUs {a}: 0)" in report.result["summary"]
    finally:
        for pod in kube.core.list_namespaced_pod(
            kube.namespace, label_selector="app=draining"
        ).items:
            _release(kube, pod.metadata.name)


def test_a_resent_shrink_refused_for_good_takes_an_earlier_deliverys_mark_off(
    kube: Kube, placing: tuple[KubernetesConnector, Steps]
) -> None:
    """A first delivery marked the pod leaving a and was cut short before its scale; the
    Deployment then changed so that the resend is refused for good (here: two replicas
    to move, one to remove). The mark it left must not stay, or the next scale-down by
    anyone deletes that pod first."""
    connector, _ = placing
    a, b, _c = kwok_nodes(kube)
    wait_for("the cluster's GPUs free", lambda: not gpu_pods_anywhere(kube))
    kube.apps.create_namespaced_deployment(kube.namespace, spread_service("marked", replicas=3))
    before = wait_for("3 replicas, one a node", lambda: ready_pods(kube, "marked", 3))
    on_a = next(pod for pod, node in before.items() if node == a)
    kube.core.patch_namespaced_pod(
        on_a, kube.namespace, {"metadata": {"annotations": {DELETION_COST: MOVE_COST}}}
    )
    with pytest.raises(ConnectorError) as refused:
        connector.resize_off(f"{kube.namespace}/deployment/marked", replicas=2, leave={a: 1, b: 1})
    assert not refused.value.retryable
    annotations = kube.core.read_namespaced_pod(on_a, kube.namespace).metadata.annotations
    assert DELETION_COST not in (annotations or {})
    assert kube.apps.read_namespaced_deployment("marked", kube.namespace).spec.replicas == 3


def test_a_shrink_waits_for_a_replica_that_stays_to_finish_starting(
    kube: Kube, placing: tuple[KubernetesConnector, Steps]
) -> None:
    """A replica on a node that stays is still starting (a model server warming up; here
    kwok starts it after a delay): the ReplicaSet would delete it before the chosen one,
    so the step cannot go yet. It waits for it within the step, as it waits for the pods
    to be deleted; it answered "not yet" at once, which the saga asks again only three
    times in about five seconds, so the move of a service warming up failed."""
    connector, _ = placing
    a, b, _c = kwok_nodes(kube)
    wait_for("the cluster's GPUs free", lambda: not gpu_pods_anywhere(kube))
    service = spread_service("warming", replicas=3)
    service.spec.template.metadata.annotations = {"pod-ready.stage.kwok.x-k8s.io/delay": "4s"}
    kube.apps.create_namespaced_deployment(kube.namespace, service)
    before = wait_for("3 replicas, one a node", lambda: ready_pods(kube, "warming", 3))
    on_b = next(pod for pod, node in before.items() if node == b)
    kube.core.delete_namespaced_pod(on_b, kube.namespace, grace_period_seconds=0)

    def starting_on_b() -> str | None:
        pods = kube.core.list_namespaced_pod(kube.namespace, label_selector="app=warming")
        new = [
            p.metadata.name
            for p in pods.items
            if p.spec.node_name == b and p.metadata.name not in before
        ]
        return new[0] if new else None

    again = wait_for("its replacement placed on b, starting", starting_on_b)
    connector.resize_off(f"{kube.namespace}/deployment/warming", replicas=2, leave={a: 1})
    after = wait_for("warming at 2", lambda: ready_pods(kube, "warming", 2))
    assert sorted(after.values()) == sorted(n for n in before.values() if n != a)
    assert again in after  # the replica that was starting stays; a's left


def _release(kube: Kube, pod: str) -> None:
    """Take the test's finalizer off a pod (gone already: nothing to do)."""
    try:
        kube.core.patch_namespaced_pod(pod, kube.namespace, {"metadata": {"finalizers": None}})
    except ApiException as error:
        if error.status != 404:
            raise


def _merge(api: client.ApiClient, kube: Kube, pod: str, body: dict[str, Any]) -> None:
    client.CoreV1Api(api).patch_namespaced_pod(pod, kube.namespace, body, _content_type=MERGE_PATCH)


def _json_patch(api: client.ApiClient, kube: Kube, pod: str, patch: list[Any]) -> None:
    client.CoreV1Api(api).patch_namespaced_pod(
        pod, kube.namespace, patch, _content_type=placement.JSON_PATCH
    )


def _refused(api: client.ApiClient, kube: Kube, pod: str, body: dict[str, Any]) -> str:
    """The policy's message for a merge patch it refuses."""
    with pytest.raises(ApiException) as refused:
        _merge(api, kube, pod, body)
    assert refused.value.status == 403, refused.value.body
    message = str(refused.value.body)
    assert POLICY_NAME in message, message
    return message


def _cost(value: str | None, **more: Any) -> dict[str, Any]:
    return {"metadata": {"annotations": {DELETION_COST: value}, **more}}


def _only_pod(kube: Kube, selector: str) -> str:
    def found() -> str | None:
        pods = kube.core.list_namespaced_pod(kube.namespace, label_selector=selector).items
        return pods[0].metadata.name if len(pods) == 1 else None

    name: str = wait_for(f"the pod of {selector}", found)
    return name


def test_the_connector_may_set_a_replicasets_pods_deletion_cost_and_nothing_with_it(
    kube: Kube, as_connector: client.ApiClient, apply: Callable[[list[Path]], None]
) -> None:
    apply(COMPONENT)
    placement._policy_in_force(as_connector, kube)
    api = as_connector
    kube.apps.create_namespaced_deployment(
        kube.namespace, inference_deployment("web", replicas=1, max_replicas=1)
    )
    replica = _only_pod(kube, "app=web")

    # Set, changed and taken off: the annotation alone, on a ReplicaSet's pod.
    for value in (MOVE_COST, "7", None):
        _merge(api, kube, replica, _cost(value))
        annotations = kube.core.read_namespaced_pod(replica, kube.namespace).metadata.annotations
        assert (annotations or {}).get(DELETION_COST) == value

    # With anything else in the same update: refused.
    refusals = [  # (part of the policy's message, the change)
        ("labels, annotations", _cost("1", labels={"extra": "x"})),
        ("labels, annotations", _cost("1", annotations={DELETION_COST: "1", "note": "x"})),
    ]
    for message, change in refusals:
        assert message in _refused(api, kube, replica, change), message
    _merge(api, kube, replica, _cost("3"))
    cost_and_image = [
        {"op": "replace", "path": f"/metadata/annotations/{COST_PATH}", "value": "1"},
        {"op": "replace", "path": "/spec/containers/0/image", "value": "evil.example/x:1"},
    ]
    with pytest.raises(ApiException) as refused:
        _json_patch(api, kube, replica, cost_and_image)
    assert refused.value.status == 403 and "containers" in str(refused.value.body)
    # A change of another annotation alone is neither kind of update.
    assert "may only take its own scheduling gate" in _refused(
        api, kube, replica, {"metadata": {"annotations": {"note": "x"}}}
    )

    # Not on a pod no ReplicaSet controls: a Job's, a bare one.
    kube.batch.create_namespaced_job(kube.namespace, gpu_job("train", gpus=1))
    others = [_only_pod(kube, "job-name=train")]
    kube.core.create_namespaced_pod(kube.namespace, bare_pod("bare", gpus=1))
    others.append("bare")
    for pod in others:
        message = _refused(api, kube, pod, _cost(MOVE_COST))
        assert "only on a pod a ReplicaSet controls" in message, pod

    # A gate lift still changes no annotation, this one included.
    gated = bare_pod("gated", gpus=1)
    gated.spec.scheduling_gates = [client.V1PodSchedulingGate(name=PLACEMENT_GATE)]
    created = kube.core.create_namespaced_pod(kube.namespace, gated)
    lift = ungate_patch(kube.api.sanitize_for_serialization(created), kwok_nodes(kube)[0])
    assert lift is not None
    cost = {"op": "add", "path": f"/metadata/annotations/{COST_PATH}", "value": "1"}
    with pytest.raises(ApiException) as refused:
        _json_patch(api, kube, "gated", [*lift, cost])
    assert refused.value.status == 403 and "labels, annotations" in str(refused.value.body)
    _json_patch(api, kube, "gated", lift)  # the lift alone is taken

    # The connector's guard still finds the policy holding it (its probe is a label).
    assert pod_gates.check_guard(api, kube.namespace) is pod_gates.Guard.held
