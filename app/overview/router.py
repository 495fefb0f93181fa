from __future__ import annotations

from datetime import timedelta
from typing import Annotated

from fastapi import APIRouter, Query

from app.api.deps import ClockDep, SessionDep, scoped
from app.core.gc_pause import paused_gc
from app.overview import service
from app.overview.models import FleetOverview
from solver.diagnosis.state import DEFAULT_BUSY_THRESHOLD

router = APIRouter(prefix="/overview", tags=["overview"])


@router.get("", **scoped("viewer"))
def overview(
    session: SessionDep,
    clock: ClockDep,
    busy_threshold: Annotated[float, Query(gt=0, le=1)] = DEFAULT_BUSY_THRESHOLD,
    recent_s: Annotated[int, Query(ge=60, le=86400)] = int(service.RECENT.total_seconds()),
) -> FleetOverview:
    """Per cluster and for the fleet, now: GPUs allocated, free, idle but allocated (busy
    under ``busy_threshold`` over the last ``recent_s`` seconds), pending jobs and the GPUs
    they ask for, and actions and plans awaiting an operator's approval."""
    # At 10,000 GPUs the read makes some 16,000 short-lived rows (busy means, allocations,
    # nodes), no cycles among them: the collector's passes they would set off walk the
    # whole heap (a full one 60-130 ms on a loaded machine, measured on the dashboard's
    # fresh load, where this read is what the cards wait for), as on the map's read.
    with paused_gc():
        return service.fleet_overview(
            session=session,
            now=clock.now(),
            busy_threshold=busy_threshold,
            recent=timedelta(seconds=recent_s),
        )
