"""Elastic services short of demand may move or stop block work to grow (``shaper`` only),
when the value trade favours it and the disruption budget and SLA flags allow."""

from __future__ import annotations

import pytest

from solver.greedy import GreedyEngine
from solver.instance import Instance, Job, SlaPolicy
from solver.plan import ActionKind, ReasonCode
from solver.policies.shaper import ShaperPolicy
from solver.solve import GREEDY

from .builders import FAST, NOW, instance, node, plan_with, running, service

LOW = SlaPolicy(team="low", priority_weight=1)
WEB = SlaPolicy(team="web", priority_weight=1)
POLICIES = (LOW, WEB)


def _full_node(block: Job, **config: object) -> Instance:
    # Node a is full: the service holds 2 of its 8 GPUs and wants 6.
    jobs = [service("s", (6, 6, 6), {"a": 2}, team="web", min_replicas=1), block]
    return instance([node("a")], jobs, policies=POLICIES, config=FAST.model_copy(update=config))


def test_service_stops_a_preemptible_checkpointable_block_job_to_meet_demand() -> None:
    inst = _full_node(running("b", {"a": 6}, team="low", checkpointable=True))
    plan = plan_with("shaper", inst)
    assert plan.placement["s"] == {"a": 6}
    assert "b" not in plan.placement
    (stop,) = plan.actions_for("b")
    assert stop.kind is ActionKind.requeue
    assert stop.reason.code is ReasonCode.preempted_by_higher_priority
    assert "service s" in stop.reason.message


@pytest.mark.parametrize(
    "block",
    [
        running("b", {"a": 6}, team="low", checkpointable=True, preemptible=False),
        running("b", {"a": 6}, team="low", checkpointable=True, preemptions_today=1),
        # Losing work is not a price the service pays: only checkpointable jobs stop.
        running("b", {"a": 6}, team="low", checkpointable=False),
    ],
    ids=["not-preemptible", "over-daily-limit", "not-checkpointable"],
)
def test_service_leaves_protected_block_work_alone(block: Job) -> None:
    policies = (LOW.model_copy(update={"max_preemptions_per_day": 1}), WEB)
    inst = _full_node(block).model_copy(update={"policies": policies})
    plan = plan_with("shaper", inst)
    assert plan.placement["b"] == {"a": 6}
    assert plan.placement["s"] == {"a": 2}


def test_service_does_not_stop_work_worth_more_than_the_demand() -> None:
    # Weight 20 block work outweighs (1 + elastic_unmet_weight 8) per GPU of demand.
    rich = SlaPolicy(team="low", priority_weight=20)
    inst = _full_node(running("b", {"a": 6}, team="low", checkpointable=True))
    inst = inst.model_copy(update={"policies": (rich, WEB)})
    plan = plan_with("shaper", inst)
    assert plan.placement["b"] == {"a": 6}


def test_service_moves_a_block_job_to_gpus_it_cannot_use() -> None:
    # The service runs on A100 only; the block job may move to the free H100 node.
    jobs = [
        service(
            "s",
            (6, 6, 6),
            {"a": 2},
            team="web",
            min_replicas=1,
            allowed_gpu_models=frozenset({"a100"}),
        ),
        running("b", {"a": 6}, team="low", checkpointable=True, preemptible=False),
    ]
    inst = instance([node("a"), node("h", model="h100")], jobs, policies=POLICIES)
    plan = plan_with("shaper", inst)
    assert plan.placement["s"] == {"a": 6}
    assert plan.placement["b"] == {"h": 6}
    assert plan.actions_for("b")[0].kind is ActionKind.migrate


def test_move_respects_cooldown_and_budget() -> None:
    jobs = [
        service(
            "s", (6,), {"a": 2}, team="web", min_replicas=1, allowed_gpu_models=frozenset({"a100"})
        ),
        running(
            "b",
            {"a": 6},
            team="low",
            checkpointable=True,
            preemptible=False,
            last_moved_at=NOW - 60,
        ),
    ]
    inst = instance([node("a"), node("h", model="h100")], jobs, policies=POLICIES)
    plan = plan_with("shaper", inst)
    assert plan.placement["b"] == {"a": 6}
    no_budget = inst.model_copy(
        update={
            "jobs": (jobs[0], jobs[1].model_copy(update={"last_moved_at": None})),
            "config": FAST.model_copy(update={"max_migrations_per_cycle": 0}),
        }
    )
    assert plan_with("shaper", no_budget).placement["b"] == {"a": 6}


@pytest.mark.parametrize("policy", ["fifo", "backfill", "priority"])
def test_other_policies_grow_services_into_free_gpus_only(policy: str) -> None:
    inst = _full_node(running("b", {"a": 6}, team="low", checkpointable=True))
    plan = plan_with(policy, inst)
    assert plan.placement["b"] == {"a": 6}
    # With free GPUs elsewhere the service does grow, onto them; b still stays.
    free = instance([node("a"), node("c")], inst.jobs, policies=POLICIES, config=inst.config)
    plan = plan_with(policy, free)
    assert plan.placement["b"] == {"a": 6}
    assert sum(plan.placement["s"].values()) == 6 and plan.placement["s"].get("c", 0) == 4


def test_greedy_alone_grows_the_service_and_the_plan_is_deterministic() -> None:
    inst = _full_node(running("b", {"a": 6}, team="low", checkpointable=True))
    result = GreedyEngine(inst, GREEDY).run()
    assert result.state.held("s") == {0: 6}
    first = ShaperPolicy().plan(inst)
    second = ShaperPolicy().plan(inst)
    assert first.placement == second.placement
