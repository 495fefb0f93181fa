from __future__ import annotations

import sqlalchemy as sa
from sqlmodel import Session

from app.clusters.models import Cluster
from app.core.errors import NotFound
from app.core.paging import Page, count_rows
from app.plans.models import Plan, PlanPublic


def list_plans(
    *, session: Session, cluster: str | None = None, limit: int = 50, offset: int = 0
) -> Page[PlanPublic]:
    query = sa.select(Plan, Cluster.name).outerjoin(Cluster, Cluster.id == Plan.cluster_id)  # type: ignore[arg-type]
    if cluster is not None:
        query = query.where(Cluster.name == cluster)
    total = count_rows(session, query)
    rows = session.execute(
        query.order_by(Plan.created_at.desc(), Plan.id.desc()).limit(limit).offset(offset)
    )  # type: ignore[attr-defined,union-attr]
    items = [PlanPublic.model_validate(p, update={"cluster": name}) for p, name in rows]
    return Page[PlanPublic](items=items, total=total, limit=limit, offset=offset)


def get_plan(*, session: Session, plan_id: int) -> PlanPublic:
    row = session.execute(
        sa.select(Plan, Cluster.name)
        .outerjoin(Cluster, Cluster.id == Plan.cluster_id)
        .where(Plan.id == plan_id)  # type: ignore[arg-type]
    ).first()
    if row is None:
        raise NotFound(f"plan {plan_id} does not exist", resource="plan", resource_id=plan_id)
    plan, name = row
    return PlanPublic.model_validate(plan, update={"cluster": name})
