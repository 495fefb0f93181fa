"""Utilization over time, bucketed: allocated GPU-time / capacity, and measured GPU busy.

Allocated share comes from the allocation history (every open or closed interval that
overlaps the window, split across buckets by overlap). Capacity is today's non-down GPU
count of the group: node history is not kept, so a cluster that grew shows the new size
for the whole window. Teams share their clusters' capacity, so per-team shares add up to the
cluster's allocated share. Measured busy is the mean of ``gpu_util`` samples (not per team:
samples belong to nodes). History is grouped by a job's current team and a node's current
GPU model.

:func:`summarize` reads the roll-up (``app.utilization.rollup``): its cost follows the
number of buckets and groups, not the rows of history. ``app.utilization.raw`` computes
the same answer from the allocations and samples themselves (the definition; the tests
hold the two equal).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlmodel import Session, col

from app.clusters.models import Cluster
from app.core.errors import Invalid
from app.gpu_models.models import GpuModel
from app.nodes.models import Node
from app.utilization import rollup
from app.utilization.models import GroupBy, UtilizationPoint, UtilizationSeries, UtilizationSummary

MAX_BUCKETS = 2000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
# Shares are rounded to 4 decimals; so is the measured mean, whose last bits depend on
# the order its samples were added in (the roll-up adds them in another order).
DECIMALS = 4


def check_window(*, since: datetime, until: datetime, bucket_s: int) -> int:
    """The number of buckets; refuses an empty window or too many buckets."""
    if until <= since:
        raise Invalid("until must be after since", field="until")
    n_buckets = math.ceil((until - since).total_seconds() / bucket_s)
    if n_buckets > MAX_BUCKETS:
        raise Invalid(
            f"{n_buckets} buckets requested; at most {MAX_BUCKETS} — widen bucket_s",
            field="bucket_s",
        )
    return n_buckets


def group_of_node(group_by: GroupBy) -> sa.SQLColumnExpression[str]:
    """The group a node's GPUs count in (teams share their cluster's capacity)."""
    return {
        GroupBy.cluster: col(Cluster.name),
        GroupBy.gpu_model: sa.func.coalesce(col(GpuModel.name), "none"),
        GroupBy.team: col(Cluster.name),
    }[group_by]


def capacity_by_group(
    session: Session, *, group_by: GroupBy, cluster: str | None
) -> dict[str, int]:
    """Non-down GPUs per group; for teams, all of them under ``"*"``."""
    group = group_of_node(group_by)
    query = (
        sa.select(group, sa.func.sum(col(Node.gpu_count)))
        .select_from(Node)
        .join(Cluster, col(Cluster.id) == col(Node.cluster_id))
        .outerjoin(GpuModel, col(GpuModel.id) == col(Node.gpu_model_id))
        .where(col(Node.state) != "down")
        .group_by(group)
    )
    if cluster is not None:
        query = query.where(col(Cluster.name) == cluster)
    capacity = {key: int(total or 0) for key, total in session.execute(query)}
    if group_by is GroupBy.team:
        return {"*": sum(capacity.values())}
    return capacity


def build_summary(
    *,
    group_by: GroupBy,
    since: datetime,
    until: datetime,
    bucket_s: int,
    capacity: dict[str, int],
    keys: Iterable[str],
    allocated_gpus: Mapping[str, Sequence[float]],
    measured: Mapping[str, Sequence[float | None]],
) -> UtilizationSummary:
    """The response: per key, per bucket, the mean GPUs allocated (``allocated_gpus``)
    and the mean measured busy fraction (``measured``; None where no sample)."""
    n_buckets = check_window(since=since, until=until, bucket_s=bucket_s)
    result = []
    for key in keys:
        cap = capacity["*"] if group_by is GroupBy.team else capacity.get(key, 0)
        means = allocated_gpus.get(key, [0.0] * n_buckets)
        busy = measured.get(key, [None] * n_buckets)
        points = []
        for i in range(n_buckets):
            mean_gpus, measured_util = means[i], busy[i]
            # Built from numbers computed here: validating thousands of points (30 days in
            # 6 h buckets for 32 clusters: 3,840) would cost about as much as the query.
            points.append(
                UtilizationPoint.model_construct(
                    start=since + timedelta(seconds=i * bucket_s),
                    allocated_gpus=round(mean_gpus, DECIMALS),
                    allocated_share=round(mean_gpus / cap, DECIMALS) if cap else 0.0,
                    measured_util=None if measured_util is None else round(measured_util, DECIMALS),
                )
            )
        result.append(UtilizationSeries(key=key, capacity_gpus=cap, points=points))
    return UtilizationSummary(
        group_by=group_by, bucket_s=bucket_s, since=since, until=until, series=result
    )


def to_us(at: datetime) -> int:
    """µs since the epoch, exactly."""
    return (at - _EPOCH) // _MICROSECOND


def summarize(
    *,
    session: Session,
    since: datetime,
    until: datetime,
    bucket_s: int,
    group_by: GroupBy,
    cluster: str | None = None,
) -> UtilizationSummary:
    n_buckets = check_window(since=since, until=until, bucket_s=bucket_s)
    cluster_names = dict(
        session.execute(sa.select(col(Cluster.id), col(Cluster.name))).tuples().all()
    )
    cluster_id = None
    if cluster is not None:
        cluster_id = next((i for i, name in cluster_names.items() if name == cluster), None)
        if cluster_id is None:  # nothing of it anywhere: no capacity and no history
            return build_summary(
                group_by=group_by, since=since, until=until, bucket_s=bucket_s,
                capacity={}, keys=[], allocated_gpus={}, measured={},
            )  # fmt: skip
    capacity = capacity_by_group(session, group_by=group_by, cluster=cluster)
    since_us, until_us = to_us(since), to_us(until)
    bucket_us = bucket_s * 1_000_000
    by_key = rollup.bucket_sums(
        session,
        group_by=group_by,
        cluster_id=cluster_id,
        since_us=since_us,
        until_us=until_us,
        bucket_us=bucket_us,
    )
    named = _named(session, group_by, cluster_names, by_key)

    allocated_gpus: dict[str, list[float]] = {}
    measured: dict[str, list[float | None]] = {}
    present: set[str] = set()  # teams holding GPUs at some time in the window
    for key, buckets in named.items():
        total, after = buckets.get(rollup.ALL_TIME), buckets.get(rollup.AFTER)
        in_window = [buckets.get(i) for i in range(n_buckets)]
        changed_since = sum(s.gpus for s in in_window if s) + (after.gpus if after else 0)
        held = (total.gpus if total else 0) - changed_since  # GPUs held at ``since``
        means: list[float] = []
        busy: list[float | None] = []
        for i, sums in enumerate(in_window):
            width_us = min(bucket_us, until_us - since_us - i * bucket_us)
            gpus = sums.gpus if sums else 0
            gpu_us = (held + gpus) * width_us - (sums.moment_us if sums else 0)
            means.append(gpu_us / width_us)
            busy.append(sums.sample_sum / sums.samples if sums and sums.samples else None)
            held += gpus
        allocated_gpus[key], measured[key] = means, busy
        if group_by is GroupBy.team and _overlaps_window(buckets, n_buckets):
            present.add(key)

    if group_by is GroupBy.team:
        keys = sorted(present)
        measured = {}  # samples belong to nodes, not teams
    else:
        keys = sorted(capacity)
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


def _named(
    session: Session,
    group_by: GroupBy,
    cluster_names: dict[int, str],
    by_key: Mapping[Any, dict[int, rollup.Sums]],
) -> dict[str, dict[int, rollup.Sums]]:
    """The roll-up's group keys as the response names them; ids that name the same
    group (every GPU model id without a model is ``"none"``) are added together."""
    if group_by is GroupBy.team:
        return {str(team): buckets for team, buckets in by_key.items()}
    names: dict[int, str]
    if group_by is GroupBy.cluster:
        names = cluster_names
    else:
        names = dict(
            session.execute(sa.select(col(GpuModel.id), col(GpuModel.name))).tuples().all()
        )
    named: dict[str, dict[int, rollup.Sums]] = defaultdict(dict)
    for key, buckets in by_key.items():
        into = named[names.get(key, "none")]
        for bucket, sums in buckets.items():
            if bucket not in into:
                into[bucket] = rollup.Sums()
            total = into[bucket]
            total.gpus += sums.gpus
            total.moment_us += sums.moment_us
            total.opened += sums.opened
            total.closed += sums.closed
            total.samples += sums.samples
            total.sample_sum += sums.sample_sum
    return named


def _overlaps_window(buckets: dict[int, rollup.Sums], n_buckets: int) -> bool:
    """Whether an allocation [start, release) with start < until and release > since (or
    none) exists: those started before ``until`` less those released by ``since``."""
    empty = rollup.Sums()
    total = buckets.get(rollup.ALL_TIME, empty)
    after = buckets.get(rollup.AFTER, empty)
    at_since = buckets.get(rollup.AT_SINCE, empty)
    closed_from_since = sum(buckets.get(i, empty).closed for i in range(n_buckets)) + after.closed
    started_before_until = total.opened - after.opened
    released_by_since = total.closed - closed_from_since + at_since.closed
    return started_before_until - released_by_since > 0
