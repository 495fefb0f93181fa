"""Each pod of an elastic Indexed Job on the node the plan gives it, not only within the
plan's nodes.

A Job's pod template is one for every index, so pinning it (required node affinity on
``kubernetes.io/hostname``) keeps the pods within a set of nodes and lets the scheduler
stack them there as it likes: four 2-GPU pods planned as two on node a, one on b and one
on c were seen to land two and two on a and b. The plan's shape then does not hold (a
resize's confirm fails, the GPUs it counted free on c are not).

So a restart at a planned size also puts a scheduling gate (``shaper.io/placement``) on
the template and the plan's node of each index on the Job (annotation
``shaper.io/pod-nodes``, ``{"0": "a", "1": "a", "2": "b", "3": "c"}``). The Job
controller creates the pods gated; the scheduler leaves a gated pod alone. The connector
then adds ``nodeSelector: {kubernetes.io/hostname: <its node>}`` to each and removes the
gate in the same patch — the two changes Kubernetes allows on a pod that is still gated
(KEP-3838, GA in 1.30), as Kueue's topology-aware scheduling does. The restart step does
it for the pods it starts; the connector's upkeep (every telemetry cycle) for any created
later (a failed pod the Job controller replaces, a step cut short).

This module says what to write; connectors.kubernetes.actions writes it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from connectors.kubernetes.pods import HOSTNAME_LABEL

PLACEMENT_GATE = "shaper.io/placement"
POD_NODES_ANNOTATION = "shaper.io/pod-nodes"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"


def pod_nodes(replicas: int, gpus: Mapping[str, int] | None, per_pod: int) -> dict[int, str] | None:
    """Index → node for ``replicas`` pods of ``per_pod`` GPUs each, the plan's GPUs on each
    node being ``gpus``: indexes in order, nodes by name, each node taking as many as its
    GPUs hold (a node given none takes none). None — pin to the node set only — when the
    plan gives no GPUs per node, the pods ask for none, or the GPUs are not whole pods
    adding up to ``replicas``."""
    gpus = {node: count for node, count in (gpus or {}).items() if count != 0}
    if not gpus or per_pod < 1:
        return None
    if any(count < 0 or count % per_pod for count in gpus.values()):
        return None
    if sum(gpus.values()) != replicas * per_pod:
        return None
    order = [node for node in sorted(gpus) for _ in range(gpus[node] // per_pod)]
    return dict(enumerate(order))


def encode(placement: Mapping[int, str]) -> str:
    return json.dumps({str(index): node for index, node in sorted(placement.items())})


def decode(annotation: str | None) -> dict[int, str]:
    """The annotation's map; an absent or malformed one is empty (the pods are let go
    wherever the template's node set allows)."""
    if not annotation:
        return {}
    try:
        found = json.loads(annotation)
    except ValueError:
        return {}
    if not isinstance(found, dict):
        return {}
    return {
        int(index): node
        for index, node in found.items()
        if isinstance(index, str) and index.isdecimal() and isinstance(node, str) and node
    }


def template_gates(template_spec: Mapping[str, Any], *, gated: bool) -> list[dict[str, Any]]:
    """The template's scheduling gates with this module's added (``gated``) or taken off;
    the site's own gates are kept (a merge patch replaces the whole list)."""
    others = [
        dict(gate)
        for gate in template_spec.get("schedulingGates") or []
        if gate.get("name") != PLACEMENT_GATE
    ]
    return [*others, {"name": PLACEMENT_GATE}] if gated else others


def has_gate(spec: Mapping[str, Any]) -> bool:
    return any(g.get("name") == PLACEMENT_GATE for g in spec.get("schedulingGates") or [])


def pod_index(pod: Mapping[str, Any]) -> int | None:
    metadata = pod.get("metadata") or {}
    index = (metadata.get("annotations") or {}).get(COMPLETION_INDEX) or (
        metadata.get("labels") or {}
    ).get(COMPLETION_INDEX)
    return int(index) if isinstance(index, str) and index.isdecimal() else None


def ungate_patch(pod: Mapping[str, Any], node: str | None) -> list[dict[str, Any]] | None:
    """The JSON patch that lets a gated pod be scheduled on ``node`` (None: wherever its
    spec allows): the node added to its nodeSelector, the gate removed — a ``test`` first,
    so a patch written against an older copy of the pod is refused rather than removing
    another gate. None when the pod carries no gate of this module's. A pod whose
    nodeSelector names a host already keeps it (Kubernetes lets a gated pod's nodeSelector
    gain entries, not change them)."""
    spec = pod.get("spec") or {}
    gates = spec.get("schedulingGates") or []
    at = next((i for i, g in enumerate(gates) if g.get("name") == PLACEMENT_GATE), None)
    if at is None:
        return None
    patch: list[dict[str, Any]] = [
        {"op": "test", "path": f"/spec/schedulingGates/{at}/name", "value": PLACEMENT_GATE},
        {"op": "remove", "path": f"/spec/schedulingGates/{at}"},
    ]
    selector = spec.get("nodeSelector")
    if node is not None and HOSTNAME_LABEL not in (selector or {}):
        if selector is None:
            patch.append(
                {"op": "add", "path": "/spec/nodeSelector", "value": {HOSTNAME_LABEL: node}}
            )
        else:
            key = HOSTNAME_LABEL.replace("~", "~0").replace("/", "~1")
            patch.append({"op": "add", "path": f"/spec/nodeSelector/{key}", "value": node})
    return patch


def planned_node(
    pod: Mapping[str, Any], placement: Mapping[int, str], pinned: list[str]
) -> str | None:
    """The node the plan gives this pod: its index's in ``placement`` when that node is
    among those the template is pinned to now (a later move may have pinned it elsewhere
    and left an old map), else None."""
    index = pod_index(pod)
    node = placement.get(index) if index is not None else None
    return node if node is not None and (not pinned or node in pinned) else None
