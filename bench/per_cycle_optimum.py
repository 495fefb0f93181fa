"""Does planning closer to the optimum win the outcomes? Every built-in scenario replayed
with ``priority`` (the strongest baseline), ``shaper``, and the shaper whose every plan is
replaced by the exact optimum of that cycle's instance when it scores higher.

    python -m bench.per_cycle_optimum [--seeds 1 2 ... 10] [--scenarios mixed ...]
                                      [--time-limit 0.5] [--workers 2]

The benchmark's small-instance section (``bench.solver --exact-sizes``) found the shaper's
plans 7–32 % below the optimum of ``solver.objective`` on instances of 16–64 GPUs, most of
it disruption (moves, stops) the engines do not attempt. Every built-in scenario is small
enough (at most 8 nodes) for ``solver.exact`` to solve each cycle's instance, usually in a
few milliseconds, so this asks the question directly: the ``optimum`` row plans each cycle
as the shaper does, then solves the exact per-node model warm-started from that plan
(``--time-limit`` seconds, one worker) and keeps the exact plan when it is legal
(``validate``) and its objective is higher. Everything else (the simulator, the dwell
rules fed by the shaper's own history, forecasts) is the shaper's.

Prints, per scenario, the mean over seeds of utilization, priority-weighted value, mean and
p99 completion time and makespan (over all submitted jobs: the replay runs until the queue
drains),
services' unmet demand and lost GPU-hours for each row, and how many cycles the optimum
replaced the shaper's plan. Figures, not a test; the simulator is deterministic, so they
vary only with the OR-Tools search (a time limit that cuts a search short).
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from sim.adapter import SolverPlanner
from sim.metrics import summarize
from sim.run import run_policy, simulate
from sim.scenario import builtin_scenarios, load_scenario
from solver.exact import MAX_JOBS, MAX_NODES, check_size, solve_exact
from solver.instance import Instance
from solver.plan import Plan
from solver.solve import solve

ROWS = ("priority", "shaper", "optimum")
METRICS = (
    ("utilization", "util %", 100.0),
    ("weighted_output", "value", 1.0),
    ("jct_mean_h", "JCT mean h", 1.0),
    ("jct_p99_h", "JCT p99 h", 1.0),
    ("makespan_h", "makespan h", 1.0),
    ("unmet_demand_replica_hours", "unmet rep-h", 1.0),
    ("lost_gpu_hours", "lost GPU-h", 1.0),
)


@dataclass
class PerCycleOptimum:
    """The shaper's plan, replaced by the cycle's exact optimum where that scores higher."""

    time_limit_s: float
    name: str = "optimum"
    cycles: int = 0
    replaced: int = 0
    too_large: int = 0
    unmodelled: int = 0  # cycles with what the exact model refuses (elastic training jobs)
    gains: list[float] = field(default_factory=list)

    def plan(self, instance: Instance) -> Plan:
        base = solve(instance, policy="shaper")
        self.cycles += 1
        if len(instance.nodes) > MAX_NODES or len(instance.jobs) > MAX_JOBS:
            self.too_large += 1
            return base
        try:
            check_size(instance)
        except ValueError:  # e.g. elastic training jobs: the shaper's plan stands
            self.unmodelled += 1
            return base
        exact = solve_exact(
            instance, time_limit_s=self.time_limit_s, num_workers=1, hint=base.placement
        )
        if exact.plan is None or exact.violations or exact.objective is None:
            return base
        if exact.objective <= base.stats.objective + 1e-6:
            return base
        self.replaced += 1
        self.gains.append(exact.objective - base.stats.objective)
        return exact.plan


def _one(task: tuple[str, int, float]) -> tuple[str, int, dict[str, dict[str, float]], str]:
    scenario, seed, time_limit_s = task
    workload = load_scenario(scenario, seed=seed)
    rows: dict[str, dict[str, float]] = {}
    for policy in ("priority", "shaper"):
        metrics = run_policy(workload, policy, diagnose=False).metrics
        rows[policy] = {key: float(metrics.get(key) or 0.0) for key, _, _ in METRICS}
    # The shaper's own planner (its forecasts, run-time estimates and dwell history), with
    # only the plan of each cycle swapped.
    planner = SolverPlanner("shaper")
    optimum = PerCycleOptimum(time_limit_s=time_limit_s)
    planner.policy = optimum
    metrics = summarize(simulate(workload, planner, diagnose=False)).metrics
    rows["optimum"] = {key: float(metrics.get(key) or 0.0) for key, _, _ in METRICS}
    note = f"{optimum.replaced}/{optimum.cycles}"
    if optimum.too_large:
        note += f" ({optimum.too_large} too large)"
    if optimum.unmodelled:
        note += f" ({optimum.unmodelled} not modelled)"
    return scenario, seed, rows, note


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(1, 11)))
    parser.add_argument("--scenarios", nargs="+", default=None, help="default: every built-in")
    parser.add_argument("--time-limit", type=float, default=0.5, help="exact model, per cycle")
    parser.add_argument("--workers", type=int, default=2, help="processes (one run each)")
    args = parser.parse_args(argv)
    scenarios = args.scenarios or builtin_scenarios()
    tasks = [(s, seed, args.time_limit) for s in scenarios for seed in args.seeds]
    console = Console(width=160)
    results: dict[str, dict[int, dict[str, dict[str, float]]]] = {}
    notes: dict[str, list[str]] = {}
    started = time.perf_counter()
    with (
        Progress(console=console, transient=True) as progress,
        ProcessPoolExecutor(args.workers) as pool,
    ):
        bar = progress.add_task("scenario × seed", total=len(tasks))
        for scenario, seed, rows, note in pool.map(_one, tasks):
            results.setdefault(scenario, {})[seed] = rows
            notes.setdefault(scenario, []).append(note)
            progress.advance(bar)
    table = Table(title=f"Per-cycle optimum vs shaper vs priority, mean of seeds {args.seeds}")
    table.add_column("scenario")
    table.add_column("row")
    for _, label, _ in METRICS:
        table.add_column(label, justify="right")
    table.add_column("plans replaced", justify="right")
    for scenario in scenarios:
        for row in ROWS:
            cells = []
            for key, _, scale in METRICS:
                mean = statistics.fmean(results[scenario][s][row][key] for s in args.seeds)
                cells.append(f"{mean * scale:,.1f}")
            replaced = ""
            if row == "optimum":
                counts = [n.split()[0].split("/") for n in notes[scenario]]
                replaced = f"{sum(int(a) for a, _ in counts)}/{sum(int(b) for _, b in counts)}"
                skipped = sum(
                    int(found.group(1))
                    for n in notes[scenario]
                    if (found := re.search(r"\((\d+) not modelled\)", n))
                )
                if skipped:
                    replaced += f" ({skipped} not modelled)"
            table.add_row(scenario if row == "priority" else "", row, *cells, replaced)
        table.add_section()
    console.print(table)
    console.print(f"{len(tasks)} runs in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
