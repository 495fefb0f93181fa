"""Run a workload under one policy or several, with an optional rich progress bar."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from sim.adapter import ForecastMode, RuntimeMode, SolverPlanner
from sim.engine import Planner, Simulation
from sim.metrics import RunResult, summarize
from sim.workload import Workload

POLICIES = ("fifo", "backfill", "priority", "shaper")
# Shaper with one lever off (``solver.SolverConfig``): the ablation rows of the tables, so
# that every gain is attributed to the lever that made it.
ABLATIONS: dict[str, dict[str, object]] = {
    "shaper, no migration": {"migration": False},
    "shaper, no preemption": {"preemption": False},
    "shaper, no replica moves": {"replica_moves": False},
    "shaper, no look-ahead": {"lookahead": False},
    "shaper, no service resize": {"elastic_resize": False},
    "shaper, greedy only (no CP-SAT)": {"use_cp_sat": False},
    "shaper, larger first, no aging": {"shortest_first": False, "aging_s": None},
    "shaper, no upgrades": {"upgrades": False},
    "shaper, no gang upgrades": {"gang_upgrades": False},
    "shaper, no per-job speeds": {"job_speeds": False},
    "shaper, no elastic training": {"elastic_training": False},
    "shaper, no elastic growth": {"elastic_growth": False},
    "shaper, no smaller elastic starts": {"elastic_smaller_starts": False},
}


@contextmanager
def progress_bar(enabled: bool, label: str, unit: str = "of simulated time") -> Iterator[Any]:
    """Yield a ``callback(now, horizon)`` that drives a rich progress bar (or does nothing).
    ``unit`` says what the percentage is of (a sweep counts its runs, not simulated time)."""
    if not enabled:
        yield None
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn(f"{{task.percentage:>5.1f}}% {unit}"),
        TimeElapsedColumn(),
        transient=True,
    ) as bar:
        task = bar.add_task(label, total=1.0)
        last = [0.0]

        def update(now: float, horizon: float) -> None:
            done = now / horizon if horizon else 1.0
            if done > 1.0:
                # Past the horizon the run drains the queue: say how far it has gone.
                if done - last[0] >= 0.05:
                    last[0] = done
                    bar.update(
                        task,
                        completed=1.0,
                        description=f"{label} · draining the queue, t = {now / 3600:.0f} h",
                    )
                return
            if done - last[0] >= 0.005 or done >= 1.0:
                last[0] = done
                bar.update(task, completed=done)

        yield update


def simulate(
    workload: Workload,
    policy: str | Planner,
    *,
    show_progress: bool = False,
    check_invariants: bool = False,
    validate_plans: bool = True,
    replan_interval: float | None = None,
    replan_on_events: bool = True,
    min_replan_gap: float = 0.0,
    record_occupancy: bool | None = None,
    drain: bool = True,
    drain_cap: float | None = None,
    diagnose: bool = True,
    forecast: str = ForecastMode.perfect,
    runtime: str = RuntimeMode.exact,
    progress: Callable[[float, float], None] | None = None,
) -> Simulation:
    """forecast, runtime: where services' demand forecasts and block jobs' run times come
    from (``sim.adapter.ForecastMode``, ``RuntimeMode``); only for a policy given by name.
    progress: called as ``progress(now, horizon)`` instead of the bar (the dashboard's
    what-if runs, ``app.simulations.runner``)."""
    planner = (
        SolverPlanner(policy, validate=validate_plans, forecast=forecast, runtime=runtime)
        if isinstance(policy, str)
        else policy
    )
    with progress_bar(show_progress, f"{workload.name} · {planner.name}") as callback:
        sim = Simulation(
            workload,
            planner,
            replan_interval=replan_interval,
            replan_on_events=replan_on_events,
            min_replan_gap=min_replan_gap,
            record_occupancy=record_occupancy,
            check_invariants=check_invariants,
            progress=progress or callback,
            drain=drain,
            drain_cap=drain_cap,
            diagnose=diagnose,
        )
        sim.run()
    return sim


def run_policy(workload: Workload, policy: str, **kwargs: Any) -> RunResult:
    return summarize(simulate(workload, policy, **kwargs))


def compare(
    workload: Workload, policies: Sequence[str] = POLICIES, **kwargs: Any
) -> dict[str, RunResult]:
    return {policy: run_policy(workload, policy, **kwargs) for policy in policies}


def run_ablations(workload: Workload, **kwargs: Any) -> dict[str, RunResult]:
    """``shaper`` once per entry of :data:`ABLATIONS`, on the same workload."""
    results = {}
    for label, change in ABLATIONS.items():
        variant = replace(workload, solver_config={**workload.solver_config, **change})
        result = run_policy(variant, "shaper", **kwargs)
        result.policy = label
        results[label] = result
    return results


def write_results(results: dict[str, RunResult] | RunResult, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(results, RunResult):
        payload: Any = results.to_json()
    else:
        payload = {"runs": {name: r.to_json() for name, r in results.items()}}
    path.write_text(json.dumps(payload, indent=1, sort_keys=True))
    return path
