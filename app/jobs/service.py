from __future__ import annotations

from collections import defaultdict
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped
from sqlmodel import Session, col

from app.clusters.models import Cluster
from app.core.lookup import found
from app.core.paging import Page, count_rows, order_by_clauses
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
) -> Page[JobPublic]:
    query = sa.select(Job, col(Cluster.name)).join(Cluster, col(Cluster.id) == Job.cluster_id)
    filters: dict[Mapped[Any], object] = {
        col(Cluster.name): cluster,
        col(Job.state): state,
        col(Job.team): team,
        col(Job.queue): queue,
        col(Job.kind): kind,
        col(Job.shape): shape,
    }
    for column, value in filters.items():
        if value is not None:
            query = query.where(column == value)
    total = count_rows(session, query)
    order = order_by_clauses(sort, _SORTABLE, default=("-priority", "submit_time"))
    rows = list(session.execute(query.order_by(*order, col(Job.id)).limit(limit).offset(offset)))
    allocations = _open_allocations(session, [job.id for job, _ in rows])
    items = [_public(job, name, allocations.get(job.id, [])) for job, name in rows]
    return Page[JobPublic](items=items, total=total, limit=limit, offset=offset)


def get_job(*, session: Session, job_id: int) -> JobPublic:
    row = session.execute(
        sa.select(Job, col(Cluster.name))
        .join(Cluster, col(Cluster.id) == Job.cluster_id)
        .where(col(Job.id) == job_id)
    ).first()
    job, name = found(row, f"job {job_id} does not exist", resource="job", resource_id=job_id)
    return _public(job, name, _open_allocations(session, [job_id]).get(job_id, []))


def _open_allocations(session: Session, job_ids: list[int]) -> dict[int, list[AllocationPublic]]:
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
        .where(col(Allocation.job_id).in_(job_ids), col(Allocation.released_at).is_(None))
    )
    result: dict[int, list[AllocationPublic]] = defaultdict(list)
    for job_id, node, indices, count, started in session.execute(query):
        result[job_id].append(
            AllocationPublic(node=node, gpu_indices=indices, gpu_count=count, started_at=started)
        )
    return result


def _public(job: Job, cluster: str, allocations: list[AllocationPublic]) -> JobPublic:
    return JobPublic.model_validate(job, update={"cluster": cluster, "allocations": allocations})
