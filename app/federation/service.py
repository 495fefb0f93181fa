"""Federation groups: create, change, delete, and which clusters are in them.

A cluster joins a group with :func:`add_cluster` (a cluster is in one group at most: in
another one already is a conflict naming it) and leaves it with :func:`remove_cluster`;
deleting a group leaves its clusters planned alone. Every change is audited.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.engine import CursorResult
from sqlmodel import Session, col, select

from app.audit import service as audit
from app.audit.models import Actor
from app.audit.service import AuditObject
from app.clusters.models import Cluster
from app.clusters.service import get_cluster
from app.core.errors import Conflict, Invalid
from app.core.lookup import found, not_taken, row_id
from app.federation.models import (
    FederationGroup,
    FederationGroupCreate,
    FederationGroupPublic,
    FederationGroupUpdate,
)


def _check(group_in: FederationGroupCreate | FederationGroupUpdate) -> None:
    if group_in.description is not None and "\x00" in group_in.description:
        raise Invalid("description: must not contain NUL (\\u0000)", field="description")


def create_group(
    *, session: Session, group_in: FederationGroupCreate, now: datetime, actor: Actor | None
) -> FederationGroup:
    _check(group_in)
    not_taken(
        session.exec(select(FederationGroup).where(FederationGroup.name == group_in.name)).first(),
        f"federation group {group_in.name!r} exists",
        resource="federation_group",
        resource_id=group_in.name,
    )
    group = FederationGroup(**group_in.model_dump(), created_at=now)
    session.add(group)
    audit.record(
        session=session,
        actor=actor,
        verb="create",
        object_type=AuditObject.federation_group,
        object_id=group.name,
        now=now,
        changes=group_in.model_dump(),
    )
    session.commit()
    session.refresh(group)
    return group


def get_group(*, session: Session, name: str) -> FederationGroup:
    group = session.exec(select(FederationGroup).where(FederationGroup.name == name)).first()
    return found(
        group,
        f"federation group {name!r} does not exist",
        resource="federation_group",
        resource_id=name,
    )


def list_groups(*, session: Session) -> list[FederationGroup]:
    return list(session.exec(select(FederationGroup).order_by(col(FederationGroup.name))))


def members(*, session: Session, group: FederationGroup) -> list[Cluster]:
    query = select(Cluster).where(Cluster.federation_group_id == row_id(group))
    return list(session.exec(query.order_by(col(Cluster.name))))


def to_public(*, session: Session, groups: list[FederationGroup]) -> list[FederationGroupPublic]:
    names: dict[int, list[str]] = defaultdict(list)
    ids = [row_id(g) for g in groups]
    if ids:
        rows = session.exec(
            select(Cluster.federation_group_id, Cluster.name)
            .where(col(Cluster.federation_group_id).in_(ids))
            .order_by(col(Cluster.name))
        )
        for group_id, name in rows:
            if group_id is not None:
                names[group_id].append(name)
    return [
        FederationGroupPublic.model_validate(g, update={"clusters": names.get(row_id(g), [])})
        for g in groups
    ]


def update_group(
    *,
    session: Session,
    name: str,
    group_in: FederationGroupUpdate,
    now: datetime,
    actor: Actor | None,
) -> FederationGroup:
    _check(group_in)
    group = get_group(session=session, name=name)
    update = group_in.model_dump(exclude_unset=True, exclude_none=True)
    changed = audit.diff({field: getattr(group, field) for field in update}, update)
    group.sqlmodel_update(update)
    session.add(group)
    if changed:
        audit.record(
            session=session,
            actor=actor,
            verb="update",
            object_type=AuditObject.federation_group,
            object_id=group.name,
            now=now,
            changes=changed,
        )
    session.commit()
    session.refresh(group)
    return group


def delete_group(*, session: Session, name: str, now: datetime, actor: Actor | None) -> None:
    group = get_group(session=session, name=name)
    clusters = [c.name for c in members(session=session, group=group)]
    for cluster in members(session=session, group=group):
        cluster.federation_group_id = None  # the foreign key has no ON DELETE rule
        session.add(cluster)
    session.delete(group)
    audit.record(
        session=session,
        actor=actor,
        verb="delete",
        object_type=AuditObject.federation_group,
        object_id=name,
        now=now,
        changes={"clusters": clusters},
    )
    session.commit()


def add_cluster(
    *, session: Session, name: str, cluster: str, now: datetime, actor: Actor | None
) -> FederationGroup:
    """Idempotent: a cluster already in this group stays; in another group is a conflict
    (checked again by the write itself: of two concurrent joins of one cluster, one wins)."""
    group = get_group(session=session, name=name)
    member = get_cluster(session=session, name=cluster)
    if member.federation_group_id == row_id(group):
        return group
    joined = 0
    if member.federation_group_id is None:
        result = session.execute(
            sa.update(Cluster)
            .where(col(Cluster.id) == row_id(member), col(Cluster.federation_group_id).is_(None))
            .values(federation_group_id=row_id(group))
        )
        joined = cast("CursorResult[Any]", result).rowcount
    if joined != 1:
        session.rollback()
        other = session.get(
            FederationGroup, get_cluster(session=session, name=cluster).federation_group_id or -1
        )
        raise Conflict(
            f"cluster {cluster!r} is in federation group "
            f"{other.name if other else '?'!r}: remove it there first",
            field="cluster",
            resource="cluster",
            resource_id=cluster,
        )
    return _membership_changed(session, group, {"added": cluster}, now, actor)


def remove_cluster(
    *, session: Session, name: str, cluster: str, now: datetime, actor: Actor | None
) -> FederationGroup:
    """Idempotent too: a cluster not in the group is left as it is."""
    group = get_group(session=session, name=name)
    member = get_cluster(session=session, name=cluster)
    if member.federation_group_id != row_id(group):
        return group
    member.federation_group_id = None
    session.add(member)
    return _membership_changed(session, group, {"removed": cluster}, now, actor)


def _membership_changed(
    session: Session,
    group: FederationGroup,
    changes: dict[str, str],
    now: datetime,
    actor: Actor | None,
) -> FederationGroup:
    audit.record(
        session=session,
        actor=actor,
        verb="update",
        object_type=AuditObject.federation_group,
        object_id=group.name,
        now=now,
        changes=changes,
    )
    session.commit()
    session.refresh(group)
    return group
