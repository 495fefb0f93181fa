from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from sqlmodel import Field, SQLModel

from app.core.types import enum_column, required_utc_column, utc_column
from connectors.base import SchedulerKind

CLUSTER_NAME_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}$"


class ShapingMode(StrEnum):
    observe = "observe"  # plan only (what-if)
    advise = "advise"  # actions wait for an operator's approval
    enforce = "enforce"  # actions are dispatched at once


class ConnectorStatus(StrEnum):
    never_seen = "never_seen"
    connected = "connected"
    stale = "stale"


class ClusterBase(SQLModel):
    name: str = Field(max_length=63, schema_extra={"pattern": CLUSTER_NAME_PATTERN})
    scheduler: SchedulerKind = enum_column(SchedulerKind.sim, 16)
    description: str = Field(default="", max_length=1024)
    mode: ShapingMode = enum_column(ShapingMode.observe, 16)
    policy: str = Field(default="shaper", max_length=32)


class ClusterCreate(ClusterBase):
    pass


class ClusterUpdate(SQLModel):
    description: str | None = Field(default=None, max_length=1024)
    mode: ShapingMode | None = None
    policy: str | None = Field(default=None, max_length=32)


class ClusterPublic(ClusterBase):
    id: int
    connector_status: ConnectorStatus
    last_seq: int | None
    last_seen_at: datetime | None
    created_at: datetime
    node_count: int = 0
    gpu_count: int = 0


class Cluster(ClusterBase, table=True):
    __tablename__ = "clusters"

    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(max_length=63, unique=True)
    connector_status: ConnectorStatus = enum_column(ConnectorStatus.never_seen, 16)
    connector_session: str | None = Field(default=None, max_length=64)
    last_seq: int | None = None
    last_seen_at: datetime | None = utc_column()
    created_at: datetime = required_utc_column()
