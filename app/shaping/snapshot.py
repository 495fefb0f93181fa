"""Phase 1–2 of the shaping cycle: an immutable snapshot of one cluster, and the solver
instance built from it.

The snapshot is read in one transaction and then never touches the database again, so
the solve works on a consistent picture however long it takes. ``to_instance`` is pure.

Mapping to the solver (documented because it decides what the solver optimises):

* the wire's words become the solver's through one table each, here and nowhere else
  (the solver imports neither ``wire`` nor ``app``, so it keeps its own enums):
  ``NODE_STATES`` (``up``/``draining``/``down`` → READY/DRAINING/DOWN) and ``JOB_SHAPES``
  (``block``/``elastic`` → BLOCK/ELASTIC); a job's ``kind`` (training, inference …) is not
  the solver's business and feeds only ``forecast.duration``.
* node names become ``<cluster>/<node>`` so instances of several clusters never clash;
  CPU cores → milli-CPUs.
* a job's ``priority`` p (0…1,000,000 on the wire) becomes the solver weight 1 + p / 10,
  multiplied by its team's ``priority_weight`` from the cluster's SLA policy.
* block jobs: ``gang_size`` replicas of ``gpus_requested / gang_size`` GPUs when that
  divides; running jobs use the largest GPU count that divides every node's share.
* elastic services: ``gpus_requested`` GPUs per replica; the forecast (``forecast.demand``,
  the simulator's forecaster too): step 0 is the latest demand sample, steps 1… the
  quantile the service's SLA ``demand_target`` asks for (``quantile_for``) of an ETS
  forecast over the hourly means of the last ``FORECAST_HISTORY_DAYS`` days — seasonal-naive
  while there are less than two days, the latest sample under one; with no sample at all,
  the current replicas. One fit per service is kept across cycles (``FORECASTER``).
* block jobs' ``expected_runtime_s`` (backfill's shadow times, the look-ahead) is what
  ``forecast.duration`` predicts from the cluster's block jobs that finished in the last
  ``DURATION_HISTORY_DAYS`` days (team, kind, GPUs), once there are
  ``MIN_DURATION_HISTORY`` of them. A running job past its prediction is expected to run
  as long again as it has (durations are heavy-tailed). The job's time limit (the
  scheduler ends it then) caps either; a running job past it is expected to end now. A
  limit of ``TELLING_LIMIT_S`` or less is also the run time before there is history, as
  Slurm's backfill takes it, and the user's estimate to learn from once
  ``MIN_DURATION_HISTORY`` finished jobs had one (``Durations``); a job with neither has
  none (a guess from nothing would only mislead the reservations).
* what the cycle forecasts is also handed out to be recorded and scored
  (``app.forecasts``): ``service_forecasts`` (each service's steps 1 … ``FORECAST_STEPS``
  − 1 — every hour the solver's look-ahead forecasts — with its lead time and the
  seasonal-naive forecast beside it) and ``runtime_predictions`` (each block
  job's run time, with its team's median run time beside it).
* elastic training jobs (block jobs whose report gives ``max_replicas``, wire.telemetry:
  Slurm's ``--nodes=MIN-MAX``): ``gpus_requested / gang_size`` GPUs per replica,
  ``min_replicas``..``max_replicas`` replicas, asking for ``replicas``, one node per
  replica at that size (``max_nodes``); one whose GPUs are not a whole number of replicas,
  or that holds a count outside its range, is planned rigid as it is. Their last resize
  counts as a move (``last_moved_at``: the solver's ``migration_cooldown_s``).
* on Slurm, multi-node jobs (rigid gangs and elastic training) run one replica per node
  (``Instance.one_replica_per_node``): Slurm gives each of a job's nodes its GRES per node.
* a block job's own speeds on GPU models (``JobReport.speeds``, wire.speeds: what its owner
  wrote) become ``Instance.speeds``, scaled so that none is above its model's catalogue
  speed (``within_catalogue``): they say how its speed differs between models, never that
  it is worth more than the catalogue says. A job with none gets those of the first speed
  profile of the SLA policy that matches its kind, team and queue (the site's, as written).
* jobs with no GPUs and finished jobs are left out.
* a pending job with ``required_nodes`` (Slurm's ``ReqNodeList``: a job requeued with its
  checkpoint must resume where its image is) may be placed only there: those nodes get a
  label ``shaper.io/pinned-<n>`` and the job a node selector for it.
* what Shaper did to each job feeds the solver's dwell rule: ``last_acted_at`` (the end of
  its last action that ran: succeeded, failed or compensated) and ``actions_last_hour``;
  a job an action is about to act on or acting on (approved, dispatched, running,
  compensating — and, unless asked otherwise, proposed) is ``locked``: the plan leaves it
  as it is. A job a failed move left without GPUs (``displaced_at``) is ``overdue``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from pydantic import ValidationError
from sqlmodel import Session, col, select

from app.actions.models import ACTIVE_ACTION_STATES, Action, ActionKind, ActionState
from app.actions.schedulers import moves_jobs, restarts_gangs
from app.actions.service import HOME_COPY_UNCONFIRMED, NEVER_RAN_WHEN_FAILED, NOT_ON_JOBS, RAN
from app.clusters import service as cluster_service
from app.core.lookup import row_id
from app.forecasts.models import RuntimePredictionCreate, ServiceForecastCreate
from app.gpu_models.models import GpuModel
from app.jobs.models import Allocation, Job
from app.nodes.models import Node
from app.policies.models import SlaPolicy as SlaPolicyRow
from app.policies.models import SpeedProfile
from app.telemetry import service as telemetry_service
from app.telemetry.models import TelemetrySample
from forecast import demand as demand_forecast
from forecast.duration import DurationPredictor, JobFeatures
from solver import instance as si
from wire.telemetry import (
    TERMINAL_JOB_STATES,
    JobShape,
    JobState,
    Metric,
    NodeState,
    SchedulerKind,
)

# Pinned jobs (``required_nodes``) select a label only their nodes carry (``_pin_labels``).
PIN_LABEL = "shaper.io/pinned"
PIN = "true"
FORECAST_STEPS = 6
FORECAST_STEP_S = demand_forecast.STEP_S
FORECAST_HISTORY_DAYS = demand_forecast.HISTORY_DAYS
# One per process: the fits it keeps are what makes a 30 s cycle over hundreds of
# services cheap (see forecast.demand). A fit only changes how the forecast is computed,
# never what the snapshot holds.
FORECASTER = demand_forecast.DemandForecaster()
DURATION_HISTORY_DAYS = 14
DURATION_HISTORY_JOBS = 5000
MIN_DURATION_HISTORY = 20
# A time limit longer than this tells nothing of how long a job runs (a site's padding, a
# partition's "a week"): it still caps the run time, but is neither the run time before
# there is history nor an estimate to learn from.
TELLING_LIMIT_S = DURATION_HISTORY_DAYS * 86_400.0
# Per cluster: the predictor learnt from its finished jobs, and a hash of those: rebuilt
# only when the history has changed (a job finished, an old one aged out).
_DURATIONS: dict[str, tuple[int, Durations]] = {}
# The one place the wire's words become the solver's (``app.diagnosis.history`` reads
# node states through this table too).
NODE_STATES: Mapping[NodeState, si.NodeState] = {
    NodeState.up: si.NodeState.up,
    NodeState.draining: si.NodeState.draining,
    NodeState.down: si.NodeState.down,
}
JOB_SHAPES: Mapping[JobShape, si.JobShape] = {
    JobShape.block: si.JobShape.block,
    JobShape.elastic: si.JobShape.elastic,
}


@dataclass(frozen=True)
class JobRow:
    """One job as the cycle sees it: frozen, so nothing in a solve can change the picture,
    with lists as tuples. Its fields are ``Job`` columns, copied by name (``_job_columns``),
    and what the snapshot derives (``_DERIVED``). The fields stay declared here rather than
    generated from ``Job``: a table row is mutable and holds lists, and the readers
    (``to_instance``, ``app.shaping.review``) and the type checker need them written out."""

    id: int
    external_id: str
    team: str
    kind: str
    shape: str
    priority: int
    gpus_requested: int
    allowed_gpu_models: tuple[str, ...]
    min_gpu_memory_gib: float
    required_precision: str | None
    gang_size: int
    checkpointable: bool
    min_replicas: int
    max_replicas: int
    replicas: int
    submit_time: datetime | None
    start_time: datetime | None
    placement: tuple[tuple[str, tuple[int, ...], int], ...]  # (node, indices, gpus)
    demand_history: tuple[tuple[datetime, float], ...]
    migrations_today: int
    preemptions_today: int
    last_moved_at: datetime | None
    last_acted_at: datetime | None = None
    actions_last_hour: int = 0
    required_nodes: tuple[str, ...] = ()
    time_limit_s: float | None = None
    replicas_movable: bool = False
    speeds: tuple[tuple[str, float], ...] = ()  # (model, the job's own speed there), sorted
    queue: str = "default"
    # An action of an open plan acts on it: approved or in flight (busy), or proposed.
    busy: bool = False
    proposed: bool = False
    displaced: bool = False


# JobRow's fields that are not Job columns; every other field is copied from the job.
_DERIVED = frozenset(
    {
        "placement",
        "demand_history",
        "migrations_today",
        "preemptions_today",
        "last_moved_at",
        "last_acted_at",
        "actions_last_hour",
        "busy",
        "proposed",
        "displaced",
    }
)
_JOB_COLUMNS = tuple(f.name for f in fields(JobRow) if f.name not in _DERIVED)


def _job_columns(job: Job) -> dict[str, Any]:
    """The job's columns that JobRow holds, lists frozen to tuples. A name here that ``Job``
    no longer has fails loudly (AttributeError) instead of leaving a default."""
    values = {name: getattr(job, name) for name in _JOB_COLUMNS}
    return {
        k: tuple(v)
        if isinstance(v, list)
        else tuple(sorted(v.items()))
        if isinstance(v, dict)
        else v
        for k, v in values.items()
    }


@dataclass(frozen=True)
class FinishedJob:
    """A block job that finished: what a run-time prediction learns from."""

    team: str
    kind: str
    gpus: int
    runtime_s: float
    ended_at: datetime
    time_limit_s: float | None = None


@dataclass(frozen=True)
class ClusterSnapshot:
    cluster: str
    cluster_id: int
    mode: str
    policy: str
    scheduler: str
    taken_at: datetime
    gpu_models: tuple[GpuModel, ...]
    nodes: tuple[Node, ...]
    jobs: tuple[JobRow, ...]
    sla: dict[str, Any]
    finished: tuple[FinishedJob, ...] = ()  # oldest first

    @property
    def job_by_id(self) -> dict[int, JobRow]:
        return {job.id: job for job in self.jobs}


def take_snapshot(
    *, session: Session, cluster_name: str, now: datetime, sla_policy: str | None = None
) -> ClusterSnapshot:
    cluster = cluster_service.get_cluster(session=session, name=cluster_name)
    nodes = tuple(session.exec(select(Node).where(Node.cluster_id == cluster.id)).all())
    node_names = {n.id: n.name for n in nodes}
    jobs = [
        j
        for j in session.exec(select(Job).where(Job.cluster_id == cluster.id))
        if j.state not in TERMINAL_JOB_STATES and j.gpus_requested > 0
    ]
    job_ids = [row_id(j) for j in jobs]
    placements: dict[int, list[tuple[str, tuple[int, ...], int]]] = {}
    if job_ids:
        open_allocations = session.exec(
            select(Allocation).where(
                col(Allocation.job_id).in_(job_ids),
                col(Allocation.released_at).is_(None),
            )
        )
        for allocation in open_allocations:
            placements.setdefault(allocation.job_id, []).append(
                (
                    node_names[allocation.node_id],
                    tuple(allocation.gpu_indices),
                    allocation.gpu_count,
                )
            )
    elastic = [jid for j, jid in zip(jobs, job_ids, strict=True) if j.shape == JobShape.elastic]
    demand = _demand_history(session, elastic, now)
    moves = _moves_today(session, job_ids, now)
    acted = _acted(session, job_ids, now)
    open_actions = _open_actions(session, job_ids)
    rows = tuple(
        JobRow(
            **_job_columns(j),
            placement=tuple(sorted(placements.get(jid, []))),
            demand_history=tuple(demand.get(jid, [])),
            migrations_today=moves.get((jid, ActionKind.migrate), (0, None))[0],
            preemptions_today=moves.get((jid, ActionKind.preempt), (0, None))[0],
            last_moved_at=_last_moved(moves, jid, j.shape),
            last_acted_at=acted.get(jid, (None, 0))[0],
            actions_last_hour=acted.get(jid, (None, 0))[1],
            busy=ActionState.approved in open_actions.get(jid, ()),
            proposed=ActionState.proposed in open_actions.get(jid, ()),
            displaced=j.displaced_at is not None,
        )
        for j, jid in zip(jobs, job_ids, strict=True)
    )
    policy_name = sla_policy or cluster.name
    sla_row = session.exec(
        select(SlaPolicyRow)
        .where(SlaPolicyRow.name == policy_name)
        .order_by(col(SlaPolicyRow.version).desc())
    ).first()
    if sla_row is not None and sla_row.deleted:
        sla_row = None  # a deleted policy applies no more: the defaults do
    return ClusterSnapshot(
        cluster=cluster.name,
        cluster_id=row_id(cluster),
        mode=cluster.mode,
        policy=cluster.policy,
        scheduler=cluster.scheduler,
        taken_at=now,
        gpu_models=tuple(session.exec(select(GpuModel)).all()),
        nodes=nodes,
        jobs=rows,
        sla=sla_row.spec if sla_row else {},
        finished=_finished_jobs(session, row_id(cluster), now),
    )


def _finished_jobs(session: Session, cluster_id: int, now: datetime) -> tuple[FinishedJob, ...]:
    """The cluster's block jobs that finished (not failed or cancelled: their run time says
    nothing of how long the work takes) in the last ``DURATION_HISTORY_DAYS`` days, at
    most the ``DURATION_HISTORY_JOBS`` latest."""
    query = (
        sa.select(
            col(Job.team),
            col(Job.kind),
            col(Job.gpus_requested),
            col(Job.start_time),
            col(Job.end_time),
            col(Job.time_limit_s),
        )
        .where(
            col(Job.cluster_id) == cluster_id,
            col(Job.state) == JobState.finished.value,
            col(Job.shape) == JobShape.block.value,
            col(Job.start_time).is_not(None),
            col(Job.end_time) >= now - timedelta(days=DURATION_HISTORY_DAYS),
        )
        .order_by(col(Job.end_time).desc())
        .limit(DURATION_HISTORY_JOBS)
    )
    rows = [
        FinishedJob(
            team=team,
            kind=str(kind),
            gpus=gpus,
            runtime_s=max(0.0, (end - start).total_seconds()),
            ended_at=end,
            time_limit_s=limit,
        )
        for team, kind, gpus, start, end, limit in session.execute(query)
    ]
    return tuple(reversed(rows))


def _demand_history(
    session: Session, job_ids: list[int], now: datetime
) -> dict[int, list[tuple[datetime, float]]]:
    """Per service: the hourly mean demand of the complete hours of the last
    ``FORECAST_HISTORY_DAYS`` days (one point per hour, at its start), then every sample of
    the current hour. Means are taken in the database: a week of 30-second samples of
    hundreds of services would be millions of rows a cycle."""
    if not job_ids:
        return {}
    hour_start = now.replace(minute=0, second=0, microsecond=0)
    since = hour_start - timedelta(days=FORECAST_HISTORY_DAYS)
    history = telemetry_service.hourly_demand(
        session=session, job_ids=job_ids, since=since, until=hour_start, step_s=FORECAST_STEP_S
    )
    is_demand = sa.and_(
        col(TelemetrySample.job_id).in_(job_ids),
        col(TelemetrySample.metric) == Metric.demand_replicas.value,
    )
    recent = (
        sa.select(col(TelemetrySample.job_id), col(TelemetrySample.at), col(TelemetrySample.value))
        .where(is_demand, col(TelemetrySample.at) >= hour_start)
        .order_by(col(TelemetrySample.at))
    )
    for job_id, at, value in session.execute(recent):
        history.setdefault(job_id, []).append((at, value))
    return history


def _moves_today(
    session: Session, job_ids: list[int], now: datetime
) -> dict[tuple[int, str], tuple[int, datetime | None]]:
    if not job_ids:
        return {}
    query = (
        sa.select(
            col(Action.job_id),
            col(Action.kind),
            sa.func.count(),
            sa.func.max(Action.updated_at),
        )
        .where(
            col(Action.job_id).in_(job_ids),
            col(Action.state) == ActionState.succeeded.value,
            col(Action.updated_at) >= now - timedelta(days=1),
        )
        .group_by(col(Action.job_id), col(Action.kind))
    )
    return {
        (job_id, kind): (int(count), last) for job_id, kind, count, last in session.execute(query)
    }


def _last_moved(
    moves: dict[tuple[int, str], tuple[int, datetime | None]], job_id: int, shape: str
) -> datetime | None:
    """When the job last moved: a migration, or an elastic training job's resize (a
    restart at another size, which ``migration_cooldown_s`` keeps from being undone at the
    next cycle); a service's resize is not a move."""
    kinds = (
        [ActionKind.migrate]
        if shape == JobShape.elastic
        else [ActionKind.migrate, ActionKind.resize]
    )
    times = [t for kind in kinds if (t := moves.get((job_id, kind), (0, None))[1]) is not None]
    return max(times, default=None)


def _acted(
    session: Session, job_ids: list[int], now: datetime
) -> dict[int, tuple[datetime | None, int]]:
    """Per job: when Shaper's last action on it ended (dwell), and how many ended in the
    last hour (move budget). A start that failed never ran the job: it starts no dwell,
    but it counts against the budget, so a start that keeps failing is not retried every
    cycle."""
    if not job_ids:
        return {}
    ended = sa.func.coalesce(Action.finished_at, Action.updated_at)
    never_ran = sa.and_(
        col(Action.state) == ActionState.failed.value,
        col(Action.kind).in_([k.value for k in NEVER_RAN_WHEN_FAILED]),
    )
    query = (
        sa.select(
            col(Action.job_id),
            sa.func.max(sa.case((never_ran, None), else_=ended)),
            sa.func.sum(sa.case((ended >= now - timedelta(hours=1), 1), else_=0)),
        )
        .where(
            col(Action.job_id).in_(job_ids),
            col(Action.kind).not_in([k.value for k in NOT_ON_JOBS]),
            col(Action.state).in_([s.value for s in RAN]),
            ended >= now - timedelta(days=1),
        )
        .group_by(col(Action.job_id))
    )
    return {job_id: (last, int(count or 0)) for job_id, last, count in session.execute(query)}


def _open_actions(session: Session, job_ids: list[int]) -> dict[int, set[ActionState]]:
    """Per job: ``approved`` when an action is about to act or acting on it, ``proposed``
    when one waits for a decision."""
    if not job_ids:
        return {}
    query = sa.select(col(Action.job_id), col(Action.state)).where(
        col(Action.job_id).in_(job_ids),
        col(Action.state).in_([s.value for s in (*ACTIVE_ACTION_STATES, ActionState.proposed)]),
    )
    found: dict[int, set[ActionState]] = {}
    for job_id, state in session.execute(query):
        bucket = ActionState.proposed if state == ActionState.proposed else ActionState.approved
        found.setdefault(job_id, set()).add(bucket)
    # A job moved to another cluster whose home copy's cancel an operator gave up on
    # (app.actions.service.abandon): the copy may come back held, and starting it would run
    # the job twice, so it stays locked (left as it is) for good.
    moved_away = sa.select(col(Action.job_id)).where(
        col(Action.job_id).in_(job_ids),
        col(Action.kind) == ActionKind.move.value,
        col(Action.state) == ActionState.failed.value,
        col(Action.error).contains(HOME_COPY_UNCONFIRMED),
    )
    for (job_id,) in session.execute(moved_away):
        found.setdefault(job_id, set()).add(ActionState.approved)
    return found


def solver_node_name(cluster: str, node: str) -> str:
    return f"{cluster}/{node}"


def solver_job_id(cluster: str, external_id: str) -> str:
    return f"{cluster}/{external_id}"


def to_instance(
    snapshot: ClusterSnapshot,
    *,
    config: si.SolverConfig | None = None,
    lock_proposed: bool = True,
    forecaster: demand_forecast.DemandForecaster | None = None,
    known_models: frozenset[str] | None = None,
) -> si.Instance:
    """lock_proposed: whether jobs of undecided proposals are locked too (False when the
    cycle asks what a fresh plan would do instead of the open proposal). forecaster: the
    services' demand forecaster, ``FORECASTER`` unless given. known_models: the GPU models
    a job's allowed models are kept among (default: those of this cluster's nodes; a
    federation group's plan passes the group's, so a job may ask for one only another
    member has)."""
    model_by_id = {m.id: m for m in snapshot.gpu_models}
    used_models = (
        set(known_models)
        if known_models is not None
        else {
            model_by_id[n.gpu_model_id].name for n in snapshot.nodes if n.gpu_model_id is not None
        }
    )
    gpu_models = tuple(
        si.GpuModel(
            name=m.name,
            memory_mib=int(m.memory_gib * 1024),
            precisions=frozenset(m.precisions),
            speed=m.relative_speed,
        )
        for m in snapshot.gpu_models
    )
    pins = _pin_labels(snapshot.jobs)
    nodes = tuple(
        si.Node(
            name=solver_node_name(snapshot.cluster, n.name),
            cluster=snapshot.cluster,
            gpu_model=model_by_id[n.gpu_model_id].name,
            gpus=n.gpu_count,
            cpu_milli=n.cpu_cores * 1000,
            memory_mib=n.memory_mib,
            labels={**n.labels, **{key: PIN for pinned, key in pins.items() if n.name in pinned}},
            state=NODE_STATES[n.state],
        )
        for n in snapshot.nodes
        if n.gpu_model_id is not None and n.gpu_count > 0
    )
    known_nodes = {n.name for n in nodes}
    now = snapshot.taken_at.timestamp()
    forecaster = forecaster or FORECASTER
    targets = {s["service"]: s.get("demand_target") for s in snapshot.sla.get("services", [])}
    durations = _duration_predictor(snapshot)
    runtimes = {
        row.id: runtime
        for row in snapshot.jobs
        if row.shape != JobShape.elastic
        and (runtime := _expected_runtime(row, now, durations)) is not None
    }
    forecasts = {
        row.id: _forecast(
            row,
            now,
            forecaster=forecaster,
            key=solver_job_id(snapshot.cluster, row.external_id),
            quantile=demand_forecast.quantile_for(targets.get(row.external_id)),
        )
        for row in snapshot.jobs
        if row.shape == JobShape.elastic
    }
    # A scheduler that cannot be told where a job goes (Kueue, Ray): a planned move within
    # the cluster could only fail, after its checkpoint had stopped the job. Per job, so
    # that a federation group's one solve keeps migrating within its other members.
    pinnable = moves_jobs(snapshot.scheduler)
    # A job on several nodes moves only whole, by a restart pinned to its new nodes, and
    # only where the scheduler does that (app.actions.schedulers).
    gangs_move = pinnable and restarts_gangs(snapshot.scheduler)
    jobs = tuple(
        job
        for row in snapshot.jobs
        if (
            job := _solver_job(
                snapshot.cluster,
                row,
                now,
                known_nodes,
                used_models,
                lock_proposed,
                pins,
                forecasts.get(row.id, ()),
                runtimes.get(row.id),
                migratable=pinnable,
                gangs_move=gangs_move,
            )
        )
        is not None
    )
    teams = snapshot.sla.get("teams", [])
    policies = tuple(
        si.SlaPolicy(
            team=t["team"],
            priority_weight=t.get("priority_weight", 1.0),
            guaranteed_gpus=t.get("guaranteed_gpus", 0),
            borrowing_limit=t.get("borrowing_limit_gpus"),
            max_queue_wait_s=t.get("max_queue_wait_s"),
            preemptible=t.get("preemptible", True),
            max_migrations_per_day=t.get("max_migrations_per_day"),
        )
        for t in teams
    )
    # A service's replicas move only where its connector can choose which of them leave a
    # node (JobReport.replicas_movable: the resize step names the nodes, and the replicas
    # come back where the scheduler puts them once the work they made room for runs,
    # solver.dependencies.split_replica_moves), and none so that a service keeps fewer
    # than max(1, min_replicas) replicas meanwhile (``replica_moves_shrink_first``); the
    # others' flag keeps them where they are. Off when no service can: the cluster's plans
    # stay those it had before.
    # (Not on a scheduler that cannot be told where a job goes: its services never move.)
    movable = pinnable and any(
        row.replicas_movable for row in snapshot.jobs if row.shape == JobShape.elastic
    )
    config = config or si.SolverConfig()
    config = config.model_copy(
        update={
            "replica_moves": movable and config.replica_moves,
            "replica_moves_shrink_first": True,
        }
    )
    if not pinnable:
        # Planned alone, its jobs' flag says as much; the config says it too, so that the
        # cluster's plans stay byte for byte those it had before the flag (with migration
        # on, the greedy would still look for moves and find none).
        config = config.model_copy(update={"migration": False, "cp_sat_migration": False})
    return si.Instance(
        now=now,
        gpu_models=gpu_models,
        nodes=nodes,
        jobs=jobs,
        policies=policies,
        config=config,
        one_replica_per_node=_one_per_node(snapshot.scheduler, jobs),
        speeds=_own_speeds(snapshot, jobs, {m.name: m.speed for m in gpu_models}),
    )


def _own_speeds(
    snapshot: ClusterSnapshot, jobs: tuple[si.Job, ...], catalogue: dict[str, float]
) -> dict[str, dict[str, float]]:
    """Block jobs' speeds on the catalogue's models (``catalogue``: name → relative speed;
    a model taken out of it since is left out): a job's own (JobReport.speeds, what its
    owner wrote), scaled by :func:`within_catalogue`; else those of the first speed
    profile of the SLA policy that matches it (``SpeedProfile``: the site's, as written)."""
    block = {job.id for job in jobs if job.shape is si.JobShape.block}
    profiles = _speed_profiles(snapshot.sla)
    speeds = {}
    for row in snapshot.jobs:
        job_id = solver_job_id(snapshot.cluster, row.external_id)
        if job_id not in block:
            continue
        own = {model: speed for model, speed in row.speeds if model in catalogue}
        if own:
            speeds[job_id] = within_catalogue(own, catalogue)
            continue
        profile = next(
            (p for p in profiles if p.matches(kind=row.kind, team=row.team, queue=row.queue)),
            None,
        )
        site = {m: v for m, v in profile.speeds.items() if m in catalogue} if profile else {}
        if site:
            speeds[job_id] = site
    return speeds


def _speed_profiles(sla: dict[str, Any]) -> list[SpeedProfile]:
    """The SLA policy's speed profiles; none from a stored spec today's model refuses (an
    older schema: its terms are read as far as they still mean something)."""
    try:
        return [SpeedProfile.model_validate(p) for p in sla.get("speed_profiles") or ()]
    except ValidationError:
        return []


def within_catalogue(own: dict[str, float], catalogue: dict[str, float]) -> dict[str, float]:
    """A job's own speeds, all scaled by one factor so that none is above its model's
    catalogue speed. A job's owner writes them, and the plan values a GPU-hour at the
    job's speed: taken as written, a job that said it runs at 100 on the H100s would go
    there before every job of a higher priority. Scaled, they keep what they say of how
    the job's speed differs between models (their ratios: which model it gains on, and
    how much) and can only lower its value below the catalogue's, never raise it: speeds
    at or below the catalogue's are planned as written, and a job that says it runs at
    100 everywhere is planned everywhere at the catalogue's speed of the slowest model it
    names. (The simulator's speeds are measured, Gavel's, and taken as they
    are.)"""
    scale = min(1.0, *(catalogue[model] / speed for model, speed in own.items()))
    return {model: speed * scale for model, speed in own.items()}


def _one_per_node(scheduler: str, jobs: tuple[si.Job, ...]) -> frozenset[str]:
    """Slurm's multi-node jobs (rigid gangs and elastic training): Slurm runs a job's GRES
    per node on each of its nodes, so each replica (a node's share) needs a node of its
    own; a running one that holds other than one replica per node is left out (nothing
    moves it, and the rule would call where it is wrong)."""
    if scheduler != SchedulerKind.slurm:
        return frozenset()
    return frozenset(
        job.id
        for job in jobs
        if job.shape is si.JobShape.block
        and (job.replicas > 1 or job.is_resizable)
        and all(gpus == job.gpus_per_replica for gpus in job.placement.values())
    )


def _pin_labels(jobs: tuple[JobRow, ...]) -> dict[frozenset[str], str]:
    """A label key for each set of nodes some pending job is pinned to. The nodes of a set
    carry its label and the job selects it: only those nodes form their own compatibility
    groups, so pins cost the solver nothing where there are none."""
    sets = sorted({frozenset(j.required_nodes) for j in jobs if j.required_nodes}, key=sorted)
    return {pinned: f"{PIN_LABEL}-{index}" for index, pinned in enumerate(sets)}


def _solver_job(
    cluster: str,
    row: JobRow,
    now: float,
    known_nodes: set[str],
    models: set[str],
    lock_proposed: bool = True,
    pins: dict[frozenset[str], str] | None = None,
    forecast: tuple[int, ...] = (),
    runtime: float | None = None,
    *,
    migratable: bool = True,
    gangs_move: bool = True,
) -> si.Job | None:
    placement: dict[str, int] = {}
    indices: dict[str, tuple[int, ...]] = {}
    for node, node_indices, gpus in row.placement:
        name = solver_node_name(cluster, node)
        if name not in known_nodes or gpus <= 0:
            continue
        placement[name] = placement.get(name, 0) + gpus
        indices[name] = tuple(sorted(indices.get(name, ()) + node_indices))
    shape = JOB_SHAPES[JobShape(row.shape)]
    elastic = shape is si.JobShape.elastic
    if elastic:
        per_replica = max(row.gpus_requested, 1)
        held = sum(placement.values())
        if held % per_replica:
            placement, indices = {}, {}  # a partial replica cannot be represented: treat as pending
        replicas = held // per_replica if placement else row.replicas
    elif placement:
        # What it holds, in the largest replica size that divides every node's share.
        per_replica = math.gcd(*placement.values())
        replicas = sum(placement.values()) // per_replica
    elif row.gang_size > 1 and row.gpus_requested % row.gang_size == 0:
        per_replica, replicas = row.gpus_requested // row.gang_size, row.gang_size
    else:
        per_replica, replicas = row.gpus_requested, 1
    training_range = None if elastic else _training_range(row, placement)
    if training_range is not None:
        per_replica, replicas = training_range
    allowed = frozenset(row.allowed_gpu_models) & models if row.allowed_gpu_models else None
    return si.Job(
        id=solver_job_id(cluster, row.external_id),
        team=row.team,
        shape=shape,
        priority=1.0 + row.priority / 10,
        gpus_per_replica=max(per_replica, 1),
        replicas=max(replicas, 0),
        max_nodes=_node_limit(row, elastic, training_range),
        allowed_gpu_models=allowed,
        gpu_memory_mib=int(row.min_gpu_memory_gib * 1024),
        precision=row.required_precision,
        node_selector=(
            {(pins or {})[frozenset(row.required_nodes)]: PIN}
            if row.required_nodes and not placement
            else {}
        ),
        clusters=frozenset({cluster}),
        submit_time=row.submit_time.timestamp() if row.submit_time else now,
        start_time=row.start_time.timestamp() if row.start_time and placement else None,
        placement=placement,
        gpu_indices=indices or None,
        expected_runtime_s=runtime,
        checkpointable=row.checkpointable,
        # A service: whether its replicas may move (solver.greedy.defragmentation): only
        # where its connector can choose which leave a node. A rigid job on several nodes:
        # only where its scheduler restarts it pinned to others (gangs_move); an elastic
        # training job changes nodes by its resizes, which its connector carries out.
        migratable=migratable
        and (
            row.replicas_movable
            if elastic
            else len(placement) <= 1 or gangs_move or training_range is not None
        ),
        last_moved_at=row.last_moved_at.timestamp() if row.last_moved_at else None,
        migrations_today=row.migrations_today,
        preemptions_today=row.preemptions_today,
        last_acted_at=row.last_acted_at.timestamp() if row.last_acted_at else None,
        actions_last_hour=row.actions_last_hour,
        locked=row.busy or (lock_proposed and row.proposed),
        # A job a failed move left without GPUs goes first (not while it runs again).
        overdue=row.displaced and not placement,
        min_replicas=row.min_replicas if elastic or training_range else 0,
        max_replicas=(row.max_replicas or None) if elastic or training_range else None,
        forecast=forecast if elastic else (),
        forecast_step_s=FORECAST_STEP_S,
        # Step k is the k-th hour after the one the cycle runs in (``_forecast``).
        forecast_origin=math.floor(now / FORECAST_STEP_S) * FORECAST_STEP_S if elastic else None,
    )


def _training_range(row: JobRow, placement: dict[str, int]) -> tuple[int, int] | None:
    """An elastic training job's GPUs per replica and the replicas it asks for (its
    ``replicas``, within its range; Slurm: a node's GPUs, and nodes); None for a rigid
    job, or one whose report does not add up (GPUs not a whole number of replicas on
    every node, or holding a count outside its range): planned as it is rather than
    resized on a guess (and never a job the solver's checks would refuse, which would
    stop the cycle)."""
    low, high = row.min_replicas, row.max_replicas
    if not 1 <= low <= high or high < 2 or row.gang_size < 1:
        return None
    per_replica, rest = divmod(row.gpus_requested, row.gang_size)
    if per_replica < 1 or rest:
        return None
    if any(gpus % per_replica for gpus in placement.values()):
        return None  # a node with part of a replica
    held = sum(placement.values()) // per_replica
    if placement and not low <= held <= high:
        return None
    return per_replica, min(max(row.replicas, low), high)


def _node_limit(row: JobRow, elastic: bool, training_range: tuple[int, int] | None) -> int | None:
    """A gang's nodes: a rigid one's ``gang_size``; an elastic training job's replicas
    (one node each at the size it asks, as Slurm runs them); none for a service."""
    if elastic:
        return None
    if training_range is not None:
        return training_range[1]
    return row.gang_size if row.gang_size > 1 else None


@dataclass(frozen=True)
class Durations:
    """The run-time predictor of a cluster, learnt from its finished jobs. ``estimates``:
    enough of those jobs had a telling time limit (``MIN_DURATION_HISTORY``) for the
    limit to be learnt as the user's estimate (forecast.duration learns actual / estimate,
    so padded limits still predict); else limits are left out of the prediction — a group
    of estimated jobs learnt from a handful would predict from those alone — and only
    cap it (:func:`_expected_runtime`)."""

    predictor: DurationPredictor
    estimates: bool

    def predict(self, team: str, kind: object, gpus: int, limit: float | None) -> float:
        return self.predictor.predict(self.features(team, kind, gpus, limit))

    def features(self, team: str, kind: object, gpus: int, limit: float | None) -> JobFeatures:
        estimate = _telling(limit) if self.estimates else None
        return JobFeatures(team=team, kind=str(kind), gpus=gpus, estimate_s=estimate)


def _telling(limit: float | None) -> float | None:
    return limit if limit is not None and limit <= TELLING_LIMIT_S else None


def _duration_predictor(snapshot: ClusterSnapshot) -> Durations | None:
    finished = snapshot.finished
    if len(finished) < MIN_DURATION_HISTORY:
        return None
    key = hash(finished)
    cached = _DURATIONS.get(snapshot.cluster)
    if cached is not None and cached[0] == key:
        return cached[1]
    with_limits = sum(1 for job in finished if _telling(job.time_limit_s) is not None)
    durations = Durations(DurationPredictor(), estimates=with_limits >= MIN_DURATION_HISTORY)
    for job in finished:
        features = durations.features(job.team, job.kind, job.gpus, job.time_limit_s)
        durations.predictor.observe(features, job.runtime_s)
    _DURATIONS[snapshot.cluster] = (key, durations)
    return durations


def _expected_runtime(row: JobRow, now: float, durations: Durations | None) -> float | None:
    """Walltime from the job's start (running) or of the whole job (pending): the
    prediction (a running job past it: as long again as it has run), at most the job's
    time limit; without a predictor, a telling limit alone (``TELLING_LIMIT_S``); else
    None."""
    limit = row.time_limit_s
    expected: float | None = _telling(limit)
    if durations is not None:
        expected = durations.predict(row.team, row.kind, row.gpus_requested, limit)
    if expected is not None and row.start_time is not None and row.placement:
        elapsed = max(0.0, now - row.start_time.timestamp())
        if expected <= elapsed:
            expected = 2 * elapsed
        if limit is not None:
            # Its scheduler ends it at its limit; one past it (a grace period) ends now.
            return max(elapsed, min(expected, limit))
    if expected is not None and limit is not None:
        return min(expected, limit)
    return expected


def _forecast(
    row: JobRow,
    now: float,
    *,
    forecaster: demand_forecast.DemandForecaster,
    key: str,
    quantile: float,
) -> tuple[int, ...]:
    """Step 0: the latest demand (now is observed, not forecast); steps 1…: the forecast's
    ``quantile`` for each future hour. The hourly series ends with the last complete hour,
    so the hour ``now`` falls in is its first step ahead and step k its (k+1)-th."""
    if not row.demand_history:
        return (row.replicas,)
    latest = row.demand_history[-1][1]
    series = _hourly(row, now)
    if not series:
        return (max(0, math.ceil(latest)),)
    ahead = forecaster.forecast(key, series, FORECAST_STEPS, now=now, quantile=quantile)
    steps = [latest, *ahead.upper[1:FORECAST_STEPS]]
    # The solver clamps to the service's range anyway; clamped here first so that a wild
    # sample (1e300 replicas) cannot overflow ceil() and stop the cycle.
    cap = max(row.max_replicas, row.replicas, 1)
    return tuple(max(0, math.ceil(min(v, cap) - 1e-9)) if math.isfinite(v) else cap for v in steps)


def _hourly(row: JobRow, now: float) -> list[float]:
    """The service's hourly mean demand, oldest first, up to the last complete hour."""
    samples = [(at.timestamp(), value) for at, value in row.demand_history]
    return demand_forecast.hourly_series(samples, end=now, step_s=FORECAST_STEP_S)


def service_forecasts(
    snapshot: ClusterSnapshot,
    *,
    job_ids: set[int] | None = None,
    forecaster: demand_forecast.DemandForecaster | None = None,
) -> list[ServiceForecastCreate]:
    """What the cycle forecasts each service's demand (of ``job_ids``, default all, that
    have a demand history) to be in each hour the solver looks ahead to: step k (1 …
    ``FORECAST_STEPS`` − 1) is the forecast's (k+1)-th step (its first is the current
    hour), the hour k after the one the cycle runs in (lead k h), with the seasonal-naive
    forecast of that hour from the same history. The same forecast ``to_instance`` plans
    with, from the same fit: the forecaster hands back the forecast it keeps for an
    unchanged series, so asking again costs nothing. A non-finite step is left out
    (nothing to score)."""
    forecaster = forecaster or FORECASTER
    now = snapshot.taken_at.timestamp()
    targets = {s["service"]: s.get("demand_target") for s in snapshot.sla.get("services", [])}
    hour_start = snapshot.taken_at.replace(minute=0, second=0, microsecond=0)
    found: list[ServiceForecastCreate] = []
    for row in snapshot.jobs:
        if row.shape != JobShape.elastic or (job_ids is not None and row.id not in job_ids):
            continue
        series = _hourly(row, now) if row.demand_history else []
        if not series:
            continue
        ahead = forecaster.forecast(
            solver_job_id(snapshot.cluster, row.external_id),
            series,
            FORECAST_STEPS,
            now=now,
            quantile=demand_forecast.quantile_for(targets.get(row.external_id)),
        )
        naive = demand_forecast.seasonal_naive(series, FORECAST_STEPS)
        for lead in range(1, FORECAST_STEPS):
            values = (ahead.mean[lead], ahead.upper[lead], naive[lead])
            if not all(math.isfinite(v) for v in values):
                continue
            found.append(
                ServiceForecastCreate(
                    job_id=row.id,
                    target_hour=hour_start + timedelta(seconds=lead * FORECAST_STEP_S),
                    mean=ahead.mean[lead],
                    upper=ahead.upper[lead],
                    quantile=ahead.quantile,
                    method=ahead.method,
                    naive=naive[lead],
                    lead_h=lead,
                )
            )
    return found


def runtime_predictions(
    snapshot: ClusterSnapshot, *, job_ids: set[int] | None = None
) -> list[RuntimePredictionCreate]:
    """The run time ``forecast.duration`` predicts for each block job (of ``job_ids``,
    default all), from its start to its end whatever it has run so far, and the naive
    prediction: the median run time of its team's finished jobs (the cluster's when the
    team has none). None while the cluster has too few finished jobs to predict from
    (``MIN_DURATION_HISTORY``): ``to_instance`` then takes a telling time limit as the run
    time, which is no prediction to score. Uncapped by the limit: the predictor's own."""
    durations = _duration_predictor(snapshot)
    if durations is None:
        return []
    rows = [
        row
        for row in snapshot.jobs
        if row.shape != JobShape.elastic and (job_ids is None or row.id in job_ids)
    ]
    if not rows:
        return []
    by_team: dict[str, list[float]] = {}
    for job in snapshot.finished:
        by_team.setdefault(job.team, []).append(job.runtime_s)
    overall = statistics.median(job.runtime_s for job in snapshot.finished)
    medians = {team: statistics.median(values) for team, values in by_team.items()}
    return [
        RuntimePredictionCreate(
            job_id=row.id,
            predicted_s=durations.predict(row.team, row.kind, row.gpus_requested, row.time_limit_s),
            naive_s=medians.get(row.team, overall),
        )
        for row in rows
    ]
