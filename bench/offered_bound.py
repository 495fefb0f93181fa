"""How high can value and utilization go? Upper bounds from the offered load that hold for
every scheduler, printed beside what the best baseline and ``shaper`` reach.

    python -m bench.offered_bound [SCENARIO ...] [--seeds 1-10 | --seeds default]
                                  [--policies fifo,backfill,priority,shaper]

Issue 12's bar asks, on every contended scenario, for +5 utilization points, 15 % more
priority-weighted value or 20 % lower mean JCT than the best baseline. ``bench.jct_bound``
says how low mean JCT can go; this says how high the other two can. Per seed, one linear
program over the window ``[0, horizon]`` in slots of a clock hour (the hours services'
demand changes on):

* ``x[j, m, t]``: GPU-hours block job ``j`` holds on GPU model ``m`` in slot ``t`` — none
  before its submission, at most its gang × the part of the slot after it (over all models
  together), and no more work than it has (Σ speed × x ≤ gang × work). An elastic
  training job (``BlockJob.max_gpus``) may hold up to its most GPUs, and a GPU-hour of it
  does at most the work it does at its fewest GPUs (value) and at least what it does at
  its most (utilization): with sublinear scaling a GPU does more work the fewer share it;
* ``y[s, m, t]``: GPU-hours service ``s`` serves on model ``m`` in slot ``t``, from its
  start: at most its demand (Σ speed × y ≤ demand × GPUs per replica × slot, a replica on a
  model of speed ``s`` serving ``s``) and its ``max_replicas``;
* per model and slot, all of them at most the GPUs of the nodes up (the workload's node
  failures; draining nodes count, as the simulator's available GPUs do).

Placement on nodes, gangs held whole, running to completion, and checkpoint, restore and
transfer times are left out, so every schedule that keeps each gang on one GPU model (as
every policy here does) is a solution and the optimum bounds them all. (The simulator would
run a gang across models at its slowest GPU's speed, busy time the program does not count.)

* **value**: max Σ weight × speed × x — what ``weighted_output`` counts (reference
  GPU-hours of work by the horizon). Once with the services served as well as a given run
  serves them (all their demand that ``max_replicas`` can serve, less that run's unmet
  replica-hours in all: the bar asks that services be served no worse than ``shaper``
  serves them today), once with no service at all (a bound whatever the services get).
* **utilization**: max Σ x + Σ y over the GPU-hours up — GPU-time that does work. The
  simulator's ``utilization`` also counts GPU-time whose work is later lost, and
  checkpoint, restore and migration time; a run can pass the bound by that much, so the
  table also prints each policy's utilization less that waste (the whole run's, at least
  the window's).
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from ortools.linear_solver import pywraplp
from rich.console import Console

from sim.metrics import RunResult
from sim.report import best_baseline
from sim.run import run_policy
from sim.scenario import builtin_scenarios, load_scenario
from sim.sweep import parse_seeds, seed_workload
from sim.workload import Workload

HOUR = 3600.0
BAR_POINTS = 5.0  # issue 12: +5 utilization points over the best baseline
BAR_VALUE = 1.15  # or 15 % more priority-weighted value


@dataclass(frozen=True)
class OfferedBounds:
    utilization: float  # busy GPU-time doing work / GPU-time up, at most
    value_served: float  # weighted_output at most, services served as well as a given run
    value_any: float  # weighted_output at most, whatever the services get
    gpu_hours_up: float


def up_seconds(workload: Workload, node: str, start: float, end: float) -> float:
    """Seconds of ``[start, end)`` the node is up: down from a ``fail`` event until the
    next ``recover`` (a ``drain`` leaves it up)."""
    # By time only: events at one instant apply in the workload's order, as the engine's.
    events = sorted(
        (
            (event.time, event.kind)
            for event in workload.node_events
            if event.node == node and event.kind in ("fail", "recover")
        ),
        key=lambda event: event[0],
    )
    up, since, total = True, start, 0.0
    for time, kind in events:
        if time <= start:
            up = kind == "recover"
            continue
        if time >= end:
            break
        if up:
            total += time - since
        up, since = kind == "recover", time
    if up:
        total += end - since
    return total


def offered_bounds(workload: Workload, unmet_replica_hours: float = 0.0) -> OfferedBounds:
    """The bounds of ``workload``; ``value_served`` lets the services go short by
    ``unmet_replica_hours`` of demand in all (a run's ``unmet_demand_replica_hours``)."""
    horizon = workload.horizon
    slots = [(t * HOUR, min((t + 1) * HOUR, horizon)) for t in range(math.ceil(horizon / HOUR))]
    capacity = {
        (model, t): sum(
            node.gpus * up_seconds(workload, node.name, start, end)
            for node in workload.nodes
            if node.gpu_model == model
        )
        / HOUR
        for model in workload.gpu_models
        for t, (start, end) in enumerate(slots)
    }
    up = sum(capacity.values())
    busy = _solve(workload, slots, capacity, "utilization", serve=None)
    return OfferedBounds(
        utilization=min(1.0, busy / up) if up else 0.0,
        value_served=_solve(workload, slots, capacity, "value", serve=unmet_replica_hours),
        value_any=_solve(workload, slots, capacity, "value", serve=None),
        gpu_hours_up=up,
    )


def _solve(
    workload: Workload,
    slots: list[tuple[float, float]],
    capacity: dict[tuple[str, int], float],
    objective: str,
    *,
    serve: float | None,
) -> float:
    """The program's optimum: ``objective`` "value" or "utilization" (busy GPU-hours).
    ``serve``: the services must be served but for this many replica-hours of demand in all;
    None: they may be (utilization) or are left out (value)."""
    solver = pywraplp.Solver.CreateSolver("GLOP")
    used: dict[tuple[str, int], list[pywraplp.Variable]] = {key: [] for key in capacity}
    gains: list[tuple[pywraplp.Variable, float]] = []
    models = workload.gpu_models
    for job in workload.jobs:
        weight = workload.team_weight(job.team)  # as weighted_output weighs it
        # Work per GPU-hour held, at most (value) or at least (utilization): 1 for a rigid
        # job; an elastic one does most per GPU at its fewest GPUs, least at its most.
        size = job.min_size if objective == "value" else job.max_size
        efficiency = job.size_factor(size) * job.gpus / size
        work: list[tuple[pywraplp.Variable, float]] = []
        for t, (start, end) in enumerate(slots):
            span = end - max(start, job.submit_time)
            if span <= 0:
                continue
            held = []
            for name, model in models.items():
                if not job.can_run_on(name):
                    continue
                x = solver.NumVar(0.0, solver.infinity(), "")
                speed = job.speed_on(model) * efficiency
                used[(name, t)].append(x)
                held.append(x)
                work.append((x, speed))
                gains.append((x, weight * job.priority * speed if objective == "value" else 1.0))
            solver.Add(solver.Sum(held) <= job.max_size * span / HOUR)
        solver.Add(solver.Sum([speed * x for x, speed in work]) <= job.gpus * job.work / HOUR)
    if serve is not None or objective == "utilization":
        short: list[tuple[float, list[tuple[pywraplp.Variable, float]]]] = []
        for service in workload.services:
            allowed = [(name, m) for name, m in models.items() if service.can_run_on(name)]
            if not allowed:
                continue  # nothing can serve it: nothing to count, nothing to require
            fastest = max(m.speed for _, m in allowed)
            per_replica = service.gpus_per_replica
            for t, (start, end) in enumerate(slots):
                begin = max(start, service.start_time)
                if begin >= end:
                    continue
                span = (end - begin) / HOUR
                served = []
                for name, model in allowed:
                    y = solver.NumVar(0.0, solver.infinity(), "")
                    used[(name, t)].append(y)
                    served.append((y, model.speed))
                    if objective == "utilization":
                        gains.append((y, 1.0))
                demand = service.demand_at(begin) * per_replica * span  # reference GPU-hours
                solver.Add(solver.Sum([speed * y for y, speed in served]) <= demand)
                limit = service.max_replicas * per_replica * span
                solver.Add(solver.Sum([y for y, _ in served]) <= limit)
                # What any plan could serve: the demand, up to max_replicas on the fastest.
                short.append((min(demand, limit * fastest), served))
        if serve is not None:
            # Short of that by at most the allowance, counted in GPU-hours of the largest
            # replica (so the requirement is never stricter than the run's shortfall).
            allowance = serve * max((sv.gpus_per_replica for sv in workload.services), default=1)
            servable = sum(need for need, _ in short)
            solver.Add(
                solver.Sum([speed * y for _, served in short for y, speed in served])
                >= servable - allowance
            )
    for key, held in used.items():
        if held:
            solver.Add(solver.Sum(held) <= capacity[key])
    solver.Maximize(solver.Sum([gain * x for x, gain in gains]))
    status = solver.Solve()
    if status != pywraplp.Solver.OPTIMAL:
        # Only when serving the services as required needs more GPUs than are up.
        return math.nan
    return float(solver.Objective().Value())


def net_utilization(result: RunResult) -> float:
    """A run's utilization less the GPU-time whose work it lost and its checkpoint,
    restore, migration and resize time (over the whole run: at least the window's)."""
    m = result.metrics
    waste = sum(
        float(m.get(key) or 0.0)
        for key in (
            "lost_gpu_hours",
            "checkpoint_gpu_hours",
            "migration_gpu_hours",
            "resize_gpu_hours",
        )
    )
    available = float(m.get("available_gpu_hours") or 0.0)
    return float(m.get("utilization") or 0.0) - (waste / available if available else 0.0)


@dataclass
class SeedRow:
    baseline: str
    util: dict[str, tuple[float, float]]  # policy -> (utilization, net of waste)
    value: dict[str, float]
    bounds: OfferedBounds


def seed_row(workload: Workload, policies: Sequence[str]) -> SeedRow:
    results = {policy: run_policy(workload, policy, drain=True) for policy in policies}
    baseline = best_baseline(results) or policies[0]
    return SeedRow(
        baseline=baseline,
        util={
            p: (float(r.metrics["utilization"] or 0.0), net_utilization(r))
            for p, r in results.items()
        },
        value={p: float(r.metrics["weighted_output"] or 0.0) for p, r in results.items()},
        # The bar: services served no worse than shaper serves them.
        bounds=offered_bounds(
            workload, float(results["shaper"].metrics["unmet_demand_replica_hours"] or 0.0)
        ),
    )


COLUMNS = (
    "scenario",
    "best baseline",
    "its util % (net)",
    "shaper util % (net)",
    "util bound %",
    f"seeds: +{BAR_POINTS:g} pt of work ≤ bound",
    "its value",
    "shaper value",
    "value bound: services as shaper serves them / none",
    f"seeds: ×{BAR_VALUE:g} value ≤ bound (served / none)",
)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenarios", nargs="*", help="default: every built-in scenario")
    parser.add_argument(
        "--seeds", default="1-10", help="e.g. 1-10, or default: each scenario's own seed"
    )
    parser.add_argument("--policies", default="fifo,backfill,priority,shaper")
    args = parser.parse_args(argv)
    scenarios = args.scenarios or builtin_scenarios()
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if "shaper" not in policies or len(policies) < 2:
        parser.error("--policies: shaper and at least one baseline")
    try:
        seeds = None if args.seeds == "default" else parse_seeds(args.seeds)
    except ValueError as exc:
        parser.error(str(exc))
    console = Console(stderr=True)
    lines = [
        f"Seeds {args.seeds} (means over them): the best baseline of each seed, shaper, and "
        "the most any scheduler can reach (net: less lost work and checkpoint, restore "
        "and migration time).",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    for scenario in scenarios:
        own = seeds if seeds is not None else [load_scenario(scenario).seed]
        rows = [seed_row(seed_workload(scenario, seed), policies) for seed in own]
        lines.append("| " + " | ".join([scenario, *_cells(rows)]) + " |")
        console.print(f"{scenario}: done", style="dim")
    print("\n".join(lines))


def _cells(rows: list[SeedRow]) -> list[str]:
    def mean(values: list[float]) -> float:
        return statistics.fmean(values)

    def pct(pairs: list[tuple[float, float]]) -> str:
        return f"{100 * mean([u for u, _ in pairs]):.1f} ({100 * mean([n for _, n in pairs]):.1f})"

    names = sorted({row.baseline for row in rows})
    base_util = [row.util[row.baseline] for row in rows]
    bound_util = [row.bounds.utilization for row in rows]
    base_value = [row.value[row.baseline] for row in rows]
    util_room = sum(
        b[0] + BAR_POINTS / 100 <= u + 1e-9 for b, u in zip(base_util, bound_util, strict=True)
    )
    served = [row.bounds.value_served for row in rows]
    anyway = [row.bounds.value_any for row in rows]
    served_known = [s for s in served if not math.isnan(s)]
    # A seed whose program has no solution (services unservable) counts in neither column.
    value_room = sum(
        BAR_VALUE * v <= s for v, s in zip(base_value, served, strict=True) if not math.isnan(s)
    )
    value_room_any = sum(BAR_VALUE * v <= a for v, a in zip(base_value, anyway, strict=True))
    served_cell = f"{mean(served_known):,.0f}" if served_known else "–"
    return [
        "/".join(names),
        pct(base_util),
        pct([row.util["shaper"] for row in rows]),
        f"{100 * mean(bound_util):.1f}",
        f"{util_room}/{len(rows)}",
        f"{mean(base_value):,.0f}",
        f"{mean([row.value['shaper'] for row in rows]):,.0f}",
        f"{served_cell} / {mean(anyway):,.0f}",
        f"{value_room}/{len(served_known)} / {value_room_any}/{len(rows)}",
    ]


if __name__ == "__main__":
    main()
