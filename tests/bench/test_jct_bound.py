"""The lower bounds on mean JCT (bench.jct_bound): exact where they must be, and never above
what a real replay reaches."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bench.jct_bound import least_area, mean_busy_time_sum, mean_jct_bound_h
from sim.run import run_policy
from sim.workload import GpuModel
from tests.sim.builders import elastic, job, workload

HOUR = 3600.0


def test_a_job_alone_is_bounded_by_its_run_time_on_the_fastest_model_it_may_use() -> None:
    fast = GpuModel(name="H100", speed=2.0)
    alone = workload(
        [job("j", gpus=2, hours=4.0, models=("A100", "H100"))],
        nodes=[("a", 4), ("h", 4)],
        extra_models=[fast],
        node_models={"h": "H100"},
    )
    bound, which = mean_jct_bound_h(alone)
    assert (bound, which) == (pytest.approx(2.0), "a")


def test_the_busy_time_bound_on_one_machine_is_shortest_first() -> None:
    # Two jobs released at 0, areas 1 and 3 on a machine of rate 1: the short one is busy
    # over [0, 1] (mean 0.5), the long one over [1, 4] (mean 2.5).
    assert mean_busy_time_sum([(0.0, 3.0), (0.0, 1.0)], rate=1.0) == pytest.approx(3.0)
    # A smaller job released later preempts: the long one runs [0, 1], the short one,
    # released at 1, [1, 2] (mean 1.5), then the long one [2, 4]: (0.5·1 + 3·2) / 3 = 13/6.
    assert mean_busy_time_sum([(0.0, 3.0), (1.0, 1.0)], rate=1.0) == pytest.approx(1.5 + 13 / 6)


@pytest.mark.parametrize("policy", ["fifo", "priority", "shaper"])
def test_no_replay_goes_below_the_bound(policy: str) -> None:
    # A queue on one 4-GPU node: gangs that cannot all run at once, arriving over time.
    jobs = [
        job("big", gpus=4, hours=6.0),
        job("a", gpus=2, hours=1.0, at_h=0.5),
        job("b", gpus=2, hours=3.0, at_h=0.5),
        job("c", gpus=1, hours=0.5, at_h=1.0),
        job("d", gpus=3, hours=2.0, at_h=2.0),
    ]
    queue = workload(jobs, nodes=[("n0", 4)], horizon_h=30.0)
    bound, which = mean_jct_bound_h(queue)
    reached = run_policy(queue, policy, drain=True).metrics["jct_mean_h"]
    assert reached is not None
    assert bound <= reached + 1e-9, (policy, bound, which, reached)
    # The queue is the bound's (b): waiting counts, not only run time.
    assert which == "b" and bound > sum(j.work for j in jobs) / len(jobs) / 3600


def test_an_elastic_job_alone_is_bounded_at_its_most_gpus() -> None:
    # 4 h of work on the 2 GPUs it asks; on its 4 most, 2 ** 0.5 times as fast.
    alone = job("e", gpus=2, hours=4.0)
    elastic = replace(alone, min_gpus=1, max_gpus=4, scaling=0.5)
    bound, which = mean_jct_bound_h(workload([elastic], nodes=[("a", 4)]))
    assert (bound, which) == (pytest.approx(4.0 / 2**0.5), "a")
    # Its least area is at its fewest GPUs: 1 GPU × 4 h / 2 ** -0.5.
    assert least_area(elastic) == pytest.approx(1 * 4 * HOUR * 2**0.5)
    assert least_area(alone) == 2 * 4 * HOUR


@pytest.mark.parametrize("policy", ["priority", "shaper"])
def test_no_replay_with_elastic_jobs_goes_below_the_bound(policy: str) -> None:
    jobs = [
        elastic("e", gpus=2, hours=6.0, scaling=0.8),
        job("a", gpus=2, hours=1.0, at_h=0.5),
        elastic("f", gpus=2, hours=3.0, at_h=1.0, scaling=0.8),
    ]
    queue = workload(jobs, nodes=[("n0", 4)], horizon_h=30.0)
    bound, _ = mean_jct_bound_h(queue)
    reached = run_policy(queue, policy, drain=True).metrics["jct_mean_h"]
    assert reached is not None and bound <= reached + 1e-9, (policy, bound, reached)
