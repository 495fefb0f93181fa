from __future__ import annotations

import re
from datetime import datetime
from enum import StrEnum
from typing import Annotated

import sqlalchemy as sa
from pydantic import AfterValidator
from sqlmodel import Field, SQLModel

from app.core.types import enum_column, json_column, required_utc_column, utc_column
from wire.telemetry import SchedulerKind

CLUSTER_NAME_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}$"

# Labels follow Kubernetes' syntax, so a cluster's can be copied from its nodes' or a
# federation tool's and an operator reads them the same way: a key is ``[prefix/]name``,
# the prefix a DNS subdomain, name and value at most 63 characters (a value may be empty).
MAX_LABELS = 32
_LABEL_NAME = re.compile(r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_LABEL_PREFIX = re.compile(r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*")
_LABEL_VALUE = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
MAX_LABEL_PREFIX = 253


def _label_key_error(key: str) -> str | None:
    prefix, slash, name = key.rpartition("/")
    if slash and not (len(prefix) <= MAX_LABEL_PREFIX and _LABEL_PREFIX.fullmatch(prefix)):
        return f"key {key!r}: its prefix must be a DNS subdomain of at most 253 characters"
    if not _LABEL_NAME.fullmatch(name):
        return (
            f"key {key!r}: its name must be 1-63 characters of a-z, 0-9, '-', '_', '.', "
            "beginning and ending with a-z or 0-9"
        )
    return None


def check_labels(labels: dict[str, str]) -> dict[str, str]:
    """Refuses the whole map at its first bad entry, naming it (pydantic reports the field:
    ``labels``, ``spec.teams[0].cluster_selector``)."""
    if len(labels) > MAX_LABELS:
        raise ValueError(f"at most {MAX_LABELS} labels, not {len(labels)}")
    for key, value in labels.items():
        error = _label_key_error(key)
        if error is not None:
            raise ValueError(error)
        if not _LABEL_VALUE.fullmatch(value):
            raise ValueError(
                f"value {value!r} of {key!r}: must be empty or 1-63 characters of A-Z, a-z, "
                "0-9, '-', '_', '.', beginning and ending with a letter or digit"
            )
    return labels


Labels = Annotated[dict[str, str], AfterValidator(check_labels)]


def labels_match(labels: dict[str, str], selector: dict[str, str]) -> bool:
    """Whether ``labels`` include every key=value of ``selector`` (an empty one: any)."""
    return all(labels.get(key) == value for key, value in selector.items())


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
