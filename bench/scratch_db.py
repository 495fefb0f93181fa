"""A throw-away PostgreSQL database for one benchmark run, migrated to head."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

from app.core import migrate

DEFAULT_DSN = os.environ.get(
    "SHAPER_TEST_POSTGRES_DSN", "host=127.0.0.1 port=5432 user=postgres dbname=postgres"
)


@contextmanager
def scratch_database(dsn: str, name: str) -> Iterator[str]:
    """Create database ``name`` (PID-suffixed), migrate it, yield its URL, drop it."""
    dbname = f"{name}_{os.getpid()}"
    params = dict(p.split("=", 1) for p in dsn.split())
    url = (
        f"postgresql+psycopg://{params.get('user', 'postgres')}@{params.get('host', '127.0.0.1')}"
        f":{params.get('port', '5432')}/{dbname}"
    )
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{dbname}"')
    try:
        migrate.upgrade(url)
        yield url
    finally:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
