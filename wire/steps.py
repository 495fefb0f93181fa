"""The saga step protocol: what the control plane asks of an executor and what it answers.

An executor is a node agent (process-level steps, :class:`AgentStep`) or a cluster's
connector (scheduler-level steps, :class:`ConnectorStep`). The control plane
(app/actions/saga.py) sends a :class:`StepRequest` as the one keyword argument ``step`` of
the Celery task named by :func:`wire.queues.step_task` on the executor's queue
(:func:`wire.queues.agent_queue`, :func:`wire.queues.connector_queue`); the executor
answers with a :class:`StepReport` as the keyword argument ``report`` of ``reply_task`` on
``reply_queue``, with its own API token. Both sides build and read the messages with these
classes, so there is one definition of each field.

Every step carries an idempotency ``key`` (an executor that answered it before answers
again from its journal, outcome ``duplicate``) and the saga's fencing ``generation`` (an
executor that has seen a newer one for the workload refuses the step, outcome
``refused``).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from wire.queues import CONTROL_QUEUE, REPLY_TASK


class AgentStep(StrEnum):
    """Process-level steps, run by the node agent of one node, always about one workload."""

    checkpoint = "checkpoint"  # checkpoint the workload into this node's image store
    transfer = "transfer"  # copy a checkpoint image here, verifying every checksum
    restore = "restore"  # start the workload from an image (a no-op if it runs here)
    # resume from an image here when the scheduler next starts the workload on this node
    stage = "stage"
    confirm = "confirm"  # the workload runs here and keeps running
    release = "release"  # stop it here (if it runs) and drop its images


class ConnectorStep(StrEnum):
    """Scheduler-level steps, run by a cluster's connector (connectors.actions says how
    each maps onto the connector's capabilities)."""

    start = "start"
    # A read: the job runs where expected (``args.expect: running``), or nowhere
    # (``stopped``); or, for a job a move submitted here (``accepted``), the scheduler holds
    # it in a state it runs from: queued past its checks, running, or having run.
    confirm = "confirm"
    reserve = "reserve"
    unreserve = "unreserve"
    resume = "resume"
    requeue = "requeue"
    resize = "resize"
    hold = "hold"
    release = "release"
    suspend = "suspend"
    cancel = "cancel"
    # Submit a job to this cluster from another one's ``SubmitSpec`` (args: ``spec``, the
    # spec as JSON; ``name``: the name it gets, unique per move, so a resent submit finds
    # the job it submitted before instead of submitting twice). The report's ``result``
    # carries the new job's ``external_id``.
    submit = "submit"
    # Undo a ``submit``: cancel the job this cluster accepted as move ``args["name"]``, if
    # there is one (a submit whose answer was lost may or may not have reached it). The
    # result's ``external_id`` is the job cancelled, or null when none had arrived.
    withdraw = "withdraw"
    # Take a node out of the scheduler's placement (``workload_id``: the node's name, as the
    # connector reports it; ``args.reason``: why, for the scheduler's record): Slurm's
    # DRAIN, a Kubernetes cordon, Ray's GCS drain. Work already there keeps running.
    # Idempotent: a node already draining or drained is left as it is. Its confirm
    # (``args.expect: drained``) reads the node back reported draining (or down).
    drain = "drain"
    # Give a drained node back to the scheduler (Slurm's RESUME, an uncordon); refused where
    # the scheduler has no such thing (Ray). Its confirm: ``args.expect: up``.
    undrain = "undrain"
    # Move a queued Armada job set to another executor cluster (an operator's: ``POST
    # /clusters/{c}/job-sets/{queue}/{job_set}/move``). ``workload_id``: ``job-set:<queue>/
    # <job set>``; ``args``: ``queue``, ``job_set``, ``executor``. Idempotent by the step's
    # key (a resend moves no job twice); the result's ``moved`` maps each workload to its new
    # job. Refused when a job has left the queue or cannot run on that executor's nodes.
    move_job_set = "move_job_set"
    # Undo a service's resize that may have run although its saga failed (unanswered, or
    # ran and could not be confirmed): if the last resize of the service this connector
    # ran is the forward step ``args.undo_key``, resize the service back to ``args.back_to``
    # replicas, its size before; otherwise (never ran here, or a newer resize ran since)
    # do nothing. It carries the compensation's new generation, so a copy
    # of the forward step still queued behind it is refused as stale: either order leaves
    # the service at the size the failed action found it.
    undo_resize = "undo_resize"


class StepPhase(StrEnum):
    """Which half of a saga a step belongs to: doing the action, or undoing it."""

    forward = "forward"
    compensate = "compensate"


class Outcome(StrEnum):
    executed = "executed"
    duplicate = "duplicate"  # answered from the journal: the step ran before
    refused = "refused"  # stale generation or not runnable here: nothing was touched


class StepRequest(BaseModel):
    """One step for one executor."""

    model_config = ConfigDict(extra="ignore")

    action_id: int
    key: str = Field(min_length=1, max_length=200)
    # A plain string here: an executor refuses a step it does not know instead of dropping it.
    step: str
    phase: str = StepPhase.forward.value
    workload_id: str | None = Field(default=None, max_length=255)
    generation: int = Field(default=0, ge=0)
    args: dict[str, Any] = Field(default_factory=dict)
    reply_task: str = REPLY_TASK
    reply_queue: str = CONTROL_QUEUE

    def answer(self, *, executor: str, ok: bool, **fields: Any) -> StepReport:
        """This step's report from ``executor`` (its action, key and generation)."""
        return StepReport(
            action_id=self.action_id,
            key=self.key,
            ok=ok,
            executor=executor,
            generation=self.generation,
            **fields,
        )


class AgentStepRequest(StepRequest):
    """A step for a node agent: one of AgentStep, always about one workload."""

    step: AgentStep
    workload_id: str = Field(min_length=1, max_length=128)


class StepReport(BaseModel):
    """An executor's answer for one step, sent to the request's ``reply_task``."""

    action_id: int
    key: str
    ok: bool
    outcome: Outcome = Outcome.executed
    result: dict[str, Any] = Field(default_factory=dict)
    error: str | None = None
    retryable: bool = False
    # Who answered: "agent.<cluster>.<node>" or "connector.<cluster>".
    executor: str = ""
    generation: int = 0

    @classmethod
    def replayed(cls, remembered: dict[str, Any]) -> StepReport:
        """A journalled answer sent again for a step that ran before."""
        return cls.model_validate({**remembered, "outcome": Outcome.duplicate})
