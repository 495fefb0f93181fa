from __future__ import annotations

from fastapi import APIRouter, Response

from app.api.deps import ActorDep, ClockDep, SessionDep, scoped
from app.clusters import service
from app.clusters.models import CLUSTER_NAME_PATTERN, ClusterCreate, ClusterPublic, ClusterUpdate

router = APIRouter(prefix="/clusters", tags=["clusters"])
NAME = {"pattern": CLUSTER_NAME_PATTERN}


@router.get("", **scoped("viewer"))
def list_clusters(session: SessionDep) -> list[ClusterPublic]:
    return service.list_public(session=session)


@router.post(
    "",
    status_code=201,
    responses={409: {"description": "A cluster of that name is registered"}},
    **scoped("admin"),
)
def register_cluster(
    session: SessionDep, clock: ClockDep, actor: ActorDep, cluster_in: ClusterCreate
) -> ClusterPublic:
    cluster = service.register_cluster(
        session=session, cluster_in=cluster_in, now=clock.now(), actor=actor
    )
    return service.to_public(session=session, clusters=[cluster])[0]


@router.get("/{cluster}", **scoped("viewer"))
def get_cluster(session: SessionDep, cluster: str) -> ClusterPublic:
    found = service.get_cluster(session=session, name=cluster)
    return service.to_public(session=session, clusters=[found])[0]


@router.patch("/{cluster}", **scoped("operator"))
def update_cluster(
    session: SessionDep, clock: ClockDep, actor: ActorDep, cluster: str, cluster_in: ClusterUpdate
) -> ClusterPublic:
    updated = service.update_cluster(
        session=session, name=cluster, cluster_in=cluster_in, now=clock.now(), actor=actor
    )
    return service.to_public(session=session, clusters=[updated])[0]


@router.delete("/{cluster}", status_code=204, **scoped("admin"))
def delete_cluster(session: SessionDep, clock: ClockDep, actor: ActorDep, cluster: str) -> Response:
    service.delete_cluster(session=session, name=cluster, now=clock.now(), actor=actor)
    return Response(status_code=204)
