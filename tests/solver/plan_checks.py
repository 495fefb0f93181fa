"""Checks every policy's plan must pass, shared by the property tests."""

from __future__ import annotations

import pytest

from solver.instance import Instance
from solver.objective import evaluate
from solver.plan import ActionKind, Plan, ReasonCode
from solver.policies import POLICY_NAMES, get_policy
from solver.relaxation import global_upper_bound
from solver.validate import validate


def placed_where_it_says(plan: Plan) -> None:
    """A start's reason names the nodes the job starts on; a job stopped or moved to make
    room for another leaves GPUs on a node where that other one lands."""
    for action in plan.actions:
        message = action.reason.message
        if action.kind is ActionKind.start and action.reason.code in (
            ReasonCode.placed,
            ReasonCode.overdue,
        ):
            said = message.rsplit("placed on ", 1)[-1]
            where = {part.split(":")[0] for part in said.split(", ")}
            assert where == set(action.to_placement), (plan.policy, action)
        beneficiary = None
        if message.startswith("stopped for "):
            beneficiary = message.removeprefix("stopped for ").split(",")[0]
        elif message.startswith("stopped on "):
            beneficiary = message.split(" for service ")[1].split(",")[0]
        elif " to make room " in message:
            beneficiary = message.rsplit(" for ", 1)[1].removeprefix("service ")
        if beneficiary is not None:
            lands = set(plan.placement.get(beneficiary, {}))
            assert lands & set(action.from_placement), (plan.policy, action, lands)


def every_policy_plans_legally(inst: Instance) -> dict[str, Plan]:
    """Each policy's plan of ``inst``, checked: legal, scored as ``evaluate`` scores it,
    under the global bound, saying where it places and why a job waits."""
    bound = global_upper_bound(inst)
    plans = {}
    for name in POLICY_NAMES:
        plan = plans[name] = get_policy(name).plan(inst)
        assert validate(inst, plan) == [], name
        assert plan.stats.objective == pytest.approx(evaluate(inst, plan.placement).objective)
        assert plan.stats.objective <= bound + 1e-6, name
        placed_where_it_says(plan)
        for job in inst.jobs:
            if not job.is_elastic and job.id not in plan.placement:
                assert job.id in plan.pending, (name, job.id)
    return plans
