from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlmodel import Session, select

from app.actions.models import TRANSITIONS, Action, ActionPublic, ActionState
from app.clusters.models import Cluster
from app.core.errors import Conflict, NotFound
from app.core.paging import Page, count_rows
from app.jobs.models import Job


def list_actions(
    *,
    session: Session,
    cluster: str | None = None,
    state: ActionState | None = None,
    plan_id: int | None = None,
    limit: int = 100,
    offset: int = 0,
) -> Page[ActionPublic]:
    query = (
        sa.select(Action, Cluster.name, Job.external_id)
        .join(Cluster, Cluster.id == Action.cluster_id)  # type: ignore[arg-type]
        .outerjoin(Job, Job.id == Action.job_id)  # type: ignore[arg-type]
    )
    if cluster is not None:
        query = query.where(Cluster.name == cluster)
    if state is not None:
        query = query.where(Action.state == state.value)
    if plan_id is not None:
        query = query.where(Action.plan_id == plan_id)
    total = count_rows(session, query)
    rows = session.execute(query.order_by(Action.id.desc()).limit(limit).offset(offset))  # type: ignore[union-attr]
    items = [_public(a, c, j) for a, c, j in rows]
    return Page[ActionPublic](items=items, total=total, limit=limit, offset=offset)


def get_action(*, session: Session, action_id: int) -> ActionPublic:
    row = session.execute(
        sa.select(Action, Cluster.name, Job.external_id)
        .join(Cluster, Cluster.id == Action.cluster_id)  # type: ignore[arg-type]
        .outerjoin(Job, Job.id == Action.job_id)  # type: ignore[arg-type]
        .where(Action.id == action_id)
    ).first()
    if row is None:
        raise NotFound(
            f"action {action_id} does not exist", resource="action", resource_id=action_id
        )
    return _public(*row)


def transition(
    *,
    session: Session,
    action_id: int,
    to: ActionState,
    by: str,
    now: datetime,
    error: str | None = None,
) -> Action:
    """Move an action along its state machine; an illegal move is a Conflict, not a no-op."""
    action = session.exec(select(Action).where(Action.id == action_id).with_for_update()).first()
    if action is None:
        raise NotFound(
            f"action {action_id} does not exist", resource="action", resource_id=action_id
        )
    current = ActionState(action.state)
    if to not in TRANSITIONS[current]:
        raise Conflict(
            f"action {action_id} is {current.value}; it cannot become {to.value}",
            resource="action",
            resource_id=action_id,
            details={"state": current.value},
        )
    action.state = to
    action.updated_at = now
    if to in (ActionState.approved, ActionState.rejected, ActionState.cancelled):
        action.decided_by, action.decided_at = by, now
    if error is not None:
        action.error = error
    session.add(action)
    session.commit()
    session.refresh(action)
    return action


def _public(action: Action, cluster: str, job_external_id: str | None) -> ActionPublic:
    return ActionPublic.model_validate(
        action, update={"cluster": cluster, "job_external_id": job_external_id}
    )
