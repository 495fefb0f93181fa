"""What a move leaves behind once its target has the job: the home row ended with where
the job went, the GPUs it held at home freed, and the job's row at the target written at
the move's generation. Written by the saga when a move succeeds (app.actions.saga) and by
an operator's abandon of a move stuck at its source (app.actions.service)."""

from __future__ import annotations

from datetime import datetime

from sqlmodel import Session, col, select

from app.actions.models import Action, ActionStep
from app.clusters.models import Cluster
from app.core.lookup import row_id
from app.jobs.models import Allocation, Job
from wire.steps import ConnectorStep, StepPhase
from wire.telemetry import JobState


def record_move(
    session: Session, action: Action, job: Job, now: datetime, *, unconfirmed: str | None = None
) -> None:
    """A moved job is gone from its cluster (its connector's next push says cancelled),
    and so are the GPUs it held there; its reason says where it went. ``unconfirmed``: why
    its home copy's end was never confirmed (an operator abandoned the move's last steps),
    added to the reason."""
    submitted = session.exec(
        select(ActionStep).where(
            ActionStep.action_id == action.id,
            ActionStep.phase == StepPhase.forward,
            ActionStep.name == ConnectorStep.submit,
        )
    ).one()
    target = session.get(Cluster, action.target_cluster_id) if action.target_cluster_id else None
    for allocation in session.exec(
        select(Allocation).where(Allocation.job_id == job.id, col(Allocation.released_at).is_(None))
    ):  # a running job's GPUs at its source are free now
        allocation.released_at = now
        session.add(allocation)
    if target is not None and submitted.result.get("external_id") is not None:
        fence_arrival(session, job, target, str(submitted.result["external_id"]), action, now)
    job.state = JobState.cancelled
    job.end_time = job.end_time or now
    job.reason = (
        f"moved to {target.name if target else 'another cluster'} as job "
        f"{submitted.result.get('external_id')} by action {action.id}"
        + (f"; {unconfirmed}" if unconfirmed else "")
    )[:255]
    job.updated_at = now
    session.add(job)


def fence_arrival(
    session: Session, job: Job, target: Cluster, external_id: str, action: Action, now: datetime
) -> None:
    """The moved job's row at the target, at least at the move's generation: the target's
    connector and node agent have fenced its new id at that generation (a running job's
    steps there name it), so a later saga of it must come after. Written ahead of the
    target's telemetry when that has not reported it yet (it fills in the rest).

    The target's row is locked first, as its connector's ingest locks it
    (``app.telemetry.ingest._lock_cluster``): the two take turns, so the ingest either
    finds the row written here or has written its own first. Without it each could
    insert the same job, one waiting on the other's uncommitted unique key while that one
    waited for a row the first held (a deadlock, or a push failing on the duplicate)."""
    session.exec(
        select(Cluster.id).where(Cluster.id == target.id).with_for_update(key_share=True)
    ).first()
    arrived = session.exec(
        select(Job)
        .where(Job.cluster_id == target.id, Job.external_id == external_id)
        .with_for_update()
    ).first()
    if arrived is None:
        arrived = Job(
            cluster_id=row_id(target),
            external_id=external_id,
            name=job.name,
            team=job.team,
            kind=job.kind,
            shape=job.shape,
            priority=job.priority,
            gpus_requested=job.gpus_requested,
            checkpointable=job.checkpointable,
            state=JobState(job.state),  # as it was at home: pending, or running restored
            submit_time=now,
            submit_spec=job.submit_spec,
            reason=f"arrived from {job.external_id} by action {action.id}"[:255],
            updated_at=now,
        )
    arrived.generation = max(arrived.generation, action.fencing_token)
    session.add(arrived)
