from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel


class GpuFigures(BaseModel):
    """What a cluster's GPUs (or the fleet's) are doing at one moment.

    ``gpus``: GPUs of nodes that are not down (the utilization chart's capacity).
    ``allocated``: GPUs held by open allocations on those nodes. ``free``: GPUs of nodes
    that are up and nobody holds (a draining node's unheld GPUs take no new work, so they
    count in neither). ``idle_allocated``: allocated GPUs measured busy under
    ``busy_threshold`` on average over the recent window, each judged by its own
    ``gpu_util`` samples when its allocation names it, else by its node's node-wide ones;
    ``unmeasured_allocated``: allocated GPUs that neither kind of sample judges.
    ``pending_gpus``: what the pending jobs ask for (an elastic service its minimum
    replicas, at least one). ``awaiting_approval``: actions proposed in advise mode that no
    operator has decided yet, and their plans.
    """

    gpus: int = 0
    gpus_down: int = 0
    allocated: int = 0
    free: int = 0
    idle_allocated: int = 0
    unmeasured_allocated: int = 0
    pending_jobs: int = 0
    pending_gpus: int = 0
    awaiting_approval_actions: int = 0
    awaiting_approval_plans: int = 0


class ClusterFigures(GpuFigures):
    cluster: str
    mode: str


class FleetOverview(BaseModel):
    at: datetime
    busy_threshold: float
    recent_s: int
    clusters: list[ClusterFigures]
    fleet: GpuFigures
