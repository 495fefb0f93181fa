"""What a finished saga changed, written in the control plane's own view of the cluster
(jobs' allocations and state) until the connector's next telemetry says otherwise. The
saga writes it when an action succeeds; an operator's abandon of a migrate whose target
confirmed the job writes it too (app.actions.service.abandon)."""

from __future__ import annotations

from datetime import datetime

from sqlmodel import Session, col, select

from app.actions.models import Action, ActionKind
from app.actions.moved import record_move
from app.core.lookup import row_id
from app.jobs.models import Allocation, Job
from app.nodes.models import Node
from wire.telemetry import JobState


def record_placement(session: Session, action: Action, job: Job, now: datetime) -> None:
    """What a finished saga changed, in the control plane's own view, until the
    connector's next telemetry says otherwise: a migrated job holds its GPUs on the target
    node now, a preempted one holds none, a started one holds its planned GPUs."""
    kind = ActionKind(action.kind)
    if kind is ActionKind.preempt and not job.checkpointable:
        return  # the scheduler requeued it; its telemetry tells the rest
    if kind is ActionKind.move:
        record_move(session, action, job, now)
        return
    if kind not in (ActionKind.migrate, ActionKind.preempt, ActionKind.start, ActionKind.resume):
        return
    nodes = dict(
        session.exec(select(Node.name, Node.id).where(Node.cluster_id == action.cluster_id)).all()
    )
    if kind in (ActionKind.start, ActionKind.resume):
        # Its confirm saw it running there: the next plan must not count those GPUs free
        # while the connector's next push is still on its way.
        for name, gpus in action.target_placement.items():
            node = nodes.get(name)
            if node is not None and not _holds(session, job, node):
                session.add(
                    Allocation(
                        job_id=row_id(job),
                        node_id=node,
                        gpu_indices=[],
                        gpu_count=gpus,
                        started_at=now,
                    )
                )
        job.state = JobState.running
        job.start_time = job.start_time or now
        job.updated_at = now
        session.add(job)
        return
    held = session.exec(
        select(Allocation).where(
            Allocation.job_id == job.id,
            col(Allocation.released_at).is_(None),
            Allocation.node_id == nodes.get(action.source_node or ""),
        )
    ).all()
    for allocation in held:
        allocation.released_at = now
        session.add(allocation)
    target = nodes.get(action.target_node or "")
    # The scheduler's telemetry may have shown the job on its target already (a requeued
    # Slurm job is seen running there before the saga's last step); it knows best.
    if kind is ActionKind.migrate and target is not None and not _holds(session, job, target):
        session.add(
            Allocation(
                job_id=row_id(job),
                node_id=target,
                gpu_indices=[],  # the target's scheduler or connector assigns devices
                gpu_count=sum(a.gpu_count for a in held) or job.gpus_requested,
                started_at=now,
            )
        )
    if kind is ActionKind.preempt:
        job.state = JobState.suspended
        job.reason = f"preempted by action {action.id}: checkpointed"[:255]
    job.updated_at = now
    session.add(job)


def _holds(session: Session, job: Job, node_id: int) -> bool:
    """Whether the job has an open allocation on the node."""
    return (
        session.exec(
            select(Allocation.id).where(
                Allocation.job_id == job.id,
                col(Allocation.released_at).is_(None),
                Allocation.node_id == node_id,
            )
        ).first()
        is not None
    )
