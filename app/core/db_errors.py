"""Database failures that are not bugs, mapped to the error hierarchy.

``classify(exc)`` looks at the driver's own error code, never at message text:

- the database cannot take writes or connections for now (PostgreSQL: read-only
  transaction 25006 or a hot standby, disk full 53100, out of memory or connections
  53xxx, shutting down 57P0x, connection failures 08xxx, serialization or deadlock
  40001/40P01, lock not available 55P03; SQLite: READONLY, FULL, BUSY, LOCKED, IOERR,
  CANTOPEN) → ``Unavailable`` (503, retryable, ``Retry-After``);
- a value the database cannot store (PostgreSQL data exceptions 22xxx, and psycopg's
  refusal of NUL in text, which it raises before sending; the ``OverflowError`` that
  sqlite3 raises, unwrapped by SQLAlchemy, binding an integer past 2^63 - 1, and that
  Python raises wherever a number is too large for what it goes into) → ``Invalid``
  (422). The API's bounded types refuse these first and
  name the field; this is the net under inputs that are not typed that way yet.

Anything else is ``None``: a bug, answered 500 by ``app.core.unhandled``. Messages are
fixed strings: a driver's message can quote the values, secrets included.
"""

from __future__ import annotations

import sqlite3

import psycopg
from sqlalchemy import exc as sa_exc

from app.core.errors import Invalid, ShaperError, Unavailable

_PG_UNAVAILABLE_CLASSES = ("08", "53", "57")
_PG_UNAVAILABLE_CODES = {"25006", "40001", "40P01", "55P03"}
_SQLITE_UNAVAILABLE = ("SQLITE_READONLY", "SQLITE_FULL", "SQLITE_BUSY", "SQLITE_LOCKED")
_SQLITE_UNAVAILABLE_PREFIXES = ("SQLITE_IOERR", "SQLITE_CANTOPEN")


def classify(exc: BaseException) -> ShaperError | None:
    if isinstance(exc, sa_exc.TimeoutError):  # no pooled connection came free in time
        return Unavailable("the database has no free connection; retry shortly")
    if isinstance(exc, OverflowError):
        return _unstorable()
    if not isinstance(exc, sa_exc.StatementError):
        return None
    orig = exc.orig
    if isinstance(orig, OverflowError):
        return _unstorable()
    if isinstance(orig, psycopg.Error):
        return _classify_postgres(orig)
    if isinstance(orig, sqlite3.Error):
        return _classify_sqlite(orig)
    return None


def _classify_postgres(orig: psycopg.Error) -> ShaperError | None:
    state = orig.sqlstate or ""
    if state in _PG_UNAVAILABLE_CODES or state.startswith(_PG_UNAVAILABLE_CLASSES):
        return _unavailable(state)
    if state.startswith("22") or (not state and isinstance(orig, psycopg.DataError)):
        return _unstorable()
    if not state and isinstance(orig, psycopg.OperationalError):  # could not connect
        return _unavailable("connection")
    return None


def _classify_sqlite(orig: sqlite3.Error) -> ShaperError | None:
    name = getattr(orig, "sqlite_errorname", "")
    if name.startswith(_SQLITE_UNAVAILABLE) or name.startswith(_SQLITE_UNAVAILABLE_PREFIXES):
        return _unavailable(name)
    return None


def _unavailable(reason: str) -> Unavailable:
    if reason == "25006" or reason.startswith("SQLITE_READONLY"):
        message = "the database is read-only; retry once it takes writes again"
    elif reason in ("53100", "SQLITE_FULL"):
        message = "the database is out of space; retry once space is freed"
    else:
        message = "the database is unavailable for now; retry shortly"
    return Unavailable(message, details={"reason": reason})


def _unstorable() -> Invalid:
    return Invalid(
        "a value in this request cannot be stored: a number out of range or text "
        "containing NUL (\\u0000)"
    )
