"""How low can mean JCT go? Two lower bounds on a workload's mean job completion time that
hold for every scheduler, printed beside what ``priority`` and ``shaper`` reach.

    python -m bench.jct_bound [SCENARIO ...] [--seeds 1-10] [--policies priority,shaper]

Issue 12 asks for ≥ 20 % lower mean JCT than the best baseline; this says where that is
possible at all. Per seed, the bound is the larger of

(a) **no waiting**: every job starts at its submission on the fastest GPU model it may use,
    so its completion time is at least its run time there (an elastic training job's at
    its most GPUs);
(b) **mean busy time** (Goemans' LP relaxation of one machine with release dates): the
    cluster pooled into one machine of rate Σ GPUs × the fastest speed any job has on their
    model, each job an area of GPUs × work (an elastic training job's least over its
    sizes). In any real schedule job ``j`` completes at its mean busy time plus at least
    half its run time (an elastic job: half its least area over the most GPU-seconds per
    second it can be processed at, its most GPUs on its fastest model), and the total rate
    at any instant is at most the pooled machine's, so Σ completion ≥ (Σ mean busy time of
    preemptive smallest-area-first on the pooled machine, which minimises it) + Σ of
    those halves.

Services and node failures are left out, which only loosens the bounds (they take GPUs).
JCT is over the block jobs, as ``jct_mean_h`` is; the replays run until the queue drains.
"""

from __future__ import annotations

import argparse
import heapq
import statistics
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from sim.run import run_policy
from sim.scenario import builtin_scenarios
from sim.sweep import parse_seeds, seed_workload
from sim.workload import BlockJob, Workload

HOUR = 3600.0


def run_time_floor(workload: Workload, job_index: int) -> float:
    """The job's run time on the fastest model it may use (seconds), at its most GPUs if
    it is elastic training."""
    job = workload.jobs[job_index]
    speeds = [
        job.speed_on(model) for name, model in workload.gpu_models.items() if job.can_run_on(name)
    ]
    return job.work / max(speeds) / job.size_factor(job.max_size)


def busy_span_floor(workload: Workload, job_index: int) -> float:
    """The least time the job's area takes at the most GPU-seconds per second it can be
    processed at (its most GPUs on the fastest model it may use): its run time floor for
    a rigid job; for an elastic one with sublinear scaling, less (it may run small, then
    burst at its most GPUs, and still end no sooner than its mean busy time plus half this:
    what step (b) needs)."""
    job = workload.jobs[job_index]
    speeds = [
        job.speed_on(model) for name, model in workload.gpu_models.items() if job.can_run_on(name)
    ]
    return least_area(job) / (job.max_size * max(speeds))


def least_area(job: BlockJob) -> float:
    """GPU-seconds of the job's work at reference speed: its gang × its work, or for an
    elastic training job the least over its sizes (at its fewest GPUs when it scales
    sublinearly: each GPU does more the fewer share the job)."""
    if not job.elastic:
        return job.gpus * job.work
    return min(size * job.work / job.size_factor(size) for size in (job.min_size, job.max_size))


def pooled_rate(workload: Workload) -> float:
    """The whole cluster as one machine: GPUs × the fastest speed any job has there."""
    fastest = {
        name: max(job.speed_on(model) for job in workload.jobs)
        for name, model in workload.gpu_models.items()
    }
    return sum(node.gpus * fastest[node.gpu_model] for node in workload.nodes)


def mean_busy_time_sum(jobs: Sequence[tuple[float, float]], rate: float) -> float:
    """Σ mean busy time of (release, area) jobs on one machine of ``rate`` under preemptive
    smallest-area-first (optimal for that sum, Goemans 1996). A job's mean busy time is the
    average, over its area, of the instants it is processed."""
    pending = sorted(jobs)
    heap: list[list[float]] = []  # [area, area left, ∫ t dA so far]
    now, i, total = 0.0, 0, 0.0
    while i < len(pending) or heap:
        if not heap:
            now = max(now, pending[i][0])
        while i < len(pending) and pending[i][0] <= now:
            area = pending[i][1]
            heapq.heappush(heap, [area, area, 0.0])
            i += 1
        entry = heap[0]
        next_release = pending[i][0] if i < len(pending) else float("inf")
        run = min(entry[1] / rate, next_release - now)
        entry[2] += rate * ((now + run) ** 2 - now**2) / 2
        entry[1] -= run * rate
        now += run
        if entry[1] <= 1e-9 * entry[0]:
            heapq.heappop(heap)
            total += entry[2] / entry[0]
    return total


def mean_jct_bound_h(workload: Workload) -> tuple[float, str]:
    """The larger of the two bounds on mean JCT (hours), and which one it is."""
    jobs = workload.jobs
    if not jobs:
        return 0.0, "-"
    run_times = [run_time_floor(workload, i) for i in range(len(jobs))]
    no_wait = sum(run_times)
    areas = [(job.submit_time, least_area(job)) for job in jobs]
    busy = (
        mean_busy_time_sum(areas, pooled_rate(workload))
        + sum(busy_span_floor(workload, i) for i in range(len(jobs))) / 2
        - sum(job.submit_time for job in jobs)
    )
    best, which = (no_wait, "a") if no_wait >= busy else (busy, "b")
    return best / len(jobs) / HOUR, which


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenarios", nargs="*", help="default: every built-in scenario")
    parser.add_argument("--seeds", default="1-10")
    parser.add_argument("--policies", default="priority,shaper")
    args = parser.parse_args(argv)
    scenarios = args.scenarios or builtin_scenarios()
    seeds = parse_seeds(args.seeds)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    table = Table(title=f"Mean JCT (h), seeds {args.seeds}: each policy and the lower bound")
    table.add_column("scenario")
    for policy in policies:
        table.add_column(policy, justify="right")
    table.add_column("lower bound (which)", justify="right")
    table.add_column(f"most it can fall below {policies[0]}", justify="right")
    console = Console()
    for scenario in scenarios:
        reached: dict[str, list[float]] = {p: [] for p in policies}
        bounds, kinds = [], set()
        for seed in seeds:
            workload = seed_workload(scenario, seed)
            bound, kind = mean_jct_bound_h(workload)
            bounds.append(bound)
            kinds.add(kind)
            for policy in policies:
                jct = run_policy(workload, policy, drain=True).metrics["jct_mean_h"]
                reached[policy].append(float(jct or 0.0))
        first = statistics.fmean(reached[policies[0]])
        bound = statistics.fmean(bounds)
        table.add_row(
            scenario,
            *(f"{statistics.fmean(reached[p]):.2f}" for p in policies),
            f"{bound:.2f} ({'/'.join(sorted(kinds))})",
            f"{100 * (first - bound) / first:.0f} %" if first else "–",
        )
        console.print(f"{scenario}: done", style="dim")
    console.print(table)


if __name__ == "__main__":
    main()
