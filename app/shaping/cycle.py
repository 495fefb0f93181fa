"""The shaping cycle for one cluster, in numbered phases over an immutable snapshot.

1. **Snapshot** the cluster's nodes, open allocations, live jobs, demand history, SLA
   policy and what Shaper's actions are doing to each job (``snapshot.take_snapshot``),
   and **record** what the cycle forecasts, to be scored against what happens
   (``app.forecasts``): each service's demand in the next hour, once an hour, and each
   block job's run time, the first time it is predicted (the forecasts are the solve's
   own: the forecaster keeps them for it).
2. **Review** the open plans (proposed, or approved with actions still to run): actions
   that have not started and no longer apply expire with the reason
   (``app.shaping.review``); a plan whose actions have all ended is ``finished``.
3. **Keep or replace** an open proposal (advise mode): it is kept — same plan, same
   action ids — unless the cluster's mode or policy changed, or a fresh plan made on the
   current state is worth materially more: at least ``SUPERSEDE_GAIN`` (5 %) and
   ``SUPERSEDE_MIN_UNITS`` above the proposal in the solver's objective, both evaluated on
   the same instance. A kept proposal only has its ``checked_at`` updated.
4. **Instance** (``snapshot.to_instance``): jobs that an open plan acts on are locked, and
   the solver's dwell rule keeps jobs Shaper acted on recently as they are.
5. **Solve** with the cluster's policy and **validate** the plan; an invalid plan is
   stored with its violations and produces no action.
6. **Dependencies** (``solver.dependencies``): a start or move that takes GPUs another
   action frees waits for it. Each group of connected actions stands or falls whole: it
   is deferred when its actions need each other in a cycle or when it touches a node an
   unfinished plan is still working on. On clusters whose scheduler honours reservations,
   every move and every start — and a service's growth, where Shaper places replicas —
   gets a ``reserve`` action first (what frees GPUs for it waits for that too), so nothing
   else can take the GPUs in between — not even free ones, which the native scheduler
   would otherwise keep handing to its own queue.
7. **Persist** the plan with a reason for every decision (each action's names its plan
   and, for what frees GPUs, the jobs it frees them for) and its actions: ``proposed`` in
   advise mode, ``approved`` by ``shaper`` in enforce mode, none in observe mode.
8. **Dispatch** of approved actions whose prerequisites have succeeded is the saga
   runner's job (``app.actions.saga``), kicked by the task that runs the cycle.

A member of a federation group solved once (``Settings.federation_solve_once``;
``app.shaping.tasks``) runs phases 1-2 (:func:`prepare_cycle`), then, once the group is
solved, phase 3 and 6-7 with its slice of the group's plan (:func:`finish_cycle`): the same
review, keep-or-replace, deferral and persistence, with no solve of its own; the plan's
summary names the group (``FEDERATION_GROUP_KEY``).

Transactions: nothing is open while the solver runs, on either backend. On SQLite a
write transaction holds the one write lock, so the cycle never writes where it reads at
length (``app.core.db``): the snapshot and the open plans are read in a read transaction
(DEFERRED), which ends; the review's expiries are written in a short write transaction
(IMMEDIATE) that reads again, under the lock, what it changes; the solve runs with no
transaction; the comparison with a proposal reads in a read transaction; withdrawing a
proposal, keeping it, and persisting the plan are each one short write transaction that
checks again under the lock what may have changed meanwhile (an operator's decision on
the proposal, the nodes other plans still work on; for a federation group's slice, what
its ``Solved.recheck`` checks: a move approved meanwhile, the cluster leaving the group).
Recording the forecasts reads what is recorded already in a read transaction and, only
when something is missing (once an hour for the services), writes it in one short write
transaction; a failure there is logged and the cycle goes on. The snapshot's rows are detached
from the session, so no later commit expires them and the solve never loads from the
database.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlmodel import Session, col, select

from app.actions import service as action_service
from app.actions.models import TERMINAL_ACTION_STATES, Action, ActionKind, ActionState
from app.actions.schedulers import places_itself, reserves
from app.clusters.models import ShapingMode
from app.core.db import begin
from app.core.lookup import row_id
from app.forecasts import service as forecast_service
from app.jobs.models import Allocation, Job
from app.plans import placement as plan_placement
from app.plans.models import OPEN_PLAN_STATES, Plan, PlanState
from app.shaping.review import review_plan
from app.shaping.snapshot import (
    MIN_DURATION_HISTORY,
    ClusterSnapshot,
    runtime_predictions,
    service_forecasts,
    solver_job_id,
    solver_node_name,
    take_snapshot,
    to_instance,
)
from solver import Instance, SolverConfig, validate
from solver import plan as sp
from solver.dependencies import (
    ActionGraph,
    action_graph,
    split_replica_moves,
    unsplit_replica_moves,
)
from solver.objective import evaluate
from solver.policies import get_policy
from wire.telemetry import JobShape

log = logging.getLogger(__name__)
SHAPER = "shaper"
# A fresh plan replaces an open proposal only when it is worth this much more (relative,
# and in objective units: one priority-weighted reference GPU-hour), so solver noise and
# small gains never churn what an operator is looking at.
SUPERSEDE_GAIN = 0.05
SUPERSEDE_MIN_UNITS = 1.0
TAKES = (ActionKind.start, ActionKind.migrate)
# A plan's summary key naming the federation group whose one solve the plan is a slice of
# (``Solved.group``); absent from a plan of the cluster's own solve.
FEDERATION_GROUP_KEY = "federation_group"
# The one place a plan's action (``solver.plan.ActionKind``) becomes an action row's kind:
# the control plane's ``ActionKind`` is the solver's five and its own saga kinds (reserve,
# unreserve, resume), which the solver, importing nothing of ``app``, cannot know.
ACTION_KINDS: Mapping[sp.ActionKind, ActionKind] = {
    sp.ActionKind.start: ActionKind.start,
    sp.ActionKind.migrate: ActionKind.migrate,
    sp.ActionKind.resize: ActionKind.resize,
    sp.ActionKind.preempt: ActionKind.preempt,
    sp.ActionKind.requeue: ActionKind.requeue,
}


@dataclass(frozen=True)
class CycleResult:
    plan_id: int
    actions: int
    violations: int
    status: str
    kept: bool = False
    expired: int = 0


@dataclass(frozen=True)
class Solved:
    """A plan for one cluster and what it was made from: its own solve (phases 4-5), or its
    slice of its federation group's one solve (``app.federation.planning.member_plan``).

    ``held``: actions (by index) left out of this plan, with why, on top of those phase 6
    defers; ``notes``: decisions about the cluster's jobs that another cluster carries out
    (a federation group's moves), shown with the plan's; ``group``: the federation group
    whose solve this is a slice of, None for the cluster's own; ``recheck``: run in the
    write transaction that persists the plan, for what changed since it was made
    elsewhere: more actions to hold (by index) with why, or ``Withdrawn`` when the plan no
    longer applies at all (nothing is persisted)."""

    snapshot: ClusterSnapshot
    instance: Instance
    plan: sp.Plan
    violations: list[str]
    policy: str
    held: Mapping[int, str] = field(default_factory=dict)
    notes: list[dict[str, Any]] = field(default_factory=list)
    group: str | None = None
    recheck: Callable[[Session], Mapping[int, str]] | None = None


class Withdrawn(Exception):
    """A plan made elsewhere no longer applies as a whole (its cluster left the federation
    group while the group was solved): nothing of it was persisted."""


@dataclass(frozen=True)
class Prepared:
    """Phases 1-2 of a cycle done: what it read, and how many actions its review expired."""

    cluster: str
    now: datetime
    snapshot: ClusterSnapshot
    open_plans: list[tuple[Plan, list[Action]]]
    expired: int


def run_cycle(
    *,
    session: Session,
    cluster_name: str,
    now: datetime,
    policy: str | None = None,
    config: SolverConfig | None = None,
) -> CycleResult:
    # What the cycle read stays loaded across its own commits: an expired object would
    # load again on first use, opening a transaction where none may be open.
    expire_on_commit, session.expire_on_commit = session.expire_on_commit, False
    try:
        prepared = _prepare(session, cluster_name, now)
        return _decide(session, prepared, *_own_solve(session, prepared, policy, config))
    finally:
        session.expire_on_commit = expire_on_commit


def prepare_cycle(*, session: Session, cluster_name: str, now: datetime) -> Prepared:
    """Phases 1-2 of a cluster's cycle (snapshot, forecasts, review), for a plan that comes
    from elsewhere: its federation group's one solve, made once every member's review is
    done. :func:`finish_cycle` does the rest with it."""
    expire_on_commit, session.expire_on_commit = session.expire_on_commit, False
    try:
        return _prepare(session, cluster_name, now)
    finally:
        session.expire_on_commit = expire_on_commit


def finish_cycle(
    *,
    session: Session,
    prepared: Prepared,
    solved: Solved | None,
    config: SolverConfig | None = None,
) -> CycleResult:
    """Phases 3-7 of a cluster's cycle after :func:`prepare_cycle`. ``solved``: a plan made
    already, on a snapshot read after ``prepared``'s review (its federation group's, sliced):
    an open proposal is kept unless it is materially better, else it is persisted as it
    is; None: the cluster's own solve, as :func:`run_cycle` makes it (with ``config``)."""
    expire_on_commit, session.expire_on_commit = session.expire_on_commit, False
    try:
        if solved is None:
            return _decide(session, prepared, *_own_solve(session, prepared, None, config))
        return _decide(session, prepared, solved.policy, lambda *_: solved, again=False)
    finally:
        session.expire_on_commit = expire_on_commit


def _own_solve(
    session: Session, prepared: Prepared, policy: str | None, config: SolverConfig | None
) -> tuple[str, Callable[[ClusterSnapshot, bool], Solved]]:
    """The policy a cluster's own cycle plans with, and its solve."""
    policy_name = policy or prepared.snapshot.policy

    def solve(snapshot: ClusterSnapshot, lock_proposed: bool) -> Solved:
        if session.in_transaction():  # only ever a read: end it rather than hold it
            session.commit()
        return _solve(snapshot, policy_name, config, lock_proposed=lock_proposed)

    return policy_name, solve


def _prepare(session: Session, cluster_name: str, now: datetime) -> Prepared:
    snapshot, open_plans = _read(session, cluster_name, now)  # 1
    _record_forecasts(session, snapshot, now)
    expired = _review(session, snapshot, open_plans, now)  # 2
    return Prepared(cluster_name, now, snapshot, open_plans, expired)


def _decide(
    session: Session,
    prepared: Prepared,
    policy_name: str,
    solve: Callable[[ClusterSnapshot, bool], Solved],
    again: bool = True,
) -> CycleResult:
    """Phases 3-7. ``solve(snapshot, lock_proposed)``: the fresh plan; ``again``: whether
    to read and solve again once something was withdrawn (a plan made elsewhere, on a
    snapshot read after the review, is used as it is)."""
    snapshot, open_plans, expired, now = (
        prepared.snapshot,
        prepared.open_plans,
        prepared.expired,
        prepared.now,
    )
    changed = bool(expired)
    fresh: Solved | None = None
    proposal = next((p for p, a in open_plans if _undecided(a)), None)
    if proposal is not None:  # 3
        actions = {p.id: a for p, a in open_plans}[proposal.id]
        stale = _stale_because(snapshot, proposal, policy_name)
        if stale is None:
            fresh = solve(snapshot, False)
            stale = _materially_better(session, fresh, actions)
            if stale is None:
                return _keep(session, proposal, now, expired)
            state = PlanState.superseded
        else:
            state = PlanState.expired
        if not _close(session, proposal, state, stale, now):
            # An operator decided part of it meanwhile: it stands.
            return _keep(session, proposal, now, expired)
        changed = True
    if fresh is None or (changed and again):
        if changed and again:  # jobs of what was withdrawn are free to plan again
            snapshot, _ = _read(session, prepared.cluster, now)
        fresh = solve(snapshot, True)  # 4-5
    result = _persist(session, fresh, now)  # 6-7
    return CycleResult(**{**result.__dict__, "expired": expired})


def _read(
    session: Session, cluster_name: str, now: datetime
) -> tuple[ClusterSnapshot, list[tuple[Plan, list[Action]]]]:
    """The snapshot and the open plans, read in one read transaction that then ends. The
    snapshot's rows are detached: they stay as read, whatever the session does next."""
    begin(session, writes=False)
    snapshot = take_snapshot(session=session, cluster_name=cluster_name, now=now)
    open_plans = _open_plans(session, snapshot.cluster_id)
    for row in (*snapshot.nodes, *snapshot.gpu_models):
        session.expunge(row)
    session.commit()
    return snapshot, open_plans


def _record_forecasts(session: Session, snapshot: ClusterSnapshot, now: datetime) -> None:
    """What this cycle forecasts that is not recorded yet (``app.forecasts.service``). The
    forecasts are computed only for what is missing, and never stop the cycle: what a
    failure here left unrecorded, the next cycle records (within the same hour)."""
    services = [r.id for r in snapshot.jobs if r.shape == JobShape.elastic and r.demand_history]
    predicting = len(snapshot.finished) >= MIN_DURATION_HISTORY
    jobs = [r.id for r in snapshot.jobs if r.shape != JobShape.elastic] if predicting else []
    if not services and not jobs:
        return
    try:
        begin(session, writes=False)
        due = forecast_service.due(
            session=session, cluster_id=snapshot.cluster_id, services=services, jobs=jobs, now=now
        )
        session.commit()
        if not due:
            return
        forecasts = service_forecasts(snapshot, job_ids=set(due.services)) if due.services else []
        predictions = runtime_predictions(snapshot, job_ids=set(due.jobs)) if due.jobs else []
        if not forecasts and not predictions:
            return
        begin(session, writes=True)
        forecast_service.record(
            session=session,
            cluster_id=snapshot.cluster_id,
            now=now,
            forecasts=forecasts,
            predictions=predictions,
        )
    except Exception:  # the plan matters more than its forecasts' record
        session.rollback()
        log.exception("cluster %s: recording the cycle's forecasts failed", snapshot.cluster)


def _solve(
    snapshot: ClusterSnapshot,
    policy_name: str,
    config: SolverConfig | None,
    *,
    lock_proposed: bool,
) -> Solved:
    """The plan and its violations (the caller has ended its transaction: none is open
    however long the solve takes)."""
    instance = to_instance(snapshot, config=config, lock_proposed=lock_proposed)
    plan = get_policy(policy_name).plan(instance)
    violations = [str(v) for v in validate(instance, plan)]
    # Checked as the solver made it; carried out as a scheduler can (the replicas a
    # service moves come back once the work they made room for runs), and a move that
    # would stop a service meanwhile deferred with what depends on it.
    plan = split_replica_moves(instance, plan)
    held = unsplit_replica_moves(instance, plan)
    return Solved(snapshot, instance, plan, violations, policy_name, held=held)


# -- open plans ------------------------------------------------------------------------


def _open_plans(session: Session, cluster_id: int) -> list[tuple[Plan, list[Action]]]:
    plans = session.exec(
        select(Plan)
        .where(Plan.cluster_id == cluster_id, col(Plan.state).in_(list(OPEN_PLAN_STATES)))
        .order_by(col(Plan.id))
    ).all()
    found = []
    for plan in plans:
        actions = list(
            session.exec(select(Action).where(Action.plan_id == plan.id).order_by(col(Action.id)))
        )
        found.append((plan, actions))
    return found


def _undecided(actions: list[Action]) -> bool:
    """A proposal nobody has decided on yet: every live action still proposed. (A plan an
    operator approved in part goes on; its remaining proposals stay until they expire.)"""
    live = [a for a in actions if ActionState(a.state) not in TERMINAL_ACTION_STATES]
    return bool(live) and all(ActionState(a.state) == ActionState.proposed for a in live)


def _review(
    session: Session,
    snapshot: ClusterSnapshot,
    open_plans: list[tuple[Plan, list[Action]]],
    now: datetime,
) -> int:
    """Expire what no longer applies and settle plans that are done, in one short write
    transaction: every plan and action is read again under the write lock first, so what
    a worker or an operator did since the snapshot counts."""
    back = _back(snapshot)
    if not open_plans and not back:
        return 0
    begin(session, writes=True)
    expired = 0
    for plan, actions in open_plans:
        # The plan locked before its actions, as an operator's decision locks it
        # (``action_service.transition``): expiring actions and then settling the plan,
        # action rows first, could deadlock with one.
        session.exec(
            select(Plan)
            .where(Plan.id == plan.id)
            .with_for_update(key_share=True)
            .execution_options(populate_existing=True)
        ).one()
        for action in actions:
            session.refresh(action)
        review = review_plan(snapshot, actions, job_names=_job_names(session, snapshot, actions))
        # The failing actions first, each with its own reason: the rest of its dependency
        # group then falls naming it (``action_service.ended``), instead of a pending
        # job's start reading as if its own job had ended.
        for action_id, why in [*review.failing.items(), *review.expired.items()]:
            if action_service.end_unstarted(
                session=session,
                action_id=action_id,
                error=f"expired: {why}",
                by=SHAPER,
                now=now,
            ):
                expired += 1
        for action in actions:
            session.refresh(action)
        _settle(plan, actions, now, next(iter(review.failing.values()), None))
        session.add(plan)
    _clear_displaced(session, back)
    session.commit()
    return expired


def _job_names(
    session: Session, snapshot: ClusterSnapshot, actions: list[Action]
) -> dict[int, str]:
    """The external id of each job the actions act on that the snapshot no longer holds
    (it holds live jobs only): the review names them in its reasons."""
    live = snapshot.job_by_id
    ids = {a.job_id for a in actions if a.job_id is not None and a.job_id not in live}
    if not ids:
        return {}
    rows = session.exec(select(Job.id, Job.external_id).where(col(Job.id).in_(sorted(ids))))
    return {job_id: external_id for job_id, external_id in rows if job_id is not None}


def _back(snapshot: ClusterSnapshot) -> list[int]:
    """Displaced jobs that the snapshot shows running again."""
    return [row.id for row in snapshot.jobs if row.displaced and row.placement]


def _clear_displaced(session: Session, back: list[int]) -> None:
    """A displaced job that runs again is no longer displaced: checked again under the
    write lock (it holds GPUs now), since a job can be displaced anew after the snapshot.
    The jobs' rows are locked first (after the plans, as a saga locks its plan, its
    action, then its job) and their GPUs read after: a saga that displaced one meanwhile
    (its GPUs released with it) has committed by then, so the job is left displaced.
    FOR NO KEY UPDATE, SKIP LOCKED: a job another transaction holds (an ingest updating it,
    a saga) is left for the next cycle rather than waited for — clearing is idempotent,
    and waiting could close a cycle with an ingest that locks jobs in its push's order and
    checks its allocations' and samples' foreign keys against them."""
    if not back:
        return
    locked = session.exec(
        select(Job.id)
        .where(col(Job.id).in_(back))
        .order_by(col(Job.id))
        .with_for_update(key_share=True, skip_locked=True)
    ).all()
    running = select(Allocation.job_id).where(col(Allocation.released_at).is_(None))
    query = select(Job).where(col(Job.id).in_(locked), col(Job.id).in_(running))
    for job in session.exec(query.execution_options(populate_existing=True)):
        job.displaced_at, job.displaced_reason = None, None
        session.add(job)


def _settle(plan: Plan, actions: list[Action], now: datetime, why: str | None) -> None:
    """A plan whose actions have all ended is finished (expired when none of them ran)."""
    states = {ActionState(a.state) for a in actions}
    if not states <= TERMINAL_ACTION_STATES:
        return
    ran = states & {ActionState.succeeded, ActionState.failed, ActionState.compensated}
    if ran or plan.state == PlanState.approved or not actions:
        plan.state = PlanState.finished
    elif ActionState.rejected in states:
        plan.state = PlanState.rejected
    else:
        plan.state = PlanState.expired
        plan.state_reason = (why or plan.state_reason or "its actions no longer apply")[:1024]


def _keep(session: Session, plan: Plan, now: datetime, expired: int) -> CycleResult:
    begin(session, writes=True)
    plan.checked_at = now
    session.add(plan)
    session.commit()
    begin(session, writes=False)
    proposed = session.exec(
        select(Action.id).where(Action.plan_id == plan.id, Action.state == ActionState.proposed)
    ).all()
    session.commit()
    return CycleResult(
        plan_id=row_id(plan),
        actions=len(proposed),
        violations=0,
        status=plan.status,
        kept=True,
        expired=expired,
    )


def _stale_because(snapshot: ClusterSnapshot, plan: Plan, policy_name: str) -> str | None:
    if snapshot.mode != plan.mode:
        return f"the cluster's mode changed from {plan.mode} to {snapshot.mode}"
    if policy_name != plan.policy:
        return f"the cluster's policy changed from {plan.policy} to {policy_name}"
    return None


def _materially_better(session: Session, solved: Solved, actions: list[Action]) -> str | None:
    """Why a fresh plan should replace the proposal, or None to keep the proposal. Both are
    valued on the same instance, the fresh one without the groups it would defer."""
    snapshot, instance, fresh = solved.snapshot, solved.instance, solved.plan
    if not fresh.actions or not instance.jobs:
        return None
    current = {job.id: dict(job.placement) for job in instance.jobs}
    graph = action_graph(instance, fresh)
    begin(session, writes=False)
    footprint = _footprint(session, snapshot.cluster_id)
    session.commit()
    deferred = {**solved.held, **_deferred(instance, fresh, graph, footprint)}
    fresh_target = dict(current)
    for index, move in enumerate(fresh.actions):
        if index not in deferred:
            fresh_target[move.job_id] = dict(move.to_placement)
    kept_target = dict(current)
    external = {row.id: row.external_id for row in snapshot.jobs}
    for action in actions:
        if ActionKind(action.kind) in (ActionKind.reserve, ActionKind.unreserve):
            continue
        if ActionState(action.state) != ActionState.proposed or action.job_id not in external:
            continue
        job_id = solver_job_id(snapshot.cluster, external[action.job_id])
        kept_target[job_id] = {
            solver_node_name(snapshot.cluster, node): gpus
            for node, gpus in action.target_placement.items()
            if gpus > 0
        }
    kept = evaluate(instance, kept_target).objective
    better = evaluate(instance, fresh_target).objective
    margin = max(SUPERSEDE_GAIN * abs(kept), SUPERSEDE_MIN_UNITS)
    if better - kept < margin:
        return None
    return f"a fresh plan is worth {better:.4g} against {kept:.4g} for this one (objective units)"


def _close(session: Session, plan: Plan, state: PlanState, why: str, now: datetime) -> bool:
    """Withdraw an undecided proposal whole; False (and nothing changed) when an operator
    decided any of it meanwhile."""
    begin(session, writes=True)
    locked = session.exec(
        select(Plan)
        .where(Plan.id == plan.id)
        .with_for_update(key_share=True)  # FOR NO KEY UPDATE: see action_service.lock_plan_of
        .execution_options(populate_existing=True)
    ).one()
    actions = list(
        session.exec(
            select(Action)
            .where(Action.plan_id == plan.id)
            .order_by(col(Action.id))
            .with_for_update()
            .execution_options(populate_existing=True)
        )
    )
    if locked.state != PlanState.proposed or not _undecided(actions):
        session.rollback()
        return False
    word = "superseded" if state is PlanState.superseded else "expired"
    for action in actions:
        if ActionState(action.state) == ActionState.proposed:
            action_service.end_unstarted(
                session=session,
                action_id=row_id(action),
                error=f"{word}: {why}",
                by=SHAPER,
                now=now,
            )
    locked.state = state
    locked.state_reason = why[:1024]
    session.add(locked)
    session.commit()
    return True


# -- persisting a new plan -------------------------------------------------------------


def _local(name: str) -> str:
    return name.split("/", 1)[1]


def _nodes(placement: dict[str, int]) -> str | None:
    return ",".join(sorted(_local(n) for n in placement)) or None


def _local_placement(placement: dict[str, int]) -> dict[str, int]:
    return {_local(node): gpus for node, gpus in sorted(placement.items())}


def _footprint(session: Session, cluster_id: int) -> dict[str, int]:
    """Nodes that unfinished actions of earlier plans still work on -> their plan id."""
    rows = session.exec(
        select(Action).where(
            Action.cluster_id == cluster_id,
            col(Action.state).not_in([s.value for s in TERMINAL_ACTION_STATES]),
        )
    ).all()
    nodes: dict[str, int] = {}
    for action in rows:
        for node in (*action.source_placement, *action.target_placement):
            nodes.setdefault(node, action.plan_id or 0)
    return nodes


def _deferred(
    instance: Instance, plan: sp.Plan, graph: ActionGraph, footprint: dict[str, int]
) -> dict[int, str]:
    """Actions left out of this plan (by index), with why: whole dependency groups."""
    left_out: dict[int, str] = {}
    for group in graph.components():
        why = None
        if group & graph.cyclic:
            why = "its actions need each other's GPUs in a cycle"
        else:
            for index in sorted(group):
                action = plan.actions[index]
                busy = [
                    _local(n)
                    for n in (*action.from_placement, *action.to_placement)
                    if _local(n) in footprint
                ]
                if busy:
                    why = f"node {busy[0]} is still worked on by plan {footprint[busy[0]]}"
                    break
        if why is not None:
            left_out.update(dict.fromkeys(group, why))
    return left_out


def _decisions(plan: sp.Plan, deferred: dict[int, str]) -> list[dict[str, Any]]:
    return [
        {
            "job": _local(a.job_id),
            "action": "deferred" if i in deferred else a.kind.value,
            "from": _nodes(a.from_placement),
            "to": _nodes(a.to_placement),
            "replicas": a.replicas,
            "reason": a.reason.code.value,
            "message": a.reason.message + (f" (deferred: {deferred[i]})" if i in deferred else ""),
        }
        for i, a in enumerate(plan.actions)
    ] + [
        {
            "job": _local(job_id),
            "action": "wait",
            "reason": reason.code.value,
            "message": reason.message,
        }
        for job_id, reason in sorted(plan.pending.items())
    ]


def _persist(session: Session, solved: Solved, now: datetime) -> CycleResult:
    """One short write transaction; the nodes other plans work on are read under its lock."""
    snapshot, instance, plan, violations = (
        solved.snapshot,
        solved.instance,
        solved.plan,
        solved.violations,
    )
    graph = action_graph(instance, plan)
    acting = not violations and snapshot.mode != ShapingMode.observe
    begin(session, writes=True)
    held = dict(solved.held)
    if solved.recheck is not None:
        try:
            for index, why in solved.recheck(session).items():
                held.setdefault(index, why)
        except Withdrawn:
            session.rollback()
            raise
    deferred = {
        **held,
        **_deferred(instance, plan, graph, _footprint(session, snapshot.cluster_id)),
    }
    stats = plan.stats
    summary: dict[str, Any] = {
        "jobs": len(instance.jobs),
        "nodes": len(instance.nodes),
        "gpus": sum(n.gpus for n in instance.nodes),
        "note": stats.note,
        "violations": violations,
        "deferred": len(deferred),
        plan_placement.SUMMARY_KEY: plan_placement.record(instance, plan, deferred),
    }
    if solved.group is not None:
        summary[FEDERATION_GROUP_KEY] = solved.group
    row = Plan(
        cluster_id=snapshot.cluster_id,
        created_at=now,
        policy=solved.policy,
        engine=stats.engine,
        mode=snapshot.mode,
        status="invalid" if violations else stats.status.value,
        objective=stats.objective,
        best_bound=stats.best_bound,
        gap=stats.gap,
        wall_time_s=stats.wall_time_s,
        decisions=_decisions(plan, deferred) + solved.notes,
        summary=summary,
        checked_at=now,
    )
    session.add(row)
    session.flush()
    created = 0
    if acting:
        created = _add_actions(session, snapshot, row, plan, graph, set(deferred), now)
    enforce = snapshot.mode == ShapingMode.enforce
    if created:
        row.state = PlanState.approved if enforce else PlanState.proposed
        if enforce:
            row.decided_by, row.decided_at = SHAPER, now
    session.add(row)
    session.commit()
    return CycleResult(
        plan_id=row_id(row),
        actions=created,
        violations=len(violations),
        status=row.status,
    )


def _add_actions(
    session: Session,
    snapshot: ClusterSnapshot,
    row: Plan,
    plan: sp.Plan,
    graph: ActionGraph,
    deferred: set[int],
    now: datetime,
) -> int:
    enforce = snapshot.mode == ShapingMode.enforce
    external = {r.external_id: r for r in snapshot.jobs}
    reserving = reserves(snapshot.scheduler)

    def new(kind: ActionKind, job_external_id: str, key: str, **fields: Any) -> Action:
        job = external.get(job_external_id)
        action = Action(
            plan_id=row.id,
            cluster_id=snapshot.cluster_id,
            job_id=job.id if job is not None else None,
            kind=kind,
            state=ActionState.approved if enforce else ActionState.proposed,
            idempotency_key=f"{snapshot.cluster}:{row.id}:{job_external_id}:{key}",
            created_at=now,
            updated_at=now,
            decided_by=SHAPER if enforce else None,
            decided_at=now if enforce else None,
            **fields,
        )
        session.add(action)
        return action

    rows: dict[int, Action] = {}
    holds: dict[int, Action] = {}
    seen: dict[tuple[str, ActionKind], int] = {}
    for index, action in enumerate(plan.actions):
        if index in deferred:
            continue
        job = _local(action.job_id)
        kind = ACTION_KINDS[action.kind]
        # A job's second action of a kind (a moved service's growth back) has a key of its own.
        nth = seen[job, kind] = seen.get((job, kind), 0) + 1
        rows[index] = new(
            kind,
            job,
            kind.value if nth == 1 else f"{kind.value}:{nth}",
            source_node=_nodes(action.from_placement),
            target_node=_nodes(action.to_placement),
            source_placement=_local_placement(action.from_placement),
            target_placement=_local_placement(action.to_placement),
            target_replicas=action.replicas,
        )
        # Every move and start holds its GPUs first: the native scheduler keeps placing
        # its own queue meanwhile, free GPUs included. So does a service's growth where
        # Shaper places its replicas (not where the scheduler owns placement: Slurm).
        row_job = external.get(job)
        training = row_job is not None and row_job.shape == JobShape.block
        taken = _taken(
            kind, action.from_placement, action.to_placement, snapshot.scheduler, training
        )
        if reserving and taken:
            held = seen[job, ActionKind.reserve] = seen.get((job, ActionKind.reserve), 0) + 1
            holds[index] = new(
                ActionKind.reserve,
                job,
                "reserve" if held == 1 else f"reserve:{held}",
                target_node=_nodes(taken),
                target_placement=_local_placement(taken),
            )
    session.flush()
    for index, action_row in rows.items():
        prerequisites = {rows[p].id for p in graph.depends_on[index] if p in rows}
        hold = holds.get(index)
        if hold is not None:
            prerequisites.add(hold.id)
        # What frees GPUs for a job waits for that job's reservation to be in place.
        prerequisites |= {holds[t].id for t in graph.serves[index] if t in holds}
        action_row.depends_on = sorted(p for p in prerequisites if p is not None)
        action_row.reason = _reason(row_id(row), plan, graph, index, rows)
        session.add(action_row)
    for index, hold in holds.items():
        served = rows[index]
        hold.counts_on = sorted(
            {_local(plan.actions[p].job_id) for p in graph.depends_on[index] if p in rows}
            | {_local(plan.actions[index].job_id)}
        )
        gpus = sum(hold.target_placement.values())
        hold.reason = (
            f"plan {row.id}: hold {gpus} GPUs on {hold.target_node} for job "
            f"{_local(plan.actions[index].job_id)} until its {served.kind} (action {served.id}) "
            "takes them"
        )
        session.add(hold)
    return len(rows) + len(holds)


def _taken(
    kind: ActionKind,
    before: dict[str, int],
    after: dict[str, int],
    scheduler: str,
    training: bool = False,
) -> dict[str, int]:
    """The GPUs an action takes that a reservation should hold for it: all of a move's or
    a start's target, what a service's growth adds on each node, and where the scheduler
    places jobs itself (Slurm), all of the target of a resize onto nodes the job does not
    hold (an elastic training job restarted there gives its own nodes back to the queue
    while it restarts)."""
    if kind in TAKES:
        return after
    if kind is ActionKind.resize and not places_itself(scheduler):
        return {n: g - before.get(n, 0) for n, g in after.items() if g > before.get(n, 0)}
    if kind is ActionKind.resize and training and before and not set(after) <= set(before):
        return after
    return {}


def _reason(
    plan_id: int, plan: sp.Plan, graph: ActionGraph, index: int, rows: dict[int, Action]
) -> str:
    action = plan.actions[index]
    text = f"plan {plan_id}: {action.reason.code.value}: {action.reason.message}"
    served = [
        f"{_local(plan.actions[i].job_id)} ({plan.actions[i].kind.value}, action {rows[i].id})"
        for i in graph.serves[index]
        if i in rows
    ]
    if served:
        text += f"; frees GPUs for {', '.join(served)}"
    return text[:2048]
