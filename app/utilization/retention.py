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
