"""The validator on hand-built plans: one feasible and one infeasible case per constraint."""

from __future__ import annotations

from typing import Any

import pytest

from solver.instance import Instance, NodeState, SlaPolicy, SolverConfig
from solver.plan import Action, ActionKind, Reason, ReasonCode
from solver.validate import PlanInvalid, check, validate

from .builders import NOW, instance, job, node, plan_from, running, service


def rules(inst: Instance, target: dict[str, dict[str, int]]) -> set[str]:
    return {v.rule for v in validate(inst, plan_from(inst, target))}


def test_capacity_gpus() -> None:
    inst = instance([node("n1", gpus=8)], [running("r", {"n1": 6}), job("p", gpus=2)])
    assert rules(inst, {"r": {"n1": 6}, "p": {"n1": 2}}) == set()
    inst = instance([node("n1", gpus=8)], [running("r", {"n1": 6}), job("p", gpus=4)])
    assert rules(inst, {"r": {"n1": 6}, "p": {"n1": 4}}) == {"capacity"}


def test_capacity_cpu_and_memory() -> None:
    small = node("n1", gpus=8, cpu_milli=8000, memory_mib=1000)
    inst = instance([small], [job("p", gpus=1, replicas=2, cpu_milli_per_replica=4000)])
    assert rules(inst, {"p": {"n1": 2}}) == set()
    inst = instance([small], [job("p", gpus=1, replicas=3, cpu_milli_per_replica=4000)])
    assert rules(inst, {"p": {"n1": 3}}) == {"capacity"}
    inst = instance([small], [job("p", gpus=1, replicas=2, memory_mib_per_replica=600)])
    assert rules(inst, {"p": {"n1": 2}}) == {"capacity"}


@pytest.mark.parametrize(
    ("requirements", "ok"),
    [
        ({"allowed_gpu_models": frozenset({"h100"})}, True),
        ({"allowed_gpu_models": frozenset({"a100"})}, False),
        ({"gpu_memory_mib": 80_000}, True),
        ({"gpu_memory_mib": 90_000}, False),
        ({"precision": "fp8"}, True),
        ({"precision": "int4"}, False),
        ({"node_selector": {"zone": "a"}}, True),
        ({"node_selector": {"zone": "b"}}, False),
        ({"clusters": frozenset({"c1"})}, True),
        ({"clusters": frozenset({"c2"})}, False),
    ],
)
def test_compatibility(requirements: dict[str, Any], ok: bool) -> None:
    inst = instance(
        [node("n1", model="h100", labels={"zone": "a"})], [job("p", gpus=2, **requirements)]
    )
    assert rules(inst, {"p": {"n1": 2}}) == (set() if ok else {"compatibility"})


def test_compatibility_taints_and_state() -> None:
    tainted = node("n1", taints=frozenset({"gpu-reserved"}))
    inst = instance([tainted], [job("p", tolerations=frozenset({"gpu-reserved"}))])
    assert rules(inst, {"p": {"n1": 1}}) == set()
    inst = instance([tainted], [job("p")])
    assert rules(inst, {"p": {"n1": 1}}) == {"compatibility"}
    inst = instance([node("n1", state=NodeState.draining)], [job("p")])
    assert rules(inst, {"p": {"n1": 1}}) == {"compatibility"}


def test_gang_all_or_nothing_spread_and_cluster() -> None:
    nodes = [node("a"), node("b"), node("c", cluster="c2")]
    gang = job("g", gpus=4, replicas=4, max_nodes=2)
    inst = instance(nodes, [gang])
    assert rules(inst, {"g": {"a": 8, "b": 8}}) == set()
    assert rules(inst, {"g": {"a": 8, "b": 4}}) == {"gang"}
    inst = instance(nodes, [job("g", gpus=4, replicas=3, max_nodes=2)])
    assert rules(inst, {"g": {"a": 4, "b": 4, "c": 4}}) == {"gang"}  # 3 nodes and 2 clusters
    inst = instance(nodes, [job("g", gpus=4, replicas=2)])
    assert rules(inst, {"g": {"a": 4, "c": 4}}) == {"gang"}


def test_non_checkpointable_job_never_moves() -> None:
    nodes = [node("a"), node("b")]
    inst = instance(nodes, [running("r", {"a": 4}, checkpointable=True)])
    assert rules(inst, {"r": {"b": 4}}) == set()
    inst = instance(nodes, [running("r", {"a": 4}, checkpointable=False)])
    assert rules(inst, {"r": {"b": 4}}) == {"movement"}


def test_disruption_budget_cooldown_per_day_and_per_cycle() -> None:
    nodes = [node("a"), node("b")]
    inst = instance(nodes, [running("r", {"a": 4}, checkpointable=True, last_moved_at=NOW - 60)])
    assert rules(inst, {"r": {"b": 4}}) == {"movement"}
    inst = instance(
        nodes,
        [running("r", {"a": 4}, checkpointable=True, migrations_today=2)],
        policies=(SlaPolicy(team="default", max_migrations_per_day=2),),
    )
    assert rules(inst, {"r": {"b": 4}}) == {"movement"}
    two = [
        running("r1", {"a": 2}, checkpointable=True),
        running("r2", {"a": 2}, checkpointable=True),
    ]
    inst = instance(nodes, two, config=SolverConfig(max_migrations_per_cycle=1))
    assert rules(inst, {"r1": {"b": 2}, "r2": {"a": 2}}) == set()
    assert rules(inst, {"r1": {"b": 2}, "r2": {"b": 2}}) == {"movement"}


def test_preemption_rules() -> None:
    nodes = [node("a")]
    inst = instance(nodes, [running("r", {"a": 4})])
    plan = plan_from(inst, {})
    assert validate(inst, plan) == []
    assert plan.actions[0].kind is ActionKind.preempt
    inst = instance(nodes, [running("r", {"a": 4}, preemptible=False)])
    assert rules(inst, {}) == {"preemption"}
    inst = instance(
        nodes,
        [running("r", {"a": 4}, preemptions_today=1)],
        policies=(SlaPolicy(team="default", max_preemptions_per_day=1),),
    )
    assert rules(inst, {}) == {"preemption"}
    inst = instance(
        nodes,
        [running("r1", {"a": 4}), running("r2", {"a": 4})],
        config=SolverConfig(max_preemptions_per_cycle=1),
    )
    assert rules(inst, {"r1": {"a": 4}}) == set()
    assert rules(inst, {}) == {"preemption"}


def test_guarantee_protects_a_team_from_other_teams() -> None:
    policies = (
        SlaPolicy(team="a", guaranteed_gpus=4),
        SlaPolicy(team="b", guaranteed_gpus=4),
    )
    jobs = [
        running("ra", {"n": 4}, team="a"),
        running("ra2", {"n": 2}, team="a"),
        job("pb", 4, team="b"),
    ]
    inst = instance([node("n")], jobs, policies=policies)
    # Team a holds 6 GPUs with a guarantee of 4: only its 2 borrowed GPUs may be reclaimed.
    assert rules(inst, {"ra": {"n": 4}, "pb": {"n": 4}}) == set()
    assert rules(inst, {"ra2": {"n": 2}, "pb": {"n": 4}}) == {"guarantee"}


def test_elastic_bounds() -> None:
    svc = service("s", (4,), {"n": 3}, min_replicas=2, max_replicas=5)
    inst = instance([node("n")], [svc])
    assert rules(inst, {"s": {"n": 2}}) == set()
    assert rules(inst, {"s": {"n": 5}}) == set()
    assert rules(inst, {"s": {"n": 1}}) == {"elastic"}
    assert rules(inst, {"s": {"n": 6}}) == {"elastic"}


def test_quota_cap() -> None:
    policies = (SlaPolicy(team="t", guaranteed_gpus=2, borrowing_limit=2),)
    inst = instance(
        [node("n")],
        [running("r", {"n": 2}, team="t"), job("p", 2, team="t"), job("q", 1, team="t")],
        policies=policies,
    )
    assert rules(inst, {"r": {"n": 2}, "p": {"n": 2}}) == set()
    assert rules(inst, {"r": {"n": 2}, "p": {"n": 2}, "q": {"n": 1}}) == {"quota"}


def test_bookkeeping_actions_and_reasons() -> None:
    inst = instance([node("n")], [job("p", 2), job("q", 2)])
    good = plan_from(inst, {"p": {"n": 2}})
    assert validate(inst, good) == []
    missing_action = good.model_copy(update={"actions": []})
    assert {v.rule for v in validate(inst, missing_action)} == {"actions"}
    wrong_kind = good.model_copy(
        update={
            "actions": [
                Action(
                    kind=ActionKind.migrate,
                    job_id="p",
                    to_placement={"n": 2},
                    reason=Reason(code=ReasonCode.placed),
                )
            ]
        }
    )
    assert {v.rule for v in validate(inst, wrong_kind)} == {"actions"}
    no_reason = good.model_copy(update={"pending": {}})
    assert {v.rule for v in validate(inst, no_reason)} == {"reasons"}
    unknown = good.model_copy(update={"placement": {**good.placement, "ghost": {"n": 1}}})
    assert {v.rule for v in validate(inst, unknown)} == {"reference"}


def test_check_raises_with_the_violations() -> None:
    inst = instance([node("n", gpus=2)], [job("p", 4)])
    plan = plan_from(inst, {"p": {"n": 4}})
    with pytest.raises(PlanInvalid) as raised:
        check(inst, plan)
    assert {v.rule for v in raised.value.violations} == {"capacity"}


def test_gpu_indices_are_kept_distinct_and_aligned() -> None:
    jobs = [
        running("r", {"n": 2}, gpu_indices={"n": (5, 6)}),
        running("u", {"n": 1}),
        job("big", 4),
        service("s", (1,), {"n": 1}, gpu_indices={"n": (7,)}),
    ]
    inst = instance([node("n", free_gpu_indices=(0, 1, 2, 3, 4))], jobs)
    plan = plan_from(inst, {"r": {"n": 2}, "u": {"n": 1}, "big": {"n": 4}, "s": {"n": 1}})
    assert validate(inst, plan) == []
    assert plan.gpu_indices["r"] == {"n": (5, 6)}
    assert plan.gpu_indices["s"] == {"n": (7,)}
    assert plan.gpu_indices["big"] == {"n": (0, 1, 2, 3)}
    assert plan.gpu_indices["u"] == {"n": (4,)}  # unknown: what the aligned block leaves
    clash = plan.model_copy(update={"gpu_indices": {**plan.gpu_indices, "u": {"n": (0,)}}})
    assert {v.rule for v in validate(inst, clash)} == {"indices"}


def test_elastic_replica_change_cap() -> None:
    svc = service("s", (8,), {"n": 2}, max_replica_change=2)
    inst = instance([node("n")], [svc])
    assert rules(inst, {"s": {"n": 4}}) == set()
    assert rules(inst, {"s": {"n": 5}}) == {"elastic"}
    for policy in ("fifo", "backfill", "priority", "shaper"):
        from solver.policies import get_policy

        plan = get_policy(policy).plan(inst)
        assert validate(inst, plan) == []
        assert plan.placement["s"] == {"n": 4}


def test_an_overfilled_snapshot_may_stay_but_not_grow() -> None:
    jobs = [running("r1", {"a": 4}), running("r2", {"a": 2}), job("p", 1)]
    inst = instance([node("a", gpus=4)], jobs)
    assert rules(inst, {"r1": {"a": 4}, "r2": {"a": 2}}) == set()
    assert rules(inst, {"r1": {"a": 4}, "r2": {"a": 2}, "p": {"a": 1}}) == {"capacity"}
    for policy in ("fifo", "backfill", "priority", "shaper"):
        from solver.policies import get_policy

        assert validate(inst, get_policy(policy).plan(inst)) == []
