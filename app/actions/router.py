from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query

from app.actions import saga, service
from app.actions.models import ActionPublic, ActionState, ActionStepPublic, ChurnPublic
from app.api.deps import ActorDep, ClockDep, SessionDep, scoped
from app.core.paging import MAX_LIMIT, MAX_OFFSET, Page
from app.core.types import DbId

router = APIRouter(prefix="/actions", tags=["actions"])
ILLEGAL_MOVE: dict[int | str, dict[str, Any]] = {
    409: {"description": "The action's state does not allow this move (or a prerequisite's)"}
}


def get_dispatcher() -> Callable[[int], None]:
    """What starts an approved action's saga (``advance`` on queue ``control``)."""
    from app.actions import tasks

    return tasks.kick


DispatcherDep = Annotated[Callable[[int], None], Depends(get_dispatcher)]


@router.get("", **scoped("viewer"))
def list_actions(
    session: SessionDep,
    cluster: str | None = None,
    state: ActionState | None = None,
    plan_id: int | None = None,
    job_id: Annotated[DbId | None, Query(description="the job's id (GET /jobs/{job_id})")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 100,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> Page[ActionPublic]:
    return service.list_actions(
        session=session,
        cluster=cluster,
        state=state,
        plan_id=plan_id,
        job_id=job_id,
        limit=limit,
        offset=offset,
    )


@router.get("/churn", **scoped("viewer"))
def get_churn(
    session: SessionDep,
    clock: ClockDep,
    cluster: str | None = None,
    window_s: Annotated[float, Query(gt=0, le=30 * 86400)] = 3600.0,
    dwell_s: Annotated[float, Query(ge=0, le=86400)] = 600.0,
) -> ChurnPublic:
    """Shaper's actions per job-hour over the window, and jobs acted on twice within the
    dwell time (the solver's dwell rule keeps that at zero)."""
    return service.churn(
        session=session, cluster=cluster, window_s=window_s, dwell_s=dwell_s, now=clock.now()
    )


@router.get("/{action_id}", **scoped("viewer"))
def get_action(session: SessionDep, action_id: DbId) -> ActionPublic:
    return service.get_action(session=session, action_id=action_id)


def _decide(
    session: SessionDep,
    clock: ClockDep,
    actor: ActorDep,
    action_id: DbId,
    to: ActionState,
) -> ActionPublic:
    service.transition(
        session=session, action_id=action_id, to=to, by=actor.name, now=clock.now(), actor=actor
    )
    return service.get_action(session=session, action_id=action_id)


@router.get("/{action_id}/steps", **scoped("viewer"))
def list_action_steps(session: SessionDep, action_id: DbId) -> list[ActionStepPublic]:
    """The action's saga, step by step: where each ran, with which generation, and how."""
    return saga.list_steps(session=session, action_id=action_id)


@router.post("/{action_id}/approve", responses=ILLEGAL_MOVE, **scoped("operator"))
def approve_action(
    session: SessionDep,
    clock: ClockDep,
    actor: ActorDep,
    dispatch: DispatcherDep,
    action_id: DbId,
) -> ActionPublic:
    """Approve a proposed action, and the proposed actions it depends on (409 naming them
    when one can no longer run); its saga starts once they have succeeded."""
    decided = _decide(session, clock, actor, action_id, ActionState.approved)
    for prerequisite in decided.depends_on:
        dispatch(prerequisite)
    dispatch(action_id)
    return decided


@router.post("/{action_id}/reject", responses=ILLEGAL_MOVE, **scoped("operator"))
def reject_action(
    session: SessionDep, clock: ClockDep, actor: ActorDep, action_id: DbId
) -> ActionPublic:
    return _decide(session, clock, actor, action_id, ActionState.rejected)


@router.post("/{action_id}/cancel", responses=ILLEGAL_MOVE, **scoped("operator"))
def cancel_action(
    session: SessionDep, clock: ClockDep, actor: ActorDep, action_id: DbId
) -> ActionPublic:
    return _decide(session, clock, actor, action_id, ActionState.cancelled)


@router.post("/{action_id}/abandon", responses=ILLEGAL_MOVE, **scoped("operator"))
def abandon_action(
    session: SessionDep, clock: ClockDep, actor: ActorDep, action_id: DbId
) -> ActionPublic:
    """Give up on an action whose executor will never answer (its node or cluster gone for
    good): a compensating one, or a move whose cancel or release at its source went
    unanswered 3 times after the target took the job. It ends failed and its saga stops.
    409 for anything else."""
    service.abandon(
        session=session, action_id=action_id, by=actor.name, now=clock.now(), actor=actor
    )
    return service.get_action(session=session, action_id=action_id)
