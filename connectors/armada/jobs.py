"""Armada jobs as the connector keeps them: folded from each job set's event stream.

Armada reports a job only through events (``pkg/api/event.proto``), in the order the
docs give for its lifecycle: submitted → queued → leased (the scheduler chose an executor
cluster) → pending (the pod is being created on a node) → running → succeeded, failed,
cancelled or preempted. A lease can be returned or expire (the job queues again), and
``cancelling``/``preempting``/``reprioritizing`` announce what the matching event then
confirms. :func:`apply` folds one event into a job; nothing here knows of gRPC or
protobuf (connectors.armada.proto turns messages into :class:`JobEvent`).

**Workloads across resubmissions.** Armada cannot stop a job and run the same job again:
a job that Shaper preempts with a checkpoint, holds or moves is cancelled and submitted
anew, under a new job id. The new job carries the annotation ``shaper.io/workload`` (the
first job's id) and ``shaper.io/attempt``, so Shaper sees one workload whose external id
never changes; :func:`current_attempts` picks each workload's newest job.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum

# Annotations the connector writes on jobs it submits again (and reads back from events).
WORKLOAD_ANNOTATION = "shaper.io/workload"
ATTEMPT_ANNOTATION = "shaper.io/attempt"
# The queue a job held in the hold queue belongs to.
HOME_QUEUE_ANNOTATION = "shaper.io/home-queue"
# When the workload's first job was submitted (ISO 8601): a job submitted again keeps its
# place in the queue's history (Shaper's wait times count from it).
FIRST_SUBMITTED_ANNOTATION = "shaper.io/first-submitted"
# The Armada priority the workload was first submitted at. A plan's start puts a job first
# in its queue by lowering its priority; the job's later attempts (a requeue, a move) go
# back to this one, so one start does not keep it ahead of its queue for good.
OWN_PRIORITY_ANNOTATION = "shaper.io/own-priority"
# The same keys as the Kubernetes connector's (connectors.kubernetes.pods): Armada runs
# jobs as Kubernetes pods, and a job's pod reads where to resume from the same places.
RESUME_FROM = "shaper.io/resume-from"
RESUME_FROM_ENV = "SHAPER_RESUME_FROM"
STOPPED_BY_STEP = "shaper.io/stopped-by-step"
CHECKPOINTABLE_ANNOTATION = "shaper.io/checkpointable"


class Phase(StrEnum):
    queued = "queued"
    leased = "leased"
    pending = "pending"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"
    preempted = "preempted"


TERMINAL_PHASES = frozenset({Phase.succeeded, Phase.failed, Phase.cancelled, Phase.preempted})


class EventKind(StrEnum):
    """The events of ``EventMessage`` the connector folds (the rest: utilisation, ingress
    info, are read and skipped)."""

    submitted = "submitted"
    queued = "queued"
    leased = "leased"
    lease_returned = "lease_returned"
    lease_expired = "lease_expired"
    pending = "pending"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancelling = "cancelling"
    cancelled = "cancelled"
    preempting = "preempting"
    preempted = "preempted"
    reprioritizing = "reprioritizing"
    reprioritized = "reprioritized"


@dataclass(frozen=True)
class JobSpec:
    """What a job asked for, from its ``submitted`` event. ``encoded`` is the submitted
    job itself (serialized), kept only to submit it again."""

    priority: float
    namespace: str
    labels: dict[str, str]
    annotations: dict[str, str]
    node_selector: dict[str, str]
    gpus: int
    encoded: bytes = field(repr=False)

    @property
    def workload_id(self) -> str | None:
        return self.annotations.get(WORKLOAD_ANNOTATION)

    @property
    def attempt(self) -> int:
        value = self.annotations.get(ATTEMPT_ANNOTATION, "0")
        return int(value) if value.isdigit() else 0


@dataclass(frozen=True)
class JobEvent:
    message_id: str
    kind: EventKind
    job_id: str
    queue: str
    job_set: str
    at: datetime | None = None
    executor: str = ""
    node: str = ""
    reason: str = ""
    priority: float | None = None
    spec: JobSpec | None = None


@dataclass(frozen=True)
class ArmadaJob:
    job_id: str
    queue: str
    job_set: str
    spec: JobSpec
    phase: Phase = Phase.queued
    priority: float = 0.0
    executor: str = ""
    node: str = ""
    # What Armada last said about it: a failure's reason, "cancelling", "preempting".
    reason: str = ""
    submitted_at: datetime | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None

    @property
    def workload_id(self) -> str:
        return self.spec.workload_id or self.job_id

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL_PHASES

    @property
    def own_priority(self) -> float:
        """The workload's own Armada priority: its first submission's, whatever a start has
        set since (an in-place ``ReprioritizeJobs`` changes ``priority``, not the spec)."""
        stamp = self.spec.annotations.get(OWN_PRIORITY_ANNOTATION)
        try:
            return float(stamp) if stamp is not None else self.spec.priority
        except ValueError:
            return self.spec.priority

    @property
    def first_submitted_at(self) -> datetime | None:
        """When the workload's first job was submitted (this one's time for a first job)."""
        stamp = self.spec.annotations.get(FIRST_SUBMITTED_ANNOTATION)
        if stamp is None:
            return self.submitted_at
        try:
            parsed = datetime.fromisoformat(stamp)
        except ValueError:
            return self.submitted_at
        return parsed if parsed.tzinfo is not None else self.submitted_at

    @property
    def active(self) -> bool:
        """Holds or is about to hold a node: leased, pending or running."""
        return self.phase in (Phase.leased, Phase.pending, Phase.running)


def apply(job: ArmadaJob | None, event: JobEvent) -> ArmadaJob | None:
    """The job after ``event``; None while its ``submitted`` event was not seen (a stream
    read from a later message id: nothing is known of what it asked for)."""
    if event.kind is EventKind.submitted:
        if job is not None or event.spec is None:
            return job  # a replayed submission changes nothing
        return ArmadaJob(
            job_id=event.job_id,
            queue=event.queue,
            job_set=event.job_set,
            spec=event.spec,
            priority=event.spec.priority,
            submitted_at=event.at,
        )
    if job is None:
        return None
    if job.terminal:
        return job  # Armada sends nothing after the end; a stray event must not revive it
    kind = event.kind
    if kind is EventKind.queued:
        return replace(job, phase=Phase.queued, executor="", node="", reason="")
    if kind is EventKind.leased:
        return replace(job, phase=Phase.leased, executor=event.executor, node="", reason="")
    if kind in (EventKind.lease_returned, EventKind.lease_expired):
        # The executor gave the job back (or never took it): it queues again.
        reason = event.reason or kind.value.replace("_", " ")
        return replace(job, phase=Phase.queued, executor="", node="", reason=reason)
    if kind is EventKind.pending:
        return replace(job, phase=Phase.pending, executor=event.executor or job.executor)
    if kind is EventKind.running:
        return replace(
            job,
            phase=Phase.running,
            executor=event.executor or job.executor,
            node=event.node or job.node,
            started_at=job.started_at or event.at,
            reason="",
        )
    if kind in (EventKind.cancelling, EventKind.preempting):
        return replace(job, reason=kind.value)
    if kind in (EventKind.reprioritizing, EventKind.reprioritized):
        if event.priority is None:
            return job
        return replace(job, priority=event.priority)
    ended = {
        EventKind.succeeded: Phase.succeeded,
        EventKind.failed: Phase.failed,
        EventKind.cancelled: Phase.cancelled,
        EventKind.preempted: Phase.preempted,
    }[kind]
    return replace(
        job,
        phase=ended,
        node=event.node or job.node,
        reason=event.reason or ("" if ended is Phase.succeeded else ended.value),
        ended_at=event.at,
    )


def current_attempts(jobs: dict[str, ArmadaJob]) -> dict[str, ArmadaJob]:
    """Each workload's newest job, by workload id: the highest attempt, then the latest
    submitted (an earlier attempt that was cancelled to be submitted again is history)."""
    newest: dict[str, ArmadaJob] = {}
    for job in jobs.values():
        seen = newest.get(job.workload_id)
        if seen is None or _order(job) > _order(seen):
            newest[job.workload_id] = job
    return newest


def _order(job: ArmadaJob) -> tuple[int, float, str]:
    submitted = job.submitted_at.timestamp() if job.submitted_at is not None else 0.0
    return (job.spec.attempt, submitted, job.job_id)
