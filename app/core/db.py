"""Engine, sessions and the column types every table shares.

SQLite transactions: a reader never takes the write lock; a writer takes it up front.
pysqlite opens transactions lazily and breaks SAVEPOINT, so the engine emits BEGIN itself
(the ``begin`` event), choosing the mode from the connection's ``shaper_sqlite_begin``
execution option:

* ``IMMEDIATE`` (the default): the write lock is taken at BEGIN, waiting up to
  ``busy_timeout`` for it. A transaction that reads and then writes (every ingest, every
  saga step, the cycle's write phases) needs it: begun DEFERRED, its first write would
  have to upgrade a read snapshot to a writer, and SQLite refuses an upgrade at once with
  SQLITE_BUSY whenever another connection writes meanwhile, without waiting. So anything
  that does not say otherwise, every Celery task and CLI command included, stays safe.
* ``DEFERRED``: a plain BEGIN, for transactions that only read: in WAL mode they read a
  snapshot and neither wait for the writer nor hold it up. ``begin(session, writes=False)``
  starts a session's next transaction so; the API does it for every GET, HEAD and OPTIONS
  (``app.api.deps``) and the shaping cycle for its read phases (``app.shaping.cycle``).

A busy database (the lock not free within ``busy_timeout``) raises SQLITE_BUSY, which
``app.core.db_errors`` answers 503 retryable with ``Retry-After``. PostgreSQL ignores the
option: its readers never block its writers.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from functools import lru_cache, partial
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy import Connection, DateTime, Engine, event
from sqlalchemy.engine import Dialect
from sqlalchemy.sql.expression import Executable
from sqlalchemy.types import TypeDecorator
from sqlmodel import Session, SQLModel, create_engine

from app.core.config import get_settings

BEGIN_OPTION = "shaper_sqlite_begin"
# How long a SQLite writer waits for the write lock before SQLITE_BUSY (503, retryable).
SQLITE_BUSY_TIMEOUT_MS = 30_000

# Named constraints make migrations reviewable and reversible on every backend.
SQLModel.metadata.naming_convention = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class UtcDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend.

    SQLite keeps no offset, so values are stored as naive UTC there and made aware again
    on load; PostgreSQL keeps ``timestamptz``. Naive datetimes are refused on the way in.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: Shaper stores only aware UTC times")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


# 19 digits in a row: an integer orjson may read as a float (past 64 bits), or not.
_LONG_DIGITS = re.compile(r"[0-9]{19}")
_LONG_DIGIT_BYTES = re.compile(rb"[0-9]{19}")


def load_json(data: str | bytes) -> Any:
    """JSON columns as read: ``orjson`` (a fifth of the CPU of ``json.loads`` on the short
    lists a page of jobs holds: a quarter of GET /jobs' query time went to it, issue 13),
    and ``json.loads`` for what orjson refuses and json takes (NaN, lone surrogates) or
    reads otherwise (integers past 64 bits, which orjson makes floats), so every value
    reads as before (``tests/app/test_json_columns.py``)."""
    if isinstance(data, str):
        long_digits = _LONG_DIGITS.search(data) is not None
    else:
        long_digits = _LONG_DIGIT_BYTES.search(data) is not None
    if not long_digits:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    return json.loads(data)


def plain_rows(session: Session, statement: Executable) -> list[dict[str, Any]]:
    """``statement``'s rows as dicts of its columns' labels, read on the session's
    connection (in its transaction) without the ORM's result handling: for reads of plain
    columns that are only published, where ``Result.mappings()`` took twice as long as the
    query (issue 13)."""
    result = session.connection().execute(statement)
    keys = list(result.keys())
    # all(): one fetch of every row (iterating fetches them one by one).
    return [dict(zip(keys, row, strict=True)) for row in result.all()]


def make_engine(
    url: str, *, sqlite_busy_timeout_ms: int = SQLITE_BUSY_TIMEOUT_MS, **kwargs: Any
) -> Engine:
    # A failed statement's message would otherwise quote its parameters (token digests,
    # whatever a request sent) into tracebacks and logs.
    kwargs.setdefault("hide_parameters", True)
    kwargs.setdefault("json_deserializer", load_json)
    if url.startswith("sqlite"):
        path = url.removeprefix("sqlite:///")
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False}, **kwargs)
        event.listen(engine, "connect", partial(_sqlite_pragmas, sqlite_busy_timeout_ms))
        event.listen(engine, "begin", _sqlite_begin)
        return engine
    return create_engine(url, pool_pre_ping=True, **kwargs)


def _sqlite_pragmas(busy_timeout_ms: int, dbapi_connection: Any, _record: Any) -> None:
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
    cursor.close()


def _sqlite_begin(connection: Connection) -> None:
    mode = connection.get_execution_options().get(BEGIN_OPTION, "IMMEDIATE")
    connection.exec_driver_sql("BEGIN" if mode == "DEFERRED" else "BEGIN IMMEDIATE")


def begin(session: Session, *, writes: bool) -> None:
    """Start ``session``'s next transaction, taking SQLite's write lock at once when it
    ``writes`` (IMMEDIATE) or not at all when it only reads (DEFERRED). A transaction in
    progress is left as it is: its mode was chosen when it began. A session bound to a
    connection that is already in a transaction (the tests' SAVEPOINT per test) runs in
    its owner's transaction, whatever the mode."""
    if session.in_transaction():
        return
    session.connection(execution_options={BEGIN_OPTION: "IMMEDIATE" if writes else "DEFERRED"})


def begin_lazily(session: Session, *, writes: bool) -> None:
    """What ``begin`` does, without taking a connection now: the session's next transaction
    begins in the mode ``writes`` asks for when its first statement runs, in the thread
    that runs it. A request's session dependency uses it: taking the connection there, in
    a thread of its own, let a worker with more requests than pooled connections stall
    (every thread of the pool waiting for a connection, every connection held by a request
    waiting for a thread to run its route) until the pool's timeout answered 503
    (issue 13's mixed-load bench). A session already in a transaction, or bound to a
    connection (the tests' SAVEPOINT per test), is left as it is."""
    if session.in_transaction():
        return
    bind = session.bind
    if isinstance(bind, Engine):
        session.bind = _with_begin_mode(bind, "IMMEDIATE" if writes else "DEFERRED")


def _with_begin_mode(engine: Engine, mode: str) -> Engine:
    """``engine`` whose connections begin in ``mode`` (same pool): made once per engine
    and mode, kept beside it, as every request asks for one."""
    modes: dict[str, Engine] = engine.__dict__.setdefault("_shaper_begin_modes", {})
    if mode not in modes:
        modes[mode] = engine.execution_options(**{BEGIN_OPTION: mode})
    return modes[mode]


@lru_cache
def get_engine() -> Engine:
    return make_engine(get_settings().resolved_database_url)


def get_session() -> Iterator[Session]:
    with Session(get_engine(), expire_on_commit=False) as session:
        yield session
