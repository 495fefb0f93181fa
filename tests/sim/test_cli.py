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
    head = [c.strip() for c in rows[0].strip("|").split("|")]
    assert head[:3] == ["scenario", "policy", "util %"]
    assert {"JCT p99 h", "makespan h", "wait max h", "JCT vs best"} <= set(head)
    fifo = dict(zip(head, (c.strip() for c in rows[1].strip("|").split("|")), strict=True))
    backfill = dict(zip(head, (c.strip() for c in rows[2].strip("|").split("|")), strict=True))
    # Same window figures; backfill finishes the queue sooner, so it is the best baseline.
    assert fifo["util %"] == backfill["util %"] and fifo["value"] == backfill["value"]
    assert backfill["policy"] == "backfill ★" and backfill["JCT vs best"] == "+0.0 %"
    assert float(fifo["makespan h"]) > float(backfill["makespan h"])
    assert fifo["jobs 2× <10 min"] == "0"
    assert "completions over the run to drain" in result.output


def _replay(trace: Path, out_dir: Path, *extra: str) -> str:
    """``replay`` with one quick policy; the output on one line, panel borders removed."""
    args = ["replay", str(trace), "--policies", "fifo", "--no-progress", "--replan-min", "240"]
    result = runner.invoke(sim_app, [*args, "--out-dir", str(out_dir), *extra])
    assert result.exit_code == 0, result.output
    return " ".join(result.output.replace("│", " ").split())


def test_replay_prints_the_cluster_and_honours_its_size(tmp_path: Path) -> None:
    pollux = DATA / "pollux-workload-1.csv"
    default = _replay(pollux, tmp_path, "--max-jobs", "20")
    expected = "cluster: 16 nodes × 4 V100 GPUs (Pollux's testbed (OSDI'21), the loader's default;"
    assert expected in default and "--gpus/--gpus-per-node to change" in default
    wider = _replay(pollux, tmp_path, "--max-jobs", "20", "--gpus-per-node", "8")
    assert "cluster: 8 nodes × 8 V100 GPUs (--gpus-per-node 8; 64 GPUs as Pollux's" in wider
    gavel = _replay(DATA / "gavel-artifact-evaluation.trace", tmp_path, "--gpus", "30")
    assert "gavel:gavel-artifact-evaluation: 15 jobs, 30 GPUs" in gavel
    assert "cluster: 10 nodes × 1 V100 + 10 nodes × 1 P100 + 10 nodes × 1 K80" in gavel
    # Jobs the cluster cannot hold are left out, and the replay says how many.
    small = _replay(pollux, tmp_path, "--max-jobs", "20", "--gpus", "2", "--gpus-per-node", "2")
    text = " ".join(small.split())
    left = int(text.split(" jobs larger than the cluster left out")[0].rsplit("(", 1)[1])
    shown = int(text.split("pollux:pollux-workload-1: ")[1].split(" jobs")[0])
    assert left > 0 and left + shown == 20


def test_replay_input_errors_name_the_option(tmp_path: Path) -> None:
    def error(*args: str) -> str:
        result = runner.invoke(sim_app, ["replay", *args, "--no-progress"])
        assert result.exit_code == 2, result.output
        return " ".join(result.output.replace("│", " ").split())

    unknown = tmp_path / "what.csv"
    unknown.write_text("a,b\n1,2\n")
    message = error(str(unknown))
    assert "Invalid value for --kind: cannot tell the trace format" in message
    assert "known formats: philly (" in message and message.rstrip(" ╰─╯").endswith("pass --kind")
    pods = tmp_path / "pods.csv"
    pods.write_text((DATA / "alibaba-pods-sample.csv").read_text())
    assert "Invalid value for --nodes:" in error(str(pods)) and "pass --nodes" in error(str(pods))
    sized = error(str(pods), "--nodes", str(DATA / "alibaba-nodes-sample.csv"), "--gpus", "8")
    assert "Invalid value for --gpus / --gpus-per-node" in sized
    assert "Invalid value for '--gpus-per-node'" in error(str(pods), "--gpus-per-node", "0")
    philly = str(DATA / "philly-sample.csv")
    assert "Invalid value for --solver" in error(philly, "--solver", "no_such_lever=1")
    assert "Invalid value for --solver" in error(philly, "--solver", "aging_s=-1")
    assert "Invalid value for --elastic: elastic: expected LOW,HIGH,SCALING" in error(
        philly, "--elastic", "0.5,2"
    )
    assert "need 0 < low <= 1 <= high, not 2.0, 1.0" in error(philly, "--elastic", "2,1,0.8")
    assert "scaling must be in (0, 1], not 1.5" in error(philly, "--elastic", "0.5,2,1.5")


def test_replay_takes_solver_overrides_for_shaper(tmp_path: Path) -> None:
    """The queue order is a lever: the same replay with aging and shortest first off plans
    differently (a changed figure shows the override reached the solver)."""

    def shaper_row(*solver: str) -> str:
        args = [str(DATA / "philly-sample.csv"), "--gpus", "16", "--max-jobs", "30"]
        result = runner.invoke(
            sim_app,
            ["replay", *args, "--policies", "shaper", "--out-dir", str(tmp_path)]
            + ["--no-progress", "--replan-min", "60", *solver],
        )
        assert result.exit_code == 0, result.output
        return next(line for line in result.output.splitlines() if line.startswith("│ shaper"))

    default = shaper_row()
    assert shaper_row("--solver", "shortest_first=true") == default  # the default itself
    assert shaper_row("--solver", "shortest_first=false", "--solver", "aging_s=none") != default


def test_table_ablation_rows_attribute_each_lever(tmp_path: Path) -> None:
    from sim.run import ABLATIONS

    result = runner.invoke(
        sim_app,
        [
            "table",
            "--scenarios",
            "training-heavy-peak4",
            "--policies",
            "priority,shaper",
            "--ablations",
            "--out-dir",
            str(tmp_path),
            "--no-progress",
        ],
    )
    assert result.exit_code == 0, result.output
    scenario_table, _, ablation_table = result.output.partition("| scenario | shaper util %")
    rows = [line for line in scenario_table.splitlines() if line.startswith("| ")][1:]
    policies = [row.strip("|").split("|")[1].strip() for row in rows]
    # The best baseline is never one of shaper's own ablations.
    assert policies == ["priority ★", "**shaper**", *ABLATIONS]
    by_policy = dict(zip(policies, rows, strict=True))
    # Without service resizing, services hold their daily peak: less utilization.
    util = {name: float(row.strip("|").split("|")[2]) for name, row in by_policy.items()}
    assert util["shaper, no service resize"] < util["**shaper**"]
    # The second table: one row, each lever's change against full shaper, from the same runs.
    (row,) = [line for line in ablation_table.splitlines() if line.startswith("| training")]
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    resize = cells[2 + list(ABLATIONS).index("shaper, no service resize")]
    drop = util["shaper, no service resize"] - util["**shaper**"]
    assert resize.startswith(f"{drop:+.1f} pt, ") and "p99 " in resize and "makespan " in resize
