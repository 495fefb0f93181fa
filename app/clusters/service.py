from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel import Session, col, select

from app.actions.models import Action
from app.audit import service as audit
from app.audit.models import Actor
from app.audit.service import AuditObject
from app.clusters.models import Cluster, ClusterCreate, ClusterPublic, ClusterUpdate
from app.core.db import plain_rows
from app.core.errors import Invalid
from app.core.lookup import found, not_taken, row_id
from app.federation.models import FederationGroup
from app.nodes.models import Node
from app.plans.models import Plan
from solver.policies import POLICY_NAMES


def _check(cluster_in: ClusterCreate | ClusterUpdate) -> None:
    """A cluster whose policy the planner does not know would never be planned again; a
    NUL PostgreSQL cannot store (SQLite could: refused on both alike)."""
    if cluster_in.description is not None and "\x00" in cluster_in.description:
        raise Invalid("description: must not contain NUL (\\u0000)", field="description")
    policy = cluster_in.policy
    if policy is not None and policy not in POLICY_NAMES:
        raise Invalid(
            f"policy: {policy!r} is not one of {', '.join(POLICY_NAMES)}",
            field="policy",
            details={"allowed": list(POLICY_NAMES)},
        )


def register_cluster(
    *, session: Session, cluster_in: ClusterCreate, now: datetime, actor: Actor | None = None
) -> Cluster:
    _check(cluster_in)
    not_taken(
        session.exec(select(Cluster).where(Cluster.name == cluster_in.name)).first(),
        f"cluster {cluster_in.name!r} is already registered",
        resource="cluster",
        resource_id=cluster_in.name,
    )
    cluster = Cluster(**cluster_in.model_dump(), created_at=now)
    session.add(cluster)
    audit.record(
        session=session,
        actor=actor,
        verb="create",
        object_type=AuditObject.cluster,
        object_id=cluster.name,
        now=now,
        changes=cluster_in.model_dump(),
    )
    session.commit()
    session.refresh(cluster)
    return cluster


def get_cluster(*, session: Session, name: str) -> Cluster:
    cluster = session.exec(select(Cluster).where(Cluster.name == name)).first()
    return found(
        cluster, f"cluster {name!r} is not registered", resource="cluster", resource_id=name
    )


def list_clusters(*, session: Session) -> list[Cluster]:
    return list(session.exec(select(Cluster).order_by(Cluster.name)))


# Every published column of ``clusters`` (ClusterPublic less the counts and the group's name).
_PUBLIC_COLUMNS = [
    Cluster.__table__.c[name]  # type: ignore[attr-defined]
    for name in ClusterPublic.model_fields
    if name not in ("node_count", "gpu_count", "federation_group")
]


def _list_public_query() -> sa.Select[Any]:
    nodes = (
        sa.select(
            col(Node.cluster_id).label("cluster_id"),
            sa.func.count().label("node_count"),
            sa.func.coalesce(sa.func.sum(Node.gpu_count), 0).label("gpu_count"),
        )
        .where(col(Node.state) != "down")
        .group_by(col(Node.cluster_id))
        .subquery()
    )
    return (
        sa.select(
            *_PUBLIC_COLUMNS,
            sa.func.coalesce(nodes.c.node_count, 0).label("node_count"),
            sa.func.coalesce(nodes.c.gpu_count, 0).label("gpu_count"),
            col(FederationGroup.name).label("federation_group"),
        )
        .outerjoin(nodes, nodes.c.cluster_id == col(Cluster.id))
        .outerjoin(FederationGroup, col(FederationGroup.id) == col(Cluster.federation_group_id))
        .order_by(col(Cluster.name))
    )


# Built once: it takes no arguments, and building it cost as much as running it.
_LIST_PUBLIC = _list_public_query()


def list_public_rows(*, session: Session) -> list[dict[str, Any]]:
    """Every cluster as ``to_public`` shows it, by name, as plain rows (``ClusterPublic``'s
    fields), in one statement of the columns it publishes: GET /clusters is the
    dashboard's most frequent read (issue 13), and loading ``Cluster`` entities (their
    push history included) cost more than the query. The route validates the rows as it
    writes them (``app.api.responses.JsonAnswer``)."""
    return plain_rows(session, _LIST_PUBLIC)


def to_public(*, session: Session, clusters: list[Cluster]) -> list[ClusterPublic]:
    ids = [row_id(c) for c in clusters]
    counts: dict[int, tuple[int, int]] = {}
    if ids:
        query = (
            sa.select(
                col(Node.cluster_id),
                sa.func.count(),
                sa.func.coalesce(sa.func.sum(Node.gpu_count), 0),
            )
            .where(col(Node.cluster_id).in_(ids), col(Node.state) != "down")
            .group_by(col(Node.cluster_id))
        )
        counts = {cid: (int(n), int(g)) for cid, n, g in session.execute(query)}
    group_ids = {c.federation_group_id for c in clusters if c.federation_group_id is not None}
    groups: dict[int, str] = {}
    if group_ids:
        rows = session.execute(
            sa.select(col(FederationGroup.id), col(FederationGroup.name)).where(
                col(FederationGroup.id).in_(group_ids)
            )
        )
        groups = {int(gid): str(name) for gid, name in rows}
    return [
        ClusterPublic.model_validate(
            c,
            update={
                "node_count": counts.get(cid, (0, 0))[0],
                "gpu_count": counts.get(cid, (0, 0))[1],
                "federation_group": groups.get(c.federation_group_id or -1),
            },
        )
        for c, cid in zip(clusters, ids, strict=True)
    ]


def update_cluster(
    *,
    session: Session,
    name: str,
    cluster_in: ClusterUpdate,
    now: datetime,
    actor: Actor | None = None,
) -> Cluster:
    """Changes what ``cluster_in`` sets (its mode, policy, description, labels: the whole
    map, so a label is removed by leaving it out); the audit record, when anything
    changed, has each field's value before and after."""
    _check(cluster_in)
    cluster = get_cluster(session=session, name=name)
    update = cluster_in.model_dump(exclude_unset=True, exclude_none=True)
    changed = audit.diff({field: getattr(cluster, field) for field in update}, update)
    cluster.sqlmodel_update(update)
    session.add(cluster)
    if changed:
        audit.record(
            session=session,
            actor=actor,
            verb="update",
            object_type=AuditObject.cluster,
            object_id=cluster.name,
            now=now,
            changes=changed,
        )
    session.commit()
    session.refresh(cluster)
    return cluster


def delete_cluster(
    *, session: Session, name: str, now: datetime, actor: Actor | None = None
) -> None:
    cluster = get_cluster(session=session, name=name)
    # Its plans, then its actions, each in id order, as every locker of a plan's actions
    # takes them (app.actions.service.lock_plan_of) and a saga takes an action with no
    # plan (a drain, a job set's move) before the rest: the delete locks the cluster's row
    # and then, cascading, its plans and actions, while a saga holding one of those may be
    # waiting for that row (a reservation given back inserts an action; a job set's
    # dispatch locks the row; a drain locks a node the cascade deletes).
    for table in (Plan, Action):
        session.exec(
            select(table.id)
            .where(table.cluster_id == cluster.id)
            .order_by(col(table.id))
            .with_for_update(key_share=True)
        ).all()
    # Moves bound for it have nowhere to go (their sagas cancel them); its own cascade.
    session.execute(
        sa.update(Action)
        .where(col(Action.target_cluster_id) == cluster.id)
        .values(target_cluster_id=None)
    )
    session.delete(cluster)
    audit.record(
        session=session,
        actor=actor,
        verb="delete",
        object_type=AuditObject.cluster,
        object_id=name,
        now=now,
        changes={"scheduler": cluster.scheduler, "mode": cluster.mode, "policy": cluster.policy},
    )
    session.commit()
