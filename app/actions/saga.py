"""Actions as durable sagas: the state machine that runs each action's steps.

Every step is a message to the one process that can do it — the node agent of a node
(``agent.<cluster>.<node>``) for process-level steps, the cluster's connector
(``connector.<cluster>``) for scheduler-level ones — and its state lives in ``action_steps``.
Executors answer with a report (``app.actions.tasks.report``) that names the step's
idempotency key. The message, the report, the step names and the queue names are the
ones in ``wire`` (``wire.steps``, ``wire.queues``), which the executors import too.
Which steps each action kind runs, in which order, and what compensation runs are in
``app.actions.recipes``; how a step's message is built, in ``app.actions.messages``.
:func:`advance` runs on every event (approval, a report, the periodic sweep), in phases:

1. **Lock** the action row (``SELECT … FOR UPDATE``): one advance at a time per action,
   whichever worker runs it.
2. **Dispatch** an approved action: plan its forward steps (``recipes.forward_steps``),
   bump the job's generation (the fencing token) when the saga moves the job, and go
   ``dispatched`` → ``running``.
   An action whose job another saga is already moving is cancelled, not queued.
   A node's action (drain, undrain: ``NODE_ACTION_KINDS``) has no job: it is fenced per
   node instead — cancelled while another drain or undrain of the node runs, and its
   steps carry the action's id as their generation (``recipes.node_steps``). A job set's
   action (``JOB_SET_ACTION_KINDS``) likewise, per job set (``recipes.job_set_steps``).
3. **Step**: in the current phase, the first step that is not finished decides —
   ``pending``: mark it ``sent`` and emit its message; ``sent`` for longer than its timeout:
   emit it again under the same key (the executor deduplicates) or, after
   ``MAX_ATTEMPTS``, fail it (a compensation step is sent until it is answered: see
   ``_advance_locked``); ``failed``: a forward failure starts compensation (a new
   generation, so nothing the forward phase sent can still act;
   ``recipes.compensation_steps``), a compensation failure fails the action.
4. **Finish**: all forward steps done → ``succeeded``; all compensation steps done →
   ``compensated``. ``error`` says what failed and what compensation did.

Messages are returned to the caller and sent only after the commit, so no message refers
to state that was rolled back. A crash between the commit and the send leaves a ``sent``
step that times out and is sent again. Reports for a step that is not ``sent`` (duplicates,
late answers of an earlier attempt or of a phase that was abandoned) change nothing.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Collection
from datetime import datetime, timedelta
from typing import Any

from sqlmodel import Session, col, select

from app.actions import service as action_service
from app.actions.messages import Outgoing, spans_nodes, step_message
from app.actions.models import (
    ACTIVE_ACTION_STATES,
    JOB_SET_ACTION_KINDS,
    NODE_ACTION_KINDS,
    TERMINAL_ACTION_STATES,
    TRANSITIONS,
    UNDONE_ACTION_STATES,
    Action,
    ActionKind,
    ActionState,
    ActionStep,
    ActionStepPublic,
    StepState,
)
from app.actions.placements import record_placement
from app.actions.recipes import (
    COPY_MAY_RUN,
    MAX_ATTEMPTS,
    NO_ANSWER,
    Unplannable,
    answered_or_given_up,
    compensation_steps,
    forward_steps,
    job_set_steps,
    node_steps,
    resume_step,
    runs_at_target,
)
from app.clusters.models import Cluster
from app.core.config import DEFAULT_SCHEDULER_START_WAIT_S
from app.core.errors import Conflict
from app.core.lookup import found, row_id
from app.core.security import Principal
from app.jobs.models import Job
from app.nodes.models import Node
from wire.queues import CONTROL_QUEUE, executor_scope, is_agent_queue, is_connector_queue
from wire.steps import AgentStep, ConnectorStep, StepPhase, StepReport
from wire.telemetry import NodeState

log = logging.getLogger(__name__)

SCHEDULER_START_WAIT_S = DEFAULT_SCHEDULER_START_WAIT_S  # SHAPER_SCHEDULER_START_WAIT_S
# How long a step may stay unanswered before it is sent again (the executor deduplicates).
# (A confirm after a stage waits for the scheduler, so it gets longer: see _timeout.)
STEP_TIMEOUT_S: dict[str, float] = {
    AgentStep.checkpoint: 600.0,
    AgentStep.restore: 300.0,
    AgentStep.transfer: 600.0,
}
DEFAULT_STEP_TIMEOUT_S = 120.0
# A connector's confirm is a poll: "not yet" answers are retried this often, at least this
# many times and for at least the scheduler's start wait (SHAPER_SCHEDULER_START_WAIT_S).
CONFIRM_POLL_S = 5.0
CONFIRM_POLLS = 24
ADVANCE_TASK = "app.actions.tasks.advance"
RETRY_BACKOFF_S = (1.0, 4.0, 15.0)
# Compensation steps resent after a "not now" until answered: failed, a service would stay
# short (undo_resize), or a copy of the give-back still queued could take off a
# reservation a newer action of the job made at the same generation (unreserve).
WAITS_OUT_NOT_NOW = (ConnectorStep.undo_resize, ConnectorStep.unreserve)


def _move(action: Action, to: ActionState, now: datetime) -> None:
    current = ActionState(action.state)
    if to not in TRANSITIONS[current]:
        raise Conflict(
            f"action {action.id} is {current.value}; it cannot become {to.value}",
            resource="action",
            resource_id=action.id,
        )
    action.state = to
    action.updated_at = now
    if to in TERMINAL_ACTION_STATES:
        log.info(
            "action %s (%s) %s%s",
            action.id,
            action.kind,
            to.value,
            f": {action.error}" if action.error else "",
            extra={"action_id": action.id, "plan_id": action.plan_id},
        )


def _steps(session: Session, action_id: int) -> list[ActionStep]:
    return list(
        session.exec(
            select(ActionStep)
            .where(ActionStep.action_id == action_id)
            .order_by(col(ActionStep.seq))
        )
    )


def _timeout(
    step: ActionStep, steps: list[ActionStep], override: float | None, start_wait_s: float
) -> float:
    if override is not None:
        return override
    staged = any(s.name == AgentStep.stage and s.phase == step.phase for s in steps)
    if step.name == AgentStep.confirm and staged:  # it waits for the scheduler (step_message)
        return max(DEFAULT_STEP_TIMEOUT_S, start_wait_s + 60.0)
    return STEP_TIMEOUT_S.get(step.name, DEFAULT_STEP_TIMEOUT_S)


def advance(
    *,
    session: Session,
    action_id: int,
    now: datetime,
    step_timeout_s: float | None = None,
    start_wait_s: float = SCHEDULER_START_WAIT_S,
) -> list[Outgoing]:
    """Move one action's saga as far as it can go now; returns the messages to send.

    step_timeout_s overrides every step's timeout; start_wait_s is how long a confirm
    waits for the scheduler to start a requeued job (see SCHEDULER_START_WAIT_S)."""
    action = action_service.lock_action(session, action_id)
    outgoing = _advance_locked(session, action, now, step_timeout_s, start_wait_s)
    outgoing += _after(session, action, now)
    session.commit()
    return outgoing


def _after(session: Session, action: Action, now: datetime) -> list[Outgoing]:
    """Once an action has ended: its bookkeeping (``action_service.ended``) and a kick for
    each approved action that was waiting for it."""
    if ActionState(action.state) not in TERMINAL_ACTION_STATES or action.finished_at is not None:
        return []
    ready = action_service.ended(session=session, action=action, now=now)
    return [kick(action_id) for action_id in ready]


def kick(action_id: int) -> Outgoing:
    """A message that makes a control worker advance an action's saga."""
    return Outgoing(queue=CONTROL_QUEUE, task=ADVANCE_TASK, kwargs={"action_id": action_id})


def _prerequisites_block(session: Session, action: Action) -> str | None:
    """'' to wait, an error when a prerequisite ended undone, None when all succeeded and
    the plan's reservations are in place (``action_service.waits_for_reservations``)."""
    if action.depends_on:
        states = dict(
            session.exec(
                select(col(Action.id), col(Action.state)).where(
                    col(Action.id).in_(action.depends_on)
                )
            ).all()
        )
        for prerequisite in action.depends_on:
            state = ActionState(states.get(prerequisite, ActionState.cancelled))
            if state in UNDONE_ACTION_STATES:
                return f"prerequisite action {prerequisite} is {state.value}"
        # Each prerequisite is in ``states`` here: a missing one returned above (cancelled).
        if not all(ActionState(states[p]) is ActionState.succeeded for p in action.depends_on):
            return ""
    if action_service.waits_for_reservations(session, action):
        return ""
    return None


def _advance_locked(
    session: Session,
    action: Action,
    now: datetime,
    step_timeout_s: float | None,
    start_wait_s: float = SCHEDULER_START_WAIT_S,
) -> list[Outgoing]:
    state = ActionState(action.state)
    if state is ActionState.approved:
        blocked = _prerequisites_block(session, action)
        if blocked == "":
            return []  # its prerequisites are still running (or waiting for theirs)
        if blocked is not None:
            _move(action, ActionState.cancelled, now)
            action.error = blocked[:4096]
            return []
        if not _dispatch(session, action, now):
            return []
        state = ActionState(action.state)
    if state not in (ActionState.running, ActionState.compensating):
        return []
    job = session.get(Job, action.job_id) if action.job_id is not None else None
    steps = _steps(session, row_id(action))
    phase = StepPhase.forward if state is ActionState.running else StepPhase.compensate
    for step in (s for s in steps if s.phase == phase):
        if step.state in (StepState.succeeded, StepState.skipped):
            continue
        if step.state == StepState.failed and _fallen_back(step, steps):
            continue  # handled: the job went back to its scheduler's queue instead
        if step.state == StepState.pending:
            return [_send(action, job, step, steps, now, start_wait_s)]
        if step.state == StepState.sent:
            assert step.sent_at is not None
            timeout = _timeout(step, steps, step_timeout_s, start_wait_s)
            if now - step.sent_at < timedelta(seconds=timeout):
                return []
            # A compensation step is never given up for want of an answer: its executor may
            # only be cut off (a partitioned target), and failing it would leave the job
            # stopped at its source with the record saying it runs there, while going on
            # without it (restoring at the source before the target is fenced) could run
            # the job twice once the target gets its queued restore. Found by
            # tests/actions/test_crash_points.py::test_the_target_cut_off_from_the_broker.
            if step.attempts < _max_attempts(step, start_wait_s) or not answered_or_given_up(
                action, step
            ):
                log.warning(
                    "action %s: step %s unanswered by %s; sending it again",
                    action.id,
                    step.name,
                    step.queue,
                )
                return [_send(action, job, step, steps, now, start_wait_s)]
            _finish_step(
                step,
                StepState.failed,
                now,
                error=f"{NO_ANSWER} from {step.queue} after {step.attempts} attempts",
            )
        # step.state is failed
        return _on_failure(session, action, job, step, steps, now, start_wait_s)
    if phase == StepPhase.forward:
        _move(action, ActionState.succeeded, now)
        if job is not None:
            record_placement(session, action, job, now)
        elif ActionKind(action.kind) in NODE_ACTION_KINDS:
            _record_node_state(session, action, steps, now)
    else:
        _move(action, ActionState.compensated, now)
        action.error = f"{action.error or 'failed'}; compensated: {_compensation_summary(steps)}"[
            :4096
        ]
    return []


def _record_node_state(
    session: Session, action: Action, steps: list[ActionStep], now: datetime
) -> None:
    """A drain or undrain confirmed: the node's state as its confirm read it, in the
    control plane's view until the connector's next telemetry says otherwise."""
    confirm = next((s for s in steps if s.name == ConnectorStep.confirm), None)
    seen = (confirm.result.get("state") if confirm is not None else None) or (
        NodeState.draining if ActionKind(action.kind) is ActionKind.drain else NodeState.up
    )
    node = _node_of(session, action)
    if node is None or seen not in {s.value for s in NodeState}:
        return
    node.state = NodeState(seen)
    node.updated_at = now
    session.add(node)


def _node_of(session: Session, action: Action, *, lock: bool = False) -> Node | None:
    """The node a drain or undrain is about (``source_node``), locked when asked."""
    query = select(Node).where(
        Node.cluster_id == action.cluster_id, Node.name == action.source_node
    )
    return session.exec(query.with_for_update() if lock else query).first()


def _dispatch_node(session: Session, action: Action, now: datetime) -> bool:
    """Plan a node action's steps, fenced per node: False when it cannot run."""
    node = _node_of(session, action, lock=True)  # one dispatch per node at a time
    cluster = session.exec(select(Cluster).where(Cluster.id == action.cluster_id)).one()
    if node is None:
        return _cancel(action, now, f"cluster {cluster.name} has no node {action.source_node}")
    return _start_fenced(
        session,
        action,
        cluster,
        now,
        kinds=NODE_ACTION_KINDS,
        same_subject=[Action.source_node == action.source_node],
        busy=f"is already draining or undraining node {node.name}",
        plan=node_steps,
    )


def _dispatch_job_set(session: Session, action: Action, now: datetime) -> bool:
    """Plan a job set's action's step, fenced per job set: False when it cannot run."""
    # One dispatch per cluster at a time: the check for another and the start are one
    # decision.
    cluster = session.exec(
        select(Cluster).where(Cluster.id == action.cluster_id).with_for_update()
    ).one()
    return _start_fenced(
        session,
        action,
        cluster,
        now,
        kinds=JOB_SET_ACTION_KINDS,
        same_subject=[
            Action.job_set_queue == action.job_set_queue,
            Action.job_set == action.job_set,
        ],
        busy=f"is already moving job set {action.job_set} of queue {action.job_set_queue}",
        plan=job_set_steps,
    )


def _start_fenced(
    session: Session,
    action: Action,
    cluster: Cluster,
    now: datetime,
    *,
    kinds: Collection[ActionKind],
    same_subject: list[Any],
    busy: str,
    plan: Callable[[Action, Cluster], list[ActionStep]],
) -> bool:
    """Start an action about something other than a job (a node, a job set) unless another
    of ``kinds`` about the same subject is in flight (cancelled, saying which: ``busy``)
    or its steps cannot be planned. The caller holds the lock that makes this one
    decision."""
    other = session.exec(
        select(Action.id).where(
            Action.cluster_id == action.cluster_id,
            col(Action.kind).in_([k.value for k in kinds]),
            *same_subject,
            Action.id != action.id,
            col(Action.state).in_(IN_FLIGHT),
        )
    ).first()
    if other is not None:
        return _cancel(action, now, f"action {other} {busy}")
    try:
        steps = plan(action, cluster)
    except Unplannable as error:
        return _cancel(action, now, str(error))
    return _start(session, action, steps, row_id(action), now)


# A saga in flight: another one for the same job (or node) must not start beside it.
IN_FLIGHT = [ActionState.dispatched, ActionState.running, ActionState.compensating]


def _cancel(action: Action, now: datetime, error: str) -> bool:
    """An approved action that cannot run: cancelled with why; False, for _dispatch."""
    _move(action, ActionState.cancelled, now)
    action.error = error
    return False


def _dispatch(session: Session, action: Action, now: datetime) -> bool:
    """Plan the forward steps and fence the job; False when the action cannot run."""
    if ActionKind(action.kind) in NODE_ACTION_KINDS:
        return _dispatch_node(session, action, now)
    if ActionKind(action.kind) in JOB_SET_ACTION_KINDS:
        return _dispatch_job_set(session, action, now)
    job = None
    if action.job_id is not None:
        job = session.exec(select(Job).where(Job.id == action.job_id).with_for_update()).first()
    if job is None:
        _move(action, ActionState.cancelled, now)
        action.error = "the action's job no longer exists"
        return False
    busy = session.exec(
        select(Action.id).where(
            Action.job_id == job.id,
            Action.id != action.id,
            col(Action.state).in_(IN_FLIGHT),
        )
    ).first()
    if busy is not None:
        _move(action, ActionState.cancelled, now)
        action.error = f"action {busy} is already moving job {job.external_id}"
        return False
    cluster = session.exec(select(Cluster).where(Cluster.id == action.cluster_id)).one()
    target = (
        session.get(Cluster, action.target_cluster_id)
        if action.target_cluster_id is not None
        else None
    )
    kind = ActionKind(action.kind)
    moving = kind in (ActionKind.migrate, ActionKind.move) or (
        kind is ActionKind.preempt and job.checkpointable
    )
    generation = job.generation + 1 if moving else job.generation
    try:
        steps = forward_steps(action, job, cluster, generation, target)
    except Unplannable as error:
        _move(action, ActionState.cancelled, now)
        action.error = str(error)
        return False
    if moving:
        job.generation = generation
        job.updated_at = now
        session.add(job)
    return _start(session, action, steps, generation, now)


def _start(
    session: Session, action: Action, steps: list[ActionStep], token: int, now: datetime
) -> bool:
    """A dispatched action's steps stored under its fencing token: it runs."""
    action.fencing_token = token
    for step in steps:
        session.add(step)
    _move(action, ActionState.dispatched, now)
    _move(action, ActionState.running, now)
    session.flush()
    return True


def _polls(step: ActionStep) -> bool:
    """A connector's confirm: "not yet" is an answer, asked again until it holds."""
    return step.name == ConnectorStep.confirm and is_connector_queue(step.queue)


def _max_attempts(step: ActionStep, start_wait_s: float) -> int:
    """A confirm polls for as long as the scheduler may take to start a job."""
    if _polls(step):
        return max(CONFIRM_POLLS, math.ceil(start_wait_s / CONFIRM_POLL_S))
    return MAX_ATTEMPTS


def _send(
    action: Action,
    job: Job | None,
    step: ActionStep,
    steps: list[ActionStep],
    now: datetime,
    start_wait_s: float,
) -> Outgoing:
    retry = step.attempts > 0
    step.state = StepState.sent
    step.attempts += 1
    step.sent_at = now
    action.attempts += 1
    action.updated_at = now
    message = step_message(action, job, step, steps, start_wait_s)
    if retry:
        backoff = (
            CONFIRM_POLL_S
            if _polls(step)
            else RETRY_BACKOFF_S[min(step.attempts - 2, len(RETRY_BACKOFF_S) - 1)]
        )
        return Outgoing(message.queue, message.task, message.kwargs, countdown=backoff)
    return message


def _finish_step(
    step: ActionStep,
    state: StepState,
    now: datetime,
    *,
    result: dict[str, Any] | None = None,
    error: str | None = None,
) -> None:
    step.state = state
    step.finished_at = now
    if result is not None:
        step.result = result
    if error is not None:
        step.error = error[:4096]


def _on_failure(
    session: Session,
    action: Action,
    job: Job | None,
    failed: ActionStep,
    steps: list[ActionStep],
    now: datetime,
    start_wait_s: float,
) -> list[Outgoing]:
    why = f"{failed.name} on {failed.queue} failed: {failed.error or 'unknown error'}"
    if failed.phase == StepPhase.compensate:
        action.error = f"{action.error or 'failed'}; compensation {why}"[:4096]
        checkpointed = any(
            s.phase == StepPhase.forward
            and s.name == AgentStep.checkpoint
            and s.state == StepState.succeeded
            for s in steps
        )
        if (
            job is not None
            and checkpointed
            and is_agent_queue(failed.queue)
            and (failed.name == AgentStep.restore)
        ):
            # Neither target nor source could take the job: it goes back to its
            # scheduler's queue with its checkpoint, and the next plan places it first.
            _displace(job, action, now, why)
            cluster = session.exec(
                select(Cluster.name).where(Cluster.id == action.cluster_id)
            ).one()
            step = resume_step(action, failed, cluster)
            session.add(step)
            session.flush()
            return [_send(action, job, step, [*steps, step], now, start_wait_s)]
        stuck = (
            AgentStep.stage,
            ConnectorStep.requeue,
            ConnectorStep.confirm,
            ConnectorStep.resume,
        )
        if job is not None and failed.name in stuck:  # a confirm of the agent's too: same name
            _displace(job, action, now, why)  # queued (or stuck) away from its GPUs
        _move(action, ActionState.failed, now)
        return []
    for step in steps:
        if step.phase == StepPhase.forward and step.state == StepState.pending:
            step.state = StepState.skipped
    action.error = why[:4096]
    if job is not None:
        job = session.exec(select(Job).where(Job.id == job.id).with_for_update()).one()
    generation = (job.generation + 1) if job is not None else failed.generation
    cluster = session.exec(select(Cluster.name).where(Cluster.id == action.cluster_id)).one()
    compensation = compensation_steps(action, steps, cluster, generation, job)
    if not compensation:
        # Nothing ran that needs undoing: the scheduler refused, or nothing reached a node;
        # or a migrate's release at its source failed after its target confirmed the job,
        # which runs there now (the record says so, as for a migrate that succeeded).
        if job is not None and runs_at_target(action, steps):
            record_placement(session, action, job, now)
        _move(action, ActionState.failed, now)
        return []
    if job is not None:
        # A new generation: whatever the forward phase sent is stale from now on.
        job.generation = generation
        job.updated_at = now
        if spans_nodes(action):
            # A gang's move stopped it: it may not start again where it was.
            _displace(job, action, now, why, "was stopped by it")
        session.add(job)
    _move(action, ActionState.compensating, now)
    for step in compensation:
        session.add(step)
    session.flush()
    steps = [*steps, *compensation]
    return [_send(action, job, compensation[0], steps, now, start_wait_s)]


def _fallen_back(step: ActionStep, steps: list[ActionStep]) -> bool:
    """A compensating restore that failed and was followed by the queue fallback."""
    return any(
        s.phase == StepPhase.compensate and s.name == ConnectorStep.resume and s.seq > step.seq
        for s in steps
    )


def _displace(
    job: Job, action: Action, now: datetime, why: str, what: str = "could not put it back"
) -> None:
    job.displaced_at = now
    job.displaced_reason = (
        f"action {action.id} ({action.kind}) {what} ({why}); it waits in its "
        "scheduler's queue with its checkpoint and the next plan places it first"
    )[:1024]
    job.updated_at = now


def _compensation_summary(steps: list[ActionStep]) -> str:
    done = [
        f"{s.name} on {s.queue.removeprefix('agent.')} ({s.result.get('summary', 'done')})"
        for s in steps
        if s.phase == StepPhase.compensate and s.state == StepState.succeeded
    ]
    return ", ".join(done) or "nothing to undo"


def record_report(
    *,
    session: Session,
    report: StepReport,
    now: datetime,
    reporter: Principal,
    start_wait_s: float = SCHEDULER_START_WAIT_S,
) -> list[Outgoing]:
    """Apply an executor's report to its step and advance the saga.

    Only the executor the step was sent to may answer it: ``reporter`` must hold the scope
    of the step's queue (``agent:<cluster>/<node>``, ``connector:<cluster>``). Only a step
    waiting for an answer (``sent``) takes a report; anything else is a duplicate or a late
    answer and changes nothing.
    """
    # The plan first, as every locker of a plan's actions (action_service.lock_action).
    action_service.lock_plan_of(session, report.action_id)
    action = session.exec(
        select(Action).where(Action.id == report.action_id).with_for_update()
    ).first()
    if action is None:
        log.warning("report for unknown action %s ignored", report.action_id)
        return []
    step = session.exec(
        select(ActionStep).where(
            ActionStep.action_id == action.id, ActionStep.idempotency_key == report.key
        )
    ).first()
    if step is not None and not reporter.allows(executor_scope(step.queue)):
        log.warning(
            "action %s: report for step %s from %s ignored: it lacks the scope %s",
            action.id,
            report.key,
            reporter.name,
            executor_scope(step.queue),
        )
        session.commit()
        return []
    if step is None or step.state != StepState.sent:
        log.info(
            "action %s: report for step %s ignored (%s)",
            action.id,
            report.key,
            "unknown step" if step is None else f"step is {step.state}",
        )
        session.commit()
        return []
    outgoing: list[Outgoing] = []
    step.answers += 1
    if report.ok:
        _finish_step(step, StepState.succeeded, now, result=report.result)
    elif report.retryable and (
        step.attempts < _max_attempts(step, start_wait_s)
        or (step.phase == StepPhase.forward and not answered_or_given_up(action, step))
        or (step.phase == StepPhase.compensate and step.name in WAITS_OUT_NOT_NOW)
    ):
        # A forward step that may not be given up (a move's cancel at its source) waits out
        # a scheduler that says "not now" as it waits out one that does not answer; so do
        # the compensation steps that have no fallback (WAITS_OUT_NOT_NOW). (Another
        # compensation step's "not now" still fails it after its attempts: its failure has
        # a fallback, the scheduler's queue with the checkpoint.)
        job = session.get(Job, action.job_id) if action.job_id is not None else None
        step.error = (report.error or "")[:4096]
        steps = _steps(session, row_id(action))
        outgoing = [_send(action, job, step, steps, now, start_wait_s)]
    else:
        error = report.error
        if report.retryable and step.answers < step.attempts:
            # This "not now" answers one of its copies; another, sent when an answer was
            # slow, may still be queued there (retryable answers are not journalled).
            error = (
                f"{COPY_MAY_RUN} ({step.attempts} sent, {step.answers} answered): "
                f"{error or 'not now'}"
            )
        _finish_step(step, StepState.failed, now, result=report.result, error=error)
    session.flush()
    if not outgoing:
        outgoing = _advance_locked(session, action, now, None, start_wait_s)
    outgoing += _after(session, action, now)
    session.commit()
    return outgoing


def active_action_ids(*, session: Session, limit: int = 1000) -> list[int]:
    """Actions the sweep must look at: approved or with a saga in flight."""
    ids = session.exec(
        select(col(Action.id))
        .where(col(Action.state).in_([s.value for s in ACTIVE_ACTION_STATES]))
        .order_by(col(Action.id))
        .limit(limit)
    )
    return [i for i in ids if i is not None]  # a primary key is never NULL


def list_steps(*, session: Session, action_id: int) -> list[ActionStepPublic]:
    found(
        session.get(Action, action_id),
        f"action {action_id} does not exist",
        resource="action",
        resource_id=action_id,
    )
    return [ActionStepPublic.model_validate(s) for s in _steps(session, action_id)]
