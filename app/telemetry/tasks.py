"""Periodic telemetry housekeeping. Thin: ids in, own session, the logic in service."""

from __future__ import annotations

from sqlmodel import Session

from app.core.clock import SystemClock
from app.core.db import get_engine
from app.core.task import task
from app.telemetry import service

# A connector that has not pushed for this long is shown as stale (it pushes every 30 s).
STALE_AFTER_S = 180


@task(name="app.telemetry.tasks.mark_stale_connectors", time_limit=60)
def mark_stale_connectors(stale_after_s: int = STALE_AFTER_S) -> int:
    # Idempotent (a pure function of last_seen_at), so running it twice is harmless.
    with Session(get_engine()) as session:
        return service.mark_stale_connectors(
            session=session, now=SystemClock().now(), stale_after_s=stale_after_s
        )
