"""``sim.bar``: issue 12's bar and issue 20's p99, scenario by scenario (``shaper sim bar``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sim.bar import Figures, bar_row, best_of, judge, lowest_p99, run_bar
from sim.cli import sim_app
from sim.sweep import sweep


def _figures(
    util: float,
    value: float,
    jct: float | None = 10.0,
    p99: float | None = 30.0,
    makespan: float | None = 60.0,
) -> Figures:
    return Figures(
        utilization=util,
        value=value,
        jct_mean_h=jct,
        jct_p99_h=p99,
        makespan_h=makespan,
        unmet_replica_h=0.0,
        sla_violation_h=0.0,
    )


BASE = _figures(0.80, 1000.0, jct=10.0)


@pytest.mark.parametrize(
    ("mine", "cleared", "worse_on"),
    [
        # Five more utilization points, the rest no worse: cleared.
        (_figures(0.85, 1000.0, jct=10.0), True, ()),
        # 4.9 points is short of it.
        (_figures(0.849, 1000.0, jct=10.0), False, ()),
        # 15 % more value.
        (_figures(0.80, 1150.0, jct=10.0), True, ()),
        # 20 % lower mean JCT at equal utilization.
        (_figures(0.80, 1000.0, jct=8.0), True, ()),
        # ... but not at lower utilization (and 2 % lower is more than 1 % worse).
        (_figures(0.784, 1000.0, jct=8.0), False, ("utilization",)),
        # A win on one figure does not excuse more than 1 % worse on another.
        (_figures(0.86, 985.0, jct=10.0), False, ("value",)),
        (_figures(0.86, 1000.0, jct=10.2), False, ("mean JCT",)),
        # Within 1 % is not worse; a tie is not a win.
        (_figures(0.80, 991.0, jct=10.09), False, ()),
        (BASE, False, ()),
    ],
)
def test_the_bar_by_hand(mine: Figures, cleared: bool, worse_on: tuple[str, ...]) -> None:
    verdict = judge(mine, BASE)
    assert verdict.cleared is cleared
    assert verdict.worse_on == worse_on


def test_undefined_figures_neither_win_nor_lose() -> None:
    no_jct = judge(_figures(0.80, 1000.0, jct=None), BASE)
    assert no_jct.jct_change is None and not no_jct.cleared and no_jct.worse_on == ()
    no_value = judge(_figures(0.80, 10.0), _figures(0.80, 0.0))
    assert no_value.value_change is None and no_value.worse_on == ()


def test_the_best_baseline_and_the_lowest_p99_are_chosen_apart() -> None:
    figures = {
        "fifo": _figures(0.70, 900.0, p99=20.0),
        "backfill": _figures(0.75, 1000.0, jct=12.0, p99=25.0),
        "priority": _figures(0.78, 1000.0, jct=11.0, p99=28.0),
        "shaper": _figures(0.90, 2000.0, p99=10.0),
    }
    # Value ties between backfill and priority: utilization decides; shaper never counts.
    assert best_of(figures) == "priority"
    assert lowest_p99(figures) == "fifo"


def test_a_row_is_the_mean_over_seeds_and_counts_seeds_against_the_same_baselines() -> None:
    seeds = {
        # Seed 1: shaper +6 points over priority, p99 worse than backfill's.
        1: {
            "fifo": _figures(0.60, 500.0, p99=50.0),
            "backfill": _figures(0.70, 800.0, p99=20.0),
            "priority": _figures(0.80, 1000.0, p99=30.0, makespan=70.0),
            "shaper": _figures(0.86, 1000.0, p99=25.0, makespan=64.0),
        },
        # Seed 2: backfill has the most value on this seed, but the scenario's best
        # baseline (of the means) is priority: shaper +4 points over it, p99 the lowest.
        2: {
            "fifo": _figures(0.60, 500.0, p99=50.0),
            "backfill": _figures(0.80, 1200.0, p99=30.0),
            "priority": _figures(0.78, 1100.0, p99=40.0),
            "shaper": _figures(0.82, 1200.0, p99=20.0, makespan=None),
        },
    }
    row = bar_row("example", seeds)
    assert row.seeds == 2
    # The means: backfill 0.75 / 1000, priority 0.79 / 1050, shaper 0.84 / 1100.
    assert row.best == "priority"
    assert row.mine.utilization == pytest.approx(0.84)
    assert row.verdict.delta_util_pt == pytest.approx(5.0)
    assert row.verdict.cleared
    assert row.seeds_cleared == 1  # seed 1 only: +4 points and +9 % value on seed 2
    # Mean p99: backfill 25, priority 35, shaper 22.5.
    assert row.p99_best == "backfill"
    assert row.p99_best_h == pytest.approx(25.0)
    assert row.p99_no_worse is True
    assert row.seeds_p99_no_worse == 1  # seed 2 only (25 > backfill's 20 on seed 1)
    # Makespans are means over the seeds that have one (none: no job completed).
    assert row.mine.makespan_h == pytest.approx(64.0)
    assert row.base.makespan_h == pytest.approx(65.0)


def test_a_run_gives_the_figures_a_sweep_gives() -> None:
    """The bar's runs are the sweep's: shaper's and priority's means over two seeds of one
    scenario equal those of ``sim.sweep`` run on its own."""
    rows, runs = run_bar(["fragmentation-heavy"], [1, 2])
    swept = sweep("fragmentation-heavy", [1, 2], ["shaper"], baseline="priority", drain=True)
    (row,) = rows
    assert sorted(runs["fragmentation-heavy"]) == [1, 2]
    assert set(runs["fragmentation-heavy"][1]) == {"fifo", "backfill", "priority", "shaper"}
    for policy, figures in (("shaper", row.mine), ("priority", None)):
        mine = [r for r in swept if r.policy == policy]
        utilization = sum(r.utilization for r in mine) / 2
        p99 = sum(r.jct_p99_h or 0.0 for r in mine) / 2
        if figures is None:
            runs_of = [runs["fragmentation-heavy"][s][policy] for s in (1, 2)]
            assert sum(m["utilization"] or 0.0 for m in runs_of) / 2 == pytest.approx(utilization)
        else:
            assert figures.utilization == pytest.approx(utilization)
            assert figures.jct_p99_h == pytest.approx(p99)


def test_cli_bar_prints_the_table_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "bar.json"
    result = CliRunner().invoke(
        sim_app,
        ["bar", "--scenarios", "mixed", "--seeds", "1", "--no-progress", "--out", str(out)],
    )
    assert result.exit_code == 0, result.output
    (line,) = [line for line in result.output.splitlines() if line.startswith("| mixed |")]
    assert line.count("|") == 13
    assert "makespan h `shaper` / best" in result.output
    payload = json.loads(out.read_text())
    assert payload["policies"] == ["fifo", "backfill", "priority", "shaper"]
    assert payload["rows"][0]["scenario"] == "mixed"
    assert set(payload["runs"]["mixed"]["1"]) == set(payload["policies"])


def test_cli_bar_rejects_bad_input() -> None:
    runner = CliRunner()
    bad_seeds = runner.invoke(sim_app, ["bar", "--seeds", "9-1"])
    assert bad_seeds.exit_code == 2 and "runs backwards" in bad_seeds.output
    bad_scenario = runner.invoke(sim_app, ["bar", "--scenarios", "nope", "--seeds", "1"])
    assert bad_scenario.exit_code != 0 and "nope" in bad_scenario.output
    bad_solver = runner.invoke(sim_app, ["bar", "--seeds", "1", "--solver", "no_such=1"])
    assert bad_solver.exit_code == 2 and "no_such" in bad_solver.output
