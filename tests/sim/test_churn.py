"""Churn: the actions plans take are recorded and counted, the shaper's planner feeds its
own history back to the solver (dwell time, move budget), and with it no job ping-pongs."""

from __future__ import annotations

import pytest

from sim.actions import Migrate, Preempt, Resize, SimPlan, Start
from sim.adapter import SolverPlanner
from sim.engine import Simulation
from sim.metrics import RunResult, acted_within, summarize
from sim.run import run_policy, simulate
from sim.scenario import load_scenario
from sim.workload import Service

from .builders import HOUR, ScriptedPlanner, at, job, workload

NO_DWELL = {"dwell_s": 0.0, "max_actions_per_job_hour": 1_000_000}


def run(wl, schedule) -> Simulation:
    # Stopped at the horizon: these tests read the state and the counts at that moment.
    return Simulation(wl, ScriptedPlanner(at(schedule)), check_invariants=True, drain=False).run()


def test_acted_within() -> None:
    assert acted_within([0.0, 700.0, 1200.0])
    assert not acted_within([0.0, 600.0, 1200.0])
    assert not acted_within([5.0])


def test_plan_actions_are_recorded_and_counted() -> None:
    # a: started, stopped 3 min later, started again at 0.5 h; b: started, moved at 1 h;
    # c only arrives (an event to re-plan at); chat resized twice, then to what it has.
    chat = Service(id="chat", hourly_demand=(1, 2), priority=5)
    wl = workload(
        [
            job("a", gpus=1, hours=10),
            job("b", gpus=1, hours=10, checkpointable=True),
            job("c", gpus=1, hours=1, at_h=0.05),
        ],
        nodes=(("n0", 4), ("n1", 4)),
        services=[chat],
        horizon_h=2,
    )
    sim = run(
        wl,
        {
            0: [Start("a", {"n0": 1}), Start("b", {"n0": 1}), Resize("chat", {"n1": 1})],
            0.05: [Preempt("a", checkpoint=False)],
            0.5: [Start("a", {"n0": 1})],
            1: [Migrate("b", {"n1": 1}), Resize("chat", {"n1": 2})],
            1.5: [Resize("chat", {"n1": 2})],
        },
    )
    assert sim.jobs["a"].acted_at == [0.0, 0.05 * HOUR, 0.5 * HOUR]
    assert sim.jobs["b"].acted_at == [0.0, HOUR]
    assert sim.jobs["c"].acted_at == []
    assert sim.services["chat"].resized_at == [0.0, HOUR]
    m = summarize(sim).metrics
    assert m["policy_actions"] == 7
    # a runs 0.05 h + 1.5 h, b 2 h
    assert m["block_job_hours"] == pytest.approx(3.55)
    assert m["actions_per_job_hour"] == pytest.approx(7 / 3.55)
    assert m["jobs_acted_twice_10min"] == 1


def test_only_the_shaper_is_fed_its_own_history() -> None:
    wl = workload([job("a", gpus=1, hours=10), job("b", gpus=1, hours=1, at_h=0.05)], horizon_h=0.1)
    sim = run(wl, {0: [Start("a", {"n0": 1})], 0.05: [Preempt("a")]})  # b: an event at 0.05
    # the run ends at 0.1 h: a was acted on twice, last 3 min ago
    shaper = SolverPlanner("shaper").instance(sim)
    requeued = shaper.job_by_id["a"]
    assert requeued.last_acted_at == pytest.approx(0.05 * HOUR)
    assert requeued.actions_last_hour == 2
    assert shaper.is_frozen(requeued)
    fifo = SolverPlanner("fifo").instance(sim)
    assert fifo.job_by_id["a"].last_acted_at is None
    assert not fifo.is_frozen(fifo.job_by_id["a"])


def test_a_job_left_without_gpus_by_a_failed_move_is_overdue() -> None:
    # b lands on a's node first; a's target is full: a has nowhere to go back to.
    wl = workload(
        [
            job("a", gpus=4, hours=10, checkpointable=True),
            job("b", gpus=4, hours=10, checkpointable=True),
            job("c", gpus=4, hours=10),
        ],
        nodes=(("n0", 4), ("n1", 4), ("n2", 4)),
        horizon_h=1.05,
    )
    sim = run(
        wl,
        {
            0: [Start("a", {"n0": 4}), Start("c", {"n1": 4}), Start("b", {"n2": 4})],
            1: [Migrate("b", {"n0": 4}), Migrate("a", {"n1": 4})],
        },
    )
    state = sim.jobs["a"]
    assert state.stranded and state.acted_at == [0.0, HOUR]
    inst = SolverPlanner("shaper").instance(sim)
    stranded = inst.job_by_id["a"]
    assert stranded.overdue and inst.is_overdue(stranded)
    assert not inst.is_frozen(stranded)  # acted on 3 min ago, yet it must be placed


class WakingPlanner:
    """Asks to be woken at the given hours (the first plan only)."""

    name = "waking"

    def __init__(self, *wake_h: float) -> None:
        self.wake_h = list(wake_h)
        self.calls: list[float] = []

    def plan(self, sim: Simulation) -> SimPlan:
        self.calls.append(round(sim.now / HOUR, 4))
        wake = self.wake_h.pop(0) * HOUR if self.wake_h else None
        return SimPlan(wake_at=wake)


def test_a_planner_is_woken_when_it_asks() -> None:
    planner = WakingPlanner(0.2, 0.1)
    Simulation(workload([], horizon_h=1, replan_min=30), planner).run()
    # cadence at 0 and 0.5; woken at 0.2 (the later request, 0.1, was in the past by then)
    assert planner.calls == [0.0, 0.2, 0.5]


def test_shaper_wakes_when_a_requeued_job_thaws() -> None:
    # high (10×) arrives at 1 h and takes low's node; it ends 3 min later. low, stopped
    # by the shaper, is frozen for the dwell time: it restarts 10 min after its stop, not
    # at the next half-hour cadence.
    wl = workload(
        [
            job("low", gpus=4, hours=4, checkpointable=True),
            job("high", gpus=4, hours=0.05, at_h=1, priority=10),
        ],
        horizon_h=3,
    )
    sim = simulate(wl, "shaper", check_invariants=True)
    low = sim.jobs["low"]
    assert low.acted_at[:2] == [0.0, HOUR]
    assert low.acted_at[2] == pytest.approx(HOUR + 600)


# -- the built-in scenarios: no ping-pong, and the gain kept ----------------------------


def utilization_gain(result: RunResult, baseline: RunResult) -> float:
    return 100 * (result.metrics["utilization"] - baseline.metrics["utilization"])


@pytest.mark.parametrize("scenario", ["training-heavy", "contended-hetero"])
def test_shaper_acts_on_no_job_twice_within_the_dwell(scenario: str) -> None:
    fifo = run_policy(load_scenario(scenario), "fifo")
    dwell = run_policy(load_scenario(scenario), "shaper")
    planner = SolverPlanner("shaper", config_overrides=NO_DWELL)
    free = summarize(simulate(load_scenario(scenario), planner))
    assert "dwell_s" not in load_scenario(scenario).solver_config  # the default, 600 s
    assert dwell.metrics["jobs_acted_twice_10min"] == 0
    with_dwell, without = utilization_gain(dwell, fifo), utilization_gain(free, fifo)
    assert abs(with_dwell - without) <= 2.0, (with_dwell, without)
