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

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from app.actions.models import (
    JOB_SET_ACTION_KINDS,
    NODE_ACTION_KINDS,
    Action,
    ActionKind,
    ActionStep,
    node_names,
)
from app.core.lookup import row_id
from app.jobs.models import Job
from wire.queues import (
    CONTROL_QUEUE,
    REPLY_TASK,
    agent_queue_prefix,
    connector_cluster,
    is_connector_queue,
    step_task,
)
from wire.steps import AgentStep, ConnectorStep, StepPhase, StepRequest
from wire.telemetry import JobShape

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
            args["nodes"] = node_names(pin)
        if step.phase == StepPhase.forward and (
            kind in (ActionKind.preempt, ActionKind.requeue) or spans_nodes(action)
        ):
            # A stopped job waits until a plan starts it again: it must not take back the
            # GPUs it was stopped to free. A gang's move: until its start pins it there.
            args["hold"] = True
    if step.name == ConnectorStep.reserve:
        args.update(
            {
                "gpus": dict(action.target_placement),
                "ttl_s": RESERVATION_TTL_S,
                "counts_on": list(action.counts_on),
            }
        )
    targets = sorted(action.target_placement) or node_names(action.target_node)
    if step.name in (ConnectorStep.start, ConnectorStep.resume) and targets:
        args["nodes"] = targets
    if step.name == ConnectorStep.start and step.phase == StepPhase.compensate:
        # A gang's move undone (recipes): started again on the nodes it left.
        args["nodes"] = sorted(action.source_placement) or node_names(action.source_node)
    training = job is not None and job.shape == JobShape.block
    if step.name == ConnectorStep.resize and training:
        args["nodes"] = targets  # an elastic training job: where it runs at its new size
    if step.name == ConnectorStep.resize and job is not None and not training:
        # A service that shrinks off named nodes (connectors.base.SupportsReplicaMoves): the
        # recipe chose it at dispatch, giving the shrink its confirm; what leaves each node
        # comes from the action alone, so that a resend says what the first delivery said
        # whatever the job's row says now (its connector restarted without pod_placement,
        # its size changed).
        if by_name.get((StepPhase.forward, ConnectorStep.confirm)) is not None:
            leave = replicas_off(action, gpus_per_replica(action, job))
            if leave:
                args["leave"] = leave
    if step.name == ConnectorStep.undo_resize and job is not None:
        # Back to the size the action found, if the connector ran this resize (its journal
        # answers for the forward step's key).
        resize = by_name.get((StepPhase.forward, ConnectorStep.resize))
        if resize is not None:
            args["undo_key"] = resize.idempotency_key
        args["back_to"] = replicas_before(action, job)
    sized = step.name == ConnectorStep.start and action.target_replicas is not None
    if training and (step.name == ConnectorStep.resize or sized) and action.target_placement:
        args["gpus"] = dict(action.target_placement)  # and how many GPUs on each node
    if step.name == ConnectorStep.confirm and is_connector_queue(step.queue):
        if kind in (ActionKind.start, ActionKind.resume):
            args.update({"expect": "running", "nodes": targets})
        elif kind is ActionKind.resize and not training:
            # Only a service's shrink off named nodes has a confirm (recipes): it holds no
            # more of its GPUs on each than the plan leaves there (a resent resize_off,
            # which finds the service at its size, cannot tell whose shrink that was). From
            # the action alone: the job's row may have changed since the steps were chosen.
            # A service never shrinks to none (the executor refuses replicas < 1).
            args.update({"expect": "running", "gpus_at_most": _gpus_left(action)})
        elif kind is ActionKind.resize or kind is ActionKind.migrate:
            # An elastic training job's resize, or a gang's move (the only migrate with a
            # scheduler's confirm: recipes): it runs on those nodes and on no others.
            args.update({"expect": "running", "nodes": targets, "exactly": True})
        elif kind is ActionKind.move:
            args["expect"] = "accepted"  # the target's scheduler runs the copy (recipes)
        elif kind in NODE_ACTION_KINDS:
            # The node read back: draining (or gone) after a drain, up after an undrain.
            args["expect"] = "drained" if kind is ActionKind.drain else "up"
        else:
            args["expect"] = "stopped"
    if step.name == AgentStep.release:
        # A migrated job's image on its source is no longer needed (nor a copy on a target
        # that compensation fences off); a preempted job's is what it resumes from.
        args["delete_image"] = not (
            step.phase == StepPhase.forward and ActionKind(action.kind) is ActionKind.preempt
        )
    workload_id = job.external_id if job is not None else None
    if kind in NODE_ACTION_KINDS:
        workload_id = action.source_node  # the node the steps are about (connectors.actions)
        if step.name == ConnectorStep.drain:
            args["reason"] = action.reason
    if kind is ActionKind.move:
        workload_id = _move_workload(action, job, step, steps, args)
    if kind in JOB_SET_ACTION_KINDS:
        # The job set the step is about, which the connector fences it under.
        workload_id = job_set_subject(action.job_set_queue or "", action.job_set or "")
        args.update(
            {
                "queue": action.job_set_queue,
                "job_set": action.job_set,
                "executor": action.target_executor,
            }
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
        workload_id=workload_id,
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


def _move_workload(
    action: Action, job: Job | None, step: ActionStep, steps: list[ActionStep], args: dict[str, Any]
) -> str | None:
    """A move's step (recipes): its arguments, and the job it is about — the source's job,
    except at the target after the submit, where it is the job the target accepted."""
    forward = [s for s in steps if s.phase == StepPhase.forward]
    submit = next(s for s in forward if s.name == ConnectorStep.submit)
    cancel = next(s for s in forward if s.name == ConnectorStep.cancel)
    source, target = connector_cluster(cancel.queue), connector_cluster(submit.queue)
    here = job.external_id if job is not None else None
    planned = node_names(action.target_node)
    if step.name == ConnectorStep.hold:
        # A job that started before the hold took effect is not moved: the connector reads
        # it back once held, and refuses (releasing the hold) unless it is still pending.
        args["pending"] = True
    if step.name == ConnectorStep.cancel and any(s.name == ConnectorStep.hold for s in forward):
        # The held home copy: one someone else cancelled (or released and started) since
        # the hold fails the cancel, and the move is undone (connectors.actions).
        args["moved_away"] = True
    if (
        step.name == ConnectorStep.release
        and step.phase == StepPhase.compensate
        and is_connector_queue(step.queue)
    ):
        args["if_held"] = True  # the hold may not have taken effect, or the job moved on
    if step.name == ConnectorStep.release and step.phase == StepPhase.forward:
        stage = next((s for s in forward if s.name == AgentStep.stage), None)
        if stage is not None and stage.result.get("image_dir"):
            # A running job's move: where it resumes from at the target. Kubernetes'
            # connector writes it on the held Job before letting it run (its pods read
            # SHAPER_RESUME_FROM); Slurm's job body finds its staged image itself.
            args["resume_from"] = stage.result["image_dir"]
    if step.name in (ConnectorStep.submit, ConnectorStep.withdraw):
        # The move's name makes a resent submit (or its withdraw) find the job it submitted
        # before; the source cluster is what the target fences the step under.
        args["name"] = move_name(row_id(action), here or "")
        args["source_cluster"] = source
        if step.name == ConnectorStep.submit and job is not None and job.submit_spec:
            args["spec"] = json.loads(job.submit_spec)
        released = any(s.name == ConnectorStep.release and s.queue == submit.queue for s in forward)
        if step.name == ConnectorStep.submit and planned and released:
            # Let go by a release at the target: a running job's copy once its image is
            # staged on its one node, a pending job's once the nodes it was planned onto
            # are reserved for it. Held and pinned to those nodes until then.
            args["nodes"] = planned
            args["hold"] = True
        return here
    if step.name == ConnectorStep.reserve and planned:
        # The job's GPUs on each target node, whatever runs there now (nothing of the
        # target's own plan frees them for it: counts on no job). A Slurm job asks the
        # same GPUs of each of its nodes.
        gpus = job.gpus_requested if job is not None else 0
        each = max(math.ceil(gpus / len(planned)), 1)
        args.update({"gpus": dict.fromkeys(planned, each), "counts_on": []})
    at_target = step.queue.startswith(agent_queue_prefix(target)) or (
        step.queue == submit.queue
        and step.name
        in (
            ConnectorStep.release,
            ConnectorStep.confirm,
            ConnectorStep.reserve,
            ConnectorStep.unreserve,
        )
    )
    if at_target:
        arrived = submit.result.get("external_id")
        return str(arrived) if arrived is not None else None
    return here


def job_set_subject(queue: str, job_set: str) -> str:
    """What a job set's steps name as their workload, and are fenced under, at the
    connector (``job-set:<queue>/<job set>``): no Armada job id or gang id looks so."""
    return f"job-set:{queue}/{job_set}"[:255]


# What a job name may carry through every scheduler (Slurm's comment word, a label value).
_NOT_IN_A_MOVE_NAME = re.compile(r"[^A-Za-z0-9._:@+/-]")


def move_name(action_id: int, external_id: str) -> str:
    """The name a move submits its job under at the target: unique per move, the same on
    every resend (``shaper-<action>-<job at the source>``)."""
    return _NOT_IN_A_MOVE_NAME.sub("-", f"shaper-{action_id}-{external_id}")[:128]


def spans_nodes(action: Action) -> bool:
    """A migrate of a job on several nodes, or onto several: a gang's move, which its
    scheduler restarts pinned to the new nodes (``app.actions.recipes``)."""
    return ActionKind(action.kind) is ActionKind.migrate and any(
        len(node_names(nodes)) > 1 for nodes in (action.source_node, action.target_node)
    )


def _requeue_pin(action: Action, job: Job | None, step: ActionStep) -> str | None:
    """The node(s) a requeued job must run on next, comma-separated: where its staged
    image waits (a gang's move: the nodes it moves to)."""
    kind = ActionKind(action.kind)
    if step.phase == StepPhase.compensate:
        return action.source_node
    if kind is ActionKind.migrate:
        return action.target_node
    if kind is ActionKind.preempt and job is not None and job.checkpointable:
        return action.source_node
    return None  # a plain requeue: the scheduler chooses


def _gpus_left(action: Action) -> dict[str, int]:
    """The GPUs a shrink leaves on each node it takes GPUs off ({node: GPUs >= 0})."""
    target = action.target_placement
    return {
        node: target.get(node, 0)
        for node, gpus in sorted(action.source_placement.items())
        if target.get(node, 0) < gpus
    }


def replicas_leaving(action: Action, job: Job) -> dict[str, int]:
    """A service's replicas the plan takes off each node ({node: replicas}), as the recipe
    sees them at dispatch: :func:`replicas_off`; empty for a job whose connector cannot
    choose which replicas leave (``Job.replicas_movable``)."""
    if not job.replicas_movable:
        return {}
    return replicas_off(action, gpus_per_replica(action, job))


def replicas_off(action: Action, per_replica: int) -> dict[str, int]:
    """Where a service holds fewer GPUs after the resize than before, in replicas of
    ``per_replica`` GPUs ({node: replicas > 0})."""
    source = action.source_placement
    leaving = {
        node: (source[node] - left) // per_replica for node, left in _gpus_left(action).items()
    }
    return {node: replicas for node, replicas in leaving.items() if replicas > 0}


def replicas_before(action: Action, job: Job) -> int:
    """A service's replicas before the resize, from the action's GPUs per node before it
    (0 where the action does not say)."""
    return sum(action.source_placement.values()) // gpus_per_replica(action, job)


def gpus_per_replica(action: Action, job: Job) -> int:
    """A service's GPUs a replica, from the action (its target GPUs over its target
    replicas) where it says, else the job's size: the action does not change between
    dispatch and a resend, the job's row may."""
    total = sum(action.target_placement.values())
    replicas = action.target_replicas
    if replicas and total and total % replicas == 0:
        return total // replicas
    return max(job.gpus_requested, 1)
