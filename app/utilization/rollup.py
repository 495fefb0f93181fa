"""Bucket sums from ``utilization_rollups`` (kept by triggers: see the migration
``ef0a1b2c3d9a``), exact for any window and bucket size.

Periods nest: the exact instant of an event (1 µs), 16 s × 4^k up to 65,536 s, and all
time. A bucket [b, e) in µs is cut into the fewest whole periods: exact instants up to the
first 16 s boundary, then ever longer periods up to the longest that fits, then shorter
ones down to the last 16 s boundary, exact instants to e (at most 3 periods of each level
on each side, merged into one range per level and side). One query joins these ranges to
the table and sums per group and bucket in the database.

Allocated GPUs come out of the events' sums without reading an allocation: with
A = GPUs held at b, G = Σ ΔGPUs and M = Σ ΔGPUs × (t - b) over the bucket's events, the
bucket's GPU-time is A × (e - b) + G × (e - b) - M, and the next bucket starts at A + G. A
at ``since`` is the all-time total less every change since then (the window's buckets and
what came after ``until``).

On PostgreSQL the triggers append deltas (``utilization_rollup_deltas``: one row per
group and event instant) that ``app.utilization.fold`` folds into the periods every few
seconds; the same query adds the deltas not folded yet, each to its bucket.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlmodel import Session

from app.utilization.models import GroupBy

# Must equal the migration's LEVELS_US (less 0 and 1): the triggers write these periods.
LEVELS_US = tuple(16_000_000 * 4**k for k in range(7))
EXACT_US = 1  # period of the exact instant: period_start_us is the event's time
ALL_TIME_US = 0
FOREVER_US = 2**62
# A delta's GPU model: its node's now, where it names a node that still exists (``n``).
NODE_MODEL = "CASE WHEN n.id IS NULL THEN {row}.gpu_model_id ELSE COALESCE(n.gpu_model_id, 0) END"
# Pseudo-buckets beside 0 … n-1: all time, after ``until``, exactly at ``since``.
ALL_TIME, AFTER, AT_SINCE = -1, -2, -3

_KEY_COLUMN = {
    GroupBy.cluster: "cluster_id",
    GroupBy.gpu_model: "gpu_model_id",
    GroupBy.team: "team",
}
_ROLLUP_DIMENSION = {
    GroupBy.cluster: "cluster",
    GroupBy.gpu_model: "gpu_model",
    GroupBy.team: "team",
}


@dataclass
class Sums:
    gpus: int = 0  # Σ ΔGPUs
    moment_us: int = 0  # Σ ΔGPUs × (t - bucket start)
    opened: int = 0
    closed: int = 0
    samples: int = 0
    sample_sum: float = 0.0


def period_ranges(start_us: int, end_us: int) -> list[tuple[int, int, int]]:
    """[start_us, end_us) as (period_us, first period start, end of the last period start)
    ranges: each row of that period whose start is in [first, end) lies in the interval,
    and together they cover it exactly once."""
    if start_us >= end_us:
        return []
    finest = LEVELS_US[0]
    first = -(-start_us // finest) * finest
    last = end_us // finest * finest
    if first >= last:
        return [(EXACT_US, start_us, end_us)]
    ranges: list[tuple[int, int, int]] = []
    if start_us < first:
        ranges.append((EXACT_US, start_us, first))
    at = first
    while at < last:
        level = next(
            level for level in reversed(LEVELS_US) if at % level == 0 and at + level <= last
        )
        if ranges and ranges[-1][0] == level and ranges[-1][2] == at:
            ranges[-1] = (level, ranges[-1][1], at + level)
        else:
            ranges.append((level, at, at + level))
        at += level
    if last < end_us:
        ranges.append((EXACT_US, last, end_us))
    return ranges


def suffix_ranges(start_us: int) -> list[tuple[int, int, int]]:
    """[start_us, forever): up to the first boundary of the longest period, then all of
    those periods after it."""
    top = LEVELS_US[-1]
    aligned = -(-start_us // top) * top
    return [*period_ranges(start_us, aligned), (top, aligned, FOREVER_US)]


def _unfolded(key: str, cluster_id: int | None) -> str:
    """PostgreSQL: the deltas not folded into the periods yet (``app.utilization.fold``),
    as rows of the same shape as the periods'. Each is an event at ``at_us``: in all
    time, in the bucket or after ``until`` that holds it, and at ``since`` if exactly
    then. Read in the same statement as the periods, so a fold that commits meanwhile
    moves none of them out of sight or into view twice. Deltas of a deleted cluster (no
    foreign key) are left out, as its periods went with it."""
    bucket = (
        f"CASE WHEN d.at_us >= :until_us THEN {AFTER}"
        " WHEN d.at_us >= :since_us THEN (d.at_us - :since_us) / :bucket_us END"
    )
    buckets = (
        f"(VALUES ({ALL_TIME}), ({bucket}), (CASE WHEN d.at_us = :since_us THEN {AT_SINCE} END))"
    )
    moment = (
        "CASE WHEN b.bucket >= 0"
        " THEN d.gpus * (d.at_us - :since_us - b.bucket * :bucket_us) ELSE 0 END"
    )
    in_cluster = "" if cluster_id is None else " AND d.cluster_id = :cluster_id"
    group, nodes = f"d.{key}", ""
    if key == "gpu_model_id":  # a delta of a node's events: the node's model now
        group = NODE_MODEL.format(row="d")
        nodes = " LEFT JOIN nodes n ON n.id = d.node_id"
    return (
        f"SELECT b.bucket, {group} AS key, d.gpus, d.opened, d.closed, d.samples,"
        f" d.sample_sum, {moment} AS moment FROM utilization_rollup_deltas d{nodes}"
        f" CROSS JOIN LATERAL {buckets} AS b (bucket)"
        f" WHERE d.dimension = :dimension{in_cluster} AND b.bucket IS NOT NULL"
        " AND EXISTS (SELECT 1 FROM clusters c WHERE c.id = d.cluster_id)"
    )


def bucket_sums(
    session: Session,
    *,
    group_by: GroupBy,
    cluster_id: int | None,
    since_us: int,
    until_us: int,
    bucket_us: int,
) -> dict[Any, dict[int, Sums]]:
    """Per group key (cluster id, GPU model id or team), per bucket index (and the
    pseudo-buckets above), the sums of the roll-up over the bucket."""
    # (bucket, its start, period, first, end); the start only matters to real buckets.
    rows: list[tuple[int, int, int, int, int]] = [(ALL_TIME, 0, ALL_TIME_US, 0, 1)]
    rows += [(AFTER, 0, *r) for r in suffix_ranges(until_us)]
    rows.append((AT_SINCE, 0, EXACT_US, since_us, since_us + 1))
    for index, start in enumerate(range(since_us, until_us, bucket_us)):
        end = min(start + bucket_us, until_us)
        rows += [(index, start, *r) for r in period_ranges(start, end)]
    key = _KEY_COLUMN[group_by]
    parameters: dict[str, Any] = {"dimension": _ROLLUP_DIMENSION[group_by]}
    in_range = (
        "u.dimension = :dimension AND u.period_us = r.period_us"
        " AND u.period_start_us >= r.lo AND u.period_start_us < r.hi"
    )
    if cluster_id is not None:
        in_range += " AND u.cluster_id = :cluster_id"
        parameters["cluster_id"] = cluster_id
    columns = (
        f"u.{key} AS key, u.gpus, u.opened, u.closed, u.samples, u.sample_sum,"
        " CASE WHEN r.bucket >= 0"
        " THEN u.gpu_us + u.gpus * (u.period_start_us - r.origin) ELSE 0 END AS moment"
    )
    if session.connection().dialect.name == "postgresql":
        # The ranges as five arrays: a literal VALUES list of a thousand rows takes
        # PostgreSQL longer to plan (6 ms) than the scans take to run.
        # Each array is sent as its text form: psycopg would adapt element by element.
        names = ("buckets", "origins", "periods", "los", "his")
        arrays = ", ".join(f"CAST(:{name} AS bigint[])" for name in names)
        ranges = f"unnest({arrays}) AS r (bucket, origin, period_us, lo, hi)"
        for name, column in zip(names, zip(*rows, strict=True), strict=True):
            parameters[name] = "{" + ",".join(map(str, column)) + "}"
        # Its cost estimate would cross PostgreSQL's JIT threshold; compiling then takes
        # longer than the query. This transaction only.
        session.execute(sa.text("SET LOCAL jit = off"))
        # One index range scan per range. Joined plainly, PostgreSQL hashes the ranges
        # and filters every row of the dimension against each (a second for 30 days);
        # OFFSET 0 keeps it from flattening the LATERAL subquery back into that join.
        matched = (
            f"SELECT r.bucket, u.* FROM {ranges} CROSS JOIN LATERAL"
            f" (SELECT {columns} FROM utilization_rollups u WHERE {in_range} OFFSET 0) AS u"
            f" UNION ALL {_unfolded(key, cluster_id)}"
        )
        parameters.update(since_us=since_us, until_us=until_us, bucket_us=bucket_us)
    else:
        # The ranges are integers computed here, so they are written into the statement:
        # bound one by one they would pass SQLite's limit of parameters for long windows.
        # CROSS JOIN keeps the ranges the outer loop in SQLite (one index search each);
        # left to itself it may scan the dimension once per range instead.
        values = ", ".join("(" + ", ".join(str(int(v)) for v in row) + ")" for row in rows)
        matched = (
            f"WITH r (bucket, origin, period_us, lo, hi) AS (VALUES {values})"
            f" SELECT r.bucket, {columns} FROM r CROSS JOIN utilization_rollups u"
            f" WHERE {in_range}"
        )
    query = sa.text(
        "SELECT m.key, m.bucket, SUM(m.gpus), SUM(m.moment), SUM(m.opened), SUM(m.closed),"
        f" SUM(m.samples), SUM(m.sample_sum) FROM ({matched}) AS m GROUP BY m.key, m.bucket"
    )
    sums: dict[Any, dict[int, Sums]] = defaultdict(dict)
    for group, bucket, gpus, moment, opened, closed, samples, sample_sum in session.execute(
        query, parameters
    ):
        # PostgreSQL sums bigints as numeric (Decimal): exact, made int here.
        sums[group][bucket] = Sums(
            int(gpus), int(moment), int(opened), int(closed), int(samples), float(sample_sum)
        )
    return sums
