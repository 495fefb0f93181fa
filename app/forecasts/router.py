from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from app.api.deps import ClockDep, SessionDep, scoped
from app.api.responses import ErrorBody
from app.forecasts import service
from app.forecasts.models import ForecastAccuracy

router = APIRouter(prefix="/forecast-accuracy", tags=["forecasts"])


@router.get(
    "",
    responses={404: {"description": "No cluster of that name", "model": ErrorBody}},
    **scoped("viewer"),
)
def forecast_accuracy(
    session: SessionDep,
    clock: ClockDep,
    cluster: Annotated[str | None, Query(min_length=1, max_length=255)] = None,
    window_h: Annotated[int, Query(ge=1, le=service.MAX_WINDOW_H)] = 24,
) -> ForecastAccuracy:
    """How good the shaping cycle's live forecasts were over the last ``window_h`` hours:
    per service, the next-hour demand forecast's error, bias and coverage of the SLA
    quantile against seasonal-naive, and (``by_lead``) the same for each lead time the
    solver's look-ahead forecasts (1 h … 5 h); per cluster, block-job run-time predictions
    against the team's median (default: every cluster, the last 24 h; at most 30 days)."""
    return service.accuracy(session=session, now=clock.now(), window_h=window_h, cluster=cluster)
