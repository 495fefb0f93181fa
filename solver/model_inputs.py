"""Phase 3 of ``solver.solve``: the CP-SAT placement model's inputs, gathered from the greedy
engine once its state is the base (``GreedyEngine.rebase``).

* Candidates: pending block jobs in the shaper's queue order that the base does not
  place, that have a ready compatible node and are not frozen (a frozen job gets no
  variable: the model cannot start it, and running frozen jobs are not movable, so no
  evacuation moves them either), less those no plan could place.
* Classes of candidates and of the services' missing replicas; pools of the base's free
  capacity; look-ahead reserves and each class's reserves; team room under quota caps
  and the GPUs a team must start for its guarantee; the migration budget the greedy left.
* Evacuations: kinds of partly used nodes whose residents may all still move within their
  cluster (``migratable``), each whole onto one node.
"""

from __future__ import annotations

from collections.abc import Mapping

from solver.greedy import GreedyEngine
from solver.instance import Instance, Job
from solver.model import (
    Evacuation,
    PlacementModel,
    Pool,
    Reserve,
    build_classes,
    build_pools,
    elastic_class,
)
from solver.plan import Reason, ReasonCode

# Pending reasons that no plan changes: such jobs get no variable.
NEVER_PLACEABLE = (ReasonCode.no_compatible_gpu_model,)


def placement_model(
    engine: GreedyEngine,
    queue: list[Job],
    missing: Mapping[str, int],
    greedy_pending: Mapping[str, Reason],
) -> PlacementModel:
    """The (not yet built) model of what starts where on the engine's base state:
    ``queue`` is the pending block jobs in order, ``missing`` the services' replicas
    short of their target, ``greedy_pending`` the greedy's reasons for what it left."""
    instance = engine.instance
    config = instance.config
    state = engine.state
    applicable: dict[str, tuple[int, ...]] = {}
    candidates: list[Job] = []
    frozen = instance.frozen_ids
    for job in queue:
        # Pinned starts (room the greedy made for them) stay where they are.
        if job.id in frozen or job.id in state.placement or not state.ready_groups(job):
            continue
        if job.id in greedy_pending and greedy_pending[job.id].code in NEVER_PLACEABLE:
            continue
        applicable[job.id] = engine.reservation_indices(job)
        candidates.append(job)
    team_min_start = engine.team_min_start()
    named_teams = {p.team for p in instance.policies if p.quota_cap is not None}
    named_teams |= set(team_min_start)
    classes = build_classes(instance, state.compat, candidates, applicable, named_teams)
    for job_id, count in sorted(missing.items()):
        classes.append(
            elastic_class(instance, state.compat, instance.job_by_id[job_id], count, len(classes))
        )
    pools = build_pools(state, [*candidates, *(instance.job_by_id[j] for j in missing)])
    team_room = {}
    for policy_rule in instance.policies:
        cap = policy_rule.quota_cap
        if cap is not None:
            team_room[policy_rule.team] = cap - state.team_usage.get(policy_rule.team, 0)
    reserves = [Reserve(groups=r.groups, gpus=r.gpus) for r in engine.reservations]
    budget = engine.migrations_left
    moves = config.cp_sat_migration and config.migration
    return PlacementModel(
        instance,
        pools,
        classes,
        reserves,
        team_room,
        team_min_start,
        evacuations=evacuations(engine, pools, budget) if moves else [],
        migration_budget=max(0, budget) if config.migration else 0,
    )


def evacuations(engine: GreedyEngine, pools: list[Pool], budget: int) -> list[Evacuation]:
    """Partly used nodes whose residents may all move, grouped into identical kinds; a
    pool is added for a group with no free GPUs."""
    if budget <= 0:
        return []
    state = engine.state
    instance: Instance = engine.instance
    horizon = instance.config.value_horizon_s
    pool_by_group = {pool.group: pool for pool in pools}
    kinds: dict[tuple[object, ...], Evacuation] = {}
    spread = instance.one_replica_per_node
    for node_index, node in enumerate(instance.nodes):
        residents = state.jobs_on_node[node_index]
        if not state.ready[node_index] or not residents or len(residents) > budget:
            continue
        group = state.compat.group_of_node[node_index]
        jobs = [instance.job_by_id[job_id] for job_id in residents]
        # Residents move within the group (its cluster): a job that is not ``migratable``
        # may move only to another cluster, which the model does not plan. Nor is a node
        # one to empty when it holds a job of two or more replicas that run one per node
        # (``Instance.one_replica_per_node``): a resident moves whole onto one node, which
        # such a job may not, so the realisation would leave it there (it never moves
        # one) and the model would count a whole free node that is not.
        if not all(
            job.migratable
            and engine.may_move(job.id)
            and group in state.compat.groups_for(job)
            and not (job.replicas > 1 and job.id in spread)
            for job in jobs
        ):
            continue
        pool = pool_by_group.get(group)
        if pool is None:
            model_group = state.compat.groups[group]
            pool = Pool(
                index=len(pools),
                group=group,
                cluster=model_group.cluster,
                speed=model_group.gpu_model.speed,
                model=model_group.gpu_model.name,
                max_node_gpus=node.gpus,
            )
            pools.append(pool)
            pool_by_group[group] = pool
        shape = tuple(
            sorted(
                (
                    (
                        job.total_gpus,
                        job.replicas * job.cpu_milli_per_replica,
                        job.replicas * job.memory_mib_per_replica,
                    )
                    for job in jobs
                ),
                reverse=True,
            )
        )
        key = (group, node.gpus, state.free_gpus[node_index], shape)
        kind = kinds.get(key)
        if kind is None:
            kind = Evacuation(
                index=len(kinds),
                pool=pool,
                node_gpus=node.gpus,
                free_gpus=state.free_gpus[node_index],
                residents=shape,
            )
            kinds[key] = kind
        cost = sum(
            instance.weight(job)
            * job.total_gpus
            * instance.migration.migration_seconds(job)
            / horizon
            for job in jobs
        )
        kind.nodes.append(node_index)
        kind.costs.append(cost)
        pool.evacuable_gpus = max(pool.evacuable_gpus, node.gpus)
        pool.evacuable_total += node.gpus - state.free_gpus[node_index]
    for kind in kinds.values():
        order = sorted(range(len(kind.nodes)), key=lambda i: (kind.costs[i], kind.nodes[i]))
        kind.nodes = [kind.nodes[i] for i in order]
        kind.costs = [kind.costs[i] for i in order]
    return list(kinds.values())
