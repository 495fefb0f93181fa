from __future__ import annotations

from datetime import datetime
from enum import StrEnum

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from app.core.types import enum_column, json_column, required_utc_column, utc_column

# Label syntax is wire's: a job's residency (wire.residency) selects clusters by them.
from wire.residency import CLUSTER_NAME_PATTERN as CLUSTER_NAME_PATTERN
from wire.residency import Labels as Labels
from wire.telemetry import SchedulerKind


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
    # Where it is ({"region": "eu-west", "site": "ams1"}): a team's ``cluster_selector``
    # (its SLA policy) keeps its jobs to the clusters of its federation group that match.
    labels: Labels = Field(default_factory=dict)


class ClusterCreate(ClusterBase):
    pass


class ClusterUpdate(SQLModel):
    description: str | None = Field(default=None, max_length=1024)
    mode: ShapingMode | None = None
    policy: str | None = Field(default=None, max_length=32)
    labels: Labels | None = Field(default=None, description="replaces the whole map")


class ClusterPublic(ClusterBase):
    id: int
    connector_status: ConnectorStatus
    last_seq: int | None
    last_seen_at: datetime | None
    created_at: datetime
    node_count: int = 0
    gpu_count: int = 0
    federation_group: str | None = None


class Cluster(ClusterBase, table=True):
    __tablename__ = "clusters"

    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(max_length=63, unique=True)
    # The federation group it is planned with (app/federation); None: planned alone.
    # No ON DELETE rule: deleting a group clears its members first (app.federation.service),
    # and SQLite cannot report such a rule on a column added in place (the migration's).
    federation_group_id: int | None = Field(
        default=None,
        sa_column=sa.Column(sa.Integer, sa.ForeignKey("federation_groups.id"), index=True),
    )
    # The server default gives rows written before labels existed an empty map.
    labels: dict[str, str] = Field(
        default_factory=dict,
        sa_column=sa.Column(sa.JSON(), nullable=False, server_default="{}"),
    )
    connector_status: ConnectorStatus = enum_column(ConnectorStatus.never_seen, 16)
    # The live connector session (app/telemetry/fencing.py) and when its first snapshot
    # was accepted. ``last_seq`` is ``bigint`` on PostgreSQL; SQLite's INTEGER is 64-bit.
    connector_session: str | None = Field(default=None, max_length=64)
    connector_session_since: datetime | None = utc_column()
    last_seq: int | None = Field(
        default=None, sa_column=sa.Column(sa.BigInteger().with_variant(sa.Integer(), "sqlite"))
    )
    # Sequence numbers the live sessions skipped (pushes that never landed: a snapshot
    # accepted with seq > last_seq + 1 counts the gap), summed over the cluster's life.
    seq_gaps: int = Field(
        default=0,
        sa_column=sa.Column(
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            nullable=False,
            server_default="0",
        ),
    )
    # [[seq, digest], …]: the live session's last accepted pushes, to tell replays apart.
    recent_pushes: list[list[int | str]] = json_column(list)
    # [{"session", "since", "superseded_at", "last_seq"}, …]: sessions that lost the cluster.
    superseded_sessions: list[dict[str, str | int | None]] = json_column(list)
    last_seen_at: datetime | None = utc_column()
    created_at: datetime = required_utc_column()
