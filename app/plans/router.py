from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from app.api.deps import SessionDep, scoped
from app.core.paging import MAX_LIMIT, Page
from app.plans import service
from app.plans.models import PlanPublic

router = APIRouter(prefix="/plans", tags=["plans"])


@router.get("", **scoped("viewer"))
def list_plans(
    session: SessionDep,
    cluster: str | None = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 50,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> Page[PlanPublic]:
    return service.list_plans(session=session, cluster=cluster, limit=limit, offset=offset)


@router.get("/{plan_id}", **scoped("viewer"))
def get_plan(session: SessionDep, plan_id: int) -> PlanPublic:
    return service.get_plan(session=session, plan_id=plan_id)
