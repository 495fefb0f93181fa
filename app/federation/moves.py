"""A federation group's plan, acted on: each pending job the group plan starts in another
cluster, and each running job it moves to another, becomes a ``move`` action of its home
cluster (``app.actions.recipes`` says how a move runs: a pending job is held at home,
submitted at the target, cancelled at home once accepted; a running one is checkpointed
on its node (``source_node``), submitted held and pinned to its one node at the target
(``target_node``), its image transferred and staged there, released, confirmed running
restored, then cancelled at home).

Algorithm (:func:`propose_moves`, once per shaping period for every group with two or
more clusters, after the members' own cycles; ``app.shaping.tasks``):

1. Solve the group as one (``planning.solve_group``); no transaction is held meanwhile.
   With ``Settings.federation_solve_once`` the shaping cycle has solved it already, once
   for the period, and its members' own plans are slices of that solve
   (``planning.member_plan``): a job gets one decision, a start at home or a move.
2. In one write transaction, for each move of the solve: the job must still be pending at
   home (running, for a running job's move), with no other action of it unfinished (its
   cluster's own plan may have started or moved it meanwhile), and both clusters must act
   (``observe`` only plans) and still be members of the group; no move goes onto a node
   that the plan and a move approved or under way, not this solve's, overbook
   (``app.federation.meanwhile``). A
   move of the same job to the same cluster (from the same
   node, for a running job) that is still proposed is kept, not duplicated, and goes to
   the nodes this plan puts the job on. A new move is
   approved by shaper when both clusters are in ``enforce`` mode (its saga starts
   at once), else proposed for an operator.
3. Proposed moves of the group's clusters that this solve no longer makes are cancelled:
   approved later, they would move a job the group plan no longer wants moved.

Where the target's scheduler can hold GPUs for a job it starts pinned (Slurm;
``app.actions.recipes``), the nodes a move was planned onto (``target_node``) are reserved
for the job before anything is given up at home: a pending job's copy may start only in
that reservation, a running job is checkpointed only once it is made. If the target's own
queue took them since the plan, the move ends with the job as it was at home. Elsewhere
(Kubernetes, Kueue, Ray, Armada) nothing holds GPUs for it: the target's scheduler places
a pending job once it arrives, and its own queue may take them first, so that the job
waits there instead of at home.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from pydantic import BaseModel, Field
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from app.actions.models import TERMINAL_ACTION_STATES, Action, ActionKind, ActionState
from app.clusters.models import Cluster, ShapingMode
from app.core.db import begin
from app.core.lookup import row_id
from app.federation import meanwhile
from app.federation.planning import FederatedMove, GroupSolve, planned_moves, solve_group
from app.jobs.models import Allocation, Job
from app.nodes.models import Node
from wire.telemetry import JobState

SHAPER = "shaper"


class MovesProposed(BaseModel):
    group: str
    proposed: list[int] = Field(default_factory=list, description="move actions proposed now")
    approved: list[int] = Field(
        default_factory=list, description="move actions approved by shaper now (enforce mode)"
    )
    kept: int = Field(0, description="moves still proposed from an earlier plan")
    superseded: int = Field(0, description="earlier proposals this plan no longer makes")
    skipped: dict[str, str] = Field(
        default_factory=dict, description="<cluster>/<job> → why the plan's move was not made"
    )


def propose_moves(
    *, session: Session, group: str, now: datetime, solved: GroupSolve | None = None
) -> MovesProposed:
    """Turn the group plan's moves into move actions; see the module docstring. ``solved``:
    the group's solve of this period, made already (``Settings.federation_solve_once``:
    its members' plans are slices of it); None: solve the group now."""
    if solved is None:
        solved = solve_group(session=session, name=group, now=now, compare=False)
    outcome = MovesProposed(group=group)
    begin(session, writes=True)
    clusters = {
        c.name: c
        for c in session.exec(select(Cluster).where(col(Cluster.name).in_(solved.clusters)))
    }
    # Changed while the solver ran (``meanwhile``): who is still a member; and the moves
    # approved or under way that the solve does not make, whose target GPUs no new move
    # may overbook (the target's instance does not count a job that has not arrived).
    still = meanwhile.members_now(session, group, list(clusters))
    under_way = meanwhile.unplanned_moves(
        session,
        {n: row_id(c) for n, c in clusters.items()},
        solved.known_moves,
        planned_moves(solved),
    )
    used = meanwhile.gpus_used(solved.plan.placement)
    capacity = {node.name: node.gpus for node in solved.instance.nodes}
    taken = {
        node: move
        for name in clusters
        for node, move in meanwhile.overbooked(
            capacity, used, meanwhile.arriving(under_way, name)
        ).items()
    }
    # (job id, target cluster id, source node: None for a pending job)
    wanted: set[tuple[int, int, str | None]] = set()
    for move in solved.moves:
        home, target = clusters.get(move.from_cluster), clusters.get(move.to_cluster)
        if home is None or target is None:
            continue  # deleted while the solver ran
        gone = [c.name for c in (home, target) if c.name not in still]
        if gone:  # its proposal, if any, is superseded below
            outcome.skipped[f"{move.from_cluster}/{move.job}"] = (
                f"{gone[0]} left federation group {group} while the group was solved"
            )
            continue
        onto = [n for n in move.nodes if f"{move.to_cluster}/{n}" in taken]
        if onto:
            outcome.skipped[f"{move.from_cluster}/{move.job}"] = (
                f"GPUs on {onto[0]} go to {taken[f'{move.to_cluster}/{onto[0]}'].text()}: "
                "a later period"
            )
            continue
        job_id = session.exec(
            select(Job.id).where(Job.cluster_id == row_id(home), Job.external_id == move.job)
        ).first()
        # FOR NO KEY UPDATE: the ingest checks the foreign keys of the allocations and
        # samples it inserts for a job with a key-share lock on the job's row, which FOR
        # UPDATE would make wait while this holds the job (and later ones) until commit.
        # SKIP LOCKED: the home's ingest updates its push's jobs in the push's order while
        # this locks them in the solve's, so waiting could deadlock with it (as with a saga
        # of the job); a job whose row is being written is proposed a later period.
        job = (
            session.exec(
                select(Job)
                .where(Job.id == job_id)
                .with_for_update(key_share=True, skip_locked=True)
            ).first()
            if job_id is not None
            else None
        )
        if job_id is not None and job is None:
            wanted.add((job_id, row_id(target), move.source_node))  # its proposal stands
            outcome.skipped[f"{move.from_cluster}/{move.job}"] = (
                "its row is being written (its cluster's telemetry, or a saga of it): "
                "a later period"
            )
            continue
        why = _why_not(session, home, job, target, move)
        if job is not None:
            wanted.add((row_id(job), row_id(target), move.source_node))
        if why is not None:
            if why:
                outcome.skipped[f"{move.from_cluster}/{move.job}"] = why
            else:
                outcome.kept += 1
                assert job is not None  # a proposal of it waits
                _retarget(session, job, target, move, group, now)
            continue
        assert job is not None  # _why_not names a missing job
        # Both clusters act: an operator decides unless both are in enforce mode.
        enforce = all(ShapingMode(c.mode) is ShapingMode.enforce for c in (home, target))
        action = Action(
            cluster_id=row_id(home),
            target_cluster_id=row_id(target),
            job_id=row_id(job),
            kind=ActionKind.move,
            state=ActionState.approved if enforce else ActionState.proposed,
            idempotency_key=_key(session, home, job, target),
            reason=_reason(group, move),
            source_node=move.source_node,
            target_node=",".join(move.nodes)[:255],
            created_at=now,
            updated_at=now,
            decided_by=SHAPER if enforce else None,
            decided_at=now if enforce else None,
        )
        try:
            with session.begin_nested():  # a concurrent plan of the group made it first
                session.add(action)
                session.flush()
        except IntegrityError:
            outcome.kept += 1
            continue
        (outcome.approved if enforce else outcome.proposed).append(row_id(action))
    outcome.superseded = _supersede(session, [row_id(c) for c in clusters.values()], wanted, now)
    session.commit()
    return outcome


def _why_not(
    session: Session, home: Cluster, job: Job | None, target: Cluster, move: FederatedMove
) -> str | None:
    """None: propose a move of the job; '': a proposal of this move waits already; else
    why not (a proposed move of the job elsewhere does not count: it is superseded)."""
    target_id = row_id(target)
    for cluster in (home, target):
        if ShapingMode(cluster.mode) is ShapingMode.observe:
            return f"{cluster.name} is in observe mode: it only plans"
    if job is None:
        return "the job is no longer reported"
    planned = JobState.running if move.running else JobState.pending
    if JobState(job.state) is not planned:
        return f"the job is {JobState(job.state).value} now"
    if move.running:
        # Its scheduler may have moved it since the solve (a requeue after a node failed):
        # the checkpoint would be asked of an agent where it no longer runs.
        held_on = set(
            session.exec(
                select(Node.name)
                .join(Allocation, col(Allocation.node_id) == col(Node.id))
                .where(Allocation.job_id == job.id, col(Allocation.released_at).is_(None))
            )
        )
        if held_on != {move.source_node}:
            where = ", ".join(sorted(held_on)) or "no node"
            return f"the job runs on {where} now, not on {move.source_node}"
    unfinished = session.exec(
        select(Action).where(
            Action.job_id == job.id,
            col(Action.state).not_in([s.value for s in TERMINAL_ACTION_STATES]),
        )
    ).all()
    proposed = [
        a
        for a in unfinished
        if ActionKind(a.kind) is ActionKind.move and ActionState(a.state) is ActionState.proposed
    ]
    # A pending job's move proposed before the job started is not this one: superseded.
    same = [a for a in proposed if a.source_node == move.source_node]
    if any(a.target_cluster_id == target_id for a in same):
        return ""
    unfinished = [a for a in unfinished if a not in proposed]
    if unfinished:
        return f"action {unfinished[0].id} ({unfinished[0].kind}) of the job is unfinished"
    return None


def _retarget(
    session: Session, job: Job, target: Cluster, move: FederatedMove, group: str, now: datetime
) -> None:
    """A kept proposal goes where this plan puts the job: the target nodes the plans of this
    period leave free for it (the one before may have planned it onto others, since given
    to other work)."""
    nodes = ",".join(move.nodes)[:255]
    source = (
        col(Action.source_node).is_(None)
        if move.source_node is None
        else col(Action.source_node) == move.source_node
    )
    kept = session.exec(
        select(Action).where(
            Action.job_id == job.id,
            Action.kind == ActionKind.move,
            Action.state == ActionState.proposed,
            Action.target_cluster_id == row_id(target),
            source,
        )
    ).first()
    if kept is not None and kept.target_node != nodes:
        # Conditional on the state, as ``_supersede``: an operator may approve the proposal
        # meanwhile, and its saga then runs on the nodes that were approved.
        session.execute(
            sa.update(Action)
            .where(col(Action.id) == row_id(kept), col(Action.state) == ActionState.proposed.value)
            .values(target_node=nodes, reason=_reason(group, move), updated_at=now)
        )


def _key(session: Session, home: Cluster, job: Job, target: Cluster) -> str:
    """Unique per proposal: the job's moves so far are counted in, so a move proposed again
    after an earlier proposal of it was superseded or rejected is a new row."""
    earlier = len(
        session.exec(
            select(Action.id).where(Action.job_id == job.id, Action.kind == ActionKind.move)
        ).all()
    )
    return f"move:{home.name}:{job.id}:{job.generation}:{target.name}:{earlier}"[:128]


def _reason(group: str, move: FederatedMove) -> str:
    if move.running:
        return (
            f"federation group {group}: job {move.job} moves from {move.source_node} in "
            f"{move.from_cluster} to {', '.join(move.nodes)} in {move.to_cluster} to make "
            f"room in {move.from_cluster} for work worth more (checkpointed here, restored "
            "there, cancelled here once it runs there)"
        )[:2048]
    return (
        f"federation group {group}: {move.from_cluster} cannot start job {move.job} now; "
        f"{move.to_cluster} has {move.gpus} GPUs for it on {', '.join(move.nodes)} "
        "(submitted there, cancelled here once accepted)"
    )[:2048]


def _supersede(
    session: Session,
    cluster_ids: list[int],
    wanted: set[tuple[int, int, str | None]],
    now: datetime,
) -> int:
    """Cancel the proposed moves of these clusters that the latest plan does not make; one
    an operator approved meanwhile is left alone (the update is conditional on the state)."""
    stale = [
        row_id(action)
        for action in session.exec(
            select(Action).where(
                col(Action.cluster_id).in_(cluster_ids),
                Action.kind == ActionKind.move,
                Action.state == ActionState.proposed,
            )
        )
        if (action.job_id, action.target_cluster_id, action.source_node) not in wanted
    ]
    if not stale:
        return 0
    cancelled: sa.CursorResult[Any] = session.execute(  # type: ignore[assignment]
        sa.update(Action)
        .where(col(Action.id).in_(stale), col(Action.state) == ActionState.proposed.value)
        .values(
            state=ActionState.cancelled.value,
            error="superseded: the federation group's latest plan no longer makes this move",
            updated_at=now,
            finished_at=now,
        )
    )
    return int(cancelled.rowcount)
