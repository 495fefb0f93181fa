"""The shaper engine: greedy first, then CP-SAT on the aggregated model, best legal plan wins.

Phases:

1. Greedy (``solver.greedy``, value order, with resize, look-ahead, defragmentation by
   migration and preemption; on queues up to ``config.second_greedy_max_pending`` also in
   priority order and with migration before preemption, keeping the best). Legal by
   construction; its plan is the fallback and a hint.
   *Saturation*: when a greedy plan leaves nothing waiting that any plan could place,
   meets every service's demand (and look-ahead target), and runs every job it starts or
   grows on the fastest GPU model that job accepts, its priority-weighted allocation (the
   first two lines of the objective, overdue boost included) is the most any plan can
   hold: nothing is left to place, and nothing placed can be worth more. The search then
   stops there: no further greedy variant when that plan also disrupts nothing, and no
   CP-SAT (whose base state keeps the greedy's disruptions anyway). What CP-SAT could
   still gain is only ``fragmentation_weight`` per whole free node, mostly by migrating
   running work to empty nodes although no waiting job needs the room — churn whose value
   is a guess about future arrivals, which the next cycle serves when they come. The plan
   is the greedy's (``stats.engine == "greedy"``) and ``stats.note`` says why.
2. Base state: the greedy state with its disruptive decisions kept (resizes down,
   migrations, preemptions) and its new starts and scale-ups undone — but for the jobs
   and services those migrations and preemptions made room for, which keep the room
   (so that "stopped for X" stays true whichever plan wins). CP-SAT re-decides
   *what starts where* on that base, and may empty further nodes by migrating their
   checkpointable residents within what is left of the migration budget; it never
   preempts. Frozen jobs (``Instance.is_frozen``) get no variable: a pending one is not
   started, a running one never counts as movable, so its placement is fixed.
3. Model (``solver.model``): pools × job classes, warm-started with a complete hint: the
   better of the greedy starts and the rounded LP relaxation (``solver.relaxation``).
   ``config.time_limit_s`` bounds the CP-SAT search (wall time, or deterministic time
   when ``config.deterministic``); the greedy pass, model building, realisation and, when
   jobs are overdue, the first solve of ``solver.constraints.overdue`` (at most a quarter
   of the limit and 1 s) come on top (about a second at 10,000 GPUs). ``num_workers``
   and ``seed`` are passed through.
4. Every CP-SAT status is handled: OPTIMAL/FEASIBLE are realised node by node (empty the
   chosen nodes, first-fit decreasing per group, then a greedy fill of what did not fit)
   and validated; INFEASIBLE, MODEL_INVALID and UNKNOWN fall back to the greedy plan
   with a note. So would a realised plan that left the room a greedy move or stop made
   for a job to others (a safety net: step 2 pins those jobs).
5. The realised plan and the greedy plan are scored with ``solver.objective.evaluate``;
   the better one is returned, and ``stats.engine``/``stats.note`` say which and why.
   ``best_bound`` is the CP-SAT bound of step 2's problem (given the greedy's disruption
   decisions) in objective units; it is an upper bound of that problem, not of every plan
   (``solver.relaxation.global_upper_bound`` is one for every plan, and much looser).
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

from ortools.sat.python import cp_model

from solver.actions import build_plan
from solver.compat import Compatibility
from solver.constraints.fragmentation import whole_nodes_needed
from solver.greedy import (
    ElasticMode,
    GreedyEngine,
    GreedyOptions,
    GreedyResult,
    Order,
    sort_key,
)
from solver.instance import Instance, Job, SolverConfig
from solver.model import (
    SCALE,
    Evacuation,
    JobClass,
    Option,
    PlacementModel,
    Pool,
    Reserve,
    build_classes,
    build_pools,
    elastic_class,
)
from solver.objective import ObjectiveTerms, evaluate
from solver.plan import Plan, Reason, ReasonCode, SolveStats, SolveStatus
from solver.relaxation import lp_rounded, objective_of
from solver.validate import Violation, validate

GREEDY = GreedyOptions(
    engine="greedy",
    order=Order.VALUE,
    elastic=ElasticMode.DEMAND,
    preempt=True,
    migrate=True,
    lookahead=True,
    preemption_candidates=256,
    starvation_guard=True,
    disrupt_for_services=True,
)


def greedy_options(config: SolverConfig) -> GreedyOptions:
    """The shaper's greedy options with the config's levers applied (ablations)."""
    return replace(
        GREEDY,
        migrate=config.migration,
        preempt=config.preemption,
        lookahead=config.lookahead,
        elastic=ElasticMode.DEMAND if config.elastic_resize else ElasticMode.PEAK,
    )


CP_SAT_STATUS = {  # CP-SAT's status codes as the plan reports them
    cp_model.OPTIMAL: SolveStatus.OPTIMAL,
    cp_model.FEASIBLE: SolveStatus.FEASIBLE,
    cp_model.INFEASIBLE: SolveStatus.INFEASIBLE,
    cp_model.MODEL_INVALID: SolveStatus.MODEL_INVALID,
    cp_model.UNKNOWN: SolveStatus.UNKNOWN,
}


def solve(instance: Instance, *, policy: str = "shaper") -> Plan:
    started_at = time.perf_counter()
    config = instance.config
    engine, greedy, greedy_target, greedy_terms, saturated = _best_greedy(instance)
    # The CP-SAT pass goes on in the greedy's engine and rewrites its reasons: keep the
    # greedy's own, so that a greedy plan never says where CP-SAT would have put a job.
    greedy_decisions = dict(greedy.decisions)
    greedy_pending = dict(greedy.pending)

    def greedy_plan(stats: SolveStats) -> Plan:
        return build_plan(
            instance,
            policy=policy,
            target=greedy_target,
            decisions=dict(greedy_decisions),
            pending=dict(greedy_pending),
            stats=stats,
            terms=greedy_terms,
        )

    if not config.use_cp_sat:
        plan = greedy_plan(SolveStats(status=SolveStatus.HEURISTIC, engine="greedy"))
        return _finish(plan, started_at, note="CP-SAT disabled in the config")
    if saturated:
        plan = greedy_plan(SolveStats(status=SolveStatus.HEURISTIC, engine="greedy"))
        return _finish(plan, started_at, note=SATURATED_NOTE)

    state = engine.state
    instance_jobs = instance.jobs
    # What the greedy moved or stopped work for stays where the room was made (pinned).
    room_made: dict[str, set[int]] = {}
    for beneficiary, names in engine.made_room_for.values():
        room_made.setdefault(beneficiary, set()).update(state.node_index[n] for n in names)
    new_starts = [
        j
        for j in instance_jobs
        if not j.is_elastic
        and not j.is_running
        and j.id in state.placement
        and j.id not in room_made
    ]
    greedy_starts = {j.id: dict(state.held(j.id)) for j in new_starts}
    greedy_scale_ups: dict[str, dict[int, int]] = {}
    for job in new_starts:
        state.evict(job)
    missing: dict[str, int] = {}
    for job in instance_jobs:
        if not job.is_elastic:
            continue
        base = engine.after_scale_down[job.id]
        added: dict[int, int] = {}
        for node, gpus in list(state.held(job.id).items()):
            extra = gpus - base.get(node, 0)
            if extra > 0 and node not in room_made.get(job.id, ()):
                state.remove(job, node, extra)
                added[node] = extra
        greedy_scale_ups[job.id] = added
        replicas = engine.state_replicas(job)
        if engine.elastic_targets[job.id] > replicas:
            missing[job.id] = engine.elastic_targets[job.id] - replicas
    base_terms = evaluate(instance, _names(instance, state.placement))

    keys = sort_key(instance, GREEDY.order)
    queue = sorted(
        (j for j in instance_jobs if not j.is_elastic and not j.is_running),
        key=lambda j: keys[j.id],
    )
    reservations = engine.reservations
    applicable: dict[str, tuple[int, ...]] = {}
    candidates: list[Job] = []
    frozen = instance.frozen_ids
    for job in queue:
        # A frozen job gets no variable: the model cannot start it (running frozen jobs
        # are not movable, so no evacuation moves them either). Pinned starts stay.
        if job.id in frozen or job.id in state.placement or not state.ready_groups(job):
            continue
        if job.id in greedy_pending and greedy_pending[job.id].code in _NEVER:
            continue
        relevant = {id(r) for r in engine.reservations_for(job)}
        applicable[job.id] = tuple(i for i, r in enumerate(reservations) if id(r) in relevant)
        candidates.append(job)
    pinned_by_team: dict[str, int] = {}
    for job in instance_jobs:
        if not job.is_elastic and not job.is_running and job.id in state.placement:
            pinned_by_team[job.team] = pinned_by_team.get(job.team, 0) + job.total_gpus
    team_min_start: dict[str, int] = {}
    for team, stopped in engine.stopped_by_team.items():
        rule = instance.policy_by_team.get(team)
        guaranteed = rule.guaranteed_gpus if rule is not None else 0
        minimum = stopped - max(0, engine.usage_before.get(team, 0) - guaranteed)
        minimum -= pinned_by_team.get(team, 0)
        if minimum > 0:
            team_min_start[team] = minimum
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
    reserves = [Reserve(groups=r.groups, gpus=r.gpus) for r in reservations]
    budget = config.max_migrations_per_cycle - engine.migrations
    moves = config.cp_sat_migration and config.migration
    evacuations = _evacuations(engine, pools, budget) if moves else []
    model = PlacementModel(
        instance,
        pools,
        classes,
        reserves,
        team_room,
        team_min_start,
        evacuations=evacuations,
        migration_budget=max(0, budget) if config.migration else 0,
    )
    model.build()
    # Warm start: the better of the greedy plan and the rounded LP relaxation.
    hint = _greedy_hint(model, greedy_starts, greedy_scale_ups)
    hint_source = "greedy"
    rounded = lp_rounded(model)
    if rounded is not None and objective_of(model, rounded[0]) > objective_of(model, hint):
        hint, hint_source = rounded[0], "rounded LP"
    _add_hints(model, hint)

    solver = cp_model.CpSolver()
    params = solver.parameters
    if config.deterministic:
        params.max_deterministic_time = config.time_limit_s
        params.interleave_search = True
    else:
        params.max_time_in_seconds = config.time_limit_s
    params.num_workers = config.num_workers
    params.random_seed = config.seed
    params.relative_gap_limit = config.relative_gap
    status = solver.solve(model.model)
    solve_status = CP_SAT_STATUS.get(status, SolveStatus.UNKNOWN)

    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return _finish(
            greedy_plan(SolveStats(status=SolveStatus.HEURISTIC, engine="greedy")),
            started_at,
            note=f"CP-SAT returned {solver.status_name(status)}; greedy plan kept",
        )

    bound = base_terms.objective + solver.best_objective_bound / SCALE
    _realise(model, solver, engine)
    _fill(engine, queue, missing)
    cp_target = _names(instance, state.placement)
    cp_terms = evaluate(instance, cp_target)
    violations: list[Violation] = []
    unused = _room_left_unused(engine, cp_target) or _breaks_reservation(engine, cp_target)
    if unused is None and cp_terms.objective > greedy_terms.objective + 1e-6:
        decisions = {
            job_id: reason
            for job_id, reason in greedy_decisions.items()
            if reason.code in (ReasonCode.PREEMPTED_BY_HIGHER_PRIORITY, ReasonCode.DEFRAGMENTATION)
        }
        decisions.update(engine.result.decisions)
        plan = build_plan(
            instance,
            policy=policy,
            target=cp_target,
            decisions=decisions,
            pending=dict(engine.result.pending),
            stats=SolveStats(status=solve_status, engine="cp-sat", best_bound=bound),
            terms=cp_terms,
        )
        # Legal by construction; checked anyway, since a wrong plan must never leave here.
        violations = validate(instance, plan)
        if not violations:
            note = f"CP-SAT {solver.status_name(status)}, hint from the {hint_source}"
            return _finish(plan, started_at, note=note)
    plan = greedy_plan(SolveStats(status=solve_status, engine="greedy", best_bound=bound))
    note = f"CP-SAT ({solver.status_name(status)}) found nothing better than the greedy plan"
    if violations:
        note = f"CP-SAT plan failed validation ({violations[0]}); greedy plan kept"
    elif unused is not None:
        note = f"CP-SAT plan did not use the room made for it ({unused}); greedy plan kept"
    return _finish(plan, started_at, note=note)


def _breaks_reservation(engine: GreedyEngine, target: dict[str, dict[str, int]]) -> str | None:
    """A new start in ``target`` on the GPUs the greedy reserved for a starving job that
    would still run at the reservation's time, or None. The model has no per-node
    reservation, so a CP-SAT plan that breaks it loses to the greedy plan."""
    guarded = engine.guarded
    if guarded is None:
        return None
    instance = engine.instance
    _, shadow_time, shadow_nodes = engine.blocked
    reserved = {instance.nodes[n].name for n in shadow_nodes}
    for job_id, held in target.items():
        job = instance.job_by_id[job_id]
        if job.is_running or job.is_elastic or job_id == guarded.id:
            continue
        runtime = job.expected_runtime_s
        if runtime is not None and instance.now + runtime <= shadow_time:
            continue
        if reserved & set(held):
            return f"{job_id} starts on GPUs reserved for {guarded.id}"
    return None


def _room_left_unused(engine: GreedyEngine, target: dict[str, dict[str, int]]) -> str | None:
    """A job the greedy moved or stopped to make room for another that, in ``target``, is
    not on the nodes it left (CP-SAT re-decides the starts), or None.

    The base state keeps the greedy's moves and stops; a plan that places their
    beneficiary elsewhere would stop or move work for nothing, under a reason that is
    not true."""
    for job_id, (beneficiary, nodes) in sorted(engine.made_room_for.items()):
        if not nodes & set(target.get(beneficiary, {})):
            return f"{job_id} made room on {', '.join(sorted(nodes))} for {beneficiary}"
    return None


_NEVER = (ReasonCode.NO_COMPATIBLE_GPU_MODEL,)


SATURATED_NOTE = (
    "CP-SAT skipped: the greedy plan places every placeable job and meets every service's "
    "demand on the fastest GPUs they accept, so no plan holds more allocation"
)


def _best_greedy(
    instance: Instance,
) -> tuple[GreedyEngine, GreedyResult, dict[str, dict[str, int]], ObjectiveTerms, bool]:
    """The greedy in value order; on small queues also in priority order and with
    migration tried before preemption. The one with the best objective, its terms, and
    whether it saturates the allocation (see the module docstring): a saturating plan
    that disrupts nothing ends the search early, as the other variants could only pack
    the same jobs differently."""
    base = greedy_options(instance.config)
    variants = [base]
    pending = sum(1 for job in instance.jobs if not job.is_running)
    if pending <= instance.config.second_greedy_max_pending:
        variants = [
            replace(base, order=order, defrag_first=defrag_first)
            for order in (Order.VALUE, Order.PRIORITY)
            for defrag_first in (False, True)
        ]
    best: (
        tuple[GreedyEngine, GreedyResult, dict[str, dict[str, int]], ObjectiveTerms, bool] | None
    ) = None
    best_value = -math.inf
    compat: Compatibility | None = None  # depends on the instance only: shared by variants
    for options in variants:
        engine = GreedyEngine(instance, options, compat)
        compat = engine.compat
        result = engine.run()
        target = result.target()
        terms = evaluate(instance, target)
        if best is None or terms.objective > best_value + 1e-9:
            saturated = _saturates(instance, engine, target)
            best, best_value = (engine, result, target, terms, saturated), terms.objective
            if saturated and terms.migration == 0 and terms.preemption == 0:
                break
    assert best is not None
    return best


def _saturates(instance: Instance, engine: GreedyEngine, target: dict[str, dict[str, int]]) -> bool:
    """No plan holds more priority-weighted allocation than ``target``: every pending job
    with a ready compatible node is placed (but a frozen one, which no plan may start), no
    running job is stopped, every service has its demand and look-ahead target, and what is
    started or grown runs on the fastest GPU model the job accepts (running jobs keep their
    model: CP-SAT moves them only within their node group)."""
    compat = engine.compat
    node_by_name = instance.node_by_name
    for job in instance.jobs:
        held = target.get(job.id)
        if job.is_elastic:
            replicas = sum(held.values()) // job.gpus_per_replica if held else 0
            if replicas < max(job.demand_at(0), engine.elastic_targets.get(job.id, 0)):
                return False
        elif job.is_running:
            if not held:
                return False
            continue
        elif not held:
            if compat.ready_groups_for(job) and not instance.is_frozen(job):
                return False
            continue
        if not held:
            continue
        # A job on nodes it no longer accepts (a locked service there) can only keep them.
        fastest = max(
            (compat.groups[g].gpu_model.speed for g in compat.groups_for(job)), default=0.0
        )
        if any(instance.speed(node_by_name[name]) < fastest for name in held):
            return False
    return True


def _finish(plan: Plan, started_at: float, *, note: str) -> Plan:
    plan.stats.wall_time_s = time.perf_counter() - started_at
    plan.stats.note = note
    return plan


def _names(instance: Instance, placement: dict[str, dict[int, int]]) -> dict[str, dict[str, int]]:
    nodes = instance.nodes
    return {
        job_id: {nodes[n].name: g for n, g in held.items()}
        for job_id, held in placement.items()
        if held
    }


def _option_for(
    model: PlacementModel, pool_of_node: dict[int, int], job_class: JobClass, held: dict[int, int]
) -> Option | None:
    pools = {pool_of_node.get(node) for node in held}
    if len(pools) != 1:
        return None
    pool = pools.pop()
    for option in model.options_by_class.get(job_class.index, []):
        if option.pool.index == pool:
            return option
    return None


def _greedy_hint(
    model: PlacementModel,
    greedy_starts: dict[str, dict[int, int]],
    greedy_scale_ups: dict[str, dict[int, int]],
) -> list[int]:
    """The greedy's starts and scale-ups as values of every model variable."""
    pool_of_node = {node: pool.index for pool in model.pools for node in pool.nodes}
    values = [0] * len(model.model.proto.variables)
    for job_class in model.classes:
        if job_class.elastic:
            job = job_class.jobs[0]
            for node, gpus in greedy_scale_ups.get(job.id, {}).items():
                option = _option_for(model, pool_of_node, job_class, {node: gpus})
                if option is not None:
                    values[option.var.index] += gpus // job.gpus_per_replica
            continue
        for job in job_class.jobs:
            held = greedy_starts.get(job.id)
            if held:
                option = _option_for(model, pool_of_node, job_class, held)
                if option is not None:
                    values[option.var.index] += 1
    for option in model.options:
        values[option.var.index] = min(values[option.var.index], option.upper)
    for pool in model.pools:
        used = model.whole_nodes_used.get(pool.index)
        if used is not None:
            values[used.index] = whole_nodes_needed(model, pool, lambda v: values[v.index])
    return values


def _add_hints(model: PlacementModel, values: list[int]) -> None:
    for option in model.options:
        model.model.add_hint(option.var, values[option.var.index])
    for used in model.whole_nodes_used.values():
        model.model.add_hint(used, values[used.index])
    for evacuation in model.evacuations:
        if evacuation.var is not None:
            model.model.add_hint(evacuation.var, values[evacuation.var.index])


def _evacuations(engine: GreedyEngine, pools: list[Pool], budget: int) -> list[Evacuation]:
    """Partly used nodes whose residents may all move, grouped into identical kinds."""
    if budget <= 0:
        return []
    state = engine.state
    instance = engine.instance
    horizon = instance.config.value_horizon_s
    pool_by_group = {pool.group: pool for pool in pools}
    kinds: dict[tuple[object, ...], Evacuation] = {}
    for node_index, node in enumerate(instance.nodes):
        residents = state.jobs_on_node[node_index]
        if not state.ready[node_index] or not residents or len(residents) > budget:
            continue
        group = state.compat.group_of_node[node_index]
        jobs = [instance.job_by_id[job_id] for job_id in residents]
        if not all(
            job.id in engine.movable
            and job.id not in engine.touched
            and group in state.compat.groups_for(job)
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
            engine.weight[job.id]
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
        state.place(job, {target: job.total_gpus})
        engine.migrations += 1
        engine.touch(job.id)
        engine.result.decisions[job.id] = Reason(
            code=ReasonCode.DEFRAGMENTATION,
            message=f"moved to {engine.instance.nodes[target].name} to empty whole nodes",
        )


def _realise(model: PlacementModel, solver: cp_model.CpSolver, engine: GreedyEngine) -> None:
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
    for group in sorted(items_by_group):
        items = items_by_group[group]
        items.sort(key=lambda item: (-item[0], item[1].id))
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
                    if cap is not None:
                        room = (cap - state.team_usage[job.team]) // job.gpus_per_replica
                        replicas = min(replicas, room)
                    state.add(job, node, replicas * job.gpus_per_replica)
                    missing -= replicas
                continue
            if cap is not None and state.team_usage[job.team] + job.total_gpus > cap:
                continue
            placement = state.find_gang(job, job.replicas, [group], job.max_nodes)
            if placement is None:
                continue
            state.place(job, placement)
            engine.touch(job.id)
            engine.started_by_team[job.team] = (
                engine.started_by_team.get(job.team, 0) + job.total_gpus
            )


def _fill(engine: GreedyEngine, queue: list[Job], missing: dict[str, int]) -> None:
    """Greedy fill of what the realisation could not place; then reasons for the rest."""
    engine.options = replace(engine.options, migrate=False, preempt=False)
    engine.epoch += 1
    engine.failed_place.clear()
    state = engine.state
    instance = engine.instance
    for job_id in sorted(missing):
        job = instance.job_by_id[job_id]
        short = engine.elastic_targets[job_id] - engine.state_replicas(job)
        if short > 0:
            engine.scale_up(job, short)
        engine.record_elastic(job)
    for job in queue:
        engine.result.decisions.pop(job.id, None)
        engine.result.pending.pop(job.id, None)
    rest = [job for job in queue if job.id not in state.placement]
    engine.place_queue(rest)
    for job in queue:
        held = state.placement.get(job.id)
        if held and job.id not in engine.result.decisions:
            code = ReasonCode.OVERDUE if instance.is_overdue(job) else ReasonCode.PLACED
            engine.result.decisions[job.id] = Reason(
                code=code, message=engine.placed_message(job, held)
            )
    engine.diagnose(queue)


__all__ = ["CP_SAT_STATUS", "GREEDY", "greedy_options", "solve"]
