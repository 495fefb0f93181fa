"""Aging credit (``SolverConfig.aging_s``): a pending job's value grows with its wait, in
whole steps, only when switched on; past the SLA's max wait the overdue boost takes over."""

from __future__ import annotations

from solver.instance import SlaPolicy
from solver.policies import get_policy

from .builders import FAST, NOW, instance, job, node, running

HOUR = 3600.0
AGING = FAST.model_copy(update={"aging_s": 2 * HOUR})


def test_boost_counts_whole_aging_steps_of_pending_jobs_only() -> None:
    inst = instance(
        [node("n1")],
        [
            job("fresh", submit_time=NOW - 60),
            job("old", submit_time=NOW - 5 * HOUR),  # 2 whole steps
            running("busy", {"n1": 1}, submit_time=NOW - 9 * HOUR),
        ],
        config=AGING,
    )
    boost = {j.id: inst.boost(j) for j in inst.jobs}
    assert boost == {"fresh": 1.0, "old": 3.0, "busy": 1.0}


def test_aging_is_12_hours_by_default_none_turns_it_off_and_overdue_outranks_it() -> None:
    old = job("old", submit_time=NOW - 50 * HOUR, team="t")
    assert instance([node("n1")], [old]).boost(old) == 5.0  # 4 whole steps of 12 h
    off = FAST.model_copy(update={"aging_s": None})
    assert instance([node("n1")], [old], config=off).boost(old) == 1.0
    bounded = instance(
        [node("n1")],
        [old],
        policies=(SlaPolicy(team="t", max_queue_wait_s=HOUR),),
        config=AGING,
    )
    assert bounded.boost(old) == AGING.overdue_weight


def test_the_value_order_starts_the_job_that_waited_longest_first() -> None:
    # One free GPU: without aging the heavier newcomer (weight 2) wins it; with 2-hour aging
    # the job that waited 7 h counts 1 × (1 + 3 steps) = 4 and goes first.
    jobs = [
        job("waited", submit_time=NOW - 7 * HOUR),
        job("newcomer", submit_time=NOW - 60, priority=2.0),
    ]
    without = get_policy("shaper").plan(instance([node("n1", gpus=1)], jobs))
    with_aging = get_policy("shaper").plan(instance([node("n1", gpus=1)], jobs, config=AGING))
    assert set(without.placement) == {"newcomer"}
    assert set(with_aging.placement) == {"waited"}
