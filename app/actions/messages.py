"""How a saga step becomes a message to its executor: a ``wire.steps.StepRequest`` on the
step's queue, whose arguments come from the action and from the results of earlier steps
(the checkpoint's image, the transfer's and the stage's directories).

The state machine (``app.actions.saga``) decides when a step is sent and sends what
:func:`step_message` returns once its transaction has committed (:class:`Outgoing`); the
steps themselves come from ``app.actions.recipes``. The arguments are kept apart from both
because they follow what the executors read (``agent/``, ``connectors/actions.py``),
not how a saga advances.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.actions.models import Action, ActionKind, ActionStep
from app.jobs.models import Job
from wire.queues import CONTROL_QUEUE, REPLY_TASK, is_connector_queue, step_task
from wire.steps import AgentStep, ConnectorStep, StepPhase, StepRequest

# Long enough for a real move (checkpoint + transfer + restore); a reservation is consumed
# when its job starts and given back when what it was for is withdrawn, so this only bounds
# a give-back that never arrives.
RESERVATION_TTL_S = 3600.0


@dataclass(frozen=True)
class Outgoing:
    """A message to send once the transaction that decided it has committed."""

    queue: str
    task: str
    kwargs: dict[str, Any]
    countdown: float = 0.0


def step_message(
    action: Action,
    job: Job | None,
    step: ActionStep,
    steps: list[ActionStep],
    start_wait_s: float,
) -> Outgoing:
    """The message for a step; arguments come from the results of earlier steps.

    ``start_wait_s``: how long an agent's confirm after a stage waits for the scheduler to
    start the job (the saga's SCHEDULER_START_WAIT_S unless told)."""
    by_name = {(s.phase, s.name): s for s in steps}
    checkpoint = by_name.get((StepPhase.forward, AgentStep.checkpoint))
    transfer = by_name.get((StepPhase.forward, AgentStep.transfer))
    image = checkpoint.result.get("image") if checkpoint is not None else None
    args: dict[str, Any] = {}
    if (
        step.name in (AgentStep.transfer, AgentStep.restore, AgentStep.release, AgentStep.stage)
        and image is not None
    ):
        args["image"] = image
    if (
        step.phase == StepPhase.forward
        and step.name in (AgentStep.restore, AgentStep.stage)
        and transfer
    ):
        args["image_dir"] = transfer.result.get("image_dir")
    stage = by_name.get((StepPhase(step.phase), AgentStep.stage))
    if step.name == AgentStep.confirm and stage is not None:
        # The scheduler starts the job; the agent waits for it to run restored from here.
        args["resumed_from"] = stage.result.get("image_dir")
        args["wait_s"] = start_wait_s
    kind = ActionKind(action.kind)
    if step.name in (ConnectorStep.requeue, ConnectorStep.suspend) and image is not None:
        # Where the job resumes from: Kubernetes' connector writes it on the Job (or the
        # Kueue Workload) so the pods the scheduler starts next read SHAPER_RESUME_FROM;
        # Slurm's job body finds its staged image itself and ignores it.
        args["image"] = image
        if stage is not None and stage.result.get("image_dir"):
            # Staged on the node the requeue pins the job to: resume from that copy.
            args["resume_from"] = stage.result["image_dir"]
    if step.name == ConnectorStep.requeue:
        pin = _requeue_pin(action, job, step)
        if pin is not None:
            args["nodes"] = [pin]
        if step.phase == StepPhase.forward and kind in (ActionKind.preempt, ActionKind.requeue):
            # A stopped job waits until a plan starts it again: it must not take back the
            # GPUs it was stopped to free.
            args["hold"] = True
    if step.name == ConnectorStep.reserve:
        args.update(
            {
                "gpus": dict(action.target_placement),
                "ttl_s": RESERVATION_TTL_S,
                "counts_on": list(action.counts_on),
            }
        )
    targets = sorted(action.target_placement) or [
        n for n in (action.target_node or "").split(",") if n
    ]
    if step.name in (ConnectorStep.start, ConnectorStep.resume) and targets:
        args["nodes"] = targets
    if step.name == ConnectorStep.confirm and is_connector_queue(step.queue):
        if kind in (ActionKind.start, ActionKind.resume):
            args.update({"expect": "running", "nodes": targets})
        else:
            args["expect"] = "stopped"
    if step.name == AgentStep.release:
        # A migrated job's image on its source is no longer needed (nor a copy on a target
        # that compensation fences off); a preempted job's is what it resumes from.
        args["delete_image"] = not (
            step.phase == StepPhase.forward and ActionKind(action.kind) is ActionKind.preempt
        )
    if is_connector_queue(step.queue):
        args.update(
            {
                "source_node": action.source_node,
                "target_node": action.target_node,
                "replicas": action.target_replicas,
            }
        )
    request = StepRequest(
        action_id=action.id,
        key=step.idempotency_key,
        step=str(step.name),
        phase=StepPhase(step.phase).value,
        workload_id=job.external_id if job is not None else None,
        generation=step.generation,
        args=args,
        reply_task=REPLY_TASK,
        reply_queue=CONTROL_QUEUE,
    )
    return Outgoing(
        queue=step.queue,
        task=step_task(step.queue, step.name),
        kwargs={"step": request.model_dump(mode="json")},
    )


def _requeue_pin(action: Action, job: Job | None, step: ActionStep) -> str | None:
    """The node a requeued job must run on next: where its staged image waits."""
    kind = ActionKind(action.kind)
    if step.phase == StepPhase.compensate:
        return action.source_node
    if kind is ActionKind.migrate:
        return action.target_node
    if kind is ActionKind.preempt and job is not None and job.checkpointable:
        return action.source_node
    return None  # a plain requeue: the scheduler chooses
