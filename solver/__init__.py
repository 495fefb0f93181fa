"""Shaper's placement solver: pure (stdlib, ortools, pydantic only).

Entry points: :class:`solver.instance.Instance` in, :class:`solver.plan.Plan` out,
:func:`solver.policies.get_policy` for the four policies and
:func:`solver.validate.validate` to check any plan against every hard constraint::

    from solver import GpuModel, Instance, Job, Node, check
    from solver.policies import get_policy

    instance = Instance(
        now=clock.now(),
        gpu_models=(GpuModel(name="h100", memory_mib=81_920, speed=2.0),),
        nodes=(Node(name="n1", cluster="c1", gpu_model="h100", gpus=8),),
        jobs=(
            Job(id="train-1", gpus_per_replica=4, placement={"n1": 4}, start_time=...),
            Job(id="train-2", gpus_per_replica=8, submit_time=...),  # pending
        ),
    )
    plan = get_policy("shaper").plan(instance)  # or "fifo", "backfill", "priority"
    check(instance, plan)                       # raises PlanInvalid on any violation
    plan.placement      # job -> node -> GPUs after the plan (running jobs included)
    plan.actions        # start / migrate / resize / preempt / requeue, each with a reason
    plan.pending        # reason for every job that holds nothing after the plan
    plan.gpu_indices    # job -> node -> GPU indices
    plan.stats          # engine, status, objective, best bound, gap, wall time

The objective is documented in :mod:`solver.objective`, the CP-SAT model in
:mod:`solver.model`, the engine that runs it in :mod:`solver.solve` (its phases each in a module
of their own), the rule-based engine behind every policy in :mod:`solver.greedy`.
"""

from solver.instance import (
    GpuModel,
    Instance,
    Job,
    JobShape,
    MigrationCostModel,
    Node,
    NodeState,
    SlaPolicy,
    SolverConfig,
)
from solver.plan import Action, ActionKind, Plan, Reason, ReasonCode, SolveStats
from solver.validate import PlanInvalid, Violation, check, validate

__all__ = [
    "Action",
    "ActionKind",
    "GpuModel",
    "Instance",
    "Job",
    "JobShape",
    "MigrationCostModel",
    "Node",
    "NodeState",
    "Plan",
    "PlanInvalid",
    "Reason",
    "ReasonCode",
    "SlaPolicy",
    "SolveStats",
    "SolverConfig",
    "Violation",
    "check",
    "validate",
]
