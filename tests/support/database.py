"""A session on a test database inside a transaction that is rolled back at the end,
the application's commits turned into SAVEPOINT releases (the ``session`` fixture,
tests/conftest.py, and tests that attach an app to the engine themselves)."""

from __future__ import annotations

from collections.abc import Iterator

from sqlalchemy import Engine
from sqlmodel import Session

from app.gpu_models import service as gpu_model_service


def session_in_rollback(engine: Engine) -> Iterator[Session]:
    connection = engine.connect()
    transaction = connection.begin()
    session = Session(
        bind=connection, join_transaction_mode="create_savepoint", expire_on_commit=False
    )
    gpu_model_service.ensure_default_catalogue(session=session)
    try:
        yield session
    finally:
        session.close()
        transaction.rollback()
        connection.close()
