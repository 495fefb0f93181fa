"""Periodic roll-up and retention work. Thin: own session, the logic in fold and
retention."""

from __future__ import annotations

from datetime import timedelta

from sqlmodel import Session

from app.core.clock import SystemClock
from app.core.config import get_settings
from app.core.db import get_engine
from app.core.task import task
from app.utilization import fold, retention


# Idempotent: a delta is folded once (deleted in the statement that adds it), and a
# second folder waits for nothing (it finds the lock taken and returns).
@task(name="app.utilization.tasks.fold_rollup_deltas", time_limit=300)
def fold_rollup_deltas() -> int:
    with Session(get_engine()) as session:
        return fold.fold_deltas(session=session)


# Idempotent: deleting what is already gone deletes nothing, and a compacted period of
# the roll-up has nothing left to compact.
@task(name="app.utilization.tasks.prune_samples", time_limit=900)
def prune_samples() -> int:
    cutoff = SystemClock().now() - timedelta(days=get_settings().sample_retention_days)
    with Session(get_engine()) as session:
        deleted = retention.prune_samples(session=session, now=cutoff, older_than=timedelta(0))
        retention.compact_rollups(
            session=session, before=cutoff, after=cutoff - retention.COMPACT_LOOKBACK
        )
        return deleted
