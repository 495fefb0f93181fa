from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response
from starlette.concurrency import run_in_threadpool

from app.api.deps import SessionDep, scoped
from app.api.responses import JsonAnswer
from app.core.paging import MAX_LIMIT, MAX_OFFSET, Page
from app.core.types import DbId
from app.jobs import service
from app.jobs.models import JobPublic
from wire.telemetry import JobKind, JobShape, JobState

router = APIRouter(prefix="/jobs", tags=["jobs"])


_PAGE: JsonAnswer[Page[JobPublic]] = JsonAnswer(Page[JobPublic])


# Async, its queries in one trip through the thread pool and its answer written here
# (issue 13; ``JsonAnswer``).
@router.get("", response_model=Page[JobPublic], **scoped("viewer"))
async def list_jobs(
    session: SessionDep,
    cluster: str | None = None,
    state: JobState | None = None,
    team: str | None = None,
    queue: str | None = None,
    kind: JobKind | None = None,
    shape: JobShape | None = None,
    sort: Annotated[str | None, Query(description="e.g. `-priority,submit_time`")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 100,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> Response:
    page = await run_in_threadpool(
        service.list_jobs,
        session=session,
        cluster=cluster,
        state=state,
        team=team,
        queue=queue,
        kind=kind,
        shape=shape,
        sort=sort,
        limit=limit,
        offset=offset,
    )
    return _PAGE.response(page)


@router.get("/{job_id}", **scoped("viewer"))
def get_job(session: SessionDep, job_id: DbId) -> JobPublic:
    return service.get_job(session=session, job_id=job_id)
