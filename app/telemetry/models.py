from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from app.core.types import enum_column, required_utc_column
from wire.telemetry import Metric


class TelemetrySample(SQLModel, table=True):
    """One measurement: a node's (or one GPU's) utilization or memory, or a service's demand."""

    __tablename__ = "telemetry_samples"
    __table_args__ = (sa.Index("ix_telemetry_samples_cluster_at", "cluster_id", "at"),)

    id: int | None = Field(default=None, primary_key=True)
    cluster_id: int = Field(
        sa_column=sa.Column(
            sa.Integer, sa.ForeignKey("clusters.id", ondelete="CASCADE"), nullable=False
        )
    )
    at: datetime = required_utc_column()
    metric: Metric = enum_column(Metric.gpu_util, 32)
    value: float
    node_id: int | None = Field(
        default=None,
        sa_column=sa.Column(sa.Integer, sa.ForeignKey("nodes.id", ondelete="CASCADE")),
    )
    gpu_index: int | None = None
    job_id: int | None = Field(
        default=None,
        sa_column=sa.Column(sa.Integer, sa.ForeignKey("jobs.id", ondelete="CASCADE")),
    )


# A node-wide sample (no ``gpu_index``) in ``GpuLatestSample``: part of the primary key,
# so not NULL (NULLs are distinct in a unique key, and an upsert would never meet them).
NODE_WIDE = -1


class GpuLatestSample(SQLModel, table=True):
    """The newest ``gpu_util`` and ``gpu_mem_used_gib`` sample of each GPU of a node (or of
    the node as a whole: ``gpu_index`` ``NODE_WIDE``), kept by the writers of samples in
    their own transaction (``app.telemetry.latest``), so that the cluster map reads one row
    per GPU and metric instead of every sample of its window. Newest by ``at``: a sample
    that arrives late, older than the row, leaves it as it is; one with the same ``at``
    replaces it (the later written, as the map's read of the samples ordered them).

    A row goes with its node or cluster (foreign keys); a node marked ``down`` keeps its
    rows, as it keeps its samples: the map's window hides them once they are old."""

    __tablename__ = "gpu_latest_samples"
    # SQLite: the rows stored in primary-key order, so a cluster's are one range.
    __table_args__ = {"sqlite_with_rowid": False}

    cluster_id: int = Field(
        sa_column=sa.Column(
            sa.Integer, sa.ForeignKey("clusters.id", ondelete="CASCADE"), primary_key=True
        )
    )
    node_id: int = Field(
        sa_column=sa.Column(
            sa.Integer, sa.ForeignKey("nodes.id", ondelete="CASCADE"), primary_key=True
        )
    )
    metric: Metric = Field(primary_key=True, sa_type=sa.String(32), max_length=32)
    gpu_index: int = Field(primary_key=True)
    at: datetime = required_utc_column()
    value: float
