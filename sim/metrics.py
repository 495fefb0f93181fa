"""Metrics of a finished run, and its JSON form for the dashboard.

Definitions (all GPU-times in GPU-hours):

* ``utilization``: busy GPU-time / available GPU-time (GPUs of nodes that are up). Busy
  = held by a block job (restore and migration time included: it is allocated, and its
  cost shows in ``migration_gpu_hours`` and in the value) + held by a service replica
  that serves demand. A replica reserved beyond the demand of the hour (FIFO reserves the
  daily peak) is allocated but idle: ``allocated_utilization`` counts it,
  ``utilization`` does not. ``utilization_of_capacity`` divides busy GPU-time by all GPUs
  over the horizon, failed nodes included.
* ``weighted_output``: Σ team weight × priority × useful GPU-hours of block jobs. Useful
  work is what survives: the whole job when completed, otherwise what is checkpointed at
  the end of the horizon (a running checkpointable job can be checkpointed then; work lost
  to preemption, failure or a missing checkpoint never counts). Migration and restore time
  is not useful work.
* ``jct_*``: completion time − submit time of completed jobs; ``queue_wait_*``: time spent
  queued (before the first start and after every preemption) by every job that arrived.
* ``unmet_demand``: replica-hours of service demand not served (a replica on a model of
  speed ``s`` serves ``s``); ``sla_violations``: service-hours served below
  ``sla_target`` × demand.
* ``fragmentation``: time-averaged share of idle GPUs that sit on nodes with fewer free
  GPUs than the smallest queued job needs (0 when nothing waits).
* Churn: ``policy_actions`` counts what the policy's plans did — starts, migrations,
  preemptions and requeues of block jobs, resizes of services (those that changed the
  service) — for every policy, a baseline's starts included. ``actions_per_job_hour``
  divides them by the job-hours of block work run (running block jobs × time);
  ``jobs_acted_twice_10min`` counts the block jobs with two such actions less than
  ``CHURN_WINDOW_S`` (600 s) apart: a job started and stopped again, or stopped and
  restarted, within ten minutes.
"""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass, field
from typing import Any

from sim.engine import JobStatus, Simulation

HOUR = 3600.0
CHURN_WINDOW_S = 600.0


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = q / 100 * (len(ordered) - 1)
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(slots=True)
class RunResult:
    scenario: str
    policy: str
    seed: int
    metrics: dict[str, float]
    timeseries: dict[str, list[float]]
    occupancy: list[dict[str, Any]] = field(default_factory=list)
    gpu_rows: list[str] = field(default_factory=list)
    horizon: float = 0.0
    timing: dict[str, float] = field(default_factory=dict)
    node_events: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "policy": self.policy,
            "seed": self.seed,
            "horizon_s": self.horizon,
            "metrics": self.metrics,
            "timeseries": self.timeseries,
            "gpu_rows": self.gpu_rows,
            "occupancy": self.occupancy,
            "node_events": self.node_events,
            "timing": self.timing,
        }


def team_weight(sim: Simulation, team: str) -> float:
    policy = sim.workload.sla_policies.get(team, {})
    return float(policy.get("priority_weight", 1.0))  # type: ignore[arg-type]


def acted_within(times: list[float], window: float = CHURN_WINDOW_S) -> bool:
    """Whether two of these (ordered) action times are less than ``window`` apart."""
    return any(later - earlier < window for earlier, later in itertools.pairwise(times))


def summarize(sim: Simulation, *, max_points: int = 400) -> RunResult:
    c = sim.counters
    useful = 0.0
    weighted = 0.0
    jct: list[float] = []
    waits: list[float] = []
    completed = 0
    for state in sim.jobs.values():
        spec = state.spec
        kept = spec.work if state.status == JobStatus.DONE else state.checkpointed
        gpu_hours = kept * spec.gpus / HOUR
        useful += gpu_hours
        weighted += team_weight(sim, spec.team) * spec.priority * gpu_hours
        waits.append(state.queue_wait)
        if state.status == JobStatus.DONE and state.end_time is not None:
            completed += 1
            jct.append(state.end_time - spec.submit_time)
    violations = 0
    for (service_id, _hour), (demand, served) in sim.service_hours.items():
        target = sim.services[service_id].spec.sla_target
        if demand > 0 and served < target * demand - 1e-6:
            violations += 1
    block_actions = sum(len(state.acted_at) for state in sim.jobs.values())
    resizes = sum(len(svc.resized_at) for svc in sim.services.values())
    acted_twice = sum(1 for state in sim.jobs.values() if acted_within(state.acted_at))
    job_hours = c.block_job_seconds / HOUR
    available = c.available_gpu_seconds or 1.0
    busy = c.block_gpu_seconds + c.serving_gpu_seconds
    metrics = {
        "gpus": float(sim.workload.total_gpus),
        "horizon_h": sim.workload.horizon / HOUR,
        "utilization": busy / available,
        "allocated_utilization": c.allocated_gpu_seconds / available,
        "utilization_of_capacity": busy / (c.capacity_gpu_seconds or 1.0),
        "block_utilization": c.block_gpu_seconds / available,
        "allocated_gpu_hours": c.allocated_gpu_seconds / HOUR,
        "available_gpu_hours": c.available_gpu_seconds / HOUR,
        "useful_gpu_hours": useful,
        "weighted_output": weighted,
        "jobs_submitted": float(len(sim.workload.jobs)),
        "jobs_arrived": float(len(sim.jobs)),
        "jobs_completed": float(completed),
        "jobs_running_at_end": float(len(sim.running)),
        "jobs_queued_at_end": float(len(sim.queue)),
        "jct_mean_h": (statistics.fmean(jct) / HOUR) if jct else 0.0,
        "jct_p50_h": _percentile(jct, 50) / HOUR,
        "jct_p99_h": _percentile(jct, 99) / HOUR,
        "queue_wait_mean_h": (statistics.fmean(waits) / HOUR) if waits else 0.0,
        "queue_wait_p50_h": _percentile(waits, 50) / HOUR,
        "queue_wait_p99_h": _percentile(waits, 99) / HOUR,
        "demand_replica_hours": c.demand_seconds / HOUR,
        "unmet_demand_replica_hours": c.unmet_demand_seconds / HOUR,
        "sla_violations": float(violations),
        "migrations": float(c.migrations),
        "migration_gpu_hours": c.migration_gpu_seconds / HOUR,
        "preemptions": float(c.preemptions),
        "failure_evictions": float(c.evictions),
        "checkpoint_gpu_hours": c.checkpoint_gpu_seconds / HOUR,
        "lost_gpu_hours": c.lost_gpu_seconds / HOUR,
        "fragmentation": c.fragmented_gpu_seconds / c.idle_gpu_seconds
        if c.idle_gpu_seconds
        else 0.0,
        "replans": float(c.replans),
        "rejected_actions": float(c.rejected_actions),
        "policy_actions": float(block_actions + resizes),
        "block_job_hours": job_hours,
        "actions_per_job_hour": (block_actions + resizes) / job_hours if job_hours else 0.0,
        "jobs_acted_twice_10min": float(acted_twice),
    }
    # Wall-clock figures vary run to run; they are kept apart from the reproducible metrics.
    timing = {"solve_seconds": c.solve_seconds}
    rows = [f"{name}/{i}" for name, node in sim.nodes.items() for i in range(node.spec.gpus)]
    occupancy = [
        {
            "row": f"{seg.node}/{seg.gpu}",
            "start": seg.start,
            "end": seg.end,
            "owner": seg.owner,
            "kind": seg.kind,
        }
        for seg in sim.segments
    ]
    return RunResult(
        scenario=sim.workload.name,
        policy=sim.planner.name,
        seed=sim.workload.seed,
        metrics=metrics,
        timeseries=downsample(sim.timeline, sim.workload.horizon, max_points),
        occupancy=occupancy,
        gpu_rows=rows if sim.record_occupancy else [],
        horizon=sim.workload.horizon,
        timing=timing,
        node_events=[
            {"t_h": e.time / HOUR, "node": e.node, "kind": e.kind}
            for e in sim.workload.node_events
            if e.time <= sim.workload.horizon
        ],
    )


def downsample(
    timeline: list[tuple[float, float, int, int, float]], horizon: float, max_points: int
) -> dict[str, list[float]]:
    """Time-weighted averages of the step functions over ``max_points`` equal bins."""
    bins = max(1, min(max_points, len(timeline)))
    width = horizon / bins if horizon > 0 else 1.0
    allocated = [0.0] * bins
    available = [0.0] * bins
    frag = [0.0] * bins
    queue = [0.0] * bins
    for index, (start, alloc, avail, queued, fragmentation) in enumerate(timeline):
        end = timeline[index + 1][0] if index + 1 < len(timeline) else horizon
        if end <= start:
            continue
        first = min(bins - 1, int(start // width))
        last = min(bins - 1, int(end // width))
        for b in range(first, last + 1):
            dt = min(end, (b + 1) * width if b < bins - 1 else horizon) - max(start, b * width)
            if dt <= 0:
                continue
            allocated[b] += alloc * dt
            available[b] += avail * dt
            frag[b] += fragmentation * dt
            queue[b] += queued * dt
    return {
        "t_h": [(b + 0.5) * width / HOUR for b in range(bins)],
        "utilization": [a / v if v else 0.0 for a, v in zip(allocated, available, strict=True)],
        "busy_gpus": [a / width for a in allocated],
        "fragmentation": [f / width for f in frag],
        "queue": [q / width for q in queue],
    }
