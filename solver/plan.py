"""Solver outputs: the target placement, the actions that reach it, and why.

``Plan.placement`` is the complete target state: every job that should hold GPUs after
the plan maps to ``{node: GPUs}`` (running jobs that keep their place included); a job
absent from it holds nothing. ``Plan.actions`` are the steps from the instance's current
placement to that target, each with a :class:`Reason`. ``Plan.pending`` gives the reason
for every pending job that stays pending (and every job the plan stops).
``Plan.gpu_indices`` names the GPUs behind each count (kept where a job stays).

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
    PLACED = "placed"
    RESIZED_TO_DEMAND = "resized_to_demand"
    DEFRAGMENTATION = "defragmentation"
    PREEMPTED_BY_HIGHER_PRIORITY = "preempted_by_higher_priority"
    OVERDUE = "overdue"
    # Why a pending job stays pending (or a running one was stopped).
    NO_COMPATIBLE_GPU_MODEL = "no_compatible_gpu_model"
    QUOTA = "quota"
    FRAGMENTATION = "fragmentation"
    DISRUPTION_BUDGET = "disruption_budget"
    LOWER_PRIORITY = "lower_priority"
    INSUFFICIENT_CAPACITY = "insufficient_capacity"
    QUEUE_ORDER = "queue_order"
    FORECAST_RESERVATION = "forecast_reservation"
    BACKFILL_RESERVATION = "backfill_reservation"
    DWELL = "dwell"  # frozen: Shaper acted on it lately, its move budget is spent, or a saga runs


class Reason(BaseModel):
    model_config = ConfigDict(frozen=True)

    code: ReasonCode
    message: str = ""


class ActionKind(enum.StrEnum):
    START = "start"  # pending job starts at ``to_placement``
    MIGRATE = "migrate"  # checkpoint at ``from_placement``, restore at ``to_placement``
    RESIZE = "resize"  # elastic service to ``replicas`` (``to_placement`` is the result)
    PREEMPT = "preempt"  # stop; work since the last checkpoint is lost; back to the queue
    REQUEUE = "requeue"  # checkpoint, stop, back to the queue (no work lost)


class Action(BaseModel):
    model_config = ConfigDict(frozen=True)

    kind: ActionKind
    job_id: str
    from_placement: dict[str, int] = Field(default_factory=dict)
    to_placement: dict[str, int] = Field(default_factory=dict)
    replicas: int | None = None
    reason: Reason


class SolveStatus(enum.StrEnum):
    OPTIMAL = "optimal"
    FEASIBLE = "feasible"  # a legal plan, optimality not proven
    HEURISTIC = "heuristic"  # produced by a rule or a greedy engine, no bound
    INFEASIBLE = "infeasible"
    UNKNOWN = "unknown"
    MODEL_INVALID = "model_invalid"


class SolveStats(BaseModel):
    status: SolveStatus = SolveStatus.HEURISTIC
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
    stats: SolveStats = Field(default_factory=SolveStats)

    def actions_for(self, job_id: str) -> list[Action]:
        return [action for action in self.actions if action.job_id == job_id]
