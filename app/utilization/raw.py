"""The utilization summary computed from the allocations and samples themselves: the
definition that ``service.summarize`` (from the roll-up) must equal. Its cost follows the
rows of history in the window (issue 13's fleet: seconds a request), so the API does not
use it; the tests compare the two. Over periods whose node samples the retention job has
deleted (``app.utilization.retention``) only the roll-up still knows their measured busy.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlmodel import Session, col

from app.clusters.models import Cluster
from app.gpu_models.models import GpuModel
from app.jobs.models import Allocation, Job
from app.nodes.models import Node
from app.telemetry.models import TelemetrySample
from app.utilization.models import GroupBy, UtilizationSummary
from app.utilization.service import (
    build_summary,
    capacity_by_group,
    check_window,
    group_of_node,
    to_us,
)
from wire.telemetry import Metric


def summarize_raw(
    *,
    session: Session,
    since: datetime,
    until: datetime,
    bucket_s: int,
    group_by: GroupBy,
    cluster: str | None = None,
) -> UtilizationSummary:
    n_buckets = check_window(since=since, until=until, bucket_s=bucket_s)
    capacity = capacity_by_group(session, group_by=group_by, cluster=cluster)
    group = group_of_node(group_by)
    group_of_allocation = col(Job.team) if group_by is GroupBy.team else group
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
    # GPU-µs as integers: exact, whatever the order the overlaps are added in.
    gpu_us: dict[str, list[int]] = defaultdict(lambda: [0] * n_buckets)
    since_us, until_us, bucket_us = to_us(since), to_us(until), bucket_s * 1_000_000
    for key, gpus, started, released in session.execute(allocation_query):
        start = max(to_us(started), since_us)
        end = min(to_us(released) if released else until_us, until_us)
        _spread(gpu_us[key], since_us, bucket_us, start, end, gpus)
    allocated_gpus = {
        key: [
            held / min(bucket_us, until_us - since_us - i * bucket_us)
            for i, held in enumerate(sums)
        ]
        for key, sums in gpu_us.items()
    }

    measured: dict[str, list[float | None]] = {}
    if group_by is not GroupBy.team:
        sample_query = (
            sa.select(group, col(TelemetrySample.at), col(TelemetrySample.value))
            .select_from(TelemetrySample)
            .join(Node, col(Node.id) == col(TelemetrySample.node_id))
            .join(Cluster, col(Cluster.id) == col(Node.cluster_id))
            .outerjoin(GpuModel, col(GpuModel.id) == col(Node.gpu_model_id))
            .where(
                col(TelemetrySample.metric) == Metric.gpu_util.value,
                col(TelemetrySample.at) >= since,
                col(TelemetrySample.at) < until,
            )
        )
        if cluster is not None:
            sample_query = sample_query.where(col(Cluster.name) == cluster)
        sums: dict[str, list[tuple[int, float]]] = defaultdict(lambda: [(0, 0.0)] * n_buckets)
        step = timedelta(seconds=bucket_s)
        for key, at, value in session.execute(sample_query):
            index = (at - since) // step  # exact: timedelta arithmetic, no float seconds
            count, total = sums[key][index]
            sums[key][index] = (count + 1, total + value)
        measured = {
            key: [total / count if count else None for count, total in buckets]
            for key, buckets in sums.items()
        }

    keys = sorted(gpu_us) if group_by is GroupBy.team else sorted(capacity)
    return build_summary(
        group_by=group_by,
        since=since,
        until=until,
        bucket_s=bucket_s,
        capacity=capacity,
        keys=keys,
        allocated_gpus=allocated_gpus,
        measured=measured,
    )


def _spread(
    buckets: list[int], since_us: int, bucket_us: int, start_us: int, end_us: int, gpus: int
) -> None:
    """Add ``gpus`` × overlap µs of [start, end) to each bucket it touches."""
    lo, hi = start_us - since_us, end_us - since_us
    first, last = lo // bucket_us, min(-(-hi // bucket_us), len(buckets))
    for i in range(max(first, 0), last):
        overlap = min(hi, (i + 1) * bucket_us) - max(lo, i * bucket_us)
        if overlap > 0:
            buckets[i] += overlap * gpus
