from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import AwareDatetime

from app.api.deps import ClockDep, SessionDep, scoped
from app.utilization import service
from app.utilization.models import GroupBy, UtilizationSummary

router = APIRouter(prefix="/utilization", tags=["utilization"])


@router.get("", **scoped("viewer"))
def utilization(
    session: SessionDep,
    clock: ClockDep,
    group_by: GroupBy = GroupBy.cluster,
    cluster: str | None = None,
    since: AwareDatetime | None = None,
    until: AwareDatetime | None = None,
    bucket_s: Annotated[int, Query(ge=60, le=7 * 86400)] = 3600,
) -> UtilizationSummary:
    """Allocated GPU share and measured GPU busy per time bucket (default: the last 24 h)."""
    end: datetime = until or clock.now()
    start: datetime = since or end - timedelta(days=1)
    return service.summarize(
        session=session,
        since=start,
        until=end,
        bucket_s=bucket_s,
        group_by=group_by,
        cluster=cluster,
    )
