from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import AwareDatetime

from app.api.deps import ClockDep, SessionDep, scoped
from app.api.responses import ErrorBody
from app.diagnosis import service
from app.diagnosis.models import IdleDiagnosis
from solver.diagnosis.state import DEFAULT_BUSY_THRESHOLD

router = APIRouter(prefix="/diagnosis", tags=["diagnosis"])


@router.get(
    "",
    responses={404: {"description": "No cluster of that name", "model": ErrorBody}},
    **scoped("viewer"),
)
def diagnosis(
    session: SessionDep,
    clock: ClockDep,
    cluster: Annotated[str, Query(min_length=1, max_length=255)],
    since: AwareDatetime | None = None,
    until: AwareDatetime | None = None,
    busy_threshold: Annotated[float, Query(gt=0, le=1)] = DEFAULT_BUSY_THRESHOLD,
) -> IdleDiagnosis:
    """Why the cluster's GPUs were idle: GPU-hours per cause, by GPU model, team and hour
    (default: the last 24 h; at most 31 days)."""
    end: datetime = until or clock.now()
    start: datetime = since or end - timedelta(days=1)
    return service.diagnose(
        session=session, cluster=cluster, since=start, until=end, busy_threshold=busy_threshold
    )
