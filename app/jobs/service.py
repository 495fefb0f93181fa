from __future__ import annotations

from collections import defaultdict
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import Mapped
from sqlmodel import Session, col

from app.clusters.models import Cluster
from app.core.db import plain_rows
from app.core.lookup import found
from app.core.paging import order_by_clauses
from app.jobs.models import Allocation, AllocationPublic, Job, JobPublic
from app.nodes.models import Node
from wire.telemetry import JobKind, JobShape, JobState

_SORTABLE: dict[str, Any] = {
    "priority": Job.priority,
    "submit_time": Job.submit_time,
    "start_time": Job.start_time,
    "end_time": Job.end_time,
    "gpus_requested": Job.gpus_requested,
    "external_id": Job.external_id,
    "name": Job.name,
    "team": Job.team,
    "state": Job.state,
    "cluster": Cluster.name,
    "updated_at": Job.updated_at,
}

# Every published column of ``jobs`` (JobPublic less the cluster's name and allocations).
_PUBLIC_COLUMNS = [
    Job.__table__.c[name]  # type: ignore[attr-defined]
    for name in JobPublic.model_fields
    if name not in ("cluster", "allocations")
]


def list_jobs(
    *,
    session: Session,
    cluster: str | None = None,
    state: JobState | None = None,
    team: str | None = None,
    queue: str | None = None,
    kind: JobKind | None = None,
    shape: JobShape | None = None,
    sort: str | None = None,
    limit: int = 100,
    offset: int = 0,
) -> dict[str, Any]:
    """A page of jobs as plain rows in ``Page[JobPublic]``'s shape (its items' allocations
    as rows too): the route validates them as it writes them
    (``app.api.responses.JsonAnswer``), without SQLModel's slower validation of each."""
    # The count reads ``jobs`` alone (a cluster's name becomes its id in a scalar
    # subquery): joining clusters for it cost a hash join of every job per request.
    conditions: list[sa.ColumnElement[bool]] = []
    if cluster is not None:
        cluster_id = sa.select(col(Cluster.id)).where(col(Cluster.name) == cluster)
        conditions.append(col(Job.cluster_id) == cluster_id.scalar_subquery())
    filters: dict[Mapped[Any], object] = {
        col(Job.state): state,
        col(Job.team): team,
        col(Job.queue): queue,
        col(Job.kind): kind,
        col(Job.shape): shape,
    }
    conditions += [column == value for column, value in filters.items() if value is not None]
    count = sa.select(sa.func.count()).select_from(Job).where(*conditions)
    total = int(session.connection().execute(count).scalar_one())
    order = order_by_clauses(sort, _SORTABLE, default=("-priority", "submit_time"))
    # Columns, not ORM entities: building 100 tracked ``Job`` objects and copying them into
    # ``JobPublic`` cost more than the query (and read ``submit_spec``, never published).
    query = (
        sa.select(*_PUBLIC_COLUMNS, col(Cluster.name).label("cluster"))
        .join(Cluster, col(Cluster.id) == Job.cluster_id)
        .where(*conditions)
        .order_by(*order, col(Job.id))
        .limit(limit)
        .offset(offset)
    )
    items = plain_rows(session, query)
    allocations = _open_allocation_rows(session, [row["id"] for row in items])
    for row in items:
        row["allocations"] = allocations.get(row["id"], [])
    return {"items": items, "total": total, "limit": limit, "offset": offset}


def get_job(*, session: Session, job_id: int) -> JobPublic:
    row = session.execute(
        sa.select(Job, col(Cluster.name))
        .join(Cluster, col(Cluster.id) == Job.cluster_id)
        .where(col(Job.id) == job_id)
    ).first()
    job, name = found(row, f"job {job_id} does not exist", resource="job", resource_id=job_id)
    return _public(job, name, _open_allocations(session, [job_id]).get(job_id, []))


def _open_allocations(session: Session, job_ids: list[int]) -> dict[int, list[AllocationPublic]]:
    return {
        job_id: [AllocationPublic.model_validate(row) for row in rows]
        for job_id, rows in _open_allocation_rows(session, job_ids).items()
    }


def _open_allocation_rows(session: Session, job_ids: list[int]) -> dict[int, list[dict[str, Any]]]:
    """Per job, its open allocations as ``AllocationPublic``'s fields."""
    if not job_ids:
        return {}
    query = (
        sa.select(
            col(Allocation.job_id),
            col(Node.name),
            col(Allocation.gpu_indices),
            col(Allocation.gpu_count),
            col(Allocation.started_at),
        )
        .join(Node, col(Node.id) == Allocation.node_id)
        .where(_one_of(session, col(Allocation.job_id), job_ids))
        .where(col(Allocation.released_at).is_(None))
    )
    result: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for job_id, node, indices, count, started in session.connection().execute(query).all():
        result[job_id].append(
            {"node": node, "gpu_indices": indices, "gpu_count": count, "started_at": started}
        )
    return result


def _one_of(session: Session, column: Any, ids: list[int]) -> sa.ColumnElement[bool]:
    """``column IN ids``; on PostgreSQL as ``= ANY(array)``, one parameter: a page's 100 ids
    as 100 parameters cost more to render and send than the query took to run."""
    condition: sa.ColumnElement[bool]
    if session.get_bind().dialect.name == "postgresql":
        condition = column == sa.any_(sa.bindparam("ids", ids, type_=postgresql.ARRAY(sa.Integer)))
    else:
        condition = column.in_(ids)
    return condition


def _public(job: Job, cluster: str, allocations: list[AllocationPublic]) -> JobPublic:
    return JobPublic.model_validate(job, update={"cluster": cluster, "allocations": allocations})
