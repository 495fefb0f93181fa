from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from app.api.deps import SessionDep, scoped
from app.core.paging import MAX_LIMIT, MAX_OFFSET, Page
from app.nodes import service
from app.nodes.models import NodePublic
from wire.telemetry import NodeState

router = APIRouter(prefix="/nodes", tags=["nodes"])


@router.get("", **scoped("viewer"))
def list_nodes(
    session: SessionDep,
    cluster: str | None = None,
    state: NodeState | None = None,
    gpu_model: str | None = None,
    sort: Annotated[str | None, Query(description="e.g. `-gpus_allocated,name`")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 100,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> Page[NodePublic]:
    return service.list_nodes(
        session=session,
        cluster=cluster,
        state=state,
        gpu_model=gpu_model,
        sort=sort,
        limit=limit,
        offset=offset,
    )
