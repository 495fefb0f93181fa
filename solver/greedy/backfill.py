"""EASY backfill around a blocked job: the blocked job gets a reservation at the earliest
time running jobs' expected runtimes free enough GPUs for it (its *shadow*); a later job
may start now if it ends before that time, or anywhere off the reserved nodes.

Used by strict FIFO with backfill (Slurm-like) and by the starvation guard, which
reserves for the first starving job that does not fit. Jobs without
``expected_runtime_s`` never end early.
"""

from __future__ import annotations

import math

from solver.greedy.ledger import Ledger
from solver.instance import Job


def shadow(ledger: Ledger, head: Job, groups: list[int]) -> tuple[float, set[int]]:
    """Earliest time the head job fits as running jobs end, and the nodes it would use."""
    instance = ledger.instance
    state = ledger.state
    now = instance.now
    ends: list[tuple[float, str]] = []
    for job_id in state.placement:
        job = instance.job_by_id[job_id]
        if job.is_elastic or job.expected_runtime_s is None:
            continue
        start = now if job.id in ledger.touched else (job.start_time or now)
        ends.append((start + job.expected_runtime_s, job_id))
    ends.sort()
    mark = state.mark()
    found: tuple[float, set[int]] = (math.inf, set())
    for end, job_id in ends:
        state.evict(instance.job_by_id[job_id])
        placement = state.find_gang(head, head.replicas, groups, head.max_nodes)
        if placement is not None:
            found = (end, set(placement))
            break
    state.rollback(mark)
    return found


def nodes_to_avoid(
    ledger: Ledger, job: Job, shadow_time: float, shadow_nodes: set[int]
) -> set[int] | None:
    """The nodes ``job`` must stay off to leave the reservation alone: none if it ends
    before the reservation's time."""
    runtime = job.expected_runtime_s
    if runtime is not None and ledger.instance.now + runtime <= shadow_time:
        return None
    return shadow_nodes or None
