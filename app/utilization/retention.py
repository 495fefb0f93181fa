"""Retention of raw node samples: those older than the retention age are deleted, in
batches; utilization over their periods is still answered, exactly, from the roll-up.

Every ``gpu_util`` sample is in the roll-up (or its deltas not folded yet) from its own
transaction on: the triggers add it as it is written, and the migration that made the
roll-up added the ones stored before. So a sample's period is covered as soon as it is
stored, and deleting it changes no answer of ``GET /utilization`` (no trigger runs on
DELETE: the roll-up keeps its sums). What the raw samples still serve: the diagnosis
(idle GPUs, windows of up to 31 days), the cluster map and the metrics (the last
minutes); the default retention (``SHAPER_SAMPLE_RETENTION_DAYS``, 35) outlives them all.

Only node measurements go (``NODE_METRICS``: GPU busy and memory, CPU, memory): services'
``demand_replicas`` samples are the forecasts' history and stay.

After a node's samples are deleted, a change of the node's GPU model moves only the
samples kept to the new model; the deleted ones stay counted under the model they had.

The roll-up's exact-instant rows (one per group and distinct event instant: every sample
instant) are compacted too (:func:`compact_rollups`): in each whole 16 s period older
than the retention, the rows of instants other than the period's start become one row
at the start + 1 µs. Every longer period already holds their sums, so an answer whose
window and buckets have edges on multiples of 16 s (since the epoch) reads no
exact-instant row but the one at ``since``, kept, and is unchanged. An edge inside a
compacted period reads the events of that period as if they happened 1 µs after its
start (each still counted once, in one bucket): the grain of old history is 16 s.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.engine import CursorResult
from sqlmodel import Session, col

from app.clusters.models import Cluster
from app.telemetry.models import TelemetrySample
from app.telemetry.service import NODE_METRICS
from app.utilization.fold import ROLLUP_FOLD_LOCK_KEY
from app.utilization.rollup import EXACT_US, LEVELS_US
from app.utilization.service import to_us

BATCH = 10_000
# One run deletes at most this many batches (the task's time limit covers them); a
# backlog (the first run on a database that kept everything) goes over the next runs.
MAX_BATCHES = 100


def prune_samples(
    *,
    session: Session,
    now: datetime,
    older_than: timedelta,
    batch: int = BATCH,
    max_batches: int | None = MAX_BATCHES,
) -> int:
    """Delete node samples taken before ``now - older_than``, a batch per transaction, the
    oldest first, cluster by cluster; returns how many. ``max_batches`` None: all of them."""
    cutoff = now - older_than
    metrics = sorted(m.value for m in NODE_METRICS)
    clusters = sa.select(col(Cluster.id)).order_by(col(Cluster.id))
    cluster_ids = list(session.execute(clusters).scalars())
    session.rollback()  # no transaction held between batches (SQLite's write lock)
    deleted, batches = 0, 0
    for cluster_id in cluster_ids:
        after: datetime | None = None  # the last batch's newest sample: kept rows not rescanned
        while max_batches is None or batches < max_batches:
            # Each batch walks the (cluster_id, at) index from where the last one stopped.
            in_range = [
                col(TelemetrySample.cluster_id) == cluster_id,
                col(TelemetrySample.at) < cutoff,
                col(TelemetrySample.metric).in_(metrics),
            ]
            if after is not None:
                in_range.append(col(TelemetrySample.at) > after)
            oldest = (
                sa.select(col(TelemetrySample.at))
                .where(*in_range)
                .order_by(col(TelemetrySample.at))
                .limit(batch)
                .subquery()
            )
            newest = session.execute(sa.select(sa.func.max(oldest.c.at))).scalar_one_or_none()
            if newest is None:
                session.rollback()
                break
            # Every sample up to the batch's newest instant (a few more than ``batch``
            # where several share it), so the next batch starts strictly after it.
            result = session.execute(
                sa.delete(TelemetrySample)
                .where(*in_range, col(TelemetrySample.at) <= newest)
                .execution_options(synchronize_session=False)
            )
            session.commit()
            deleted += cast("CursorResult[Any]", result).rowcount
            batches += 1
            after = newest
    return deleted


# The hourly task compacts the roll-up over this much before the cutoff (the hour that
# just passed it, newest first, and a beat that was down for up to a day); older rows
# left over (a database pruned before compaction existed, a beat down for longer) go with
# ``shaper db prune-samples``, which compacts all of the history.
COMPACT_LOOKBACK = timedelta(days=1)
_PERIOD_US = LEVELS_US[0]
# The roll-up's dimensions (``utilization_rollups.dimension``), each compacted in turn.
DIMENSIONS = ("cluster", "gpu_model", "team")
_SUMS = ("gpus", "opened", "closed", "samples", "sample_sum")
_GROUP = "dimension, cluster_id, gpu_model_id, team"
# An exact-instant row of [lo, hi) that compaction moves: not at a period's start (kept:
# read as the instant ``since``) nor 1 µs after it (compaction's own row).
_MOVED = (
    f"dimension = :dimension AND period_us = {EXACT_US}"
    " AND period_start_us >= :lo AND period_start_us < :hi"
    f" AND period_start_us % {_PERIOD_US} > 1"
)
_COMPACT = sa.text(
    f"INSERT INTO utilization_rollups ({_GROUP}, period_us, period_start_us, gpu_us,"
    f" {', '.join(_SUMS)})"
    f" SELECT {_GROUP}, {EXACT_US}, period_start_us / {_PERIOD_US} * {_PERIOD_US} + 1, 0,"
    f" {', '.join(f'SUM({c})' for c in _SUMS)} FROM utilization_rollups WHERE {_MOVED}"
    " AND cluster_id IN :clusters"
    f" GROUP BY {_GROUP}, period_start_us / {_PERIOD_US}"
    " HAVING " + " OR ".join(f"SUM({c}) <> 0" for c in _SUMS) +
    " ON CONFLICT (dimension, cluster_id, gpu_model_id, team, period_us, period_start_us)"
    " DO UPDATE SET " + ", ".join(f"{c} = utilization_rollups.{c} + excluded.{c}" for c in _SUMS)
).bindparams(sa.bindparam("clusters", expanding=True))  # fmt: skip
_DELETE = sa.text(
    f"DELETE FROM utilization_rollups WHERE {_MOVED} AND cluster_id IN :clusters"
).bindparams(sa.bindparam("clusters", expanding=True))
# Where a batch of ``batch`` exact-instant rows back from ``hi`` begins.
_NTH = sa.text(
    "SELECT period_start_us FROM utilization_rollups WHERE dimension = :dimension"
    f" AND period_us = {EXACT_US} AND period_start_us >= :lo AND period_start_us < :hi"
    " ORDER BY period_start_us DESC LIMIT 1 OFFSET :skip"
)


def compact_rollups(
    *,
    session: Session,
    before: datetime,
    after: datetime | None = None,
    batch: int = BATCH,
    max_batches: int | None = MAX_BATCHES,
) -> int:
    """Compact the roll-up's exact-instant rows of the whole 16 s periods between
    ``after`` (None: the oldest) and ``before`` (see the module's docstring), newest
    first (a run cut short by ``max_batches`` has done the periods that just expired),
    about ``batch`` rows a transaction; returns how many rows it moved.

    The three dimensions take batches in turn, one each a round, so ``max_batches`` is
    shared fairly: one dimension with far more rows (``team``, on a site of many teams)
    cannot spend it all and leave the others uncompacted run after run. A dimension that
    is done gives its turns to the others.

    Idempotent, and any part of it may run again: a compacted period holds no row to
    move. On PostgreSQL each batch holds the folder's lock (the only other writer of the
    roll-up) and leaves alone the rows of a cluster whose row is locked FOR UPDATE (a
    deletion, a job set's move; an ingest's lock lets it through), as the fold does; the
    next run finds them."""
    postgres = session.get_bind().dialect.name == "postgresql"
    end = to_us(before) // _PERIOD_US * _PERIOD_US
    start = 0 if after is None else max(0, to_us(after) // _PERIOD_US * _PERIOD_US)
    session.rollback()  # no transaction held between batches (SQLite's write lock)
    removed, batches = 0, 0
    # Per dimension, where its next batch ends (its rows below are still to do).
    pending = {dimension: end for dimension in DIMENSIONS if start < end}
    while pending and (max_batches is None or batches < max_batches):
        for dimension, hi in list(pending.items()):
            if max_batches is not None and batches >= max_batches:
                break
            bounds = {"dimension": dimension, "lo": start, "hi": hi}
            nth = session.execute(_NTH, {**bounds, "skip": batch - 1}).scalar_one_or_none()
            # Whole periods only: from the start of the batch's oldest row's period.
            lo = start if nth is None else max(start, nth // _PERIOD_US * _PERIOD_US)
            clusters = sa.select(col(Cluster.id))
            if postgres:
                session.execute(sa.select(sa.func.pg_advisory_xact_lock(ROLLUP_FOLD_LOCK_KEY)))
                # Held FOR KEY SHARE (``read`` and ``key_share``; ``key_share`` alone is FOR
                # NO KEY UPDATE, which held every cluster's row from its connector's
                # ingest until the batch committed): the new rows' foreign key check then
                # waits for nothing, and a cluster being deleted is skipped.
                clusters = clusters.with_for_update(read=True, key_share=True, skip_locked=True)
            cluster_ids = list(session.execute(clusters).scalars())
            if cluster_ids:
                parameters = {**bounds, "lo": lo, "clusters": cluster_ids}
                session.execute(_COMPACT, parameters)
                result = session.execute(_DELETE, parameters)
                removed += cast("CursorResult[Any]", result).rowcount
            session.commit()
            batches += 1
            if start < lo:
                pending[dimension] = lo
            else:
                del pending[dimension]
    return removed
