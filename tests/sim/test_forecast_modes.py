"""Where the simulator's service forecasts come from: the curve, the control plane's
forecaster, or the week's peak."""

from __future__ import annotations

from typing import Any

import pytest

from forecast import demand as fd
from forecast.duration import JobFeatures
from sim.adapter import ForecastMode, RuntimeMode, SolverPlanner
from sim.metrics import summarize
from sim.run import simulate
from sim.workload import Service

from .builders import HOUR, job, workload

CURVE = tuple(float(v) for v in [1] * 8 + [2, 3, 4, 4, 4, 3] + [2] * 4 + [1] * 6)


def test_noise_is_reproducible_and_keeps_the_curve_on_average() -> None:
    noisy = Service(id="chat", hourly_demand=CURVE, demand_noise=0.2, noise_seed=3)
    again = Service(id="chat", hourly_demand=CURVE, demand_noise=0.2, noise_seed=3)
    hours = [h * HOUR for h in range(24 * 30)]
    assert [noisy.demand_at(t) for t in hours] == [again.demand_at(t) for t in hours]
    mean = sum(noisy.demand_at(t) for t in hours) / len(hours)
    assert mean == pytest.approx(sum(CURVE) / len(CURVE), rel=0.05)
    assert Service(id="chat", hourly_demand=CURVE).demand_at(9 * HOUR) == CURVE[9]


@pytest.mark.parametrize("mode", list(ForecastMode))
def test_each_mode_serves_a_noiseless_service(mode: ForecastMode) -> None:
    chat = Service(id="chat", hourly_demand=CURVE, priority=8, max_replicas=8)
    wl = workload(
        [job("train", gpus=4, hours=30)], services=[chat], horizon_h=30, nodes=(("n0", 8),)
    )
    sim = simulate(wl, "shaper", check_invariants=True, forecast=mode)
    metrics = summarize(sim).metrics
    assert metrics["unmet_demand_replica_hours"] == pytest.approx(0)


def test_the_model_forecast_holds_no_more_than_the_peak_reservation() -> None:
    chat = Service(id="chat", hourly_demand=CURVE, priority=8, max_replicas=8)
    wl = workload([], services=[chat], horizon_h=48, nodes=(("n0", 8),))
    model, peak, perfect = (
        summarize(simulate(wl, "shaper", forecast=mode)).metrics
        for mode in (ForecastMode.model, ForecastMode.peak, ForecastMode.perfect)
    )
    assert model["service_gpu_hours"] < peak["service_gpu_hours"]
    assert model["unmet_demand_replica_hours"] <= peak["unmet_demand_replica_hours"]
    # A noiseless curve with a week of history: ETS reads the curve off it.
    assert model["service_gpu_hours"] == pytest.approx(perfect["service_gpu_hours"])


def test_the_adapter_asks_the_shared_forecaster_with_the_slas_quantile() -> None:
    chat = Service(id="chat", hourly_demand=CURVE, priority=8, max_replicas=8, sla_target=0.9)
    wl = workload([], services=[chat], horizon_h=2, nodes=(("n0", 8),))
    planner = SolverPlanner("shaper", forecast="model")
    sim = simulate(wl, planner)
    asked: list[float] = []
    ask = planner.forecaster.forecast

    def recording(*args: Any, **kwargs: Any) -> Any:
        asked.append(kwargs["quantile"])
        return ask(*args, **kwargs)

    planner.forecaster.forecast = recording  # type: ignore[method-assign]
    forecast = planner.instance(sim).job_by_id["chat"].forecast
    assert len(forecast) == planner.forecast_hours
    assert planner.forecaster.fits >= 1
    assert asked == [fd.quantile_for(0.9)]
    peak = SolverPlanner("shaper", forecast="peak")
    assert set(peak.instance(simulate(wl, peak)).job_by_id["chat"].forecast) == {4}


@pytest.mark.parametrize("mode", list(RuntimeMode))
def test_every_run_time_mode_completes_the_work(mode: RuntimeMode) -> None:
    jobs = [job(f"j{i}", gpus=2, hours=2, at_h=i) for i in range(6)]
    wl = workload(jobs, horizon_h=12, nodes=(("n0", 4),))
    sim = simulate(wl, "backfill", check_invariants=True, runtime=mode)
    assert summarize(sim).metrics["jobs_completed"] == 6


def test_predicted_run_times_are_learnt_from_the_jobs_done_before() -> None:
    jobs = [job(f"j{i}", gpus=2, hours=2, at_h=i) for i in range(6)]
    wl = workload(jobs, horizon_h=12, nodes=(("n0", 4),))
    planner = SolverPlanner("backfill", runtime="predicted")
    simulate(wl, planner)
    # Every job the planner saw finish was scored, then learnt from.
    assert planner.durations.error.count >= 4
    spec = wl.jobs[0]
    features = JobFeatures(team=spec.team, kind=spec.kind, gpus=spec.gpus)
    assert planner.durations.predict(features) == pytest.approx(2 * HOUR)
