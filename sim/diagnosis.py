"""Why the simulated GPUs sat idle: the run's state between two events, read as a
``solver.diagnosis.ClusterAt``, classified and integrated over the measured window
``[0, horizon]`` (the same window as ``utilization``).

How the simulator's state maps to the classifier's:

* a node that is not up is down; a draining node is draining;
* a running block job holds its GPUs, busy (the simulator has no busy measurement: restore
  and migration time count as allocated work, as in ``sim.metrics``); a free GPU still
  dumping the checkpoint of a job that left it is held by that job, busy;
* a service's GPUs above its demand are ``reservation`` in the same fraction that
  ``sim.metrics`` leaves out of ``utilization`` (held × (1 − demand / capacity served)),
  so the idle GPU-hours here are exactly capacity − busy of ``utilization_of_capacity``;
* a queued job of ``g`` GPUs is ``g`` one-GPU members on at most as many nodes as
  ``sim.adapter`` lets its gang span (the fewest of its largest compatible nodes);
* team caps are the scenario's ``guaranteed_gpus + borrowing_limit`` (``SlaPolicy``).

Plans' reservations of free GPUs are not visible in the simulator's state: GPUs a policy
keeps free for a job or a forecast show as ``queue_order`` when a queued job would fit them.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from solver.diagnosis import (
    AllocationAt,
    ClusterAt,
    IdleCause,
    IdleHours,
    NodeAt,
    QueuedJobAt,
    classify,
)
from solver.instance import SlaPolicy

if TYPE_CHECKING:
    from sim.engine import SimJob, Simulation
    from sim.workload import Workload

EPS = 1e-6
CLUSTER = "sim"


class IdleTracker:
    """Integrates the breakdown over a run: ``add`` between two events, ``summary`` at
    the end."""

    def __init__(self, workload: Workload) -> None:
        self.horizon = workload.horizon
        self.hours = IdleHours()
        largest: dict[str, int] = {}
        for node in workload.nodes:
            largest[node.gpu_model] = max(largest.get(node.gpu_model, 0), node.gpus)
        self._largest_node = largest
        caps = {}
        for team, terms in workload.sla_policies.items():
            cap = SlaPolicy.model_validate({"team": team, **terms}).quota_cap
            if cap is not None:
                caps[team] = cap
        self._caps = caps
        self._spans: dict[tuple[int, tuple[str, ...]], int] = {}
        self._queued_as: dict[str, QueuedJobAt] = {}
        self._shapes: dict[tuple[str, int, tuple[str, ...], int], QueuedJobAt] = {}

    def add(self, sim: Simulation, start: float, end: float) -> None:
        """The state of ``sim`` held over ``[start, end)``; only the window counts."""
        end = min(end, self.horizon)
        if end - start <= EPS:
            return
        self.hours.add(classify(self.cluster_at(sim)), cluster=CLUSTER, start=start, end=end)

    def cluster_at(self, sim: Simulation) -> ClusterAt:
        nodes = [
            NodeAt(n.spec.name, n.spec.gpu_model, n.spec.gpus, n.state) for n in sim.nodes.values()
        ]
        allocations = [
            AllocationAt(node, job.spec.team, len(indices))
            for job in sim.running.values()
            for node, indices in job.placement.items()
        ]
        dumping: defaultdict[tuple[str, str], int] = defaultdict(int)
        for node_name, job_id in sim.dumping_gpus():
            dumping[(node_name, sim.jobs[job_id].spec.team)] += 1
        allocations += [AllocationAt(node, team, gpus) for (node, team), gpus in dumping.items()]
        for svc in sim.services.values():
            held = svc.replicas * svc.spec.gpus_per_replica
            if not held:
                continue
            capacity = sim.service_capacity(svc)
            serving = min(1.0, svc.spec.demand_at(sim.now) / capacity) if capacity > 0 else 0.0
            for node, replicas in svc.replicas_by_node().items():
                gpus = replicas * svc.spec.gpus_per_replica
                allocations.append(
                    AllocationAt(node, svc.spec.team, gpus, above_demand=gpus * (1 - serving))
                )
        # Jobs alike share one object (``_queued``), so identity removes the duplicates
        # before the classifier hashes what is left.
        queue = tuple({id(q): q for q in map(self._queued, sim.queue.values())}.values())
        return ClusterAt(tuple(nodes), tuple(allocations), queue, self._caps)

    def _queued(self, job: SimJob) -> QueuedJobAt:
        """The job as the classifier sees it, one shared object per distinct shape: a long
        queue is read at every event of the window."""
        spec = job.spec
        if spec.id not in self._queued_as:
            span = self._span(spec.gpus, spec.gpu_models)
            shape = (spec.team, spec.gpus, spec.gpu_models, span)
            if shape not in self._shapes:
                self._shapes[shape] = QueuedJobAt(
                    team=spec.team,
                    gpus=spec.gpus,
                    gpu_models=frozenset(spec.gpu_models),
                    members=spec.gpus,
                    max_nodes=span,
                )
            self._queued_as[spec.id] = self._shapes[shape]
        return self._queued_as[spec.id]

    def _span(self, gpus: int, models: tuple[str, ...]) -> int:
        key = (gpus, models)
        if key not in self._spans:
            largest = max(
                (
                    size
                    for model, size in self._largest_node.items()
                    if not models or model in models
                ),
                default=1,
            )
            self._spans[key] = max(1, math.ceil(gpus / max(1, largest)))
        return self._spans[key]

    def summary(self) -> dict[str, Any]:
        """GPU-hours per cause, and per cause by GPU model, team and hour (JSON-ready)."""
        by_model: dict[str, dict[str, float]] = {}
        by_team: dict[str, dict[str, float]] = {}
        by_hour: dict[int, dict[str, float]] = {}
        for row in self.hours.rows():
            for table, key in ((by_model, row.gpu_model), (by_team, row.team or "-")):
                cell = table.setdefault(key, {})
                cell[row.cause.value] = cell.get(row.cause.value, 0.0) + row.gpu_hours
            hour = by_hour.setdefault(row.bucket, {})
            hour[row.cause.value] = hour.get(row.cause.value, 0.0) + row.gpu_hours
        return {
            "capacity_gpu_hours": self.hours.capacity_gpu_hours,
            "busy_gpu_hours": self.hours.busy_gpu_hours,
            "idle_gpu_hours": self.hours.idle_gpu_hours,
            "by_cause": {c.value: h for c, h in self.hours.hours_by_cause().items()},
            "by_gpu_model": by_model,
            "by_team": by_team,
            "by_hour": [{"hour": hour, **by_hour[hour]} for hour in sorted(by_hour)],
        }


def idle_metric(cause: IdleCause) -> str:
    """The ``RunResult.metrics`` key of a cause's idle GPU-hours."""
    return f"idle_{cause.value}_gpu_hours"
