"""The exact per-node model: hand-worked optima, and a bound no policy's plan beats."""

from __future__ import annotations

import pytest

from bench.instances import EveryRule, LoadedCluster, random_instance
from solver.exact import MAX_NODES, solve_exact
from solver.instance import Instance, NodeState, SlaPolicy
from solver.objective import evaluate
from solver.plan import SolveStatus
from solver.policies import POLICY_NAMES, get_policy
from solver.validate import validate

from .builders import FAST, NOW, instance, job, node, running, service

# 20 GB default checkpoint at 1,000 MiB/s both ways, plus 30 s overhead.
MIGRATION_S = 30.0 + 2 * 20_000 / 1000
FRAGMENTATION = 0.05


def exact_optimum(inst: Instance) -> float:
    result = solve_exact(inst, time_limit_s=10.0, num_workers=1)
    assert result.status is SolveStatus.optimal
    assert result.exact, result.violations
    assert result.objective is not None and result.bound is not None
    assert result.bound == pytest.approx(result.objective, abs=1e-2)
    return result.objective


def test_packs_the_best_subset_not_the_first_jobs() -> None:
    # 8 a100 GPUs (speed 1): {B, C} = 4 × 2 + 2 × 1 = 10 beats {A, C} = 6 + 2 (FIFO's pick).
    inst = instance(
        [node("n1")],
        [
            job("a", gpus=6, submit_time=NOW - 300),
            job("b", gpus=4, priority=2.0),
            job("c", gpus=2),
        ],
    )
    assert exact_optimum(inst) == pytest.approx(10.0)
    assert evaluate(inst, get_policy("fifo").plan(inst).placement).objective < 10.0


def test_moves_a_checkpointable_job_off_the_fast_node() -> None:
    # Keep R (4 GPUs) on the h100 (speed 2) and start G on the a100: 4·2 + 8·1 = 16. Move R
    # to the a100 and G to the h100: 4·1 + 8·2 = 20, less R's migration: 4 GPUs × 70 s.
    nodes = [node("fast", model="h100"), node("slow")]
    movable = running("r", {"fast": 4}, checkpointable=True)
    inst = instance(nodes, [movable, job("g", gpus=8)])
    assert exact_optimum(inst) == pytest.approx(20.0 - 4 * MIGRATION_S / 3600)
    # Not checkpointable: stopping R costs its hour of work, 4 GPU-hours, so
    # 16 − 4 + one free node is worse than keeping it: 16.
    pinned = instance(nodes, [movable.model_copy(update={"checkpointable": False}), job("g", 8)])
    assert exact_optimum(pinned) == pytest.approx(16.0)


def test_serves_demand_before_a_block_job_and_never_lands_on_a_draining_node() -> None:
    # Service demand 3 on 4 free GPUs: 3 served = 3. The 4-GPU job instead would be worth
    # 4 × 2 = 8 but leave 3 replicas unmet at 8 each: −16. The draining node takes nothing
    # and earns no free-node credit.
    inst = instance(
        [node("n1", gpus=4), node("drain", state=NodeState.draining)],
        [service("s", forecast=(3,)), job("b", gpus=4, priority=2.0)],
    )
    assert exact_optimum(inst) == pytest.approx(3.0)


def test_gang_stays_in_one_cluster() -> None:
    # A 2 × 4-GPU gang: n1 + n2 span two clusters, n1 + n3 do not: 8, plus n2 left free.
    gang = job("g", gpus=4, replicas=2, max_nodes=2)
    split = instance([node("n1", 4), node("n2", 4, cluster="c2")], [gang])
    assert exact_optimum(split) == pytest.approx(2 * FRAGMENTATION)
    joined = instance([node("n1", 4), node("n2", 4, cluster="c2"), node("n3", 4)], [gang])
    assert exact_optimum(joined) == pytest.approx(8.0 + FRAGMENTATION)


def test_quota_caps_a_team() -> None:
    # Team "t" may hold 4 GPUs: the 2-GPU job at priority 4 (8) and one at priority 1 (2)
    # fit it; the 4-GPU job at priority 2 (8) would leave no room for either.
    policy = SlaPolicy(team="t", borrowing_limit=4)
    inst = instance(
        [node("n1")],
        [
            job("a", gpus=2, priority=4.0, team="t"),
            job("b", gpus=2, team="t"),
            job("c", gpus=4, priority=2.0, team="t"),
        ],
        policies=(policy,),
    )
    assert exact_optimum(inst) == pytest.approx(10.0)


def test_pins_only_legal_plans() -> None:
    # Rule 10: an overdue job that fits on free GPUs may not be left pending; a frozen
    # running job may not move.
    overdue = job("late", gpus=2, overdue=True)
    inst = instance([node("n1", 4)], [overdue])
    assert solve_exact(inst, pin={}).status is SolveStatus.infeasible
    assert solve_exact(inst, pin={"late": {"n1": 2}}).status is SolveStatus.optimal
    frozen = running("r", {"n1": 2}, checkpointable=True, locked=True)
    inst = instance([node("n1", 4), node("n2", 4)], [frozen])
    assert solve_exact(inst, pin={"r": {"n2": 2}}).status is SolveStatus.infeasible


def test_refuses_large_instances() -> None:
    nodes = [node(f"n{i}") for i in range(MAX_NODES + 1)]
    with pytest.raises(ValueError, match="at most"):
        solve_exact(instance(nodes, []))


@pytest.mark.parametrize("seed", range(40))
def test_no_policy_beats_the_exact_bound(seed: int) -> None:
    """On random small instances (quotas, guarantees, overdue jobs, frozen jobs, draining
    nodes, gangs): the exact plan is legal, no policy's plan scores above the bound, and
    the model admits every policy's plan at no less than its objective (so the bound is
    one on the real problem, not on a smaller one)."""
    inst = random_instance(seed, EveryRule(nodes=6, pending=12, shaper_history=bool(seed % 2)))
    result = solve_exact(inst, time_limit_s=5.0, num_workers=1)
    assert result.bound is not None and result.plan is not None
    assert result.exact == (result.status is SolveStatus.optimal)
    assert validate(inst, result.plan) == []
    for name in POLICY_NAMES:
        plan = get_policy(name).plan(inst)
        objective = evaluate(inst, plan.placement).objective
        assert objective <= result.bound + 1e-6, name
        pinned = solve_exact(inst, pin=plan.placement, time_limit_s=5.0, num_workers=1)
        assert pinned.status is SolveStatus.optimal, name
        assert pinned.bound is not None and pinned.bound >= objective - 1e-6, name


@pytest.mark.parametrize(("gpus", "seed"), [(16, 1), (16, 2), (32, 1), (32, 3), (64, 1)])
def test_benchmark_instances_are_solved_exactly(gpus: int, seed: int) -> None:
    """The small section of bench/solver.py: proven optimal, legal, above every policy."""
    inst = random_instance(seed, LoadedCluster(gpus=gpus, load=1.0), FAST)
    result = solve_exact(inst, time_limit_s=10.0, num_workers=1)
    assert result.exact, (result.status, result.violations)
    assert result.objective is not None
    for name in POLICY_NAMES:
        plan = get_policy(name).plan(inst)
        assert plan.stats.objective <= result.objective + 1e-6, name
