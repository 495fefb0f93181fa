from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

import sqlalchemy as sa
from pydantic import BaseModel, ConfigDict, field_validator
from sqlmodel import Field, SQLModel

from app.core.types import NoNulStr, enum_column, json_column, required_utc_column, utc_column
from wire.redaction import MASK
from wire.steps import StepPhase


# What an action row does (its values are stored and in the API). start … requeue are what
# a plan asks for (``solver.plan.ActionKind``, mapped once by ``app.shaping.cycle.ACTION_KINDS``:
# the solver may not import ``app``, and these add kinds it never plans); reserve, unreserve
# and resume are the control plane's own, and move is a federation group's plan
# (``app.federation.moves``). A comment, not a docstring: pydantic would publish
# a docstring in the OpenAPI schema.
class ActionKind(StrEnum):
    # Holds GPUs on the target for the job a plan frees them for (ahead of the actions
    # that free them), so the native scheduler cannot hand them to anyone else.
    reserve = "reserve"
    # Gives such GPUs back when the job they were held for will not take them.
    unreserve = "unreserve"
    start = "start"
    migrate = "migrate"
    resize = "resize"
    preempt = "preempt"
    resume = "resume"
    requeue = "requeue"
    # A pending job goes to another cluster of its federation group (``target_cluster``):
    # submitted there, cancelled here once the target has accepted it.
    move = "move"
    # An operator's, about a node rather than a job (no job; ``source_node`` and
    # ``target_node`` name the node): the scheduler places no new work there (drain), or
    # may again (undrain). POST /clusters/{cluster}/nodes/{node}/drain and /undrain.
    drain = "drain"
    undrain = "undrain"
    # An operator's, about an Armada job set (``job_set_queue``, ``job_set``) rather than one
    # job: its queued jobs go to executor cluster ``target_executor``.
    # POST /clusters/{cluster}/job-sets/{queue}/{job_set}/move (app.actions.job_sets).
    move_job_set = "move_job_set"


# The kinds about a node, not a job: no job, fenced per node (app.actions.saga), never
# compensated (a drain is not undone because its confirm failed).
NODE_ACTION_KINDS = frozenset({ActionKind.drain, ActionKind.undrain})
# The kinds about a job set, not one job: no job, fenced per job set, never compensated
# (the scheduler's refusal changes nothing; a move that went through is the operator's).
JOB_SET_ACTION_KINDS = frozenset({ActionKind.move_job_set})


class ActionState(StrEnum):
    proposed = "proposed"
    approved = "approved"
    rejected = "rejected"
    dispatched = "dispatched"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    compensating = "compensating"
    compensated = "compensated"
    cancelled = "cancelled"


# The only moves an action may make. Anything else is a Conflict.
TRANSITIONS: dict[ActionState, frozenset[ActionState]] = {
    ActionState.proposed: frozenset(
        {ActionState.approved, ActionState.rejected, ActionState.cancelled}
    ),
    ActionState.approved: frozenset({ActionState.dispatched, ActionState.cancelled}),
    ActionState.dispatched: frozenset(
        {ActionState.running, ActionState.failed, ActionState.cancelled}
    ),
    ActionState.running: frozenset(
        {ActionState.succeeded, ActionState.failed, ActionState.compensating}
    ),
    ActionState.failed: frozenset({ActionState.compensating}),
    ActionState.compensating: frozenset({ActionState.compensated, ActionState.failed}),
    ActionState.rejected: frozenset(),
    ActionState.succeeded: frozenset(),
    ActionState.compensated: frozenset(),
    ActionState.cancelled: frozenset(),
}


# Where an action has ended: nothing it does can change any more.
TERMINAL_ACTION_STATES = frozenset(
    {
        ActionState.rejected,
        ActionState.succeeded,
        ActionState.failed,
        ActionState.compensated,
        ActionState.cancelled,
    }
)
# Ended without doing what it was for: its dependants cannot run.
UNDONE_ACTION_STATES = TERMINAL_ACTION_STATES - {ActionState.succeeded}
# Approved and not yet ended: it may still act on the cluster.
ACTIVE_ACTION_STATES = (
    ActionState.approved,
    ActionState.dispatched,
    ActionState.running,
    ActionState.compensating,
)


class ActionPublic(SQLModel):
    id: int
    plan_id: int | None
    cluster: str
    # Where a ``move`` sends the job (the action's ``cluster`` is where it comes from).
    target_cluster: str | None = None
    # The job's id (GET /jobs/{job_id}); None once the job's row is gone, and for a node's
    # action (drain, undrain: ``source_node`` names the node) and a job set's.
    job_id: int | None = None
    # A job set's action (move_job_set): the Armada queue and job set, and the executor
    # cluster its jobs go to.
    job_set_queue: str | None = None
    job_set: str | None = None
    target_executor: str | None = None
    job_external_id: str | None
    kind: ActionKind
    state: ActionState
    idempotency_key: str
    reason: str
    source_node: str | None
    target_node: str | None
    source_placement: dict[str, int] = {}
    target_placement: dict[str, int] = {}
    counts_on: list[str] = []
    target_replicas: int | None
    depends_on: list[int] = []
    fencing_token: int
    attempts: int
    error: str | None
    created_at: datetime
    updated_at: datetime
    decided_by: str | None
    decided_at: datetime | None
    finished_at: datetime | None = None


class NodeActionRequest(BaseModel):
    """An operator's drain or undrain of one node (the body is optional)."""

    model_config = ConfigDict(extra="forbid")

    # Why, kept on the action and handed to the scheduler (Slurm's node Reason, Ray's drain
    # message); absent: Shaper says who asked.
    reason: NoNulStr | None = Field(default=None, min_length=1, max_length=1024)


class JobSetMoveRequest(BaseModel):
    """An operator's move of a queued Armada job set to another executor cluster."""

    model_config = ConfigDict(extra="forbid")

    # The executor cluster (as the cluster's nodes report it: label armadaproject.io/executor).
    executor: NoNulStr = Field(min_length=1, max_length=128)
    # Why, kept on the action; absent: Shaper says who asked.
    reason: NoNulStr | None = Field(default=None, min_length=1, max_length=1024)


NODE_LIST = sa.String(255).with_variant(sa.Text(), "postgresql")


def node_names(nodes: str | None) -> list[str]:
    """The nodes an action's ``source_node`` or ``target_node`` names (comma-separated: a
    gang's action names every node it leaves or takes)."""
    return [n for n in (nodes or "").split(",") if n]


class Action(SQLModel, table=True):
    __tablename__ = "actions"
    __table_args__ = (sa.Index("ix_actions_cluster_state", "cluster_id", "state"),)

    id: int | None = Field(default=None, primary_key=True)
    plan_id: int | None = Field(
        default=None,
        sa_column=sa.Column(sa.Integer, sa.ForeignKey("plans.id", ondelete="SET NULL"), index=True),
    )
    cluster_id: int = Field(
        sa_column=sa.Column(
            sa.Integer, sa.ForeignKey("clusters.id", ondelete="CASCADE"), nullable=False
        )
    )
    # NULL for a node's action (NODE_ACTION_KINDS) and once the job's row is gone.
    job_id: int | None = Field(
        default=None,
        sa_column=sa.Column(sa.Integer, sa.ForeignKey("jobs.id", ondelete="SET NULL"), index=True),
    )
    # A move's destination (another cluster of the job's federation group); NULL otherwise,
    # and once that cluster is deleted (app.clusters.service clears it: SQLite cannot
    # reflect an ON DELETE added with a column, so the schema carries none).
    target_cluster_id: int | None = Field(
        default=None, sa_column=sa.Column(sa.Integer, sa.ForeignKey("clusters.id"))
    )
    kind: ActionKind = enum_column(ActionKind.start, 16)
    state: ActionState = enum_column(ActionState.proposed, 16)
    idempotency_key: str = Field(max_length=128, unique=True)
    reason: str = Field(default="", max_length=2048)
    # Comma-separated: a gang's action names every node it leaves or takes, which on a
    # large site's node names passes any short limit (32 nodes of 40 characters: 1,311).
    # TEXT on PostgreSQL; SQLite never enforced the VARCHAR's length, and changing the type
    # there would recreate the table (its steps' foreign keys cascade).
    source_node: str | None = Field(default=None, sa_type=NODE_LIST)
    target_node: str | None = Field(default=None, sa_type=NODE_LIST)
    # A job set's action (JOB_SET_ACTION_KINDS); NULL otherwise.
    job_set_queue: str | None = Field(default=None, max_length=128)
    job_set: str | None = Field(default=None, max_length=255)
    target_executor: str | None = Field(default=None, max_length=128)
    target_replicas: int | None = None
    # GPUs per node before and after the action (the counts behind source/target_node).
    source_placement: dict[str, int] = json_column(dict)
    target_placement: dict[str, int] = json_column(dict)
    # A reservation: the jobs whose GPUs on its nodes the plan frees for it (the connector
    # refuses to reserve GPUs that anyone else holds: the plan was made on a stale view).
    counts_on: list[str] = json_column(list)
    # Ids of the actions of the same plan that must succeed before this one may start.
    depends_on: list[int] = json_column(list)
    fencing_token: int = 0
    attempts: int = 0
    error: str | None = Field(default=None, max_length=4096)
    created_at: datetime = required_utc_column()
    updated_at: datetime = required_utc_column()
    decided_by: str | None = Field(default=None, max_length=128)
    decided_at: datetime | None = utc_column()
    finished_at: datetime | None = utc_column()


class StepState(StrEnum):
    pending = "pending"  # planned, not sent yet
    sent = "sent"  # a message is out; waiting for the executor's report
    succeeded = "succeeded"
    failed = "failed"
    skipped = "skipped"  # not needed (a compensation step whose forward step never ran)


class ActionStepPublic(SQLModel):
    seq: int
    phase: StepPhase
    name: str
    queue: str
    state: StepState
    generation: int
    idempotency_key: str
    attempts: int
    # Answers the step had while it was sent: fewer than ``attempts`` once it is over, a
    # copy of it may still be on its way to its executor (a cut-off node's queue).
    answers: int = 0
    result: dict[str, Any]
    error: str | None
    sent_at: datetime | None
    finished_at: datetime | None

    @field_validator("result", mode="after")
    @classmethod
    def _hide_workload_environment(cls, result: dict[str, Any]) -> dict[str, Any]:
        return without_environment_values(result)


def without_environment_values(result: dict[str, Any]) -> dict[str, Any]:
    """``result`` with the values of a checkpoint's workload environment hidden (names
    kept). A checkpoint step's result is the image (``agent.backends.base.CheckpointImage``),
    whose ``workload.env`` is the whole environment the job was started with: its target
    node needs it to start the workload again, but it holds whatever secrets the job had
    (API keys, passwords, this node's own token), and the steps are published to every
    viewer token. Returns a copy; the stored result is left whole."""
    image = result.get("image")
    if not isinstance(image, dict):
        return result
    workload = image.get("workload")
    if not isinstance(workload, dict) or not isinstance(workload.get("env"), dict):
        return result
    env: dict[str, Any] = workload["env"]
    hidden = dict.fromkeys(env, MASK)
    return {**result, "image": {**image, "workload": {**workload, "env": hidden}}}


class ActionStep(SQLModel, table=True):
    """One step of an action's saga: what was asked of whom, and what came back.

    The rows of an action, in ``seq`` order, are its step log; a step's idempotency key
    (``<action key>:<phase>:<name>``) is what the executor deduplicates on.
    """

    __tablename__ = "action_steps"
    __table_args__ = (sa.UniqueConstraint("action_id", "seq", name="uq_action_steps_action_seq"),)

    id: int | None = Field(default=None, primary_key=True)
    action_id: int = Field(
        sa_column=sa.Column(
            sa.Integer, sa.ForeignKey("actions.id", ondelete="CASCADE"), nullable=False
        )
    )
    seq: int
    phase: StepPhase = enum_column(StepPhase.forward, 16)
    name: str = Field(max_length=32)
    # Where the step runs: "agent.<cluster>.<node>" or "connector.<cluster>".
    queue: str = Field(max_length=320)
    state: StepState = enum_column(StepState.pending, 16)
    # The job's fencing token the step carries; executors refuse older ones.
    generation: int = 0
    idempotency_key: str = Field(max_length=200, unique=True)
    attempts: int = 0
    # Answers recorded while it was sent: fewer than ``attempts`` when it fails on a "not
    # now", and a copy of it may still be on its way to its executor (saga.record_report).
    answers: int = 0
    result: dict[str, Any] = json_column(dict)
    error: str | None = Field(default=None, max_length=4096)
    sent_at: datetime | None = utc_column()
    finished_at: datetime | None = utc_column()


class ChurnPublic(SQLModel):
    """How often Shaper acted on the same jobs over a window (lower is calmer)."""

    cluster: str | None
    window_s: float
    dwell_s: float
    actions: int  # actions that ran (reservations not counted)
    job_hours: float  # hours jobs held GPUs within the window
    actions_per_job_hour: float | None
    jobs_acted_on: int
    jobs_acted_on_twice_within_dwell: int
    examples: list[str]  # some of those jobs
