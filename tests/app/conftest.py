"""Fixtures of the API and embedded-default tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine
from sqlmodel import Session

from app.core import migrate
from app.core.db import make_engine
from app.gpu_models import service as gpu_model_service


@pytest.fixture(params=["sqlite", "postgres"])
def committed_engine(
    request: pytest.FixtureRequest, tmp_path: Path, make_postgres_database: Any
) -> Iterator[Engine]:
    """A committed database (the saga tasks open their own sessions)."""
    if request.param == "sqlite":
        yield from _committed(f"sqlite:///{tmp_path / 'shaper.db'}")
    else:
        yield from _committed(_postgres_url(tmp_path, make_postgres_database))


@pytest.fixture
def committed_postgres_engine(tmp_path: Path, make_postgres_database: Any) -> Iterator[Engine]:
    """A committed PostgreSQL database, for what only it can show (row locks)."""
    yield from _committed(_postgres_url(tmp_path, make_postgres_database))


def _postgres_url(tmp_path: Path, make_postgres_database: Any) -> str:
    return str(make_postgres_database(f"plans_{tmp_path.name[-12:].replace('-', '_')}"))


def _committed(url: str) -> Iterator[Engine]:
    migrate.upgrade(url)
    engine = make_engine(url)
    with Session(engine) as session:
        gpu_model_service.ensure_default_catalogue(session=session)
        session.commit()
    yield engine
    engine.dispose()
