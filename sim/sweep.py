"""A scenario over many seeds: how much of a policy's gain is the default seed's luck.

Each seed regenerates the scenario's jobs (arrivals, sizes, durations, priorities) and runs
every policy on them; the gain of each policy over the baseline is then summarized over
the seeds (mean, median, worst). A scenario's table row shows one seed; this shows the
spread behind it.

By default only the window's figures (utilization, value, jobs done by the horizon) are
compared, so the runs stop at the horizon: what happens after it cannot change them. With
``drain`` every run goes on until its queue drains, as the scenario tables do, and each row
also carries the completion times over every job (mean and p99 JCT, makespan, longest
wait): the
summary then says on how many seeds each policy's p99 was no worse than the baseline's,
which one seed's table cannot.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from sim.run import compare
from sim.scenario import load_scenario
from sim.workload import Workload
from solver.instance import SolverConfig


@dataclass(frozen=True, slots=True)
class SeedRow:
    seed: int
    policy: str
    utilization: float
    delta_util_pt: float
    value: float
    # None when the baseline produced no value at all (the ratio is unbounded).
    value_ratio: float | None
    jobs_completed: int
    # Over every job, run to drain (``sweep(drain=True)``); None otherwise.
    jct_mean_h: float | None = None
    jct_p99_h: float | None = None
    makespan_h: float | None = None
    wait_max_h: float | None = None


@dataclass(frozen=True, slots=True)
class Spread:
    mean: float
    median: float
    worst: float
    best: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        return cls(statistics.fmean(values), statistics.median(values), min(values), max(values))


@dataclass(frozen=True, slots=True)
class SweepSummary:
    policy: str
    seeds: int
    delta_util_pt: Spread
    value_ratio: Spread | None
    unbounded_ratios: int
    # With drained runs: the spread of mean and p99 JCT, and the seeds on which the
    # policy's p99 was no worse than the baseline's.
    jct_mean_h: Spread | None = None
    jct_p99_h: Spread | None = None
    makespan_h: Spread | None = None
    p99_no_worse_seeds: int | None = None


def parse_seeds(text: str) -> list[int]:
    """``"1-20"``, ``"3,5,8"`` or a mix (``"1-5,11"``) → the seeds, in order, no repeats."""
    seeds: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        first, dash, last = part.partition("-")
        try:
            low = int(first)
            high = int(last) if dash else low
        except ValueError:
            raise ValueError(f"seeds: {part!r} is not a number or a range like 1-20") from None
        if high < low:
            raise ValueError(f"seeds: range {part!r} runs backwards")
        seeds.extend(s for s in range(low, high + 1) if s not in seeds)
    if not seeds:
        raise ValueError("seeds: no seed given")
    return seeds


def parse_solver_overrides(items: Sequence[str]) -> dict[str, object]:
    """``["gang_aware_placement=true", ...]`` → ``SolverConfig`` overrides, checked against
    its fields (pydantic coerces the strings when the config is built); ``none`` or
    ``null`` is None (``aging_s=none``: aging off)."""
    overrides: dict[str, object] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"solver: {item!r} is not KEY=VALUE")
        text = value.strip()
        overrides[key.strip()] = None if text.lower() in ("none", "null") else text
    SolverConfig.model_validate(overrides)  # an unknown key or a bad value fails here
    return overrides


def sweep(
    scenario: str,
    seeds: Sequence[int],
    policies: Sequence[str],
    *,
    baseline: str = "fifo",
    on_seed: Callable[[int], None] | None = None,
    solver_config: Mapping[str, object] | None = None,
    drain: bool = False,
) -> list[SeedRow]:
    """``solver_config``: overrides of the scenario's ``SolverConfig`` (the shaper's
    levers; the baselines ignore them). ``drain``: run each to its drained queue and
    record completion times (see the module docstring). One seed after the other, here;
    sim.ray_sweep runs the same seeds as Ray tasks."""
    names = policy_names(baseline, policies)
    rows: list[SeedRow] = []
    for seed in seeds:
        metrics = seed_metrics(seed_workload(scenario, seed, solver_config), names, drain=drain)
        rows.extend(seed_rows(seed, metrics, baseline=baseline, drain=drain))
        if on_seed is not None:
            on_seed(seed)
    return rows


def policy_names(baseline: str, policies: Sequence[str]) -> list[str]:
    """The policies each seed runs: the baseline first, no repeats."""
    return list(dict.fromkeys([baseline, *policies]))


def seed_workload(
    scenario: str, seed: int, solver_config: Mapping[str, object] | None = None
) -> Workload:
    """The scenario's jobs for one seed, with the sweep's solver overrides."""
    workload = load_scenario(scenario, seed=seed)
    if solver_config:
        workload = replace(workload, solver_config={**workload.solver_config, **solver_config})
    return workload


Metrics = dict[str, dict[str, float | None]]


def seed_metrics(workload: Workload, names: Sequence[str], *, drain: bool) -> Metrics:
    """Every policy's metrics on one seed's workload: what a seed's run gives back (small,
    so that a remote run returns only this, not the runs' time series)."""
    results = compare(workload, names, drain=drain)
    return {name: dict(results[name].metrics) for name in names}


def seed_rows(seed: int, metrics: Metrics, *, baseline: str, drain: bool) -> list[SeedRow]:
    base = metrics[baseline]
    base_util, base_value = _figure(base, "utilization"), _figure(base, "weighted_output")
    rows = []
    for name, m in metrics.items():
        util, value = _figure(m, "utilization"), _figure(m, "weighted_output")
        rows.append(
            SeedRow(
                seed=seed,
                policy=name,
                utilization=util,
                delta_util_pt=100 * (util - base_util),
                value=value,
                value_ratio=value / base_value if base_value > 0 else None,
                jobs_completed=int(m["jobs_completed_in_window"] or 0),
                jct_mean_h=m["jct_mean_h"] if drain else None,
                jct_p99_h=m["jct_p99_h"] if drain else None,
                makespan_h=m["makespan_h"] if drain else None,
                wait_max_h=m["queue_wait_max_h"] if drain else None,
            )
        )
    return rows


def _figure(metrics: Mapping[str, float | None], key: str) -> float:
    """A figure ``sim.metrics.summarize`` always sets to a number (never None)."""
    value = metrics[key]
    assert value is not None, f"metric {key!r} is None"
    return value


def summarize_sweep(rows: Sequence[SeedRow], baseline: str = "fifo") -> list[SweepSummary]:
    summaries = []
    base_p99 = {r.seed: r.jct_p99_h for r in rows if r.policy == baseline}
    for policy in dict.fromkeys(r.policy for r in rows):
        mine = [r for r in rows if r.policy == policy]
        ratios = [r.value_ratio for r in mine if r.value_ratio is not None]
        means = [r.jct_mean_h for r in mine if r.jct_mean_h is not None]
        p99s = [r.jct_p99_h for r in mine if r.jct_p99_h is not None]
        makespans = [r.makespan_h for r in mine if r.makespan_h is not None]
        # A seed counts when both p99s exist (a run where no job arrived has none).
        compared: list[tuple[float, float]] = []
        for r in mine:
            base = base_p99.get(r.seed)
            if r.jct_p99_h is not None and base is not None:
                compared.append((r.jct_p99_h, base))
        summaries.append(
            SweepSummary(
                policy=policy,
                seeds=len(mine),
                delta_util_pt=Spread.of([r.delta_util_pt for r in mine]),
                value_ratio=Spread.of(ratios) if ratios else None,
                unbounded_ratios=len(mine) - len(ratios),
                jct_mean_h=Spread.of(means) if means else None,
                jct_p99_h=Spread.of(p99s) if p99s else None,
                makespan_h=Spread.of(makespans) if makespans else None,
                p99_no_worse_seeds=(
                    sum(1 for p99, base in compared if p99 <= base + 1e-9) if compared else None
                ),
            )
        )
    return summaries


def sweep_json(scenario: str, baseline: str, rows: Sequence[SeedRow]) -> dict[str, Any]:
    return {
        "scenario": scenario,
        "baseline": baseline,
        "rows": [asdict(r) for r in rows],
        "summary": [asdict(s) for s in summarize_sweep(rows, baseline)],
    }
