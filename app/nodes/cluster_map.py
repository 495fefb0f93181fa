"""The cluster map (GET /nodes/map): every node of one cluster as a row of GPUs, who holds
each GPU, the latest utilization and memory measured on it, and the moves of the cluster's
latest open plan, read in one request so that the dashboard draws 1,000 nodes from one
reply instead of one read per node.

Which GPU a job holds: the scheduler's device indices where it names them (Slurm);
schedulers that only count GPUs (Kubernetes) name none, so such a job is drawn on its
node's first GPUs that no indexed job holds (as the first dashboard did).

A planned move is one of the plan's actions that has not ended. Its cells where it
leaves: the GPUs the job holds there now; where it goes: the GPUs the plan assigned
(``GET /plans/{id}/placement``'s ``after``) or, for a plan stored without them, the node's
first free GPUs standing for the count (``exact`` false).

What was measured on a GPU: its latest ``gpu_util`` and ``gpu_mem_used_gib`` of the last
``MEASURED_WINDOW``, its own sample else its node's, read either from every sample of the
window or from ``gpu_latest_samples`` (one row per GPU and metric, kept by the writers of
samples); both give the same reply.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlmodel import Session, col, select

from app.actions.models import TERMINAL_ACTION_STATES, Action, ActionKind
from app.clusters.models import Cluster
from app.core.lookup import found
from app.gpu_models.models import GpuModel
from app.jobs.models import Allocation, Job
from app.nodes.models import (
    ClusterMap,
    MapCells,
    MapJob,
    MapNode,
    MapPlan,
    Node,
    PlannedMove,
)
from app.plans import service as plan_service
from app.plans.models import OPEN_PLAN_STATES, Plan
from app.telemetry.models import NODE_WIDE, GpuLatestSample, TelemetrySample
from wire.telemetry import Metric, NodeState

# A sample older than this says nothing about the GPU now (agents report every few
# seconds to a minute; a node silent for longer shows "not measured").
MEASURED_WINDOW = timedelta(minutes=10)
# The actions that take GPUs from one place to another (reservations only hold them).
MAP_KINDS = (ActionKind.migrate, ActionKind.move, ActionKind.start, ActionKind.preempt)


def cluster_map(
    *, session: Session, cluster: str, now: datetime, from_latest: bool = False
) -> ClusterMap:
    """The map of ``cluster`` at ``now``. ``from_latest``: each GPU's measurements from
    ``gpu_latest_samples`` (one row per GPU and metric) instead of every sample of the
    window; the same reply (``Settings.map_from_latest_samples``)."""
    row = found(
        session.exec(select(Cluster).where(Cluster.name == cluster)).first(),
        f"cluster {cluster!r} does not exist",
        resource="cluster",
        resource_id=cluster,
    )
    assert row.id is not None
    since = now - MEASURED_WINDOW
    # Columns, not Node entities: the ORM's identity map and attribute instrumentation
    # cost more than the rest of the read at 1,000 nodes.
    nodes = session.execute(
        sa.select(
            col(Node.id),
            col(Node.name),
            col(Node.gpu_count),
            col(Node.state),
            col(GpuModel.name),
            col(GpuModel.memory_gib),
        )
        .outerjoin(GpuModel, col(GpuModel.id) == col(Node.gpu_model_id))
        .where(col(Node.cluster_id) == row.id)
        .order_by(col(Node.name), col(Node.id))
    ).all()
    jobs, holders = _holders(session, row.id, {node_id: count for node_id, _, count, *_ in nodes})
    read = _from_latest_table if from_latest else _latest_samples
    measured = read(session, row.id, since=since, until=now)
    # Built unvalidated (model_construct): every value is a column of its declared type or
    # a list of them, and 1,000s of validations were a fifth of the read.
    drawn = [
        MapNode.model_construct(
            name=name,
            gpu_model=model,
            gpu_memory_gib=memory,
            state=NodeState(state),
            holders=[holders[node_id].get(i) for i in range(count)],
            util=_measured(measured.get((node_id, Metric.gpu_util.value)), count),
            mem_used_gib=_measured(measured.get((node_id, Metric.gpu_mem_used_gib.value)), count),
        )
        for node_id, name, count, state, model, memory in nodes
    ]
    plan = session.exec(
        select(Plan)
        .where(Plan.cluster_id == row.id, col(Plan.state).in_(OPEN_PLAN_STATES))
        .order_by(col(Plan.created_at).desc(), col(Plan.id).desc())
        .limit(1)
    ).first()
    moves = _moves(session, plan, drawn, jobs) if plan is not None else []
    return ClusterMap(
        cluster=cluster,
        measured_since=since,
        nodes=drawn,
        jobs=jobs,
        plan=None
        if plan is None or plan.id is None
        else MapPlan(id=plan.id, state=str(plan.state), created_at=plan.created_at),
        moves=moves,
    )


def _holders(
    session: Session, cluster_id: int, sizes: dict[int | None, int]
) -> tuple[list[MapJob], dict[int | None, dict[int, int]]]:
    """The jobs holding GPUs of the cluster, and by node the GPU index → that job's place
    in the list."""
    # The GPU indices as their JSON text: a cluster's allocations name a few dozen distinct
    # lists ("[0, 1]"), each parsed once (JSON decoding per row was a fifth of the read).
    connection = session.connection()
    rows = connection.execute(
        sa.select(
            col(Allocation.node_id),
            sa.cast(col(Allocation.gpu_indices), sa.Text),
            col(Allocation.gpu_count),
            col(Job.id),
            col(Job.external_id),
            col(Job.team),
            col(Job.sla_class),
        )
        .join(Job, col(Job.id) == col(Allocation.job_id))
        .join(Node, col(Node.id) == col(Allocation.node_id))
        .where(col(Node.cluster_id) == cluster_id, col(Allocation.released_at).is_(None))
        .order_by(col(Job.external_id), col(Allocation.id))
    ).all()
    jobs: list[MapJob] = []
    place: dict[int, int] = {}
    holders: dict[int | None, dict[int, int]] = defaultdict(dict)
    counted: list[tuple[int, int, int]] = []
    parsed: dict[str, list[int]] = {}
    for node_id, text, gpus, job_id, external_id, team, sla_class in rows:
        indices = parsed.get(text)
        if indices is None:
            indices = parsed[text] = json.loads(text)
        if job_id not in place:
            place[job_id] = len(jobs)
            jobs.append(
                MapJob.model_construct(
                    id=job_id, external_id=external_id, team=team, sla_class=sla_class
                )
            )
        if indices:
            for i in indices:
                if 0 <= i < sizes.get(node_id, 0):
                    holders[node_id][i] = place[job_id]
        else:
            counted.append((node_id, gpus, place[job_id]))
    for node_id, gpus, held_by in counted:
        free = [i for i in range(sizes.get(node_id, 0)) if i not in holders[node_id]]
        for i in free[:gpus]:
            holders[node_id][i] = held_by
    return jobs, holders


# (node id, metric) → GPU index (-1: the node as a whole) → the latest value of the window.
_Measured = dict[tuple[int, str], dict[int, float]]
# A read of the window's samples names at most this many nodes (SQLite bounds a
# statement's parameters); more, and it reads the whole cluster's.
_NAMED_NODES = 5000


def _from_latest_table(
    session: Session, cluster_id: int, *, since: datetime, until: datetime
) -> _Measured:
    """What :func:`_latest_samples` answers, from ``gpu_latest_samples``: one row per GPU
    and metric, the newest ever written. A row newer than ``until`` (a clock ahead of the
    control plane's, up to the day the ingest allows) is not the window's latest: the
    nodes with one are answered from their samples, as before."""
    connection = session.connection()
    of_cluster = col(GpuLatestSample.cluster_id) == cluster_id
    # The times stay in the database: turning 20,000 of them into datetimes was a third
    # of this read.
    rows = connection.execute(
        sa.select(
            col(GpuLatestSample.node_id),
            col(GpuLatestSample.gpu_index),
            col(GpuLatestSample.metric),
            col(GpuLatestSample.value),
        ).where(of_cluster, col(GpuLatestSample.at) >= since, col(GpuLatestSample.at) <= until)
    ).all()
    ahead = set(
        connection.execute(
            sa.select(col(GpuLatestSample.node_id))
            .distinct()
            .where(of_cluster, col(GpuLatestSample.at) > until)
        ).scalars()
    )
    measured: _Measured = defaultdict(dict)
    for node_id, index, metric, value in rows:
        if node_id not in ahead:
            measured[(node_id, metric)][index] = value
    if ahead:
        named = sorted(ahead) if len(ahead) <= _NAMED_NODES else None
        for (node_id, metric), by_gpu in _latest_samples(
            session, cluster_id, since=since, until=until, nodes=named
        ).items():
            if node_id in ahead:
                measured[(node_id, metric)] = by_gpu
    return measured


def _latest_samples(
    session: Session,
    cluster_id: int,
    *,
    since: datetime,
    until: datetime,
    nodes: Sequence[int] | None = None,
) -> _Measured:
    """The latest value of each GPU's (or node's, gpu index -1) utilization and memory in
    the window, by (node id, metric) and GPU index: one read, whatever the number of nodes
    (``nodes``: of those only)."""
    # Every sample of the window, oldest first, so that the newest of each (node, GPU,
    # metric) is the last one kept: an ordered range read of the (cluster, at) index. A
    # window function ranking them in SQL (row_number) costs SQLite a sort of the window,
    # three times the read. Plain rows, not ORM ones, for the same reason.
    connection = session.connection()
    rows = connection.execute(
        sa.select(
            col(TelemetrySample.node_id),
            col(TelemetrySample.gpu_index),
            col(TelemetrySample.metric),
            col(TelemetrySample.value),
        )
        .where(
            col(TelemetrySample.cluster_id) == cluster_id,
            col(TelemetrySample.at) >= since,
            col(TelemetrySample.at) <= until,
            col(TelemetrySample.node_id).is_not(None),
            col(TelemetrySample.metric).in_([Metric.gpu_util.value, Metric.gpu_mem_used_gib.value]),
            sa.true() if nodes is None else col(TelemetrySample.node_id).in_(nodes),
        )
        .order_by(col(TelemetrySample.at), col(TelemetrySample.id))
    ).all()
    measured: _Measured = defaultdict(dict)
    for node_id, index, metric, value in rows:
        measured[(node_id, metric)][NODE_WIDE if index is None else index] = value
    return measured


def _measured(by_gpu: dict[int, float] | None, count: int) -> list[float | None]:
    """A node's figure per GPU: the GPU's own sample, else the node's (index -1)."""
    if not by_gpu:
        return [None] * count
    node_wide = by_gpu.get(NODE_WIDE)
    return [by_gpu.get(i, node_wide) for i in range(count)]


def _moves(
    session: Session, plan: Plan, nodes: list[MapNode], jobs: list[MapJob]
) -> list[PlannedMove]:
    assert plan.id is not None
    target_cluster = sa.orm.aliased(Cluster)
    rows = session.execute(
        sa.select(Action, col(Job.external_id), col(target_cluster.name))
        .outerjoin(Job, col(Job.id) == Action.job_id)
        .outerjoin(target_cluster, col(target_cluster.id) == Action.target_cluster_id)
        .where(
            col(Action.plan_id) == plan.id,
            col(Action.kind).in_(MAP_KINDS),
            # A move that has ended is where the jobs are now, no longer a plan.
            col(Action.state).not_in(TERMINAL_ACTION_STATES),
        )
        .order_by(col(Action.id))
    ).all()
    if not rows:
        return []
    assigned = {
        (n.node, held.job): held.gpu_indices
        for n in plan_service.plan_placement(session=session, plan_id=plan.id).nodes
        for held in n.after
    }
    by_name = {n.name: n for n in nodes}
    place = {j.id: i for i, j in enumerate(jobs)}
    moves: list[PlannedMove] = []
    for action, external_id, target in rows:
        assert action.id is not None
        mine = place.get(action.job_id) if action.job_id is not None else None
        leaves = dict(action.source_placement) or (
            {action.source_node: 0} if action.source_node else {}
        )
        source = [_left(by_name.get(node), node, gpus, mine) for node, gpus in leaves.items()]
        goes = dict(action.target_placement) or (
            {action.target_node: sum(c.gpus for c in source)} if action.target_node else {}
        )
        takes = [
            _taken(by_name.get(node), node, gpus, assigned.get((node, external_id or "")))
            if target is None
            else MapCells(node=node, gpus=gpus, gpu_indices=[], exact=False)
            for node, gpus in goes.items()
        ]
        moves.append(
            PlannedMove(
                action_id=action.id,
                kind=str(action.kind),
                state=str(action.state),
                job=external_id,
                job_id=action.job_id,
                target_cluster=target,
                source=source,
                target=takes,
            )
        )
    return moves


def _left(node: MapNode | None, name: str, gpus: int, job: int | None) -> MapCells:
    """The GPUs the job holds on the node it leaves (all of them when the action does not
    say how many)."""
    held = [i for i, h in enumerate(node.holders) if job is not None and h == job] if node else []
    count = gpus or len(held)
    return MapCells(node=name, gpus=count, gpu_indices=held[:count], exact=len(held) >= count)


def _taken(node: MapNode | None, name: str, gpus: int, planned: Sequence[int] | None) -> MapCells:
    if node is None:
        return MapCells(node=name, gpus=gpus, gpu_indices=[], exact=False)
    if planned:
        return MapCells(node=name, gpus=gpus, gpu_indices=sorted(planned), exact=True)
    free = [i for i, h in enumerate(node.holders) if h is None]
    busy = [i for i, h in enumerate(node.holders) if h is not None]
    return MapCells(node=name, gpus=gpus, gpu_indices=sorted((free + busy)[:gpus]), exact=False)
