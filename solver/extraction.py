"""Phase 7 of ``solver.solve``: a CP-SAT solution of the aggregated model made into a
placement, node by node, on the greedy engine's base state.

The model counts jobs per node group, not per node, so its solution is realised: first
the nodes it chose to empty (their residents move to other nodes of the group, or stay),
then per group, largest items first, best fit. A job that runs one replica per node
(``Instance.one_replica_per_node``) comes before every other item of its group (those
needing more nodes first) and is placed a replica at a time on distinct nodes, each the
best node for one replica (``find_gang`` would take the emptiest nodes first). What does
not fit is left for the engine's ``fill``. Every change goes through the engine's state,
so the result is legal by construction.
"""

from __future__ import annotations

from ortools.sat.python import cp_model

from solver.greedy import GreedyEngine
from solver.instance import Job
from solver.model import PlacementModel
from solver.state import ClusterState


def realise(model: PlacementModel, solver: cp_model.CpSolver, engine: GreedyEngine) -> None:
    """Place the model's counts node by node: empty the chosen nodes, then per group,
    largest items first, best fit."""
    state = engine.state
    instance = engine.instance
    _empty_nodes(model, solver, engine)
    next_job = {c.index: 0 for c in model.classes}
    items_by_group: dict[int, list[tuple[int, Job, int]]] = {}
    for option in model.options:
        count = solver.value(option.var)
        if count <= 0:
            continue
        job_class = option.job_class
        if job_class.elastic:
            job = job_class.jobs[0]
            items_by_group.setdefault(option.pool.group, []).append(
                (job.gpus_per_replica, job, count)
            )
            continue
        for _ in range(count):
            if next_job[job_class.index] >= len(job_class.jobs):
                break
            job = job_class.jobs[next_job[job_class.index]]
            next_job[job_class.index] += 1
            items_by_group.setdefault(option.pool.group, []).append((job.total_gpus, job, 1))
    spread = instance.one_replica_per_node
    for group in sorted(items_by_group):
        items = items_by_group[group]
        # A gang that needs a node per replica comes first, whatever its size: a job
        # placed before it, larger ones too, could take a node that only the gang's own
        # chunks fit beside (best fit fills the tightest node). The model counts such a
        # gang only where it has its distinct nodes beside the rest (``PlacementModel.
        # _add_spread_rows``); placed a replica at a time at best fit, it leaves the rest
        # the roomiest nodes.
        items.sort(key=lambda item: (-_nodes_needed(item[1], spread), -item[0], item[1].id))
        for _, job, count in items:
            cap = instance.policy_for(job).quota_cap
            if job.is_elastic:
                missing = count
                while missing > 0:
                    if cap is not None and state.team_usage[job.team] + job.gpus_per_replica > cap:
                        break
                    node = state.find_single_node(job, 1, [group])
                    if node is None:
                        break
                    replicas = min(missing, state.replicas_fitting(job, node))
                    if state.gang_fit is not None:
                        replicas = 1  # each replica where it leaves the least waste
                    if cap is not None:
                        room = (cap - state.team_usage[job.team]) // job.gpus_per_replica
                        replicas = min(replicas, room)
                    state.add(job, node, replicas * job.gpus_per_replica)
                    missing -= replicas
                continue
            if cap is not None and state.team_usage[job.team] + job.total_gpus > cap:
                continue
            if job.replicas > 1 and job.id in instance.one_replica_per_node:
                placement = _node_per_replica(state, job, group)
            else:
                placement = state.find_gang(job, job.replicas, [group], job.max_nodes)
            if placement is None:
                continue
            engine.admit(job, placement)


def _nodes_needed(job: Job, spread: frozenset[str]) -> int:
    """Distinct nodes a job must have: its replicas where it runs one per node, else 0."""
    return job.replicas if job.id in spread and not job.is_elastic else 0


def _node_per_replica(state: ClusterState, job: Job, group: int) -> dict[int, int] | None:
    """A node of ``group`` for each replica, none twice; None if the group has too few."""
    chosen: dict[int, int] = {}
    for _ in range(job.replicas):
        node = state.find_single_node(job, 1, [group], exclude=set(chosen))
        if node is None:
            return None
        chosen[node] = job.gpus_per_replica
    return chosen


def _empty_nodes(model: PlacementModel, solver: cp_model.CpSolver, engine: GreedyEngine) -> None:
    """Empty the chosen nodes; their residents go to other nodes of the group, or stay."""
    state = engine.state
    emptied: set[int] = set()
    movers: list[tuple[Job, dict[int, int], int]] = []
    for kind in model.evacuations:
        if kind.var is None:
            continue
        for node in kind.nodes[: solver.value(kind.var)]:
            emptied.add(node)
            for job_id in list(state.jobs_on_node[node]):
                job = engine.instance.job_by_id[job_id]
                movers.append((job, state.evict(job), kind.pool.group))
    movers.sort(key=lambda mover: (-mover[0].total_gpus, mover[0].id))
    for job, original, group in movers:
        target = state.find_single_node(job, job.replicas, [group], exclude=emptied)
        if target is None:
            state.place(job, original)
            continue
        engine.move(
            job, target, f"moved to {engine.instance.nodes[target].name} to empty whole nodes"
        )
