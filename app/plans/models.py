from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from app.actions.models import ActionStepPublic
from app.core.types import enum_column, json_column, required_utc_column, utc_column


class PlanState(StrEnum):
    """Where a plan stands as a whole (its solve status is ``status``)."""

    observed = "observed"  # nothing to act on: observe mode, no action, or an invalid plan
    proposed = "proposed"  # advise mode: waiting for an operator's decision
    approved = "approved"  # its actions run (enforce mode: at once)
    finished = "finished"  # every action has ended
    rejected = "rejected"  # an operator rejected it whole
    expired = "expired"  # the state it was made on changed: it no longer applies
    superseded = "superseded"  # a materially better plan replaced it


# Plans that still decide what happens on their cluster: their unfinished actions are
# reviewed every cycle (several at once in enforce mode, where each cycle may add one).
OPEN_PLAN_STATES = frozenset({PlanState.proposed, PlanState.approved})


class PlanPublic(SQLModel):
    id: int
    cluster: str | None
    created_at: datetime
    policy: str
    engine: str
    mode: str
    status: str
    objective: float | None
    best_bound: float | None
    gap: float | None
    wall_time_s: float
    decisions: list[dict[str, Any]]
    summary: dict[str, Any]
    state: PlanState = PlanState.observed
    state_reason: str | None = None
    checked_at: datetime | None = None
    decided_by: str | None = None
    decided_at: datetime | None = None


class PlacedJob(SQLModel):
    job: str  # the job's external id
    # The job's id (GET /jobs/{job_id}); None once its row is gone.
    job_id: int | None
    gpus: int
    # Which of the node's GPUs, where known (empty: the scheduler only counts them).
    gpu_indices: list[int] = []


class NodePlacement(SQLModel):
    """One node a plan's actions touch: who held its GPUs before the plan, who after."""

    node: str
    # Its GPU model and GPUs when the plan was made; None where the plan did not store them.
    gpu_model: str | None
    gpus: int | None
    before: list[PlacedJob]
    after: list[PlacedJob]


class PlanPlacement(SQLModel):
    """GET /plans/{id}/placement: the plan's placement change, node by node."""

    plan_id: int
    cluster: str | None
    # False for a plan stored before its placement was: rebuilt from its actions, it
    # shows only the jobs they move, not the neighbours they leave alone.
    complete: bool
    nodes: list[NodePlacement]


class PlanStepPublic(ActionStepPublic):
    """A saga step of one of a plan's actions (GET /plans/{id}/steps)."""

    action_id: int


class JobDecisions(SQLModel):
    """What a cluster's latest plan decided for some jobs (GET /plans/decisions): the queue
    page's "why waiting" without the plan's every other decision."""

    cluster: str
    # None when the cluster has no plan yet.
    plan_id: int | None
    created_at: datetime | None
    # In the plan's order; a job the plan did not decide on has none.
    decisions: list[dict[str, Any]]


class PlanDecisionOnJob(SQLModel):
    """One plan's decision about one job (GET /plans/decisions/history): the job page's
    account of what the shaping cycle made of the job, plan after plan."""

    plan_id: int
    created_at: datetime
    # The plan's mode and where it stands now: a decision of an observed or rejected plan
    # never ran.
    mode: str
    plan_state: PlanState
    decision: dict[str, Any]


class Plan(SQLModel, table=True):
    """One solve of the shaping cycle, with a reason for every decision it made."""

    __tablename__ = "plans"

    id: int | None = Field(default=None, primary_key=True)
    cluster_id: int | None = Field(
        default=None,
        sa_column=sa.Column(
            sa.Integer, sa.ForeignKey("clusters.id", ondelete="CASCADE"), index=True
        ),
    )
    created_at: datetime = required_utc_column(index=True)
    policy: str = Field(max_length=32)
    engine: str = Field(max_length=32)
    mode: str = Field(max_length=16)
    status: str = Field(max_length=32)
    objective: float | None = None
    best_bound: float | None = None
    gap: float | None = None
    wall_time_s: float = 0.0
    decisions: list[dict[str, Any]] = json_column(list)
    summary: dict[str, Any] = json_column(dict)
    state: PlanState = enum_column(PlanState.observed, 16)
    # Why it expired, was superseded or rejected.
    state_reason: str | None = Field(default=None, max_length=1024)
    # The last cycle that found it still applies (a kept proposal is re-checked each cycle).
    checked_at: datetime | None = utc_column()
    decided_by: str | None = Field(default=None, max_length=128)
    decided_at: datetime | None = utc_column()
