"""What changes in a federation group while it is solved once, and what the solve's plans
do about it (``Settings.federation_solve_once``; ``app.shaping.tasks``).

The group's one solve reads its members and runs with nothing held; its moves and its
members' slices are persisted after, each in a short write transaction. Meanwhile:

* an operator may approve a move the solve did not see approved (a move proposed by an
  earlier plan: the solve plans its job afresh, ``lock_proposed=False``). The move will
  run, so a slice's action that acts on the moved job at home is held with its dependency
  group, naming the move (``held``). What the solve read approved (``active_moves``, read
  before the snapshots) locked its job.
* a slice's action that takes GPUs on a node that a move the solve does not make goes to
  (approved meanwhile, or under way since before: the target member's instance does not
  count a job that has not arrived) is held too when the node has too few GPUs for both,
  and so is a new move of the group onto such a node (``app.federation.moves``).
* a member may leave the group: its slice is not persisted as the group's decision
  (``left_group``: ``app.shaping.cycle.Withdrawn``; the task plans it alone), and no move
  of the group's goes to or from it.

And between periods: a move that failed, was compensated or that an operator rejected
(``set_back``) is not planned again to the same cluster for ``RETRY_AFTER``. Planned
apart, a member's own solve starts such a job at home meanwhile; planned once, the group's
solve would move it again every period and its home plan would never start it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlmodel import Session, col, select

from app.actions.models import ACTIVE_ACTION_STATES, Action, ActionKind, ActionState, node_names
from app.clusters.models import Cluster
from app.federation.models import FederationGroup
from app.jobs.models import Job
from solver import Instance
from solver.dependencies import action_graph
from solver.plan import ActionKind as PlanKind
from solver.plan import Plan

# A move that failed or was rejected is not planned again to the same cluster for this long.
RETRY_AFTER = timedelta(hours=1)
SET_BACK = (ActionState.failed, ActionState.compensated, ActionState.rejected)
# What the solve makes: (from cluster, job, to cluster, source node: None for a pending job)
Planned = tuple[str, str, str, str | None]


@dataclass(frozen=True)
class Approved:
    """A move approved or under way that the solve does not make; ``seen``: the solve read
    it approved already (its job was locked), else it was approved while the group was
    solved."""

    action_id: int
    job: str
    from_cluster: str
    to_cluster: str
    nodes: tuple[str, ...]
    seen: bool
    gpus: int

    def text(self) -> str:
        return (
            f"job {self.job}'s move from {self.from_cluster} to {self.to_cluster} (action "
            f"{self.action_id}) "
            + ("is under way" if self.seen else "was approved while the group was solved")
        )


def _moves_of(cluster_ids: Collection[int]) -> sa.ColumnElement[bool]:
    ids = list(cluster_ids)
    return sa.and_(
        col(Action.kind) == ActionKind.move.value,
        col(Action.state).in_([s.value for s in ACTIVE_ACTION_STATES]),
        sa.or_(col(Action.cluster_id).in_(ids), col(Action.target_cluster_id).in_(ids)),
    )


def active_moves(session: Session, cluster_ids: Collection[int]) -> frozenset[int]:
    """The moves from or to these clusters that are approved or under way: the solve's
    snapshots (read after this) lock their jobs."""
    rows = session.exec(select(Action.id).where(_moves_of(cluster_ids)))
    return frozenset(i for i in rows if i is not None)


def unplanned_moves(
    session: Session,
    clusters: Mapping[str, int],
    known: frozenset[int],
    planned: Iterable[Planned],
    only: str | None = None,
) -> list[Approved]:
    """The moves from or to ``clusters`` (name → id; ``only``: from or to that one) approved
    or under way now that the solve does not make (``planned``); ``known``: those it read
    approved."""
    names = {cid: name for name, cid in clusters.items()}
    ids = [clusters[only]] if only is not None else list(clusters.values())
    makes = set(planned)
    found: list[Approved] = []
    query = (
        select(Action, Job.external_id, Job.gpus_requested)
        .join(Job, col(Job.id) == col(Action.job_id))
        .where(_moves_of(ids))
        .order_by(col(Action.id))
    )
    for action, job, gpus in session.exec(query):
        source = names.get(action.cluster_id, f"cluster {action.cluster_id}")
        target = names.get(action.target_cluster_id or -1, f"cluster {action.target_cluster_id}")
        if (source, job, target, action.source_node) in makes:
            continue
        action_id = int(action.id or 0)
        nodes = tuple(node_names(action.target_node))
        found.append(Approved(action_id, job, source, target, nodes, action_id in known, gpus))
    return found


def arriving(moves: list[Approved], member: str) -> dict[str, tuple[int, Approved]]:
    """Solver node name of ``member`` → the GPUs the moves bring there, and the first of
    them (a move onto several nodes counts all its GPUs on each: its row does not say how
    they are split)."""
    found: dict[str, tuple[int, Approved]] = {}
    for move in moves:
        if move.to_cluster != member:
            continue
        for node in move.nodes:
            gpus, first = found.get(f"{member}/{node}", (0, move))
            found[f"{member}/{node}"] = (gpus + move.gpus, first)
    return found


def gpus_used(placement: Mapping[str, Mapping[str, int]]) -> dict[str, int]:
    """Node → the GPUs a plan's placement (job → node → GPUs) uses on it."""
    used: dict[str, int] = {}
    for where in placement.values():
        for node, gpus in where.items():
            used[node] = used.get(node, 0) + gpus
    return used


def overbooked(
    capacity: Mapping[str, int], used: Mapping[str, int], coming: Mapping[str, tuple[int, Approved]]
) -> dict[str, Approved]:
    """The nodes whose GPUs the plan (``used``) and the moves ``coming`` need more of than
    they have → the first such move."""
    return {
        node: move
        for node, (gpus, move) in coming.items()
        if node in capacity and used.get(node, 0) + gpus > capacity[node]
    }


def held(part: Instance, own: Plan, member: str, moves: list[Approved]) -> dict[int, str]:
    """The dependency groups of a member's slice ``own`` that a move the solve does not
    make conflicts with, with why: an action on a job whose move was approved meanwhile
    (one approved before, the solve kept as it is), or one that takes GPUs on a node a
    move goes to in this member (the member's instance does not count them)."""
    leaving = {
        f"{a.from_cluster}/{a.job}": a for a in moves if a.from_cluster == member and not a.seen
    }
    capacity = {node.name: node.gpus for node in part.nodes}
    short = overbooked(capacity, gpus_used(own.placement), arriving(moves, member))
    found: dict[int, str] = {}
    if not leaving and not short:
        return found
    grows = PlanKind.start, PlanKind.migrate, PlanKind.resize
    for component in action_graph(part, own).components():
        why = None
        for index in sorted(component):
            action = own.actions[index]
            if action.job_id in leaving:
                why = f"{leaving[action.job_id].text()}: a later period"
                break
            taken = [
                node
                for node, gpus in action.to_placement.items()
                if node in short
                and action.kind in grows
                and gpus > action.from_placement.get(node, 0)
            ]
            if taken:
                move = short[taken[0]]
                why = f"GPUs on {taken[0].split('/', 1)[1]} go to {move.text()}: a later period"
                break
        if why is not None:
            found.update(dict.fromkeys(component, why))
    return found


def left_group(session: Session, group: str, cluster: str) -> str | None:
    """Why ``cluster``'s slice of ``group``'s solve is no longer the group's (it left the
    group, or was deleted), or None."""
    row = session.exec(
        select(FederationGroup.name)
        .join(Cluster, col(Cluster.federation_group_id) == col(FederationGroup.id))
        .where(Cluster.name == cluster)
    ).first()
    if row == group:
        return None
    return f"cluster {cluster} left federation group {group} while the group was solved"


def members_now(session: Session, group: str, names: Collection[str]) -> dict[str, int]:
    """Which of ``names`` are members of ``group`` now: name → cluster id."""
    rows = session.exec(
        select(Cluster.name, Cluster.id)
        .join(FederationGroup, col(Cluster.federation_group_id) == col(FederationGroup.id))
        .where(FederationGroup.name == group, col(Cluster.name).in_(list(names)))
    )
    return {name: cid for name, cid in rows if cid is not None}


def set_back(
    session: Session, clusters: Mapping[str, int], now: datetime
) -> dict[str, dict[str, str]]:
    """Solver job id (``<home>/<job>``) → the clusters of the group its last ``RETRY_AFTER``
    of moves failed to or were rejected for, each with why."""
    names = {cid: name for name, cid in clusters.items()}
    ended = sa.func.coalesce(col(Action.finished_at), col(Action.updated_at))
    query = (
        select(Action, Job.external_id)
        .join(Job, col(Job.id) == col(Action.job_id))
        .where(
            col(Action.kind) == ActionKind.move.value,
            col(Action.state).in_([s.value for s in SET_BACK]),
            col(Action.cluster_id).in_(list(names)),
            ended >= now - RETRY_AFTER,
        )
        .order_by(col(Action.id))
    )
    found: dict[str, dict[str, str]] = {}
    for action, job in session.exec(query):
        target = names.get(action.target_cluster_id or -1)
        if target is None:
            continue
        verb = "was rejected" if action.state == ActionState.rejected else "failed"
        found.setdefault(f"{names[action.cluster_id]}/{job}", {})[target] = (
            f"its move to {target} (action {action.id}) {verb} within the last "
            f"{int(RETRY_AFTER.total_seconds() // 60)} min"
        )
    return found


def without_set_back(
    movable: dict[str, frozenset[str]],
    stays: dict[str, str],
    back: Mapping[str, Mapping[str, str]],
) -> dict[str, frozenset[str]]:
    """``movable`` without the clusters each job's moves were set back at; a job left with
    nowhere to go is added to ``stays`` with why."""
    kept: dict[str, frozenset[str]] = {}
    for job_id, targets in movable.items():
        failed = back.get(job_id, {})
        left = frozenset(t for t in targets if t not in failed)
        if left:
            kept[job_id] = left
        else:
            stays[job_id] = "; ".join(failed[t] for t in sorted(targets))
    return kept
