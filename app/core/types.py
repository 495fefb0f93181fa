"""Column helpers shared by every table: aware UTC times, JSON, bounded strings."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlmodel import Field

from app.core.db import UtcDateTime


def utc_column(*, nullable: bool = True, index: bool = False) -> Any:
    return Field(default=None, sa_column=sa.Column(UtcDateTime(), nullable=nullable, index=index))


def required_utc_column(*, index: bool = False) -> Any:
    return Field(sa_column=sa.Column(UtcDateTime(), nullable=False, index=index))


def json_column(default_factory: Any = dict) -> Any:
    return Field(default_factory=default_factory, sa_column=sa.Column(sa.JSON(), nullable=False))


def enum_column(default: Any, length: int = 32, index: bool = False) -> Any:
    return Field(default=default, sa_type=sa.String(length), max_length=length, index=index)
