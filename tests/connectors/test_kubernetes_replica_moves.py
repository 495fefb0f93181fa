"""Moving a Deployment's replicas off named nodes (connectors.kubernetes.capabilities
``resize_off``, connectors.kubernetes.actions ``resize_deployment_off``): the pure parts —
which pods leave, when the ReplicaSet would delete others first, the selector, the
refusals made before any request, and the ``replicas_movable`` of the reports. The
control plane's side (the ReplicaSet's choice, the admission policy) runs in
tests/k8s/test_kubernetes_replica_moves.py."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client import ApiClient

from connectors.base import ConnectorError, SupportsReplicaMoves
from connectors.kubernetes.actions import (
    DELETION_COST,
    MOVE_COST,
    _mark_leaving,
    label_selector,
    leaving_blocker,
    pick_leaving,
)
from connectors.kubernetes.config import KubernetesConnectorConfig
from connectors.kubernetes.connector import KubernetesConnector
from connectors.kubernetes.pods import (
    JobGroup,
    OwnerRef,
    TranslationContext,
    group_pods,
    job_report,
)
from tests.connectors.test_kubernetes_incremental import connector_of
from wire.telemetry import NodeState

NODES = {"n1": NodeState.up, "n2": NodeState.up}
WHAT = "resize deployment llm in ml to 2 (1 off n1)"


def replica(
    name: str,
    node: str | None,
    *,
    ready: bool = True,
    phase: str = "Running",
    cost: str | None = None,
    replica_set: str = "llm-abc",
) -> dict[str, Any]:
    """A pod of the Deployment ``llm`` (ReplicaSet ``llm-abc``) as the API server serves it."""
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": "ml",
        "uid": f"uid-{name}",
        "labels": {"app": "llm", "pod-template-hash": replica_set.rsplit("-", 1)[1]},
        "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": replica_set, "controller": True}
        ],
    }
    if cost is not None:
        metadata["annotations"] = {DELETION_COST: cost}
    spec: dict[str, Any] = {
        "containers": [{"name": "serve", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
    }
    if node:
        spec["nodeName"] = node
    condition = {"type": "Ready", "status": "True" if ready else "False"}
    return {
        "metadata": metadata,
        "spec": spec,
        "status": {"phase": phase, "conditions": [condition]},
    }


def names(pods: list[dict[str, Any]]) -> list[str]:
    return [p["metadata"]["name"] for p in pods]


def test_the_pods_leaving_a_node_are_an_earlier_deliverys_then_not_ready_then_by_name() -> None:
    pods = [
        replica("llm-a", "n1"),
        replica("llm-b", "n1", ready=False),
        replica("llm-c", "n1"),
        replica("llm-d", "n2"),
    ]
    assert names(pick_leaving(pods, {"n1": 1}, what=WHAT)) == ["llm-b"]
    assert names(pick_leaving(pods, {"n1": 2, "n2": 1}, what=WHAT)) == ["llm-b", "llm-a", "llm-d"]
    # A resent step takes the pods its first delivery marked, whatever their rank.
    pods[2] = replica("llm-c", "n1", cost=MOVE_COST)
    assert names(pick_leaving(pods, {"n1": 1}, what=WHAT)) == ["llm-c"]
    # A site's own cost is no mark of Shaper's.
    pods[2] = replica("llm-c", "n1", cost="-5")
    assert names(pick_leaving(pods, {"n1": 1}, what=WHAT)) == ["llm-b"]


def test_a_node_holding_fewer_of_its_replicas_is_refused_for_good() -> None:
    pods = [replica("llm-a", "n1"), replica("llm-b", "n2")]
    with pytest.raises(ConnectorError) as refused:
        pick_leaving(pods, {"n1": 2}, what=WHAT)
    assert not refused.value.retryable
    assert "node n1 runs 1 of its replicas, not 2" in str(refused.value)
    with pytest.raises(ConnectorError, match="node n3 runs 0"):
        pick_leaving(pods, {"n3": 1}, what=WHAT)


def test_pods_the_replicaset_deletes_first_block_the_move_unless_the_shrink_takes_them_too() -> (
    None
):
    ready = [replica("llm-a", "n1"), replica("llm-b", "n2"), replica("llm-c", "n2")]
    chosen = [ready[0]]
    assert leaving_blocker(ready, chosen, replicas=2) is None
    # A replica not placed yet goes before any placed one: the chosen one would stay.
    waiting = [*ready, replica("llm-d", None, phase="Pending")]
    blocker = leaving_blocker(waiting, chosen, replicas=3)
    assert blocker is not None and "llm-d" in blocker
    # ... unless the shrink removes both (4 → 2).
    assert leaving_blocker(waiting, chosen, replicas=2) is None
    # Not ready, or pending on its node, counts the same; a chosen one not ready does not.
    for other in (replica("llm-d", "n2", ready=False), replica("llm-d", "n2", phase="Pending")):
        assert leaving_blocker([*ready, other], chosen, replicas=3) is not None
    slow = replica("llm-a", "n1", ready=False)
    assert leaving_blocker([slow, *ready[1:]], [slow], replicas=2) is None


def test_a_shrink_that_would_also_remove_running_replicas_the_plan_keeps_is_refused() -> None:
    """The Deployment runs four ready replicas where the plan saw three (an autoscaler
    added one): a scale from 4 to 2 with one chosen would also remove a running replica
    of the ReplicaSet's choosing. Refused for good, before anything is marked (no API
    call is made: the client is None)."""
    pods = [replica(f"llm-{i}", f"n{i}") for i in range(1, 5)]
    with pytest.raises(ConnectorError) as refused:
        _mark_leaving(None, "ml", pods, {"n2": 1}, desired=4, replicas=2, what=WHAT, own=None)  # type: ignore[arg-type]
    assert not refused.value.retryable
    assert "runs 4 replica(s), more than the plan saw" in str(refused.value)


def test_a_label_selector_is_spelled_as_the_query_parameter() -> None:
    selector = {
        "matchLabels": {"app": "llm", "tier": "gpu"},
        "matchExpressions": [
            {"key": "zone", "operator": "In", "values": ["a", "b"]},
            {"key": "canary", "operator": "NotIn", "values": ["yes"]},
            {"key": "serving", "operator": "Exists"},
            {"key": "legacy", "operator": "DoesNotExist"},
        ],
    }
    assert label_selector(selector) == (
        "app=llm,tier=gpu,zone in (a,b),canary notin (yes),serving,!legacy"
    )
    assert label_selector(None) == ""


def bare(**options: Any) -> KubernetesConnector:
    """A connector that never reaches an API server (its refusals come first)."""
    config = KubernetesConnectorConfig(cluster="c", **options)
    return KubernetesConnector(config, api=ApiClient(), start=False)


def test_the_connectors_can_move_replicas_but_only_a_deployments_with_pod_placement() -> None:
    connector = bare(pod_placement=True)
    assert isinstance(connector, SupportsReplicaMoves)
    assert isinstance(connector_of("kueue"), SupportsReplicaMoves)
    refusals = {  # external id → what the refusal says
        "ml/statefulset/db": "a StatefulSet drops its highest ordinals",
        "ml/job/train": "only a Deployment's replicas",
        "ml/pod/p": "only a Deployment's replicas",
    }
    for external_id, why in refusals.items():
        with pytest.raises(ConnectorError) as refused:
            connector.resize_off(external_id, replicas=1, leave={"n1": 1})
        assert not refused.value.retryable and why in str(refused.value), external_id
    with pytest.raises(ConnectorError) as refused:
        bare().resize_off("ml/deployment/llm", replicas=1, leave={"n1": 1})
    assert not refused.value.retryable and "pod_placement" in str(refused.value)


def deployment(
    name: str = "llm", kind: str = "Deployment", *, elastic: bool = True
) -> dict[str, Any]:
    """A Deployment (or StatefulSet) of two replicas, declared elastic up to four."""
    template = {"spec": replica("t", None)["spec"]}
    annotations = {"shaper.io/max-replicas": "4"} if elastic else {}
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": {
            "name": name,
            "namespace": "ml",
            "uid": f"uid-{name}",
            "annotations": annotations,
        },
        "spec": {"replicas": 2, "template": template},
    }


@pytest.mark.parametrize(
    ("kind", "replica_moves", "elastic", "movable"),
    [
        ("Deployment", True, True, True),
        ("Deployment", False, True, False),
        # Nobody declared it elastic: a move, which shrinks it first, is not Shaper's to make.
        ("Deployment", True, False, False),
        ("StatefulSet", True, True, False),
    ],
)
def test_a_deployments_replicas_are_movable_with_the_connectors_pod_placement(
    kind: str, replica_moves: bool, elastic: bool, movable: bool
) -> None:
    pods = [replica("llm-abc-1", "n1"), replica("llm-abc-2", "n2")]
    if kind == "StatefulSet":
        for pod in pods:
            pod["metadata"]["ownerReferences"][0].update(kind="StatefulSet", name="llm")
    groups = group_pods(pods, {kind: [deployment(kind=kind, elastic=elastic)]})
    context = TranslationContext(node_states=NODES, replica_moves=replica_moves)
    report = job_report(groups[f"ml/{kind.lower()}/llm"], context)
    assert report is not None and report.replicas == 2
    assert report.replicas_movable is movable


def test_a_job_is_never_movable() -> None:
    job = {
        "metadata": {"name": "train", "namespace": "ml"},
        "spec": {
            "parallelism": 1,
            "completions": 1,
            "template": {"spec": replica("t", None)["spec"]},
        },
    }
    context = TranslationContext(node_states=NODES, replica_moves=True)
    report = job_report(JobGroup(OwnerRef("Job", "ml", "train"), job), context)
    assert report is not None and not report.replicas_movable


@pytest.mark.parametrize("kind", ["kubernetes", "kueue"])
@pytest.mark.parametrize("pod_placement", [True, False])
def test_read_state_says_so_as_the_whole_translation_does(kind: str, pod_placement: bool) -> None:
    """The incremental reports (connectors.kubernetes.incremental) and a whole translation
    take ``replica_moves`` from the same option."""
    connector = connector_of(kind, pod_placement=pod_placement)
    connector.informers["deployments"]._apply({"type": "ADDED", "object": deployment()})
    for pod in (replica("llm-abc-1", "n1"), replica("llm-abc-2", "n2")):
        connector.informers["pods"]._apply({"type": "ADDED", "object": pod})
    state = connector.read_state()
    (report,) = [job for job in state.jobs if job.external_id == "ml/deployment/llm"]
    assert report.replicas_movable is pod_placement
    assert state == connector.rebuild_state()
