from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from app.actions.router import DispatcherDep
from app.api.deps import ActorDep, ClockDep, SessionDep, scoped
from app.api.responses import ErrorBody
from app.core.errors import Invalid
from app.core.paging import MAX_LIMIT, MAX_OFFSET, Page
from app.core.types import DbId
from app.plans import service
from app.plans.models import (
    JobDecisions,
    PlanDecisionOnJob,
    PlanPlacement,
    PlanPublic,
    PlanState,
    PlanStepPublic,
)

router = APIRouter(prefix="/plans", tags=["plans"])
# How many of a cluster's latest plans a job's decision history reads at most (each plan's
# decisions are one document, one per waiting job of its cluster).
MAX_HISTORY_PLANS = 200
NOT_PROPOSED: dict[int | str, dict[str, Any]] = {
    409: {"description": "The plan is no longer proposed"}
}


@router.get("", **scoped("viewer"))
def list_plans(
    session: SessionDep,
    cluster: str | None = None,
    state: PlanState | None = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 50,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> Page[PlanPublic]:
    return service.list_plans(
        session=session, cluster=cluster, state=state, limit=limit, offset=offset
    )


# Before /{plan_id}: "decisions" is no plan id.
@router.get(
    "/decisions",
    responses={404: {"description": "No such cluster", "model": ErrorBody}},
    **scoped("viewer"),
)
def latest_decisions(
    session: SessionDep,
    cluster: str,
    job: Annotated[list[str], Query(description="a job's external id; repeat for more")],
) -> JobDecisions:
    """The cluster's latest plan's decisions for the jobs named (a plan of a large queue
    holds one per waiting job: the queue page asks for the jobs it shows)."""
    if len(job) > MAX_LIMIT:
        raise Invalid(f"job: at most {MAX_LIMIT} jobs at once, not {len(job)}", field="job")
    return service.latest_decisions(session=session, cluster=cluster, jobs=job)


@router.get(
    "/decisions/history",
    responses={404: {"description": "No such job", "model": ErrorBody}},
    **scoped("viewer"),
)
def job_decision_history(
    session: SessionDep,
    job_id: Annotated[DbId, Query(description="the job's id (GET /jobs/{job_id})")],
    plans: Annotated[
        int,
        Query(ge=1, le=MAX_HISTORY_PLANS, description="how many of the latest plans to read"),
    ] = 20,
) -> list[PlanDecisionOnJob]:
    """What the latest plans of the job's cluster decided about the job, newest first (the
    job page's history)."""
    return service.job_decision_history(session=session, job_id=job_id, plans=plans)


NO_PLAN: dict[int | str, dict[str, Any]] = {
    404: {"description": "No such plan", "model": ErrorBody}
}


@router.get("/{plan_id}", responses=NO_PLAN, **scoped("viewer"))
def get_plan(session: SessionDep, plan_id: DbId) -> PlanPublic:
    return service.get_plan(session=session, plan_id=plan_id)


@router.get("/{plan_id}/placement", responses=NO_PLAN, **scoped("viewer"))
def get_plan_placement(session: SessionDep, plan_id: DbId) -> PlanPlacement:
    """Node by node, for the nodes the plan's actions touch: GPUs per job before the plan
    and after it (the plan page's before/after)."""
    return service.plan_placement(session=session, plan_id=plan_id)


@router.get("/{plan_id}/steps", responses=NO_PLAN, **scoped("viewer"))
def list_plan_steps(session: SessionDep, plan_id: DbId) -> list[PlanStepPublic]:
    """Every saga step of the plan's actions (GET /actions/{id}/steps for all of them at
    once), by action, in step order."""
    return service.plan_steps(session=session, plan_id=plan_id)


@router.post("/{plan_id}/approve", responses=NOT_PROPOSED, **scoped("operator"))
def approve_plan(
    session: SessionDep,
    clock: ClockDep,
    actor: ActorDep,
    dispatch: DispatcherDep,
    plan_id: DbId,
) -> PlanPublic:
    """Approve the whole plan: its actions run in dependency order (a start waits for the
    actions that free its GPUs; a failed prerequisite cancels what depends on it)."""
    plan, approved = service.decide_plan(
        session=session,
        plan_id=plan_id,
        approve=True,
        by=actor.name,
        now=clock.now(),
        actor=actor,
    )
    for action_id in approved:
        dispatch(action_id)
    return plan


@router.post("/{plan_id}/reject", responses=NOT_PROPOSED, **scoped("operator"))
def reject_plan(session: SessionDep, clock: ClockDep, actor: ActorDep, plan_id: DbId) -> PlanPublic:
    """Reject every proposed action of the plan; nothing of it runs."""
    plan, _ = service.decide_plan(
        session=session,
        plan_id=plan_id,
        approve=False,
        by=actor.name,
        now=clock.now(),
        actor=actor,
    )
    return plan
