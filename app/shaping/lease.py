"""One shaping cycle at a time across every replica of the control plane.

PostgreSQL: a session-level advisory lock, taken with ``pg_try_advisory_lock`` (never
waits) and released at the end of the cycle. If the leader dies, its connection closes,
PostgreSQL drops the lock, and the next replica's beat tick (one period later) takes it.
SQLite (the embedded default) serves one process, which runs one cycle at a time.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa
from sqlmodel import Session

SHAPING_LOCK_KEY = 0x5348_4150  # "SHAP"


@contextmanager
def shaping_lease(session: Session) -> Iterator[bool]:
    """Yields whether this process holds the lease; do nothing when it does not."""
    if session.get_bind().dialect.name != "postgresql":
        yield True  # and no transaction: on SQLite it would hold the write lock all cycle
        return
    connection = session.connection()
    held = bool(
        connection.execute(sa.select(sa.func.pg_try_advisory_lock(SHAPING_LOCK_KEY))).scalar()
    )
    try:
        yield held
    finally:
        if held:
            connection.execute(sa.select(sa.func.pg_advisory_unlock(SHAPING_LOCK_KEY)))
