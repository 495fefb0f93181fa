from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from app.core.types import enum_column, json_column, required_utc_column
from wire.telemetry import NodeState


class NodePublic(SQLModel):
    id: int
    cluster: str
    name: str
    gpu_model: str | None
    gpu_count: int
    gpus_allocated: int
    cpu_cores: int
    memory_mib: int
    labels: dict[str, str]
    state: NodeState
    updated_at: datetime


class Node(SQLModel, table=True):
    __tablename__ = "nodes"
    __table_args__ = (sa.UniqueConstraint("cluster_id", "name", name="uq_nodes_cluster_name"),)

    id: int | None = Field(default=None, primary_key=True)
    cluster_id: int = Field(
        sa_column=sa.Column(
            sa.Integer, sa.ForeignKey("clusters.id", ondelete="CASCADE"), nullable=False
        )
    )
    name: str = Field(max_length=255)
    gpu_model_id: int | None = Field(default=None, foreign_key="gpu_models.id")
    gpu_count: int = 0
    cpu_cores: int = 0
    memory_mib: int = Field(default=0, sa_type=sa.BigInteger)
    labels: dict[str, str] = json_column(dict)
    state: NodeState = enum_column(NodeState.up, 16)
    updated_at: datetime = required_utc_column()
