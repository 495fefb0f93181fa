from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response

from app.api.deps import ActorDep, ClockDep, SessionDep, scoped
from app.core.types import DbId, NoNulStr
from app.policies import service
from app.policies.models import (
    SlaPolicyCreate,
    SlaPolicyImportPreview,
    SlaPolicyPublic,
    SlaPolicyRollback,
    SlaPolicyUpdate,
)
from app.policies.yaml_documents import (
    MEDIA_TYPE,
    YAML_MEDIA_TYPES,
    export_document,
    parse_document,
)

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


@router.post(
    "/{name}/rollback",
    responses={
        404: {"description": "No such policy or version, or the policy is deleted"},
        409: {"description": "That version's terms are current already, or a concurrent edit"},
    },
    **scoped("operator"),
)
def roll_back_policy(
    session: SessionDep,
    clock: ClockDep,
    actor: ActorDep,
    name: str,
    rollback_in: SlaPolicyRollback,
) -> SlaPolicyPublic:
    """Writes a new version with an earlier version's spec; history is never rewritten.
    The next shaping cycle reads it as it reads any edit."""
    policy = service.roll_back(
        session=session,
        name=name,
        version=rollback_in.version,
        comment=rollback_in.comment,
        by=actor.name,
        now=clock.now(),
        actor=actor,
    )
    return SlaPolicyPublic.model_validate(policy)


@router.get(
    "/{name}/export",
    response_class=Response,
    responses={200: {"content": {MEDIA_TYPE: {"schema": {"type": "string"}}}}},
    **scoped("viewer"),
)
def export_policy(
    session: SessionDep, name: str, version: Annotated[DbId | None, Query()] = None
) -> Response:
    """The current version's spec (or ``version``'s) as a YAML document to keep in Git."""
    policy = service.get_policy(session=session, name=name, version=version)
    return Response(
        export_document(policy),
        media_type=MEDIA_TYPE,
        headers={
            "Content-Disposition": f'attachment; filename="{policy.name}-v{policy.version}.yaml"'
        },
    )


async def _yaml_body(request: Request) -> bytes:
    # Bounded before it gets here, as a JSON body is (app.core.body_limit).
    return await request.body()


def _yaml_route(scope: str) -> dict[str, Any]:
    """``scoped(scope)``, with the YAML body published in the OpenAPI schema (FastAPI
    only describes the bodies it parses itself)."""
    route = scoped(scope)
    route["openapi_extra"] = {
        **route["openapi_extra"],
        "requestBody": {
            "required": True,
            "content": {t: {"schema": {"type": "string"}} for t in YAML_MEDIA_TYPES},
        },
    }
    return route


# Viewer: a CI job can check a file against the live policy before it is merged.
@router.post("/{name}/import/preview", **_yaml_route("viewer"))
def preview_policy_import(
    session: SessionDep, name: str, document: Annotated[bytes, Depends(_yaml_body)]
) -> SlaPolicyImportPreview:
    """What ``import`` would do with the document, validated the same way; writes nothing."""
    parsed = parse_document(document)
    current = service.get_policy(session=session, name=name)
    service.check_models(session, parsed)
    spec = parsed.model_dump(mode="json")
    return SlaPolicyImportPreview(
        name=name,
        current_version=current.version,
        current_spec=service.comparable(current.spec),
        spec=spec,
        changed=not service.same_terms(current.spec, spec),
    )


@router.post(
    "/{name}/import",
    responses={
        404: {"description": "No such policy, or it is deleted; create it first"},
        409: {"description": "Another edit wrote the next version first; read again"},
    },
    **_yaml_route("operator"),
)
def import_policy(
    session: SessionDep,
    clock: ClockDep,
    actor: ActorDep,
    name: str,
    document: Annotated[bytes, Depends(_yaml_body)],
    comment: Annotated[NoNulStr, Query(max_length=1024)] = "imported from YAML",
) -> SlaPolicyPublic:
    """Sets the policy's spec from a YAML document (as ``export`` writes it), validated as
    a JSON edit is. The terms current already write nothing: the answer is the current
    version, so a GitOps sync can apply the same file again and again."""
    policy, _written = service.apply_spec(
        session=session,
        name=name,
        spec=parse_document(document),
        comment=comment,
        by=actor.name,
        now=clock.now(),
        actor=actor,
    )
    return SlaPolicyPublic.model_validate(policy)
