"""The simulator's why-idle breakdown: hand-worked runs under a scripted planner, and on a
built-in scenario the causes against the run's own utilization and its service curve."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sim.actions import Start
from sim.cli import sim_app
from sim.diagnosis import idle_metric
from sim.engine import Simulation
from sim.idle_report import idle_markdown
from sim.metrics import RunResult, summarize
from sim.run import run_policy
from sim.scenario import load_scenario
from sim.workload import GpuModel, NodeEvent
from solver.diagnosis import IdleCause

from .builders import ScriptedPlanner, job, workload


def _first_fit(sim: Simulation) -> list[Start]:
    """Start the oldest queued job on the first node with room, one job per re-plan."""
    for state in sorted(sim.queue.values(), key=lambda s: s.spec.submit_time):
        for name, node in sim.nodes.items():
            if node.schedulable and node.free >= state.spec.gpus:
                if state.spec.can_run_on(node.spec.gpu_model):
                    return [Start(state.spec.id, {name: state.spec.gpus})]
    return []


def _hours(result: RunResult) -> dict[IdleCause, float]:
    return {
        cause: result.metrics[idle_metric(cause)]  # type: ignore[misc]
        for cause in IdleCause
        if result.metrics[idle_metric(cause)]
    }


def test_heterogeneity_then_no_demand() -> None:
    """n0 (H100) and n1 (A100), 8 GPUs each; two 1-h jobs that need all of n0's H100s.
    0-1 h: one runs, the other waits for H100: n1 is idle for heterogeneity (8 GPU-h).
    1-2 h: the second runs, nothing waits: n1 idles for no demand; 2-3 h both nodes do."""
    jobs = [job(name, gpus=8, hours=1, models=("H100",)) for name in ("a", "b")]
    load = workload(
        jobs,
        nodes=(("n0", 8), ("n1", 8)),
        model="H100",
        extra_models=(GpuModel(name="A100"),),
        node_models={"n1": "A100"},
        horizon_h=3,
    )
    result = summarize(Simulation(load, ScriptedPlanner(_first_fit)).run())
    assert _hours(result) == {IdleCause.heterogeneity: 8.0, IdleCause.no_demand: 8.0 + 16.0}
    assert result.idle_causes["by_gpu_model"]["A100"] == {"heterogeneity": 8.0, "no_demand": 16.0}
    assert result.idle_causes["by_hour"][0] == {"hour": 0, "heterogeneity": 8.0}


def test_a_failed_node_is_draining_down_and_a_small_gap_is_fragmentation() -> None:
    """n1 (8 GPUs) runs a 6-GPU job throughout; n0 (4 GPUs) fails from 1 h to 2 h. A 4-GPU
    job arrives at 1.25 h: only n0 could hold it, so until n0 is back n1's 2 free GPUs are
    a hole too small for the queue (fragmentation); it then runs on n0 from 2 h to 2.5 h."""
    jobs = [
        job("big", gpus=6, hours=3),
        job("small", gpus=4, hours=0.5, at_h=1.25),
    ]
    load = workload(
        jobs,
        nodes=(("n1", 8), ("n0", 4)),
        horizon_h=3,
        events=(
            NodeEvent(time=1 * 3600.0, node="n0", kind="fail"),
            NodeEvent(time=2 * 3600.0, node="n0", kind="recover"),
        ),
    )
    result = summarize(Simulation(load, ScriptedPlanner(_first_fit)).run())
    # no_demand: n1's 2 free GPUs for 0-1.25 h and 2-3 h, n0's 4 for 0-1 h and 2.5-3 h.
    assert _hours(result) == pytest.approx(
        {
            IdleCause.draining_down: 4.0,
            IdleCause.fragmentation: 1.5,
            IdleCause.no_demand: 2 * 1.25 + 2 * 1.0 + 4 * 1.0 + 4 * 0.5,
        }
    )


@pytest.fixture(scope="module")
def training_heavy() -> dict[str, RunResult]:
    return {
        policy: run_policy(load_scenario("training-heavy"), policy) for policy in ("fifo", "shaper")
    }


@pytest.mark.parametrize("policy", ["fifo", "shaper"])
def test_causes_add_up_to_what_utilization_leaves(
    training_heavy: dict[str, RunResult], policy: str
) -> None:
    m = training_heavy[policy].metrics
    capacity = m["gpus"] * m["horizon_h"]  # type: ignore[operator]
    unused = capacity * (1 - m["utilization_of_capacity"])  # type: ignore[operator]
    assert sum(_hours(training_heavy[policy]).values()) == pytest.approx(unused, abs=1e-6)


def test_fifo_idles_the_service_peak_reservation(training_heavy: dict[str, RunResult]) -> None:
    """FIFO holds the chat service at its daily peak around the clock and keeps its two
    other GPUs busy: every idle GPU-hour is the peak minus the hour's demand."""
    load = load_scenario("training-heavy")
    (chat,) = load.services
    hours = int(load.horizon // 3600)
    above_peak = sum(chat.peak_replicas - chat.demand_at(h * 3600.0) for h in range(hours))
    assert _hours(training_heavy["fifo"]) == {IdleCause.reservation: pytest.approx(above_peak)}
    assert "reservation" in idle_markdown(training_heavy)
    assert math.isclose(
        training_heavy["fifo"].idle_causes["by_team"]["inference"]["reservation"], above_peak
    )


def test_sim_run_prints_the_causes_and_writes_them(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    args = ["run", "training-heavy", "--policy", "fifo", "--why-idle", "--out", str(out)]
    result = CliRunner().invoke(sim_app, args)
    assert result.exit_code == 0, result.output
    (line,) = [row for row in result.output.splitlines() if "reservation" in row]
    written = json.loads(out.read_text())["idle_causes"]
    assert f"{written['by_cause']['reservation']:,.1f}" in line
    assert written["idle_gpu_hours"] == pytest.approx(sum(written["by_cause"].values()))
