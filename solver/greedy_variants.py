"""Phase 1 of ``solver.solve``: the shaper's greedy passes, the best of them, and whether
it saturates the allocation (so that no further search can gain).

The greedy runs in value order; on queues up to ``config.second_greedy_max_pending``
also in priority order and with migration tried before preemption, keeping the plan with
the best objective. *Saturation*: when a greedy plan leaves nothing waiting that any plan
could place, meets every service's demand (and look-ahead target), and runs every job it
starts or grows on the fastest GPU model that job accepts, its priority-weighted
allocation is the most any plan can hold. A saturating plan that also disrupts nothing
ends the search among variants early, as the others could only pack the same jobs
differently.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from solver.compat import Compatibility
from solver.greedy import ElasticMode, GreedyEngine, GreedyOptions, GreedyResult, Order
from solver.instance import Instance, SolverConfig
from solver.objective import Evaluator, ObjectiveTerms

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
    move_replicas=True,
    stops_weigh_time_left=True,
)


def greedy_options(config: SolverConfig) -> GreedyOptions:
    """The shaper's greedy options with the config's levers applied (ablations)."""
    return replace(
        GREEDY,
        migrate=config.migration or config.cross_cluster_migration,
        preempt=config.preemption,
        lookahead=config.lookahead,
        elastic=ElasticMode.DEMAND if config.elastic_resize else ElasticMode.PEAK,
        gang_aware=config.gang_aware_placement,
        move_replicas=config.replica_moves,
        shortest_remaining=config.shortest_remaining,
        job_speeds=config.job_speeds,
        upgrades=config.upgrades and config.migration,
        gang_upgrades=config.gang_upgrades,
    )


@dataclass
class BestGreedy:
    engine: GreedyEngine  # the pass that produced it, which the CP-SAT pass goes on in
    result: GreedyResult
    target: dict[str, dict[str, int]]  # job -> node name -> GPUs
    terms: ObjectiveTerms
    saturated: bool
    # Scored every variant; the CP-SAT pass scores its placements of the instance with it.
    evaluator: Evaluator


def best_greedy(instance: Instance) -> BestGreedy:
    """The greedy variant with the best objective (see the module docstring)."""
    base = greedy_options(instance.config)
    variants = [base]
    pending = sum(1 for job in instance.jobs if not job.is_running)
    if pending <= instance.config.second_greedy_max_pending:
        variants = [
            replace(base, order=order, defrag_first=defrag_first)
            for order in (Order.VALUE, Order.PRIORITY)
            for defrag_first in (False, True)
        ]
    best: BestGreedy | None = None
    best_value = -math.inf
    compat: Compatibility | None = None  # depends on the instance only: shared by variants
    evaluator = Evaluator(instance)
    for options in variants:
        engine = GreedyEngine(instance, options, compat)
        compat = engine.compat
        result = engine.run()
        target = result.target()
        terms = evaluator.evaluate(target)
        if best is None or terms.objective > best_value + 1e-9:
            saturated = saturates(instance, engine, target)
            best = BestGreedy(engine, result, target, terms, saturated, evaluator)
            best_value = terms.objective
            if saturated and terms.migration == 0 and terms.preemption == 0:
                break
    assert best is not None
    return best


def saturates(instance: Instance, engine: GreedyEngine, target: dict[str, dict[str, int]]) -> bool:
    """No plan holds more priority-weighted allocation than ``target``: every pending job
    with a ready compatible node is placed (but a frozen one, which no plan may start), no
    running job is stopped, every service has its demand and look-ahead target, and what is
    started or grown runs on the fastest GPU model the job accepts (running jobs keep their
    model: CP-SAT moves them only within their node group), and no job starts away from
    its home cluster (that start pays a transfer: a plan without it may be worth more)."""
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
        if job.home_cluster is not None and not job.is_running:
            if any(node_by_name[name].cluster != job.home_cluster for name in held):
                return False
        # A job on nodes it no longer accepts (a locked service there) can only keep them.
        fastest = max(
            (
                instance.job_speed(job, compat.groups[g].gpu_model.name)
                for g in compat.groups_for(job)
            ),
            default=0.0,
        )
        if any(instance.job_speed(job, node_by_name[name].gpu_model) < fastest for name in held):
            return False
    return True
