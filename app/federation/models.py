"""A federation group: clusters planned as one, so pending work can go where GPUs are free.

A cluster belongs to at most one group (``clusters.federation_group_id``); a group's link
figures price what crossing between its clusters costs (``solver.MigrationCostModel``'s
inter-cluster terms): a job's image crosses at ``inter_cluster_bandwidth_mib_per_s`` after
``inter_cluster_overhead_s`` (submitting it to the other scheduler), and, where the sites'
provider bills data that leaves, each GiB costs ``inter_cluster_egress_gpu_s_per_gib``
GPU-seconds of work (egress price per GiB ÷ GPU-hour price × 3600; 0: free).
"""

from __future__ import annotations

from datetime import datetime

from sqlmodel import Field, SQLModel

from app.clusters.models import CLUSTER_NAME_PATTERN
from app.core.types import required_utc_column

GROUP_NAME_PATTERN = CLUSTER_NAME_PATTERN


class FederationGroupBase(SQLModel):
    name: str = Field(max_length=63, schema_extra={"pattern": GROUP_NAME_PATTERN})
    description: str = Field(default="", max_length=1024)
    inter_cluster_bandwidth_mib_per_s: float = Field(default=100.0, gt=0, le=1_000_000)
    inter_cluster_overhead_s: float = Field(default=120.0, ge=0, le=86_400)
    inter_cluster_egress_gpu_s_per_gib: float = Field(default=0.0, ge=0, le=86_400)


class FederationGroupCreate(FederationGroupBase):
    pass


class FederationGroupUpdate(SQLModel):
    description: str | None = Field(default=None, max_length=1024)
    inter_cluster_bandwidth_mib_per_s: float | None = Field(default=None, gt=0, le=1_000_000)
    inter_cluster_overhead_s: float | None = Field(default=None, ge=0, le=86_400)
    inter_cluster_egress_gpu_s_per_gib: float | None = Field(default=None, ge=0, le=86_400)


class FederationGroupPublic(FederationGroupBase):
    id: int
    created_at: datetime
    clusters: list[str] = []


class FederationGroup(FederationGroupBase, table=True):
    __tablename__ = "federation_groups"

    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(max_length=63, unique=True)
    created_at: datetime = required_utc_column()
