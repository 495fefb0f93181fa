from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel import Session, col, select

from app.actions import service as action_service
from app.actions.models import Action, ActionState
from app.audit import service as audit
from app.audit.models import Actor
from app.audit.service import AuditObject
from app.clusters.models import Cluster
from app.core.errors import Conflict
from app.core.lookup import found, row_id
from app.core.paging import Page, count_rows
from app.jobs.models import Job
from app.plans.models import JobDecisions, Plan, PlanDecisionOnJob, PlanPublic, PlanState


def list_plans(
    *,
    session: Session,
    cluster: str | None = None,
    state: PlanState | None = None,
    limit: int = 50,
    offset: int = 0,
) -> Page[PlanPublic]:
    query = sa.select(Plan, col(Cluster.name)).outerjoin(
        Cluster, col(Cluster.id) == Plan.cluster_id
    )
    if cluster is not None:
        query = query.where(col(Cluster.name) == cluster)
    if state is not None:
        query = query.where(col(Plan.state) == state.value)
    total = count_rows(session, query)
    rows = session.execute(
        query.order_by(col(Plan.created_at).desc(), col(Plan.id).desc()).limit(limit).offset(offset)
    )
    items = [PlanPublic.model_validate(p, update={"cluster": name}) for p, name in rows]
    return Page[PlanPublic](items=items, total=total, limit=limit, offset=offset)


def get_plan(*, session: Session, plan_id: int) -> PlanPublic:
    row = session.execute(
        sa.select(Plan, col(Cluster.name))
        .outerjoin(Cluster, col(Cluster.id) == Plan.cluster_id)
        .where(col(Plan.id) == plan_id)
    ).first()
    plan, name = found(row, f"plan {plan_id} does not exist", resource="plan", resource_id=plan_id)
    return PlanPublic.model_validate(plan, update={"cluster": name})


def latest_decisions(*, session: Session, cluster: str, jobs: list[str]) -> JobDecisions:
    """The latest plan of ``cluster`` (the order of GET /plans), its decisions for ``jobs``
    (external ids) only."""
    cluster_id = found(
        session.exec(select(Cluster.id).where(Cluster.name == cluster)).first(),
        f"cluster {cluster!r} does not exist",
        resource="cluster",
        resource_id=cluster,
    )
    plan = session.exec(
        select(Plan)
        .where(Plan.cluster_id == cluster_id)
        .order_by(col(Plan.created_at).desc(), col(Plan.id).desc())
        .limit(1)
    ).first()
    if plan is None:
        return JobDecisions(cluster=cluster, plan_id=None, created_at=None, decisions=[])
    wanted = set(jobs)
    return JobDecisions(
        cluster=cluster,
        plan_id=plan.id,
        created_at=plan.created_at,
        decisions=[d for d in plan.decisions if d.get("job") in wanted],
    )


def job_decision_history(*, session: Session, job_id: int, plans: int) -> list[PlanDecisionOnJob]:
    """What the latest ``plans`` plans of the job's cluster decided about it, newest first
    (a plan without a decision about the job gives none).

    A plan's decisions are one JSON document with a decision per waiting job of its
    cluster: the database picks out the job's (``json_each``, ``json_array_elements``)
    rather than every decision of every plan being loaded here — 50 plans of 10,000
    waiting jobs took a second that way."""
    cluster_id, external_id = found(
        session.execute(
            sa.select(col(Job.cluster_id), col(Job.external_id)).where(col(Job.id) == job_id)
        ).first(),
        f"job {job_id} does not exist",
        resource="job",
        resource_id=job_id,
    )
    latest = (
        sa.select(col(Plan.id))
        .where(col(Plan.cluster_id) == cluster_id)
        .order_by(col(Plan.created_at).desc(), col(Plan.id).desc())
        .limit(plans)
        .scalar_subquery()
    )
    decisions = col(Plan.decisions)
    decision: Any
    if session.connection().dialect.name == "postgresql":
        elements = (
            sa.func.json_array_elements(decisions)
            .table_valued(
                sa.column("value", sa.JSON), with_ordinality="position", joins_implicitly=True
            )
            .render_derived("element")
        )
        decision, position = elements.c.value, elements.c.position
        about_job = decision.op("->>")("job") == external_id
    else:
        elements = sa.func.json_each(decisions).table_valued(
            sa.column("value", sa.JSON), sa.column("key"), joins_implicitly=True
        )
        decision, position = elements.c.value, elements.c.key
        about_job = sa.func.json_extract(decision, "$.job") == external_id
    rows = session.execute(
        sa.select(col(Plan.id), col(Plan.created_at), col(Plan.mode), col(Plan.state), decision)
        .select_from(Plan)
        .join(elements, sa.true())
        .where(col(Plan.id).in_(latest), about_job)
        .order_by(col(Plan.created_at).desc(), col(Plan.id).desc(), position)
    )
    return [
        PlanDecisionOnJob(
            plan_id=plan_id, created_at=created_at, mode=mode, plan_state=state, decision=value
        )
        for plan_id, created_at, mode, state, value in rows
    ]


def decide_plan(
    *,
    session: Session,
    plan_id: int,
    approve: bool,
    by: str,
    now: datetime,
    actor: Actor | None = None,
) -> tuple[PlanPublic, list[int]]:
    """Approve or reject every proposed action of a plan at once. Returns the plan and the
    ids of the actions approved (for dispatch). Only a proposed plan can be decided;
    rejecting one that was approved in part withdraws only what is still proposed (and,
    through the dependency groups, what waits for it)."""
    plan = found(
        session.exec(select(Plan).where(Plan.id == plan_id).with_for_update()).first(),
        f"plan {plan_id} does not exist",
        resource="plan",
        resource_id=plan_id,
    )
    if PlanState(plan.state) is not PlanState.proposed:
        why = f" ({plan.state_reason})" if plan.state_reason else ""
        raise Conflict(
            f"plan {plan_id} is {plan.state}{why}; only a proposed plan can be "
            f"{'approved' if approve else 'rejected'}",
            resource="plan",
            resource_id=plan_id,
            details={"state": plan.state},
        )
    proposed = session.exec(
        select(Action)
        .where(Action.plan_id == plan_id, Action.state == ActionState.proposed)
        .order_by(col(Action.id))
        .with_for_update()
    ).all()
    target = ActionState.approved if approve else ActionState.rejected
    decided: list[int] = []
    for action in proposed:
        if ActionState(action.state) is not ActionState.proposed:
            continue  # rejected with a prerequisite a moment ago
        action.state, action.updated_at = target, now
        action.decided_by, action.decided_at = by, now
        session.add(action)
        decided.append(row_id(action))
        if not approve:
            action_service.ended(session=session, action=action, now=now)
    # Rejecting a plan an operator approved in part stops what has not started; what was
    # approved before goes on, and the plan with it.
    remaining = session.exec(
        select(Action.id).where(
            Action.plan_id == plan_id,
            col(Action.state).in_(
                [ActionState.approved, ActionState.dispatched, ActionState.running]
            ),
        )
    ).first()
    before = plan.state
    plan.state = PlanState.approved if approve or remaining is not None else PlanState.rejected
    plan.decided_by, plan.decided_at = by, now
    session.add(plan)
    audit.record(
        session=session,
        actor=actor,
        verb="approve" if approve else "reject",
        object_type=AuditObject.plan,
        object_id=plan_id,
        now=now,
        changes={
            "state": [before, plan.state],
            "actions": decided,
        },
    )
    session.commit()
    return get_plan(session=session, plan_id=plan_id), decided if approve else []
