"""The shaper engine: CP-SAT against the greedy plan, statuses, bounds, determinism."""

from __future__ import annotations

import pytest
from ortools.sat.python import cp_model

from bench.instances import EveryRule, random_instance
from solver.instance import Instance, SlaPolicy, SolverConfig
from solver.objective import evaluate
from solver.plan import ActionKind, ReasonCode, SolveStatus
from solver.policies import POLICY_NAMES, get_policy
from solver.solve import SATURATED_NOTE
from solver.validate import check

from .builders import instance, job, node, plan_with, running, service


def _knapsack() -> Instance:
    # Value order (weight first) takes A (3 × 6 = 18) and strands 2 GPUs; B + C give 20.
    jobs = [job("A", 6, priority=3.0), job("B", 4, priority=2.5), job("C", 4, priority=2.5)]
    return instance([node("a")], jobs)


def test_cp_sat_beats_the_greedy_plan() -> None:
    inst = _knapsack()
    greedy = plan_with("shaper", inst.model_copy(update={"config": SolverConfig(use_cp_sat=False)}))
    assert greedy.stats.engine == "greedy"
    assert set(greedy.placement) == {"A"}
    plan = plan_with("shaper", inst)
    assert plan.stats.engine == "cp-sat"
    assert plan.stats.status is SolveStatus.optimal
    assert set(plan.placement) == {"B", "C"}
    assert plan.stats.objective == pytest.approx(20.0)
    assert plan.stats.objective > greedy.stats.objective
    assert plan.stats.best_bound == pytest.approx(plan.stats.objective)
    assert plan.stats.gap == pytest.approx(0.0, abs=1e-9)


def test_a_plan_budget_the_greedy_spends_keeps_the_greedy_plan_and_says_so() -> None:
    inst = _knapsack()
    spent = plan_with(
        "shaper", inst.model_copy(update={"config": SolverConfig(plan_budget_s=0.001)})
    )
    assert spent.stats.engine == "greedy" and set(spent.placement) == {"A"}
    assert spent.stats.note.startswith("CP-SAT skipped: the greedy took ")
    assert spent.stats.note.endswith(" of the 0.001 s plan budget; greedy plan kept")
    # A budget that leaves room searches as without one; deterministic runs ignore it.
    for config in (
        SolverConfig(plan_budget_s=30.0),
        SolverConfig(plan_budget_s=0.001, deterministic=True),
    ):
        plan = plan_with("shaper", inst.model_copy(update={"config": config}))
        assert plan.stats.engine == "cp-sat" and set(plan.placement) == {"B", "C"}


def test_greedy_plan_is_kept_when_cp_sat_finds_nothing_better() -> None:
    # q (8) leaves p (4) waiting, so CP-SAT runs, and cannot do better than q alone.
    plan = plan_with("shaper", instance([node("a")], [job("p", 4), job("q", 8)]))
    assert plan.stats.engine == "greedy"
    assert "nothing better" in plan.stats.note
    assert plan.stats.status is SolveStatus.optimal


def test_cp_sat_is_skipped_when_the_greedy_places_everything() -> None:
    plan = plan_with("shaper", instance([node("a")], [job("p", 4)]))
    assert plan.stats.engine == "greedy"
    assert plan.stats.status is SolveStatus.heuristic
    assert plan.stats.note == SATURATED_NOTE


def test_no_defragmenting_migration_when_nothing_waits() -> None:
    # CP-SAT used to move r1 next to r2 to free a whole node (the fragmentation term)
    # although nothing waited for the room.
    inst = instance(
        [node("a"), node("b"), node("c")],
        [
            running("r1", {"a": 1}, checkpointable=True, checkpoint_size_mib=100),
            running("r2", {"b": 1}, checkpointable=True, checkpoint_size_mib=100),
            job("p", 1),
        ],
    )
    plan = plan_with("shaper", inst)
    assert plan.stats.note == SATURATED_NOTE
    assert not [a for a in plan.actions if a.kind is ActionKind.migrate]


def test_a_start_on_the_fastest_accepted_model_saturates() -> None:
    plan = plan_with("shaper", instance([node("a"), node("b", model="h100")], [job("p", 4)]))
    assert plan.placement["p"].keys() == {"b"}
    assert plan.stats.note == SATURATED_NOTE


def test_disabled_cp_sat_says_so_before_saturation() -> None:
    inst = instance([node("a")], [job("p", 4), job("q", 8)])
    inst = inst.model_copy(update={"config": SolverConfig(use_cp_sat=False)})
    assert plan_with("shaper", inst).stats.note == "CP-SAT disabled in the config"


@pytest.mark.parametrize("status", [cp_model.UNKNOWN, cp_model.INFEASIBLE, cp_model.MODEL_INVALID])
def test_every_failed_status_falls_back_to_greedy(
    status: cp_model.CpSolverStatus, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cp_model.CpSolver, "solve", lambda self, model, *a, **k: status)
    inst = _knapsack()
    plan = plan_with("shaper", inst)
    assert plan.stats.engine == "greedy"
    assert plan.stats.status is SolveStatus.heuristic
    assert cp_model.CpSolver().status_name(status) in plan.stats.note
    assert set(plan.placement) == {"A"}


def test_objective_matches_evaluate_for_every_policy() -> None:
    inst = instance(
        [node("a"), node("b", model="h100")],
        [
            running("r", {"a": 4}, checkpointable=True),
            service("s", (2, 4), {"b": 1}),
            job("p", 2, priority=2.0),
            job("g", 4, replicas=2),
        ],
    )
    for name in POLICY_NAMES:
        plan = plan_with(name, inst)
        assert plan.stats.objective == pytest.approx(evaluate(inst, plan.placement).objective)
        if plan.stats.best_bound is not None:
            assert plan.stats.best_bound >= plan.stats.objective - 1e-6


def test_quota_and_gangs_hold_in_the_cp_sat_plan() -> None:
    policies = (SlaPolicy(team="t", borrowing_limit=8),)
    jobs = [job(f"g{i}", 4, replicas=2, team="t", priority=2.0) for i in range(3)]
    jobs += [job(f"s{i}", 1) for i in range(6)]
    inst = instance([node("a"), node("b"), node("c")], jobs, policies=policies)
    plan = plan_with("shaper", inst)
    team_gpus = sum(sum(plan.placement.get(f"g{i}", {}).values()) for i in range(3))
    assert team_gpus <= 8
    check(inst, plan)


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_deterministic_with_a_fixed_seed(policy: str) -> None:
    inst = random_instance(11, EveryRule(nodes=12, pending=40))
    inst = inst.model_copy(
        update={"config": SolverConfig(num_workers=2, seed=3, deterministic=True, time_limit_s=1.0)}
    )
    first = get_policy(policy).plan(inst)
    second = get_policy(policy).plan(inst)
    assert first.placement == second.placement
    assert first.actions == second.actions
    assert first.pending == second.pending
    assert first.stats.objective == second.stats.objective


def test_a_higher_priority_job_left_out_by_the_optimiser_is_not_called_lower_priority() -> None:
    plan = plan_with("shaper", _knapsack())
    assert plan.pending["A"].code is ReasonCode.insufficient_capacity
