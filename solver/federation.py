"""Several clusters in one instance (a federation group) or each on its own.

:func:`federate` builds the group's instance from one instance per cluster: nodes stay
where they are; each pending job may start in its own cluster or in those ``movable``
lists for it, with its cluster as ``home_cluster`` so that starting elsewhere costs the
transfer of its image (``MigrationCostModel.remote_start_seconds``); a running job is held
to its cluster unless ``running_movable`` lists others for it (one the move's saga can
carry out: checkpoint on its node, transfer, resubmit pinned to one node there), and then
the greedy passes may move it there with ``config.cross_cluster_migration``, paying
``migration_seconds(across=True)``. :func:`split_by_cluster` is the opposite:
an instance whose every job is held to one cluster, as one instance per cluster, for
planning each alone. :func:`cross_cluster_starts` reads what federation changed in a plan.

Where a job may go is the caller's to say in ``movable``; :func:`residency_clusters` is the
one rule for it: a cluster must satisfy every :class:`Residency` that applies (the job's
own and its team's), by labels and by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from solver.instance import GpuModel, Instance, MigrationCostModel, SlaPolicy, SolverConfig
from solver.plan import ActionKind, Plan


def labels_match(labels: Mapping[str, str], selector: Mapping[str, str]) -> bool:
    """Whether ``labels`` include every key=value of ``selector`` (an empty one: any)."""
    return all(labels.get(key) == value for key, value in selector.items())


@dataclass(frozen=True)
class Residency:
    """The clusters a job may run in (data residency, locality): those whose labels include
    every key=value of ``cluster_selector`` and, unless ``allowed_clusters`` is None, that
    it names. The default permits any cluster."""

    cluster_selector: Mapping[str, str] = field(default_factory=dict)
    allowed_clusters: frozenset[str] | None = None

    def permits(self, cluster: str, labels: Mapping[str, str]) -> bool:
        named = self.allowed_clusters is None or cluster in self.allowed_clusters
        return named and labels_match(labels, self.cluster_selector)


def residency_clusters(
    labels: Mapping[str, Mapping[str, str]], *rules: Residency | None
) -> frozenset[str]:
    """The clusters of ``labels`` (name → its labels) that every rule permits (None: no
    rule)."""
    return frozenset(
        cluster
        for cluster, own in labels.items()
        if all(rule is None or rule.permits(cluster, own) for rule in rules)
    )


def federate(
    parts: Mapping[str, Instance],
    *,
    movable: Mapping[str, frozenset[str]],
    migration: MigrationCostModel,
    config: SolverConfig,
    running_movable: Mapping[str, frozenset[str]] | None = None,
) -> Instance:
    """One instance over ``parts`` (cluster name → that cluster's instance, whose nodes all
    name it). ``movable``: job id → the other clusters a pending job may start in;
    ``running_movable``: job id → the other clusters a running job may move to (only a
    checkpointable block job on one node: anything else is a ``ValueError``).

    GPU models are shared by name, and so are SLA policies by team: the same name defined
    differently by two members is a ``ValueError`` naming both (a federation group plans
    under one set of rules, and the solver weighs and caps jobs by team)."""
    models: dict[str, GpuModel] = {}
    policies: dict[str, tuple[str, SlaPolicy]] = {}
    nodes = []
    jobs = []
    for cluster, part in parts.items():
        for model in part.gpu_models:
            if models.setdefault(model.name, model) != model:
                raise ValueError(f"GPU model {model.name!r} is defined differently in {cluster}")
        for policy in part.policies:
            first, known = policies.setdefault(policy.team, (cluster, policy))
            if known != policy:
                raise ValueError(
                    f"team {policy.team!r} has a different SLA policy in {first} and {cluster}"
                )
        for node in part.nodes:
            if node.cluster != cluster:
                raise ValueError(f"node {node.name} is in {node.cluster}, not {cluster}")
            nodes.append(node)
        for job in part.jobs:
            update: dict[str, object] = {"clusters": frozenset({cluster})}
            if not job.is_running and job.id in movable:
                update = {"clusters": movable[job.id] | {cluster}, "home_cluster": cluster}
            elif job.is_running and running_movable and job.id in running_movable:
                if job.is_elastic or not job.checkpointable or len(job.placement) != 1:
                    raise ValueError(
                        f"job {job.id}: only a checkpointable block job on one node moves "
                        "to another cluster"
                    )
                update = {"clusters": running_movable[job.id] | {cluster}}
            jobs.append(job.model_copy(update=update))
    return Instance(
        now=max((part.now for part in parts.values()), default=0.0),
        gpu_models=tuple(models.values()),
        nodes=tuple(nodes),
        jobs=tuple(jobs),
        policies=tuple(policy for _, policy in policies.values()),
        migration=migration,
        config=config,
        speeds={job_id: own for part in parts.values() for job_id, own in part.speeds.items()},
        one_replica_per_node=frozenset().union(
            *(part.one_replica_per_node for part in parts.values())
        ),
    )


def split_by_cluster(instance: Instance) -> list[Instance]:
    """One instance per cluster, for planning each alone: its nodes, and the jobs held to
    it (every job must be held to one cluster). One cluster: the instance itself."""
    clusters = sorted({node.cluster for node in instance.nodes})
    if len(clusters) <= 1:
        return [instance]
    parts = []
    for cluster in clusters:
        jobs = []
        for job in instance.jobs:
            if job.clusters is None or len(job.clusters) != 1:
                raise ValueError(f"job {job.id}: may run in several clusters, planned alone")
            if cluster in job.clusters:
                jobs.append(job)
        nodes = tuple(node for node in instance.nodes if node.cluster == cluster)
        # A new Instance, not model_copy: that would carry the whole's cached look-ups.
        parts.append(
            Instance(
                now=instance.now,
                gpu_models=instance.gpu_models,
                nodes=nodes,
                jobs=tuple(jobs),
                policies=instance.policies,
                migration=instance.migration,
                config=instance.config,
                speeds={j.id: instance.speeds[j.id] for j in jobs if j.id in instance.speeds},
                one_replica_per_node=instance.one_replica_per_node & {j.id for j in jobs},
            )
        )
    return parts


@dataclass(frozen=True)
class CrossClusterStart:
    job_id: str
    home: str
    target: str
    placement: dict[str, int]


@dataclass(frozen=True)
class CrossClusterMove:
    """A running job the plan moves from ``source`` (its one node) to ``target`` (one
    node of another cluster)."""

    job_id: str
    home: str
    target: str
    source: str
    placement: dict[str, int]


def cross_cluster_moves(instance: Instance, plan: Plan) -> list[CrossClusterMove]:
    """The plan's migrations of running jobs to another cluster."""
    nodes = instance.node_by_name
    moves = []
    for action in plan.actions:
        if action.kind is not ActionKind.migrate or not action.to_placement:
            continue
        job = instance.job_by_id[action.job_id]
        home = nodes[next(iter(job.placement))].cluster
        target = nodes[next(iter(action.to_placement))].cluster
        if target != home:
            source = next(iter(job.placement))
            moves.append(CrossClusterMove(job.id, home, target, source, dict(action.to_placement)))
    return moves


def cross_cluster_starts(instance: Instance, plan: Plan) -> list[CrossClusterStart]:
    """The plan's starts of pending jobs in a cluster other than their home."""
    nodes = instance.node_by_name
    starts = []
    for action in plan.actions:
        if action.kind is not ActionKind.start:
            continue
        job = instance.job_by_id[action.job_id]
        if job.home_cluster is None or not action.to_placement:
            continue
        target = nodes[next(iter(action.to_placement))].cluster
        if target != job.home_cluster:
            starts.append(
                CrossClusterStart(job.id, job.home_cluster, target, dict(action.to_placement))
            )
    return starts
