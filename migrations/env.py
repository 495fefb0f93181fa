"""Alembic environment: the URL comes from Settings (or the caller), the metadata from
``app.models``. Migrations are reviewed by hand; ``compare_type`` catches type drift."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context

from app.core.config import get_settings
from app.core.db import make_engine
from app.models import metadata
from migrations.render import render_item

config = context.config


def _url() -> str:
    return config.get_main_option("sqlalchemy.url") or get_settings().resolved_database_url


def run_migrations_offline() -> None:
    context.configure(
        url=_url(),
        target_metadata=metadata,
        literal_binds=True,
        compare_type=True,
        render_item=render_item,
        render_as_batch=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = make_engine(_url(), poolclass=sa.pool.NullPool)
    with engine.connect() as connection:
        _run(connection)


def _run(connection: sa.Connection) -> None:
    # render_as_batch: SQLite cannot ALTER most things; batch mode recreates tables there.
    context.configure(
        connection=connection,
        target_metadata=metadata,
        compare_type=True,
        render_item=render_item,
        render_as_batch=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
