"""Each GPU's latest sample (``gpu_latest_samples``), kept by the writers of samples: the
connector's ingest (``app.telemetry.ingest``) and the node agents' samples
(``app.telemetry.service.record_node_samples``), in their own transaction, right after
the samples themselves. The cluster map reads it (``app.nodes.cluster_map``).

One upsert per write, whatever its size: a row is replaced only by a sample at least as
new (``excluded.at >= gpu_latest_samples.at``), so a sample that arrives late never hides
a newer one, and two writers of the same GPU (a connector and the node's agent) leave
the newer of their samples whichever commits last. Rows are written in key order: two
transactions upserting the same rows wait for each other, never deadlock.

A writer inserts its samples first: on PostgreSQL that takes the cluster row's key-share
lock (the samples' foreign key), which the ingest's lock of the cluster row (FOR NO KEY
UPDATE, ``app.telemetry.ingest._lock_cluster``) lets through, so a node agent never
waits for an ingest before writing here; the two meet only on rows here, taken in key
order. (With a FOR UPDATE of the cluster row, an agent holding a row here while it waited
for the ingest's cluster lock, and the ingest waiting for the row, would deadlock.)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from sqlmodel import Session

from app.telemetry.models import NODE_WIDE, GpuLatestSample
from wire.telemetry import Metric

LATEST = GpuLatestSample.__table__  # type: ignore[attr-defined]
# The metrics the map shows: the only ones kept here.
KEPT_METRICS = frozenset({Metric.gpu_util.value, Metric.gpu_mem_used_gib.value})

_Key = tuple[int, int, str, int]

_INSERT = "INSERT INTO gpu_latest_samples (cluster_id, node_id, metric, gpu_index, at, value)"
_ON_CONFLICT = (
    " ON CONFLICT (cluster_id, node_id, metric, gpu_index) DO UPDATE"
    " SET at = excluded.at, value = excluded.value"
    " WHERE excluded.at >= gpu_latest_samples.at"
)
# PostgreSQL: the rows as one array per column, unnested into one INSERT (an executemany
# of 20,000 upserts is a round trip each, even pipelined); the arrays sent in binary
# (``%b``): psycopg's text form of 20,000-element arrays cost four times the CPU.
_POSTGRES_UPSERT = (
    _INSERT + " SELECT * FROM unnest(%b::integer[], %b::integer[], %b::varchar[],"
    " %b::integer[], %b::timestamptz[], %b::float8[])" + _ON_CONFLICT
)
# SQLite: run once per row by the driver.
_SQLITE_UPSERT = _INSERT + " VALUES (?, ?, ?, ?, ?, ?)" + _ON_CONFLICT


def newest(samples: Iterable[Mapping[str, Any]]) -> dict[_Key, tuple[datetime, float]]:
    """The newest of ``samples`` (rows of ``telemetry_samples`` as dicts, in the order they
    are written) per GPU and kept metric; of two with the same ``at``, the later one."""
    kept: dict[_Key, tuple[datetime, float]] = {}
    for sample in samples:
        node_id = sample["node_id"]
        metric = sample["metric"]
        if node_id is None or metric not in KEPT_METRICS:
            continue
        index = sample["gpu_index"]
        key = (sample["cluster_id"], node_id, metric, NODE_WIDE if index is None else index)
        at = sample["at"]
        held = kept.get(key)
        if held is None or at >= held[0]:
            kept[key] = (at, sample["value"])
    return kept


def keep_latest(session: Session, samples: Iterable[Mapping[str, Any]]) -> int:
    """Upsert the newest of ``samples`` (just inserted, in this transaction) into
    ``gpu_latest_samples``; returns how many rows it offered (one per GPU and metric)."""
    rows = sorted(newest(samples).items())
    if not rows:
        return 0
    connection = session.connection()
    if connection.dialect.name == "postgresql":
        flat = ((*key, at, value) for key, (at, value) in rows)
        columns = [list(column) for column in zip(*flat, strict=True)]
        # On the session's connection, in its transaction (as app.telemetry.ingest._rows).
        raw = connection.connection.driver_connection
        assert raw is not None
        with raw.cursor() as cursor:
            cursor.execute(_POSTGRES_UPSERT, columns)
        return len(rows)
    # SQLite: the values as it stores them (the column type's own conversion, once per
    # distinct time: a push's samples share a few), without SQLAlchemy's handling of
    # 20,000 parameter sets.
    dialect = connection.dialect
    to_stored = LATEST.c.at.type.dialect_impl(dialect).bind_processor(dialect)
    assert to_stored is not None  # UtcDateTime: naive UTC text there, six digits of µs
    stored: dict[datetime, Any] = {}
    values = []
    for key, (at, value) in rows:
        when = stored.get(at)
        if when is None:
            when = stored[at] = to_stored(at)
        values.append((*key, when, value))
    connection.exec_driver_sql(_SQLITE_UPSERT, values)
    return len(rows)
