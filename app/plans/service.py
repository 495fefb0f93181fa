from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel import Session, col, select

from app.actions import service as action_service
from app.actions.models import Action, ActionKind, ActionState, ActionStep
from app.audit import service as audit
from app.audit.models import Actor
from app.audit.service import AuditObject
from app.clusters.models import Cluster
from app.core.errors import Conflict
from app.core.lookup import found, row_id
from app.core.paging import Page, count_rows
from app.gpu_models.models import GpuModel
from app.jobs.models import Job
from app.nodes.models import Node
from app.plans import placement
from app.plans.models import (
    JobDecisions,
    NodePlacement,
    PlacedJob,
    Plan,
    PlanDecisionOnJob,
    PlanPlacement,
    PlanPublic,
    PlanState,
    PlanStepPublic,
)

# Actions that hold or give back GPUs for another action: they move no job.
HOLDS = (ActionKind.reserve, ActionKind.unreserve)


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
    items = [_public(p, name) for p, name in rows]
    return Page[PlanPublic](items=items, total=total, limit=limit, offset=offset)


def get_plan(*, session: Session, plan_id: int) -> PlanPublic:
    row = session.execute(
        sa.select(Plan, col(Cluster.name))
        .outerjoin(Cluster, col(Cluster.id) == Plan.cluster_id)
        .where(col(Plan.id) == plan_id)
    ).first()
    plan, name = found(row, f"plan {plan_id} does not exist", resource="plan", resource_id=plan_id)
    return _public(plan, name)


def _public(plan: Plan, cluster: str | None) -> PlanPublic:
    # The stored placement is GET /plans/{id}/placement's: a list of plans stays small.
    summary = {k: v for k, v in plan.summary.items() if k != placement.SUMMARY_KEY}
    return PlanPublic.model_validate(plan, update={"cluster": cluster, "summary": summary})


def plan_placement(*, session: Session, plan_id: int) -> PlanPlacement:
    """The plan's placement before and after, node by node (``app.plans.placement``):
    as stored with the plan, or rebuilt from its actions for a plan stored without it."""
    plan = found(
        session.get(Plan, plan_id),
        f"plan {plan_id} does not exist",
        resource="plan",
        resource_id=plan_id,
    )
    kept = plan.summary.get(placement.SUMMARY_KEY)
    complete = isinstance(kept, dict)
    stored: dict[str, Any]
    if isinstance(kept, dict):
        stored = kept
    else:
        actions = session.exec(
            select(Action)
            .where(Action.plan_id == plan_id, col(Action.kind).not_in(HOLDS))
            .order_by(col(Action.id))
        ).all()
        stored = placement.from_actions(
            (job, a.source_placement, a.target_placement)
            for a, job in zip(actions, _external_ids(session, actions), strict=True)
        )
        stored = _sizes(session, plan.cluster_id, stored)
    cluster = session.get(Cluster, plan.cluster_id) if plan.cluster_id is not None else None
    nodes: dict[str, Any] = stored["nodes"]
    names = {job for n in nodes.values() for part in ("before", "after") for job in n[part]}
    ids = _job_ids(session, plan.cluster_id, names)

    def placed(jobs: dict[str, int], indices: dict[str, list[int]]) -> list[PlacedJob]:
        return [
            PlacedJob(job=job, job_id=ids.get(job), gpus=gpus, gpu_indices=indices.get(job, []))
            for job, gpus in jobs.items()
        ]

    return PlanPlacement(
        plan_id=plan_id,
        cluster=cluster.name if cluster is not None else None,
        complete=complete,
        nodes=[
            NodePlacement(
                node=name,
                gpu_model=node["gpu_model"],
                gpus=node["gpus"],
                before=placed(node["before"], node.get("indices_before", {})),
                after=placed(node["after"], node.get("indices_after", {})),
            )
            for name, node in nodes.items()
        ],
    )


def _external_ids(session: Session, actions: Sequence[Action]) -> list[str]:
    """Each action's job's external id (its action id when the job's row is gone)."""
    wanted = {a.job_id for a in actions if a.job_id is not None}
    rows = (
        session.execute(sa.select(col(Job.id), col(Job.external_id)).where(col(Job.id).in_(wanted)))
        .tuples()
        .all()
    )
    names: dict[int | None, str] = dict(rows)
    return [names.get(a.job_id, f"action {a.id}") for a in actions]


def _sizes(session: Session, cluster_id: int | None, rebuilt: dict[str, Any]) -> dict[str, Any]:
    """A rebuilt placement with its nodes' sizes as they are now."""
    rows = session.execute(
        sa.select(col(Node.name), col(Node.gpu_count), col(GpuModel.name))
        .outerjoin(GpuModel, col(GpuModel.id) == Node.gpu_model_id)
        .where(col(Node.cluster_id) == cluster_id, col(Node.name).in_(list(rebuilt["nodes"])))
    ).all()
    for name, gpus, model in rows:
        rebuilt["nodes"][name].update(gpus=gpus, gpu_model=model)
    return rebuilt


def _job_ids(session: Session, cluster_id: int | None, names: set[str]) -> dict[str, int]:
    rows = (
        session.execute(
            sa.select(col(Job.external_id), col(Job.id)).where(
                col(Job.cluster_id) == cluster_id, col(Job.external_id).in_(names)
            )
        )
        .tuples()
        .all()
    )
    return dict(rows)


def plan_steps(*, session: Session, plan_id: int) -> list[PlanStepPublic]:
    """Every saga step of the plan's actions, by action and then in step order: the plan
    page's account of what ran where, in one reply rather than one per action."""
    found(
        session.get(Plan, plan_id),
        f"plan {plan_id} does not exist",
        resource="plan",
        resource_id=plan_id,
    )
    steps = session.exec(
        select(ActionStep)
        .join(Action, col(Action.id) == ActionStep.action_id)
        .where(Action.plan_id == plan_id)
        .order_by(col(ActionStep.action_id), col(ActionStep.seq))
    ).all()
    return [PlanStepPublic.model_validate(step) for step in steps]


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
        # FOR NO KEY UPDATE: see action_service.lock_plan_of.
        session.exec(
            select(Plan).where(Plan.id == plan_id).with_for_update(key_share=True)
        ).first(),
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
