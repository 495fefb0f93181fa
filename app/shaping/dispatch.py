"""Phase 6 of the shaping cycle: hand a plan's approved actions to the saga runner.

In ``enforce`` mode the cycle persists its actions as ``approved`` (by ``shaper``); in
``advise`` mode an operator approves them through the API. Either way an approved action
becomes a saga when ``app.actions.tasks.advance`` runs for it; this module only says which
actions of a plan are ready. The periodic sweep dispatches anything approved that was
missed (a crash between the commit and the kick), so kicking is an optimisation, not a
duty.
"""

from __future__ import annotations

from sqlmodel import Session, col, select

from app.actions.models import Action, ActionState


def approved_actions(*, session: Session, plan_id: int) -> list[int]:
    """Ids of the plan's actions that wait for dispatch, oldest first."""
    ids = session.exec(
        select(col(Action.id))
        .where(Action.plan_id == plan_id, Action.state == ActionState.approved)
        .order_by(col(Action.id))
    )
    return [i for i in ids if i is not None]  # a primary key is never NULL
