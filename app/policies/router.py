from __future__ import annotations

from fastapi import APIRouter

from app.api.deps import ActorDep, ClockDep, SessionDep, scoped
from app.core.types import DbId
from app.policies import service
from app.policies.models import SlaPolicyCreate, SlaPolicyPublic, SlaPolicyUpdate

router = APIRouter(prefix="/policies", tags=["policies"])


@router.get("", **scoped("viewer"))
def list_policies(session: SessionDep) -> list[SlaPolicyPublic]:
    return [SlaPolicyPublic.model_validate(p) for p in service.list_latest(session=session)]


@router.post(
    "",
    status_code=201,
    responses={409: {"description": "A policy of that name exists; PUT a new version"}},
    **scoped("operator"),
)
def create_policy(
    session: SessionDep, clock: ClockDep, actor: ActorDep, policy_in: SlaPolicyCreate
) -> SlaPolicyPublic:
    policy = service.create_policy(
        session=session, policy_in=policy_in, by=actor.name, now=clock.now(), actor=actor
    )
    return SlaPolicyPublic.model_validate(policy)


@router.get("/{name}", **scoped("viewer"))
def get_policy(session: SessionDep, name: str) -> SlaPolicyPublic:
    return SlaPolicyPublic.model_validate(service.get_policy(session=session, name=name))


@router.put(
    "/{name}",
    responses={409: {"description": "Another edit wrote the next version first; read again"}},
    **scoped("operator"),
)
def edit_policy(
    session: SessionDep,
    clock: ClockDep,
    actor: ActorDep,
    name: str,
    policy_in: SlaPolicyUpdate,
) -> SlaPolicyPublic:
    """Writes a new version; earlier versions stay readable."""
    policy = service.new_version(
        session=session,
        name=name,
        policy_in=policy_in,
        by=actor.name,
        now=clock.now(),
        actor=actor,
    )
    return SlaPolicyPublic.model_validate(policy)


@router.delete(
    "/{name}",
    status_code=204,
    responses={
        404: {"description": "No such policy, or it is deleted already"},
        409: {"description": "Another edit wrote the next version first; read again"},
    },
    **scoped("operator"),
)
def delete_policy(session: SessionDep, clock: ClockDep, actor: ActorDep, name: str) -> None:
    """Stops the policy applying (its cluster falls back to the defaults) and drops it from
    the list; its versions, the deletion included, stay readable. POST the name again to
    bring it back as its next version."""
    service.delete_policy(session=session, name=name, by=actor.name, now=clock.now(), actor=actor)


@router.get("/{name}/versions", **scoped("viewer"))
def list_policy_versions(session: SessionDep, name: str) -> list[SlaPolicyPublic]:
    return [
        SlaPolicyPublic.model_validate(p) for p in service.list_versions(session=session, name=name)
    ]


@router.get("/{name}/versions/{version}", **scoped("viewer"))
def get_policy_version(session: SessionDep, name: str, version: DbId) -> SlaPolicyPublic:
    return SlaPolicyPublic.model_validate(
        service.get_policy(session=session, name=name, version=version)
    )
