from __future__ import annotations

from datetime import datetime
from enum import StrEnum

import sqlalchemy as sa
from pydantic import BaseModel
from sqlmodel import Field, SQLModel


class GroupBy(StrEnum):
    cluster = "cluster"
    gpu_model = "gpu_model"
    team = "team"


class UtilizationPoint(BaseModel):
    start: datetime
    allocated_gpus: float  # mean GPUs allocated over the bucket
    allocated_share: float  # allocated_gpus / capacity_gpus
    measured_util: float | None  # mean GPU busy fraction from telemetry samples


class UtilizationSeries(BaseModel):
    key: str
    capacity_gpus: int
    points: list[UtilizationPoint]


class UtilizationSummary(BaseModel):
    group_by: GroupBy
    bucket_s: int
    since: datetime
    until: datetime
    series: list[UtilizationSeries]


class UtilizationRollup(SQLModel, table=True):
    """Sums of allocation events and ``gpu_util`` samples per group and time period,
    written by database triggers (see the migration that creates it) and read by
    ``app.utilization.rollup``.

    A group is (``dimension``, cluster, key): ``gpu_model_id`` is the key of the
    ``gpu_model`` dimension (0: none), ``team`` that of ``team``; both are 0/'' otherwise.
    A period is ``period_us`` long and starts at ``period_start_us`` (µs since the epoch, a
    multiple of its length); ``period_us`` 1 is the exact instant of the events, 0 the
    period of all time. An allocation is two events: +GPUs when it starts, -GPUs when it
    is released. ``gpu_us`` is Σ GPUs × (event time - period start), in µs."""

    __tablename__ = "utilization_rollups"
    __table_args__ = (
        sa.Index("ix_utilization_rollups_period", "dimension", "period_us", "period_start_us"),
    )

    dimension: str = Field(primary_key=True, max_length=16)
    cluster_id: int = Field(
        sa_column=sa.Column(
            sa.Integer,
            sa.ForeignKey("clusters.id", ondelete="CASCADE"),
            primary_key=True,
        )
    )
    gpu_model_id: int = Field(primary_key=True)
    team: str = Field(primary_key=True, max_length=128)
    period_us: int = Field(sa_column=sa.Column(sa.BigInteger, primary_key=True))
    period_start_us: int = Field(sa_column=sa.Column(sa.BigInteger, primary_key=True))
    gpus: int = Field(sa_column=sa.Column(sa.BigInteger, nullable=False))
    gpu_us: int = Field(sa_column=sa.Column(sa.BigInteger, nullable=False))
    opened: int = Field(sa_column=sa.Column(sa.BigInteger, nullable=False))
    closed: int = Field(sa_column=sa.Column(sa.BigInteger, nullable=False))
    samples: int = Field(sa_column=sa.Column(sa.BigInteger, nullable=False))
    sample_sum: float


class UtilizationRollupDelta(SQLModel, table=True):
    """What PostgreSQL's triggers add to ``utilization_rollups``, not folded in yet: one row
    per group and event instant (``at_us``, µs since the epoch) of one writer's statement,
    appended, never updated. ``app.utilization.fold`` moves them into the roll-up's periods;
    ``app.utilization.rollup`` reads both, so answers are exact whether or not they are
    folded. SQLite's triggers upsert the roll-up itself (it has one writer at a time), so
    this table stays empty there.

    Why appended rows and not upserts in the writer's transaction: concurrent writers of
    one cluster (its connector's ingest, sagas, node agents) would each lock the cluster's
    all-time and current-period rows until commit, in orders no trigger can fix across the
    statements of a transaction, and deadlocked (``tests/app/test_utilization_writers.py``).
    No foreign key either: a trigger's row needs none (rows of a deleted cluster are never
    read and the fold drops them), and checking one took a key-share lock on the cluster's
    row in every writer's statements (when the ingest locked that row FOR UPDATE, a writer
    holding a job row the ingest wanted next waited for it: a deadlock).

    ``node_id``: on a ``gpu_model`` row written for a node's events, that node; the row's
    group is the node's GPU model when folded or read (``gpu_model_id`` is the model when
    written, used if the node is gone), so a write that raced a model change lands under
    the new model (see the migration ``0a1b2c3d4e5f``). None on every other row."""

    __tablename__ = "utilization_rollup_deltas"

    # BIGINT on PostgreSQL: appended at every write and never reused. SQLite's INTEGER
    # primary key is its 64-bit rowid (a BIGINT one would not be filled in).
    id: int | None = Field(
        default=None,
        sa_column=sa.Column(sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True),
    )
    dimension: str = Field(max_length=16)
    cluster_id: int
    node_id: int | None = None
    gpu_model_id: int
    team: str = Field(max_length=128)
    at_us: int = Field(sa_column=sa.Column(sa.BigInteger, nullable=False))
    gpus: int = Field(sa_column=sa.Column(sa.BigInteger, nullable=False))
    opened: int = Field(sa_column=sa.Column(sa.BigInteger, nullable=False))
    closed: int = Field(sa_column=sa.Column(sa.BigInteger, nullable=False))
    samples: int = Field(sa_column=sa.Column(sa.BigInteger, nullable=False))
    sample_sum: float
