"""Benchmark: replay the whole Philly trace with ``shaper`` on a 1,000-GPU cluster.

    .venv/bin/python bench/sim.py [TRACE] [--gpus 1000] [--policy shaper] [--replan-min 30]
        [--window-start-h H --window-end-h H] [--solver KEY=VALUE]

Prints the wall time of the simulation (loading excluded, and printed apart) and the
simulated-time / real-time ratio. Re-planning is on a fixed cadence (default every 30
simulated minutes, as the control plane's shaping cycle) rather than on every one of the
~164k arrival and completion events; ``--events`` re-plans on events too (much slower).
Target: ≤ 60 s on 2 cores.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sim.metrics import summarize  # noqa: E402
from sim.run import simulate  # noqa: E402
from sim.traces import TraceOptions, load_trace  # noqa: E402

DEFAULT_TRACE = ROOT / ".." / "shared" / "traces" / "philly" / "philly.csv"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", nargs="?", default=str(DEFAULT_TRACE))
    parser.add_argument("--gpus", type=int, default=1000)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--policy", default="shaper")
    parser.add_argument("--replan-min", type=float, default=30.0)
    parser.add_argument("--events", action="store_true", help="also re-plan on every event")
    parser.add_argument("--max-jobs", type=int, default=None)
    parser.add_argument(
        "--window-start-h", type=float, default=0.0, help="keep jobs submitted from this hour"
    )
    parser.add_argument(
        "--window-end-h", type=float, default=None, help="keep jobs submitted before this hour"
    )
    parser.add_argument("--progress", action="store_true")
    parser.add_argument(
        "--drain",
        action="store_true",
        help="run on past the trace until the queue drains (default: stop at the last "
        "arrival, the span the speed target is set for; completion figures are then censored)",
    )
    parser.add_argument(
        "--solver",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="SolverConfig override, e.g. use_cp_sat=false or time_limit_s=0.5",
    )
    args = parser.parse_args(argv)

    trace = Path(args.trace)
    if not trace.exists():
        print(f"trace not found: {trace}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    options = TraceOptions(
        gpus=args.gpus,
        gpus_per_node=args.gpus_per_node,
        replan_interval_min=args.replan_min,
        max_jobs=args.max_jobs,
        window_start_h=args.window_start_h,
        window_end_h=args.window_end_h,
    )
    workload = load_trace(trace, options=options)
    load_s = time.perf_counter() - started
    started = time.perf_counter()
    overrides: dict[str, object] = {}
    for item in args.solver:
        key, _, value = item.partition("=")
        lowered = value.lower()
        overrides[key] = lowered == "true" if lowered in ("true", "false") else float(value)
    workload.solver_config.update(overrides)
    sim = simulate(
        workload,
        args.policy,
        show_progress=args.progress,
        replan_on_events=args.events,
        validate_plans=False,
        record_occupancy=False,
        drain=args.drain,
    )
    wall = time.perf_counter() - started
    m = summarize(sim).metrics
    simulated = sim.run_end
    print(f"trace            {trace} ({len(workload.jobs):,} jobs)")
    print(f"cluster          {workload.total_gpus} GPUs, {len(workload.nodes)} nodes")
    print(
        f"policy           {args.policy}, re-plan every {args.replan_min:g} min"
        + (" and on events" if args.events else "")
        + (f"; solver config {overrides}" if overrides else "; default solver config")
    )
    print(f"simulated time   {simulated / 86400:.1f} days")
    print(f"load time        {load_s:.1f} s")
    print(
        f"wall time        {wall:.1f} s  (policy {sim.counters.solve_seconds:.1f} s, "
        f"{sim.counters.replans:,} re-plans, "
        f"{1000 * sim.counters.solve_seconds / max(1, sim.counters.replans):.1f} ms each)"
    )
    engines = getattr(sim.planner, "engines", {})
    print("plans won by     " + ", ".join(f"{name} {n:,}" for name, n in sorted(engines.items())))
    print(f"sim/real ratio   {simulated / wall:,.0f}x")
    utilization = m["utilization"]
    assert utilization is not None  # summarize always sets it
    print(f"utilization      {100 * utilization:.1f} %")
    print(f"jobs completed   {m['jobs_completed']:,.0f} of {m['jobs_arrived']:,.0f} arrived")
    bound = "≥ " if m["jct_censored_jobs"] else ""  # unfinished jobs: lower bounds

    def hours(key: str) -> str:
        value = m[key]
        return "–" if value is None else f"{bound}{value:.2f} h"

    print(f"queue wait       mean {hours('queue_wait_mean_h')}, p99 {hours('queue_wait_p99_h')}")
    print(f"JCT              mean {hours('jct_mean_h')}, p99 {hours('jct_p99_h')}")
    print(
        f"migrations       {m['migrations']:.0f} ({m['migration_gpu_hours']:.1f} GPU-h), "
        f"preemptions {m['preemptions']:.0f}"
    )
    print(f"target           {'met' if wall <= 60 else 'MISSED'} (≤ 60 s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
