"""Pagination and sorting shared by every list endpoint."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Generic, TypeVar

from pydantic import BaseModel
from sqlalchemy import ColumnElement, Select, func, select
from sqlmodel import Session

from app.core.errors import Invalid

T = TypeVar("T")
MAX_LIMIT = 1000
# Past any table's size and within every backend's integer (SQLite's LIMIT/OFFSET are
# signed 64-bit; larger values would be a 500, not the 422 that names ``offset``).
MAX_OFFSET = 2**31 - 1


class Page(BaseModel, Generic[T]):
    items: list[T]
    total: int
    limit: int
    offset: int


def order_by_clauses(
    sort: str | None, allowed: Mapping[str, ColumnElement[Any]], default: Sequence[str]
) -> list[ColumnElement[Any]]:
    """``"-priority,submit_time"`` → ORDER BY clauses; unknown fields name ``sort`` at fault."""
    fields = [f.strip() for f in sort.split(",") if f.strip()] if sort else list(default)
    clauses: list[ColumnElement[Any]] = []
    for field in fields:
        descending = field.startswith("-")
        name = field.lstrip("-+")
        if name not in allowed:
            raise Invalid(
                f"cannot sort by {name!r}; choose from {', '.join(sorted(allowed))}",
                field="sort",
            )
        column = allowed[name]
        clauses.append(column.desc() if descending else column.asc())
    return clauses


def count_rows(session: Session, query: Select[Any]) -> int:
    return int(session.execute(select(func.count()).select_from(query.subquery())).scalar_one())
