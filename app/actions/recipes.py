"""The recipe of each action kind: which steps its saga runs, where, in which order, and
what compensation runs when a forward step fails.

A recipe only lists steps (rows of ``action_steps``, not yet sent); the state machine in
``app.actions.saga`` sends them one at a time and decides when to compensate, and
``app.actions.messages`` builds each step's message. They are apart because a new action
kind or a new scheduler changes the recipes and nothing of how a saga advances.

Migrate, for a job on node S moving to node T (generation G):
``checkpoint@S → transfer@T → restore@T → confirm@T → release@S``. Compensation
(generation G+1): ``release@T`` (only if a step reached T: it kills whatever was restored
there and fences T against the old generation) → ``restore@S`` (a no-op when the job still
runs at S, else from the checkpoint it left there).

On a cluster whose scheduler owns where jobs run (Slurm, Kubernetes, Kueue:
``schedulers.places_itself``) the job cannot move behind the scheduler's back. The image
is *staged* on the target and the scheduler is asked to requeue the job pinned there
(the requeue carries the image: Kubernetes' connector hands the new pods its pointer as
``SHAPER_RESUME_FROM``); when it starts the job, the job's ``shaper agent exec --wait``
restores it from the image (agent.resume):
``checkpoint@S → transfer@T → stage@T → requeue@connector(pin T) → confirm@T (waits for
the scheduler to start it, restored) → release@S``. A checkpointable job is preempted with
``checkpoint@S → stage@S → requeue@connector(pin S)``: it resumes from its checkpoint
when the scheduler runs it again. Compensation before the requeue is the one above (the
job's batch step still waits at S); after it, ``release@T → stage@S →
requeue@connector(pin S) → confirm@S``: the job goes back to S and resumes there. When
the restore at S fails too, the job goes back to its scheduler's queue with its checkpoint
(:func:`resume_step`).

The other kinds are the scheduler's alone: a job that cannot checkpoint is preempted with
``requeue → confirm``; ``start``, ``resume`` and ``requeue`` are the step itself then a
``confirm`` that polls the scheduler for its effect; ``resize``, ``reserve`` and
``unreserve`` are one step. Nothing process-level ran for them, so nothing compensates.
"""

from __future__ import annotations

from app.actions.models import Action, ActionKind, ActionStep, StepState
from app.actions.schedulers import places_itself
from app.clusters.models import Cluster
from app.core.lookup import row_id
from app.jobs.models import Job
from wire.queues import agent_queue, connector_queue, is_agent_queue
from wire.steps import AgentStep, ConnectorStep, StepPhase

# A step's error when its executor never answered (it may still have run it).
NO_ANSWER = "no answer"


class _Plan:
    def __init__(self, action: Action, cluster: str, generation: int) -> None:
        self.action = action
        self.cluster = cluster
        self.generation = generation
        self.steps: list[ActionStep] = []

    def add(self, name: str, queue: str, phase: StepPhase, seq: int) -> None:
        self.steps.append(
            ActionStep(
                action_id=row_id(self.action),
                seq=seq,
                phase=phase,
                name=name,
                queue=queue,
                generation=self.generation,
                idempotency_key=f"{self.action.idempotency_key}:{phase.value}:{name}"[:200],
            )
        )


def _single(nodes: str | None, what: str, action: Action) -> str:
    names = [n for n in (nodes or "").split(",") if n]
    if len(names) != 1:
        raise Unplannable(
            f"{action.kind} needs exactly one {what} node, the action names {nodes or 'none'}"
        )
    return names[0]


class Unplannable(Exception):
    """The action names nodes its recipe cannot use; the saga cancels it with this message."""


def forward_steps(action: Action, job: Job, cluster: Cluster, generation: int) -> list[ActionStep]:
    """The steps that do the action, in order, under the job's (new) generation."""
    plan = _Plan(action, cluster.name, generation)
    kind = ActionKind(action.kind)
    fwd = StepPhase.forward
    owned = places_itself(cluster.scheduler)
    scheduler = connector_queue(cluster.name)
    if kind is ActionKind.migrate:
        source = agent_queue(cluster.name, _single(action.source_node, "source", action))
        target = agent_queue(cluster.name, _single(action.target_node, "target", action))
        if source == target:
            raise Unplannable("migrate needs a target node other than its source")
        if owned:
            names = [
                (AgentStep.checkpoint, source),
                (AgentStep.transfer, target),
                (AgentStep.stage, target),
                (ConnectorStep.requeue, scheduler),
                (AgentStep.confirm, target),
                (AgentStep.release, source),
            ]
        else:
            names = [
                (AgentStep.checkpoint, source),
                (AgentStep.transfer, target),
                (AgentStep.restore, target),
                (AgentStep.confirm, target),
                (AgentStep.release, source),
            ]
        for seq, (name, queue) in enumerate(names):
            plan.add(name, queue, fwd, seq)
    elif kind is ActionKind.preempt and job.checkpointable:
        source = agent_queue(cluster.name, _single(action.source_node, "source", action))
        plan.add(AgentStep.checkpoint, source, fwd, 0)
        if owned:
            plan.add(AgentStep.stage, source, fwd, 1)
            plan.add(ConnectorStep.requeue, scheduler, fwd, 2)
        else:
            plan.add(AgentStep.release, source, fwd, 1)
    elif kind is ActionKind.preempt:
        plan.add(ConnectorStep.requeue, scheduler, fwd, 0)
        plan.add(ConnectorStep.confirm, scheduler, fwd, 1)
    elif kind in (ActionKind.start, ActionKind.resume, ActionKind.requeue):
        # "Succeeded" means seen: the confirm polls the scheduler for the effect.
        plan.add(ConnectorStep(kind.value), scheduler, fwd, 0)
        plan.add(ConnectorStep.confirm, scheduler, fwd, 1)
    else:  # resize, reserve, unreserve: the scheduler does them
        plan.add(ConnectorStep(kind.value), scheduler, fwd, 0)
    return plan.steps


def _requeued(steps: list[ActionStep]) -> bool:
    """Whether the forward phase's requeue may have reached the scheduler."""
    requeue = next(
        (s for s in steps if s.phase == StepPhase.forward and s.name == ConnectorStep.requeue), None
    )
    if requeue is None:
        return False
    timed_out = requeue.state == StepState.failed and (requeue.error or "").startswith(NO_ANSWER)
    return requeue.state == StepState.succeeded or timed_out


def compensation_steps(
    action: Action, steps: list[ActionStep], cluster: str, generation: int
) -> list[ActionStep]:
    """Undo what the forward steps did: fence the target, keep or bring the job back home."""
    plan = _Plan(action, cluster, generation)
    seq = max(s.seq for s in steps) + 1
    by_name = {s.name: s for s in steps if s.phase == StepPhase.forward}
    checkpoint = by_name.get(AgentStep.checkpoint)
    if checkpoint is None or checkpoint.state in (StepState.pending, StepState.skipped):
        return []  # nothing process-level happened (or only the scheduler was asked)
    source = checkpoint.queue
    reached_target = [
        s
        for s in steps
        if is_agent_queue(s.queue)
        and s.queue != source
        and s.state not in (StepState.pending, StepState.skipped)
    ]
    if reached_target:
        plan.add(AgentStep.release, reached_target[0].queue, StepPhase.compensate, seq)
        seq += 1
    if _requeued(steps):
        # The scheduler has the job (pending, or started on the target): send it home,
        # to resume from the image the checkpoint left at the source.
        for name, queue in (
            (AgentStep.stage, source),
            (ConnectorStep.requeue, connector_queue(cluster)),
            (AgentStep.confirm, source),
        ):
            plan.add(name, queue, StepPhase.compensate, seq)
            seq += 1
    else:
        plan.add(AgentStep.restore, source, StepPhase.compensate, seq)
    return plan.steps


def resume_step(action: Action, failed: ActionStep, cluster: str) -> ActionStep:
    """When a compensating restore fails, neither target nor source can take the job: it
    goes back to its scheduler's queue with its checkpoint, by a ``resume`` right after
    the failed step."""
    back = _Plan(action, cluster, failed.generation)
    back.add(ConnectorStep.resume, connector_queue(cluster), StepPhase.compensate, failed.seq + 1)
    return back.steps[0]
