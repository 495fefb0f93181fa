from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Path, Response
from starlette.concurrency import run_in_threadpool

from app.actions import drains, job_sets
from app.actions.models import ActionKind, ActionPublic, JobSetMoveRequest, NodeActionRequest
from app.actions.router import DispatcherDep
from app.api.deps import ActorDep, ClockDep, SessionDep, scoped
from app.api.responses import JsonAnswer
from app.clusters import service
from app.clusters.models import CLUSTER_NAME_PATTERN, ClusterCreate, ClusterPublic, ClusterUpdate

router = APIRouter(prefix="/clusters", tags=["clusters"])
NAME = {"pattern": CLUSTER_NAME_PATTERN}


_CLUSTERS: JsonAnswer[list[ClusterPublic]] = JsonAnswer(list[ClusterPublic])


# Async, its query in one trip through the thread pool and its answer written here: the
# dashboard's most frequent read (issue 13; ``JsonAnswer``).
@router.get("", response_model=list[ClusterPublic], **scoped("viewer"))
async def list_clusters(session: SessionDep) -> Response:
    rows = await run_in_threadpool(service.list_public_rows, session=session)
    return _CLUSTERS.response(rows)


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


# --- an operator's drain and undrain of a node (app.actions.drains) ------------------------

_NODE_CONFLICT: dict[int | str, dict[str, Any]] = {
    409: {
        "description": "The node is in that state already, or a drain or undrain of it has "
        "not ended"
    }
}


def _node_route(kind: ActionKind, summary: str) -> None:
    """``POST /{cluster}/nodes/{node}/<kind>``: an approved action of that kind, dispatched
    at once, that the cluster's connector carries out and then reads back."""

    def route(
        session: SessionDep,
        clock: ClockDep,
        actor: ActorDep,
        dispatch: DispatcherDep,
        cluster: str,
        node: str,
        body: Annotated[NodeActionRequest | None, Body()] = None,
    ) -> ActionPublic:
        action = drains.request_node_action(
            session=session,
            cluster=cluster,
            node=node,
            kind=kind,
            reason=body.reason if body is not None else None,
            now=clock.now(),
            actor=actor,
        )
        dispatch(action.id)
        return action

    router.post(
        f"/{{cluster}}/nodes/{{node}}/{kind.value}",
        status_code=202,
        responses=_NODE_CONFLICT,
        name=f"{kind.value}_node",
        description=summary + " (GET /actions/{id} follows the action).",
        **scoped("operator"),
    )(route)


_node_route(
    ActionKind.drain,
    "Take the node out of its scheduler's placement (work there runs on): an approved "
    "`drain` action, dispatched at once, that the cluster's connector carries out and then "
    "reads back",
)
_node_route(
    ActionKind.undrain,
    "Give a drained node back to its scheduler: an `undrain` action, as a drain's (Ray has "
    "no undrain: its action fails saying so)",
)


# --- an operator's move of an Armada job set to another executor (app.actions.job_sets) ---


@router.post(
    "/{cluster}/job-sets/{queue}/{job_set}/move",
    status_code=202,
    responses={
        409: {
            "description": "The cluster does not run Armada, the job set is not queued (or "
            "is on that executor already), or a move of it or a saga on one of its jobs "
            "has not ended"
        }
    },
    **scoped("operator"),
)
def move_job_set(
    session: SessionDep,
    clock: ClockDep,
    actor: ActorDep,
    dispatch: DispatcherDep,
    cluster: str,
    queue: Annotated[str, Path(min_length=1, max_length=128)],
    job_set: Annotated[str, Path(min_length=1, max_length=255)],
    body: JobSetMoveRequest,
) -> ActionPublic:
    """Move a queued Armada job set to another executor cluster: an approved
    `move_job_set` action, dispatched at once, that the cluster's connector carries out (each
    job cancelled and submitted again selecting that executor), or refuses saying why, in
    the action's error (GET /actions/{id} follows the action)."""
    action = job_sets.request_job_set_move(
        session=session,
        cluster=cluster,
        queue=queue,
        job_set=job_set,
        executor=body.executor,
        reason=body.reason,
        now=clock.now(),
        actor=actor,
    )
    dispatch(action.id)
    return action
