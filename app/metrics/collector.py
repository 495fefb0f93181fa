"""Metric families computed from the database when Prometheus scrapes.

Read at scrape time rather than kept as counters in the process, so every replica of the
API answers the same figures and a restart loses nothing. Each family is one aggregate
query; the cost is that of the dashboard's own summaries.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from datetime import datetime, timedelta

import sqlalchemy as sa
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from sqlmodel import Session

from app.actions.models import Action, ActionKind, ActionState
from app.clusters.models import Cluster
from app.diagnosis import service as diagnosis_service
from app.forecasts import service as forecast_service
from app.gpu_models.models import GpuModel
from app.jobs.models import Allocation, Job
from app.nodes.models import Node
from app.plans.models import Plan
from app.telemetry.models import TelemetrySample
from wire.telemetry import JobState, NodeState
from wire.telemetry import Metric as SampleMetric

# Core tables: typed columns for aggregate queries (the models' attributes are not).
ACTIONS = Action.__table__  # type: ignore[attr-defined]
ALLOCATIONS = Allocation.__table__  # type: ignore[attr-defined]
CLUSTERS = Cluster.__table__  # type: ignore[attr-defined]
JOBS = Job.__table__  # type: ignore[attr-defined]
MODELS = GpuModel.__table__  # type: ignore[attr-defined]
NODES = Node.__table__  # type: ignore[attr-defined]
PLANS = Plan.__table__  # type: ignore[attr-defined]
SAMPLES = TelemetrySample.__table__  # type: ignore[attr-defined]

# Measured busy is the mean of the agents' GPU samples over this window.
BUSY_WINDOW = timedelta(minutes=5)
# Idle GPU-hours by cause over this window (the diagnosis replays the window's history, so
# the window bounds a scrape's cost: tens of milliseconds for the demo's three clusters).
IDLE_WINDOW = timedelta(hours=1)
# Forecast accuracy over this window: a day of each service's next-hour forecasts.
FORECAST_WINDOW_H = 24
_OPEN_JOB_STATES = (JobState.pending, JobState.running, JobState.suspended)


class DatabaseCollector:
    """A prometheus_client collector over one session, for one scrape."""

    def __init__(self, session: Session, now: datetime) -> None:
        self.session = session
        self.now = now
        self._clusters: dict[int, str] = dict(
            session.execute(sa.select(CLUSTERS.c.id, CLUSTERS.c.name)).tuples().all()
        )

    def describe(self) -> list[Metric]:
        return []  # computed per scrape: nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        yield from self._gpus()
        yield self._busy()
        yield from self._jobs()
        yield from self._plans()
        yield self._actions()
        yield self._migrations()
        yield from self._telemetry()
        yield self._idle()
        yield from self._forecasts()
        yield from self._forecasts_by_lead()

    def _cluster(self, cluster_id: int) -> str:
        return self._clusters.get(cluster_id, str(cluster_id))

    def _gpus(self) -> Iterator[Metric]:
        gpus = GaugeMetricFamily(
            "shaper_gpus",
            "GPUs by state: allocated (held by jobs), free (up and unheld), unavailable "
            "(down, or unheld on a draining node)",
            labels=["cluster", "gpu_model", "state"],
        )
        team = GaugeMetricFamily(
            "shaper_team_gpus_allocated",
            "GPUs held by each team's jobs",
            labels=["cluster", "team"],
        )
        held: dict[int, int] = dict(
            self.session.execute(
                sa.select(ALLOCATIONS.c.node_id, sa.func.sum(ALLOCATIONS.c.gpu_count))
                .where(ALLOCATIONS.c.released_at.is_(None))
                .group_by(ALLOCATIONS.c.node_id)
            )
            .tuples()
            .all()
        )
        counts: dict[tuple[str, str, str], int] = defaultdict(int)
        rows = self.session.execute(
            sa.select(
                NODES.c.id, NODES.c.cluster_id, MODELS.c.name, NODES.c.gpu_count, NODES.c.state
            ).join(MODELS, MODELS.c.id == NODES.c.gpu_model_id)
        ).all()
        for node_id, cluster_id, model, size, state in rows:
            key = (self._cluster(cluster_id), model)
            allocated = min(int(held.get(node_id) or 0), size)
            rest = size - allocated
            counts[(*key, "allocated")] += allocated if state != NodeState.down else 0
            if state == NodeState.up:
                counts[(*key, "free")] += rest
            else:
                counts[(*key, "unavailable")] += rest if state == NodeState.draining else size
        for (cluster, model, state), value in sorted(counts.items()):
            gpus.add_metric([cluster, model, state], value)
        by_team = self.session.execute(
            sa.select(JOBS.c.cluster_id, JOBS.c.team, sa.func.sum(ALLOCATIONS.c.gpu_count))
            .join(ALLOCATIONS, ALLOCATIONS.c.job_id == JOBS.c.id)
            .where(ALLOCATIONS.c.released_at.is_(None))
            .group_by(JOBS.c.cluster_id, JOBS.c.team)
        ).all()
        for cluster_id, team_name, value in sorted(by_team, key=lambda r: (r[0], r[1])):
            team.add_metric([self._cluster(cluster_id), team_name], float(value or 0))
        yield gpus
        yield team

    def _busy(self) -> Metric:
        busy = GaugeMetricFamily(
            "shaper_gpu_busy_ratio",
            f"mean measured GPU utilization (node agents' samples, last "
            f"{int(BUSY_WINDOW.total_seconds())} s)",
            labels=["cluster", "gpu_model"],
        )
        rows = self.session.execute(
            sa.select(NODES.c.cluster_id, MODELS.c.name, sa.func.avg(SAMPLES.c.value))
            .join(NODES, NODES.c.id == SAMPLES.c.node_id)
            .join(MODELS, MODELS.c.id == NODES.c.gpu_model_id)
            .where(
                SAMPLES.c.metric == SampleMetric.gpu_util.value,
                SAMPLES.c.at >= self.now - BUSY_WINDOW,
            )
            .group_by(NODES.c.cluster_id, MODELS.c.name)
        ).all()
        for cluster_id, model, value in sorted(rows, key=lambda r: (r[0], r[1])):
            busy.add_metric([self._cluster(cluster_id), model], float(value))
        return busy

    def _jobs(self) -> Iterator[Metric]:
        jobs = GaugeMetricFamily(
            "shaper_jobs", "jobs not yet ended, by state", labels=["cluster", "state"]
        )
        queue = GaugeMetricFamily(
            "shaper_queue_jobs", "pending jobs by SLA class", labels=["cluster", "sla_class"]
        )
        wait = GaugeMetricFamily(
            "shaper_queue_wait_seconds_max",
            "how long the longest-waiting pending job of each SLA class has waited",
            labels=["cluster", "sla_class"],
        )
        states = self.session.execute(
            sa.select(JOBS.c.cluster_id, JOBS.c.state, sa.func.count())
            .where(JOBS.c.state.in_([s.value for s in _OPEN_JOB_STATES]))
            .group_by(JOBS.c.cluster_id, JOBS.c.state)
        ).all()
        for cluster_id, state, value in sorted(states, key=lambda r: (r[0], str(r[1]))):
            jobs.add_metric([self._cluster(cluster_id), str(JobState(state))], value)
        pending = self.session.execute(
            sa.select(
                JOBS.c.cluster_id,
                JOBS.c.sla_class,
                sa.func.count(),
                sa.func.min(JOBS.c.submit_time),
            )
            .where(JOBS.c.state == JobState.pending.value)
            .group_by(JOBS.c.cluster_id, JOBS.c.sla_class)
        ).all()
        for cluster_id, sla_class, count, oldest in sorted(pending, key=lambda r: (r[0], r[1])):
            labels = [self._cluster(cluster_id), sla_class]
            queue.add_metric(labels, count)
            if oldest is not None:
                waited = self.now - _aware(oldest, self.now)
                wait.add_metric(labels, max(waited.total_seconds(), 0.0))
        yield jobs
        yield queue
        yield wait

    def _plans(self) -> Iterator[Metric]:
        solve = GaugeMetricFamily(
            "shaper_plan_solve_seconds", "wall time of the latest plan's solve", labels=["cluster"]
        )
        gap = GaugeMetricFamily(
            "shaper_plan_gap",
            "relative gap between the latest plan and its bound (0 = proven optimal)",
            labels=["cluster"],
        )
        age = GaugeMetricFamily(
            "shaper_plan_age_seconds", "time since the latest plan was made", labels=["cluster"]
        )
        latest = (
            sa.select(sa.func.max(PLANS.c.id).label("plan_id"))
            .where(PLANS.c.cluster_id.is_not(None))
            .group_by(PLANS.c.cluster_id)
            .subquery()
        )
        rows = self.session.execute(
            sa.select(PLANS.c.cluster_id, PLANS.c.wall_time_s, PLANS.c.gap, PLANS.c.created_at)
            .join(latest, latest.c.plan_id == PLANS.c.id)
            .order_by(PLANS.c.cluster_id)
        ).all()
        for cluster_id, wall_time_s, plan_gap, created_at in rows:
            cluster = self._cluster(cluster_id)
            solve.add_metric([cluster], wall_time_s)
            if plan_gap is not None:
                gap.add_metric([cluster], plan_gap)
            age.add_metric(
                [cluster], max((self.now - _aware(created_at, self.now)).total_seconds(), 0.0)
            )
        yield solve
        yield gap
        yield age

    def _actions(self) -> Metric:
        actions = GaugeMetricFamily(
            "shaper_actions", "actions by kind and state", labels=["cluster", "kind", "state"]
        )
        rows = self.session.execute(
            sa.select(
                ACTIONS.c.cluster_id, ACTIONS.c.kind, ACTIONS.c.state, sa.func.count()
            ).group_by(ACTIONS.c.cluster_id, ACTIONS.c.kind, ACTIONS.c.state)
        ).all()
        for cluster_id, kind, state, value in sorted(rows, key=lambda r: (r[0], r[1], r[2])):
            labels = [self._cluster(cluster_id), str(ActionKind(kind)), str(ActionState(state))]
            actions.add_metric(labels, value)
        return actions

    def _migrations(self) -> Metric:
        durations = SummaryMetricFamily(
            "shaper_migration_duration_seconds",
            "succeeded migrations, from approval to the end of the saga",
            labels=["cluster"],
        )
        finished = self.session.execute(
            sa.select(ACTIONS.c.cluster_id, ACTIONS.c.decided_at, ACTIONS.c.finished_at).where(
                ACTIONS.c.kind == ActionKind.migrate.value,
                ACTIONS.c.state == ActionState.succeeded.value,
                ACTIONS.c.decided_at.is_not(None),
                ACTIONS.c.finished_at.is_not(None),
            )
        ).all()
        totals: dict[int, tuple[int, float]] = defaultdict(lambda: (0, 0.0))
        for cluster_id, decided, ended in finished:
            count, seconds = totals[cluster_id]
            took = _aware(ended, self.now) - _aware(decided, self.now)
            totals[cluster_id] = (count + 1, seconds + max(took.total_seconds(), 0.0))
        for cluster_id, (count, seconds) in sorted(totals.items()):
            durations.add_metric([self._cluster(cluster_id)], count, seconds)
        return durations

    def _telemetry(self) -> Iterator[Metric]:
        age = GaugeMetricFamily(
            "shaper_telemetry_age_seconds",
            "time since the cluster's connector last pushed telemetry that was accepted",
            labels=["cluster"],
        )
        seq = GaugeMetricFamily(
            "shaper_telemetry_last_seq",
            "sequence number of the live connector session's last accepted push",
            labels=["cluster"],
        )
        gaps = CounterMetricFamily(
            "shaper_telemetry_seq_gaps",
            "sequence numbers the cluster's connector sessions skipped: pushes built that "
            "never landed",
            labels=["cluster"],
        )
        rows = self.session.execute(
            sa.select(
                CLUSTERS.c.name, CLUSTERS.c.last_seen_at, CLUSTERS.c.last_seq, CLUSTERS.c.seq_gaps
            ).order_by(CLUSTERS.c.name)
        ).all()
        for name, last_seen_at, last_seq, seq_gaps in rows:
            if last_seen_at is not None:
                seen = _aware(last_seen_at, self.now)
                age.add_metric([name], max((self.now - seen).total_seconds(), 0.0))
            if last_seq is not None:
                seq.add_metric([name], last_seq)
            gaps.add_metric([name], seq_gaps or 0)
        yield age
        yield seq
        yield gaps

    def _idle(self) -> Metric:
        idle = GaugeMetricFamily(
            "shaper_idle_gpu_hours",
            f"idle or allocated-but-unused GPU-hours over the last "
            f"{int(IDLE_WINDOW.total_seconds())} s, by cause (the why-idle diagnosis)",
            labels=["cluster", "gpu_model", "cause"],
        )
        for name in sorted(self._clusters.values()):
            diagnosis = diagnosis_service.diagnose(
                session=self.session, cluster=name, since=self.now - IDLE_WINDOW, until=self.now
            )
            for cell in diagnosis.by_gpu_model:
                idle.add_metric([name, cell.key or "none", str(cell.cause)], cell.gpu_hours)
        return idle

    def _forecasts(self) -> Iterator[Metric]:
        """Per service: labelled by cluster and service name (the elastic job's name in its
        cluster, as the SLA policy names it), never a job id. One series per service that
        had a scored hour in the window: as many as the site runs services (hundreds),
        the same bound as the SLA policy's list of services."""
        window = f"next-hour forecasts of the last {FORECAST_WINDOW_H} h"
        service_labels = ["cluster", "service"]
        abs_error = GaugeMetricFamily(
            "shaper_forecast_abs_error_replicas",
            f"mean absolute error of the demand forecast's mean, {window}",
            labels=service_labels,
        )
        naive_error = GaugeMetricFamily(
            "shaper_forecast_naive_abs_error_replicas",
            f"mean absolute error of the seasonal-naive forecast (the baseline), {window}",
            labels=service_labels,
        )
        bias = GaugeMetricFamily(
            "shaper_forecast_bias_replicas",
            f"mean of forecast minus demand (> 0: over-forecast), {window}",
            labels=service_labels,
        )
        coverage = GaugeMetricFamily(
            "shaper_forecast_coverage_ratio",
            f"share of hours whose demand was at most the forecast's SLA quantile, {window}",
            labels=service_labels,
        )
        target = GaugeMetricFamily(
            "shaper_forecast_target_quantile",
            "the SLA quantile the forecasts reserved for (what coverage should reach)",
            labels=service_labels,
        )
        hours = GaugeMetricFamily(
            "shaper_forecast_hours_scored",
            f"hours scored, {window}",
            labels=service_labels,
        )
        jobs_window = f"block jobs that finished in the last {FORECAST_WINDOW_H} h"
        duration_error = GaugeMetricFamily(
            "shaper_duration_abs_error_hours",
            f"mean absolute error of the predicted run time, {jobs_window}",
            labels=["cluster"],
        )
        duration_naive = GaugeMetricFamily(
            "shaper_duration_naive_abs_error_hours",
            f"mean absolute error of the team's median run time (the baseline), {jobs_window}",
            labels=["cluster"],
        )
        duration_pct = GaugeMetricFamily(
            "shaper_duration_abs_pct_error_median",
            f"median absolute percentage error of the predicted run time (a fraction), "
            f"{jobs_window}",
            labels=["cluster"],
        )
        duration_jobs = GaugeMetricFamily(
            "shaper_duration_jobs_scored", f"jobs scored, {jobs_window}", labels=["cluster"]
        )
        summary = forecast_service.accuracy(
            session=self.session, now=self.now, window_h=FORECAST_WINDOW_H
        )
        for service in summary.services:
            labels = [service.cluster, service.service]
            abs_error.add_metric(labels, service.mae_replicas)
            naive_error.add_metric(labels, service.naive_mae_replicas)
            bias.add_metric(labels, service.bias_replicas)
            coverage.add_metric(labels, service.coverage)
            target.add_metric(labels, service.target_quantile)
            hours.add_metric(labels, service.hours_scored)
        for durations in summary.durations:
            labels = [durations.cluster]
            duration_error.add_metric(labels, durations.mae_hours)
            duration_naive.add_metric(labels, durations.naive_mae_hours)
            if durations.median_abs_pct_error is not None:
                duration_pct.add_metric(labels, durations.median_abs_pct_error)
            duration_jobs.add_metric(labels, durations.jobs_scored)
        yield from (abs_error, naive_error, bias, coverage, target, hours)
        yield from (duration_error, duration_naive, duration_pct, duration_jobs)

    def _forecasts_by_lead(self) -> Iterator[Metric]:
        """Per cluster and lead time (1 h … the solver's look-ahead), the cluster's
        services pooled: clusters × 5 series, whatever the number of services (the
        per-service figures by lead are in GET /forecast-accuracy)."""
        window = f"forecasts of the last {FORECAST_WINDOW_H} h, every service of the cluster"
        labels = ["cluster", "lead_h"]
        abs_error = GaugeMetricFamily(
            "shaper_forecast_lead_abs_error_replicas",
            f"mean absolute error of the forecast's mean made lead_h hours ahead, {window}",
            labels=labels,
        )
        naive_error = GaugeMetricFamily(
            "shaper_forecast_lead_naive_abs_error_replicas",
            f"mean absolute error of the seasonal-naive forecast for the same hours, {window}",
            labels=labels,
        )
        coverage = GaugeMetricFamily(
            "shaper_forecast_lead_coverage_ratio",
            f"share of hours whose demand was at most the forecast's SLA quantile, {window}",
            labels=labels,
        )
        hours = GaugeMetricFamily(
            "shaper_forecast_lead_hours_scored", f"hours scored, {window}", labels=labels
        )
        for lead in forecast_service.accuracy_by_lead(
            session=self.session, now=self.now, window_h=FORECAST_WINDOW_H
        ):
            values = [lead.cluster, str(lead.lead_h)]
            abs_error.add_metric(values, lead.mae_replicas)
            naive_error.add_metric(values, lead.naive_mae_replicas)
            coverage.add_metric(values, lead.coverage)
            hours.add_metric(values, lead.hours_scored)
        yield from (abs_error, naive_error, coverage, hours)


def _aware(moment: datetime, like: datetime) -> datetime:
    """SQLite hands back naive UTC times from aggregates and core selects."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=like.tzinfo)
