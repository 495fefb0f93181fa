from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from itertools import pairwise

import sqlalchemy as sa
from sqlalchemy.orm import aliased
from sqlmodel import Session, col, select

from app.actions.models import (
    ACTIVE_ACTION_STATES,
    TERMINAL_ACTION_STATES,
    TRANSITIONS,
    UNDONE_ACTION_STATES,
    Action,
    ActionKind,
    ActionPublic,
    ActionState,
    ActionStep,
    ChurnPublic,
    StepState,
)
from app.actions.moved import record_move
from app.actions.placements import record_placement
from app.actions.recipes import MAX_ATTEMPTS, answered_or_given_up
from app.actions.schedulers import places_itself
from app.audit import service as audit
from app.audit.models import Actor
from app.audit.service import AuditObject
from app.clusters.models import Cluster
from app.core.errors import Conflict
from app.core.lookup import found, row_id
from app.core.paging import Page, count_rows
from app.jobs.models import Allocation, Job
from app.plans.models import Plan
from wire.queues import connector_cluster
from wire.steps import ConnectorStep, StepPhase

# The cluster a move sends its job to (``actions`` joins ``clusters`` twice).
TARGET = aliased(Cluster, name="target_cluster")


def list_actions(
    *,
    session: Session,
    cluster: str | None = None,
    state: ActionState | None = None,
    plan_id: int | None = None,
    job_id: int | None = None,
    limit: int = 100,
    offset: int = 0,
) -> Page[ActionPublic]:
    query = (
        sa.select(Action, col(Cluster.name), col(Job.external_id), col(TARGET.name))
        .join(Cluster, col(Cluster.id) == Action.cluster_id)
        .outerjoin(Job, col(Job.id) == Action.job_id)
        .outerjoin(TARGET, col(TARGET.id) == Action.target_cluster_id)
    )
    if cluster is not None:
        query = query.where(col(Cluster.name) == cluster)
    if state is not None:
        query = query.where(col(Action.state) == state.value)
    if plan_id is not None:
        query = query.where(col(Action.plan_id) == plan_id)
    if job_id is not None:
        query = query.where(col(Action.job_id) == job_id)
    total = count_rows(session, query)
    rows = session.execute(query.order_by(col(Action.id).desc()).limit(limit).offset(offset))
    items = [_public(a, c, j, t) for a, c, j, t in rows]
    return Page[ActionPublic](items=items, total=total, limit=limit, offset=offset)


# The fields that name what an operator's action is about (a node, a job set).
OPERATOR_SUBJECTS = frozenset(
    {"source_node", "target_node", "job_set_queue", "job_set", "target_executor"}
)


def create_operator_action(
    *,
    session: Session,
    cluster_id: int,
    kind: ActionKind,
    subject: dict[str, str],
    reason: str | None,
    what: str,
    now: datetime,
    actor: Actor | None,
    changes: dict[str, str],
) -> ActionPublic:
    """An operator's action about a node or a job set rather than a job (``subject``: the
    action's fields that name it), approved by whoever asked, in the audit log, committed;
    the caller dispatches it. ``reason`` absent: ``what`` and who asked."""
    who = actor.name if actor is not None else "shaper"
    action = Action(
        cluster_id=cluster_id,
        job_id=None,
        kind=kind,
        state=ActionState.approved,
        idempotency_key=f"{kind.value}-{cluster_id}-{uuid.uuid4().hex}",
        reason=(reason or f"{what} asked by {who}")[:2048],
        created_at=now,
        updated_at=now,
        decided_by=who,
        decided_at=now,
    )
    for field, value in subject.items():
        if field not in OPERATOR_SUBJECTS:
            raise ValueError(f"{field} does not name what an operator's action is about")
        setattr(action, field, value)
    session.add(action)
    session.flush()
    audit.record(
        session=session,
        actor=actor,
        verb=kind.value,
        object_type=AuditObject.action,
        object_id=row_id(action),
        now=now,
        changes={**changes, "reason": action.reason},
    )
    session.commit()
    return get_action(session=session, action_id=row_id(action))


def get_action(*, session: Session, action_id: int) -> ActionPublic:
    row = session.execute(
        sa.select(Action, col(Cluster.name), col(Job.external_id), col(TARGET.name))
        .join(Cluster, col(Cluster.id) == Action.cluster_id)
        .outerjoin(Job, col(Job.id) == Action.job_id)
        .outerjoin(TARGET, col(TARGET.id) == Action.target_cluster_id)
        .where(col(Action.id) == action_id)
    ).first()
    return _public(
        *found(row, f"action {action_id} does not exist", resource="action", resource_id=action_id)
    )


def transition(
    *,
    session: Session,
    action_id: int,
    to: ActionState,
    by: str,
    now: datetime,
    error: str | None = None,
    actor: Actor | None = None,
) -> Action:
    """An operator's decision on one action (approve, reject, cancel); an illegal move is a
    Conflict, not a no-op.

    Approving an action approves the proposed actions it depends on (it could not run
    without them), or is refused, naming them, when one of them can no longer run; and a
    later action of the same job that waits on one of those (a moved service's growth back,
    ``solver.dependencies.split_replica_moves``), with what it depends on: approved alone,
    the shrink would leave the service short until the proposal expired.
    Rejecting or cancelling one withdraws its dependency group: the unstarted actions
    connected to it (see ``ended``).

    The action's plan is locked first (``lock_action``): two operators deciding two
    actions of one dependency group at once would otherwise each hold their own and wait
    for the other's (a deadlock, PostgreSQL aborting one). The second decision then sees
    the first's outcome.
    """
    action = lock_action(session, action_id)
    _check_move(action, to)
    before = action.state
    also_approved: list[int] = []
    if to is ActionState.approved:
        for prerequisite in _with_followers(session, action):
            state = ActionState(prerequisite.state)
            if state in UNDONE_ACTION_STATES:
                raise Conflict(
                    f"action {action_id} depends on action {prerequisite.id} "
                    f"({prerequisite.kind} of job {prerequisite.job_id}), which is "
                    f"{state.value}: it can no longer run",
                    resource="action",
                    resource_id=action_id,
                    details={"depends_on": action.depends_on, "blocking": [prerequisite.id]},
                )
            if state is ActionState.proposed:
                _decide(prerequisite, ActionState.approved, by, now)
                session.add(prerequisite)
                also_approved.append(row_id(prerequisite))
    _decide(action, to, by, now)
    if error is not None:
        action.error = error
    session.add(action)
    if to in UNDONE_ACTION_STATES:
        ended(session=session, action=action, now=now)
    changes: dict[str, object] = {"state": [before, to.value]}
    if also_approved:
        changes["prerequisites_approved"] = also_approved
    audit.record(
        session=session,
        actor=actor,
        verb=DECISION_VERBS.get(to, to.value),
        object_type=AuditObject.action,
        object_id=action_id,
        now=now,
        changes=changes,
    )
    session.commit()
    session.refresh(action)
    return action


def abandon(
    *, session: Session, action_id: int, by: str, now: datetime, actor: Actor | None = None
) -> Action:
    """An operator gives up on an action that waits for an executor gone for good (a node
    removed, a cluster taken down). The saga resends an unanswered step it may not give up
    until it is answered (app.actions.saga): every compensation step, a move's last
    steps once the target has the job (the cancel of the home copy, the release of a
    running job's checkpoint there, the give-back of the nodes the target held for it:
    app.actions.recipes), and a migrate's release at its source once its target confirmed
    the job. Those are the
    cases that can be abandoned: a ``compensating`` action, and a running ``move`` or
    ``migrate`` whose such step went unanswered for ``MAX_ATTEMPTS`` sends. The action ends
    ``failed`` with the reason (where the job runs now, and what may be left at the source
    to check by hand), the saga stops, its job is no longer locked, and what the schedulers
    report next is what the control plane believes. Anything else is a Conflict."""
    action = lock_action(session, action_id)
    current = ActionState(action.state)
    if current is ActionState.compensating:
        before = f"; it had failed with: {action.error}" if action.error else ""
        reason = (
            f"abandoned by {by} while compensating{before}; the job is where its scheduler "
            "reports it next"
        )
    else:
        stuck = _stuck_move_step(session, action)
        if stuck is None:
            raise Conflict(
                f"action {action_id} is {current.value}; only a compensating action, or a "
                "move waiting for its source's answer after the target took the job, can be "
                "abandoned",
                resource="action",
                resource_id=action_id,
                details={"state": current.value},
            )
        reason = _abandoned_move(action, stuck, _steps_of(session, row_id(action)), by)
        job = session.get(Job, action.job_id) if action.job_id is not None else None
        if job is not None and ActionKind(action.kind) is ActionKind.migrate:
            # Its target confirmed the job: it runs there, as after a migrate that ended.
            record_placement(session, action, job, now)
        if job is not None and ActionKind(action.kind) is ActionKind.move:
            # The target has the job: the home row says so (and is left out of plans, so
            # a home copy that comes back held is never started: snapshot), and the
            # target's row is fenced at the move's generation, as a finished move's are.
            record_move(
                session,
                action,
                job,
                now,
                unconfirmed=HOME_COPY_UNCONFIRMED if stuck.name == ConnectorStep.cancel else None,
            )
    if ActionKind(action.kind) is not ActionKind.move:
        _fence_abandoned(session, action, now)
    _decide(action, ActionState.failed, by, now)
    action.error = reason[:2000]
    session.add(action)
    ended(session=session, action=action, now=now)
    audit.record(
        session=session,
        actor=actor,
        verb="abandon",
        object_type=AuditObject.action,
        object_id=action_id,
        now=now,
        changes={"state": [current.value, ActionState.failed.value]},
    )
    session.commit()
    session.refresh(action)
    return action


def _fence_abandoned(session: Session, action: Action, now: datetime) -> None:
    """A new generation for the abandoned action's job: a copy of one of its steps still
    queued for an executor that comes back is then refused as stale once a newer saga of
    the job has reached that executor (without it, that saga's steps would carry the same
    generation, and a late undo_resize or unreserve would undo what it did). A move fences
    its job itself (``record_move``)."""
    if action.job_id is None:
        return
    # FOR NO KEY UPDATE: the generation is no key, and an ingest's foreign-key checks on
    # the job's row (its allocations, samples) pass the lock instead of waiting for it.
    job = session.exec(
        select(Job).where(Job.id == action.job_id).with_for_update(key_share=True)
    ).first()
    if job is not None:
        job.generation += 1
        job.updated_at = now
        session.add(job)


# Said of a moved job's home copy whose cancel an operator gave up on: its row keeps it
# (app.shaping.snapshot leaves such a job out of every plan).
HOME_COPY_UNCONFIRMED = "was never confirmed cancelled"


def _steps_of(session: Session, action_id: int) -> list[ActionStep]:
    query = select(ActionStep).where(ActionStep.action_id == action_id)
    return list(session.exec(query.order_by(col(ActionStep.seq))))


def _stuck_move_step(session: Session, action: Action) -> ActionStep | None:
    """A running move's or migrate's step that is resent until answered and has gone
    unanswered for ``MAX_ATTEMPTS`` sends more than it has had answers (a source that keeps
    answering "not now" is alive: its step is not stuck; one that said it once and then
    went silent is); None otherwise."""
    if ActionState(action.state) is not ActionState.running:
        return None
    if ActionKind(action.kind) not in (ActionKind.move, ActionKind.migrate):
        return None
    for step in _steps_of(session, row_id(action)):
        if (
            step.state == StepState.sent
            and step.phase == StepPhase.forward
            and not answered_or_given_up(action, step)
            and step.attempts - step.answers >= MAX_ATTEMPTS
        ):
            return step
    return None


def _abandoned_move(action: Action, stuck: ActionStep, steps: list[ActionStep], by: str) -> str:
    if ActionKind(action.kind) is ActionKind.migrate:  # its source's release (recipes)
        return (
            f"abandoned by {by} after {stuck.attempts} unanswered sends of {stuck.name} to "
            f"{stuck.queue}; the job runs at {action.target_node} (its confirm there "
            "succeeded); its checkpoint image and GPUs at the source were never confirmed "
            "released: check that node by hand if it comes back"
        )
    submit = next(s for s in steps if s.name == ConnectorStep.submit)
    arrived = submit.result.get("external_id", "?")
    where = f"the job runs at {connector_cluster(submit.queue)} as job {arrived}"
    if stuck.name == ConnectorStep.cancel:
        left = (
            f"its copy at {connector_cluster(stuck.queue)} {HOME_COPY_UNCONFIRMED}: cancel "
            "it there by hand if that cluster comes back (plans leave it alone)"
        )
    elif stuck.name == ConnectorStep.unreserve:
        left = (
            f"the nodes {connector_cluster(stuck.queue)} held for it were never confirmed "
            "given back: its connector's upkeep ends the reservation at its time to live"
        )
    else:
        left = (
            f"its checkpoint image at the source ({stuck.queue}) was never confirmed "
            "deleted: remove it by hand if that node comes back"
        )
    return (
        f"abandoned by {by} after {stuck.attempts} unanswered sends of {stuck.name} to "
        f"{stuck.queue}; {where}; {left}"
    )


DECISION_VERBS = {
    ActionState.approved: "approve",
    ActionState.rejected: "reject",
    ActionState.cancelled: "cancel",
}


def end_unstarted(*, session: Session, action_id: int, error: str, by: str, now: datetime) -> bool:
    """Withdraw an action that has not started (proposed, or approved and not dispatched):
    ``cancelled`` with ``error``, and its dependency group with it. The row is locked and
    read again first, so an action a worker has just dispatched is left alone (False).
    The caller commits."""
    action = lock_action(session, action_id)
    if ActionState(action.state) not in (ActionState.proposed, ActionState.approved):
        return False
    _decide(action, ActionState.cancelled, by, now)
    action.error = error[:4096]
    session.add(action)
    ended(session=session, action=action, now=now)
    return True


def ended(*, session: Session, action: Action, now: datetime) -> list[int]:
    """Bookkeeping when an action ends; the caller commits. Returns the ids of approved
    actions that may run now: dependants when it succeeded, ``unreserve`` actions when GPUs
    held for its job are no longer wanted.

    * ``finished_at`` is set;
    * if it ended without doing its job, its dependency group falls whole: every unstarted
      action connected to it by dependencies (either way) is cancelled with the reason —
      but a moved service's growth back whose shrink has run or runs, which then runs
      after that shrink alone (``_shrink_before``);
    * if GPUs were reserved for its job by its plan and the job will not take them now, an
      ``unreserve`` action (approved by shaper) gives them back to the scheduler — also
      when a reservation succeeds after what it was for was withdrawn;
    * when it was the plan's last reservation still to end, the plan's other approved
      actions, which waited for it (``waits_for_reservations``), may run.
    """
    action.finished_at = action.finished_at or now
    session.add(action)
    if action.plan_id is None:
        return []
    # Locked (and read again), in id order: a sibling a worker is dispatching right now is
    # seen as running, not cancelled behind its back.
    siblings = list(
        session.exec(
            select(Action)
            .where(Action.plan_id == action.plan_id)
            .order_by(col(Action.id))
            .with_for_update()
            .execution_options(populate_existing=True)
        )
    )
    if ActionState(action.state) is ActionState.succeeded:
        ready = [
            row_id(a)
            for a in siblings
            if action.id in (a.depends_on or []) and ActionState(a.state) is ActionState.approved
        ]
        if ActionKind(action.kind) is ActionKind.reserve and _taker_withdrawn(action, siblings):
            ready += _give_back_reservation(session, action, siblings, now)
        if ActionKind(action.kind) in TAKER_KINDS and _returned_by_plan(session, action):
            ready += _give_back_reservation(session, action, siblings, now)
        return ready + [i for i in _reservations_in_place(action, siblings) if i not in ready]
    why = f"action {action.id} ({action.kind}) of the same plan is {action.state}"
    if action.error:
        why += f": {action.error}"
    withdrawn = [action]
    restored: list[int] = []
    for other in _connected(action, siblings):
        if ActionState(other.state) in (ActionState.proposed, ActionState.approved):
            shrink = _shrink_before(other, siblings)
            if shrink is not None:
                # A moved service's growth back: its shrink has run (or runs), so it still
                # has a service to restore, now after the shrink alone.
                other.depends_on = [row_id(shrink)]
                session.add(other)
                restored.append(row_id(other))
                continue
            _decide(other, ActionState.cancelled, "shaper", now)
            other.error = why[:4096]
            other.finished_at = now
            session.add(other)
            withdrawn.append(other)
    given_back: list[int] = []
    for taker in withdrawn:
        if ActionKind(taker.kind) in TAKER_KINDS:
            given_back += _give_back_reservation(session, taker, siblings, now)
    return given_back + restored + _reservations_in_place(action, siblings)


def _shrink_before(growth: Action, siblings: list[Action]) -> Action | None:
    """For an approved resize of a job, the earlier resize of that job in the plan that
    shrank it and has run or is running (a replica move's first half,
    ``solver.dependencies.split_replica_moves``), if any: when what the move made room for
    ends undone, the growth back still runs, after that shrink, instead of falling with
    it and leaving the service short until a later plan grows it again."""
    if ActionState(growth.state) is not ActionState.approved or growth.job_id is None:
        return None
    if ActionKind(growth.kind) is not ActionKind.resize:
        return None
    for earlier in siblings:
        if (
            earlier.job_id == growth.job_id
            and row_id(earlier) < row_id(growth)
            and ActionKind(earlier.kind) is ActionKind.resize
            and ActionState(earlier.state) in (ActionState.running, ActionState.succeeded)
            and sum(earlier.target_placement.values()) < sum(earlier.source_placement.values())
        ):
            return earlier
    return None


TAKER_KINDS = (ActionKind.start, ActionKind.migrate, ActionKind.resize)


def waits_for_reservations(session: Session, action: Action) -> bool:
    """Whether an action waits for its plan's reservations: none of a plan's actions that
    act on jobs runs while one of its approved reservations has yet to end.

    Dependencies order only an action's own group, but any action can set the native
    scheduler's queue moving (a start of the job at its head, GPUs a requeue frees), and
    the queue then takes free GPUs that the plan gave to a start of another group whose
    reservation is not yet in place. The plan's counts are only true while all of its
    reservations hold them. Ordering only: a reservation that fails takes down its own
    group (``ended``), not the plan's others."""
    if action.plan_id is None or ActionKind(action.kind) in NOT_ON_JOBS:
        return False
    pending = session.exec(
        select(Action.id).where(
            Action.plan_id == action.plan_id,
            Action.kind == ActionKind.reserve,
            col(Action.state).in_([s.value for s in _RESERVING]),
        )
    ).first()
    return pending is not None


# A reservation the plan's other actions wait for: not yet ended, and not failed already.
# A reserve that is compensating failed (only its unreserve is left, sent until answered,
# which gives GPUs back and takes nothing): as one that ended failed, it holds up only its
# own group, not the plan's others until its connector comes back.
_RESERVING = tuple(s for s in ACTIVE_ACTION_STATES if s is not ActionState.compensating)


def _reservations_in_place(action: Action, siblings: list[Action]) -> list[int]:
    """When ``action`` was its plan's last reservation still to end: the plan's approved
    actions that waited for the reservations (``waits_for_reservations``)."""
    if ActionKind(action.kind) is not ActionKind.reserve:
        return []
    if any(
        ActionKind(a.kind) is ActionKind.reserve and ActionState(a.state) in _RESERVING
        for a in siblings
        if a.id != action.id
    ):
        return []
    return [
        row_id(a)
        for a in siblings
        if ActionKind(a.kind) not in NOT_ON_JOBS and ActionState(a.state) is ActionState.approved
    ]


def _returned_by_plan(session: Session, action: Action) -> bool:
    """Whether a reservation is given back when the action it was for has done its job.
    The simulated clusters' scheduler spends one when its job starts; Slurm's cannot tell
    when a move has ended (the job runs on the target before the move is confirmed, and
    its reservation also holds the way home), so the plan gives it back."""
    cluster = session.get(Cluster, action.cluster_id)
    return cluster is not None and places_itself(cluster.scheduler)


def _taker_withdrawn(reservation: Action, siblings: list[Action]) -> bool:
    takers = [
        a
        for a in siblings
        if ActionKind(a.kind) in TAKER_KINDS
        and a.job_id == reservation.job_id
        and reservation.id in (a.depends_on or [])
    ]
    return bool(takers) and all(ActionState(a.state) in UNDONE_ACTION_STATES for a in takers)


def dependency_groups(actions: list[Action]) -> list[list[Action]]:
    """A plan's actions grouped by their dependencies, either way, transitively: each
    group stands or falls whole."""
    parent = {a.id: a.id for a in actions}

    def root(action_id: int | None) -> int | None:
        while parent[action_id] != action_id:
            parent[action_id] = parent[parent[action_id]]
            action_id = parent[action_id]
        return action_id

    for action in actions:
        for prerequisite in action.depends_on or []:
            if prerequisite in parent:
                parent[root(action.id)] = root(prerequisite)
    groups: dict[int | None, list[Action]] = {}
    for action in sorted(actions, key=lambda a: a.id or 0):
        groups.setdefault(root(action.id), []).append(action)
    return list(groups.values())


def _connected(action: Action, siblings: list[Action]) -> list[Action]:
    """The other actions of ``action``'s dependency group."""
    group = next(g for g in dependency_groups(siblings) if any(a.id == action.id for a in g))
    return [a for a in group if a.id != action.id]


def _give_back_reservation(
    session: Session, taker: Action, siblings: list[Action], now: datetime
) -> list[int]:
    """An approved ``unreserve`` for each reservation of the taker's job that succeeded."""
    held = [
        a
        for a in siblings
        if ActionKind(a.kind) is ActionKind.reserve
        and a.job_id == taker.job_id
        and ActionState(a.state) is ActionState.succeeded
    ]
    created: list[int] = []
    for reservation in held:
        key = f"{reservation.idempotency_key}:unreserve"[:128]
        if session.exec(select(Action.id).where(Action.idempotency_key == key)).first():
            continue
        give_back = Action(
            plan_id=taker.plan_id,
            cluster_id=taker.cluster_id,
            job_id=taker.job_id,
            kind=ActionKind.unreserve,
            state=ActionState.approved,
            idempotency_key=key,
            reason=f"plan {taker.plan_id}: give back the GPUs held by action "
            f"{reservation.id}: action {taker.id} ({taker.kind}) is {taker.state}",
            target_node=reservation.target_node,
            target_placement=dict(reservation.target_placement),
            created_at=now,
            updated_at=now,
            decided_by="shaper",
            decided_at=now,
        )
        session.add(give_back)
        session.flush()
        created.append(row_id(give_back))
    return created


def _with_followers(session: Session, action: Action) -> list[Action]:
    """``action``'s prerequisites (``_prerequisites``), and each proposed action of the same
    plan and job as one of them or ``action`` that depends on it, with its own
    prerequisites; ``action`` itself left out."""
    found = {row_id(p): p for p in _prerequisites(session, action)}
    todo = [action, *found.values()]
    while todo:
        leader = todo.pop()
        if leader.job_id is None or leader.plan_id is None:
            continue  # a node's or a job set's action: no job to follow
        # Locked and read again: one a cycle or another operator ended meanwhile is not
        # approved over its end.
        followers = session.exec(
            select(Action)
            .where(
                Action.plan_id == leader.plan_id,
                Action.job_id == leader.job_id,
                col(Action.state) == ActionState.proposed.value,
                Action.id != action.id,
            )
            .order_by(col(Action.id))
            .with_for_update()
            .execution_options(populate_existing=True)
        ).all()
        for locked in followers:
            if row_id(leader) not in (locked.depends_on or []) or row_id(locked) in found:
                continue
            if ActionState(locked.state) is not ActionState.proposed:
                continue
            found[row_id(locked)] = locked
            todo.append(locked)
            for prerequisite in _prerequisites(session, locked):
                if row_id(prerequisite) != action.id and row_id(prerequisite) not in found:
                    found[row_id(prerequisite)] = prerequisite
                    todo.append(prerequisite)
    return [found[i] for i in sorted(found)]


def _prerequisites(session: Session, action: Action) -> list[Action]:
    """Every action this one depends on, directly or through others."""
    found: dict[int, Action] = {}
    todo = list(action.depends_on or [])
    while todo:
        action_id = todo.pop()
        if action_id in found:
            continue
        prerequisite = session.exec(
            select(Action).where(Action.id == action_id).with_for_update()
        ).first()
        if prerequisite is None:
            continue
        found[action_id] = prerequisite
        todo.extend(prerequisite.depends_on or [])
    return [found[i] for i in sorted(found)]


def lock_plan_of(session: Session, action_id: int) -> None:
    """Lock the plan an action belongs to, if any: every path that locks a plan's actions
    locks the plan first (``lock_action``, ``decide_plan``, the cycle's review and
    withdrawal), so two of them never hold one action each while waiting for the
    other's. FOR NO KEY UPDATE (``key_share``): lockers still take turns, but a saga
    adding an action to the plan (``ended``'s give-back of a reservation), whose foreign
    key check takes a key-share lock on the plan row while it holds the plan's actions,
    is not blocked by it (that wait would close a cycle with ours). A plan's id on its
    action never changes, so it is read unlocked."""
    plan_id = session.exec(select(Action.plan_id).where(Action.id == action_id)).first()
    if plan_id is not None:
        session.exec(
            select(Plan.id).where(Plan.id == plan_id).with_for_update(key_share=True)
        ).first()


def lock_action(session: Session, action_id: int) -> Action:
    """The action, locked for this transaction (and read again) after its plan
    (``lock_plan_of``); NotFound if missing.

    The plan first also for a saga's step: the step that ends an action locks the plan's
    other actions (``ended``), while an operator approving a later action of the plan
    holds that one and locks its prerequisites — the action ending among them. Without
    the plan lock the two waited for each other."""
    lock_plan_of(session, action_id)
    action = session.exec(select(Action).where(Action.id == action_id).with_for_update()).first()
    return found(
        action, f"action {action_id} does not exist", resource="action", resource_id=action_id
    )


def _check_move(action: Action, to: ActionState) -> None:
    current = ActionState(action.state)
    if to not in TRANSITIONS[current]:
        why = f"; {action.error}" if action.error and current in TERMINAL_ACTION_STATES else ""
        raise Conflict(
            f"action {action.id} is {current.value}; it cannot become {to.value}{why}",
            resource="action",
            resource_id=action.id,
            details={"state": current.value},
        )


def _decide(action: Action, to: ActionState, by: str, now: datetime) -> None:
    action.state = to
    action.updated_at = now
    action.decided_by, action.decided_at = by, now


def _public(
    action: Action, cluster: str, job_external_id: str | None, target_cluster: str | None
) -> ActionPublic:
    return ActionPublic.model_validate(
        action,
        update={
            "cluster": cluster,
            "job_external_id": job_external_id,
            "target_cluster": target_cluster,
        },
    )


# Actions that ran on a job (reservations move no job); the dwell rule counts the same.
RAN = (ActionState.succeeded, ActionState.failed, ActionState.compensated)
NOT_ON_JOBS = (ActionKind.reserve, ActionKind.unreserve)
NEVER_RAN_WHEN_FAILED = (ActionKind.start, ActionKind.resume)


def churn(
    *, session: Session, cluster: str | None, window_s: float, dwell_s: float, now: datetime
) -> ChurnPublic:
    """Shaper's actions per job-hour over the last ``window_s``, and the jobs it acted on
    twice less than ``dwell_s`` apart (the dwell rule says none should be)."""
    since = now - timedelta(seconds=window_s)
    finished = sa.func.coalesce(Action.finished_at, Action.updated_at)
    query = (
        sa.select(finished, col(Job.external_id))
        .join(Cluster, col(Cluster.id) == Action.cluster_id)
        .join(Job, col(Job.id) == Action.job_id)
        .where(
            col(Action.state).in_([s.value for s in RAN]),
            col(Action.kind).not_in([k.value for k in NOT_ON_JOBS]),
            # A start that failed never ran the job: nothing happened to it.
            sa.not_(
                sa.and_(
                    col(Action.state) == ActionState.failed.value,
                    col(Action.kind).in_([k.value for k in NEVER_RAN_WHEN_FAILED]),
                )
            ),
            finished >= since,
        )
    )
    if cluster is not None:
        query = query.where(col(Cluster.name) == cluster)
    times: dict[str, list[datetime]] = {}
    total = 0
    for at, external_id in session.execute(query):
        times.setdefault(external_id, []).append(at)
        total += 1
    twice = sorted(
        job
        for job, at in times.items()
        if any((b - a).total_seconds() < dwell_s for a, b in pairwise(sorted(at)))
    )
    hours = _job_hours(session, cluster, since, now)
    return ChurnPublic(
        cluster=cluster,
        window_s=window_s,
        dwell_s=dwell_s,
        actions=total,
        job_hours=round(hours, 3),
        actions_per_job_hour=round(total / hours, 4) if hours > 0 else None,
        jobs_acted_on=len(times),
        jobs_acted_on_twice_within_dwell=len(twice),
        examples=twice[:10],
    )


def _job_hours(session: Session, cluster: str | None, since: datetime, now: datetime) -> float:
    """Hours jobs held GPUs in [since, now]: each job's allocation intervals, merged."""
    query = (
        sa.select(col(Allocation.job_id), col(Allocation.started_at), col(Allocation.released_at))
        .join(Job, col(Job.id) == Allocation.job_id)
        .join(Cluster, col(Cluster.id) == Job.cluster_id)
        .where(
            sa.or_(col(Allocation.released_at).is_(None), col(Allocation.released_at) > since),
            col(Allocation.started_at) < now,
        )
    )
    if cluster is not None:
        query = query.where(col(Cluster.name) == cluster)
    spans: dict[int, list[tuple[datetime, datetime]]] = {}
    for job_id, started, released in session.execute(query):
        start, end = max(started, since), min(released or now, now)
        if end > start:
            spans.setdefault(job_id, []).append((start, end))
    seconds = 0.0
    for intervals in spans.values():
        intervals.sort()
        current_start, current_end = intervals[0]
        for start, end in intervals[1:]:
            if start > current_end:
                seconds += (current_end - current_start).total_seconds()
                current_start, current_end = start, end
            else:
                current_end = max(current_end, end)
        seconds += (current_end - current_start).total_seconds()
    return seconds / 3600
