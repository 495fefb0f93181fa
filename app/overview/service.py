"""The fleet overview: per cluster, what its GPUs are doing now, in a few grouped queries
(nodes with their open allocations, recent busy samples per node, pending jobs, proposals
waiting for a decision), so one request stays cheap at 10,000 GPUs and 100,000 jobs.

Idle-but-allocated is judged per node: the mean of the node's ``gpu_util`` samples (per
GPU or node-wide) over the recent window, against the busy threshold the idle diagnosis
uses, applied to every GPU allocated on that node.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlmodel import Session, col

from app.actions.models import Action, ActionState
from app.clusters import service as cluster_service
from app.core.lookup import row_id
from app.jobs.models import Allocation, Job
from app.nodes.models import Node
from app.overview.models import ClusterFigures, FleetOverview, GpuFigures
from app.plans.models import Plan, PlanState
from app.telemetry.models import TelemetrySample
from solver.diagnosis.state import DEFAULT_BUSY_THRESHOLD
from wire.telemetry import JobShape, JobState, Metric, NodeState

RECENT = timedelta(minutes=15)


def fleet_overview(
    *,
    session: Session,
    now: datetime,
    busy_threshold: float = DEFAULT_BUSY_THRESHOLD,
    recent: timedelta = RECENT,
) -> FleetOverview:
    clusters = cluster_service.list_clusters(session=session)
    figures = {row_id(c): ClusterFigures(cluster=c.name, mode=str(c.mode)) for c in clusters}

    busy_rows = session.execute(
        sa.select(col(TelemetrySample.node_id), sa.func.avg(col(TelemetrySample.value)))
        .where(
            col(TelemetrySample.metric) == Metric.gpu_util.value,
            col(TelemetrySample.at) > now - recent,
            col(TelemetrySample.at) <= now,
            col(TelemetrySample.node_id).is_not(None),
        )
        .group_by(col(TelemetrySample.node_id))
    ).tuples()
    busy_by_node = {node_id: float(busy) for node_id, busy in busy_rows}
    held = (
        sa.select(
            col(Allocation.node_id), sa.func.sum(col(Allocation.gpu_count)).label("allocated")
        )
        .where(col(Allocation.released_at).is_(None))
        .group_by(col(Allocation.node_id))
        .subquery()
    )
    nodes = session.execute(
        sa.select(
            col(Node.id),
            col(Node.cluster_id),
            col(Node.gpu_count),
            col(Node.state),
            sa.func.coalesce(held.c.allocated, 0),
        ).outerjoin(held, held.c.node_id == col(Node.id))
    ).tuples()
    for node_id, cluster_id, gpu_count, state, allocated_raw in nodes:
        cluster = figures.get(cluster_id)
        if cluster is None:
            continue
        if state == NodeState.down:
            cluster.gpus_down += gpu_count
            continue
        allocated = min(int(allocated_raw), gpu_count)
        cluster.gpus += gpu_count
        cluster.allocated += allocated
        if state == NodeState.up:
            cluster.free += gpu_count - allocated
        busy = busy_by_node.get(node_id)
        if busy is None:
            cluster.unmeasured_allocated += allocated
        elif busy < busy_threshold:
            cluster.idle_allocated += allocated

    # A block job asks for gpus_requested in all; an elastic service that much per replica.
    asked = sa.case(
        (
            col(Job.shape) == JobShape.elastic.value,
            col(Job.gpus_requested)
            * sa.case((col(Job.min_replicas) > 1, col(Job.min_replicas)), else_=1),
        ),
        else_=col(Job.gpus_requested),
    )
    pending = session.execute(
        sa.select(col(Job.cluster_id), sa.func.count(), sa.func.coalesce(sa.func.sum(asked), 0))
        .where(col(Job.state) == JobState.pending.value)
        .group_by(col(Job.cluster_id))
    ).tuples()
    for cluster_id, jobs, gpus in pending:
        if cluster_id in figures:
            figures[cluster_id].pending_jobs = int(jobs)
            figures[cluster_id].pending_gpus = int(gpus)

    proposed_actions = session.execute(
        sa.select(col(Action.cluster_id), sa.func.count())
        .where(col(Action.state) == ActionState.proposed.value)
        .group_by(col(Action.cluster_id))
    ).tuples()
    for cluster_id, count in proposed_actions:
        if cluster_id in figures:
            figures[cluster_id].awaiting_approval_actions = int(count)
    proposed_plans = session.execute(
        sa.select(col(Plan.cluster_id), sa.func.count())
        .where(col(Plan.state) == PlanState.proposed.value)
        .group_by(col(Plan.cluster_id))
    ).tuples()
    for cluster_id, count in proposed_plans:
        if cluster_id is not None and cluster_id in figures:
            figures[cluster_id].awaiting_approval_plans = int(count)

    totals: defaultdict[str, int] = defaultdict(int)
    for cluster in figures.values():
        for name in GpuFigures.model_fields:
            totals[name] += getattr(cluster, name)
    return FleetOverview(
        at=now,
        busy_threshold=busy_threshold,
        recent_s=int(recent.total_seconds()),
        clusters=sorted(figures.values(), key=lambda c: c.cluster),
        fleet=GpuFigures(**totals),
    )
