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
