"""The shaping cycle for one cluster, in numbered phases over an immutable snapshot.

1. **Snapshot** the cluster's nodes, open allocations, live jobs, demand history and SLA
   policy in one read (``snapshot.take_snapshot``).
2. **Instance**: map the snapshot to a pure ``solver.Instance`` (``snapshot.to_instance``).
3. **Solve** with the cluster's policy (``fifo`` | ``backfill`` | ``priority`` | ``shaper``).
4. **Validate** the plan with the solver-agnostic checker; an invalid plan is stored with
   its violations and produces no action.
5. **Persist** the plan with a reason for every decision and every job left pending, and
   its actions: in ``observe`` mode none; in ``advise`` mode ``proposed`` (an operator
   approves or rejects them); in ``enforce`` mode ``approved`` by ``shaper``. Proposals of
   earlier cycles that nobody decided on are cancelled: the newest plan supersedes them.
6. **Dispatch** of approved actions (``dispatch.approved_actions``, kicked by the task that
   runs the cycle) is the saga runner's job: ``app.actions.saga``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlmodel import Session, select

from app.actions.models import Action, ActionKind, ActionState
from app.clusters.models import ShapingMode
from app.plans.models import Plan
from app.shaping.snapshot import ClusterSnapshot, take_snapshot, to_instance
from solver import Instance, SolverConfig, validate
from solver import plan as sp
from solver.policies import get_policy

SHAPER = "shaper"


@dataclass(frozen=True)
class CycleResult:
    plan_id: int
    actions: int
    violations: int
    status: str


def run_cycle(
    *,
    session: Session,
    cluster_name: str,
    now: datetime,
    policy: str | None = None,
    config: SolverConfig | None = None,
) -> CycleResult:
    snapshot = take_snapshot(session=session, cluster_name=cluster_name, now=now)  # 1
    instance = to_instance(snapshot, config=config)  # 2
    policy_name = policy or snapshot.policy
    plan = get_policy(policy_name).plan(instance)  # 3
    violations = validate(instance, plan)  # 4
    return _persist(
        session, snapshot, instance, plan, policy_name, [str(v) for v in violations], now
    )  # 5


def _local(name: str) -> str:
    return name.split("/", 1)[1]


def _nodes(placement: dict[str, int]) -> str | None:
    return ",".join(sorted(_local(n) for n in placement)) or None


def _persist(
    session: Session,
    snapshot: ClusterSnapshot,
    instance: Instance,
    plan: sp.Plan,
    policy_name: str,
    violations: list[str],
    now: datetime,
) -> CycleResult:
    decisions: list[dict[str, Any]] = [
        {
            "job": _local(a.job_id),
            "action": a.kind.value,
            "from": _nodes(a.from_placement),
            "to": _nodes(a.to_placement),
            "replicas": a.replicas,
            "reason": a.reason.code.value,
            "message": a.reason.message,
        }
        for a in plan.actions
    ] + [
        {
            "job": _local(job_id),
            "action": "wait",
            "reason": reason.code.value,
            "message": reason.message,
        }
        for job_id, reason in sorted(plan.pending.items())
    ]
    stats = plan.stats
    row = Plan(
        cluster_id=snapshot.cluster_id,
        created_at=now,
        policy=policy_name,
        engine=stats.engine,
        mode=snapshot.mode,
        status="invalid" if violations else stats.status.value,
        objective=stats.objective,
        best_bound=stats.best_bound,
        gap=stats.gap,
        wall_time_s=stats.wall_time_s,
        decisions=decisions,
        summary={
            "jobs": len(instance.jobs),
            "nodes": len(instance.nodes),
            "gpus": sum(n.gpus for n in instance.nodes),
            "note": stats.note,
            "violations": violations,
        },
    )
    session.add(row)
    session.flush()
    _supersede_proposals(session, snapshot.cluster_id, now)
    created = 0
    if not violations and snapshot.mode != ShapingMode.observe:
        enforce = snapshot.mode == ShapingMode.enforce
        job_ids = {j.external_id: j.id for j in snapshot.jobs}
        for action in plan.actions:
            external_id = _local(action.job_id)
            session.add(
                Action(
                    plan_id=row.id,
                    cluster_id=snapshot.cluster_id,
                    job_id=job_ids.get(external_id),
                    kind=ActionKind(action.kind.value),
                    state=ActionState.approved if enforce else ActionState.proposed,
                    idempotency_key=f"{snapshot.cluster}:{row.id}:{external_id}:{action.kind.value}",
                    reason=f"{action.reason.code.value}: {action.reason.message}"[:2048],
                    source_node=_nodes(action.from_placement),
                    target_node=_nodes(action.to_placement),
                    target_replicas=action.replicas,
                    created_at=now,
                    updated_at=now,
                    decided_by=SHAPER if enforce else None,
                    decided_at=now if enforce else None,
                )
            )
            created += 1
    session.commit()
    return CycleResult(
        plan_id=row.id,
        actions=created,
        violations=len(violations),  # type: ignore[arg-type]
        status=row.status,
    )


def _supersede_proposals(session: Session, cluster_id: int, now: datetime) -> None:
    stale = session.exec(
        select(Action).where(Action.cluster_id == cluster_id, Action.state == ActionState.proposed)
    ).all()
    for action in stale:
        action.state = ActionState.cancelled
        action.decided_by, action.decided_at, action.updated_at = SHAPER, now, now
        action.error = "superseded by a newer plan"
        session.add(action)
