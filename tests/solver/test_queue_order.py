"""The head start in shortest first's order (``SolverConfig.queue_head_start``, off by
default): among pending jobs of one weight the key is submission time + alpha × expected
run time left, so that a long job that has waited longer than a shorter one by more than
alpha × the difference of their run times goes first; ``queue_head_start_cap_s`` bounds
the head start."""

from __future__ import annotations

from solver.greedy import Order, sort_key
from solver.instance import Job, SolverConfig
from solver.policies import get_policy

from .builders import FAST, NOW, instance, job, node

HOUR = 3600.0


def _config(**update: object) -> SolverConfig:
    return FAST.model_copy(update=update)


def _started(jobs: list[Job], config: SolverConfig) -> set[str]:
    plan = get_policy("shaper").plan(instance([node("n1", gpus=8)], jobs, config=config))
    return set(plan.placement)


def _long_and_short(long_waited_h: float) -> list[Job]:
    """Two gangs of one weight, each filling the node: a 10 h job that has waited
    ``long_waited_h`` and a 1 h newcomer (waits under ``aging_s``: no aging credit)."""
    return [
        job(
            "long", replicas=8, expected_runtime_s=10 * HOUR, submit_time=NOW - long_waited_h * HOUR
        ),
        job("short", replicas=8, expected_runtime_s=HOUR, submit_time=NOW),
    ]


def test_a_long_job_goes_first_once_its_wait_exceeds_alpha_times_the_difference() -> None:
    half = _config(queue_head_start=0.5)  # the short job's head start: 0.5 × 9 h = 4.5 h
    assert _started(_long_and_short(6), FAST) == {"short"}  # today: shortest first
    assert _started(_long_and_short(6), half) == {"long"}
    assert _started(_long_and_short(4), half) == {"short"}
    # 0: oldest first within the weight, whatever the run times.
    assert _started(_long_and_short(0.1), _config(queue_head_start=0.0)) == {"long"}


def test_the_cap_bounds_the_head_start() -> None:
    uncapped = _config(queue_head_start=1.0)  # head start 9 h
    capped = _config(queue_head_start=1.0, queue_head_start_cap_s=2 * HOUR)
    assert _started(_long_and_short(3), uncapped) == {"short"}
    # Each job's head start is at most 2 h: long -3 h + 2 h against short 0 + 1 h.
    assert _started(_long_and_short(3), capped) == {"long"}
    assert _started(_long_and_short(0.5), capped) == {"short"}


def test_weight_aging_and_unestimated_jobs_keep_their_place() -> None:
    config = _config(queue_head_start=0.0)
    jobs = [
        job("light-old", replicas=8, expected_runtime_s=HOUR, submit_time=NOW - 5 * HOUR),
        job("heavy-new", replicas=8, expected_runtime_s=20 * HOUR, priority=2.0),
        job("unknown-old", replicas=8, submit_time=NOW - 9 * HOUR),
        job("aged", replicas=8, expected_runtime_s=30 * HOUR, submit_time=NOW - 13 * HOUR),
    ]
    keys = sort_key(instance([node("n1")], jobs, config=config), Order.VALUE)
    order = sorted(keys, key=keys.__getitem__)
    # heavy-new (2) and aged (1 + one 12 h step) tie on value; the older goes first.
    assert order == ["aged", "heavy-new", "light-old", "unknown-old"]


def test_off_by_default() -> None:
    assert SolverConfig().queue_head_start is None
    assert SolverConfig().queue_head_start_cap_s is None
