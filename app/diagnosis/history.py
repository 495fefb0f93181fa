"""A cluster's stored history over a window, replayed as the idle-GPU classifier's states:
``[(start, end, ClusterAt), …]``, each held constant between two changes.

What is read, and what each piece becomes (``solver.diagnosis.state``):

* nodes: today's rows (node history is not kept, as in ``app.utilization``): a node down
  now is down for the whole window. A node without a GPU model counts as model ``none``.
* allocations: every interval that overlaps the window; its busy fraction in a bucket is
  the mean of the ``gpu_util`` samples of its GPUs there (per-GPU samples where the agent
  sends them, else the node's), None (counted busy) without samples.
* elastic services: GPUs held above ``ceil(mean demand_replicas of the bucket)`` replicas
  are held above demand (``reservation``); without a demand sample, none are.
* the queue: a block job with GPUs is queued from its submit time until it ends (its end
  time, else its last update when it is finished) whenever it holds no allocation — before
  its first start and after a preemption. A job without a submit time is never queued.
  A gang of ``gang_size`` that divides its GPUs is that many members; any other job is one.
* quota: the cluster's SLA policy (named after it, as the shaping cycle reads it), the
  version in force at each instant; caps are ``guaranteed + borrowing limit``.

* plans' reservations (``app.diagnosis.reservations``, which says which timestamps bound
  each): a ``reserve`` that succeeded counts its GPUs on each target node as the node's
  ``reserved_gpus`` (``reserved_for``: the job's team; None when reservations of several
  teams share the node) from when it took effect until it was given back, replaced,
  spent by its job's start there, its job or its plan ended, or it lapsed. The classifier
  counts them (``reservation``) only up to the node's free GPUs.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import datetime
from itertools import pairwise

import sqlalchemy as sa
from sqlmodel import Session, col

from app.core.db import load_json
from app.diagnosis.reservations import Reserved, reservations
from app.gpu_models.models import GpuModel
from app.jobs.models import Allocation, Job
from app.nodes.models import Node
from app.policies.models import SlaPolicy
from app.shaping.snapshot import NODE_STATES
from app.telemetry.models import TelemetrySample
from solver import instance as si
from solver.diagnosis import AllocationAt, ClusterAt, NodeAt, QueuedJobAt
from wire.telemetry import TERMINAL_JOB_STATES, JobShape, Metric

NO_MODEL = "none"


@dataclass(frozen=True, slots=True)
class _Held:
    job_id: int
    node_id: int
    gpus: int
    indices: tuple[int, ...]
    start: float
    end: float


@dataclass(frozen=True, slots=True)
class _Lifetime:
    job_id: int
    team: str
    elastic: bool
    gpus_per_replica: int
    queued_as: QueuedJobAt | None  # None: never queued (a service, no GPUs)
    submit: float
    end: float


@dataclass(frozen=True, slots=True)
class Window:
    cluster_id: int
    cluster: str
    since: datetime
    until: datetime
    bucket_s: int
    busy_threshold: float

    def bucket(self, t: float) -> int:
        return int((t - self.since.timestamp()) // self.bucket_s)


def replay(session: Session, window: Window) -> Iterator[tuple[float, float, ClusterAt]]:
    """The cluster's states over the window, in time order, each with its interval.

    A sweep over the change points: what starts is added as time passes it, what ended is
    dropped. Each part of the state (the nodes with their reservations, the allocations of
    the bucket, the queue, the caps) is built again only when what it is made of changed,
    and a state equal to the one before is yielded as that same object, so that a caller
    classifies it once (``service``). The queue holds each distinct queued job once: the
    classifier answers jobs alike alike, so 80,000 waiting jobs of a few shapes are those
    few shapes, and a job that joins a shape already waiting changes nothing.
    """
    nodes, node_names = _nodes(session, window)
    held = _allocations(session, window)
    lives = _lifetimes(session, window)
    busy = _busy_means(session, window)
    demand = _demand_means(session, window)
    caps = _quota_caps(session, window)
    reserved = reservations(
        session, cluster_id=window.cluster_id, since=window.since, until=window.until
    )

    since, until = window.since.timestamp(), window.until.timestamp()
    points = {since, until}
    points |= {since + k * window.bucket_s for k in range(1, window.bucket(until) + 1)}
    points |= {t for h in held for t in (h.start, h.end)}
    points |= {t for life in lives.values() for t in (life.submit, life.end)}
    points |= {at for at, _ in caps}
    points |= {t for r in reserved for t in (r.start, r.end)}
    times = sorted(t for t in points if since <= t <= until)

    # What is in force at t: start <= t < end. Added in order of start (the allocations'
    # order, which the classifier reads per node, is kept), dropped in order of end.
    by_start = sorted(held, key=lambda h: h.start)
    allocations = _Sweep([(h.start, h.end) for h in by_start])
    queued = sorted((life for life in lives.values() if life.queued_as), key=lambda j: j.submit)
    waits = _Sweep([(life.submit, life.end) for life in queued])
    holds = _Sweep([(r.start, r.end) for r in reserved])
    # Each queued job as the index of its shape (QueuedJobAt, interned): the queue is the
    # shapes with at least one job waiting and holding nothing.
    shapes: dict[QueuedJobAt, int] = {}
    shape_of = [shapes.setdefault(life.queued_as, len(shapes)) for life in queued if life.queued_as]
    by_index = list(shapes)
    job_index = {life.job_id: i for i, life in enumerate(queued)}
    holding: Counter[int] = Counter()  # job → its allocations in force
    waiting_by_shape: Counter[int] = Counter()
    counted: set[int] = set()  # queued jobs counted in waiting_by_shape

    state: ClusterAt | None = None
    nodes_now = nodes
    allocations_now: tuple[AllocationAt, ...] = ()
    queue_now: tuple[QueuedJobAt, ...] = ()
    caps_now: dict[str, int] = {}
    bucket_now: int | None = None
    for start, end in pairwise(times):
        touched: set[int] = set()  # queued jobs whose waiting or holding changed
        added, dropped = allocations.advance(start)
        for i in added:
            holding[by_start[i].job_id] += 1
        for i in dropped:
            holding[by_start[i].job_id] -= 1
        for i in (*added, *dropped):
            if (job := job_index.get(by_start[i].job_id)) is not None:
                touched.add(job)
        waits_added, waits_dropped = waits.advance(start)
        touched.update(waits_added, waits_dropped)
        queue_changed = False
        for job in touched:
            now = job in waits.active and not holding[queued[job].job_id]
            if now == (job in counted):
                continue
            shape = shape_of[job]
            if now:
                counted.add(job)
                waiting_by_shape[shape] += 1
                queue_changed |= waiting_by_shape[shape] == 1
            else:
                counted.discard(job)
                waiting_by_shape[shape] -= 1
                if not waiting_by_shape[shape]:
                    del waiting_by_shape[shape]
                    queue_changed = True
        if queue_changed:
            rebuilt_queue = tuple(by_index[shape] for shape in sorted(waiting_by_shape))
            queue_now = queue_now if rebuilt_queue == queue_now else rebuilt_queue
        bucket = window.bucket(start)
        if added or dropped or bucket != bucket_now:
            bucket_now = bucket
            active = [by_start[i] for i in allocations.active]
            rebuilt = _allocations_at(active, lives, node_names, busy, demand, bucket)
            allocations_now = allocations_now if rebuilt == allocations_now else rebuilt
        if any(holds.advance(start)):
            rebuilt_nodes = _with_reservations(nodes, [reserved[i] for i in holds.active])
            nodes_now = nodes_now if rebuilt_nodes == nodes_now else rebuilt_nodes
        caps_at = _caps_at(caps, start)
        caps_now = caps_now if caps_at == caps_now else caps_at
        if (
            state is None
            or state.nodes is not nodes_now
            or state.allocations is not allocations_now
            or state.queue is not queue_now
            or state.quota_caps is not caps_now
        ):
            state = ClusterAt(
                nodes=nodes_now,
                allocations=allocations_now,
                queue=queue_now,
                quota_caps=caps_now,
                busy_threshold=window.busy_threshold,
            )
        yield start, end, state


class _Sweep:
    """Which of ``spans`` (start, end) hold at t (start <= t < end) as t only grows:
    ``active`` their indices, in order of index (= of start when they are sorted so)."""

    def __init__(self, spans: list[tuple[float, float]]) -> None:
        self._spans = spans
        self._by_start = sorted(range(len(spans)), key=lambda i: spans[i][0])
        self._by_end = sorted(range(len(spans)), key=lambda i: spans[i][1])
        self._next_start = self._next_end = 0
        self.active: dict[int, None] = {}

    def advance(self, t: float) -> tuple[list[int], list[int]]:
        """Move to ``t``: the indices added and those dropped."""
        added, dropped = [], []
        spans, by_start, by_end = self._spans, self._by_start, self._by_end
        while self._next_start < len(by_start) and spans[by_start[self._next_start]][0] <= t:
            i = by_start[self._next_start]
            self._next_start += 1
            if spans[i][1] > t:
                self.active[i] = None
                added.append(i)
        while self._next_end < len(by_end) and spans[by_end[self._next_end]][1] <= t:
            i = by_end[self._next_end]
            self._next_end += 1
            if i in self.active:
                del self.active[i]
                dropped.append(i)
        return added, dropped


def _nodes(session: Session, window: Window) -> tuple[tuple[NodeAt, ...], dict[int, str]]:
    query = (
        sa.select(
            col(Node.id), col(Node.name), col(GpuModel.name), col(Node.gpu_count), col(Node.state)
        )
        .select_from(Node)
        .outerjoin(GpuModel, col(GpuModel.id) == col(Node.gpu_model_id))
        .where(col(Node.cluster_id) == window.cluster_id)
        .order_by(col(Node.name))
    )
    nodes, names = [], {}
    for node_id, name, model, gpus, state in session.execute(query):
        names[node_id] = name
        # Through the snapshot's table (the one wire → solver mapping); unknown is down.
        solver_state = NODE_STATES.get(state, si.NodeState.down)
        nodes.append(NodeAt(name, model or NO_MODEL, int(gpus or 0), solver_state))
    return tuple(nodes), names


def _with_reservations(nodes: tuple[NodeAt, ...], holding: list[Reserved]) -> tuple[NodeAt, ...]:
    if not holding:
        return nodes
    gpus: defaultdict[str, int] = defaultdict(int)
    teams: defaultdict[str, set[str]] = defaultdict(set)
    for held in holding:
        gpus[held.node] += held.gpus
        teams[held.node].add(held.team)
    return tuple(
        replace(
            node,
            reserved_gpus=gpus[node.name],
            reserved_for=next(iter(teams[node.name])) if len(teams[node.name]) == 1 else None,
        )
        if node.name in gpus
        else node
        for node in nodes
    )


def _allocations(session: Session, window: Window) -> list[_Held]:
    query = (
        sa.select(
            col(Allocation.job_id),
            col(Allocation.node_id),
            col(Allocation.gpu_count),
            col(Allocation.gpu_indices),
            col(Allocation.started_at),
            col(Allocation.released_at),
        )
        .select_from(Allocation)
        .join(Node, col(Node.id) == col(Allocation.node_id))
        .where(col(Node.cluster_id) == window.cluster_id)
        .where(col(Allocation.started_at) < window.until)
        .where(
            sa.or_(
                col(Allocation.released_at).is_(None), col(Allocation.released_at) > window.since
            )
        )
        .order_by(col(Allocation.started_at))
    )
    return [
        _Held(
            job_id,
            node_id,
            int(gpus),
            tuple(indices or ()),
            started.timestamp(),
            released.timestamp() if released else math.inf,
        )
        for job_id, node_id, gpus, indices, started, released in session.execute(query)
    ]


def _lifetimes(session: Session, window: Window) -> dict[int, _Lifetime]:
    """Jobs that could be queued in the window, and every job that holds GPUs in it."""
    # The allowed models as their stored text, read once per distinct text: decoding the
    # JSON of each of 100,000 rows was a third of this read. The last update is only read
    # where it is the end (a finished job without an end time).
    terminal = sorted(state.value for state in TERMINAL_JOB_STATES)
    query = sa.select(
        col(Job.id),
        col(Job.team),
        col(Job.shape),
        col(Job.gpus_requested),
        sa.cast(col(Job.allowed_gpu_models), sa.Text),
        col(Job.gang_size),
        col(Job.submit_time),
        col(Job.end_time),
        sa.case(
            (
                sa.and_(col(Job.end_time).is_(None), col(Job.state).in_(terminal)),
                col(Job.updated_at),
            )
        ),
    ).where(
        col(Job.cluster_id) == window.cluster_id,
        sa.or_(col(Job.submit_time).is_(None), col(Job.submit_time) < window.until),
        sa.or_(col(Job.end_time).is_(None), col(Job.end_time) > window.since),
    )
    lives = {}
    # Jobs alike share one QueuedJobAt (and its frozenset): 100,000 jobs are a few shapes.
    shapes: dict[tuple[str, int, str, int], QueuedJobAt] = {}
    models: dict[str, frozenset[str]] = {}
    for (
        job_id,
        team,
        shape,
        gpus_requested,
        allowed,
        gang_size,
        submit_time,
        end_time,
        updated_at,
    ) in session.execute(query):
        elastic = shape == JobShape.elastic
        finished = end_time or updated_at
        queued = None
        if not elastic and gpus_requested > 0 and submit_time is not None:
            gang = gang_size if gang_size > 1 else 1
            members = gang if gpus_requested % gang == 0 else 1
            key = (team, gpus_requested, allowed or "", members)
            queued = shapes.get(key)
            if queued is None:
                if key[2] not in models:
                    models[key[2]] = frozenset(load_json(allowed) if allowed else ())
                queued = shapes[key] = QueuedJobAt(
                    team=team, gpus=gpus_requested, gpu_models=models[key[2]], members=members
                )
        lives[job_id] = _Lifetime(
            job_id=job_id,
            team=team,
            elastic=elastic,
            gpus_per_replica=max(1, gpus_requested),
            queued_as=queued,
            submit=submit_time.timestamp() if submit_time else math.inf,
            end=finished.timestamp() if finished else math.inf,
        )
    return lives


def _bucket_index(session: Session, window: Window) -> sa.ColumnElement[int]:
    """The sample's bucket, computed in SQL as ``app.utilization`` does: PostgreSQL's cast
    rounds, so it floors first; SQLite's truncates (= floor, as offsets are ≥ 0)."""
    offset_s = sa.extract("epoch", col(TelemetrySample.at)) - window.since.timestamp()
    scaled = offset_s / window.bucket_s
    if session.connection().dialect.name == "postgresql":
        return sa.cast(sa.func.floor(scaled), sa.Integer)
    return sa.cast(scaled, sa.Integer)


def _busy_means(session: Session, window: Window) -> dict[tuple[int, int | None, int], float]:
    """Mean ``gpu_util`` per (node, GPU index or None for the node's own, bucket)."""
    bucket = _bucket_index(session, window)
    query = (
        sa.select(
            col(TelemetrySample.node_id),
            col(TelemetrySample.gpu_index),
            bucket,
            sa.func.avg(col(TelemetrySample.value)),
        )
        .where(
            col(TelemetrySample.cluster_id) == window.cluster_id,
            col(TelemetrySample.metric) == Metric.gpu_util.value,
            col(TelemetrySample.at) >= window.since,
            col(TelemetrySample.at) < window.until,
        )
        .group_by(col(TelemetrySample.node_id), col(TelemetrySample.gpu_index), bucket)
    )
    return {
        (node_id, gpu_index, int(index)): float(mean)
        for node_id, gpu_index, index, mean in session.execute(query)
        if node_id is not None
    }


def _demand_means(session: Session, window: Window) -> dict[tuple[int, int], float]:
    bucket = _bucket_index(session, window)
    query = (
        sa.select(col(TelemetrySample.job_id), bucket, sa.func.avg(col(TelemetrySample.value)))
        .where(
            col(TelemetrySample.cluster_id) == window.cluster_id,
            col(TelemetrySample.metric) == Metric.demand_replicas.value,
            col(TelemetrySample.at) >= window.since,
            col(TelemetrySample.at) < window.until,
        )
        .group_by(col(TelemetrySample.job_id), bucket)
    )
    return {
        (job_id, int(index)): float(mean)
        for job_id, index, mean in session.execute(query)
        if job_id is not None
    }


def _quota_caps(session: Session, window: Window) -> list[tuple[float, dict[str, int]]]:
    """(in force from, caps) of each version of the cluster's SLA policy, oldest first."""
    query = (
        sa.select(col(SlaPolicy.created_at), col(SlaPolicy.spec), col(SlaPolicy.deleted))
        .where(col(SlaPolicy.name) == window.cluster, col(SlaPolicy.created_at) < window.until)
        .order_by(col(SlaPolicy.version))
    )
    versions = []
    for created_at, stored_spec, deleted in session.execute(query):
        # A deletion keeps the last spec for the record; from then on no caps apply.
        spec = {} if deleted else stored_spec
        caps = {
            team["team"]: int(team.get("guaranteed_gpus", 0)) + int(team["borrowing_limit_gpus"])
            for team in (spec or {}).get("teams", [])
            if team.get("borrowing_limit_gpus") is not None
        }
        versions.append((max(created_at.timestamp(), window.since.timestamp()), caps))
    return versions


def _caps_at(versions: list[tuple[float, dict[str, int]]], t: float) -> dict[str, int]:
    current: dict[str, int] = {}
    for since, caps in versions:
        if since <= t:
            current = caps
    return current


def _allocations_at(
    active: list[_Held],
    lives: dict[int, _Lifetime],
    node_names: dict[int, str],
    busy: dict[tuple[int, int | None, int], float],
    demand: dict[tuple[int, int], float],
    bucket: int,
) -> tuple[AllocationAt, ...]:
    above_by_job = _above_demand(active, lives, demand, bucket)
    allocations = []
    for held in active:
        life = lives.get(held.job_id)
        above = min(held.gpus, above_by_job.get(held.job_id, 0))
        if above:
            above_by_job[held.job_id] -= above
        allocations.append(
            AllocationAt(
                node=node_names[held.node_id],
                team=life.team if life else "-",
                gpus=held.gpus,
                busy=_busy(held, busy, bucket),
                above_demand=above,
            )
        )
    return tuple(allocations)


def _above_demand(
    active: list[_Held],
    lives: dict[int, _Lifetime],
    demand: dict[tuple[int, int], float],
    bucket: int,
) -> dict[int, int]:
    """Per service: GPUs it holds beyond the replicas its demand of the bucket needs."""
    held_by_service: defaultdict[int, int] = defaultdict(int)
    for held in active:
        life = lives.get(held.job_id)
        if life is not None and life.elastic:
            held_by_service[held.job_id] += held.gpus
    above = {}
    for job_id, gpus in held_by_service.items():
        mean = demand.get((job_id, bucket))
        if mean is not None:
            needed = math.ceil(mean) * lives[job_id].gpus_per_replica
            above[job_id] = max(0, gpus - needed)
    return above


def _busy(held: _Held, busy: dict[tuple[int, int | None, int], float], bucket: int) -> float | None:
    per_gpu = [busy[key] for i in held.indices if (key := (held.node_id, i, bucket)) in busy]
    if per_gpu:
        return sum(per_gpu) / len(per_gpu)
    return busy.get((held.node_id, None, bucket))
