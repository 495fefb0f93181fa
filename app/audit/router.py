from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import AwareDatetime

from app.api.deps import SessionDep, scoped
from app.audit import service
from app.audit.models import AuditRecordPublic
from app.audit.service import AuditObject
from app.core.paging import MAX_LIMIT, MAX_OFFSET, Page
from app.core.types import DbId

router = APIRouter(prefix="/audit", tags=["audit"])


@router.get("", **scoped("admin"))
def list_audit_records(
    session: SessionDep,
    object_type: AuditObject | None = None,
    object_id: Annotated[str | None, Query(min_length=1, max_length=255)] = None,
    actor: Annotated[
        str | None, Query(min_length=1, max_length=128, description="the token's name")
    ] = None,
    actor_token_id: DbId | None = None,
    since: Annotated[AwareDatetime | None, Query(description="inclusive")] = None,
    until: Annotated[AwareDatetime | None, Query(description="exclusive")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 100,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> Page[AuditRecordPublic]:
    """Every change made through the API, newest first: who (the token's id, name and
    scopes), what (`<object type>.<verb>` and the object's id), when, the request's
    `X-Request-ID` when the caller or a proxy sent one, and what changed. Telemetry
    pushes are not recorded."""
    return service.list_records(
        session=session,
        object_type=object_type,
        object_id=object_id,
        actor=actor,
        actor_token_id=actor_token_id,
        since=since,
        until=until,
        limit=limit,
        offset=offset,
    )
