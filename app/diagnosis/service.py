"""Why a cluster's GPUs were idle over a window, from its stored history
(``app.diagnosis.history``) through the pure classifier (``solver.diagnosis``)."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta

from sqlmodel import Session

from app.clusters import service as cluster_service
from app.core.errors import Invalid
from app.core.lookup import row_id
from app.diagnosis.history import Window, replay
from app.diagnosis.models import BucketCauseHours, CauseHours, GroupCauseHours, IdleDiagnosis
from solver.diagnosis import (
    ClusterAt,
    Diagnosis,
    IdleCause,
    IdleHours,
    Settled,
    classify,
    settle,
)
from solver.diagnosis.state import DEFAULT_BUSY_THRESHOLD

# A month of hourly buckets: the replay visits every change in the window (and classifies
# each distinct state once), so the window bounds the work of one request.
MAX_WINDOW = timedelta(days=31)
BUCKET_S = 3600
ROUND = 6


def diagnose(
    *,
    session: Session,
    cluster: str,
    since: datetime,
    until: datetime,
    busy_threshold: float = DEFAULT_BUSY_THRESHOLD,
) -> IdleDiagnosis:
    if until <= since:
        raise Invalid("until must be after since", field="until")
    if until - since > MAX_WINDOW:
        raise Invalid(
            f"the window spans {(until - since).total_seconds() / 86400:.1f} days; at most "
            f"{MAX_WINDOW.days} — move since later",
            field="since",
        )
    window = window_of(
        session=session, cluster=cluster, since=since, until=until, busy_threshold=busy_threshold
    )
    hours = IdleHours(bucket_s=BUCKET_S, origin=since.timestamp())
    # The replay yields an unchanged state as the same object: classified once, held over
    # every interval it lasts (each still added apart, so the sums are the same); a state
    # whose nodes and allocations did not change (only its queue or caps) is settled once.
    state: ClusterAt | None = None
    settled: Settled | None = None
    diagnosis: Diagnosis | None = None
    for start, end, now in replay(session, window):
        if now is not state or diagnosis is None:
            if (
                settled is None
                or state is None
                or now.nodes is not state.nodes
                or now.allocations is not state.allocations
            ):
                settled = settle(now)
            state, diagnosis = now, classify(now, settled)
        hours.add(diagnosis, cluster=window.cluster, start=start, end=end)
    return _summary(hours, window)


def window_of(
    *,
    session: Session,
    cluster: str,
    since: datetime,
    until: datetime,
    busy_threshold: float = DEFAULT_BUSY_THRESHOLD,
) -> Window:
    """The replay's window over the named cluster (404 when there is none), in hourly
    buckets."""
    row = cluster_service.get_cluster(session=session, name=cluster)
    return Window(
        cluster_id=row_id(row),
        cluster=row.name,
        since=since,
        until=until,
        bucket_s=BUCKET_S,
        busy_threshold=busy_threshold,
    )


def _summary(hours: IdleHours, window: Window) -> IdleDiagnosis:
    by_model: defaultdict[tuple[str | None, IdleCause], float] = defaultdict(float)
    by_team: defaultdict[tuple[str | None, IdleCause], float] = defaultdict(float)
    by_bucket: defaultdict[tuple[int, IdleCause], float] = defaultdict(float)
    for row in hours.rows():
        by_model[(row.gpu_model, row.cause)] += row.gpu_hours
        by_team[(row.team, row.cause)] += row.gpu_hours
        by_bucket[(row.bucket, row.cause)] += row.gpu_hours
    idle = hours.idle_gpu_hours
    totals = hours.hours_by_cause()
    order = list(IdleCause)
    return IdleDiagnosis(
        cluster=window.cluster,
        since=window.since,
        until=window.until,
        bucket_s=window.bucket_s,
        busy_threshold=window.busy_threshold,
        capacity_gpu_hours=round(hours.capacity_gpu_hours, ROUND),
        busy_gpu_hours=round(hours.busy_gpu_hours, ROUND),
        idle_gpu_hours=round(idle, ROUND),
        causes=[
            CauseHours(
                cause=cause,
                gpu_hours=round(totals[cause], ROUND),
                share_of_idle=round(totals[cause] / idle, ROUND) if idle > 0 else 0.0,
            )
            for cause in order
        ],
        by_gpu_model=_groups(by_model),
        by_team=_groups(by_team),
        by_bucket=[
            BucketCauseHours(
                start=window.since + timedelta(seconds=bucket * window.bucket_s),
                cause=cause,
                gpu_hours=round(value, ROUND),
            )
            for (bucket, cause), value in sorted(
                by_bucket.items(), key=lambda item: (item[0][0], order.index(item[0][1]))
            )
        ],
    )


def _groups(cells: dict[tuple[str | None, IdleCause], float]) -> list[GroupCauseHours]:
    order = list(IdleCause)
    return [
        GroupCauseHours(key=key, cause=cause, gpu_hours=round(value, ROUND))
        for (key, cause), value in sorted(
            cells.items(), key=lambda item: (item[0][0] or "", order.index(item[0][1]))
        )
    ]
