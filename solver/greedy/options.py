"""What configures a greedy pass: the queue order, how services are sized, which levers
(preemption, migration, look-ahead, backfill) it may pull. One options value per policy
(``solver.policies``) and one for the shaper (``solver.greedy_variants``)."""

from __future__ import annotations

import enum
import math
import weakref
from dataclasses import dataclass

from solver.instance import Instance, Job


class Order(enum.StrEnum):
    ARRIVAL = "arrival"
    PRIORITY = "priority"
    VALUE = "value"


class ElasticMode(enum.StrEnum):
    PEAK = "peak"  # reserve the daily peak, never scale down (the study's FIFO baseline)
    DEMAND = "demand"  # follow the forecast for now


@dataclass(frozen=True)
class GreedyOptions:
    engine: str = "greedy"
    order: Order = Order.VALUE
    elastic: ElasticMode = ElasticMode.DEMAND
    strict_fifo: bool = False
    backfill: bool = False
    preempt: bool = False
    migrate: bool = False
    lookahead: bool = False
    defrag_first: bool = False  # try migration before preemption for a job that does not fit
    # Defragmentation may also move service replicas off a node it clears for a job.
    move_replicas: bool = False
    # The first job in the policy's order that starves (``Instance.is_starving``) and does
    # not fit gets an EASY-backfill reservation that every later job must leave alone.
    starvation_guard: bool = False
    preemption_candidates: int = 32  # nodes looked at per preemption attempt
    # A service short of its demand may move (``migrate``) or stop (``preempt``) block work
    # to grow (``solver.greedy.elastic``): the shaper's configuration.
    disrupt_for_services: bool = False
    # Single-node placements (replicas, small jobs, moves) leave free GPUs the waiting gangs
    # can use rather than best fit's holes (``solver.gang_fit``).
    gang_aware: bool = False
    # A stop is weighed over the run time the victim has left (``solver.greedy.preemption``):
    # a job about to end is not stopped, losing its work, for a job that could soon have its
    # GPUs anyway. The baselines stop by priority alone, as Kueue does.
    stops_weigh_time_left: bool = False
    # A pending job may stop longer work of no more weight (``SolverConfig.shortest_remaining``,
    # ``solver.greedy.shortest_remaining``): the shaper's, when its config asks for it.
    shortest_remaining: bool = False
    # Each job's own speed on each model (``Instance.speeds``) orders the models it tries and
    # weighs its moves and stops (``SolverConfig.job_speeds``): the shaper's. The baselines
    # know one speed per model, as Kueue's flavors and Slurm's partitions do.
    job_speeds: bool = False
    # Running checkpointable jobs move onto GPUs faster for them that are free after the
    # queue is placed (``SolverConfig.upgrades``, ``solver.greedy.upgrades``).
    upgrades: bool = False
    # ... gangs that span nodes as well (``SolverConfig.gang_upgrades``).
    gang_upgrades: bool = False

    @property
    def grows_services_by_disruption(self) -> bool:
        return self.disrupt_for_services and (self.preempt or self.migrate)


# The keys of the last instance asked for, by a weak reference (an instance is immutable,
# so its keys never change): the shaper asks twice per plan, for its greedy pass and for
# the CP-SAT pass's queue, and at 100,000 GPUs each computation took a fifth of a second.
_last: tuple[weakref.ref[Instance], Order, dict[str, tuple[object, ...]]] | None = None


def sort_key(instance: Instance, order: Order) -> dict[str, tuple[object, ...]]:
    """Queue position of every job; jobs past their max queue wait first in every order.
    The mapping returned may be shared with other callers: read it, never change it."""
    global _last
    last = _last
    if last is not None and last[0]() is instance and last[1] is order:
        return last[2]
    keys = _sort_key(instance, order)
    _last = (weakref.ref(instance), order, keys)
    return keys


def _sort_key(instance: Instance, order: Order) -> dict[str, tuple[object, ...]]:
    keys: dict[str, tuple[object, ...]] = {}
    shortest = instance.config.shortest_first
    head_start = instance.config.queue_head_start
    cap = instance.config.queue_head_start_cap_s
    critical = instance.config.critical_first
    overdue_ids = instance.overdue_ids  # Instance.is_overdue of each of its own jobs
    for job in instance.jobs:
        overdue = 0 if job.id in overdue_ids else 1
        if order is Order.ARRIVAL:
            keys[job.id] = (overdue, job.submit_time, job.id)
        elif order is Order.PRIORITY:
            keys[job.id] = (overdue, -instance.weight(job), job.submit_time, job.id)
        else:
            if critical and instance.is_critical(job):
                # config.critical_first: ahead of the rest of its weight, the longest first.
                within: tuple[int, float] = (0, -_run_time_left(job))
            else:
                within = (1, _queue_time(job, head_start, cap) if shortest else 0.0)
            keys[job.id] = (
                overdue,
                -instance.weight(job) * instance.boost(job),  # aging credit included
                *within,
                -job.total_gpus,
                job.submit_time,
                job.id,
            )
    return keys


def _queue_time(job: Job, head_start: float | None, cap: float | None) -> float:
    """Shortest first's place within a weight: the run time left, or with a head start
    (``SolverConfig.queue_head_start``) the submission time plus that multiple of the run
    time left (at most ``queue_head_start_cap_s``): a job that has waited longer than
    another by more than the difference goes first."""
    run_time = _run_time_left(job)
    if head_start is None or math.isinf(run_time):
        return run_time
    ahead = head_start * run_time
    return job.submit_time + (ahead if cap is None else min(ahead, cap))


def _run_time_left(job: Job) -> float:
    """A block job's expected run time left (``SolverConfig.shortest_first``); a service,
    or a job nobody estimated, sorts after every estimated one of its weight."""
    if job.is_elastic or job.expected_runtime_s is None:
        return math.inf
    return job.expected_runtime_s
