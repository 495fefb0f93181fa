from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from app.core.types import enum_column, json_column, required_utc_column, utc_column
from wire.residency import Residency
from wire.telemetry import JobKind, JobShape, JobState


class AllocationPublic(SQLModel):
    node: str
    # Device indices where the scheduler knows them (Slurm); Kubernetes only counts.
    gpu_indices: list[int]
    gpu_count: int
    started_at: datetime


class JobPublic(SQLModel):
    id: int
    cluster: str
    external_id: str
    name: str
    team: str
    queue: str
    kind: JobKind
    shape: JobShape
    priority: int
    sla_class: str
    gpus_requested: int
    allowed_gpu_models: list[str]
    required_nodes: list[str] = []
    residency: Residency | None = None
    min_gpu_memory_gib: float
    required_precision: str | None
    gang_size: int
    checkpointable: bool
    min_replicas: int
    max_replicas: int
    replicas: int
    submit_time: datetime | None
    start_time: datetime | None
    end_time: datetime | None
    state: JobState
    reason: str
    restart_count: int
    time_limit_s: float | None = None
    replicas_movable: bool = False
    speeds: dict[str, float] = {}
    generation: int = 0
    displaced_at: datetime | None = None
    displaced_reason: str | None = None
    updated_at: datetime
    allocations: list[AllocationPublic] = []


class Job(SQLModel, table=True):
    __tablename__ = "jobs"
    __table_args__ = (
        sa.UniqueConstraint("cluster_id", "external_id", name="uq_jobs_cluster_external_id"),
        sa.Index("ix_jobs_cluster_state", "cluster_id", "state"),
        # The overview's pending demand per cluster, read from the index alone (issue 18).
        sa.Index(
            "ix_jobs_state_demand", "state", "cluster_id", "shape", "gpus_requested", "min_replicas"
        ),
        # The queue page's waiting jobs, longest waiting first (GET /jobs?state=pending
        # &sort=submit_time): a page of 50 read from the index instead of sorting every
        # pending job per request (issue 18).
        sa.Index("ix_jobs_state_submit_time_id", "state", "submit_time", "id"),
    )

    id: int | None = Field(default=None, primary_key=True)
    cluster_id: int = Field(
        sa_column=sa.Column(
            sa.Integer, sa.ForeignKey("clusters.id", ondelete="CASCADE"), nullable=False
        )
    )
    external_id: str = Field(max_length=255)
    name: str = Field(default="", max_length=255)
    team: str = Field(default="default", max_length=128)
    queue: str = Field(default="default", max_length=128)
    kind: JobKind = enum_column(JobKind.other, 32)
    shape: JobShape = enum_column(JobShape.block, 16)
    priority: int = 0
    sla_class: str = Field(default="standard", max_length=64)
    gpus_requested: int = 0
    allowed_gpu_models: list[str] = json_column(list)
    # A pending job may start only there (wire: JobReport.required_nodes).
    required_nodes: list[str] = json_column(list)
    # How to submit it in another cluster of its federation group (wire:
    # JobReport.submit as compact JSON text, compared as text by each push; None: its
    # connector cannot say, so it stays where it is). Text, not JSON: the JSON columns are
    # compared with their spaces taken out, and a batch script's spaces are its own.
    # Not published: a batch script may hold what only its owner should read.
    submit_spec: str | None = Field(default=None, sa_column=sa.Column(sa.Text(), nullable=True))
    # The clusters of its federation group it may run in (wire: JobReport.residency, as
    # its JSON; None: no rule of its own). SQL NULL, not JSON null, when absent.
    residency: dict[str, Any] | None = Field(
        default=None, sa_column=sa.Column(sa.JSON(none_as_null=True), nullable=True)
    )
    min_gpu_memory_gib: float = 0
    required_precision: str | None = Field(default=None, max_length=16)
    gang_size: int = 1
    checkpointable: bool = False
    min_replicas: int = 0
    max_replicas: int = 0
    replicas: int = 0
    submit_time: datetime | None = utc_column()
    start_time: datetime | None = utc_column()
    end_time: datetime | None = utc_column()
    state: JobState = enum_column(JobState.pending, 16)
    reason: str = Field(default="", max_length=255)
    restart_count: int = 0
    # wire: JobReport.time_limit_s (None: no limit, or the scheduler does not say).
    time_limit_s: float | None = None
    # wire: JobReport.replicas_movable (its connector can choose which replicas leave a
    # node: the plan may move them, app/shaping/snapshot.py).
    replicas_movable: bool = False
    # wire: JobReport.speeds (a block job's own speed per GPU model; empty: its models').
    speeds: dict[str, float] = json_column(dict)
    # Fencing token: bumped by every saga that moves the job (migrate, preempt); node
    # agents refuse steps that carry an older one, so the job never runs twice.
    generation: int = 0
    # Set when a Shaper action left the job without GPUs against the plan (a move whose
    # target and source were both lost): it is back in its scheduler's queue with its
    # checkpoint, and the next plan places it first. Cleared when it runs again.
    displaced_at: datetime | None = utc_column()
    displaced_reason: str | None = Field(default=None, max_length=1024)
    updated_at: datetime = required_utc_column()


# GET /jobs's default order (``-priority,submit_time`` then id): with it a page of 100 is
# read from the index's head instead of sorting every job per request (issue 13).
sa.Index(
    "ix_jobs_priority_submit_time_id",
    Job.__table__.c.priority.desc(),  # type: ignore[attr-defined]
    Job.__table__.c.submit_time,  # type: ignore[attr-defined]
    Job.__table__.c.id,  # type: ignore[attr-defined]
)


class Allocation(SQLModel, table=True):
    """GPUs of one node held by one job over a time interval (open while ``released_at`` is
    null). Closed rows are the placement history that utilization summaries are made of."""

    __tablename__ = "allocations"
    __table_args__ = (sa.Index("ix_allocations_open", "released_at", "started_at"),)

    id: int | None = Field(default=None, primary_key=True)
    job_id: int = Field(
        sa_column=sa.Column(
            sa.Integer, sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False, index=True
        )
    )
    node_id: int = Field(
        sa_column=sa.Column(
            sa.Integer, sa.ForeignKey("nodes.id", ondelete="CASCADE"), nullable=False, index=True
        )
    )
    gpu_indices: list[int] = json_column(list)
    gpu_count: int = 0
    started_at: datetime = required_utc_column()
    released_at: datetime | None = utc_column()
