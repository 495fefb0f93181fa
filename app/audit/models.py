"""The audit log: one row per change made through the API (who, what, when).

A row is written by the service that makes the change, in the same transaction
(``app.audit.service.record``): it exists exactly when the change does. Rows are never
updated or deleted by Shaper, and carry no foreign keys, so the record of a token, cluster
or plan outlives the thing itself. Telemetry pushes are not audited: they are the
connectors' high-volume stream, accounted for by the fencing columns of ``clusters``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from app.core.types import json_column, required_utc_column


@dataclass(frozen=True)
class Actor:
    """Who asks for a change: the API token (never its secret) and the request's id.

    ``token_id`` is None for a change made on the command line (``shaper token create``).
    """

    token_id: int | None
    name: str
    scopes: tuple[str, ...]
    request_id: str | None = None


class AuditRecordPublic(SQLModel):
    id: int
    at: datetime
    actor_token_id: int | None
    actor_name: str
    actor_scopes: list[str]
    action: str = Field(description="`<object type>.<verb>`, e.g. `plan.approve`")
    object_type: str
    object_id: str
    request_id: str | None
    changes: dict[str, Any] = Field(
        description="what changed: `{field: [before, after]}` for an update, the new "
        "object's fields for a creation, and whatever else the service knows cheaply"
    )


class AuditRecord(SQLModel, table=True):
    __tablename__ = "audit_log"
    __table_args__ = (sa.Index("ix_audit_log_object", "object_type", "object_id"),)

    id: int | None = Field(default=None, primary_key=True)
    at: datetime = required_utc_column(index=True)
    actor_token_id: int | None = Field(default=None, index=True)
    actor_name: str = Field(max_length=128, index=True)
    actor_scopes: list[str] = json_column(list)
    action: str = Field(max_length=64)
    object_type: str = Field(max_length=32)
    object_id: str = Field(max_length=255)
    request_id: str | None = Field(default=None, max_length=64)
    changes: dict[str, Any] = json_column(dict)
