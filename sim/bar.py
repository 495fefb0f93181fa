"""Issue 12's bar and issue 20's p99 goal, scenario by scenario, over many seeds: one
command for the table the README shows (``shaper sim bar``).

Every scenario runs on each seed under ``fifo``, ``backfill``, ``priority`` and
``shaper``, each until its queue drains (``sim.sweep.seed_metrics``). Per scenario the
figures are the means over the seeds, and:

* the **best baseline** is the baseline with the most value, then utilization, then the
  lowest mean JCT (``sim.report.best_baseline``'s rule, on the means);
* the **bar** (issue 12) is cleared when ``shaper`` has at least ``UTIL_POINTS`` more
  utilization points, or ``VALUE_GAIN`` more value, or a mean JCT ``JCT_CUT`` lower at
  equal or better utilization — and is not worse than the best baseline on any of the
  three by more than ``WORSE`` (relative; a tie is not a win);
* **p99** (issue 20) compares ``shaper``'s mean p99 JCT with the lowest of the
  baselines'.

Each is also counted seed by seed, against the same baselines (the bar names one best
baseline per scenario), which says how much a mean owes to a few seeds. Services' unmet
demand and SLA hours are shown beside: the bar also asks that they be no worse than they
were, which is a comparison with history, not with a baseline, so they are reported
rather than judged here.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

from sim.report import strength
from sim.sweep import Metrics, seed_metrics, seed_workload

BASELINES = ("fifo", "backfill", "priority")
MINE = "shaper"
POLICIES = (*BASELINES, MINE)
UTIL_POINTS = 5.0  # utilization points more
VALUE_GAIN = 0.15  # × more value
JCT_CUT = 0.20  # × lower mean JCT, at equal or better utilization
WORSE = 0.01  # worse than the best baseline by more than this share breaks the bar
EPS = 1e-9  # figures exactly at a threshold meet it (float arithmetic aside)


@dataclass(frozen=True, slots=True)
class Figures:
    """One policy's figures: one seed's, or the mean over seeds (None where a figure is
    undefined on every seed: no job completed)."""

    utilization: float
    value: float
    jct_mean_h: float | None
    jct_p99_h: float | None
    makespan_h: float | None
    unmet_replica_h: float
    sla_violation_h: float

    @classmethod
    def of(cls, metrics: Mapping[str, float | None]) -> Figures:
        return cls(
            utilization=_number(metrics, "utilization"),
            value=_number(metrics, "weighted_output"),
            jct_mean_h=metrics.get("jct_mean_h"),
            jct_p99_h=metrics.get("jct_p99_h"),
            makespan_h=metrics.get("makespan_h"),
            unmet_replica_h=metrics.get("unmet_demand_replica_hours") or 0.0,
            sla_violation_h=metrics.get("sla_violations") or 0.0,
        )

    @classmethod
    def mean(cls, figures: Sequence[Figures]) -> Figures:
        return cls(
            utilization=statistics.fmean(f.utilization for f in figures),
            value=statistics.fmean(f.value for f in figures),
            jct_mean_h=_mean_of(f.jct_mean_h for f in figures),
            jct_p99_h=_mean_of(f.jct_p99_h for f in figures),
            makespan_h=_mean_of(f.makespan_h for f in figures),
            unmet_replica_h=statistics.fmean(f.unmet_replica_h for f in figures),
            sla_violation_h=statistics.fmean(f.sla_violation_h for f in figures),
        )


@dataclass(frozen=True, slots=True)
class Verdict:
    """``shaper`` against one baseline on the bar's three figures."""

    delta_util_pt: float
    value_change: float | None  # × − 1; None when the baseline earned no value
    jct_change: float | None  # × − 1; None when either mean JCT is undefined
    cleared: bool
    worse_on: tuple[str, ...]  # the figures more than WORSE worse than the baseline's


@dataclass(frozen=True, slots=True)
class BarRow:
    scenario: str
    seeds: int
    best: str  # the best baseline of the means
    mine: Figures
    base: Figures
    verdict: Verdict
    seeds_cleared: int  # seeds on which the bar is cleared against ``best``
    p99_best: str  # the baseline with the lowest mean p99 ("–": none has one)
    p99_best_h: float | None  # its mean p99
    p99_no_worse: bool | None  # None when a p99 is undefined
    seeds_p99_no_worse: int  # seeds on which shaper's p99 is no worse than ``p99_best``'s


def judge(mine: Figures, base: Figures) -> Verdict:
    """The bar: one of the three wins, and none of the three more than ``WORSE`` worse."""
    delta = 100 * (mine.utilization - base.utilization)
    value_change = mine.value / base.value - 1 if base.value > 0 else None
    jct_change = None
    if mine.jct_mean_h is not None and base.jct_mean_h:
        jct_change = mine.jct_mean_h / base.jct_mean_h - 1
    worse: list[str] = []
    if mine.utilization < base.utilization * (1 - WORSE):
        worse.append("utilization")
    if mine.value < base.value * (1 - WORSE):
        worse.append("value")
    if jct_change is not None and jct_change > WORSE:
        worse.append("mean JCT")
    wins = (
        delta >= UTIL_POINTS - EPS
        or (value_change is not None and value_change >= VALUE_GAIN - EPS)
        or (
            jct_change is not None
            and jct_change <= -JCT_CUT + EPS
            and mine.utilization >= base.utilization - EPS
        )
    )
    return Verdict(delta, value_change, jct_change, wins and not worse, tuple(worse))


def best_of(figures: Mapping[str, Figures]) -> str:
    """The best baseline: most value, then utilization, then the lowest mean JCT (the
    table's rule, ``sim.report.strength``)."""
    return max(
        (name for name in figures if name != MINE),
        key=lambda n: strength(figures[n].value, figures[n].utilization, figures[n].jct_mean_h),
    )


def lowest_p99(figures: Mapping[str, Figures]) -> str | None:
    """The baseline with the lowest p99 JCT (None if no baseline has one)."""
    known = [n for n in figures if n != MINE and figures[n].jct_p99_h is not None]
    return min(known, key=lambda n: figures[n].jct_p99_h or 0.0) if known else None


def _p99_no_worse(figures: Mapping[str, Figures], best: str | None) -> bool | None:
    mine = figures[MINE].jct_p99_h
    theirs = figures[best].jct_p99_h if best is not None else None
    if mine is None or theirs is None:
        return None
    return mine <= theirs


def bar_row(scenario: str, per_seed: Mapping[int, Mapping[str, Figures]]) -> BarRow:
    """One scenario's row from each seed's figures per policy."""
    names = list(next(iter(per_seed.values())))
    means = {name: Figures.mean([seed[name] for seed in per_seed.values()]) for name in names}
    best = best_of(means)
    p99_best = lowest_p99(means)
    return BarRow(
        scenario=scenario,
        seeds=len(per_seed),
        best=best,
        mine=means[MINE],
        base=means[best],
        verdict=judge(means[MINE], means[best]),
        seeds_cleared=sum(judge(s[MINE], s[best]).cleared for s in per_seed.values()),
        p99_best=p99_best or "–",
        p99_best_h=means[p99_best].jct_p99_h if p99_best else None,
        p99_no_worse=_p99_no_worse(means, p99_best),
        seeds_p99_no_worse=sum(bool(_p99_no_worse(s, p99_best)) for s in per_seed.values()),
    )


def _one_seed(task: tuple[str, int, Mapping[str, object] | None]) -> tuple[str, int, Metrics]:
    scenario, seed, overrides = task
    return (
        scenario,
        seed,
        seed_metrics(seed_workload(scenario, seed, overrides), POLICIES, drain=True),
    )


def run_bar(
    scenarios: Sequence[str],
    seeds: Sequence[int],
    *,
    solver_config: Mapping[str, object] | None = None,
    workers: int = 1,
    on_done: Callable[[int, int], None] | None = None,
) -> tuple[list[BarRow], dict[str, dict[int, Metrics]]]:
    """Every scenario on every seed under the four policies, run to drain; the rows, and
    each run's metrics (scenario → seed → policy → metrics) for the JSON. ``solver_config``
    overrides ``shaper``'s levers (the baselines ignore them); ``workers`` > 1 runs the
    seeds in that many processes (the same figures: each run is deterministic)."""
    tasks = [(scenario, seed, solver_config) for scenario in scenarios for seed in seeds]
    runs: dict[str, dict[int, Metrics]] = {scenario: {} for scenario in scenarios}
    done = 0
    for scenario, seed, metrics in _map(tasks, workers):
        runs[scenario][seed] = metrics
        done += 1
        if on_done is not None:
            on_done(done, len(tasks))
    rows = [
        bar_row(
            scenario,
            {
                seed: {name: Figures.of(m) for name, m in runs[scenario][seed].items()}
                for seed in seeds
            },
        )
        for scenario in scenarios
    ]
    return rows, runs


def _map(
    tasks: list[tuple[str, int, Mapping[str, object] | None]], workers: int
) -> Iterable[tuple[str, int, Metrics]]:
    if workers <= 1:
        return map(_one_seed, tasks)
    pool = ProcessPoolExecutor(workers)
    try:
        return list(pool.map(_one_seed, tasks))
    finally:
        pool.shutdown()


def bar_markdown(rows: Sequence[BarRow]) -> str:
    """The README's table: margins over the best baseline, the bar, p99 against the lowest,
    and the makespans beside them (issue 20: the tail and the end, not the mean alone)."""
    head = (
        "| scenario | best baseline | Δ util pt | value | mean JCT | cleared (seeds) | "
        "more than 1 % worse on | unmet demand rep-h `shaper` / best | SLA h `shaper` / best | "
        "p99 h `shaper` / lowest | p99 no worse (seeds) | makespan h `shaper` / best |"
    )
    lines = [head, "|" + "---|" * 12]
    for row in rows:
        v = row.verdict
        seeds = f"{row.seeds_cleared}/{row.seeds}"
        cleared = f"**yes** ({seeds})" if v.cleared else f"no ({seeds})"
        p99_base = f"{_h(row.p99_best_h)} (`{row.p99_best}`)"
        p99_ok = {True: "yes", False: "no", None: "–"}[row.p99_no_worse]
        lines.append(
            f"| {row.scenario} | `{row.best}` | {v.delta_util_pt:+.1f} | {_pct(v.value_change)} "
            f"| {_pct(v.jct_change)} | {cleared} | {', '.join(v.worse_on) or '–'} "
            f"| {row.mine.unmet_replica_h:.2f} / {row.base.unmet_replica_h:.2f} "
            f"| {row.mine.sla_violation_h:.1f} / {row.base.sla_violation_h:.1f} "
            f"| {_h(row.mine.jct_p99_h)} / {p99_base} "
            f"| {p99_ok} ({row.seeds_p99_no_worse}/{row.seeds}) "
            f"| {_h(row.mine.makespan_h)} / {_h(row.base.makespan_h)} |"
        )
    return "\n".join(lines)


def bar_json(rows: Sequence[BarRow], runs: Mapping[str, Mapping[int, Metrics]]) -> dict[str, Any]:
    return {
        "policies": list(POLICIES),
        "rows": [asdict(row) for row in rows],
        "runs": {s: {str(seed): m for seed, m in per.items()} for s, per in runs.items()},
    }


def _number(metrics: Mapping[str, float | None], key: str) -> float:
    value = metrics.get(key)
    return float(value) if value is not None else 0.0


def _mean_of(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.fmean(known) if known else None


def _pct(change: float | None) -> str:
    return "–" if change is None else f"{100 * change:+.1f} %"


def _h(hours: float | None) -> str:
    return "–" if hours is None else f"{hours:.1f}"
