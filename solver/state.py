"""Mutable cluster state for the rule-based engines, with an undo log.

Free capacity per node, who holds what, GPUs per team, and per node group a bucket index
``free GPUs -> ordered set of ready nodes`` so best-fit is a bucket walk, not a scan of
every node. Every change goes through :meth:`ClusterState.add` / :meth:`remove`, which
record an undo entry, so a tentative preemption or defragmentation rolls back exactly.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

from solver.compat import Compatibility
from solver.fragmentation import fgd_score, fragmentation_for
from solver.gang_fit import GangFit
from solver.instance import FULL_GPU_MILLI, Instance, Job, NodeState

UNLIMITED = 1 << 60


class ClusterState:
    def __init__(self, instance: Instance, compat: Compatibility | None = None) -> None:
        self.instance = instance
        self.compat = compat if compat is not None else Compatibility(instance)
        nodes = instance.nodes
        self.node_index = {node.name: i for i, node in enumerate(nodes)}
        self.free_gpus = [node.gpus for node in nodes]
        self.free_cpu = [node.cpu_milli if node.cpu_milli else UNLIMITED for node in nodes]
        self.free_mem = [node.memory_mib if node.memory_mib else UNLIMITED for node in nodes]
        self.ready = [node.state is NodeState.up for node in nodes]
        self.placement: dict[str, dict[int, int]] = {}
        self.team_usage: dict[str, int] = defaultdict(int)
        self.jobs_on_node: list[dict[str, int]] = [{} for _ in nodes]
        self._log: list[tuple[str, int, int]] = []
        self._logging = False
        # Nodes whose holdings changed (after the load) since the last
        # ``take_changed_nodes``: a reader that keeps its own per-node index
        # (``solver.greedy.defragmentation``) refreshes those instead of scanning them all.
        self._changed_nodes: set[int] = set()
        self._group_orders: dict[tuple[object, ...], tuple[int, ...]] = {}
        # Set by the shaper's engine (``SolverConfig.gang_aware_placement``): single-node
        # placements then leave free GPUs the waiting gangs can use (``solver.gang_fit``).
        self.gang_fit: GangFit | None = None
        # Set by the shaper's engine (``SolverConfig.job_speeds``): each job's own speeds
        # (``Instance.speeds``), the order it tries models in. The baselines know one
        # speed per model.
        self.speeds: Mapping[str, Mapping[str, float]] = {}
        # With the instance's typical shapes given (the fractional-GPU world), single-node
        # placements go where FGD's fragmentation for them grows least.
        self.fragmentation = (
            fragmentation_for(instance.typical_shapes) if instance.typical_shapes else None
        )
        self._load(instance.jobs)
        # Buckets are built after the initial load, from the resulting free counts.
        self.group_free = [0] * len(self.compat.groups)
        # Each group's model's speed (``group_speed`` for a job with speeds of its own).
        self.model_speed = [group.gpu_model.speed for group in self.compat.groups]
        # No node of a group has more free GPUs than this: where bucket walks stop.
        self.most_gpus = [
            max((nodes[i].gpus for i in group.node_indices), default=0)
            for group in self.compat.groups
        ]
        self.buckets: list[dict[int, dict[int, None]]] = [
            defaultdict(dict) for _ in self.compat.groups
        ]
        for i in range(len(nodes)):
            if self.ready[i]:
                group = self.compat.group_of_node[i]
                self.buckets[group][self.free_gpus[i]][i] = None
                self.group_free[group] += self.free_gpus[i]
        self._logging = True

    def _load(self, jobs: Iterable[Job]) -> None:
        """The snapshot's holdings, counted as ``add`` counts them, without what only
        changes after the load need (undo entries, buckets, changed nodes)."""
        node_index = self.node_index
        free_gpus, free_cpu, free_mem = self.free_gpus, self.free_cpu, self.free_mem
        for job in jobs:
            if not job.placement:
                continue
            held = self.placement.setdefault(job.id, {})
            for node_name, gpus in job.placement.items():
                node = node_index[node_name]
                replicas = gpus // job.gpus_per_replica
                free_gpus[node] -= gpus
                free_cpu[node] -= replicas * job.cpu_milli_per_replica
                free_mem[node] -= replicas * job.memory_mib_per_replica
                held[node] = held.get(node, 0) + gpus
                self.jobs_on_node[node][job.id] = held[node]
                self.team_usage[job.team] += gpus
        # Shares and MIG instances planned around this (whole-GPU) part count too.
        for team, gpus in self.instance.quota_held_outside.items():
            self.team_usage[team] += gpus

    # -- primitive changes -------------------------------------------------------------

    def _move_bucket(self, node: int, old_free: int, new_free: int) -> None:
        if not self._logging or not self.ready[node]:
            return
        group = self.compat.group_of_node[node]
        bucket = self.buckets[group]
        del bucket[old_free][node]
        bucket[new_free][node] = None
        self.group_free[group] += new_free - old_free

    def add(self, job: Job, node: int, gpus: int) -> None:
        replicas = gpus // job.gpus_per_replica
        old = self.free_gpus[node]
        self.free_gpus[node] = old - gpus
        self.free_cpu[node] -= replicas * job.cpu_milli_per_replica
        self.free_mem[node] -= replicas * job.memory_mib_per_replica
        if self.gang_fit is not None and job.id not in self.placement:
            self.gang_fit.started(job)
        held = self.placement.setdefault(job.id, {})
        held[node] = held.get(node, 0) + gpus
        self.jobs_on_node[node][job.id] = held[node]
        self.team_usage[job.team] += gpus
        self._move_bucket(node, old, old - gpus)
        self._changed_nodes.add(node)
        if self._logging:
            self._log.append((job.id, node, gpus))

    def remove(self, job: Job, node: int, gpus: int) -> None:
        replicas = gpus // job.gpus_per_replica
        old = self.free_gpus[node]
        self.free_gpus[node] = old + gpus
        self.free_cpu[node] += replicas * job.cpu_milli_per_replica
        self.free_mem[node] += replicas * job.memory_mib_per_replica
        held = self.placement[job.id]
        held[node] -= gpus
        if held[node] == 0:
            del held[node]
            del self.jobs_on_node[node][job.id]
        else:
            self.jobs_on_node[node][job.id] = held[node]
        if not held:
            del self.placement[job.id]
            if self.gang_fit is not None:
                self.gang_fit.stopped(job)
        self.team_usage[job.team] -= gpus
        self._move_bucket(node, old, old + gpus)
        self._changed_nodes.add(node)
        if self._logging:
            self._log.append((job.id, node, -gpus))

    def place(self, job: Job, placement: dict[int, int]) -> None:
        for node, gpus in placement.items():
            self.add(job, node, gpus)

    def evict(self, job: Job) -> dict[int, int]:
        held = dict(self.placement.get(job.id, {}))
        for node, gpus in held.items():
            self.remove(job, node, gpus)
        return held

    def mark(self) -> int:
        return len(self._log)

    def rollback(self, mark: int) -> None:
        job_by_id = self.instance.job_by_id
        while len(self._log) > mark:
            job_id, node, gpus = self._log[-1]
            job = job_by_id[job_id]
            if gpus > 0:
                self.remove(job, node, gpus)
            else:
                self.add(job, node, -gpus)
            # Each inverse appended one entry; drop it and the original.
            del self._log[-2:]

    def take_changed_nodes(self) -> set[int]:
        """The nodes whose holdings changed since the last call (rolled-back changes
        included); the record then starts afresh."""
        changed, self._changed_nodes = self._changed_nodes, set()
        return changed

    # -- queries -------------------------------------------------------------------------

    def held(self, job_id: str) -> dict[int, int]:
        return self.placement.get(job_id, {})

    def replicas_fitting(self, job: Job, node: int) -> int:
        fit = self.free_gpus[node] // job.gpus_per_replica
        if job.id in self.instance.one_replica_per_node:
            # One replica per node: none more where it holds one already.
            fit = min(fit, 0 if node in self.placement.get(job.id, ()) else 1)
        if job.cpu_milli_per_replica:
            fit = min(fit, self.free_cpu[node] // job.cpu_milli_per_replica)
        if job.memory_mib_per_replica:
            fit = min(fit, self.free_mem[node] // job.memory_mib_per_replica)
        return max(0, fit)

    def ready_groups(self, job: Job) -> list[int]:
        return self.compat.ready_groups_for(job)

    def in_cluster_of(self, groups: list[int], nodes: Iterable[int]) -> list[int]:
        """The groups in the cluster of ``nodes`` (where a running job or replica is)."""
        clusters = {self.instance.nodes[n].cluster for n in nodes}
        return [g for g in groups if self.compat.groups[g].cluster in clusters]

    def move_tiers(self, job: Job, groups: list[int], nodes: Iterable[int]) -> list[list[int]]:
        """Where running ``job`` on ``nodes`` may move, the tiers tried in order: its own
        cluster's ``groups`` (unless only ``config.cross_cluster_migration`` is on, or the job
        is not ``migratable``), then, with ``config.cross_cluster_migration``, those of the
        other clusters the job's ``clusters`` lists (None lists none: a move to another
        cluster is a checkpoint, a transfer over the group's link and a resubmission, so it
        comes after any at home and only where the federation said it could be carried out)."""
        config = self.instance.config
        home = self.in_cluster_of(groups, nodes)
        # ``cross_cluster_migration`` without ``migration``, or a job whose scheduler cannot
        # be told where it goes: moves to other clusters only.
        within = config.migration or not config.cross_cluster_migration
        across_only = not (within and job.migratable)
        tiers = [] if across_only else [home]
        if config.cross_cluster_migration and job.clusters is not None:
            away = [g for g in groups if g not in home]
            if away:
                tiers.append(away)
        return tiers

    def find_move_target(
        self,
        job: Job,
        groups: list[int],
        nodes: Iterable[int],
        exclude: set[int] | None = None,
    ) -> int | None:
        """One node for running ``job`` (now on ``nodes``) to move to whole: the first of
        :meth:`move_tiers` that has one (``find_single_node``); None when none does."""
        held = list(nodes)
        for tier in self.move_tiers(job, groups, held):
            target = self.find_single_node(job, job.replicas, tier, exclude)
            if target is not None:
                return target
        return None

    def nodes_with_free(self, group: int, gpus: int) -> list[int]:
        """The ready nodes of ``group`` with at least ``gpus`` GPUs free."""
        return [
            node
            for free, members in self.buckets[group].items()
            if free >= gpus
            for node in members
        ]

    def compatible_free(self, groups: Iterable[int]) -> int:
        return sum(self.group_free[g] for g in groups)

    def group_order(self, groups: list[int], job: Job | None = None) -> tuple[int, ...]:
        # Faster GPUs first (for ``job``: its own speed on each, ``Instance.speeds``): the
        # objective weights GPUs by speed. Asked for every placement tried, of a few distinct
        # lists of groups (and jobs' speed tables): each is sorted once.
        key: tuple[object, ...] = tuple(groups)
        own = self.own_speeds(job) if job is not None else None
        if own:
            key = (key, tuple(sorted(own.items())))
        ordered = self._group_orders.get(key)
        if ordered is None:
            speed = {g: self.group_speed(g, job) for g in groups}
            ordered = tuple(sorted(groups, key=lambda g: (-speed[g], g)))
            self._group_orders[key] = ordered
        return ordered

    def own_speeds(self, job: Job) -> Mapping[str, float] | None:
        """``job``'s own speeds as this plan counts them (``speeds``), or None."""
        return self.speeds.get(job.id) if self.speeds else None

    def group_speed(self, group: int, job: Job | None = None) -> float:
        """How fast the group's GPUs run ``job`` (``Instance.job_speed``), or their model's
        speed."""
        own = self.own_speeds(job) if job is not None else None
        if not own:
            return self.model_speed[group]
        return own.get(self.compat.groups[group].gpu_model.name, self.model_speed[group])

    def find_single_node(
        self, job: Job, replicas: int, groups: list[int], exclude: set[int] | None = None
    ) -> int | None:
        """Best node holding ``replicas`` replicas: fastest model, then (with ``gang_fit``)
        the least waste for the waiting gangs, keep whole nodes, tightest."""
        if replicas > 1 and job.id in self.instance.one_replica_per_node:
            return None  # its replicas go one to a node (``Instance.one_replica_per_node``)
        if self.fragmentation is not None:
            return self._least_fragmenting_node(job, replicas, groups, exclude)
        need = replicas * job.gpus_per_replica
        best: tuple[float, float, int, int, int] | None = None
        nodes = self.instance.nodes
        gang_fit = self.gang_fit
        own = self.own_speeds(job) is not None
        model_speed = self.model_speed
        for group in self.group_order(groups, job):
            bucket = self.buckets[group]
            speed = self.group_speed(group, job) if own else model_speed[group]
            # Levels in increasing order of free GPUs: at most a node's GPUs, a handful.
            for free in range(need, self.most_gpus[group] + 1):
                members = bucket.get(free)
                if not members:
                    continue
                found = None
                for node in members:
                    if exclude and node in exclude:
                        continue
                    if self.replicas_fitting(job, node) >= replicas:
                        found = node
                        break
                if found is None:
                    continue
                breaks_whole = 1 if free == nodes[found].gpus and need < free else 0
                waste = 0.0 if gang_fit is None else gang_fit.waste_increase(job, found, free, need)
                key = (-speed, waste, breaks_whole, free - need, found)
                if best is None or key < best:
                    best = key
                if gang_fit is None:
                    break  # best fit: the tightest level of the group is its candidate
        return None if best is None else best[4]

    def _least_fragmenting_node(
        self, job: Job, replicas: int, groups: list[int], exclude: set[int] | None
    ) -> int | None:
        """The node holding ``replicas`` replicas with FGD's best score (its fragmentation
        for the typical shapes grows least; fastest model first, then the first node in
        the instance's order). Idle GPUs count 1000 milli free, GPUs fractional jobs share
        what they leave (``Instance.shared_free_milli``)."""
        measure = self.fragmentation
        assert measure is not None
        need = replicas * job.gpus_per_replica
        cpu_need = replicas * job.cpu_milli_per_replica
        mem_need = replicas * job.memory_mib_per_replica
        nodes = self.instance.nodes
        shared = self.instance.shared_free_milli
        best: tuple[float, int, int] | None = None
        own = self.own_speeds(job) is not None
        for group in self.group_order(groups, job):
            bucket = self.buckets[group]
            speed = self.group_speed(group, job) if own else self.model_speed[group]
            for free in range(need, self.most_gpus[group] + 1):
                for node in bucket.get(free, ()):
                    if exclude and node in exclude:
                        continue
                    if self.replicas_fitting(job, node) < replicas:
                        continue
                    name = nodes[node].name
                    model = nodes[node].gpu_model
                    partial = shared.get(name, ())
                    cpu = self.free_cpu[node]
                    mem = self.free_mem[node]
                    before = measure([FULL_GPU_MILLI] * free + list(partial), cpu, model, mem)
                    after = measure(
                        [FULL_GPU_MILLI] * (free - need) + list(partial),
                        cpu - cpu_need,
                        model,
                        mem - mem_need,
                    )
                    key = (-speed, -fgd_score(before - after), node)
                    if best is None or key < best:
                        best = key
        return None if best is None else best[2]

    def find_gang(
        self,
        job: Job,
        replicas: int,
        groups: list[int],
        max_nodes: int | None,
        exclude: set[int] | None = None,
    ) -> dict[int, int] | None:
        """Replicas over the fewest nodes of one group (one cluster, one GPU model)."""
        node = self.find_single_node(job, replicas, groups, exclude)
        if node is not None:
            return {node: replicas * job.gpus_per_replica}
        limit = max_nodes if max_nodes is not None else replicas
        if limit <= 1:
            return None
        for group in self.group_order(groups, job):
            bucket = self.buckets[group]
            chosen: list[tuple[int, int]] = []
            remaining = replicas
            for free in sorted((f for f, m in bucket.items() if m), reverse=True):
                if free < job.gpus_per_replica:
                    break
                for candidate in bucket[free]:
                    if exclude and candidate in exclude:
                        continue
                    fit = self.replicas_fitting(job, candidate)
                    if fit <= 0:
                        continue
                    chosen.append((candidate, min(fit, remaining)))
                    remaining -= min(fit, remaining)
                    if remaining == 0 or len(chosen) >= limit:
                        break
                if remaining == 0 or len(chosen) >= limit:
                    break
            if remaining == 0:
                return {n: r * job.gpus_per_replica for n, r in chosen}
        return None
