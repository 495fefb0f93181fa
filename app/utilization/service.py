"""Utilization over time, bucketed: allocated GPU-time / capacity, and measured GPU busy.

Allocated share comes from the allocation history (every open or closed interval that
overlaps the window, split across buckets by overlap). Capacity is today's non-down GPU
count of the group: node history is not kept, so a cluster that grew shows the new size
for the whole window. Teams share their clusters' capacity, so per-team shares add up to the
cluster's allocated share. Measured busy is the mean of ``gpu_util`` samples (not per team:
samples belong to nodes).
"""

from __future__ import annotations

import math
from collections import defaultdict
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlmodel import Session, col

from app.clusters.models import Cluster
from app.core.errors import Invalid
from app.gpu_models.models import GpuModel
from app.jobs.models import Allocation, Job
from app.nodes.models import Node
from app.telemetry.models import TelemetrySample
from app.utilization.models import GroupBy, UtilizationPoint, UtilizationSeries, UtilizationSummary
from wire.telemetry import Metric

MAX_BUCKETS = 2000


def summarize(
    *,
    session: Session,
    since: datetime,
    until: datetime,
    bucket_s: int,
    group_by: GroupBy,
    cluster: str | None = None,
) -> UtilizationSummary:
    if until <= since:
        raise Invalid("until must be after since", field="until")
    n_buckets = math.ceil((until - since).total_seconds() / bucket_s)
    if n_buckets > MAX_BUCKETS:
        raise Invalid(
            f"{n_buckets} buckets requested; at most {MAX_BUCKETS} — widen bucket_s",
            field="bucket_s",
        )

    group_of_node = {
        GroupBy.cluster: col(Cluster.name),
        GroupBy.gpu_model: sa.func.coalesce(col(GpuModel.name), "none"),
        GroupBy.team: col(Cluster.name),  # capacity is shared; see module docstring
    }[group_by]
    capacity_query = (
        sa.select(group_of_node, sa.func.sum(col(Node.gpu_count)))
        .select_from(Node)
        .join(Cluster, col(Cluster.id) == col(Node.cluster_id))
        .outerjoin(GpuModel, col(GpuModel.id) == col(Node.gpu_model_id))
        .where(col(Node.state) != "down")
        .group_by(group_of_node)
    )
    if cluster is not None:
        capacity_query = capacity_query.where(col(Cluster.name) == cluster)
    capacity = {key: int(total or 0) for key, total in session.execute(capacity_query)}
    if group_by is GroupBy.team:
        capacity = {"*": sum(capacity.values())}

    group_of_allocation = col(Job.team) if group_by is GroupBy.team else group_of_node
    allocation_query = (
        sa.select(
            group_of_allocation,
            col(Allocation.gpu_count),
            col(Allocation.started_at),
            col(Allocation.released_at),
        )
        .select_from(Allocation)
        .join(Job, col(Job.id) == col(Allocation.job_id))
        .join(Node, col(Node.id) == col(Allocation.node_id))
        .join(Cluster, col(Cluster.id) == col(Node.cluster_id))
        .outerjoin(GpuModel, col(GpuModel.id) == col(Node.gpu_model_id))
        .where(col(Allocation.started_at) < until)
        .where(sa.or_(col(Allocation.released_at).is_(None), col(Allocation.released_at) > since))
    )
    if cluster is not None:
        allocation_query = allocation_query.where(col(Cluster.name) == cluster)
    gpu_seconds: dict[str, list[float]] = defaultdict(lambda: [0.0] * n_buckets)
    for key, gpus, started, released in session.execute(allocation_query):
        start = max(started, since)
        end = min(released or until, until)
        _spread(gpu_seconds[key], since, bucket_s, start, end, gpus)

    measured: dict[str, list[float | None]] = {}
    if group_by is not GroupBy.team:
        # extract(epoch) compiles to EXTRACT on PostgreSQL and strftime('%s') on SQLite.
        offset_s = sa.extract("epoch", col(TelemetrySample.at)) - since.timestamp()
        scaled = offset_s / bucket_s
        # PostgreSQL's cast rounds, SQLite's truncates (= floor here, as offsets are ≥ 0).
        postgres = session.connection().dialect.name == "postgresql"
        bucket_index = sa.func.floor(scaled) if postgres else sa.cast(scaled, sa.Integer)
        sample_query = (
            sa.select(group_of_node, bucket_index, sa.func.avg(col(TelemetrySample.value)))
            .select_from(TelemetrySample)
            .join(Node, col(Node.id) == col(TelemetrySample.node_id))
            .join(Cluster, col(Cluster.id) == col(Node.cluster_id))
            .outerjoin(GpuModel, col(GpuModel.id) == col(Node.gpu_model_id))
            .where(
                col(TelemetrySample.metric) == Metric.gpu_util.value,
                col(TelemetrySample.at) >= since,
                col(TelemetrySample.at) < until,
            )
            .group_by(group_of_node, bucket_index)
        )
        if cluster is not None:
            sample_query = sample_query.where(col(Cluster.name) == cluster)
        for key, index, mean in session.execute(sample_query):
            series = measured.setdefault(key, [None] * n_buckets)
            if 0 <= int(index) < n_buckets:
                series[int(index)] = float(mean)

    keys = (
        sorted(set(capacity) - {"*"} | set(gpu_seconds))
        if group_by is GroupBy.team
        else sorted(capacity)
    )
    result = []
    for key in keys:
        cap = capacity["*"] if group_by is GroupBy.team else capacity.get(key, 0)
        seconds = gpu_seconds.get(key, [0.0] * n_buckets)
        points = []
        for i in range(n_buckets):
            start = since + timedelta(seconds=i * bucket_s)
            width = min(bucket_s, (until - start).total_seconds())
            mean_gpus = seconds[i] / width if width > 0 else 0.0
            points.append(
                UtilizationPoint(
                    start=start,
                    allocated_gpus=round(mean_gpus, 4),
                    allocated_share=round(mean_gpus / cap, 4) if cap else 0.0,
                    measured_util=measured.get(key, [None] * n_buckets)[i],
                )
            )
        result.append(UtilizationSeries(key=key, capacity_gpus=cap, points=points))
    return UtilizationSummary(
        group_by=group_by, bucket_s=bucket_s, since=since, until=until, series=result
    )


def _spread(
    buckets: list[float],
    since: datetime,
    bucket_s: int,
    start: datetime,
    end: datetime,
    gpus: int,
) -> None:
    """Add ``gpus`` × overlap seconds of [start, end) to each bucket it touches."""
    lo = (start - since).total_seconds()
    hi = (end - since).total_seconds()
    first, last = int(lo // bucket_s), min(int(math.ceil(hi / bucket_s)), len(buckets))
    for i in range(max(first, 0), last):
        overlap = min(hi, (i + 1) * bucket_s) - max(lo, i * bucket_s)
        if overlap > 0:
            buckets[i] += overlap * gpus
