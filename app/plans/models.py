from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from app.core.types import json_column, required_utc_column


class PlanPublic(SQLModel):
    id: int
    cluster: str | None
    created_at: datetime
    policy: str
    engine: str
    mode: str
    status: str
    objective: float | None
    best_bound: float | None
    gap: float | None
    wall_time_s: float
    decisions: list[dict[str, Any]]
    summary: dict[str, Any]


class Plan(SQLModel, table=True):
    """One solve of the shaping cycle, with a reason for every decision it made."""

    __tablename__ = "plans"

    id: int | None = Field(default=None, primary_key=True)
    cluster_id: int | None = Field(
        default=None,
        sa_column=sa.Column(
            sa.Integer, sa.ForeignKey("clusters.id", ondelete="CASCADE"), index=True
        ),
    )
    created_at: datetime = required_utc_column(index=True)
    policy: str = Field(max_length=32)
    engine: str = Field(max_length=32)
    mode: str = Field(max_length=16)
    status: str = Field(max_length=32)
    objective: float | None = None
    best_bound: float | None = None
    gap: float | None = None
    wall_time_s: float = 0.0
    decisions: list[dict[str, Any]] = json_column(list)
    summary: dict[str, Any] = json_column(dict)
