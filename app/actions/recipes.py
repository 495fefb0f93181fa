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

A job on several nodes (a gang, ``SolverConfig.gang_upgrades``) moving to others is no one
node's process image: its scheduler stops it, it writes its own checkpoint (as a
checkpointable job requeued by a plan does), and it starts again pinned to the new nodes
from that checkpoint: ``requeue@connector(held, pin T…) → start@connector(T…) →
confirm@connector`` (it runs on T… and on no other node), where the scheduler restarts a
job pinned so (``schedulers.restarts_gangs``: Slurm, the simulated clusters; elsewhere the
action is refused). Compensation (generation G+1), once the requeue may have reached the
scheduler: ``start@connector(S…)``, the job started again on the nodes it left (a no-op
when it runs), and the saga marks it displaced, so that the next plan places it first
wherever it can (a start re-pins it) if it cannot start there.

Move, a pending job of cluster A going to cluster B of its federation group (generation
G): ``hold@connector.A → submit@connector.B → confirm@connector.B → cancel@connector.A``.
The hold keeps A's scheduler from starting the job while B takes it; the submit names the
move (a resent one finds the job it submitted before). A submit's answer only says that
B's scheduler took the request, and some find out later that they cannot run it (Kueue
never admits it, its pods cannot be created, Ray cannot build its runtime environment):
the confirm (``expect: accepted``, connectors.arrival says what that is for each scheduler
family) polls B until its scheduler holds the new copy in a state it runs from, and fails
when the scheduler rejected it or it stays unknown for all its polls, which undoes the move
while A's copy is still there. A's copy is cancelled only after that confirm, and the
cancel, like a compensation step, is sent until it is answered: given up, the job might be
pending in both. Compensation (generation G+1): ``withdraw@connector.B`` (when the submit
was ever sent: a submit whose answer was lost may have arrived; a copy that already ran
there fails it, and nothing at A is released; one rejected before it ran is nothing to
withdraw) → ``release@connector.A`` (when the hold was sent; only a job still pending and
held is released).
Where B's scheduler can hold GPUs for a job it starts pinned (Slurm:
``schedulers.holds_moved_jobs``) and the move names the nodes it was planned onto
(``target_node``), those are held for the copy before it may start, or B's own queue
could take them between the plan and B's scheduler starting it, and the job would wait at
B instead of at home: ``hold@connector.A → submit@connector.B (held, pinned to the planned
nodes) → reserve@connector.B (their GPUs for B's copy; refused when B's own work took them
since the plan) → release@connector.B (into the reservation) → confirm@connector.B →
cancel@connector.A → unreserve@connector.B``. B's connector confirms a copy it holds nodes
for only once it runs (a copy that waits in its reservation is "not yet": the GPUs are
held for it, so it starts at once or something the plan did not count stops it, and then
it is better at home), so A's copy is cancelled, and the reservation given back, once the
copy runs on the nodes held for it. Compensation adds ``unreserve@connector.B`` after the
withdraw (when the reserve was sent: its answer may have been lost after it was made);
a refused reservation thus ends the move with the job pending at home as it was.
Kubernetes, Kueue, Ray and Armada hold no GPUs for a job: their copy waits in B's queue.

A running checkpointable job moves from node S of A to node T of B (B's scheduler must
start a job pinned to a node: Slurm, Kubernetes, Armada): ``checkpoint@S →
submit@connector.B (held, pinned to T) → transfer@T → stage@T → release@connector.B →
confirm@T (B's scheduler has started it, restored from the staged image) →
cancel@connector.A → release@S``. Steps at B after the submit name the job by its new id
there (the submit's answer), so its image, fence and record at T are B's job's. The cancel
and the release at S are sent until answered, and once the cancel has succeeded nothing is
compensated (the job is B's). Before that, compensation is ``withdraw@connector.B →
release@T`` (when a step reached T) ``→ restore@S`` (a no-op when it still runs there).
Where B's scheduler can hold GPUs for a job (Slurm: ``schedulers.holds_moved_jobs``), T is
held for the job before anything stops it at S: ``submit@connector.B (held, pinned to T) →
reserve@connector.B (T's GPUs for B's job; refused when B's own work took them since the
plan) → checkpoint@S → … → release@connector.B (into the reservation) → … →
release@S → unreserve@connector.B``; compensation adds ``unreserve@connector.B`` after
the withdraw, and a refused reservation undoes the move with the job untouched at S.
A move's last ``unreserve`` is sent until answered, and B's connector answers it at once:
where Slurm will not take B's job out of its reservation (so will not delete it), the
connector ends the reservation now instead of answering "not now" for as long as the job
runs (connectors.slurm: its nodes are free at once, the job runs on, the upkeep deletes
what is left); only a B that does not answer at all keeps the move running, and an
operator may abandon it (app.actions.service.abandon).

The other kinds are the scheduler's alone: a job that cannot checkpoint is preempted with
``requeue → confirm``; ``start``, ``resume`` and ``requeue`` are the step itself then a
``confirm`` that polls the scheduler for its effect; so is an elastic training job's
``resize`` (``resize → confirm``: the connector shrinks it where it runs, or restarts it
on the nodes it grows onto, and the confirm waits for it to run there and nowhere else;
the job resumes from its own checkpoint); a service's ``resize``, ``reserve`` and
``unreserve`` are one step, except a service's shrink off named nodes (``args.leave``, a
replica move's first half): ``resize → confirm``, the confirm reading that the service
holds no more GPUs on each of those nodes than the plan leaves there
(``args.gpus_at_most``). Nothing process-level ran for them, so nothing compensates, with
two exceptions. A reserve that may have been made although the action failed (unanswered,
or answered "not now" while a resent copy was still out: :func:`may_have_run`) is taken
off by ``unreserve@connector`` under a new generation, so that a copy still queued is
either undone or refused. A service's resize that may have run although the action failed
(the same, or it ran and its confirm gave up) is undone by
``undo_resize@connector`` under a new generation. The connector resizes the service back
to its size before only if the last resize of it that it ran is this one, and refuses a
copy of the resize still queued behind the undo as stale: a shrink delivered after the saga gave up
(the connector cut off for longer than its sends) would otherwise leave the service short
with the record saying it is not.

Drain and undrain are about a node, not a job (an operator's, ``NODE_ACTION_KINDS``):
``drain@connector → confirm@connector`` (the scheduler reports the node draining, or
gone), ``undrain@connector → confirm@connector`` (reported up). Their generation is the
action's id, which grows with every action on the node, so the connector refuses a late
step of an older drain or undrain of it (connectors.actions fences them per node). Nothing
compensates them: a drain whose confirm gave up may still take effect, and undoing it
would hand the node back to the scheduler against the operator's wish; the action fails
with what the scheduler last reported, and the operator decides (undrain, or drain again).

A job set's move (an operator's, ``JOB_SET_ACTION_KINDS``: an Armada job set to another
executor cluster) is one step, ``move_job_set@connector``, under the action's id as its
generation (the connector fences it per job set). Succeeded means Armada accepted the
jobs submitted again there; its scheduler runs them when they fit, and telemetry says
where. Nothing compensates it: a refused move changed nothing, and one that went through
is what the operator asked for.
"""

from __future__ import annotations

from app.actions.messages import replicas_before, replicas_leaving, spans_nodes
from app.actions.models import (
    JOB_SET_ACTION_KINDS,
    NODE_ACTION_KINDS,
    Action,
    ActionKind,
    ActionStep,
    StepState,
    node_names,
)
from app.actions.schedulers import (
    holds_moved_jobs,
    moves_jobs,
    places_itself,
    restarts_gangs,
    takes_moves,
)
from app.clusters.models import Cluster
from app.core.lookup import row_id
from app.jobs.models import Job
from wire.queues import agent_queue, connector_queue, is_agent_queue
from wire.steps import AgentStep, ConnectorStep, StepPhase
from wire.telemetry import JobShape, JobState, SubmitSpec

# A step's error when its executor never answered (it may still have run it).
NO_ANSWER = "no answer"
# The start of a step's error when it failed on a "not now" (a retryable answer) while it
# had had fewer answers than sends (``ActionStep.answers``): that answer speaks for one
# copy, and another may still be queued for its executor, to run later (retryable answers
# are not journalled).
COPY_MAY_RUN = "a copy may still run"


def may_have_run(step: ActionStep) -> bool:
    """Whether a forward step's effect may have happened, or may yet happen: it succeeded,
    or it failed with a copy of it possibly still on its way to its executor (unanswered,
    or answered "not now" while resent copies were out)."""
    if step.state == StepState.succeeded:
        return True
    error = step.error or ""
    return step.state == StepState.failed and error.startswith((NO_ANSWER, COPY_MAY_RUN))


# Sends of a step before it is given up, unless answered_or_given_up says it may not be.
MAX_ATTEMPTS = 3


class _Plan:
    def __init__(self, action: Action, cluster: str, generation: int) -> None:
        self.action = action
        self.cluster = cluster
        self.generation = generation
        self.steps: list[ActionStep] = []

    def add(self, name: str, queue: str, phase: StepPhase, seq: int) -> None:
        key = f"{self.action.idempotency_key}:{phase.value}:{name}"
        if any(s.name == name and s.phase == phase for s in self.steps):
            key += f":{seq}"  # a second step of that name (a move's two releases)
        self.steps.append(
            ActionStep(
                action_id=row_id(self.action),
                seq=seq,
                phase=phase,
                name=name,
                queue=queue,
                generation=self.generation,
                idempotency_key=key[:200],
            )
        )


def _single(nodes: str | None, what: str, action: Action) -> str:
    names = node_names(nodes)
    if len(names) != 1:
        raise Unplannable(
            f"{action.kind} needs exactly one {what} node, the action names {nodes or 'none'}"
        )
    return names[0]


class Unplannable(Exception):
    """The action names nodes its recipe cannot use; the saga cancels it with this message."""


def forward_steps(
    action: Action,
    job: Job,
    cluster: Cluster,
    generation: int,
    target_cluster: Cluster | None = None,
) -> list[ActionStep]:
    """The steps that do the action, in order, under the job's (new) generation.

    ``target_cluster``: a move's destination (``action.target_cluster_id``)."""
    plan = _Plan(action, cluster.name, generation)
    kind = ActionKind(action.kind)
    if kind is ActionKind.move:
        return _move_steps(plan, job, cluster, target_cluster, action)
    fwd = StepPhase.forward
    owned = places_itself(cluster.scheduler)
    scheduler = connector_queue(cluster.name)
    if kind is ActionKind.migrate and spans_nodes(action):
        return _gang_migrate_steps(plan, job, cluster, action)
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
    elif kind in (ActionKind.start, ActionKind.resume, ActionKind.requeue) or (
        kind is ActionKind.resize and job.shape == JobShape.block
    ):
        # "Succeeded" means seen: the confirm polls the scheduler for the effect (an
        # elastic training job's resize: it runs on the nodes planned, and no others).
        plan.add(ConnectorStep(kind.value), scheduler, fwd, 0)
        plan.add(ConnectorStep.confirm, scheduler, fwd, 1)
    elif kind is ActionKind.resize and replicas_leaving(action, job):
        # A service shrunk off named nodes (a replica move's first half): the confirm reads
        # the GPUs it left there before what the shrink made room for may start.
        plan.add(ConnectorStep.resize, scheduler, fwd, 0)
        plan.add(ConnectorStep.confirm, scheduler, fwd, 1)
    else:  # resize, reserve, unreserve: the scheduler does them
        plan.add(ConnectorStep(kind.value), scheduler, fwd, 0)
    return plan.steps


def _gang_migrate_steps(
    plan: _Plan, job: Job, cluster: Cluster, action: Action
) -> list[ActionStep]:
    """A job on several nodes moving to others (module docstring): no node's process image
    moves; its scheduler stops it, it resumes from its own checkpoint where it is started."""
    if not restarts_gangs(cluster.scheduler):
        raise Unplannable(
            f"migrate of job {job.external_id} from {action.source_node} to "
            f"{action.target_node}: a job on several nodes moves by a restart pinned to its "
            f"new nodes, which Shaper does through Slurm and the simulated clusters only; "
            f"{cluster.name} runs {cluster.scheduler}"
        )
    if not job.checkpointable:
        raise Unplannable(
            f"job {job.external_id} runs on {action.source_node} and cannot checkpoint: a "
            "restart on other nodes would start it over"
        )
    scheduler = connector_queue(cluster.name)
    for seq, name in enumerate((ConnectorStep.requeue, ConnectorStep.start, ConnectorStep.confirm)):
        plan.add(name, scheduler, StepPhase.forward, seq)
    return plan.steps


def node_steps(action: Action, cluster: Cluster) -> list[ActionStep]:
    """A node action's steps (drain, undrain), under its own id as their generation."""
    kind = ActionKind(action.kind)
    if kind not in NODE_ACTION_KINDS:
        raise Unplannable(f"{kind} is about a job, not a node")
    if not action.source_node or "," in action.source_node:
        raise Unplannable(f"{kind} needs one node, the action names {action.source_node or 'none'}")
    plan = _Plan(action, cluster.name, row_id(action))
    scheduler = connector_queue(cluster.name)
    plan.add(ConnectorStep(kind.value), scheduler, StepPhase.forward, 0)
    plan.add(ConnectorStep.confirm, scheduler, StepPhase.forward, 1)
    return plan.steps


def job_set_steps(action: Action, cluster: Cluster) -> list[ActionStep]:
    """A job set's action's steps (move_job_set), under its own id as their generation."""
    kind = ActionKind(action.kind)
    if kind not in JOB_SET_ACTION_KINDS:
        raise Unplannable(f"{kind} is not about a job set")
    if not (action.job_set_queue and action.job_set and action.target_executor):
        raise Unplannable(f"{kind} needs a queue, a job set and an executor")
    plan = _Plan(action, cluster.name, row_id(action))
    plan.add(ConnectorStep(kind.value), connector_queue(cluster.name), StepPhase.forward, 0)
    return plan.steps


def _move_steps(
    plan: _Plan, job: Job, cluster: Cluster, target: Cluster | None, action: Action
) -> list[ActionStep]:
    if target is None:
        raise Unplannable("move names no target cluster (or it was deleted)")
    if target.id == cluster.id:
        raise Unplannable(f"move needs a target cluster other than {cluster.name}")
    state = JobState(job.state)
    if state not in (JobState.pending, JobState.running):
        raise Unplannable(f"job {job.external_id} is {state.value}: there is nothing to move")
    if job.submit_spec is None:
        raise Unplannable(
            f"{cluster.name}'s connector did not say how to submit job {job.external_id} "
            "elsewhere (no submit spec)"
        )
    if not takes_moves(target.scheduler):
        raise Unplannable(
            f"{target.name} runs {target.scheduler}, whose connector does not take moved jobs "
            "yet (it cannot submit one)"
        )
    spec = SubmitSpec.model_validate_json(job.submit_spec)
    if spec.portable is None and spec.scheduler != target.scheduler:
        raise Unplannable(
            f"job {job.external_id} has a {spec.scheduler} submit spec and no portable form: "
            f"{target.name} runs {target.scheduler}"
        )
    source, there = connector_queue(cluster.name), connector_queue(target.name)
    fwd = StepPhase.forward
    if state is JobState.pending:
        held = bool(_planned_nodes(action)) and holds_moved_jobs(target.scheduler)
        names: list[tuple[str, str]] = [
            (ConnectorStep.hold, source),
            (ConnectorStep.submit, there),
        ]
        if held:
            # Slurm: the copy is submitted held and pinned to the nodes the plan counted on,
            # those are reserved for it (refused when B's own queue took them since the
            # plan: the move ends, the job still pending at home), and it is let go into
            # the reservation; the reservation is given back once A's copy is gone.
            names += [(ConnectorStep.reserve, there), (ConnectorStep.release, there)]
        # Kubernetes, Kueue, Ray, Armada (and a move that names no target nodes): the copy
        # waits in B's queue as any job; nothing there holds GPUs for it.
        names += [
            (ConnectorStep.confirm, there),  # B's scheduler will run its copy
            (ConnectorStep.cancel, source),
        ]
        if held:
            names.append((ConnectorStep.unreserve, there))
        for seq, (name, queue) in enumerate(names):
            plan.add(name, queue, fwd, seq)
        return plan.steps
    if not job.checkpointable:
        raise Unplannable(
            f"job {job.external_id} runs and cannot checkpoint: it would start over at "
            f"{target.name}; only a checkpointable running job moves"
        )
    if not (places_itself(target.scheduler) and moves_jobs(target.scheduler)):
        raise Unplannable(
            f"a running job moves only to a cluster whose scheduler starts it pinned to the "
            f"node its checkpoint is staged on (Slurm, Kubernetes); {target.name} "
            f"runs {target.scheduler}"
        )
    node = _single(action.source_node, "source", action)
    landing = _single(action.target_node, "target", action)
    at_source = agent_queue(cluster.name, node)
    at_target = agent_queue(target.name, landing)
    submit = (ConnectorStep.submit, there)  # held, pinned to the target node
    checkpoint = (AgentStep.checkpoint, at_source)
    if holds_moved_jobs(target.scheduler):
        # The target's GPUs are held for the job before anything stops it at home: the
        # held copy is submitted and its node reserved first (a reservation refused because
        # the target's own queue took the GPUs since the plan ends the move with the job
        # untouched), and the reservation is given back once the job is B's.
        first = [submit, (ConnectorStep.reserve, there), checkpoint]
        last = [(ConnectorStep.unreserve, there)]
    else:
        first, last = [checkpoint, submit], []
    names = [
        *first,
        (AgentStep.transfer, at_target),
        (AgentStep.stage, at_target),
        (ConnectorStep.release, there),  # its scheduler starts it there, restored
        (AgentStep.confirm, at_target),
        (ConnectorStep.cancel, source),
        (AgentStep.release, at_source),
        *last,
    ]
    for seq, (name, queue) in enumerate(names):
        plan.add(name, queue, fwd, seq)
    return plan.steps


def _planned_nodes(action: Action) -> list[str]:
    """The target nodes a pending job's move was planned onto (none: B's scheduler
    chooses)."""
    return node_names(action.target_node)


def answered_or_given_up(action: Action, step: ActionStep) -> bool:
    """Whether a step sent without an answer may be given up after its attempts: not a
    compensation step, nor a move's last steps (the cancel at its source, the release of
    a running job's checkpoint there, the give-back of the target's reservation): see the
    module's docstring."""
    if step.phase == StepPhase.compensate:
        return False
    if ActionKind(action.kind) is ActionKind.migrate:
        # Its last step, the source's release, comes after the target's confirm: the job
        # runs there. Given up, compensation would stop it there and restore the
        # checkpoint at the source, losing the work done since (and a late release there
        # would delete that checkpoint first).
        return step.name != AgentStep.release
    if ActionKind(action.kind) is not ActionKind.move:
        return True
    source_release = step.name == AgentStep.release and is_agent_queue(step.queue)
    last = (ConnectorStep.cancel, ConnectorStep.unreserve)
    return not (step.name in last or source_release)


def _move_compensation(plan: _Plan, steps: list[ActionStep], seq: int) -> list[ActionStep]:
    forward = [s for s in steps if s.phase == StepPhase.forward]
    sent = [s for s in forward if s.state not in (StepState.pending, StepState.skipped)]
    cancel = next(s for s in forward if s.name == ConnectorStep.cancel)
    if cancel.state == StepState.succeeded:
        return []  # the job is the target's now: what failed after is not undone
    submit = next(s for s in forward if s.name == ConnectorStep.submit)
    if submit in sent:
        plan.add(ConnectorStep.withdraw, submit.queue, StepPhase.compensate, seq)
        seq += 1
    reserve = next((s for s in forward if s.name == ConnectorStep.reserve), None)
    if reserve is not None and reserve in sent:
        # Its answer may have been lost after the reservation was made.
        plan.add(ConnectorStep.unreserve, reserve.queue, StepPhase.compensate, seq)
        seq += 1
    hold = next((s for s in forward if s.name == ConnectorStep.hold), None)
    if hold is not None:  # a pending job's move
        if hold in sent:
            # Whatever its answer, the hold may have taken effect (a read after it can fail):
            # the release is asked only if the job is still pending and held (args.if_held).
            plan.add(ConnectorStep.release, hold.queue, StepPhase.compensate, seq)
        return plan.steps
    # A running job's: fence the target node, bring the job back at its source.
    checkpoint = next(s for s in forward if s.name == AgentStep.checkpoint)
    if checkpoint not in sent:
        return plan.steps
    landed = [s for s in sent if is_agent_queue(s.queue) and s.queue != checkpoint.queue]
    if landed:
        plan.add(AgentStep.release, landed[0].queue, StepPhase.compensate, seq)
        seq += 1
    plan.add(AgentStep.restore, checkpoint.queue, StepPhase.compensate, seq)
    return plan.steps


def _requeued(steps: list[ActionStep]) -> bool:
    """Whether the forward phase's requeue may have reached the scheduler."""
    requeue = next(
        (s for s in steps if s.phase == StepPhase.forward and s.name == ConnectorStep.requeue), None
    )
    return requeue is not None and may_have_run(requeue)


def compensation_steps(
    action: Action,
    steps: list[ActionStep],
    cluster: str,
    generation: int,
    job: Job | None = None,
) -> list[ActionStep]:
    """Undo what the forward steps did: fence the target, keep or bring the job back home,
    size a service back."""
    if ActionKind(action.kind) in NODE_ACTION_KINDS | JOB_SET_ACTION_KINDS:
        return []  # a drain is not undone by its failure, nor a job set's move (docstring)
    plan = _Plan(action, cluster, generation)
    seq = max(s.seq for s in steps) + 1
    if ActionKind(action.kind) is ActionKind.move:
        return _move_compensation(plan, steps, seq)
    if ActionKind(action.kind) is ActionKind.resize:
        if job is not None and _service_resize_may_have_run(action, job, steps):
            plan.add(ConnectorStep.undo_resize, connector_queue(cluster), StepPhase.compensate, seq)
        return plan.steps
    if ActionKind(action.kind) is ActionKind.reserve:
        reserve = next((s for s in steps if s.name == ConnectorStep.reserve), None)
        if reserve is not None and may_have_run(reserve):
            # A copy may hold the GPUs later, for its time to live, with no action left to
            # give them back: take it off, at a generation that refuses a copy still queued.
            plan.add(ConnectorStep.unreserve, reserve.queue, StepPhase.compensate, seq)
        return plan.steps
    if spans_nodes(action):
        if _requeued(steps):
            # A gang's move: its scheduler stopped it (held, or pinned to nodes it has not
            # started on). Start it again where it ran; the saga marks it displaced, so the
            # next plan places it first if it cannot start there.
            plan.add(ConnectorStep.start, connector_queue(cluster), StepPhase.compensate, seq)
        return plan.steps
    by_name = {s.name: s for s in steps if s.phase == StepPhase.forward}
    checkpoint = by_name.get(AgentStep.checkpoint)
    if checkpoint is None or checkpoint.state in (StepState.pending, StepState.skipped):
        return []  # nothing process-level happened (or only the scheduler was asked)
    source = checkpoint.queue
    if runs_at_target(action, steps):
        return []  # a failed release at the source undoes nothing
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


def runs_at_target(action: Action, steps: list[ActionStep]) -> bool:
    """Whether a migrate's target confirmed the job running there (its agent's confirm,
    the step before the source's release): the migration is done but for that release."""
    if ActionKind(action.kind) is not ActionKind.migrate:
        return False
    forward = {s.name: s for s in steps if s.phase == StepPhase.forward}
    checkpoint, confirm = forward.get(AgentStep.checkpoint), forward.get(AgentStep.confirm)
    return (
        checkpoint is not None
        and confirm is not None
        and confirm.queue != checkpoint.queue
        and confirm.state == StepState.succeeded
    )


def _service_resize_may_have_run(action: Action, job: Job, steps: list[ActionStep]) -> bool:
    """A service's resize that ran, or may have or may yet (:func:`may_have_run`: a copy
    still queued reaches the connector late), and that has a size to go back to.
    An elastic training job's resize is not undone here: it may have restarted the job
    elsewhere, and its own checkpoint is what it resumes from either way."""
    if job.shape == JobShape.block or replicas_before(action, job) < 1:
        return False
    resize = next(
        (s for s in steps if s.phase == StepPhase.forward and s.name == ConnectorStep.resize),
        None,
    )
    return resize is not None and may_have_run(resize)


def resume_step(action: Action, failed: ActionStep, cluster: str) -> ActionStep:
    """When a compensating restore fails, neither target nor source can take the job: it
    goes back to its scheduler's queue with its checkpoint, by a ``resume`` right after
    the failed step."""
    back = _Plan(action, cluster, failed.generation)
    back.add(ConnectorStep.resume, connector_queue(cluster), StepPhase.compensate, failed.seq + 1)
    return back.steps[0]
