"""What the shaping cycle forecast, kept to be scored against what happened.

``ServiceForecast``: one row per elastic service, forecast hour and lead time — every
hour of the solver's look-ahead (``app.shaping.snapshot.FORECAST_STEPS``): the cycle that
runs in hour H forecasts hours H+1 … H+5, its steps 1 … 5, and ``lead_h`` is the step
(the forecast hour starts ``lead_h`` hours after the start of the hour it was made in).
Written once per hour, by the first cycle ``app.forecasts.service.RECORD_DELAY`` into
it, so each hour is forecast five times, at five lead times. ``actual`` is the hour's
observed mean demand, filled in (with ``scored_at``) once the hour is over.

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
        sa.UniqueConstraint(
            "job_id", "target_hour", "lead_h", name="uq_service_forecasts_job_hour_lead"
        ),
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
    # The solver's step: hours from the start of the hour it was made in to target_hour.
    lead_h: int = Field(
        default=1, sa_column=sa.Column(sa.Integer(), nullable=False, server_default="1")
    )
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
    """A cycle's forecast of a service's demand in ``target_hour`` (replicas), made
    ``lead_h`` hours ahead (the solver's step)."""

    job_id: int
    target_hour: datetime
    mean: float
    upper: float
    quantile: float
    method: Method
    naive: float
    lead_h: int = 1


@dataclass(frozen=True)
class RuntimePredictionCreate:
    """A cycle's prediction of a block job's run time, and the naive one (seconds)."""

    job_id: int
    predicted_s: float
    naive_s: float


class ServiceAccuracy(BaseModel):
    """One service's next-hour forecasts (lead 1 h) over the window's scored hours. Errors
    are in replicas; ``skill`` is 1 − MAE / naive MAE (> 0: the model beats
    seasonal-naive)."""

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


class LeadAccuracy(BaseModel):
    """The forecasts made ``lead_h`` hours ahead, over the window's scored hours: one
    service's, or (``service`` None) every service of the cluster's pooled, each
    forecast hour weighing the same. Figures as in ``ServiceAccuracy``."""

    cluster: str
    service: str | None
    lead_h: int
    hours_scored: int
    mae_replicas: float
    naive_mae_replicas: float
    skill: float | None
    bias_replicas: float
    coverage: float
    target_quantile: float


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
    # Each service's forecasts by lead time (1 h … the solver's look-ahead): how the error
    # grows the further ahead the solver looks.
    by_lead: list[LeadAccuracy]
    durations: list[DurationAccuracy]
