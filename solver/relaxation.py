"""LP relaxation of the placement model, solved with GLOP, rounded into a CP-SAT hint.

The aggregated model is close to a transportation problem: its LP optimum is nearly
integral. CP-SAT on two workers can take seconds to walk from the greedy hint to that
optimum; a short LP dive (round the most fractional count up, re-solve) followed by
rounding down and a greedy top-up lands next to it in milliseconds. Rounding down
keeps every ``≤`` constraint (all coefficients are non-negative); ``whole_nodes_used`` is
recomputed, and a hint that breaks a ``≥`` constraint (a team's guarantee) is discarded.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

from ortools.linear_solver import pywraplp

from solver.compat import Compatibility
from solver.constraints.capacity import maxfill
from solver.constraints.fragmentation import whole_nodes_needed
from solver.instance import Instance, NodeState

if TYPE_CHECKING:
    from solver.model import PlacementModel

_FAR = 1 << 61
DIVE_STEPS = 40
DIVE_SECONDS = 0.3
DIVE_MAX_OPTIONS = 2000


Row = tuple[list[int], list[int], int, int]  # variables, coefficients, low, high


def _rows(model: PlacementModel) -> list[Row] | None:
    rows: list[Row] = []
    for constraint in model.model.proto.constraints:
        linear = constraint.linear
        if len(constraint.enforcement_literal) or not len(linear.vars):
            return None  # not a plain linear model
        domain = list(linear.domain)
        rows.append((list(linear.vars), list(linear.coeffs), domain[0], domain[-1]))
    return rows


def lp_rounded(model: PlacementModel) -> tuple[list[int], float] | None:
    """Values per model variable and the LP optimum (in model units), or None."""
    rows = _rows(model)
    lp = pywraplp.Solver.CreateSolver("GLOP")
    if rows is None or lp is None:
        return None
    infinity = lp.infinity()
    variables = []
    for index, var in enumerate(model.model.proto.variables):
        domain = list(var.domain)
        variables.append(lp.NumVar(float(domain[0]), float(domain[-1]), f"x{index}"))
    for var_indices, coefficients, low, high in rows:
        row = lp.Constraint(
            float(low) if low > -_FAR else -infinity, float(high) if high < _FAR else infinity
        )
        for var_index, coefficient in zip(var_indices, coefficients, strict=True):
            row.SetCoefficient(variables[var_index], float(coefficient))
    objective = lp.Objective()
    for coefficient, var in model.objective_terms:
        objective.SetCoefficient(variables[var.index], float(coefficient))
    objective.SetMaximization()
    if lp.Solve() != pywraplp.Solver.OPTIMAL:
        return None
    bound = objective.Value()
    first = [v.solution_value() for v in variables]
    best: list[int] | None = None
    # Round the LP optimum, and the end of a short dive from it; keep the better. Large
    # models have many items per count, so the dive gains little there and costs time.
    starts = [first]
    if len(model.options) <= DIVE_MAX_OPTIONS:
        starts.append(_dive(model, lp, variables, first))
    for fractional in starts:
        values = [math.floor(x + 1e-6) for x in fractional]
        _top_up(model, rows, values, fractional)
        _repair_whole_nodes(model, values)
        if _feasible(rows, values) and (
            best is None or objective_of(model, values) > objective_of(model, best)
        ):
            best = values
    return None if best is None else (best, bound)


def _dive(
    model: PlacementModel,
    lp: pywraplp.Solver,
    variables: list[pywraplp.Variable],
    solution: list[float],
) -> list[float]:
    """LP diving: round the most fractional placement up (or, if that is infeasible, down)
    and re-solve, a few times within a small time budget; returns the last LP solution."""
    started = time.perf_counter()
    option_vars = [o.var.index for o in model.options]
    for _ in range(DIVE_STEPS):
        if time.perf_counter() - started > DIVE_SECONDS:
            break
        fractions = [
            (solution[i] - math.floor(solution[i] + 1e-6), i)
            for i in option_vars
            if solution[i] - math.floor(solution[i] + 1e-6) > 1e-6
        ]
        if not fractions:
            break
        _, index = max(fractions)
        variable = variables[index]
        low, high = variable.lb(), variable.ub()
        variable.SetLb(float(math.ceil(solution[index])))
        if lp.Solve() != pywraplp.Solver.OPTIMAL:
            variable.SetLb(low)
            variable.SetUb(float(math.floor(solution[index])))
            if lp.Solve() != pywraplp.Solver.OPTIMAL:
                variable.SetUb(high)
                break
        solution = [v.solution_value() for v in variables]
    return solution


def _top_up(
    model: PlacementModel, rows: list[Row], values: list[int], fractional: list[float]
) -> None:
    """Add back whole items while every ``≤`` row has room: rounded-away ones first, then
    the most valuable. Rows on whole nodes used are repaired afterwards instead."""
    skip = {used.index for used in model.whole_nodes_used.values()}
    activity: list[int] = []
    highs: list[int] = []
    rows_of: dict[int, list[tuple[int, int]]] = {}
    for row, (var_indices, coefficients, _, high) in enumerate(rows):
        pairs = list(zip(var_indices, coefficients, strict=True))
        activity.append(sum(values[v] * c for v, c in pairs))
        highs.append(high)
        if not any(v in skip for v in var_indices):
            for var_index, coefficient in pairs:
                rows_of.setdefault(var_index, []).append((row, coefficient))
    value_of = {var.index: coefficient for coefficient, var in model.objective_terms}
    options = [o for o in model.options if value_of.get(o.var.index, 0) > 0]
    options.sort(
        key=lambda o: (
            -(fractional[o.var.index] - values[o.var.index] > 1e-6),
            -value_of[o.var.index] / max(1, o.nodes * o.chunk_gpus),
            o.var.index,
        )
    )
    for option in options:
        index = option.var.index
        touched = rows_of.get(index, [])
        while values[index] < option.upper and all(
            activity[row] + coefficient <= highs[row] for row, coefficient in touched
        ):
            values[index] += 1
            for row, coefficient in touched:
                activity[row] += coefficient


def _repair_whole_nodes(model: PlacementModel, values: list[int]) -> None:
    for pool in model.pools:
        used = model.whole_nodes_used.get(pool.index)
        if used is not None:
            values[used.index] = whole_nodes_needed(model, pool, lambda v: values[v.index])


def _feasible(rows: list[Row], values: list[int]) -> bool:
    for var_indices, coefficients, low, high in rows:
        total = sum(values[v] * c for v, c in zip(var_indices, coefficients, strict=True))
        if not low <= total <= high:
            return False
    return True


def objective_of(model: PlacementModel, values: list[int]) -> int:
    return sum(coefficient * values[var.index] for coefficient, var in model.objective_terms)


def global_upper_bound(instance: Instance) -> float:
    """An upper bound on the objective of *any* legal plan, from one LP.

    Relaxed: packing beyond a per-level condition (as in ``capacity``), gang spreads, node
    states, migration costs and budgets, the priority order of preemption, guarantees,
    look-ahead, CPU and memory. Kept: compatibility, GPUs per node, team quota caps,
    elastic demand, the cost of stopping a running job and the preemption limits (an
    elastic training job the shaper may resize counts at any size up to its maximum, with
    neither: what a plan gains from it is at most that). Jobs
    that can neither move nor stop stay where they are (frozen ones included: see
    ``Instance.is_frozen``; a frozen pending job stays pending); jobs that may move but
    not stop stay placed. Looser than the CP-SAT bound, which holds for the placement
    problem left after the greedy's disruptive decisions; the benchmark reports both. Most
    of the difference is the migration budget: the LP may repack every checkpointable job.
    """
    config = instance.config
    compat = Compatibility(instance)
    lp = pywraplp.Solver.CreateSolver("GLOP")
    if lp is None:
        return math.inf
    node_index = {node.name: i for i, node in enumerate(instance.nodes)}
    constant = 0.0
    by_group: dict[int, list[tuple[pywraplp.Variable, int, int]]] = {}  # var, GPUs, chunk
    fixed_on_node = [0] * len(instance.nodes)
    by_team: dict[str, list[tuple[pywraplp.Variable, int]]] = {}
    objective = lp.Objective()
    stoppable: list[list[pywraplp.Variable]] = []
    for job in instance.jobs:
        weight = instance.weight(job)
        frozen = instance.is_frozen(job)
        if frozen and not job.placement:
            continue  # no plan may start it
        if frozen and job.is_elastic:
            # A locked service keeps its replicas: what they serve is a constant.
            speeds: list[float] = []
            for node_name, gpus in job.placement.items():
                node = instance.node_by_name[node_name]
                fixed_on_node[node_index[node_name]] += gpus
                speeds += [instance.speed(node)] * (gpus // job.gpus_per_replica)
            demand = job.demand_at(0)
            served = sorted(speeds, reverse=True)[:demand]
            constant += weight * job.gpus_per_replica * sum(served)
            unmet = max(0, demand - len(speeds))
            constant -= config.elastic_unmet_weight * weight * job.gpus_per_replica * unmet
            continue
        running_block = not job.is_elastic and bool(job.placement)
        limit = instance.policy_for(job).max_preemptions_per_day
        can_stop = (
            running_block
            and not frozen
            and instance.is_preemptible(job)
            and (limit is None or job.preemptions_today < limit)
        )
        if running_block and (frozen or not (job.checkpointable or can_stop)):
            for node_name, gpus in job.placement.items():
                node = instance.node_by_name[node_name]
                fixed_on_node[node_index[node_name]] += gpus
                constant += weight * gpus * instance.job_speed(job, node.gpu_model)
            continue
        # An elastic training job the shaper may resize (``solver.elastic_training``).
        resizable = (
            job.is_resizable
            and config.elastic_training
            and (not job.placement or job.checkpointable)
        )
        # Where it may go, and where it is (a job may stay on a node it no longer matches).
        here = {compat.group_of_node[node_index[name]] for name in job.placement}
        groups = sorted(set(compat.groups_for(job)) | here)
        if job.is_elastic:
            size, upper = job.gpus_per_replica, job.demand_at(0)
            chunk = size
            unit = weight * size
            constant -= config.elastic_unmet_weight * unit * upper
            value = [
                unit * (g.gpu_model.speed + config.elastic_unmet_weight) for g in compat.groups
            ]
        else:
            upper = 1
            if resizable:
                # Any size up to its maximum, in replicas: a plan may place it partly (at
                # least its minimum if it runs and may not stop).
                size, chunk = (job.max_replicas or 0) * job.gpus_per_replica, job.gpus_per_replica
            else:
                size = job.held_gpus or job.total_gpus  # what it holds, if it runs
                one_node = job.replicas == 1 or job.max_nodes == 1
                chunk = size if one_node else job.gpus_per_replica  # a gang may split
            boost = instance.boost(job)
            value = [
                weight * boost * size * instance.job_speed(job, g.gpu_model.name)
                for g in compat.groups
            ]
        if not groups or upper <= 0:
            continue
        variables = [lp.NumVar(0.0, float(upper), "") for _ in groups]
        # A running job that may move but not stop is placed somewhere; one that stops
        # loses its work since the last checkpoint (the objective's preemption term).
        lowest = job.min_replicas / max(1, job.max_replicas or 1) if resizable else 1.0
        row = lp.Constraint(lowest if running_block and not can_stop else 0.0, float(upper))
        lost = 0.0
        if can_stop and not resizable:  # (a resizable job's stop cost and cap: dropped)
            seconds = instance.migration.preemption_lost_seconds(job, instance.now)
            lost = weight * job.held_gpus * seconds / config.value_horizon_s
            constant -= lost
            stoppable.append(variables)
        for group, variable in zip(groups, variables, strict=True):
            row.SetCoefficient(variable, 1.0)
            objective.SetCoefficient(variable, value[group] + lost)
            by_group.setdefault(group, []).append((variable, size, chunk))
            by_team.setdefault(job.team, []).append((variable, size))
    # Packing per node group (draining and down nodes too: work there may stay): what the
    # fixed jobs leave free on each node, by level; items of
    # at least t GPUs fill at most maxfill(free, sizes ≥ t) of a node (valid for any plan).
    levels: dict[int, dict[int, int]] = {}
    for index, node in enumerate(instance.nodes):
        free = max(0, node.gpus - fixed_on_node[index])
        group_levels = levels.setdefault(compat.group_of_node[index], {})
        group_levels[free] = group_levels.get(free, 0) + 1
    for group, items in by_group.items():
        sizes = sorted({chunk for _, _, chunk in items}, reverse=True)
        for threshold in sizes:
            allowed = [size for size in sizes if size >= threshold]
            room = sum(
                count * maxfill(free, allowed) for free, count in levels.get(group, {}).items()
            )
            row = lp.Constraint(0.0, float(room))
            for variable, gpus, chunk in items:
                if chunk >= threshold:
                    row.SetCoefficient(variable, float(gpus))
    for team, team_items in by_team.items():
        rule = instance.policy_by_team.get(team)
        quota_cap = rule.quota_cap if rule is not None else None
        if quota_cap is not None:
            outside = instance.quota_held_outside.get(team, 0)
            current = outside + sum(job.held_gpus for job in instance.jobs if job.team == team)
            row = lp.Constraint(0.0, float(max(quota_cap, current) - outside))
            for variable, size in team_items:
                row.SetCoefficient(variable, float(size))
    cap = config.max_preemptions_per_cycle
    if cap is not None and stoppable:
        row = lp.Constraint(float(len(stoppable) - cap), lp.infinity())
        for variables in stoppable:
            for variable in variables:
                row.SetCoefficient(variable, 1.0)
    objective.SetMaximization()
    if lp.Solve() != pywraplp.Solver.OPTIMAL:
        return math.inf
    whole_nodes = sum(1 for node in instance.nodes if node.state is NodeState.up and node.gpus > 0)
    return constant + float(objective.Value()) + config.fragmentation_weight * whole_nodes
