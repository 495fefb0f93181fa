"""Column helpers shared by every table, and the bounded types every API input uses.

Columns: aware UTC times, JSON, bounded strings.

Inputs: a value the API accepts must be one both databases can store, or the request
fails deep inside a driver as a 500 (SQLite raises ``OverflowError`` past 2^63 - 1,
PostgreSQL refuses ``integer`` values past 2^31 - 1 and text containing NUL). So every
integer, string, list and mapping that comes in is bounded here, once, with pydantic's
own constraints, and a value outside them is a 422 naming its field on either backend:

- ``DbId``: a row id (every id column is PostgreSQL ``integer``), 1 … 2^31 - 1;
- ``Count``/``Offset``: non-negative integers that fit ``integer`` too;
- ``GpuCount``/``Seconds``: domain quantities, bounded far below what the solver's int64
  arithmetic could overflow on (CP-SAT multiplies them by weights and horizons);
- ``NoNulStr``: a string without NUL; its length is bounded where it is used
  (``Field(max_length=…)``, as for the column);
- ``AwareDatetime``: pydantic's; naive times are refused (``UtcDateTime`` would raise
  inside the flush otherwise).
"""

from __future__ import annotations

from typing import Annotated, Any

import sqlalchemy as sa
from annotated_types import Ge, Le
from pydantic import AfterValidator, AwareDatetime
from sqlmodel import Field

from app.core.db import UtcDateTime

INT32_MAX = 2**31 - 1  # PostgreSQL `integer`: every id and count column
MAX_GPUS = 1_000_000  # more than any site; keeps GPU arithmetic far from int64 limits
MAX_SECONDS = 10 * 365 * 86400  # ten years: any wait, deadline offset or window
MAX_TEAMS = 1_000  # per SLA policy (and as many services)
MAX_REPLICAS = 100_000

DbId = Annotated[int, Ge(1), Le(INT32_MAX)]
Count = Annotated[int, Ge(0), Le(INT32_MAX)]
Offset = Annotated[int, Ge(0), Le(INT32_MAX)]
GpuCount = Annotated[int, Ge(0), Le(MAX_GPUS)]
Seconds = Annotated[int, Ge(0), Le(MAX_SECONDS)]
Replicas = Annotated[int, Ge(0), Le(MAX_REPLICAS)]

__all__ = [
    "INT32_MAX",
    "AwareDatetime",
    "Count",
    "DbId",
    "GpuCount",
    "Offset",
    "Replicas",
    "Seconds",
    "NoNulStr",
    "no_nul",
]


def no_nul(value: str) -> str:
    """PostgreSQL cannot store NUL in text; SQLite could, so refuse it on both alike."""
    if "\x00" in value:
        raise ValueError("must not contain NUL (\\u0000) characters")
    return value


NoNulStr = Annotated[str, AfterValidator(no_nul)]


def utc_column(*, nullable: bool = True, index: bool = False) -> Any:
    return Field(default=None, sa_column=sa.Column(UtcDateTime(), nullable=nullable, index=index))


def required_utc_column(*, index: bool = False) -> Any:
    return Field(sa_column=sa.Column(UtcDateTime(), nullable=False, index=index))


def json_column(default_factory: Any = dict) -> Any:
    return Field(default_factory=default_factory, sa_column=sa.Column(sa.JSON(), nullable=False))


def enum_column(default: Any, length: int = 32, index: bool = False) -> Any:
    return Field(default=default, sa_type=sa.String(length), max_length=length, index=index)
