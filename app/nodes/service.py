from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlmodel import Session, col

from app.clusters.models import Cluster
from app.core.paging import Page, count_rows, order_by_clauses
from app.gpu_models.models import GpuModel
from app.jobs.models import Allocation
from app.nodes.models import Node, NodePublic
from wire.telemetry import NodeState

_allocated = (
    sa.select(col(Allocation.node_id), sa.func.sum(Allocation.gpu_count).label("gpus"))
    .where(col(Allocation.released_at).is_(None))
    .group_by(col(Allocation.node_id))
    .subquery()
)
_SORTABLE: dict[str, Any] = {
    "name": Node.name,
    "cluster": Cluster.name,
    "gpu_count": Node.gpu_count,
    "gpus_allocated": sa.func.coalesce(_allocated.c.gpus, 0),
    "state": Node.state,
    "updated_at": Node.updated_at,
}


def list_nodes(
    *,
    session: Session,
    cluster: str | None = None,
    state: NodeState | None = None,
    gpu_model: str | None = None,
    sort: str | None = None,
    limit: int = 100,
    offset: int = 0,
) -> Page[NodePublic]:
    query = (
        sa.select(
            Node,
            sa.label("cluster_name", col(Cluster.name)),
            sa.label("gpu_model_name", col(GpuModel.name)),
            sa.func.coalesce(_allocated.c.gpus, 0).label("allocated"),
        )
        .join(Cluster, col(Cluster.id) == Node.cluster_id)
        .outerjoin(GpuModel, col(GpuModel.id) == Node.gpu_model_id)
        .outerjoin(_allocated, _allocated.c.node_id == Node.id)
    )
    if cluster is not None:
        query = query.where(col(Cluster.name) == cluster)
    if state is not None:
        query = query.where(col(Node.state) == state.value)
    if gpu_model is not None:
        query = query.where(col(GpuModel.name) == gpu_model)
    total = count_rows(session, query)
    order = order_by_clauses(sort, _SORTABLE, default=("cluster", "name"))
    rows = session.execute(query.order_by(*order, col(Node.id)).limit(limit).offset(offset))
    items = [
        NodePublic(
            id=node.id,
            cluster=cluster_name,
            name=node.name,
            gpu_model=gpu_model_name,
            gpu_count=node.gpu_count,
            gpus_allocated=int(allocated),
            cpu_cores=node.cpu_cores,
            memory_mib=node.memory_mib,
            labels=node.labels,
            state=node.state,
            updated_at=node.updated_at,
        )
        for node, cluster_name, gpu_model_name, allocated in rows
    ]
    return Page[NodePublic](items=items, total=total, limit=limit, offset=offset)
