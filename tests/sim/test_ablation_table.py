"""``sim.ablation_table``: what each lever off changes against full shaper, the tail and
the end beside the mean (issue 20), figures checked by hand."""

from __future__ import annotations

from sim.ablation_table import ablation_cell, ablation_markdown
from sim.metrics import RunResult
from sim.run import ABLATIONS


def _run(
    policy: str,
    util: float = 0.80,
    value: float = 1000.0,
    jct: float | None = 10.0,
    p99: float | None = 30.0,
    makespan: float | None = 60.0,
    unmet: float = 0.0,
) -> RunResult:
    metrics: dict[str, float | None] = {
        "utilization": util,
        "weighted_output": value,
        "jct_mean_h": jct,
        "jct_p99_h": p99,
        "makespan_h": makespan,
        "unmet_demand_replica_hours": unmet,
    }
    return RunResult(scenario="example", policy=policy, seed=1, metrics=metrics, timeseries={})


def test_a_cell_gives_every_change_with_the_tail_and_the_end() -> None:
    off = _run("off", util=0.77, value=950.0, jct=12.0, p99=33.5, makespan=58.0, unmet=1.25)
    assert ablation_cell(_run("shaper"), off) == (
        "-3.0 pt, -5.0 %, JCT +20 %, p99 +3.5 h, makespan -2.0 h, unmet +1.2 rep-h"
    )


def test_a_lever_that_moves_only_the_tail_is_not_no_change() -> None:
    assert ablation_cell(_run("shaper"), _run("off", p99=31.0)) == (
        "+0.0 pt, +0.0 %, JCT +0 %, p99 +1.0 h, makespan +0.0 h"
    )
    assert ablation_cell(_run("shaper"), _run("off", p99=30.04)) == "no change"


def test_undefined_completion_times_print_a_dash() -> None:
    off = _run("off", util=0.70, jct=None, p99=None, makespan=None)
    assert ablation_cell(_run("shaper"), off) == ("-10.0 pt, +0.0 %, JCT –, p99 –, makespan –")


def test_the_table_has_a_column_per_lever_and_leaves_out_scenarios_without_shaper() -> None:
    first = next(iter(ABLATIONS))
    results = {
        "example": {"shaper": _run("shaper"), first: _run(first, util=0.75)},
        "baselines-only": {"priority": _run("priority")},
    }
    lines = ablation_markdown(results).splitlines()
    assert len(lines) == 3  # head, rule, one scenario
    head = [cell.strip() for cell in lines[0].strip("|").split("|")]
    assert head[1] == "shaper util % / value / JCT mean h / p99 h / makespan h"
    assert head[2:] == [label.removeprefix("shaper, ") for label in ABLATIONS]
    row = [cell.strip() for cell in lines[2].strip("|").split("|")]
    assert row[:3] == [
        "example",
        "80.0 / 1,000 / 10.0 / 30.0 / 60.0",
        "-5.0 pt, +0.0 %, JCT +0 %, p99 +0.0 h, makespan +0.0 h",
    ]
    assert row[3:] == ["–"] * (len(ABLATIONS) - 1)  # levers not run
