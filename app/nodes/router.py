from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from app.api.deps import ClockDep, SessionDep, SettingsDep, scoped
from app.api.responses import ErrorBody
from app.core.gc_pause import paused_gc
from app.core.paging import MAX_LIMIT, MAX_OFFSET, Page
from app.nodes import cluster_map, service
from app.nodes.models import ClusterMap, NodePublic
from wire.telemetry import NodeState

router = APIRouter(prefix="/nodes", tags=["nodes"])


@router.get("", **scoped("viewer"))
def list_nodes(
    session: SessionDep,
    cluster: str | None = None,
    state: NodeState | None = None,
    gpu_model: str | None = None,
    sort: Annotated[str | None, Query(description="e.g. `-gpus_allocated,name`")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 100,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> Page[NodePublic]:
    return service.list_nodes(
        session=session,
        cluster=cluster,
        state=state,
        gpu_model=gpu_model,
        sort=sort,
        limit=limit,
        offset=offset,
    )


@router.get(
    "/map",
    responses={404: {"description": "No such cluster", "model": ErrorBody}},
    **scoped("viewer"),
)
def get_cluster_map(
    session: SessionDep, clock: ClockDep, settings: SettingsDep, cluster: str
) -> ClusterMap:
    """Every node of the cluster with its GPUs: who holds each, its latest measured
    utilization and memory, and the moves of the cluster's latest open plan (the
    dashboard's cluster map, one read for the whole cluster)."""
    # At 10,000 GPUs the read makes some 100,000 short-lived rows and lists; the collector
    # passes they trigger walk the whole heap and took three quarters of its time.
    with paused_gc():
        return cluster_map.cluster_map(
            session=session,
            cluster=cluster,
            now=clock.now(),
            from_latest=settings.map_from_latest_samples,
        )
