"""Telemetry, as the API, the tasks and the demo use it: read a connector's push
(:func:`parse_push`), ingest it (:func:`ingest`: the pipeline is ``app.telemetry.ingest``,
one transaction, idempotent by sequence number), flag connectors that went silent, and store
a node agent's samples of its own node; read services' hourly mean demand
(:func:`hourly_demand`: the shaping cycle's forecasts and their scoring).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, cast

import sqlalchemy as sa
from pydantic import TypeAdapter
from sqlalchemy.engine import CursorResult
from sqlmodel import Session, col, select

from app.clusters.models import Cluster, ConnectorStatus
from app.core.bulk import insert_rows
from app.core.errors import Invalid
from app.core.gc_pause import paused_gc
from app.core.lookup import found
from app.nodes.models import Node
from app.telemetry import latest, physics
from app.telemetry.ingest import SAMPLES, ingest_push
from app.telemetry.models import TelemetrySample
from wire.telemetry import (
    Metric,
    SampleReport,
    TelemetryAck,
    TelemetryDelta,
    TelemetryPush,
    TelemetrySnapshot,
)

# Built once: a validator is compiled from the schema when the adapter is made.
_PUSH: TypeAdapter[TelemetrySnapshot | TelemetryDelta] = TypeAdapter(TelemetryPush)


def parse_push(body: bytes) -> TelemetrySnapshot | TelemetryDelta:
    """A request body (JSON bytes) → a validated snapshot or delta, the way the API route
    reads it: pydantic-core parses and validates in one pass, with the collector paused.
    Raises ``pydantic.ValidationError`` (malformed JSON included)."""
    with paused_gc():
        return _PUSH.validate_json(body)


def ingest(
    *,
    session: Session,
    cluster_name: str,
    push: TelemetrySnapshot | TelemetryDelta,
    now: datetime,
) -> TelemetryAck:
    """One push through the pipeline (``app.telemetry.ingest``), with the collector paused
    as for :func:`parse_push`."""
    with paused_gc():
        return ingest_push(session, cluster_name, push, now)


def mark_stale_connectors(*, session: Session, now: datetime, stale_after_s: int) -> int:
    """Flag clusters whose connector has been silent for ``stale_after_s``; returns how many.

    One conditional UPDATE, not a read then a write: a push that lands in between (its
    ingest sets the cluster connected and seen now) would otherwise be overwritten as
    stale until the next push. The UPDATE waits for an ingest holding the row and then
    checks the row as that ingest left it."""
    cutoff = now - timedelta(seconds=stale_after_s)
    result = session.execute(
        sa.update(Cluster)
        .where(
            col(Cluster.connector_status) == ConnectorStatus.connected,
            col(Cluster.last_seen_at) < cutoff,
        )
        .values(connector_status=ConnectorStatus.stale)
        .execution_options(synchronize_session=False)
    )
    session.commit()
    return int(cast("CursorResult[Any]", result).rowcount)


NODE_METRICS = frozenset(
    {Metric.gpu_util, Metric.gpu_mem_used_gib, Metric.cpu_util, Metric.mem_used_mib}
)


def record_node_samples(
    *,
    session: Session,
    cluster_name: str,
    node_name: str,
    samples: list[SampleReport],
    now: datetime,
) -> int:
    """Store a node agent's measurements of its own node; all or nothing. The samples are
    held to the same bounds and time window as a connector's (``physics.check_sample``)."""
    cluster = found(
        session.exec(select(Cluster).where(Cluster.name == cluster_name)).first(),
        f"cluster {cluster_name!r} is not registered",
        resource="cluster",
        resource_id=cluster_name,
    )
    node = found(
        session.exec(
            select(Node).where(Node.cluster_id == cluster.id, Node.name == node_name)
        ).first(),
        f"node {node_name!r} is not known in cluster {cluster_name!r} (its "
        "connector reports nodes)",
        resource="node",
        resource_id=node_name,
    )
    for i, sample in enumerate(samples):
        if sample.metric not in NODE_METRICS:
            raise Invalid(
                f"{sample.metric.value} is not a node metric", field=f"samples[{i}].metric"
            )
        if sample.node != node_name:
            raise Invalid(
                f"sample is about {sample.node!r}, not this node {node_name!r}",
                field=f"samples[{i}].node",
            )
        physics.check_sample(
            sample,
            f"samples[{i}]",
            now=now,
            node_gpus={node_name: node.gpu_count},
            job_names=None,
        )
    rows = [
        {
            "cluster_id": cluster.id,
            "at": s.at,
            "metric": s.metric.value,
            "value": s.value,
            "node_id": node.id,
            "gpu_index": s.gpu_index,
            "job_id": None,
        }
        for s in samples
    ]
    insert_rows(session, SAMPLES, rows)
    latest.keep_latest(session, rows)  # after the samples: see app.telemetry.latest
    session.commit()
    return len(rows)


def hourly_demand(
    *, session: Session, job_ids: list[int], since: datetime, until: datetime, step_s: int = 3600
) -> dict[int, list[tuple[datetime, float]]]:
    """Per service: the mean of its ``demand_replicas`` samples over each ``step_s`` step
    of [since, until) that has any (the step's start, its mean), oldest first; ``since``
    is a step's start. Means are taken in the database: a week of 30-second samples of
    hundreds of services would be millions of rows."""
    if not job_ids:
        return {}
    # extract(epoch) compiles to EXTRACT on PostgreSQL and strftime('%s') on SQLite;
    # PostgreSQL's cast rounds, SQLite's truncates (= floor here, as offsets are ≥ 0).
    scaled = (sa.extract("epoch", col(TelemetrySample.at)) - since.timestamp()) / step_s
    postgres = session.connection().dialect.name == "postgresql"
    step_index = sa.func.floor(scaled) if postgres else sa.cast(scaled, sa.Integer)
    query = (
        sa.select(col(TelemetrySample.job_id), step_index, sa.func.avg(col(TelemetrySample.value)))
        .where(
            col(TelemetrySample.job_id).in_(job_ids),
            col(TelemetrySample.metric) == Metric.demand_replicas.value,
            col(TelemetrySample.at) >= since,
            col(TelemetrySample.at) < until,
        )
        .group_by(col(TelemetrySample.job_id), step_index)
        .order_by(col(TelemetrySample.job_id), step_index)
    )
    means: dict[int, list[tuple[datetime, float]]] = {}
    for job_id, index, mean in session.execute(query):
        at = since + timedelta(seconds=int(index) * step_s)
        means.setdefault(job_id, []).append((at, float(mean)))
    return means
