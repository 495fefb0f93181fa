"""What planning a federation group as one would change: a what-if over the live state.

Algorithm (``plan_group``):

1. Snapshot every cluster of the group and build its instance, as its own shaping cycle
   does (``app.shaping.snapshot``); nothing is held while the solver runs after that.
2. A pending block job may start in another cluster of the group when its connector said
   how to submit it there (``jobs.submit_spec``), that cluster can run it (its scheduler
   is of the spec's kind, or any kind when the spec has a portable form) and its team may
   go there: its home cluster's SLA policy names the cluster in the team's
   ``allowed_clusters`` (None: any) and the cluster's labels include every key=value of
   the team's ``cluster_selector`` (data residency; None: any), and the job's own
   residency (``jobs.residency``: its connector read it, wire.residency) permits the
   cluster too, by its labels and names. Members whose policies give one team different
   selectors are refused, naming both. A job pinned to nodes
   (``required_nodes``: a requeue with its checkpoint) or a service stays where it is.
   A *running* block job may move to another member by the same rules when the move's
   saga could carry it out (``app.actions.recipes``): it can checkpoint, runs on one
   node, and the target's scheduler starts a job pinned to the node its checkpoint is
   staged on (``places_itself`` and ``moves_jobs``); every other running job is held to
   its cluster.
3. Solve each cluster alone (what its cycle plans today; the what-if only) and the group
   as one instance within ``PLAN_BUDGET_S`` (``solver.federation.federate``: a start away
   from home pays its image's transfer over the group's link, at the rate its moves'
   transfers measured, ``app.federation.link``; a running job moved away pays its
   checkpoint, restore and that transfer), with the same policy (shaper) and no
   migrations within a cluster (the cycles do those): only moves of running jobs to
   another member (``cross_cluster_migration``), within the per-cycle migration budget,
   dwell, cooldown and the teams' migrations per day; compare the pending jobs each
   starts and the objective.
4. Report each job the group plan starts (pending) or moves (running) in another cluster,
   and why each pending job that may not go anywhere else stays home.

The what-if is read-only; ``app.federation.moves`` turns the same solve's moves into move
actions (submit in the target cluster, cancel at home once accepted).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any

from pydantic import BaseModel, Field
from sqlmodel import Session, col, select

from app.actions.schedulers import moves_jobs, places_itself, takes_moves
from app.clusters.models import Cluster, ShapingMode
from app.core.db import begin
from app.core.errors import Invalid
from app.core.lookup import row_id
from app.federation import meanwhile
from app.federation.link import measured_link
from app.federation.models import FederationGroup
from app.federation.service import get_group, members
from app.jobs.models import Job
from app.shaping.cycle import Solved, Withdrawn
from app.shaping.snapshot import ClusterSnapshot, solver_job_id, take_snapshot, to_instance
from solver import Instance, SolverConfig, validate
from solver.dependencies import action_graph
from solver.federation import (
    Residency,
    cross_cluster_moves,
    cross_cluster_starts,
    federate,
    residency_clusters,
)
from solver.instance import MigrationCostModel
from solver.objective import evaluate
from solver.plan import ActionKind, Plan, Reason, ReasonCode
from solver.policies import get_policy
from wire.telemetry import JobShape, JobState

POLICY = "shaper"
# A whole plan of the group within this wall-clock budget (SolverConfig.plan_budget_s): it
# runs inside the shaping period, after every member's own cycle.
PLAN_BUDGET_S = 5.0
DISPATCH = (
    "what-if only: the shaping cycle proposes these moves (a cluster in advise mode) or "
    "dispatches them (enforce) as move actions of the source cluster; observe: neither"
)


class Figures(BaseModel):
    pending_started: int = Field(description="pending block jobs the plan starts")
    objective: float


class FederatedMove(BaseModel):
    job: str
    from_cluster: str
    to_cluster: str
    gpus: int
    nodes: list[str]
    running: bool = Field(
        False,
        description="a running job moved (checkpointed on source_node, restored on its one "
        "node there); else a pending job started there",
    )
    source_node: str | None = Field(None, description="running: the node it leaves")


class Link(BaseModel):
    bandwidth_mib_per_s: float = Field(
        description="what the plan priced a start away from home with: the rate measured on "
        "the group's last move transfers, else the group's configured bandwidth"
    )
    measured_transfers: int = Field(description="transfers measured (0: configured rate)")
    egress_gpu_s_per_gib: float = Field(
        0.0, description="what a GiB crossing between the clusters cost, in GPU-seconds"
    )


class StaysHome(BaseModel):
    job: str
    cluster: str
    why: str


STAYS_HOME_SHOWN = 100


class FederationWhatIf(BaseModel):
    group: str
    clusters: list[str]
    planned_at: datetime
    policy: str
    pending_jobs: int
    movable_jobs: int
    movable_running_jobs: int = Field(
        description="running jobs the plan may move to another member (see ``moves``)"
    )
    alone: Figures
    federated: Figures
    moves: list[FederatedMove]
    link: Link
    stays_home: int = Field(description="pending jobs that cannot start in another member")
    stays_home_examples: list[StaysHome] = Field(
        description=f"why, for the first {STAYS_HOME_SHOWN} of them (by cluster and job)"
    )
    running_held_examples: list[StaysHome] = Field(
        default_factory=list,
        description=f"why running jobs may not move to another member, for the first "
        f"{STAYS_HOME_SHOWN} of them (by cluster and job)",
    )
    dispatch: str = DISPATCH


def job_residency(job: Job) -> Residency | None:
    """The job's own residency (``jobs.residency``, wire.residency's form) as the solver's."""
    if job.residency is None:
        return None
    names = job.residency.get("allowed_clusters")
    return Residency(
        cluster_selector=dict(job.residency.get("cluster_selector") or {}),
        allowed_clusters=None if names is None else frozenset(names),
    )


def _residency_text(rule: Residency) -> str:
    selector = ",".join(f"{k}={v}" for k, v in rule.cluster_selector.items())
    parts = [f"cluster_selector {selector}"] if selector else []
    if rule.allowed_clusters is not None:
        parts.append(f"allowed_clusters [{', '.join(sorted(rule.allowed_clusters))}]")
    return "; ".join(parts) or "none"


def _targets(
    job: Job,
    home: Cluster,
    clusters: list[Cluster],
    allowed: dict[tuple[str, str], Residency],
    *,
    lands: Callable[[str], bool] = lambda _scheduler: True,
) -> tuple[frozenset[str], str]:
    """The other clusters that can run ``job`` from its submit spec (its scheduler's kind,
    or any with a portable form), whose scheduler ``lands`` it, and that it and its team
    may use (its residency, its team's rule); when none, why (the job has a spec)."""
    assert job.submit_spec is not None
    spec: dict[str, Any] = json.loads(job.submit_spec)
    portable = spec.get("portable") is not None
    readers = [
        c
        for c in clusters
        if c.name != home.name
        and (portable or c.scheduler == spec.get("scheduler"))
        and takes_moves(c.scheduler)
    ]
    landing = {c.name: c.labels for c in readers if lands(c.scheduler)}
    team_rule, own = allowed.get((home.name, job.team)), job_residency(job)
    targets = residency_clusters(landing, team_rule, own)
    if targets:
        return targets, ""
    if not readers:
        return targets, (
            f"no other member runs {spec.get('scheduler')} and its spec has no portable form"
        )
    if not landing:
        return targets, (
            f"no other member that runs it starts a job pinned to a node (Slurm, "
            f"Kubernetes): {', '.join(sorted(f'{c.name} runs {c.scheduler}' for c in readers))}"
        )
    by_team = residency_clusters(landing, team_rule)
    if not by_team:
        return targets, (
            f"team {job.team}'s SLA policy in {home.name} lets it go to none of "
            f"{', '.join(sorted(landing))} (allowed_clusters, cluster_selector)"
        )
    assert own is not None  # the team's rule alone lets it go
    return targets, (
        f"its own residency ({_residency_text(own)}) lets it go to none of "
        f"{', '.join(sorted(by_team))}"
    )


def lands_pinned(scheduler: str) -> bool:
    """Whether a running job moved to a cluster of this scheduler can land restored: its
    scheduler starts the resubmitted job on the node its checkpoint is staged on
    (``app.actions.recipes``' running move)."""
    return places_itself(scheduler) and moves_jobs(scheduler)


def _running_movable(
    session: Session,
    clusters: list[Cluster],
    allowed: dict[tuple[str, str], Residency],
    parts: dict[str, Instance],
) -> tuple[dict[str, frozenset[str]], dict[str, str]]:
    """Solver job id → the other clusters of the group a running job may move to (see the
    module docstring, step 2); and, for every other running block job, why it stays."""
    by_id = {row_id(c): c for c in clusters}
    query = select(Job).where(col(Job.cluster_id).in_(list(by_id)), Job.state == JobState.running)
    movable: dict[str, frozenset[str]] = {}
    stays: dict[str, str] = {}
    for job in session.exec(query):
        home = by_id[job.cluster_id]
        job_id = solver_job_id(home.name, job.external_id)
        planned = parts[home.name].job_by_id.get(job_id)
        if job.shape != JobShape.block or planned is None or not planned.is_running:
            continue
        if not job.checkpointable:
            stays[job_id] = "it cannot checkpoint: it would start over"
        elif len(planned.placement) != 1:
            stays[job_id] = f"it runs on {len(planned.placement)} nodes: a move takes one"
        elif job.submit_spec is None:
            stays[job_id] = f"{home.name}'s connector gave no submit spec for it"
        else:
            targets, why = _targets(job, home, clusters, allowed, lands=lands_pinned)
            if targets:
                movable[job_id] = targets
            else:
                stays[job_id] = why
    return movable, stays


def _movable(
    session: Session, clusters: list[Cluster], allowed: dict[tuple[str, str], Residency]
) -> tuple[dict[str, frozenset[str]], dict[str, str]]:
    """Solver job id → the other clusters of the group that can run the pending job and
    that it and its team may use (``allowed``: (cluster, team) → the rule of its home
    cluster's SLA policy, by name and by labels (``_allowed``); absent: any); and, for
    every other pending job, why it stays home."""
    by_id = {row_id(c): c for c in clusters}
    query = select(Job).where(col(Job.cluster_id).in_(list(by_id)), Job.state == JobState.pending)
    movable: dict[str, frozenset[str]] = {}
    stays: dict[str, str] = {}
    for job in session.exec(query):
        home = by_id[job.cluster_id]
        job_id = solver_job_id(home.name, job.external_id)
        if job.shape != JobShape.block:
            stays[job_id] = "a service stays in its cluster"
            continue
        if job.required_nodes:
            stays[job_id] = "it waits to resume from its checkpoint on its own nodes"
            continue
        if job.submit_spec is None:
            stays[job_id] = f"{home.name}'s connector gave no submit spec for it"
            continue
        targets, why = _targets(job, home, clusters, allowed)
        if targets:
            movable[job_id] = targets
        else:
            stays[job_id] = why
    return movable, stays


def _same_selectors(group: str, slas: dict[str, dict[str, Any]]) -> None:
    """A team's data may not leave its region whichever member it is queued in: members
    whose policies give it different selectors (one none) are refused, naming both, as
    ``solver.federation.federate`` refuses other differing team rules (it sees only the
    solver's)."""
    seen: dict[str, tuple[str, dict[str, str] | None]] = {}
    for cluster, sla in slas.items():
        for team in sla.get("teams", []):
            selector = team.get("cluster_selector") or None  # {} selects every cluster
            first, known = seen.setdefault(team["team"], (cluster, selector))
            if known != selector:
                raise Invalid(
                    f"federation group {group!r}: team {team['team']!r} has a different "
                    f"cluster_selector in {first} and {cluster}",
                    field="group",
                )


def _allowed(group: str, slas: dict[str, dict[str, Any]]) -> dict[tuple[str, str], Residency]:
    """(cluster, team) → where the team's jobs queued there may go, by that cluster's SLA
    policy: the clusters its ``allowed_clusters`` names (None: every member) whose labels
    include its ``cluster_selector``. A team with neither rule is absent."""
    _same_selectors(group, slas)
    allowed: dict[tuple[str, str], Residency] = {}
    for home, sla in slas.items():
        for team in sla.get("teams", []):
            names, selector = team.get("allowed_clusters"), team.get("cluster_selector")
            if names is None and selector is None:
                continue
            allowed[(home, team["team"])] = Residency(
                cluster_selector=selector or {},
                allowed_clusters=None if names is None else frozenset(names),
            )
    return allowed


def _figures(instance: Instance, placement: dict[str, dict[str, int]], started: int) -> Figures:
    return Figures(
        pending_started=started, objective=round(evaluate(instance, placement).objective, 3)
    )


def _block_starts(instance: Instance, plan: Plan) -> int:
    jobs = instance.job_by_id
    return sum(
        1 for a in plan.actions if a.kind is ActionKind.start and not jobs[a.job_id].is_elastic
    )


@dataclass(frozen=True)
class GroupSolve:
    """One solve of a federation group as a whole, and of each member alone."""

    group: str
    clusters: list[str]
    instance: Instance
    plan: Plan
    movable_jobs: int
    movable_running_jobs: int
    alone: Figures | None  # None when not compared
    moves: list[FederatedMove]
    stays: dict[str, str]  # solver job id → why it cannot start in another member
    running_stays: dict[str, str]  # solver job id → why a running job may not move away
    link: Link
    # Each member's snapshot and instance (the group's instance is made of these).
    snapshots: dict[str, ClusterSnapshot] = field(default_factory=dict)
    parts: dict[str, Instance] = field(default_factory=dict)
    # ``validate`` of the group's plan on the group's instance.
    violations: list[str] = field(default_factory=list)
    # The members' ids, and the moves from or to them that were approved or running when
    # the solve read them (``meanwhile``: any other approved since is a change).
    cluster_ids: dict[str, int] = field(default_factory=dict)
    known_moves: frozenset[int] = frozenset()


def solve_group(
    *,
    session: Session,
    name: str,
    now: datetime,
    compare: bool = True,
    for_members: bool = False,
    only: Collection[str] | None = None,
) -> GroupSolve:
    """Plan the group as one over the live state (and, ``compare``, each member alone).

    ``for_members``: the solve is the members' own plans too (``member_plan``; the
    shaping cycle with ``Settings.federation_solve_once``): it also migrates within a
    cluster (but not the jobs of a member whose scheduler cannot be told where a job goes:
    they are not ``migratable``; they may still be stopped, or moved to another member),
    and no job moves to or from a member in ``observe`` mode (it only plans: such a move
    could never be made); a member whose policy is not the group's (``POLICY``) is refused
    (``Invalid``: its own plan would not be made by its own policy). ``only``: the members
    planned (the others' cycles failed this period); None: all.

    The session's transaction is ended: nothing is held while the solver runs, and no ORM
    object read here is used after."""
    # Read in a read transaction (a POST's session has begun a write one: on SQLite that
    # would hold the one write lock through every solve), copy what the plans need, and
    # end it: no ORM object is touched after, so none reopens a transaction while the
    # solver runs.
    session.rollback()
    begin(session, writes=False)
    group: FederationGroup = get_group(session=session, name=name)
    clusters = [c for c in members(session=session, group=group) if only is None or c.name in only]
    names = [c.name for c in clusters]
    apart = sorted(f"{c.name} plans with {c.policy}" for c in clusters if c.policy != POLICY)
    if for_members and apart:
        raise Invalid(
            f"federation group {name!r} is planned with {POLICY}, its members apart: "
            f"{', '.join(apart)}",
            field="group",
        )
    if len(clusters) < 2:
        raise Invalid(
            f"federation group {name!r} has {len(clusters)} cluster(s): add at least two",
            field="group",
        )
    measured = measured_link(session, [row_id(c) for c in clusters])
    bandwidth = (
        measured.bandwidth_mib_per_s
        if measured is not None
        else group.inter_cluster_bandwidth_mib_per_s
    )
    link = MigrationCostModel(
        inter_cluster_bandwidth_mib_per_s=bandwidth,
        inter_cluster_overhead_s=group.inter_cluster_overhead_s,
        inter_cluster_egress_gpu_s_per_gib=group.inter_cluster_egress_gpu_s_per_gib,
    )
    # Alone, each member's own cycle migrates within it; planned for the members, the
    # group's one solve does. One config serves the group: the jobs of a member whose
    # scheduler cannot be told where a job goes (Kueue, Ray) are not ``migratable``
    # (``snapshot.to_instance``), so they never move within it, while the others' do.
    within = for_members
    config = SolverConfig(
        migration=within,
        cp_sat_migration=within,
        replica_moves=False,
        cross_cluster_migration=True,
        plan_budget_s=PLAN_BUDGET_S,
    )
    cluster_ids = {c.name: row_id(c) for c in clusters}
    # Before the snapshots: a move approved in between is then a change, never missed.
    known_moves = meanwhile.active_moves(session, list(cluster_ids.values()))
    snapshots = {n: take_snapshot(session=session, cluster_name=n, now=now) for n in names}
    # A job may need a GPU model only another member has: each part knows the group's.
    models = frozenset(
        m.name
        for snapshot in snapshots.values()
        for m in snapshot.gpu_models
        for node in snapshot.nodes
        if node.gpu_model_id == m.id and node.gpu_count > 0
    )
    # A job with a proposal waiting (a move of an earlier group plan) is planned afresh:
    # kept locked, the group would never make the same move again and would supersede it.
    parts = {
        n: to_instance(snapshot, config=config, known_models=models, lock_proposed=False)
        for n, snapshot in snapshots.items()
    }
    allowed = _allowed(name, {n: snapshot.sla for n, snapshot in snapshots.items()})
    movable, stays = _movable(session, clusters, allowed)
    running_movable, running_stays = _running_movable(session, clusters, allowed, parts)
    if for_members:
        observing = {c.name for c in clusters if ShapingMode(c.mode) is ShapingMode.observe}
        movable = _acting(movable, stays, observing)
        running_movable = _acting(running_movable, running_stays, observing)
        # Its moves that failed or were rejected lately are not made again: its home
        # plan is a slice of this solve, so it starts there instead (``meanwhile``).
        back = meanwhile.set_back(session, cluster_ids, now)
        movable = meanwhile.without_set_back(movable, stays, back)
        running_movable = meanwhile.without_set_back(running_movable, running_stays, back)
    session.rollback()  # nothing is held while the solver runs
    try:
        whole = federate(
            parts,
            movable=movable,
            running_movable=running_movable,
            migration=link,
            config=config,
        )
    except ValueError as error:  # the members' rules disagree: say which
        raise Invalid(f"federation group {name!r}: {error}", field="group") from error
    policy = get_policy(POLICY)
    alone = None
    if compare:
        alone_started = 0
        alone_objective = 0.0
        for part in parts.values():
            plan = policy.plan(part)
            alone_started += _block_starts(part, plan)
            alone_objective += evaluate(part, plan.placement).objective
        alone = Figures(pending_started=alone_started, objective=round(alone_objective, 3))
    plan = policy.plan(whole)
    moves = [
        FederatedMove(
            job=start.job_id.split("/", 1)[1],
            from_cluster=start.home,
            to_cluster=start.target,
            gpus=sum(start.placement.values()),
            nodes=sorted(node.split("/", 1)[1] for node in start.placement),
        )
        for start in cross_cluster_starts(whole, plan)
    ] + [
        FederatedMove(
            job=move.job_id.split("/", 1)[1],
            from_cluster=move.home,
            to_cluster=move.target,
            gpus=sum(move.placement.values()),
            nodes=sorted(node.split("/", 1)[1] for node in move.placement),
            running=True,
            source_node=move.source.split("/", 1)[1],
        )
        for move in cross_cluster_moves(whole, plan)
    ]
    return GroupSolve(
        group=name,
        clusters=names,
        instance=whole,
        plan=plan,
        movable_jobs=len(movable),
        movable_running_jobs=len(running_movable),
        alone=alone,
        moves=moves,
        stays=stays,
        running_stays=running_stays,
        link=Link(
            bandwidth_mib_per_s=round(bandwidth, 3),
            measured_transfers=measured.samples if measured is not None else 0,
            egress_gpu_s_per_gib=link.inter_cluster_egress_gpu_s_per_gib,
        ),
        snapshots=snapshots,
        parts=parts,
        violations=[str(v) for v in validate(whole, plan)] if for_members else [],
        cluster_ids=cluster_ids,
        known_moves=known_moves,
    )


def _acting(
    movable: dict[str, frozenset[str]], stays: dict[str, str], observing: set[str]
) -> dict[str, frozenset[str]]:
    """``movable`` without the members in ``observe`` mode, as homes or as targets; a job
    left with nowhere to go is added to ``stays`` with why."""
    acting: dict[str, frozenset[str]] = {}
    for job_id, targets in movable.items():
        home = job_id.split("/", 1)[0]
        if home in observing:
            stays[job_id] = f"{home} is in observe mode: it only plans"
        elif targets - observing:
            acting[job_id] = targets - observing
        else:
            stays[job_id] = f"{', '.join(sorted(targets))} only plan (observe mode)"
    return acting


def member_plan(solved: GroupSolve, name: str) -> Solved:
    """Member ``name``'s slice of a group solve made ``for_members``: its instance, and the
    group plan's actions on its own jobs that stay in it (starts, migrations within it,
    resizes, preemptions); its jobs' moves to another member are its plan's notes (the
    moves are actions of their own: ``app.federation.moves``). A start or a migration onto
    GPUs that only a running job's move away frees waits for the next period, with its
    dependency group (``Solved.held``): the move is not this plan's to wait for. The
    group plan's violations are every member's."""
    plan, part = solved.plan, solved.parts[name]
    jobs = part.job_by_id
    away = {f"{m.from_cluster}/{m.job}": m for m in solved.moves}
    vacated = {
        f"{m.from_cluster}/{m.source_node}": m for m in solved.moves if m.source_node is not None
    }

    def placed(leaving: set[str] | dict[str, FederatedMove]) -> dict[str, dict[str, int]]:
        """The plan's placement of the member's jobs, those ``leaving`` it where they are."""
        target = {
            job.id: dict(job.placement) if job.id in leaving else plan.placement.get(job.id, {})
            for job in part.jobs
        }
        return {job_id: where for job_id, where in target.items() if where}

    def indexed(
        leaving: set[str] | dict[str, FederatedMove],
    ) -> dict[str, dict[str, tuple[int, ...]]]:
        """The plan's GPU indices of the member's jobs, those ``leaving`` it where they are."""
        target = {
            job.id: dict(job.gpu_indices or {})
            if job.id in leaving
            else plan.gpu_indices.get(job.id, {})
            for job in part.jobs
        }
        return {job_id: held for job_id, held in target.items() if held}

    own = plan.model_copy(
        update={
            "actions": [a for a in plan.actions if a.job_id in jobs and a.job_id not in away],
            "placement": placed(away),
            "pending": {j: r for j, r in plan.pending.items() if j in jobs},
            "gpu_indices": indexed(away) if plan.gpu_indices else {},
        }
    )
    incoming = {
        f"{name}/{node}": m for m in solved.moves if m.to_cluster == name for node in m.nodes
    }
    held = _held(part, own, vacated, incoming, solved.group)
    left = {own.actions[i].job_id for i in held}
    # What is validated: the slice without what waits; a pending job it leaves where it is
    # (started elsewhere, or waiting for GPUs a move frees) says why.
    elsewhere = Reason(
        code=ReasonCode.insufficient_capacity,
        message="it starts in another member, or waits for GPUs a move frees",
    )
    checked = own.model_copy(
        update={
            "actions": [a for i, a in enumerate(own.actions) if i not in held],
            "placement": placed(away.keys() | left),
            "gpu_indices": indexed(away.keys() | left) if plan.gpu_indices else {},
            "pending": {
                **dict.fromkeys((j for j in away.keys() | left if j in jobs), elsewhere),
                **own.pending,
            },
        }
    )
    # The plan's figures are the member's (its slice valued on its instance), the note the
    # group's: its objective, bound and gap are the whole group's.
    stats = plan.stats.model_copy(
        update={
            "objective": evaluate(part, checked.placement).objective,
            "best_bound": None,
            "gap": None,
            "note": f"a slice of federation group {solved.group}'s plan (objective "
            f"{plan.stats.objective:.4g} for the group){'; ' if plan.stats.note else ''}"
            f"{plan.stats.note}",
        }
    )
    return Solved(
        snapshot=solved.snapshots[name],
        instance=part,
        plan=own.model_copy(update={"stats": stats}),
        violations=[*solved.violations, *(str(v) for v in validate(part, checked))],
        policy=POLICY,
        held=held,
        notes=[_note(solved.group, m) for m in solved.moves if m.from_cluster == name],
        group=solved.group,
        recheck=partial(_recheck, solved, name, part, own),
    )


def planned_moves(solved: GroupSolve) -> list[meanwhile.Planned]:
    return [(m.from_cluster, m.job, m.to_cluster, m.source_node) for m in solved.moves]


def _recheck(
    solved: GroupSolve, name: str, part: Instance, own: Plan, session: Session
) -> dict[int, str]:
    """In the write transaction that persists member ``name``'s slice: ``Withdrawn`` when it
    left the group meanwhile; else the actions to hold for moves approved meanwhile or
    under way (``meanwhile.held``)."""
    why = meanwhile.left_group(session, solved.group, name)
    if why is not None:
        raise Withdrawn(why)
    moves = meanwhile.unplanned_moves(
        session, solved.cluster_ids, solved.known_moves, planned_moves(solved), only=name
    )
    return meanwhile.held(part, own, name, moves)


def _held(
    part: Instance,
    own: Plan,
    vacated: dict[str, FederatedMove],
    incoming: dict[str, FederatedMove],
    group: str,
) -> dict[int, str]:
    """The dependency groups of ``own``'s actions that wait for a later period, with why:
    those that stop a running job of the member (preempt, requeue) on a node another
    member's job moves onto (``incoming``: solver node name → that move) — the move is an
    action of the other member's, approved or dropped on its own, and a stop made for it
    now would run even if it never comes; held, the moved job arrives pending and the next
    plan (its own cluster's then) decides the stop — and those that take GPUs on a node
    that has them only once a running job has left it for another member (``vacated``):
    ``own`` keeps the leaving jobs where they are."""
    used: dict[str, int] = {}
    for where in own.placement.values():
        for node, gpus in where.items():
            used[node] = used.get(node, 0) + gpus
    nodes = part.node_by_name
    short = {n for n in vacated if n in nodes and used.get(n, 0) > nodes[n].gpus}
    jobs = part.job_by_id
    stops = (ActionKind.preempt, ActionKind.requeue)
    held: dict[int, str] = {}
    for component in action_graph(part, own).components():
        actions = [own.actions[index] for index in sorted(component)]
        stopped = [
            node
            for action in actions
            if action.kind in stops and (job := jobs.get(action.job_id)) is not None
            for node in job.placement
            if node in incoming
        ]
        taken = [node for action in actions for node in action.to_placement if node in short]
        if stopped:
            move = incoming[stopped[0]]
            why = (
                f"stops work on {stopped[0].split('/', 1)[-1]} for job {move.job} of "
                f"{move.from_cluster}, which the federation group {group} moves here: "
                "once it has arrived, a later period"
            )
        elif taken:
            move = vacated[taken[0]]
            why = (
                f"GPUs on {move.source_node} free once job {move.job} moves to "
                f"{move.to_cluster} (federation group {group}): a later period"
            )
        else:
            continue
        held.update(dict.fromkeys(component, why))
    return held


def _note(group: str, move: FederatedMove) -> dict[str, Any]:
    """A plan's decision about a job of its cluster that the group moves elsewhere."""
    verb = "moves (checkpointed, restored there)" if move.running else "starts"
    return {
        "job": move.job,
        "action": "move",
        "from": move.source_node,
        "to": ",".join(move.nodes),
        "cluster": move.to_cluster,
        "reason": "federation",
        "message": f"federation group {group}: {verb} in {move.to_cluster} on "
        f"{', '.join(move.nodes)} (a move action of this cluster)",
    }


def plan_group(*, session: Session, name: str, now: datetime) -> FederationWhatIf:
    solved = solve_group(session=session, name=name, now=now)
    whole = solved.instance
    assert solved.alone is not None  # compared
    return FederationWhatIf(
        group=name,
        clusters=solved.clusters,
        planned_at=now,
        policy=POLICY,
        pending_jobs=sum(1 for j in whole.jobs if not j.is_running and not j.is_elastic),
        movable_jobs=solved.movable_jobs,
        movable_running_jobs=solved.movable_running_jobs,
        alone=solved.alone,
        federated=_figures(whole, solved.plan.placement, _block_starts(whole, solved.plan)),
        moves=solved.moves,
        link=solved.link,
        stays_home=len(solved.stays),
        stays_home_examples=[
            StaysHome(cluster=job_id.split("/", 1)[0], job=job_id.split("/", 1)[1], why=why)
            for job_id, why in sorted(solved.stays.items())[:STAYS_HOME_SHOWN]
        ],
        running_held_examples=[
            StaysHome(cluster=job_id.split("/", 1)[0], job=job_id.split("/", 1)[1], why=why)
            for job_id, why in sorted(solved.running_stays.items())[:STAYS_HOME_SHOWN]
        ],
    )
