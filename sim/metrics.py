"""Metrics of a finished run, and its JSON form for the dashboard.

A run has two spans. The *window* is ``[0, horizon]``: arrivals and node events happen in
it, and the rates are measured over it. After the horizon the run goes on with no new
arrivals until every job is done or the cap is reached (``Simulation.drain``), and the
completion figures are measured over the whole run, so that they cannot flatter a policy
that finishes short jobs and leaves long ones queued.

Over the window (all GPU-times in GPU-hours):

* ``utilization``: busy GPU-time / available GPU-time (GPUs of nodes that are up). Busy
  = held by a block job (restore and migration time included: it is allocated, and its
  cost shows in ``migration_gpu_hours``/``checkpoint_gpu_hours``) + GPUs dumping the
  checkpoint of a job that left them + held by a service replica that serves demand. A
  replica reserved beyond the demand of the hour (FIFO reserves the daily peak) is
  allocated but idle: ``allocated_utilization`` counts it, ``utilization`` does not.
  ``utilization_of_capacity`` divides busy GPU-time by all GPUs, failed nodes included.
* ``weighted_output``: Σ team weight × priority × useful GPU-hours of block jobs by the
  horizon. Useful work is what survives: the whole job when completed, otherwise what is
  checkpointed at the horizon (a running checkpointable job can be checkpointed then;
  work lost to preemption, failure or a missing checkpoint never counts). Migration and
  restore time is not useful work. ``jobs_completed_in_window`` counts jobs done by then.
* ``unmet_demand``: replica-hours of service demand not served (a replica on a model of
  speed ``s`` serves ``s``); ``sla_violations``: service-hours served below
  ``sla_target`` × demand; ``service_gpu_hours``: GPU-hours services held, serving or not.
* ``fragmentation``: time-averaged share of idle GPUs that sit on nodes with fewer free
  GPUs than the smallest queued job needs (0 when nothing waits).
  ``fragmentation_blocked_share``: share of re-plans at which some queued job fitted the
  free GPUs taken together but not on the fewest nodes its gang may span — the re-plans
  at which moving work could have admitted it. 0 means capacity, not fragmentation, kept
  jobs waiting.
* ``idle_<cause>_gpu_hours``: why GPUs were idle, one cause per idle GPU-hour
  (``solver.diagnosis.causes``, mapped from the simulator's state by ``sim.diagnosis``);
  they add up to capacity − busy GPU-hours, failed nodes included (``draining_down``).
  ``RunResult.idle_causes`` has the same by GPU model, team and hour.

Over the whole run:

* ``jct_*``: completion time − submit time of *every* job that arrived. A job not done
  when the run ends is censored at that time, so with ``jct_censored_jobs > 0`` the mean
  and percentiles are lower bounds (the tables print them as "≥"); ``completed_share`` is
  the share of jobs done. ``queue_wait_*``: time queued (before the first start and after
  every preemption), same jobs, same censoring. ``makespan_h``: the last completion, or
  the end of the run when some job never completed (a lower bound then). ``None`` (shown
  as "–") where a figure is undefined, e.g. no job arrived.
* GPU-time by where it went (``sim.ledger``): ``allocated_block_gpu_hours`` =
  ``productive`` + ``lost`` + ``in_flight`` + ``checkpoint`` + ``migration`` + ``resize``
  GPU-hours, checked per job; ``unaccounted_gpu_hours`` is the gap (0 up to rounding).
  ``resizes`` counts the rescales of elastic training jobs (a checkpoint and a restart at
  another size, beside ``migrations``), ``resize_gpu_hours`` what they cost.
* Between clusters: ``remote_starts`` counts starts and migrations in a cluster other
  than the one the job's image was in, ``gib_crossed`` the GiB of images sent for them,
  ``egress_gpu_hours`` what that data leaving its site cost at the scenario's
  ``transfer.inter_cluster_egress_gpu_s_per_gib`` (money in GPU-hours, outside the ledger:
  no GPU waits for it; 0 when egress is not priced).
* Churn: ``policy_actions`` counts what the policy's plans did — starts, migrations,
  rescales, preemptions and requeues of block jobs, resizes of services (those that changed the
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

from sim.diagnosis import idle_metric
from sim.engine import JobStatus, Simulation
from sim.ledger import CATEGORIES
from solver.diagnosis import IdleCause

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
    metrics: dict[str, float | None]
    timeseries: dict[str, list[float]]
    occupancy: list[dict[str, Any]] = field(default_factory=list)
    gpu_rows: list[str] = field(default_factory=list)
    horizon: float = 0.0
    run_end: float = 0.0
    timing: dict[str, float] = field(default_factory=dict)
    node_events: list[dict[str, Any]] = field(default_factory=list)
    # Why GPUs sat idle over the window (``sim.diagnosis.IdleTracker.summary``).
    idle_causes: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "policy": self.policy,
            "seed": self.seed,
            "horizon_s": self.horizon,
            "run_end_s": self.run_end,
            "metrics": self.metrics,
            "timeseries": self.timeseries,
            "gpu_rows": self.gpu_rows,
            "occupancy": self.occupancy,
            "node_events": self.node_events,
            "timing": self.timing,
            "idle_causes": self.idle_causes,
        }


def acted_within(times: list[float], window: float = CHURN_WINDOW_S) -> bool:
    """Whether two of these (ordered) action times are less than ``window`` apart."""
    return any(later - earlier < window for earlier, later in itertools.pairwise(times))


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) / HOUR if values else None


def _pct(values: list[float], q: float) -> float | None:
    return _percentile(values, q) / HOUR if values else None


def summarize(sim: Simulation, *, max_points: int = 400) -> RunResult:
    c = sim.counters
    w = sim.window or c
    horizon = sim.workload.horizon
    end = sim.run_end
    useful = 0.0
    weighted = 0.0
    jct: list[float] = []
    waits: list[float] = []
    completed = 0
    completed_in_window = 0
    censored = 0
    last_completion = 0.0
    ledger = dict.fromkeys(CATEGORIES, 0.0)
    allocated_block = 0.0
    for state in sim.jobs.values():
        spec = state.spec
        kept = state.kept_at_horizon if state.kept_at_horizon is not None else state.checkpointed
        gpu_hours = kept * spec.gpus / HOUR
        useful += gpu_hours
        weighted += sim.workload.team_weight(spec.team) * spec.priority * gpu_hours
        waits.append(state.queue_wait)
        if state.status == JobStatus.done and state.end_time is not None:
            completed += 1
            completed_in_window += state.end_time <= horizon + 1e-6
            jct.append(state.end_time - spec.submit_time)
            last_completion = max(last_completion, state.end_time)
        else:
            censored += 1
            jct.append(end - spec.submit_time)
        for name, value in state.ledger.totals().items():
            ledger[name] += value
        allocated_block += state.ledger.allocated
    violations = 0
    for (service_id, hour), (demand, served) in sim.service_hours.items():
        if hour * HOUR >= horizon:
            continue  # the window's SLA; the drain only finishes block jobs
        target = sim.services[service_id].spec.sla_target
        if demand > 0 and served < target * demand - 1e-6:
            violations += 1
    block_actions = sum(len(state.acted_at) for state in sim.jobs.values())
    resizes = sum(len(svc.resized_at) for svc in sim.services.values())
    acted_twice = sum(1 for state in sim.jobs.values() if acted_within(state.acted_at))
    job_hours = c.block_job_seconds / HOUR
    available = w.available_gpu_seconds or 1.0
    block_busy = w.block_gpu_seconds + w.draining_gpu_seconds
    busy = block_busy + w.serving_gpu_seconds
    arrived = len(sim.jobs)
    metrics: dict[str, float | None] = {
        "gpus": float(sim.workload.total_gpus),
        "horizon_h": horizon / HOUR,
        "run_end_h": end / HOUR,
        "drained": float(sim.drained),
        "drain_cap_hit": float(sim.drain and not sim.drained),
        "utilization": busy / available,
        "allocated_utilization": (w.allocated_gpu_seconds + w.draining_gpu_seconds) / available,
        "utilization_of_capacity": busy / (w.capacity_gpu_seconds or 1.0),
        "block_utilization": block_busy / available,
        "allocated_gpu_hours": (w.allocated_gpu_seconds + w.draining_gpu_seconds) / HOUR,
        "available_gpu_hours": w.available_gpu_seconds / HOUR,
        "useful_gpu_hours": useful,
        "weighted_output": weighted,
        "jobs_submitted": float(len(sim.workload.jobs)),
        "jobs_arrived": float(arrived),
        "jobs_completed": float(completed),
        "jobs_completed_in_window": float(completed_in_window),
        "completed_share": completed / arrived if arrived else None,
        "jobs_running_at_end": float(len(sim.running)),
        "jobs_queued_at_end": float(len(sim.queue)),
        "jct_censored_jobs": float(censored),
        "jct_mean_h": _mean(jct),
        "jct_p50_h": _pct(jct, 50),
        "jct_p99_h": _pct(jct, 99),
        "jct_max_h": max(jct) / HOUR if jct else None,
        "makespan_h": (end if censored else last_completion) / HOUR if arrived else None,
        "queue_wait_mean_h": _mean(waits),
        "queue_wait_p50_h": _pct(waits, 50),
        "queue_wait_p99_h": _pct(waits, 99),
        "queue_wait_max_h": max(waits) / HOUR if waits else None,
        "demand_replica_hours": w.demand_seconds / HOUR,
        "unmet_demand_replica_hours": w.unmet_demand_seconds / HOUR,
        "service_gpu_hours": w.service_gpu_seconds / HOUR,
        "sla_violations": float(violations),
        "migrations": float(c.migrations),
        "resizes": float(c.resizes),
        "remote_starts": float(c.remote_starts),
        "gib_crossed": c.gib_crossed,
        "egress_gpu_hours": sim.workload.transfer.egress_gpu_seconds(c.gib_crossed) / HOUR,
        "preemptions": float(c.preemptions),
        "failure_evictions": float(c.evictions),
        "allocated_block_gpu_hours": allocated_block / HOUR,
        "productive_gpu_hours": ledger["productive"] / HOUR,
        "lost_gpu_hours": ledger["lost"] / HOUR,
        "in_flight_gpu_hours": ledger["in_flight"] / HOUR,
        "checkpoint_gpu_hours": ledger["checkpoint"] / HOUR,
        "migration_gpu_hours": ledger["migration"] / HOUR,
        "resize_gpu_hours": ledger["resize"] / HOUR,
        "unaccounted_gpu_hours": (
            c.block_gpu_seconds + c.draining_gpu_seconds - sum(ledger.values())
        )
        / HOUR,
        "fragmentation": w.fragmented_gpu_seconds / w.idle_gpu_seconds
        if w.idle_gpu_seconds
        else 0.0,
        "replans": float(c.replans),
        "fragmentation_blocked_share": (
            w.fragmentation_blocked_replans / w.replans if w.replans else 0.0
        ),
        "rejected_actions": float(c.rejected_actions),
        "policy_actions": float(block_actions + resizes),
        "block_job_hours": job_hours,
        "actions_per_job_hour": (block_actions + resizes) / job_hours if job_hours else 0.0,
        "jobs_acted_twice_10min": float(acted_twice),
    }
    idle_causes = sim.idle.summary() if sim.idle is not None else {}
    for cause, hours in idle_causes.get("by_cause", {}).items():
        metrics[idle_metric(IdleCause(cause))] = hours
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
        timeseries=downsample(sim.timeline, end, max_points),
        occupancy=occupancy,
        gpu_rows=rows if sim.record_occupancy else [],
        horizon=horizon,
        run_end=end,
        timing=timing,
        idle_causes=idle_causes,
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
