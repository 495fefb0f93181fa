"""Max queue wait as a hard rule: engines place overdue jobs whenever they can, the CP-SAT
model requires as many as any of its solutions places, and ``validate`` rejects a plan
that leaves one pending on free GPUs it fits."""

from __future__ import annotations

import pytest
from ortools.sat.python import cp_model

from solver.compat import Compatibility
from solver.instance import Instance, SlaPolicy, SolverConfig
from solver.model import PlacementModel, build_classes, build_pools
from solver.overdue_pass import require_overdue
from solver.plan import ActionKind, ReasonCode
from solver.state import ClusterState
from solver.validate import validate

from .builders import FAST, NOW, instance, job, node, plan_from, plan_with, running

ALL = ("fifo", "backfill", "priority", "shaper")
LATE = SlaPolicy(team="late", priority_weight=2, max_queue_wait_s=3600)
LOW = SlaPolicy(team="low", priority_weight=1)
OVERDUE_SUBMIT = NOW - 7200


@pytest.mark.parametrize("policy", ["priority", "shaper"])
def test_overdue_job_preempts_lower_priority_work(policy: str) -> None:
    jobs = [
        running("r", {"a": 8}, team="low", checkpointable=True),
        job("late", 8, team="late", submit_time=OVERDUE_SUBMIT),
    ]
    plan = plan_with(policy, instance([node("a")], jobs, policies=(LATE, LOW)))
    assert plan.placement.get("late") == {"a": 8}
    assert "r" not in plan.placement
    assert plan.actions_for("late")[0].reason.code is ReasonCode.overdue
    assert plan.actions_for("r")[0].kind in (ActionKind.preempt, ActionKind.requeue)


@pytest.mark.parametrize("policy", ALL)
def test_overdue_job_is_not_held_behind_a_blocked_queue_head(policy: str) -> None:
    # "head" arrived first and does not fit; strict FIFO would block everything behind it.
    jobs = [
        running("r", {"a": 6}, team="low"),
        job("head", 8, team="low", submit_time=NOW - 50_000),
        job("late", 2, team="late", submit_time=OVERDUE_SUBMIT),
    ]
    plan = plan_with(policy, instance([node("a")], jobs, policies=(LATE, LOW)))
    assert plan.placement.get("late") == {"a": 2}
    assert plan.actions_for("late")[0].reason.code is ReasonCode.overdue


@pytest.mark.parametrize("policy", ALL)
def test_overdue_job_nothing_legal_places(policy: str) -> None:
    # The only node is held by work that may not be stopped: the plan is still valid,
    # and the reason says the job is overdue and why it stays pending.
    jobs = [
        running("r", {"a": 8}, team="low", preemptible=False),
        job("late", 8, team="late", submit_time=OVERDUE_SUBMIT),
    ]
    plan = plan_with(policy, instance([node("a")], jobs, policies=(LATE, LOW)))
    assert plan.placement["r"] == {"a": 8}
    reason = plan.pending["late"]
    assert reason.message.startswith("past its max queue wait")
    assert reason.code in (ReasonCode.insufficient_capacity, ReasonCode.lower_priority)


@pytest.mark.parametrize("policy", ALL)
def test_competing_overdue_jobs_place_as_many_as_fit(policy: str) -> None:
    jobs = [
        job("late1", 8, team="late", submit_time=OVERDUE_SUBMIT),
        job("late2", 8, team="late", submit_time=OVERDUE_SUBMIT - 10),
        job("late3", 4, team="late", submit_time=OVERDUE_SUBMIT - 20),
    ]
    plan = plan_with(policy, instance([node("a"), node("b", gpus=4)], jobs, policies=(LATE,)))
    placed = {j for j in ("late1", "late2", "late3") if j in plan.placement}
    assert len(placed) == 2
    assert "late3" in placed
    (left,) = {"late1", "late2"} - placed
    assert plan.pending[left].message.startswith("past its max queue wait")


def _model(inst: Instance) -> PlacementModel:
    state = ClusterState(inst, Compatibility(inst))
    pending = [j for j in inst.jobs if not j.is_running]
    classes = build_classes(inst, state.compat, pending, {j.id: () for j in pending})
    model = PlacementModel(inst, build_pools(state, pending), classes, [], {})
    model.build()
    require_overdue(model)
    return model


def test_cp_sat_places_the_overdue_job_even_when_the_objective_prefers_another() -> None:
    # Without the boost (overdue_weight 1) the objective prefers "rich" (weight 5); the
    # hard rule still puts the overdue job on the only free node.
    config = FAST.model_copy(update={"overdue_weight": 1.0})
    jobs = [
        job("late", 8, team="late", submit_time=OVERDUE_SUBMIT),
        job("rich", 8, team="rich"),
    ]
    policies = (LATE, SlaPolicy(team="rich", priority_weight=5))
    inst = instance([node("a")], jobs, policies=policies, config=config)
    model = _model(inst)
    assert model.overdue_required == 1 and model.overdue_proven
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    assert solver.solve(model.model) == cp_model.OPTIMAL
    placed = {
        o.job_class.jobs[0].id: solver.value(o.var) for o in model.options if solver.value(o.var)
    }
    assert placed == {"late": 1}
    plan = plan_with("shaper", inst)
    assert "late" in plan.placement and "rich" not in plan.placement


def test_cp_sat_overdue_requirement_never_makes_the_model_infeasible() -> None:
    # Three overdue 8-GPU jobs compete for two nodes: the model asks for two, not three.
    jobs = [job(f"late{i}", 8, team="late", submit_time=OVERDUE_SUBMIT) for i in range(3)]
    inst = instance([node("a"), node("b")], jobs, policies=(LATE,))
    model = _model(inst)
    assert model.overdue_required == 2
    assert cp_model.CpSolver().solve(model.model) == cp_model.OPTIMAL


def test_validate_flags_an_overdue_job_left_on_free_gpus() -> None:
    jobs = [job("late", 4, team="late", submit_time=OVERDUE_SUBMIT), job("p", 4)]
    inst = instance([node("a")], jobs, policies=(LATE,))
    violations = validate(inst, plan_from(inst, {"p": {"a": 4}}))
    assert [v.job_id for v in violations if v.rule == "overdue"] == ["late"]


def test_validate_accepts_an_overdue_job_that_does_not_fit() -> None:
    jobs = [job("late", 8, team="late", submit_time=OVERDUE_SUBMIT), job("p", 4)]
    inst = instance([node("a")], jobs, policies=(LATE,))
    plan = plan_from(inst, {"p": {"a": 4}})
    assert "overdue" not in {v.rule for v in validate(inst, plan)}


def test_validate_ignores_jobs_within_their_wait_and_respects_quota() -> None:
    capped = SlaPolicy(team="late", max_queue_wait_s=3600, guaranteed_gpus=0, borrowing_limit=2)
    # Same max wait, but waiting only a minute so far: not overdue, free GPUs or not.
    prompt = SlaPolicy(team="prompt", max_queue_wait_s=3600)
    jobs = [
        job("late", 4, team="late", submit_time=OVERDUE_SUBMIT),
        job("fresh", 4, team="prompt"),
    ]
    inst = instance([node("a", gpus=16)], jobs, policies=(capped, prompt))
    assert not inst.is_overdue(inst.job_by_id["fresh"])
    plan = plan_from(inst, {})
    assert "overdue" not in {v.rule for v in validate(inst, plan)}


def test_no_max_wait_no_rule() -> None:
    config = SolverConfig(time_limit_s=1.0, num_workers=1, deterministic=True)
    inst = instance([node("a")], [job("p", 4, submit_time=0.0)], config=config)
    assert "overdue" not in {v.rule for v in validate(inst, plan_from(inst, {}))}
