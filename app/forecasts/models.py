"""What the shaping cycle forecast, kept to be scored against what happened.

``ServiceForecast``: one row per elastic service per hour it forecast — the hour after
the one the cycle ran in (the solver's step 1), written once, by the first cycle
``app.forecasts.service.RECORD_DELAY`` into the hour. ``actual`` is the hour's observed
mean demand, filled in (with ``scored_at``) once the hour is over.

``RuntimePrediction``: one row per block job, the run time predicted the first time a
cycle predicted it; the actual run time is the job's own (``end_time - start_time``)
once it has finished.

Both keep the naive forecast made at the same moment from the same history (the baseline
the model replaced), so an operator sees whether the model beats it live.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from pydantic import BaseModel
from sqlmodel import Field, SQLModel

from app.core.types import enum_column, required_utc_column, utc_column
from forecast.demand import Method


class ServiceForecast(SQLModel, table=True):
    __tablename__ = "service_forecasts"
    __table_args__ = (
        sa.UniqueConstraint("job_id", "target_hour", name="uq_service_forecasts_job_hour"),
        # Hour first: the summaries read a window of hours across clusters; the cycle asks
        # for one hour of one cluster.
        sa.Index("ix_service_forecasts_hour_cluster", "target_hour", "cluster_id"),
    )

    id: int | None = Field(default=None, primary_key=True)
    cluster_id: int = Field(
        sa_column=sa.Column(
            sa.Integer, sa.ForeignKey("clusters.id", ondelete="CASCADE"), nullable=False
        )
    )
    job_id: int = Field(
        sa_column=sa.Column(
            sa.Integer, sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False
        )
    )
    target_hour: datetime = required_utc_column()  # the forecast hour's start
    made_at: datetime = required_utc_column()
    method: Method = enum_column(Method.latest, 16)
    quantile: float
    mean: float  # replicas
    upper: float  # the quantile's value: what the solver reserves, before rounding up
    naive: float  # seasonal-naive (the latest value under a day of history)
    actual: float | None = None  # the hour's mean demand; None: no sample that hour
    scored_at: datetime | None = utc_column()


class RuntimePrediction(SQLModel, table=True):
    __tablename__ = "runtime_predictions"

    id: int | None = Field(default=None, primary_key=True)
    cluster_id: int = Field(
        sa_column=sa.Column(
            sa.Integer, sa.ForeignKey("clusters.id", ondelete="CASCADE"), nullable=False
        )
    )
    job_id: int = Field(
        sa_column=sa.Column(
            sa.Integer,
            sa.ForeignKey("jobs.id", ondelete="CASCADE"),
            nullable=False,
            unique=True,
        )
    )
    predicted_at: datetime = required_utc_column(index=True)
    predicted_s: float
    naive_s: float  # the median run time of the team's finished jobs (the cluster's)


@dataclass(frozen=True)
class ServiceForecastCreate:
    """A cycle's forecast of a service's demand in ``target_hour`` (replicas)."""

    job_id: int
    target_hour: datetime
    mean: float
    upper: float
    quantile: float
    method: Method
    naive: float


@dataclass(frozen=True)
class RuntimePredictionCreate:
    """A cycle's prediction of a block job's run time, and the naive one (seconds)."""

    job_id: int
    predicted_s: float
    naive_s: float


class ServiceAccuracy(BaseModel):
    """One service's next-hour forecasts over the window's scored hours. Errors are in
    replicas; ``skill`` is 1 − MAE / naive MAE (> 0: the model beats seasonal-naive)."""

    cluster: str
    service: str
    hours_scored: int
    mae_replicas: float
    naive_mae_replicas: float
    skill: float | None  # None: the naive forecast was exact every hour
    bias_replicas: float  # mean of forecast − actual: > 0 over-forecasts
    coverage: float  # share of hours whose demand was at most the upper forecast
    target_quantile: float  # what coverage should be (the SLA's demand target)
    methods: dict[str, int]  # hours scored by the method that made their forecast


class DurationAccuracy(BaseModel):
    """A cluster's block-job run-time predictions, for the jobs that finished in the
    window. Percentage errors leave out jobs shorter than a minute (instant failures)."""

    cluster: str
    jobs_scored: int
    mae_hours: float
    naive_mae_hours: float
    bias_hours: float  # mean of predicted − actual
    median_abs_pct_error: float | None  # a fraction: 0.25 is 25 %
    naive_median_abs_pct_error: float | None
    median_ratio: float | None  # predicted / actual


class ForecastAccuracy(BaseModel):
    since: datetime
    until: datetime
    window_h: int
    services: list[ServiceAccuracy]
    durations: list[DurationAccuracy]
