"""The end of a queue (``SolverConfig.critical_first``, off by default): a pending job whose
expected run time is at least the cluster's drain time (``Instance.drain_time_s``) starts
before shorter jobs of its weight, the longest first, since every hour it waited would
be an hour on the last completion."""

from __future__ import annotations

import pytest

from solver.greedy import Order, sort_key
from solver.instance import Job, NodeState, SolverConfig

from .builders import FAST, NOW, instance, job, node, running, service
from .test_queue_order import _started as started_on_one_node

HOUR = 3600.0
ON = FAST.model_copy(update={"critical_first": True})


def test_drain_time_is_the_block_work_over_the_gpus_services_leave_on_average() -> None:
    jobs = [
        running("busy", {"n1": 2}, expected_runtime_s=10 * HOUR),  # started 1 h ago: 9 h left
        job("small", expected_runtime_s=4 * HOUR),
        job("pair", gpus=2, expected_runtime_s=20 * HOUR),
        job("unknown", gpus=2),  # no estimate: left out
        service("chat", forecast=(1, 3, 2), placement={"n2": 3}),  # mean 2 replicas, not 3
    ]
    nodes = [node("n1", gpus=4), node("n2", gpus=4), node("n3", gpus=4, state=NodeState.down)]
    inst = instance(nodes, jobs)
    # (2 × 9 h + 1 × 4 h + 2 × 20 h) of GPU-time over 8 GPUs less 2 for the service.
    assert inst.drain_time_s == pytest.approx(62 * HOUR / 6)
    assert inst.is_critical(inst.job_by_id["pair"])  # 20 h ≥ 10.3 h
    assert not inst.is_critical(inst.job_by_id["small"])
    assert not inst.is_critical(inst.job_by_id["unknown"])


def test_running_jobs_count_their_time_left_and_are_never_critical() -> None:
    long_ago = NOW - 100 * HOUR
    jobs = [
        # 101 h estimated from a start 100 h ago: 1 h left; past its estimate: nothing.
        running("nearly", {"n1": 4}, expected_runtime_s=101 * HOUR, start_time=long_ago),
        running("overdue", {"n1": 4}, expected_runtime_s=50 * HOUR, start_time=long_ago),
        job("next", replicas=8, expected_runtime_s=3 * HOUR),
    ]
    inst = instance([node("n1")], jobs)
    assert inst.drain_time_s == pytest.approx((4 * 1 + 8 * 3) * HOUR / 8)
    assert not inst.is_critical(inst.job_by_id["nearly"])  # 101 h ≥ 3.5 h, but it runs
    assert not inst.is_critical(inst.job_by_id["next"])  # 3 h against 3.5 h
    # Exactly the drain time counts: a pending job alone is its own drain.
    alone = instance([node("n1")], [job("only", replicas=8, expected_runtime_s=5 * HOUR)])
    assert alone.drain_time_s == pytest.approx(5 * HOUR)
    assert alone.is_critical(alone.job_by_id["only"])


def test_a_share_counts_its_part_of_a_gpu_and_a_service_its_replica_bounds() -> None:
    jobs = [
        job("share", gpu_milli=250, expected_runtime_s=8 * HOUR),
        job("whole", expected_runtime_s=2 * HOUR),
        # A forecast of 0 under min_replicas 2 still takes 2 GPUs.
        service("chat", forecast=(0, 0), min_replicas=2),
    ]
    inst = instance([node("n1", gpus=4)], jobs)
    assert inst.drain_time_s == pytest.approx((0.25 * 8 + 2) * HOUR / 2)


def test_drain_time_is_infinite_when_services_would_hold_every_gpu() -> None:
    inst = instance(
        [node("n1", gpus=2)],
        [job("a", expected_runtime_s=HOUR), service("chat", forecast=(2, 2))],
    )
    assert inst.drain_time_s == float("inf")
    assert not inst.is_critical(inst.job_by_id["a"])


def _queue(long_h: float) -> list[Job]:
    """One node of 8 GPUs with 4 free; two pending 4-GPU jobs of one weight, a 2 h one and
    a ``long_h`` one. The drain time is (4 × 5 + 4 × 2 + 4 × long_h) / 8 hours."""
    return [
        running("busy", {"n1": 4}, expected_runtime_s=6 * HOUR),  # started 1 h ago
        job("short", replicas=4, expected_runtime_s=2 * HOUR),
        job("long", replicas=4, expected_runtime_s=long_h * HOUR),
    ]


def _started(jobs: list[Job], config: SolverConfig) -> set[str]:
    return started_on_one_node(jobs, config) - {"busy"}


def test_a_job_that_would_end_last_anyway_starts_before_shorter_ones() -> None:
    # 30 h against a drain of (20 + 8 + 120) / 8 = 18.5 h: it sets the last completion.
    assert _started(_queue(30), FAST) == {"short"}  # off: shortest first
    assert _started(_queue(30), ON) == {"long"}
    # 5 h against (20 + 8 + 20) / 8 = 6 h: others end after it, shortest first stays.
    assert _started(_queue(5), ON) == {"short"}


def test_weight_and_aging_come_first_and_the_longest_critical_job_leads() -> None:
    jobs = [
        job("short", replicas=8, expected_runtime_s=HOUR),
        job("long", replicas=8, expected_runtime_s=40 * HOUR),
        job("longer", replicas=8, expected_runtime_s=50 * HOUR),
        job("heavy", replicas=8, expected_runtime_s=2 * HOUR, priority=2.0),
        job("aged", replicas=8, expected_runtime_s=3 * HOUR, submit_time=NOW - 13 * HOUR),
    ]
    # Drain: 8 × (1 + 40 + 50 + 2 + 3) / 8 = 96 h on one node, where neither the 40 h nor
    # the 50 h job is critical; 48 h on two nodes, where the 50 h job is; 32 h on three,
    # where both are, the longer first.
    one = instance([node("n1")], jobs, config=ON)
    two = instance([node("n1"), node("n2")], jobs, config=ON)
    three = instance([node("n1"), node("n2"), node("n3")], jobs, config=ON)
    assert not any(one.is_critical(j) for j in jobs)
    assert [j.id for j in jobs if two.is_critical(j)] == ["longer"]
    assert [j.id for j in jobs if three.is_critical(j)] == ["long", "longer"]
    for inst, expected in (
        (one, ["heavy", "aged", "short", "long", "longer"]),
        (two, ["heavy", "aged", "longer", "short", "long"]),
        (three, ["heavy", "aged", "longer", "long", "short"]),
    ):
        keys = sort_key(inst, Order.VALUE)
        # Weight × aging credit first (heavy: 2, aged: 1 + one 12 h step; the shorter of
        # the tie first), then the critical job, then shortest first.
        assert sorted(keys, key=keys.__getitem__) == expected


def test_off_by_default() -> None:
    assert SolverConfig().critical_first is False
