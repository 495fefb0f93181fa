"""Shortest first (``SolverConfig.shortest_first``, on by default): among pending jobs of
one weight the value order starts the least expected run time left first; off, it starts
the larger gang (and, among equals, the older job)."""

from __future__ import annotations

from solver.instance import Job, SolverConfig
from solver.policies import get_policy

from .builders import FAST, NOW, instance, job, node

HOUR = 3600.0
SHORTEST = FAST
LARGEST = FAST.model_copy(update={"shortest_first": False})
assert SHORTEST.shortest_first


def _started(jobs: list[Job], config: SolverConfig) -> set[str]:
    plan = get_policy("shaper").plan(instance([node("n1", gpus=8)], jobs, config=config))
    return set(plan.placement)


def test_of_two_equal_gangs_the_shorter_starts_and_off_the_older() -> None:
    jobs = [
        job("long", replicas=8, expected_runtime_s=10 * HOUR, submit_time=NOW - 2 * HOUR),
        job("short", replicas=8, expected_runtime_s=HOUR, submit_time=NOW - HOUR),
    ]
    assert _started(jobs, LARGEST) == {"long"}
    assert _started(jobs, SHORTEST) == {"short"}


def test_short_small_jobs_go_before_a_long_gang_of_the_same_weight() -> None:
    jobs = [
        job("gang", replicas=8, expected_runtime_s=10 * HOUR, submit_time=NOW - 3 * HOUR),
        job("a", replicas=4, expected_runtime_s=HOUR, submit_time=NOW - HOUR),
        job("b", replicas=4, expected_runtime_s=2 * HOUR, submit_time=NOW - HOUR),
    ]
    assert _started(jobs, LARGEST) == {"gang"}
    assert _started(jobs, SHORTEST) == {"a", "b"}


def test_weight_still_comes_first_and_unestimated_jobs_come_after_estimated_ones() -> None:
    jobs = [
        job("heavy-long", replicas=8, expected_runtime_s=20 * HOUR, priority=2.0),
        job("light-short", replicas=8, expected_runtime_s=HOUR),
    ]
    assert _started(jobs, SHORTEST) == {"heavy-long"}
    unestimated = [
        job("unknown", replicas=8, submit_time=NOW - 5 * HOUR),
        job("known", replicas=8, expected_runtime_s=30 * HOUR, submit_time=NOW - HOUR),
    ]
    assert _started(unestimated, LARGEST) == {"unknown"}
    assert _started(unestimated, SHORTEST) == {"known"}
