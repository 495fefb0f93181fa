"""Writing and reading the audit log.

``record`` is called by each service that changes state on an operator's behalf, before
its own commit, so the row and the change share one transaction: a change that rolls back
takes its record with it, and a refused change (404, 409, 422) never reaches ``record``.
It takes no secrets: callers pass field values they choose (a token's name, scopes and
expiry, never its secret or digest).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from enum import StrEnum
from typing import Any

import sqlalchemy as sa
from pydantic_core import to_jsonable_python
from sqlmodel import Session, col

from app.audit.models import Actor, AuditRecord, AuditRecordPublic
from app.core.errors import Invalid
from app.core.paging import Page, count_rows


class AuditObject(StrEnum):
    token = "token"
    cluster = "cluster"
    gpu_model = "gpu_model"
    sla_policy = "sla_policy"
    action = "action"
    plan = "plan"
    federation_group = "federation_group"


def record(
    *,
    session: Session,
    actor: Actor | None,
    verb: str,
    object_type: AuditObject,
    object_id: str | int | None,
    now: datetime,
    changes: Mapping[str, Any] | None = None,
) -> None:
    """Adds the record of one change to the session; the caller's commit writes it.

    ``actor`` None: a change Shaper makes itself (the cycle, a saga) or one made by a
    caller that is not an API request; nothing is recorded.
    """
    if actor is None:
        return
    session.add(
        AuditRecord(
            at=now,
            actor_token_id=actor.token_id,
            actor_name=actor.name[:128],
            actor_scopes=list(actor.scopes),
            action=f"{object_type.value}.{verb}"[:64],
            object_type=object_type.value,
            object_id=str(object_id)[:255],
            request_id=actor.request_id,
            changes=to_jsonable_python(dict(changes or {})),
        )
    )


def diff(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, list[Any]]:
    """``{field: [before, after]}`` for each field of ``after`` whose value changed."""
    return {
        field: [before.get(field), value]
        for field, value in after.items()
        if before.get(field) != value
    }


def list_records(
    *,
    session: Session,
    object_type: AuditObject | None = None,
    object_id: str | None = None,
    actor: str | None = None,
    actor_token_id: int | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    limit: int = 100,
    offset: int = 0,
) -> Page[AuditRecordPublic]:
    """Newest first. ``since`` is inclusive, ``until`` exclusive."""
    if since is not None and until is not None and until <= since:
        raise Invalid("until: must be later than since", field="until")
    query = sa.select(AuditRecord)
    if object_type is not None:
        query = query.where(col(AuditRecord.object_type) == object_type.value)
    if object_id is not None:
        query = query.where(col(AuditRecord.object_id) == object_id)
    if actor is not None:
        query = query.where(col(AuditRecord.actor_name) == actor)
    if actor_token_id is not None:
        query = query.where(col(AuditRecord.actor_token_id) == actor_token_id)
    if since is not None:
        query = query.where(col(AuditRecord.at) >= since)
    if until is not None:
        query = query.where(col(AuditRecord.at) < until)
    total = count_rows(session, query)
    rows = session.execute(
        query.order_by(col(AuditRecord.at).desc(), col(AuditRecord.id).desc())
        .limit(limit)
        .offset(offset)
    ).scalars()
    items = [AuditRecordPublic.model_validate(row) for row in rows]
    return Page[AuditRecordPublic](items=items, total=total, limit=limit, offset=offset)
