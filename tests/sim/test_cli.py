"""``shaper sim`` commands through typer's CliRunner."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from sim.cli import sim_app

DATA = Path(__file__).parent / "data"
runner = CliRunner()


def test_run_prints_metrics_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    result = runner.invoke(
        sim_app, ["run", "training-heavy", "--policy", "fifo", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "training-heavy" in result.output
    payload = json.loads(out.read_text())
    assert payload["policy"] == "fifo" and 0 < payload["metrics"]["utilization"] <= 1
    assert payload["metrics"]["jobs_acted_twice_10min"] == 0
    assert 0 < payload["metrics"]["actions_per_job_hour"] < 1


def test_compare_writes_table_json_and_figures(tmp_path: Path) -> None:
    result = runner.invoke(
        sim_app,
        [
            "compare",
            "training-heavy",
            "--policies",
            "fifo,shaper",
            "--out-dir",
            str(tmp_path),
            "--format",
            "svg",
            "--markdown",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "| shaper |" in result.output
    runs = json.loads((tmp_path / "training-heavy.json").read_text())["runs"]
    assert set(runs) == {"fifo", "shaper"}
    for name in ("training-heavy-utilization.svg", "training-heavy-occupancy.svg"):
        assert (tmp_path / name).read_text().lstrip().startswith("<?xml")


def test_replay_a_trace_path(tmp_path: Path) -> None:
    result = runner.invoke(
        sim_app,
        [
            "replay",
            str(DATA / "philly-sample.csv"),
            "--gpus",
            "64",
            "--max-jobs",
            "80",
            "--policies",
            "fifo,shaper",
            "--out-dir",
            str(tmp_path),
            "--no-progress",
            "--replan-min",
            "240",
        ],
    )
    assert result.exit_code == 0, result.output
    runs = json.loads((tmp_path / "philly-sample.json").read_text())["runs"]
    assert runs["fifo"]["metrics"]["jobs_arrived"] == 80
    assert (tmp_path / "philly-sample-utilization.png").stat().st_size > 0


def test_bad_input_is_a_usage_error(tmp_path: Path) -> None:
    assert runner.invoke(sim_app, ["run", "training-heavy", "--policy", "nope"]).exit_code == 2
    assert runner.invoke(sim_app, ["run", "no-such-scenario"]).exit_code == 2
    missing = runner.invoke(sim_app, ["replay", str(tmp_path / "missing.csv")])
    assert missing.exit_code == 2


def test_list() -> None:
    result = runner.invoke(sim_app, ["list"])
    assert result.exit_code == 0 and "scale-64" in result.output


def test_table_over_scenarios(tmp_path: Path) -> None:
    result = runner.invoke(
        sim_app,
        [
            "table",
            "--scenarios",
            "training-heavy",
            "--policies",
            "fifo,backfill",
            "--out-dir",
            str(tmp_path),
        ],
    )
    assert result.exit_code == 0, result.output
    rows = [line for line in result.output.splitlines() if line.startswith("| ")]
    assert len(rows) == 3  # header + two policies
    assert rows[0].endswith("| lost GPU-h | actions/job-h | jobs acted 2× <10 min |")
    assert rows[1].startswith("| training-heavy | fifo |")
    assert "+0.0 %" in rows[1]
    assert rows[1].endswith("| 0.14 | 0 |")  # fifo's starts per job-hour; no job twice
