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


class MapNode(SQLModel):
    """One node of the cluster map, its GPUs as lists by GPU index (a list per figure
    rather than an object per GPU: 8,000 GPUs are one small reply, quick to encode)."""

    name: str
    gpu_model: str | None
    # The model's memory per GPU (the catalogue's), for "used of total"; None: no model.
    gpu_memory_gib: float | None
    state: NodeState
    # The job holding each GPU, as its place in ClusterMap.jobs; None: free.
    holders: list[int | None]
    # The latest gpu_util (0..1) and gpu_mem_used_gib of each GPU within the map's window:
    # the GPU's own sample or, where the node reports only an average, its node's; None:
    # not measured.
    util: list[float | None]
    mem_used_gib: list[float | None]


class MapJob(SQLModel):
    id: int
    external_id: str
    team: str
    sla_class: str


class MapCells(SQLModel):
    """GPUs of one node a planned move leaves or takes. ``exact``: the plan (or the
    scheduler) named these GPUs; otherwise the node's first free ones stand for the count."""

    node: str
    gpus: int
    gpu_indices: list[int]
    exact: bool


class PlannedMove(SQLModel):
    action_id: int
    kind: str
    state: str
    job: str | None
    job_id: int | None
    # A federated move's destination cluster (its target cells are not on this map).
    target_cluster: str | None
    source: list[MapCells]
    target: list[MapCells]


class MapPlan(SQLModel):
    id: int
    state: str
    created_at: datetime


class ClusterMap(SQLModel):
    """GET /nodes/map: every node of one cluster with its GPUs, who holds each and what was
    measured on it, and the moves of the cluster's latest open plan — one read per view."""

    cluster: str
    measured_since: datetime
    nodes: list[MapNode]
    jobs: list[MapJob]
    plan: MapPlan | None
    moves: list[PlannedMove]
