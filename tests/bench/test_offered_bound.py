"""The offered-load bounds on value and utilization (bench.offered_bound): exact on small
cases worked by hand, and never below what a real replay reaches."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from bench.offered_bound import net_utilization, offered_bounds, up_seconds
from sim.run import run_policy
from sim.workload import BlockJob, GpuModel, NodeEvent, Service
from tests.sim.builders import elastic, job, workload

HOUR = 3600.0


def _two_jobs() -> list[BlockJob]:
    # A: 1 GPU for 2 h from 0; B: 2 GPUs for 3 h from 1 h, at three times A's weight.
    return [job("a", gpus=1, hours=2.0), job("b", gpus=2, hours=3.0, at_h=1.0, priority=3.0)]


def test_the_bounds_of_two_jobs_on_one_node_worked_by_hand() -> None:
    bounds = offered_bounds(workload(_two_jobs(), nodes=[("n0", 2)], horizon_h=4.0))
    # B fills both GPUs from 1 h to 4 h (6 GPU-hours × 3); A gets the hour before B comes
    # (1 GPU-hour × 1): 19. Giving A a second hour would take it from B.
    assert bounds.value_any == pytest.approx(19.0)
    assert bounds.value_served == pytest.approx(19.0)  # no service to serve
    # Busy: 1 GPU in the first hour (only A has come, on one GPU), 2 after: 7 of 8.
    assert bounds.utilization == pytest.approx(7 / 8)
    assert bounds.gpu_hours_up == pytest.approx(8.0)


def test_a_service_served_in_full_takes_its_gpus_from_the_value_bound() -> None:
    chat = Service(id="chat", hourly_demand=(1.0,), max_replicas=4)
    bounds = offered_bounds(
        workload(_two_jobs(), nodes=[("n0", 2)], horizon_h=4.0, services=[chat])
    )
    # One GPU for the service every hour: A its first hour (1), B one GPU for 3 h (9).
    assert bounds.value_served == pytest.approx(10.0)
    assert bounds.value_any == pytest.approx(19.0)  # left unserved, the jobs get it all
    # Serving counts as busy: every GPU-hour can be busy.
    assert bounds.utilization == pytest.approx(1.0)
    # A demand no plan can serve (3 replicas on 2 GPUs) leaves that bound undefined.
    greedy = Service(id="greedy", hourly_demand=(3.0,), max_replicas=4)
    too_much = offered_bounds(
        workload(_two_jobs(), nodes=[("n0", 2)], horizon_h=4.0, services=[greedy])
    )
    assert math.isnan(too_much.value_served)
    assert too_much.value_any == pytest.approx(19.0)  # the jobs alone, as above


def test_a_failed_node_and_a_faster_model_change_the_bounds() -> None:
    fast = GpuModel(name="H100", speed=2.0)
    down = [
        NodeEvent(time=1 * HOUR, node="n0", kind="fail"),
        NodeEvent(time=2 * HOUR, node="n0", kind="recover"),
        NodeEvent(time=3 * HOUR, node="n0", kind="drain"),  # stays up
    ]
    assert up_seconds(workload([], events=down, horizon_h=4.0), "n0", 0.0, 4 * HOUR) == 3 * HOUR
    # 4 h of work on one GPU: on the H100 it is done in 2 h and earns 4 (reference work).
    one = [job("j", gpus=1, hours=4.0)]
    slow = offered_bounds(workload(one, nodes=[("n0", 1)], horizon_h=4.0, events=down))
    assert slow.value_any == pytest.approx(3.0)  # the hour n0 is down is lost
    assert slow.utilization == pytest.approx(1.0)  # of the 3 GPU-hours up
    quick = offered_bounds(
        workload(
            one,
            nodes=[("h0", 1)],
            horizon_h=4.0,
            extra_models=[fast],
            node_models={"h0": "H100"},
        )
    )
    assert quick.value_any == pytest.approx(4.0)
    assert quick.utilization == pytest.approx(0.5)  # 2 GPU-hours do all its work


@pytest.mark.parametrize("policy", ["fifo", "priority", "shaper"])
def test_no_replay_passes_the_bounds(policy: str) -> None:
    # A queue on two 4-GPU nodes with a service and a node failure: gangs that cannot all
    # run at once, checkpointable and not, of three weights, arriving over time.
    jobs = [
        job("big", gpus=4, hours=6.0, checkpointable=True, checkpoint_interval_h=1.0),
        job("a", gpus=2, hours=1.0, at_h=0.5, priority=3.0),
        job("b", gpus=2, hours=3.0, at_h=0.5),
        job("c", gpus=1, hours=0.5, at_h=1.0, priority=10.0),
        job("d", gpus=3, hours=2.0, at_h=2.0, checkpointable=True, checkpoint_interval_h=0.5),
        job("e", gpus=4, hours=5.0, at_h=3.0, priority=3.0),
    ]
    chat = Service(id="chat", hourly_demand=(1.0, 1.0, 3.0, 3.0, 1.0), max_replicas=4)
    fail = [
        NodeEvent(time=2.5 * HOUR, node="n1", kind="fail"),
        NodeEvent(time=4.0 * HOUR, node="n1", kind="recover"),
    ]
    queue = workload(
        jobs, nodes=[("n0", 4), ("n1", 4)], horizon_h=8.0, services=[chat], events=fail
    )
    bounds = offered_bounds(queue)
    result = run_policy(queue, policy, drain=True)
    value = result.metrics["weighted_output"]
    assert value is not None and value <= bounds.value_any + 1e-6, (policy, value, bounds)
    assert net_utilization(result) <= bounds.utilization + 1e-6, (policy, bounds)
    assert result.metrics["available_gpu_hours"] == pytest.approx(bounds.gpu_hours_up)
    # The queue is long enough that the bound is not just every GPU-hour up.
    assert bounds.utilization < 1.0


def test_a_service_short_by_an_allowance_frees_that_much_for_the_jobs() -> None:
    chat = Service(id="chat", hourly_demand=(1.0,), max_replicas=4)
    two = workload(_two_jobs(), nodes=[("n0", 2)], horizon_h=4.0, services=[chat])
    # Served in full: 10 (above); 1 replica-hour short: B gets one more GPU-hour (× 3).
    assert offered_bounds(two, unmet_replica_hours=1.0).value_served == pytest.approx(13.0)
    assert offered_bounds(two, unmet_replica_hours=4.0).value_served == pytest.approx(19.0)


@pytest.mark.parametrize("policy", ["fifo", "shaper"])
def test_services_on_fast_models_starting_mid_hour_and_events_at_one_instant(policy: str) -> None:
    # Found by review, each a run the first version's bound was below.
    fast = GpuModel(name="H100", speed=2.0)
    # Demand 10 replicas with at most 4: 4 replicas at speed 2 serve 8 of it, all busy.
    rushed = workload(
        [],
        nodes=[("h0", 4)],
        horizon_h=4.0,
        extra_models=[fast],
        node_models={"h0": "H100"},
        services=[Service(id="chat", hourly_demand=(10.0,), max_replicas=4)],
    )
    # A service starting a quarter into the first hour serves from then.
    late = workload(
        [],
        nodes=[("n0", 4)],
        horizon_h=2.0,
        services=[Service(id="chat", hourly_demand=(4.0,), max_replicas=4, start_time=0.25 * HOUR)],
    )
    # n1 fails at 1 h; at 2 h it recovers and fails again, in that order: down from 1 h on.
    events = [
        NodeEvent(time=1 * HOUR, node="n1", kind="fail"),
        NodeEvent(time=2 * HOUR, node="n1", kind="recover"),
        NodeEvent(time=2 * HOUR, node="n1", kind="fail"),
    ]
    flapping = workload(
        [job("a", gpus=4, hours=4.0)], nodes=[("n0", 4), ("n1", 4)], horizon_h=4.0, events=events
    )
    expected = {"rushed": 1.0, "late": (0.75 * 4 + 4) / 8, "flapping": 16 / 20}
    for name, case in (("rushed", rushed), ("late", late), ("flapping", flapping)):
        bounds = offered_bounds(case)
        assert bounds.utilization == pytest.approx(expected[name]), name
        result = run_policy(case, policy, drain=True)
        assert result.metrics["available_gpu_hours"] == pytest.approx(bounds.gpu_hours_up), name
        assert net_utilization(result) <= bounds.utilization + 1e-6, name


def test_an_elastic_job_may_hold_its_most_gpus_and_does_most_per_gpu_at_its_fewest() -> None:
    # 2 h of work on the 2 GPUs it asks (4 reference GPU-hours), 1 to 4 GPUs, scaling 0.5,
    # alone on 4 GPUs for 4 h. At 4 GPUs it runs 2 ** 0.5 times as fast: 2 / 1.41 h, so
    # 4 × 1.41 = 5.66 GPU-hours busy, its most. A GPU-hour of it does at most 2 ** 0.5
    # reference GPU-hours of work (at 1 GPU), so the value bound stays its 4 GPU-hours.
    elastic = replace(job("e", gpus=2, hours=2.0), min_gpus=1, max_gpus=4, scaling=0.5)
    bounds = offered_bounds(workload([elastic], nodes=[("n0", 4)], horizon_h=4.0))
    assert bounds.utilization == pytest.approx(4 * 2 / 2**0.5 / 16)
    assert bounds.value_any == pytest.approx(4.0)
    rigid = offered_bounds(
        workload([job("e", gpus=2, hours=2.0)], nodes=[("n0", 4)], horizon_h=4.0)
    )
    assert rigid.utilization == pytest.approx(4 / 16)


@pytest.mark.parametrize("policy", ["priority", "shaper"])
def test_no_replay_with_elastic_jobs_passes_the_bounds(policy: str) -> None:
    jobs = [
        elastic("e", gpus=2, hours=5.0, scaling=0.8),
        job("a", gpus=2, hours=1.0, at_h=0.5, priority=3.0),
        elastic("f", gpus=1, hours=3.0, at_h=1.0, max_gpus=3, scaling=0.8),
    ]
    wl = workload(jobs, nodes=[("n0", 4)], horizon_h=4.0)
    bounds = offered_bounds(wl)
    result = run_policy(wl, policy)
    assert result.metrics["weighted_output"] <= bounds.value_any + 1e-6
    assert net_utilization(result) <= bounds.utilization + 1e-6
