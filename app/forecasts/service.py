"""The shaping cycle's forecasts, recorded, scored against what happened, and summarised.

Recording (``due`` then ``record``, from the cycle: ``app.shaping.cycle``): each service's
forecast of every hour of the solver's look-ahead (lead 1 h … 5 h) once per hour, from
the first cycle ``RECORD_DELAY`` into the hour — later cycles of the hour find the next
hour's row and write nothing (within an hour the hourly series, and so the forecast, does
not change) — and each block job's run time the first time a cycle predicts it. ``due``
is one indexed read per cycle; ``record`` one short write transaction, only when
something is missing.

Scoring: the same transaction that records an hour's forecasts fills in the observed
mean demand of every recorded hour that has ended (``actual``; left empty when the
service reported no demand that hour), ``RECORD_DELAY`` after its end so that the
hour's last samples have arrived. A run time is scored when its job finishes: the job's
own start and end say how long it ran. Every recording transaction drops what is older
than ``RETENTION`` (but the prediction of a job still running, which would otherwise be
made anew): storage stays at about 3,600 rows per service (720 hours × 5 leads) and one
per recent job.

Summary (``accuracy``: the API, the CLI, the metrics): per service, mean absolute error
of the next-hour forecast's mean and of the naive forecast, bias, and coverage (the share
of hours whose demand stayed at or under the forecast quantile) against the quantile
asked for; the same figures by lead time, per service (``by_lead``) and pooled over a
cluster's services (``accuracy_by_lead``: the metrics, whose labels stay clusters ×
leads); per cluster, the run-time predictions' errors against the naive ones.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel import Session, col, select

from app.clusters import service as cluster_service
from app.clusters.models import Cluster
from app.core.errors import Invalid
from app.core.lookup import row_id
from app.forecasts.models import (
    DurationAccuracy,
    ForecastAccuracy,
    LeadAccuracy,
    RuntimePrediction,
    RuntimePredictionCreate,
    ServiceAccuracy,
    ServiceForecast,
    ServiceForecastCreate,
)
from app.jobs.models import Job
from app.telemetry import service as telemetry_service
from forecast.duration import MAPE_FLOOR_S
from wire.telemetry import TERMINAL_JOB_STATES, JobShape, JobState

HOUR = timedelta(hours=1)
# The lead of the next hour's forecast: the one the per-service summary and ``due`` read.
NEXT_HOUR_LEAD = 1
# How far into an hour its next hour's forecasts are recorded and the hours that have
# ended are scored: the ended hour's last samples have been pushed by then.
RECORD_DELAY = timedelta(minutes=5)
# Recorded hours left unscored longer than this (the cycle was not running) stay so.
SCORE_LOOKBACK = timedelta(days=2)
RETENTION = timedelta(days=30)
MAX_WINDOW_H = 30 * 24  # what is kept
ROUND = 6
EXACT = 1e-9  # a naive error this small is none: skill, a ratio to it, is not given


def hour_of(moment: datetime) -> datetime:
    return moment.replace(minute=0, second=0, microsecond=0)


@dataclass(frozen=True)
class Due:
    """What a cycle has to record: services without a forecast for the next hour (none
    before ``RECORD_DELAY`` into the hour) and block jobs without a prediction."""

    services: frozenset[int] = field(default_factory=frozenset)
    jobs: frozenset[int] = field(default_factory=frozenset)

    def __bool__(self) -> bool:
        return bool(self.services or self.jobs)


def due(
    *,
    session: Session,
    cluster_id: int,
    services: Sequence[int],
    jobs: Sequence[int],
    now: datetime,
) -> Due:
    """Read only: the caller's transaction, none written."""
    missing_services: set[int] = set()
    hour = hour_of(now)
    if services and now >= hour + RECORD_DELAY:
        recorded = session.exec(
            select(ServiceForecast.job_id).where(
                ServiceForecast.cluster_id == cluster_id,
                ServiceForecast.target_hour == hour + HOUR,
                # Every lead of an hour is written in one transaction: the next hour's
                # stands for them all.
                ServiceForecast.lead_h == NEXT_HOUR_LEAD,
            )
        )
        missing_services = set(services) - set(recorded)
    missing_jobs: set[int] = set()
    if jobs:
        predicted = session.exec(
            select(RuntimePrediction.job_id).where(col(RuntimePrediction.job_id).in_(list(jobs)))
        )
        missing_jobs = set(jobs) - set(predicted)
    return Due(frozenset(missing_services), frozenset(missing_jobs))


def record(
    *,
    session: Session,
    cluster_id: int,
    now: datetime,
    forecasts: Sequence[ServiceForecastCreate],
    predictions: Sequence[RuntimePredictionCreate],
) -> None:
    """Insert what is not there yet (a row a racing writer put in first stands), score the
    hours that have ended and prune, then commit: all or nothing. The caller has begun the
    write transaction."""
    _insert_new(
        session,
        ServiceForecast,
        [
            {
                "cluster_id": cluster_id,
                "job_id": f.job_id,
                "target_hour": f.target_hour,
                "lead_h": f.lead_h,
                "made_at": now,
                "method": f.method.value,
                "quantile": f.quantile,
                "mean": f.mean,
                "upper": f.upper,
                "naive": f.naive,
            }
            for f in forecasts
        ],
        ["job_id", "target_hour", "lead_h"],
    )
    _insert_new(
        session,
        RuntimePrediction,
        [
            {
                "cluster_id": cluster_id,
                "job_id": p.job_id,
                "predicted_at": now,
                "predicted_s": p.predicted_s,
                "naive_s": p.naive_s,
            }
            for p in predictions
        ],
        ["job_id"],
    )
    if forecasts:  # once an hour: the hours that ended since
        score(session=session, cluster_id=cluster_id, now=now)
    _prune(session, cluster_id, now)  # two indexed deletes that find nothing most times
    session.commit()


def _insert_new(
    session: Session, table: type[Any], rows: list[dict[str, Any]], unique: list[str]
) -> None:
    if not rows:
        return
    dialect = postgresql if session.connection().dialect.name == "postgresql" else sqlite
    statement = dialect.insert(table.__table__).values(rows)
    session.execute(statement.on_conflict_do_nothing(index_elements=unique))


def score(*, session: Session, cluster_id: int, now: datetime) -> int:
    """Fill in the observed mean demand of the cluster's recorded hours that ended at least
    ``RECORD_DELAY`` ago (in the caller's transaction); returns how many were scored."""
    if now < hour_of(now) + RECORD_DELAY:
        return 0
    ended_before = hour_of(now)
    rows = session.exec(
        select(ServiceForecast).where(
            ServiceForecast.cluster_id == cluster_id,
            col(ServiceForecast.scored_at).is_(None),
            col(ServiceForecast.target_hour) >= ended_before - SCORE_LOOKBACK,
            col(ServiceForecast.target_hour) <= ended_before - HOUR,
        )
    ).all()
    if not rows:
        return 0
    means = telemetry_service.hourly_demand(
        session=session,
        job_ids=sorted({r.job_id for r in rows}),
        since=min(r.target_hour for r in rows),
        until=ended_before,
    )
    observed = {(job_id, at): mean for job_id, hours in means.items() for at, mean in hours}
    for row in rows:
        row.actual = observed.get((row.job_id, row.target_hour))
        row.scored_at = now
        session.add(row)
    return len(rows)


def _prune(session: Session, cluster_id: int, now: datetime) -> None:
    cutoff = now - RETENTION
    session.execute(
        sa.delete(ServiceForecast).where(
            col(ServiceForecast.cluster_id) == cluster_id,
            col(ServiceForecast.target_hour) < cutoff,
        )
    )
    # A job still running keeps its prediction: dropped, it would be predicted anew.
    live = sa.select(col(Job.id)).where(
        col(Job.cluster_id) == cluster_id,
        col(Job.state).not_in([s.value for s in TERMINAL_JOB_STATES]),
    )
    session.execute(
        sa.delete(RuntimePrediction).where(
            col(RuntimePrediction.cluster_id) == cluster_id,
            col(RuntimePrediction.predicted_at) < cutoff,
            col(RuntimePrediction.job_id).not_in(live),
        )
    )


# -- the summary -----------------------------------------------------------------------


def accuracy(
    *, session: Session, now: datetime, window_h: int, cluster: str | None = None
) -> ForecastAccuracy:
    """Scores of the forecasts whose hour ended, and of the run-time predictions of the
    jobs that finished, in the last ``window_h`` hours (of every cluster, or of one)."""
    since, _ = _window(now, window_h)
    cluster_id = (
        row_id(cluster_service.get_cluster(session=session, name=cluster))
        if cluster is not None
        else None
    )
    names = _cluster_names(session)
    by_lead = _by_lead(session, names, cluster_id, since, now, per_service=True)
    return ForecastAccuracy(
        since=since,
        until=now,
        window_h=window_h,
        services=_services(session, names, by_lead, cluster_id, since, now),
        by_lead=by_lead,
        durations=_durations(session, names, cluster_id, since, now),
    )


def accuracy_by_lead(*, session: Session, now: datetime, window_h: int) -> list[LeadAccuracy]:
    """Every cluster's service forecasts of the last ``window_h`` hours by lead time, its
    services pooled (``service`` None)."""
    since, until = _window(now, window_h)
    return _by_lead(session, _cluster_names(session), None, since, until, per_service=False)


def _window(now: datetime, window_h: int) -> tuple[datetime, datetime]:
    if not 1 <= window_h <= MAX_WINDOW_H:
        raise Invalid(
            f"window_h is {window_h}; from 1 to {MAX_WINDOW_H} (what is kept)", field="window_h"
        )
    return now - timedelta(hours=window_h), now


def _cluster_names(session: Session) -> dict[int, str]:
    clusters = session.execute(sa.select(col(Cluster.id), col(Cluster.name))).tuples()
    return dict(clusters.all())


def _scored(cluster_id: int | None, since: datetime, until: datetime) -> list[Any]:
    """Forecasts of the hours that ended in [since, until) and were scored."""
    scored = [
        col(ServiceForecast.actual).is_not(None),
        col(ServiceForecast.target_hour) >= since,
        col(ServiceForecast.target_hour) <= until - HOUR,
    ]
    if cluster_id is not None:
        scored.append(col(ServiceForecast.cluster_id) == cluster_id)
    return scored


def _error_stats() -> list[Any]:
    """Per group: hours, MAE, naive MAE, bias, coverage, mean quantile."""
    actual = col(ServiceForecast.actual)
    covered = sa.case((actual <= col(ServiceForecast.upper), 1), else_=0)
    return [
        sa.func.count(),
        sa.func.avg(sa.func.abs(col(ServiceForecast.mean) - actual)),
        sa.func.avg(sa.func.abs(col(ServiceForecast.naive) - actual)),
        sa.func.avg(col(ServiceForecast.mean) - actual),
        sa.func.avg(covered),
        sa.func.avg(col(ServiceForecast.quantile)),
    ]


def _skill(mae: float, naive_mae: float) -> float | None:
    return round(1 - mae / naive_mae, ROUND) if naive_mae > EXACT else None


def _by_lead(
    session: Session,
    names: dict[int, str],
    cluster_id: int | None,
    since: datetime,
    until: datetime,
    *,
    per_service: bool,
) -> list[LeadAccuracy]:
    cluster, lead = col(ServiceForecast.cluster_id), col(ServiceForecast.lead_h)
    if per_service:
        query = (
            sa.select(cluster, col(Job.external_id), lead, *_error_stats())
            .join(Job, col(Job.id) == col(ServiceForecast.job_id))
            .group_by(cluster, col(Job.external_id), lead)
        )
    else:
        query = sa.select(cluster, sa.null(), lead, *_error_stats()).group_by(cluster, lead)
    rows = session.execute(query.where(*_scored(cluster_id, since, until))).all()
    found = [
        LeadAccuracy(
            cluster=names.get(cid, str(cid)),
            service=service,
            lead_h=int(lead_h),
            hours_scored=int(hours),
            mae_replicas=round(float(mae), ROUND),
            naive_mae_replicas=round(float(naive_mae), ROUND),
            skill=_skill(float(mae), float(naive_mae)),
            bias_replicas=round(float(bias), ROUND),
            coverage=round(float(coverage), ROUND),
            target_quantile=round(float(quantile), ROUND),
        )
        for cid, service, lead_h, hours, mae, naive_mae, bias, coverage, quantile in rows
    ]
    return sorted(found, key=lambda a: (a.cluster, a.service or "", a.lead_h))


def _services(
    session: Session,
    names: dict[int, str],
    by_lead: list[LeadAccuracy],
    cluster_id: int | None,
    since: datetime,
    until: datetime,
) -> list[ServiceAccuracy]:
    """Each service's next-hour figures: its lead-1 row of ``by_lead`` (one scan of the
    window serves both), with the hours by method."""
    group = (col(ServiceForecast.cluster_id), col(Job.external_id))
    methods: defaultdict[tuple[str, str], dict[str, int]] = defaultdict(dict)
    for cid, service, method, hours in session.execute(
        sa.select(*group, col(ServiceForecast.method), sa.func.count())
        .join(Job, col(Job.id) == col(ServiceForecast.job_id))
        .where(*_scored(cluster_id, since, until), col(ServiceForecast.lead_h) == NEXT_HOUR_LEAD)
        .group_by(*group, col(ServiceForecast.method))
    ):
        methods[(names.get(cid, str(cid)), service)][str(method)] = int(hours)
    return [
        ServiceAccuracy(
            cluster=lead.cluster,
            service=lead.service,
            hours_scored=lead.hours_scored,
            mae_replicas=lead.mae_replicas,
            naive_mae_replicas=lead.naive_mae_replicas,
            skill=lead.skill,
            bias_replicas=lead.bias_replicas,
            coverage=lead.coverage,
            target_quantile=lead.target_quantile,
            methods=methods[(lead.cluster, lead.service)],
        )
        for lead in by_lead
        if lead.lead_h == NEXT_HOUR_LEAD and lead.service is not None
    ]


def _durations(
    session: Session,
    names: dict[int, str],
    cluster_id: int | None,
    since: datetime,
    until: datetime,
) -> list[DurationAccuracy]:
    """Block jobs that finished (not failed or cancelled: their run time says nothing of
    how long the work takes, and the predictor learns only from finished jobs)."""
    query = (
        sa.select(
            col(RuntimePrediction.cluster_id),
            col(RuntimePrediction.predicted_s),
            col(RuntimePrediction.naive_s),
            col(Job.start_time),
            col(Job.end_time),
        )
        .join(Job, col(Job.id) == col(RuntimePrediction.job_id))
        .where(
            col(Job.state) == JobState.finished.value,
            col(Job.shape) == JobShape.block.value,
            col(Job.start_time).is_not(None),
            col(Job.end_time) >= since,
            col(Job.end_time) <= until,
        )
    )
    if cluster_id is not None:
        query = query.where(col(RuntimePrediction.cluster_id) == cluster_id)
    by_cluster: defaultdict[int, list[tuple[float, float, float]]] = defaultdict(list)
    for cid, predicted, naive, start, end in session.execute(query):
        actual = max(0.0, (end - start).total_seconds())
        by_cluster[cid].append((float(predicted), float(naive), actual))
    found = [_duration_summary(names.get(cid, str(cid)), jobs) for cid, jobs in by_cluster.items()]
    return sorted(found, key=lambda d: d.cluster)


def _duration_summary(cluster: str, jobs: list[tuple[float, float, float]]) -> DurationAccuracy:
    long_enough = [(p, n, a) for p, n, a in jobs if a >= MAPE_FLOOR_S]
    hours = 3600.0

    def median(values: list[float]) -> float | None:
        return round(statistics.median(values), ROUND) if values else None

    return DurationAccuracy(
        cluster=cluster,
        jobs_scored=len(jobs),
        mae_hours=round(statistics.fmean(abs(p - a) for p, _, a in jobs) / hours, ROUND),
        naive_mae_hours=round(statistics.fmean(abs(n - a) for _, n, a in jobs) / hours, ROUND),
        bias_hours=round(statistics.fmean(p - a for p, _, a in jobs) / hours, ROUND),
        median_abs_pct_error=median([abs(p - a) / a for p, _, a in long_enough]),
        naive_median_abs_pct_error=median([abs(n - a) / a for _, n, a in long_enough]),
        median_ratio=median([p / a for p, _, a in long_enough]),
    )
