"""Set-based writes for telemetry ingest.

PostgreSQL gets ``COPY`` (an order of magnitude faster than multi-row INSERT for tens of
thousands of rows) and ``UPDATE … FROM`` a temporary table; every other backend gets an
``executemany`` through SQLAlchemy. Both run inside the caller's transaction.

Rows come either as dicts (``insert_rows``/``update_rows``) or, for the hot paths, as
tuples in the order of a column list (``insert_tuples``/``update_tuples``): those go to
psycopg's C row writer as they are, with no per-row work in Python. In tuples, JSON columns
hold the document already serialised (``json_text``), which is what binary COPY sends.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlmodel import Session

from app.core.db import UtcDateTime

_COPY_UPDATE_THRESHOLD = 200  # below this, executemany is as fast and simpler


def _pg_type(column: sa.Column[Any]) -> str:
    """The PostgreSQL type name COPY BINARY must be told for ``column``."""
    kind = column.type
    if isinstance(kind, sa.JSON):
        # Sent pre-serialised: binary COPY input of json is its UTF-8 text, same as text's.
        return "text"
    if isinstance(kind, sa.BigInteger):
        return "int8"
    if isinstance(kind, sa.Integer):
        return "int4"
    if isinstance(kind, sa.Boolean):
        return "bool"
    if isinstance(kind, sa.Float):
        return "float8"
    if isinstance(kind, (sa.DateTime, UtcDateTime)):
        return "timestamptz"
    return "text"


def json_text(value: Any) -> str | None:
    """A JSON column's value as the compact text tuples carry (``None`` stays SQL NULL)."""
    if value is None:
        return None
    if not value:  # the common empty list or dict, without a json.dumps call
        return "[]" if isinstance(value, list) else "{}"
    return json.dumps(value, separators=(",", ":"))


def _json_indexes(table: sa.Table, columns: Sequence[str]) -> list[int]:
    return [i for i, c in enumerate(columns) if isinstance(table.c[c].type, sa.JSON)]


def _copy_tuples(
    session: Session,
    table_name: str,
    table: sa.Table,
    columns: Sequence[str],
    rows: Iterable[Sequence[Any]],
) -> int:
    """COPY … FROM STDIN in binary format, with the column types given up front so psycopg's
    C row formatter does the work (no per-value type lookup in Python). Rows are sent as
    they come: fed by a generator, the server indexes the first ones while the generator
    makes the rest."""
    types = [_pg_type(table.c[c]) for c in columns]
    raw = session.connection().connection.driver_connection
    assert raw is not None
    statement = f"COPY {table_name} ({', '.join(columns)}) FROM STDIN (FORMAT BINARY)"
    count = 0
    with raw.cursor() as cursor, cursor.copy(statement) as copy:
        copy.set_types(types)
        write_row = copy.write_row
        for row in rows:
            write_row(row)
            count += 1
    return count


def _as_dicts(
    table: sa.Table, columns: Sequence[str], rows: Iterable[Sequence[Any]]
) -> list[dict[str, Any]]:
    """Tuples → dicts for SQLAlchemy, JSON text decoded again (its JSON type encodes)."""
    json_indexes = _json_indexes(table, columns)
    out = []
    for row in rows:
        values = dict(zip(columns, row, strict=True))
        for i in json_indexes:
            text = row[i]
            values[columns[i]] = None if text is None else json.loads(text)
        out.append(values)
    return out


def insert_tuples(
    session: Session, table: sa.Table, columns: Sequence[str], rows: Iterable[Sequence[Any]]
) -> int:
    """Insert ``rows``, each a tuple of ``columns``' values (JSON columns as ``json_text``);
    returns how many. ``rows`` may be a generator: on PostgreSQL it is consumed while the
    COPY runs, so it must not use the session meanwhile."""
    iterator = iter(rows)
    first = next(iterator, None)
    if first is None:
        return 0  # no COPY round trip for nothing
    rest = itertools.chain((first,), iterator)
    if session.connection().dialect.name == "postgresql":
        return _copy_tuples(session, table.name, table, columns, rest)
    values = _as_dicts(table, columns, rest)
    session.execute(table.insert(), values)
    return len(values)


def update_tuples(
    session: Session, table: sa.Table, columns: Sequence[str], rows: Sequence[Sequence[Any]]
) -> int:
    """Update rows by ``id``: ``columns[0]`` is ``id``, each row a tuple of ``columns``'
    values (JSON columns as ``json_text``)."""
    if not rows:
        return 0
    if columns[0] != "id":
        raise ValueError("update_tuples needs id as the first column")
    assigned = list(columns[1:])
    connection = session.connection()
    if connection.dialect.name == "postgresql" and len(rows) >= _COPY_UPDATE_THRESHOLD:
        staging = f"_stage_{table.name}"
        connection.exec_driver_sql(
            f"CREATE TEMP TABLE {staging} AS SELECT id, {', '.join(assigned)} "
            f"FROM {table.name} WITH NO DATA"
        )
        try:
            _copy_tuples(session, staging, table, columns, rows)
            assignments = ", ".join(f"{c} = s.{c}" for c in assigned)
            connection.exec_driver_sql(
                f"UPDATE {table.name} AS t SET {assignments} FROM {staging} AS s WHERE t.id = s.id"
            )
        finally:
            connection.exec_driver_sql(f"DROP TABLE {staging}")
        return len(rows)
    return _update_dicts(session, table, assigned, _as_dicts(table, columns, rows))


def _update_dicts(
    session: Session, table: sa.Table, assigned: Sequence[str], rows: Sequence[dict[str, Any]]
) -> int:
    statement = (
        table.update()
        .where(table.c.id == sa.bindparam("_id"))
        .values({c: sa.bindparam(c) for c in assigned})
    )
    session.execute(statement, [{**{c: r[c] for c in assigned}, "_id": r["id"]} for r in rows])
    return len(rows)


def _to_tuples(
    table: sa.Table, columns: Sequence[str], rows: Sequence[dict[str, Any]]
) -> list[tuple[Any, ...]]:
    json_indexes = _json_indexes(table, columns)
    out = []
    for row in rows:
        values = [row[c] for c in columns]
        for i in json_indexes:
            values[i] = json_text(values[i])
        out.append(tuple(values))
    return out


def insert_rows(session: Session, table: sa.Table, rows: Sequence[dict[str, Any]]) -> int:
    """Insert ``rows``, dicts that all have the same keys."""
    if not rows:
        return 0
    if session.connection().dialect.name != "postgresql":
        # No COPY: SQLAlchemy takes the dicts as they are (its JSON type encodes).
        session.execute(table.insert(), list(rows))
        return len(rows)
    columns = list(rows[0])
    return insert_tuples(session, table, columns, _to_tuples(table, columns, rows))


def update_rows(session: Session, table: sa.Table, rows: Sequence[dict[str, Any]]) -> int:
    """Update rows by ``id``; every row dict has the same keys, ``id`` among them."""
    if not rows:
        return 0
    columns = ["id", *(c for c in rows[0] if c != "id")]
    copies = session.connection().dialect.name == "postgresql"
    if not copies or len(rows) < _COPY_UPDATE_THRESHOLD:
        return _update_dicts(session, table, columns[1:], rows)
    return update_tuples(session, table, columns, _to_tuples(table, columns, rows))
