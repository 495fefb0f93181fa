"""Which nodes a job may run on: GPU model, GPU memory, precision, selectors, taints.

Nodes that agree on everything compatibility looks at form a :class:`NodeGroup`; a job's
compatible groups are computed once per distinct job signature, so the cost is
``groups × signatures`` rather than ``nodes × jobs``. Of a node's labels only those some
job's selector names count: a label every node has its own value of (Kubernetes'
``kubernetes.io/hostname``, Ray's node id) would make each node a group of its own, and a
gang, which takes its nodes from one group, could then never span two nodes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from solver.instance import GpuModel, Instance, Job, Node, NodeState

GroupKey = tuple[str, str, tuple[tuple[str, str], ...], frozenset[str]]
JobSignature = tuple[
    frozenset[str] | None,
    int,
    str | None,
    tuple[tuple[str, str], ...],
    frozenset[str],
    frozenset[str] | None,
]


@dataclass
class NodeGroup:
    """Nodes of one cluster and GPU model with the same taints and the same values of the
    labels jobs select on (``labels`` holds only those)."""

    index: int
    cluster: str
    gpu_model: GpuModel
    labels: dict[str, str]
    taints: frozenset[str]
    node_indices: list[int] = field(default_factory=list)


def group_key(node: Node, selected: tuple[str, ...]) -> GroupKey:
    """``selected``: the label keys some job's selector names, sorted."""
    return (node.cluster, node.gpu_model, _labels(node, selected), node.taints)


def _labels(node: Node, selected: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    return tuple((key, node.labels[key]) for key in selected if key in node.labels)


def job_signature(job: Job) -> JobSignature:
    return (
        job.allowed_gpu_models,
        job.gpu_memory_mib,
        job.precision,
        tuple(sorted(job.node_selector.items())),
        job.tolerations,
        job.clusters,
    )


def group_accepts(group: NodeGroup, job: Job) -> bool:
    model = group.gpu_model
    if job.allowed_gpu_models is not None and model.name not in job.allowed_gpu_models:
        return False
    if job.gpu_memory_mib > model.memory_mib:
        return False
    if job.precision is not None and job.precision not in model.precisions:
        return False
    if job.clusters is not None and group.cluster not in job.clusters:
        return False
    if any(group.labels.get(key) != value for key, value in job.node_selector.items()):
        return False
    return group.taints <= job.tolerations


def node_accepts(instance: Instance, node: Node, job: Job) -> bool:
    """Compatibility of one node, ignoring its state and free capacity."""
    group = NodeGroup(
        index=-1,
        cluster=node.cluster,
        gpu_model=instance.model_by_name[node.gpu_model],
        labels=node.labels,
        taints=node.taints,
    )
    return group_accepts(group, job)


class Compatibility:
    """Node groups of an instance and a cache of job signature -> compatible groups."""

    def __init__(self, instance: Instance) -> None:
        self.instance = instance
        by_key: dict[GroupKey, NodeGroup] = {}
        selected = tuple(sorted({key for job in instance.jobs for key in job.node_selector}))
        for node_index, node in enumerate(instance.nodes):
            key = group_key(node, selected)
            group = by_key.get(key)
            if group is None:
                group = NodeGroup(
                    index=len(by_key),
                    cluster=node.cluster,
                    gpu_model=instance.model_by_name[node.gpu_model],
                    labels=dict(_labels(node, selected)),
                    taints=node.taints,
                )
                by_key[key] = group
            group.node_indices.append(node_index)
        self.groups: list[NodeGroup] = list(by_key.values())
        self.group_of_node: list[int] = [0] * len(instance.nodes)
        for group in self.groups:
            for node_index in group.node_indices:
                self.group_of_node[node_index] = group.index
        self._cache: dict[JobSignature, list[int]] = {}
        self._ready_cache: dict[JobSignature, list[int]] = {}
        nodes = instance.nodes
        self._group_ready = [
            any(nodes[i].state is NodeState.up for i in group.node_indices) for group in self.groups
        ]

    def groups_for(self, job: Job) -> list[int]:
        """Indices of the groups whose nodes the job may run on (any state)."""
        signature = job_signature(job)
        cached = self._cache.get(signature)
        if cached is None:
            cached = [g.index for g in self.groups if group_accepts(g, job)]
            self._cache[signature] = cached
        return cached

    def has_ready_node(self, group_index: int) -> bool:
        return self._group_ready[group_index]

    def ready_groups_for(self, job: Job) -> list[int]:
        """Compatible groups with at least one ready node."""
        signature = job_signature(job)
        cached = self._ready_cache.get(signature)
        if cached is None:
            cached = [g for g in self.groups_for(job) if self._group_ready[g]]
            self._ready_cache[signature] = cached
        return cached
