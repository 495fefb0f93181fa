"""Solver outputs: the target placement, the actions that reach it, and why.

``Plan.placement`` is the complete target state: every job that should hold GPUs after
the plan maps to ``{node: GPUs}`` (running jobs that keep their place included); a job
absent from it holds nothing. ``Plan.actions`` are the steps from the instance's current
placement to that target, each with a :class:`Reason`. ``Plan.pending`` gives the reason
for every pending job that stays pending (and every job the plan stops).
``Plan.gpu_indices`` names the GPUs behind each count (kept where a job stays);
``Plan.mig_starts`` where on its GPU each MIG job's instance starts.

The control plane stores each action as a row whose kind is its own
``app.actions.models.ActionKind``: these five plus the saga kinds only it needs (reserve,
unreserve, resume). The solver imports nothing of ``app``, so the two enums stay apart and
``app.shaping.cycle.ACTION_KINDS`` maps one onto the other, once.
"""

from __future__ import annotations

import enum

from pydantic import BaseModel, ConfigDict, Field


class ReasonCode(enum.StrEnum):
    # Why something was done.
    placed = "placed"
    resized_to_demand = "resized_to_demand"
    defragmentation = "defragmentation"
    faster_gpus = "faster_gpus"  # moved onto GPUs faster for it (solver.greedy.upgrades)
    shrunk = "shrunk"  # elastic training job resized down instead of stopping work
    grown = "grown"  # elastic training job resized up into idle GPUs (solver.elastic_training)
    preempted_by_higher_priority = "preempted_by_higher_priority"
    overdue = "overdue"
    # Why a pending job stays pending (or a running one was stopped).
    no_compatible_gpu_model = "no_compatible_gpu_model"
    quota = "quota"
    fragmentation = "fragmentation"
    disruption_budget = "disruption_budget"
    lower_priority = "lower_priority"
    insufficient_capacity = "insufficient_capacity"
    queue_order = "queue_order"
    forecast_reservation = "forecast_reservation"
    backfill_reservation = "backfill_reservation"
    dwell = "dwell"  # frozen: Shaper acted on it lately, its move budget is spent, or a saga runs


class Reason(BaseModel):
    model_config = ConfigDict(frozen=True)

    code: ReasonCode
    message: str = ""


class ActionKind(enum.StrEnum):
    start = "start"  # pending job starts at ``to_placement``
    migrate = "migrate"  # checkpoint at ``from_placement``, restore at ``to_placement``
    # An elastic service to ``replicas``, or an elastic training job (``Job.is_resizable``)
    # checkpointed and restarted at ``replicas`` on ``to_placement``; also the size an
    # elastic training job starts at.
    resize = "resize"
    preempt = "preempt"  # stop; work since the last checkpoint is lost; back to the queue
    requeue = "requeue"  # checkpoint, stop, back to the queue (no work lost)


class Action(BaseModel):
    model_config = ConfigDict(frozen=True)

    kind: ActionKind
    job_id: str
    from_placement: dict[str, int] = Field(default_factory=dict)
    to_placement: dict[str, int] = Field(default_factory=dict)
    replicas: int | None = None
    reason: Reason


class SolveStatus(enum.StrEnum):
    optimal = "optimal"
    feasible = "feasible"  # a legal plan, optimality not proven
    heuristic = "heuristic"  # produced by a rule or a greedy engine, no bound
    infeasible = "infeasible"
    unknown = "unknown"
    model_invalid = "model_invalid"


class SolveStats(BaseModel):
    status: SolveStatus = SolveStatus.heuristic
    engine: str = "greedy"  # "fifo" | "backfill" | "priority" | "greedy" | "cp-sat"
    objective: float = 0.0
    best_bound: float | None = None
    gap: float | None = None
    wall_time_s: float = 0.0
    note: str = ""


class Plan(BaseModel):
    policy: str
    placement: dict[str, dict[str, int]] = Field(default_factory=dict)
    actions: list[Action] = Field(default_factory=list)
    pending: dict[str, Reason] = Field(default_factory=dict)
    gpu_indices: dict[str, dict[str, tuple[int, ...]]] = Field(
        default_factory=dict, description="job -> node -> GPU indices held after the plan"
    )
    # Left out of dumps when empty, so a plan without MIG jobs serialises as it always did.
    mig_starts: dict[str, int] = Field(
        default_factory=dict,
        exclude_if=lambda starts: not starts,
        description="MIG jobs (Job.mig_profile) -> the first memory slice of their GPU "
        "instance, on the GPU gpu_indices names (solver.mig)",
    )
    stats: SolveStats = Field(default_factory=SolveStats)

    def actions_for(self, job_id: str) -> list[Action]:
        return [action for action in self.actions if action.job_id == job_id]
