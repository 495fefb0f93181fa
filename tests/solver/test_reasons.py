"""Every reason code, on a case built to produce it, for the policies where it applies."""

from __future__ import annotations

import pytest

from solver.instance import Job, SlaPolicy, SolverConfig
from solver.plan import ActionKind, ReasonCode

from .builders import NOW, instance, job, node, plan_with, running, service

ALL = ("fifo", "backfill", "priority", "shaper")


@pytest.mark.parametrize("policy", ALL)
def test_no_compatible_gpu_model(policy: str) -> None:
    inst = instance([node("a", model="a100")], [job("p", precision="fp8")])
    plan = plan_with(policy, inst)
    assert plan.pending["p"].code is ReasonCode.no_compatible_gpu_model


@pytest.mark.parametrize("policy", ALL)
def test_quota(policy: str) -> None:
    inst = instance(
        [node("a")],
        [running("r", {"a": 2}, team="t"), job("p", 1, team="t")],
        policies=(SlaPolicy(team="t", guaranteed_gpus=0, borrowing_limit=2),),
    )
    plan = plan_with(policy, inst)
    assert plan.pending["p"].code is ReasonCode.quota


@pytest.mark.parametrize("policy", ALL)
def test_fragmentation(policy: str) -> None:
    inst = instance(
        [node("a"), node("b")],
        [running("r1", {"a": 4}), running("r2", {"b": 4}), job("p", 8)],
    )
    plan = plan_with(policy, inst)
    assert plan.pending["p"].code is ReasonCode.fragmentation
    assert "8 compatible GPUs free" in plan.pending["p"].message


def test_fragmentation_is_fixed_by_migration_in_shaper() -> None:
    jobs = [
        running("r1", {"a": 4}, checkpointable=True),
        running("r2", {"b": 4}, checkpointable=True),
        job("p", 8),
    ]
    plan = plan_with("shaper", instance([node("a"), node("b")], jobs))
    assert sum(plan.placement["p"].values()) == 8
    kinds = {a.job_id: a.kind for a in plan.actions}
    assert ActionKind.migrate in kinds.values()
    moved = [a for a in plan.actions if a.kind is ActionKind.migrate]
    assert all(a.reason.code is ReasonCode.defragmentation for a in moved)


def test_disruption_budget_migrations() -> None:
    jobs = [
        running("r1", {"a": 4}, checkpointable=True),
        running("r2", {"b": 4}, checkpointable=True),
        job("p", 8),
    ]
    config = SolverConfig(max_migrations_per_cycle=0, num_workers=1, deterministic=True)
    plan = plan_with("shaper", instance([node("a"), node("b")], jobs, config=config))
    assert plan.pending["p"].code is ReasonCode.disruption_budget


@pytest.mark.parametrize("policy", ["priority", "shaper"])
def test_disruption_budget_preemptions_per_day(policy: str) -> None:
    inst = instance(
        [node("a")],
        [running("low", {"a": 8}, team="low", preemptions_today=3), job("high", 8, team="high")],
        policies=(
            SlaPolicy(team="low", priority_weight=1, max_preemptions_per_day=3),
            SlaPolicy(team="high", priority_weight=5),
        ),
    )
    plan = plan_with(policy, inst)
    assert plan.pending["high"].code is ReasonCode.disruption_budget


@pytest.mark.parametrize("policy", ["priority", "shaper"])
def test_lower_priority(policy: str) -> None:
    inst = instance([node("a")], [running("r", {"a": 8}, priority=5.0), job("p", 2, priority=1.0)])
    plan = plan_with(policy, inst)
    assert plan.pending["p"].code is ReasonCode.lower_priority


@pytest.mark.parametrize("policy", ["priority", "shaper"])
def test_preempted_by_higher_priority(policy: str) -> None:
    inst = instance([node("a")], [running("r", {"a": 8}, priority=1.0), job("p", 8, priority=5.0)])
    plan = plan_with(policy, inst)
    assert plan.placement["p"] == {"a": 8}
    (stop,) = plan.actions_for("r")
    assert stop.kind is ActionKind.preempt
    assert stop.reason.code is ReasonCode.preempted_by_higher_priority
    assert plan.pending["r"].code is ReasonCode.preempted_by_higher_priority


@pytest.mark.parametrize("policy", ["fifo", "backfill"])
def test_insufficient_capacity_without_preemption(policy: str) -> None:
    inst = instance([node("a")], [running("r", {"a": 8}, priority=1.0), job("p", 8, priority=5.0)])
    plan = plan_with(policy, inst)
    assert plan.pending["p"].code is ReasonCode.insufficient_capacity
    assert "r" in plan.placement


@pytest.mark.parametrize("policy", ALL)
def test_insufficient_capacity_when_larger_than_the_cluster(policy: str) -> None:
    inst = instance([node("a"), node("b")], [job("huge", 8, replicas=3)])
    plan = plan_with(policy, inst)
    assert plan.pending["huge"].code is ReasonCode.insufficient_capacity


def _head_of_line(runtime: float) -> list[Job]:
    return [
        running("r", {"a": 8}, expected_runtime_s=7200, start_time=NOW - 3600),
        job("head", 8, replicas=2, submit_time=NOW - 600),
        job("small", 1, submit_time=NOW - 60, expected_runtime_s=runtime),
    ]


def test_queue_order_in_fifo() -> None:
    plan = plan_with("fifo", instance([node("a"), node("b")], _head_of_line(600)))
    assert plan.pending["head"].code is ReasonCode.insufficient_capacity
    assert plan.pending["small"].code is ReasonCode.queue_order


def test_backfill_starts_a_short_job_and_reserves_for_the_head() -> None:
    short = plan_with("backfill", instance([node("a"), node("b")], _head_of_line(600)))
    assert "small" in short.placement
    long = plan_with("backfill", instance([node("a"), node("b")], _head_of_line(86_400)))
    assert long.pending["small"].code is ReasonCode.backfill_reservation


def test_forecast_reservation() -> None:
    jobs = [
        service("s", (2, 2, 8), {"a": 2}, min_replicas=1),
        job("long", 4, expected_runtime_s=36_000),
        job("mobile", 4, expected_runtime_s=36_000, checkpointable=True),
    ]
    plan = plan_with("shaper", instance([node("a"), node("b", gpus=2)], jobs))
    assert plan.pending["long"].code is ReasonCode.forecast_reservation
    assert "mobile" in plan.placement
    short = [service("s", (2, 2, 8), {"a": 2}), job("short", 4, expected_runtime_s=1800)]
    plan = plan_with("shaper", instance([node("a"), node("b", gpus=2)], short))
    assert "short" in plan.placement


@pytest.mark.parametrize("policy", ["priority", "shaper"])
def test_resize_to_demand(policy: str) -> None:
    inst = instance([node("a")], [service("s", (2, 6), {"a": 5}, min_replicas=1)])
    plan = plan_with(policy, inst)
    assert plan.placement["s"] == {"a": 2}
    (resize,) = plan.actions_for("s")
    assert resize.kind is ActionKind.resize and resize.replicas == 2
    assert resize.reason.code is ReasonCode.resized_to_demand


@pytest.mark.parametrize("policy", ["fifo", "backfill"])
def test_fifo_baselines_reserve_the_daily_peak(policy: str) -> None:
    inst = instance([node("a")], [service("s", (2, 6, 3), {"a": 2}, min_replicas=1)])
    plan = plan_with(policy, inst)
    assert plan.placement["s"] == {"a": 6}


@pytest.mark.parametrize("policy", ["priority", "shaper"])
def test_overdue_job_goes_first_and_may_preempt(policy: str) -> None:
    policies = (
        SlaPolicy(team="late", priority_weight=2, max_queue_wait_s=3600),
        SlaPolicy(team="vip", priority_weight=3),
        SlaPolicy(team="low", priority_weight=1),
    )
    jobs = [
        running("r", {"a": 8}, team="low"),
        job("late", 8, team="late", submit_time=NOW - 7200),
        job("vip", 8, team="vip"),
    ]
    plan = plan_with(policy, instance([node("a")], jobs, policies=policies))
    assert plan.placement.get("late") == {"a": 8}
    assert plan.actions_for("late")[0].reason.code is ReasonCode.overdue
    assert plan.pending["vip"].code is ReasonCode.lower_priority


@pytest.mark.parametrize("policy", ALL)
def test_placed(policy: str) -> None:
    plan = plan_with(policy, instance([node("a")], [job("p", 2)]))
    (start,) = plan.actions_for("p")
    assert start.kind is ActionKind.start
    assert start.reason.code is ReasonCode.placed


def test_an_overdue_job_is_not_held_back_by_the_forecast() -> None:
    jobs = [
        service("s", (2, 2, 8), {"a": 2}, min_replicas=1),
        job("long", 4, expected_runtime_s=36_000, submit_time=NOW - 7200),
    ]
    policies = (SlaPolicy(team="default", max_queue_wait_s=3600),)
    plan = plan_with("shaper", instance([node("a"), node("b", gpus=2)], jobs, policies=policies))
    assert "long" in plan.placement
    assert plan.actions_for("long")[0].reason.code is ReasonCode.overdue
