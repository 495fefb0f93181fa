"""The telemetry ingest pipeline: one connector push (a snapshot or a delta) fenced,
checked against what can be true of a cluster, and written as the rows it changes.

It is apart from ``app.telemetry.service`` (the functions the route, the tasks and the
demo call) because it is the hot path that ``bench.ingest`` and ``bench.deltas`` time:
bulk SQL on the tables themselves, not the ORM, and its own notion of which stored rows
a push touches (``_Scope``).

Algorithm (one transaction; nothing is written unless every check passes):

1. Lock the cluster row and fence the push (``fencing.admit``): a superseded connector
   session is refused (409 ``stale_session``); a replayed ``(session, seq)`` with the same
   content is acknowledged as a duplicate without writing, with other content refused (409
   ``replay_mismatch``); an older seq never accepted is refused (409 ``out_of_order``); a
   delta that does not follow the last accepted push of the live session raises
   ``SnapshotRequired`` (409); a snapshot from a new session takes the cluster over.
2. Check the push against what can be true of a cluster (``physics.check_push``): known
   GPU models, nodes and jobs; times in order and in a window around now; bounded numbers;
   allocations only of running/suspended jobs, on nodes that are not down, within what the
   job requested, and per node within its GPUs with no GPU held twice — for a delta,
   merged with the stored open allocations. Errors name the field
   (``jobs[12].allocations[0].node``), HTTP 422.
   A delta is checked and written against the stored rows it names or touches (its nodes
   and jobs, the nodes its allocations sit on, the other jobs' open allocations there, the
   nodes and jobs its samples name): its cost follows the delta, not the cluster
   (``_Scope``). A snapshot reads the whole cluster.
3. Diff against the stored state and write only what changed: new rows by bulk insert,
   changed rows by bulk update (an elastic training job's replica range, once reported,
   is kept while later reports of it give none: Slurm forgets a job's node range when it
   starts, ``_kept_range``); a snapshot marks vanished nodes ``down`` and vanished jobs
   ``finished``; allocations that changed are closed (``released_at``) and reopened, so the
   allocation table keeps the placement history.
4. Store samples, and each GPU's newest of them in ``gpu_latest_samples``
   (``app.telemetry.latest``: what the cluster map reads); record the sequence, its
   digest, the session and connector status (``fencing.record``).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel import Session, select

from app.clusters.models import Cluster, ConnectorStatus
from app.core.bulk import insert_rows, insert_tuples, json_text, update_rows, update_tuples
from app.core.lookup import found
from app.gpu_models import service as gpu_model_service
from app.jobs.models import Allocation, Job
from app.nodes.models import Node
from app.telemetry import fencing, latest, physics
from app.telemetry.model_names import spelt_as_catalogue
from app.telemetry.models import TelemetrySample
from wire.telemetry import (
    TERMINAL_JOB_STATES,
    JobReport,
    JobShape,
    JobState,
    NodeReport,
    NodeState,
    TelemetryAck,
    TelemetryDelta,
    TelemetrySnapshot,
)

NODES = Node.__table__  # type: ignore[attr-defined]
JOBS = Job.__table__  # type: ignore[attr-defined]
ALLOCATIONS = Allocation.__table__  # type: ignore[attr-defined]
SAMPLES = TelemetrySample.__table__  # type: ignore[attr-defined]

_NODE_FIELDS = ("gpu_model_id", "gpu_count", "cpu_cores", "memory_mib", "labels", "state")
_JOB_FIELDS = (
    "name", "team", "queue", "kind", "shape", "priority", "sla_class", "gpus_requested",
    "allowed_gpu_models", "min_gpu_memory_gib", "required_precision", "gang_size",
    "checkpointable", "min_replicas", "max_replicas", "replicas", "submit_time", "start_time",
    "end_time", "state", "reason", "restart_count", "required_nodes", "submit_spec",
    "residency", "time_limit_s", "replicas_movable", "speeds",
)  # fmt: skip
_JOB_JSON_FIELDS = frozenset({"allowed_gpu_models", "required_nodes", "residency", "speeds"})
_JOB_STATE = _JOB_FIELDS.index("state")
_JOB_SHAPE = _JOB_FIELDS.index("shape")
_TERMINAL = frozenset(s.value for s in TERMINAL_JOB_STATES)
_JOB_RANGE = slice(_JOB_FIELDS.index("min_replicas"), _JOB_FIELDS.index("replicas") + 1)
assert _JOB_FIELDS[_JOB_RANGE.start : _JOB_RANGE.stop] == (
    "min_replicas",
    "max_replicas",
    "replicas",
)
_JOB_INSERT_COLUMNS = ("cluster_id", "external_id", *_JOB_FIELDS, "updated_at")
_JOB_UPDATE_COLUMNS = ("id", *_JOB_FIELDS, "updated_at")
_ALLOCATION_COLUMNS = ("job_id", "node_id", "gpu_indices", "gpu_count", "started_at")


# A delta naming more stored rows than this reads the whole cluster instead (a superset is
# always correct): an IN list that long costs about as much, and SQLite bounds the number
# of parameters of a statement.
_NAMED_LIMIT = 5000


@dataclass(frozen=True)
class _Scope:
    """The stored rows a push is checked and written against. ``None``: the whole cluster
    (a snapshot replaces it; a very large delta); else the names (possibly a few more).

    For a delta: ``nodes`` are the nodes it reports or removes, those its allocations sit
    on and those its samples name; ``jobs`` the jobs it reports or removes and those its
    samples name; ``holding_nodes`` the nodes whose occupancy it can change (reported,
    removed, allocated on), whose other open allocations count in the merged check."""

    nodes: frozenset[str] | None
    jobs: frozenset[str] | None
    holding_nodes: frozenset[str]

    @staticmethod
    def of(push: TelemetrySnapshot | TelemetryDelta) -> _Scope:
        if isinstance(push, TelemetrySnapshot):
            return _Scope(None, None, frozenset())
        holding = {n.name for n in push.nodes} | set(push.removed_nodes)
        holding |= {a.node for job in push.jobs for a in job.allocations}
        nodes = holding | {s.node for s in push.samples if s.node is not None}
        jobs = {j.external_id for j in push.jobs} | set(push.removed_jobs)
        jobs |= {s.job for s in push.samples if s.job is not None}
        return _Scope(_bounded(nodes), _bounded(jobs), frozenset(holding))


def _bounded(names: set[str]) -> frozenset[str] | None:
    return frozenset(names) if len(names) <= _NAMED_LIMIT else None


def _named(column: sa.ColumnElement[Any], names: Collection[Any] | None) -> sa.ColumnElement[bool]:
    """``column IN names``; no condition when ``names`` is None (the whole cluster)."""
    return sa.true() if names is None else column.in_(sorted(names))


def ingest_push(
    session: Session, cluster_name: str, push: TelemetrySnapshot | TelemetryDelta, now: datetime
) -> TelemetryAck:
    """One push through the pipeline above, in one transaction; the caller pauses the
    garbage collector (``service.ingest``)."""
    cluster = _lock_cluster(session, cluster_name)
    ack = TelemetryAck(cluster=cluster.name, seq=push.seq)
    content_digest = fencing.digest(push)
    admission = fencing.admit(cluster, push, content_digest)
    if admission.duplicate:
        session.rollback()
        return ack.model_copy(update={"duplicate": True})

    cluster_id: int = cluster.id  # type: ignore[assignment]
    scope = _Scope.of(push)
    catalogue = gpu_model_service.ids_by_name(session=session)
    push = spelt_as_catalogue(push, catalogue)
    stored_nodes = _stored_nodes(session, cluster_id, scope.nodes)
    stored_jobs = _stored_jobs(session, cluster_id, scope.jobs)
    physics.check_push(
        push,
        now=now,
        catalogue=catalogue,
        stored_nodes={name: (row["gpu_count"], row["state"]) for name, row in stored_nodes.items()},
        stored_jobs=stored_jobs.keys(),
        stored_holdings=_stored_holdings(session, cluster_id, scope.holding_nodes, stored_nodes),
    )

    nodes_written, node_ids = _write_nodes(
        session, cluster_id, push, stored_nodes, catalogue, now, scope.nodes
    )
    jobs_written, jobs_finished, job_ids, placements = _write_jobs(
        session, cluster_id, push, stored_jobs, node_ids, now, scope.jobs
    )
    allocations_written = _write_allocations(
        session,
        cluster_id,
        placements,
        job_ids,
        finished=jobs_finished,
        now=now,
        whole_cluster=scope.jobs is None,
    )
    samples = _sample_rows(push, cluster_id, node_ids, job_ids)
    samples_written = insert_rows(session, SAMPLES, samples)
    latest.keep_latest(session, samples)

    fencing.record(cluster, push, content_digest, admission=admission, now=now)
    cluster.last_seen_at = now
    cluster.connector_status = ConnectorStatus.connected
    session.add(cluster)
    session.commit()
    return ack.model_copy(
        update={
            "nodes_written": nodes_written,
            "jobs_written": jobs_written,
            "jobs_finished": len(jobs_finished),
            "allocations_written": allocations_written,
            "samples_written": samples_written,
        }
    )


def _lock_cluster(session: Session, name: str) -> Cluster:
    """The cluster's row, locked: pushes of one cluster take turns (``fencing.admit`` reads
    and writes its fencing state). FOR NO KEY UPDATE (``key_share``), not FOR UPDATE: a
    row inserted elsewhere that points at the cluster (an action a saga or an operator
    adds, a moved job's arrival, a sample) checks its foreign key with a key-share lock on
    this row, which FOR UPDATE would make wait for the whole ingest — while that
    transaction held a job or node row the ingest updates next (a saga ending a start
    holds its job; a drain holds its node): a deadlock. Deleting the cluster still
    excludes an ingest (DELETE locks the row FOR UPDATE)."""
    query = select(Cluster).where(Cluster.name == name).with_for_update(key_share=True)
    cluster = session.exec(query).first()
    return found(
        cluster, f"cluster {name!r} is not registered", resource="cluster", resource_id=name
    )


def _rows(session: Session, query: sa.Select[Any]) -> Sequence[Sequence[Any]]:
    """A SELECT's rows as plain tuples. On PostgreSQL they come straight from psycopg, in
    the session's transaction: for 20,000 rows SQLAlchemy's Row objects and result
    processors cost more than the query. Values differ only in form (aware datetimes in
    the server's time zone instead of UTC), never in what they compare equal to."""
    connection = session.connection()
    if connection.dialect.name != "postgresql":
        return session.execute(query).all()
    # render_postcompile: an IN list's values become plain parameters psycopg can take.
    compiled = query.compile(
        dialect=connection.dialect, compile_kwargs={"render_postcompile": True}
    )
    raw = connection.connection.driver_connection
    assert raw is not None
    with raw.cursor() as cursor:
        cursor.execute(str(compiled), compiled.params)
        rows: list[tuple[Any, ...]] = cursor.fetchall()
    return rows


def _stored_nodes(
    session: Session, cluster_id: int, names: Collection[str] | None
) -> dict[str, dict[str, Any]]:
    """name → the stored node (id and ``_NODE_FIELDS``), of ``names`` (None: all)."""
    if names is not None and not names:
        return {}
    columns = [NODES.c.id, NODES.c.name, *(NODES.c[f] for f in _NODE_FIELDS)]
    query = sa.select(*columns).where(NODES.c.cluster_id == cluster_id, _named(NODES.c.name, names))
    return {row.name: dict(row._mapping) for row in session.execute(query)}


def _json_text(column: sa.ColumnElement[Any]) -> sa.ColumnElement[str]:
    """A JSON column as compact text (no spaces), the form ``json_text`` writes: stored
    and reported values are then compared as strings, without decoding 20,000 documents."""
    return sa.func.replace(sa.cast(column, sa.Text), " ", "")


def _int_list_json(values: list[int]) -> str:
    """``json_text`` of a list of ints, without the encoder's per-call set-up."""
    return "[" + ",".join(map(str, values)) + "]"


def _stored_jobs(
    session: Session, cluster_id: int, external_ids: Collection[str] | None
) -> dict[str, tuple[int, tuple[Any, ...]]]:
    """external_id → (id, the _JOB_FIELDS values, JSON fields as compact text), of
    ``external_ids`` (None: all)."""
    if external_ids is not None and not external_ids:
        return {}
    columns = [_json_text(JOBS.c[f]) if f in _JOB_JSON_FIELDS else JOBS.c[f] for f in _JOB_FIELDS]
    query = sa.select(JOBS.c.id, JOBS.c.external_id, *columns).where(
        JOBS.c.cluster_id == cluster_id, _named(JOBS.c.external_id, external_ids)
    )
    return {row[1]: (row[0], tuple(row[2:])) for row in _rows(session, query)}


def _stored_holdings(
    session: Session,
    cluster_id: int,
    touched: Collection[str],
    stored_nodes: dict[str, dict[str, Any]],
) -> list[physics.StoredHolding]:
    """For a delta, the open allocations (of any job) on the stored nodes it touches; a
    snapshot (``touched`` empty) replaces them all, so it is judged alone. The rest of the
    cluster cannot conflict with a delta. ``stored_nodes`` holds at least the touched ones
    that are stored (a node not stored holds nothing)."""
    names = {row["id"]: name for name, row in stored_nodes.items() if name in touched}
    if not names:
        return []
    node_ids = _bounded_ids(names)
    # The nodes' ids name this cluster's rows already; without the redundant condition on
    # jobs.cluster_id, PostgreSQL joins by the jobs' primary key even on tables it has
    # not analysed yet (right after a first snapshot), instead of scanning the cluster.
    where = (
        JOBS.c.cluster_id == cluster_id if node_ids is None else ALLOCATIONS.c.node_id.in_(node_ids)
    )
    query = (
        sa.select(
            JOBS.c.external_id,
            ALLOCATIONS.c.node_id,
            ALLOCATIONS.c.gpu_indices,
            ALLOCATIONS.c.gpu_count,
        )
        .join(JOBS, JOBS.c.id == ALLOCATIONS.c.job_id)
        .where(ALLOCATIONS.c.released_at.is_(None), where)
        # In the order they were placed: a refusal then names the same holder whatever
        # plan the database picks.
        .order_by(ALLOCATIONS.c.id)
    )
    return [
        physics.StoredHolding(job, names[node_id], tuple(indices or ()), count)
        for job, node_id, indices, count in session.execute(query)
        if node_id in names
    ]


def _bounded_ids(ids: Collection[int]) -> list[int] | None:
    return sorted(ids) if len(ids) <= _NAMED_LIMIT else None


def _node_values(report: NodeReport, catalogue: dict[str, int]) -> dict[str, Any]:
    return {
        "gpu_model_id": catalogue[report.gpu_model] if report.gpu_model else None,
        "gpu_count": report.gpu_count,
        "cpu_cores": report.cpu_cores,
        "memory_mib": report.memory_mib,
        "labels": dict(report.labels),
        "state": report.state,
    }


def _write_nodes(
    session: Session,
    cluster_id: int,
    push: TelemetrySnapshot | TelemetryDelta,
    stored: dict[str, dict[str, Any]],
    catalogue: dict[str, int],
    now: datetime,
    scope: Collection[str] | None,
) -> tuple[int, dict[str, int]]:
    """Writes the nodes; returns how many rows changed and the ids of the stored nodes in
    ``scope`` (None: all), new ones included."""
    inserts: list[dict[str, Any]] = []
    updates: list[dict[str, Any]] = []
    for report in push.nodes:
        values = _node_values(report, catalogue)
        row = stored.get(report.name)
        if row is None:
            inserts.append(
                {"cluster_id": cluster_id, "name": report.name, **values, "updated_at": now}
            )
        elif any(row[f] != values[f] for f in _NODE_FIELDS):
            updates.append({"id": row["id"], **values, "updated_at": now})
    if isinstance(push, TelemetrySnapshot):
        vanished = set(stored) - {n.name for n in push.nodes}
    else:
        vanished = set(push.removed_nodes) & set(stored)
    for name in vanished:
        if stored[name]["state"] != NodeState.down.value:
            updates.append(
                {
                    "id": stored[name]["id"],
                    **{f: stored[name][f] for f in _NODE_FIELDS},
                    "state": NodeState.down.value,
                    "updated_at": now,
                }
            )
    insert_rows(session, NODES, inserts)
    update_rows(session, NODES, updates)
    ids = {name: row["id"] for name, row in stored.items()}
    if inserts:
        query = sa.select(NODES.c.id, NODES.c.name).where(
            NODES.c.cluster_id == cluster_id, _named(NODES.c.name, scope)
        )
        ids = {name: id_ for id_, name in session.execute(query)}
    return len(inserts) + len(updates), ids


def _job_row(report: JobReport) -> tuple[Any, ...]:
    """The ``_JOB_FIELDS`` values of a report, JSON fields as compact text: the form
    ``_stored_jobs`` reads back (so the two compare as tuples) and the form COPY sends.

    Enum members are str subclasses: stored as their value and equal to it, without the
    cost of ``.value`` on 20,000 rows."""
    return (
        report.name,
        report.team,
        report.queue,
        report.kind,
        report.shape,
        report.priority,
        report.sla_class,
        report.gpus_requested,
        json_text(report.allowed_gpu_models),
        report.min_gpu_memory_gib,
        report.required_precision,
        report.gang_size,
        report.checkpointable,
        report.min_replicas,
        report.max_replicas,
        report.replicas,
        report.submit_time,
        report.start_time,
        report.end_time,
        report.state,
        report.reason,
        report.restart_count,
        json_text(report.required_nodes),
        report.submit.model_dump_json() if report.submit is not None else None,
        report.residency.model_dump_json() if report.residency is not None else None,
        report.time_limit_s,
        report.replicas_movable,
        # Sorted: the stored text is compared with the next report's, whatever order its
        # connector read the models in.
        json_text(dict(sorted(report.speeds.items()))),
    )


def _kept_range(values: tuple[Any, ...], stored: tuple[Any, ...]) -> tuple[Any, ...]:
    """``values`` with the stored replica range of an elastic training job whose report
    gives none (a block job with ``max_replicas`` 0 that was stored with one): Slurm
    reports the range of ``sbatch --nodes=MIN-MAX`` only while the job waits, and a job
    Shaper restarted at a new size is pinned to that size there."""
    if values[_JOB_SHAPE] != JobShape.block or values[_JOB_RANGE][1]:
        return values
    if stored[_JOB_SHAPE] != JobShape.block or not stored[_JOB_RANGE][1]:
        return values
    if stored[_JOB_STATE] in _TERMINAL:
        return values  # an id a scheduler gave again to a new job
    return (*values[: _JOB_RANGE.start], *stored[_JOB_RANGE], *values[_JOB_RANGE.stop :])


# A job's placements: (node id, GPU indices as compact JSON text, GPU count).
_Placements = dict[str, set[tuple[int, str, int]]]


def _write_jobs(
    session: Session,
    cluster_id: int,
    push: TelemetrySnapshot | TelemetryDelta,
    stored: dict[str, tuple[int, tuple[Any, ...]]],
    node_ids: dict[str, int],
    now: datetime,
    scope: Collection[str] | None,
) -> tuple[int, set[int], dict[str, int], _Placements]:
    """Writes the jobs; returns how many rows changed, the ids of vanished jobs now
    finished, the id of every job in ``scope`` (None: all) by external id, and the
    reported placements by external id (worked out in the same pass, while the server
    indexes the rows already sent)."""
    updates: list[tuple[Any, ...]] = []
    placements: _Placements = {}

    def new_rows() -> Iterator[tuple[Any, ...]]:
        # Streamed into the COPY as they are made; changed rows are kept for the update.
        for report in push.jobs:
            values = _job_row(report)
            row = stored.get(report.external_id)
            if row is not None:
                values = _kept_range(values, row[1])
            if row is None:
                yield (cluster_id, report.external_id, *values, now)
            elif row[1] != values:
                updates.append((row[0], *values, now))
            placements[report.external_id] = {
                (node_ids[a.node], _int_list_json(sorted(a.gpu_indices)), a.gpus)
                for a in report.allocations
            }

    inserted = insert_tuples(session, JOBS, _JOB_INSERT_COLUMNS, new_rows())
    if isinstance(push, TelemetrySnapshot):
        gone: Iterable[str] = set(stored) - {j.external_id for j in push.jobs}
    else:
        gone = set(push.removed_jobs) & set(stored)
    finished = {stored[e][0] for e in gone if stored[e][1][_JOB_STATE] not in _TERMINAL}
    update_tuples(session, JOBS, _JOB_UPDATE_COLUMNS, updates)
    if finished:  # vanished: only state and end time change
        session.execute(
            JOBS.update()
            .where(JOBS.c.id.in_(finished))
            .values(
                state=JobState.finished.value,
                end_time=sa.func.coalesce(JOBS.c.end_time, now),
                updated_at=now,
            )
        )
    ids = {external_id: row[0] for external_id, row in stored.items()}
    if inserted:
        query = sa.select(JOBS.c.id, JOBS.c.external_id).where(
            JOBS.c.cluster_id == cluster_id, _named(JOBS.c.external_id, scope)
        )
        ids = {external_id: id_ for id_, external_id in _rows(session, query)}
    return inserted + len(updates) + len(finished), finished, ids, placements


def _write_allocations(
    session: Session,
    cluster_id: int,
    placements: _Placements,
    job_ids: dict[str, int],
    *,
    finished: set[int],
    now: datetime,
    whole_cluster: bool,
) -> int:
    """Closes the open allocations of the reported and finished jobs that the report no
    longer has, opens the new ones. ``whole_cluster``: read the open allocations of the
    whole cluster (a snapshot touches nearly every job), else those of these jobs only."""
    desired = {job_ids[external_id]: wanted for external_id, wanted in placements.items()}
    touched = set(desired) | finished
    open_rows: list[Sequence[Any]] = []
    if touched:
        query = sa.select(
            ALLOCATIONS.c.id,
            ALLOCATIONS.c.job_id,
            ALLOCATIONS.c.node_id,
            _json_text(ALLOCATIONS.c.gpu_indices),
            ALLOCATIONS.c.gpu_count,
        ).where(ALLOCATIONS.c.released_at.is_(None))
        only = None if whole_cluster else _bounded_ids(touched)
        if only is None:
            query = query.join(JOBS, JOBS.c.id == ALLOCATIONS.c.job_id).where(
                JOBS.c.cluster_id == cluster_id
            )
        else:
            query = query.where(ALLOCATIONS.c.job_id.in_(only))
        open_rows = [r for r in _rows(session, query) if r[1] in touched]
    release: list[int] = []
    kept: set[tuple[int, int, str, int]] = set()
    for allocation_id, job_id, node_id, indices_text, gpu_count in open_rows:
        key = (node_id, indices_text, gpu_count)
        if key in desired.get(job_id, set()):
            kept.add((job_id, *key))
        else:
            release.append(allocation_id)
    if release:
        session.execute(
            ALLOCATIONS.update().where(ALLOCATIONS.c.id.in_(release)).values(released_at=now)
        )
    inserts = (
        (job_id, node_id, indices, count, now)
        for job_id, placements in desired.items()
        for node_id, indices, count in placements
        if (job_id, node_id, indices, count) not in kept
    )
    return insert_tuples(session, ALLOCATIONS, _ALLOCATION_COLUMNS, inserts) + len(release)


def _sample_rows(
    push: TelemetrySnapshot | TelemetryDelta,
    cluster_id: int,
    node_ids: dict[str, int],
    job_ids: dict[str, int],
) -> list[dict[str, Any]]:
    return [
        {
            "cluster_id": cluster_id,
            "at": s.at,
            "metric": s.metric.value,
            "value": s.value,
            "node_id": node_ids[s.node] if s.node is not None else None,
            "gpu_index": s.gpu_index,
            "job_id": job_ids[s.job] if s.job is not None else None,
        }
        for s in push.samples
    ]
