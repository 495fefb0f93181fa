"""``sim.sweep``: a scenario over several seeds, and ``shaper sim sweep``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sim.cli import sim_app
from sim.run import run_policy
from sim.scenario import load_scenario
from sim.sweep import (
    SeedRow,
    Spread,
    parse_seeds,
    parse_solver_overrides,
    summarize_sweep,
    sweep,
)


def test_parse_seeds() -> None:
    assert parse_seeds("1-3") == [1, 2, 3]
    assert parse_seeds("5, 1-2,2") == [5, 1, 2]
    for bad in ("", "a-3", "4-2", ","):
        with pytest.raises(ValueError, match="seeds"):
            parse_seeds(bad)


def test_parse_solver_overrides() -> None:
    overrides = parse_solver_overrides(["gang_aware_placement=true", "time_limit_s = 0.5"])
    assert overrides == {"gang_aware_placement": "true", "time_limit_s": "0.5"}
    assert parse_solver_overrides(["aging_s=none", "starvation_guard_s=NULL"]) == {
        "aging_s": None,
        "starvation_guard_s": None,
    }
    for bad in (["gang_aware_placement"], ["no_such_lever=true"], ["time_limit_s=-1"]):
        with pytest.raises(ValueError):
            parse_solver_overrides(bad)


def test_each_seed_is_the_scenario_run_with_that_seed() -> None:
    rows = sweep("training-heavy-peak4", [3, 4], ["backfill"])
    assert [(r.seed, r.policy) for r in rows] == [
        (3, "fifo"),
        (3, "backfill"),
        (4, "fifo"),
        (4, "backfill"),
    ]
    # The same figures as a direct run of that seed.
    direct = run_policy(load_scenario("training-heavy-peak4", seed=4), "backfill").metrics
    fifo = run_policy(load_scenario("training-heavy-peak4", seed=4), "fifo").metrics
    row = rows[3]
    assert row.utilization == direct["utilization"]
    assert row.delta_util_pt == pytest.approx(100 * (direct["utilization"] - fifo["utilization"]))
    assert row.value_ratio == pytest.approx(direct["weighted_output"] / fifo["weighted_output"])
    assert rows[2].delta_util_pt == 0 and rows[2].value_ratio == 1


def _row(seed: int, policy: str, delta: float, ratio: float | None) -> SeedRow:
    return SeedRow(seed, policy, 0.5, delta, 10.0, ratio, 1)


def test_summary_by_hand() -> None:
    rows = [
        _row(1, "shaper", 10.0, 2.0),
        _row(2, "shaper", 40.0, None),  # the baseline produced nothing
        _row(3, "shaper", 25.0, 3.0),
        _row(1, "fifo", 0.0, 1.0),
    ]
    shaper, fifo = summarize_sweep(rows)
    assert shaper.policy == "shaper" and shaper.seeds == 3
    assert shaper.delta_util_pt == Spread(mean=25.0, median=25.0, worst=10.0, best=40.0)
    assert shaper.value_ratio == Spread(mean=2.5, median=2.5, worst=2.0, best=3.0)
    assert shaper.unbounded_ratios == 1
    assert fifo.seeds == 1 and fifo.unbounded_ratios == 0


def test_cli_sweep_prints_tables_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "sweep.json"
    result = CliRunner().invoke(
        sim_app,
        ["sweep", "training-heavy", "--seeds", "1-2", "--no-progress", "--out", str(out)],
    )
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("| ")]
    assert any(line.startswith("| 2 | shaper |") for line in lines)
    assert any(line.startswith("| shaper | 2 |") for line in lines)
    payload = json.loads(out.read_text())
    assert payload["baseline"] == "fifo" and len(payload["rows"]) == 4
    assert [s["policy"] for s in payload["summary"]] == ["fifo", "shaper"]


def test_cli_sweep_rejects_bad_input() -> None:
    runner = CliRunner()
    bad_seeds = runner.invoke(sim_app, ["sweep", "training-heavy", "--seeds", "9-1"])
    assert bad_seeds.exit_code == 2 and "runs backwards" in bad_seeds.output
    bad_policy = runner.invoke(sim_app, ["sweep", "training-heavy", "--policies", "nope"])
    assert bad_policy.exit_code == 2 and "unknown policy" in bad_policy.output


def test_a_drained_sweep_carries_each_runs_completion_times() -> None:
    rows = sweep("training-heavy-peak4", [4], ["priority"], baseline="priority", drain=True)
    direct = run_policy(load_scenario("training-heavy-peak4", seed=4), "priority").metrics
    (row,) = rows
    assert row.jct_mean_h == direct["jct_mean_h"] and row.jct_p99_h == direct["jct_p99_h"]
    assert row.wait_max_h == direct["queue_wait_max_h"]
    assert row.makespan_h == direct["makespan_h"] and row.makespan_h is not None
    # Undrained runs stop at the horizon and carry none.
    assert sweep("training-heavy-peak4", [4], [], baseline="priority")[0].jct_p99_h is None


def test_p99_no_worse_counts_seeds_against_the_baseline_by_hand() -> None:
    def row(seed: int, policy: str, p99: float | None) -> SeedRow:
        span = None if p99 is None else p99 + seed
        return SeedRow(
            seed, policy, 0.5, 0.0, 10.0, 1.0, 1, jct_mean_h=5.0, jct_p99_h=p99, makespan_h=span
        )

    rows = [
        row(1, "priority", 30.0),
        row(1, "shaper", 30.0),  # equal: no worse
        row(2, "priority", 30.0),
        row(2, "shaper", 31.0),  # worse
        row(3, "priority", None),  # no job arrived: not compared
        row(3, "shaper", 20.0),
    ]
    priority, shaper = summarize_sweep(rows, "priority")
    assert shaper.p99_no_worse_seeds == 1
    assert shaper.jct_p99_h == Spread(mean=27.0, median=30.0, worst=20.0, best=31.0)
    assert shaper.makespan_h == Spread(mean=29.0, median=31.0, worst=23.0, best=33.0)
    assert priority.p99_no_worse_seeds == 2  # against itself, on the seeds it has a p99


def test_cli_sweep_drain_prints_completion_times(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        sim_app,
        [
            "sweep",
            "training-heavy-peak4",
            "--seeds",
            "4",
            "--baseline",
            "priority",
            "--policies",
            "shaper",
            "--drain",
            "--no-progress",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "JCT p99 h" in result.output and "makespan h, mean" in result.output
    assert any(
        line.startswith("| shaper | 1 |") and line.rstrip().endswith("of 1 seeds |")
        for line in result.output.splitlines()
    )
