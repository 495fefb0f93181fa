from __future__ import annotations

from fastapi import APIRouter, Response

from app.actions.router import DispatcherDep
from app.api.deps import ActorDep, ClockDep, SessionDep, scoped
from app.federation import moves, planning, service
from app.federation.models import (
    FederationGroupCreate,
    FederationGroupPublic,
    FederationGroupUpdate,
)

router = APIRouter(prefix="/federation-groups", tags=["federation"])


@router.get("", **scoped("viewer"))
def list_groups(session: SessionDep) -> list[FederationGroupPublic]:
    return service.to_public(session=session, groups=service.list_groups(session=session))


@router.post(
    "",
    status_code=201,
    responses={409: {"description": "A federation group of that name exists"}},
    **scoped("admin"),
)
def create_group(
    session: SessionDep, clock: ClockDep, actor: ActorDep, group_in: FederationGroupCreate
) -> FederationGroupPublic:
    group = service.create_group(session=session, group_in=group_in, now=clock.now(), actor=actor)
    return service.to_public(session=session, groups=[group])[0]


@router.get("/{group}", **scoped("viewer"))
def get_group(session: SessionDep, group: str) -> FederationGroupPublic:
    found = service.get_group(session=session, name=group)
    return service.to_public(session=session, groups=[found])[0]


@router.patch("/{group}", **scoped("admin"))
def update_group(
    session: SessionDep,
    clock: ClockDep,
    actor: ActorDep,
    group: str,
    group_in: FederationGroupUpdate,
) -> FederationGroupPublic:
    updated = service.update_group(
        session=session, name=group, group_in=group_in, now=clock.now(), actor=actor
    )
    return service.to_public(session=session, groups=[updated])[0]


@router.delete("/{group}", status_code=204, **scoped("admin"))
def delete_group(session: SessionDep, clock: ClockDep, actor: ActorDep, group: str) -> Response:
    service.delete_group(session=session, name=group, now=clock.now(), actor=actor)
    return Response(status_code=204)


@router.put(
    "/{group}/clusters/{cluster}",
    responses={409: {"description": "The cluster is in another federation group"}},
    **scoped("admin"),
)
def add_cluster(
    session: SessionDep, clock: ClockDep, actor: ActorDep, group: str, cluster: str
) -> FederationGroupPublic:
    updated = service.add_cluster(
        session=session, name=group, cluster=cluster, now=clock.now(), actor=actor
    )
    return service.to_public(session=session, groups=[updated])[0]


@router.delete("/{group}/clusters/{cluster}", **scoped("admin"))
def remove_cluster(
    session: SessionDep, clock: ClockDep, actor: ActorDep, group: str, cluster: str
) -> FederationGroupPublic:
    updated = service.remove_cluster(
        session=session, name=group, cluster=cluster, now=clock.now(), actor=actor
    )
    return service.to_public(session=session, groups=[updated])[0]


@router.post("/{group}/what-if", **scoped("viewer"))
def what_if(session: SessionDep, clock: ClockDep, group: str) -> planning.FederationWhatIf:
    """Plans the group as one over the live state, and each cluster alone, and says which
    pending jobs federation would start in another cluster. Changes nothing."""
    return planning.plan_group(session=session, name=group, now=clock.now())


@router.post("/{group}/plan", **scoped("operator"))
def plan(
    session: SessionDep, clock: ClockDep, dispatch: DispatcherDep, group: str
) -> moves.MovesProposed:
    """Plans the group now, as the shaping cycle does each period: the pending jobs it
    starts in another cluster become move actions of their home cluster (proposed in
    advise mode, dispatched at once in enforce mode; none in observe mode)."""
    outcome = moves.propose_moves(session=session, group=group, now=clock.now())
    for action_id in outcome.approved:
        dispatch(action_id)
    return outcome
