"""Plans' reservations of a cluster over a window: which free GPUs of which node a plan
held for a job, and when (``history`` counts them as the node's ``reserved_gpus``).

A plan holds GPUs with a ``reserve`` action (``app.shaping.cycle``: ahead of each move or
start, so that the native scheduler gives them to nobody else) whose ``target_placement``
says how many GPUs of which node. Only a reserve that succeeded held anything. It holds
them

* from when it took effect: the ``finished_at`` of its succeeded forward ``reserve``
  step, recorded when the connector answered that the scheduler holds them (the action's
  ``finished_at``, set in the same transaction, where the step row is missing; its
  created and decided times are before the scheduler did anything);

until the first of these, each per the connector contract
(``connectors.base.SupportsReservation``):

* the matching give-back took effect: the ``finished_at`` of the succeeded forward
  ``unreserve`` step (same fallback) of a succeeded ``unreserve`` of the same job, at or
  after it. An unreserve gives back everything held for the job, whichever plan asked;
* a later ``reserve`` of the same job took effect (it replaces the earlier one);
* on each node, the job started there: the ``started_at`` of its first allocation on
  that node at or after the reservation took effect (the scheduler spends it);
* the job ended (its ``end_time``, else its last update once it is finished);
* the action's plan ended otherwise: every action of the plan has ended, at the latest
  ``finished_at`` (else ``updated_at``) among them — the moment the plan was settled;
* its time to live ran out: ``RESERVATION_TTL_S`` after it took effect (the connector
  was told to let it lapse then).

The GPUs are counted while some other job still holds them (the plan reserves what its
moves will free); the classifier counts a node's reserved GPUs only up to its free ones.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from sqlmodel import Session, col

from app.actions.messages import RESERVATION_TTL_S
from app.actions.models import (
    TERMINAL_ACTION_STATES,
    Action,
    ActionKind,
    ActionState,
    ActionStep,
    StepState,
)
from app.jobs.models import Allocation, Job
from app.nodes.models import Node
from wire.steps import StepPhase
from wire.telemetry import TERMINAL_JOB_STATES


@dataclass(frozen=True, slots=True)
class Reserved:
    """``gpus`` of ``node`` held for a job of ``team`` over [start, end) (epoch seconds)."""

    node: str
    gpus: int
    team: str
    start: float
    end: float


@dataclass(frozen=True, slots=True)
class _Effect:
    plan_id: int | None
    job_id: int
    at: float
    placement: dict[str, int]


def reservations(
    session: Session, *, cluster_id: int, since: datetime, until: datetime
) -> list[Reserved]:
    """The plans' reservations of the cluster that overlap [since, until)."""
    since_s, until_s = since.timestamp(), until.timestamp()
    # One that took effect a time to live before the window had lapsed by then; what ends
    # one (a give-back, a new reservation) comes after it.
    earliest = since - timedelta(seconds=RESERVATION_TTL_S)
    reserves = _effects(session, cluster_id, ActionKind.reserve, earliest, until)
    current = [r for r in reserves if r.at + RESERVATION_TTL_S > since_s]
    if not current:
        return []
    jobs = sorted({r.job_id for r in current})
    unreserves = _effects(session, cluster_id, ActionKind.unreserve, earliest, until, jobs)
    given_back: defaultdict[int, list[float]] = defaultdict(list)
    for effect in unreserves:
        given_back[effect.job_id].append(effect.at)
    replaced: defaultdict[int, list[float]] = defaultdict(list)
    for effect in reserves:
        replaced[effect.job_id].append(effect.at)
    # A second early: the float round trip must not lose a start at the very moment.
    first = datetime.fromtimestamp(min(r.at for r in current), UTC) - timedelta(seconds=1)
    started = _starts(session, jobs, since=first, until=until)
    teams, job_ends = _jobs(session, jobs)
    plan_ends = _plan_ends(session, sorted({r.plan_id for r in current if r.plan_id}))

    found = []
    for effect in current:
        ends = [effect.at + RESERVATION_TTL_S, job_ends.get(effect.job_id, math.inf)]
        ends += [t for t in given_back[effect.job_id] if t >= effect.at]
        ends += [t for t in replaced[effect.job_id] if t > effect.at]
        if effect.plan_id is not None:
            ends.append(plan_ends.get(effect.plan_id, math.inf))
        end = min(ends)
        for node, gpus in effect.placement.items():
            consumed = [t for t in started.get((effect.job_id, node), ()) if t >= effect.at]
            node_end = min([end, *consumed])
            if gpus > 0 and node_end > max(effect.at, since_s) and effect.at < until_s:
                team = teams.get(effect.job_id, "-")
                found.append(Reserved(node, int(gpus), team, effect.at, node_end))
    return found


def _effects(
    session: Session,
    cluster_id: int,
    kind: ActionKind,
    since: datetime,
    until: datetime,
    job_ids: list[int] | None = None,
) -> list[_Effect]:
    """The cluster's succeeded actions of ``kind`` (reserve or unreserve) that took effect
    in [since, until), oldest first, with the moment they did."""
    took_effect = sa.func.coalesce(col(ActionStep.finished_at), col(Action.finished_at))
    query = (
        sa.select(
            col(Action.plan_id),
            col(Action.job_id),
            took_effect,
            col(Action.target_placement),
        )
        .select_from(Action)
        .outerjoin(
            ActionStep,
            sa.and_(
                col(ActionStep.action_id) == col(Action.id),
                col(ActionStep.phase) == StepPhase.forward.value,
                col(ActionStep.name) == kind.value,
                col(ActionStep.state) == StepState.succeeded.value,
            ),
        )
        .where(
            col(Action.cluster_id) == cluster_id,
            col(Action.kind) == kind.value,
            col(Action.state) == ActionState.succeeded.value,
            col(Action.job_id).is_not(None),
            took_effect >= since,
            took_effect < until,
        )
        .order_by(took_effect, col(Action.id))
    )
    if job_ids is not None:
        query = query.where(col(Action.job_id).in_(job_ids))
    return [
        _Effect(plan_id, job_id, _utc_seconds(at), dict(placement or {}))
        for plan_id, job_id, at, placement in session.execute(query)
        if at is not None
    ]


def _starts(
    session: Session, job_ids: list[int], *, since: datetime, until: datetime
) -> dict[tuple[int, str], list[float]]:
    """(job, node name) → when each of its allocations there started in [since, until)."""
    query = (
        sa.select(col(Allocation.job_id), col(Node.name), col(Allocation.started_at))
        .join(Node, col(Node.id) == col(Allocation.node_id))
        .where(
            col(Allocation.job_id).in_(job_ids),
            col(Allocation.started_at) >= since,
            col(Allocation.started_at) < until,
        )
    )
    starts: defaultdict[tuple[int, str], list[float]] = defaultdict(list)
    for job_id, node, started_at in session.execute(query):
        starts[(job_id, node)].append(started_at.timestamp())
    return starts


def _jobs(session: Session, job_ids: list[int]) -> tuple[dict[int, str], dict[int, float]]:
    """Each job's team, and when it ended (as ``history`` reads a job's end)."""
    query = sa.select(
        col(Job.id), col(Job.team), col(Job.end_time), col(Job.state), col(Job.updated_at)
    ).where(col(Job.id).in_(job_ids))
    teams, ends = {}, {}
    for job_id, team, end_time, state, updated_at in session.execute(query):
        teams[job_id] = team
        finished = end_time or (updated_at if state in TERMINAL_JOB_STATES else None)
        if finished is not None:
            ends[job_id] = finished.timestamp()
    return teams, ends


def _plan_ends(session: Session, plan_ids: list[int]) -> dict[int, float]:
    """Plans all of whose actions have ended, and when the last of them did."""
    if not plan_ids:
        return {}
    ended = sa.func.coalesce(col(Action.finished_at), col(Action.updated_at))
    open_states = [s.value for s in ActionState if s not in TERMINAL_ACTION_STATES]
    still_open = sa.func.sum(sa.case((col(Action.state).in_(open_states), 1), else_=0))
    query = (
        sa.select(col(Action.plan_id), sa.func.max(ended), still_open)
        .where(col(Action.plan_id).in_(plan_ids))
        .group_by(col(Action.plan_id))
    )
    return {
        plan_id: _utc_seconds(last)
        for plan_id, last, open_count in session.execute(query)
        if not open_count and last is not None
    }


def _utc_seconds(moment: datetime) -> float:
    """An aggregate's time; read as UTC should a backend hand it back naive."""
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()
