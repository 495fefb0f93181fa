"""What a finished saga changed, written in the control plane's own view of the cluster
(jobs' allocations and state) until the connector's next telemetry says otherwise. The
saga writes it when an action succeeds; an operator's abandon of a migrate whose target
confirmed the job writes it too (app.actions.service.abandon)."""

from __future__ import annotations

from datetime import datetime

from sqlmodel import Session, col, select

from app.actions.models import Action, ActionKind, node_names
from app.actions.moved import record_move
from app.core.lookup import row_id
from app.jobs.models import Allocation, Job
from app.nodes.models import Node
from wire.telemetry import JobState


def record_placement(session: Session, action: Action, job: Job, now: datetime) -> None:
    """What a finished saga changed, in the control plane's own view, until the
    connector's next telemetry says otherwise: a migrated job holds its GPUs on the target
    node(s) now, a preempted one holds none, a started one holds its planned GPUs."""
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
        _hold(session, job, nodes, action.target_placement, now)
        job.state = JobState.running
        job.start_time = job.start_time or now
        job.updated_at = now
        session.add(job)
        return
    # A gang's move names several nodes on either side (recipes), comma-separated.
    sources = [nodes[n] for n in node_names(action.source_node) if n in nodes]
    held = session.exec(
        select(Allocation).where(
            Allocation.job_id == job.id,
            col(Allocation.released_at).is_(None),
            col(Allocation.node_id).in_(sources),
        )
    ).all()
    for allocation in held:
        allocation.released_at = now
        session.add(allocation)
    targets = node_names(action.target_node)
    if kind is ActionKind.migrate:
        moved = sum(a.gpu_count for a in held) or job.gpus_requested
        landing = dict(action.target_placement) or dict.fromkeys(targets[:1], moved)
        _hold(session, job, nodes, landing, now)
    if kind is ActionKind.preempt:
        job.state = JobState.suspended
        job.reason = f"preempted by action {action.id}: checkpointed"[:255]
    job.updated_at = now
    session.add(job)


def _hold(
    session: Session, job: Job, nodes: dict[str, int | None], gpus: dict[str, int], now: datetime
) -> None:
    """Allocations for the job on the nodes of ``gpus`` (name -> GPUs) it does not hold yet:
    the scheduler's telemetry may show it there already (a requeued Slurm job is seen
    running on its target before the saga's last step), and it knows best. No GPU indices:
    the scheduler or its connector assigns them."""
    for name, count in gpus.items():
        node = nodes.get(name)
        if node is not None and not _holds(session, job, node):
            session.add(
                Allocation(
                    job_id=row_id(job),
                    node_id=node,
                    gpu_indices=[],
                    gpu_count=count,
                    started_at=now,
                )
            )


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
