"""The snapshot's forecasts, on both databases: services' demand (ETS over the hourly
history) and block jobs' run times (from the jobs that finished)."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session

from app.core.clock import FrozenClock
from app.shaping.snapshot import (
    FORECAST_STEPS,
    MIN_DURATION_HISTORY,
    take_snapshot,
    to_instance,
)
from forecast.demand import DemandForecaster
from tests.app.builders import job, node, snapshot
from tests.support.clock import T0

TELEMETRY = "/api/v1/clusters/alpha/telemetry"


def _cycle(hour: int) -> float:
    """A daily cycle between 2 and 8 replicas, highest at 18:00 UTC."""
    return 5.0 + 3.0 * math.sin(2 * math.pi * (hour - 12) / 24)


def _post_history(client: TestClient, auth: dict, clock: FrozenClock, hours: int) -> None:
    """Service s with two demand samples an hour (at :10 and :40) for ``hours`` hours from
    T0 (12:00), then the clock at 30 minutes into the next hour."""
    client.post(
        "/api/v1/clusters", headers=auth["admin"], json={"name": "alpha", "scheduler": "sim"}
    )
    samples = [
        {
            "at": (T0 + timedelta(hours=h, minutes=minute)).isoformat(),
            "metric": "demand_replicas",
            "job": "s",
            "value": _cycle(12 + h),
        }
        for h in range(hours + 1)
        for minute in (10, 40)
        if h < hours or minute == 10  # the current hour: one sample so far
    ]
    clock.advance(hours * 3600 + 30 * 60)
    service = job(
        "s",
        team="inference",
        shape="elastic",
        state="running",
        gpus_requested=1,
        min_replicas=1,
        max_replicas=10,
        replicas=2,
        allocations=[{"node": "n1", "gpu_indices": [0, 1]}],
    )
    response = client.post(
        TELEMETRY,
        headers=auth["connector_alpha"],
        json=snapshot(1, nodes=[node("n1")], jobs=[service], samples=samples),
    )
    assert response.status_code == 200, response.text


def test_the_snapshot_forecasts_a_service_from_its_demand_history(
    client: TestClient, auth: dict, session: Session, clock: FrozenClock
) -> None:
    hours = 4 * 24
    _post_history(client, auth, clock, hours)
    forecaster = DemandForecaster()
    taken = take_snapshot(session=session, cluster_name="alpha", now=clock.now())
    (row,) = taken.jobs
    # Hourly means of the complete hours (one point each), then the current hour's sample.
    assert len(row.demand_history) == hours + 1
    solver_job = to_instance(taken, forecaster=forecaster).job_by_id["alpha/s"]
    forecast = solver_job.forecast
    assert forecaster.fits == 1  # four days of history: ETS, not the fallback
    # The cycle runs half an hour into its hour: step 1 (the next hour) begins in 30 min.
    assert solver_job.forecast_origin == clock.now().timestamp() - 1800
    assert solver_job.seconds_until_step(1, clock.now().timestamp()) == 1800
    assert len(forecast) == FORECAST_STEPS
    assert forecast[0] == math.ceil(_cycle(12 + hours))  # now: the latest sample
    for step in range(1, FORECAST_STEPS):
        truth = _cycle(12 + hours + step)
        # A noiseless cycle: the quantile is the cycle itself, rounded up to replicas.
        assert math.ceil(truth - 1e-6) <= forecast[step] <= math.ceil(truth) + 1, step
    # The next cycle reuses the fit.
    to_instance(taken, forecaster=forecaster)
    assert forecaster.fits == 1


@pytest.mark.parametrize("hours", [5, 30])
def test_a_short_history_falls_back_without_fitting(
    client: TestClient, auth: dict, session: Session, clock: FrozenClock, hours: int
) -> None:
    _post_history(client, auth, clock, hours)
    forecaster = DemandForecaster()
    taken = take_snapshot(session=session, cluster_name="alpha", now=clock.now())
    forecast = to_instance(taken, forecaster=forecaster).job_by_id["alpha/s"].forecast
    assert forecaster.fits == 0
    latest = math.ceil(_cycle(12 + hours))
    if hours < 24:  # under a day: the latest value throughout
        assert forecast == (latest,) + (math.ceil(_cycle(12 + hours - 1) - 1e-9),) * 5
    else:  # seasonal-naive: the same hour yesterday
        for step in range(1, FORECAST_STEPS):
            assert forecast[step] >= math.ceil(_cycle(12 + hours + step - 24) - 1e-9)


def _post_finished(
    client: TestClient,
    auth: dict,
    clock: FrozenClock,
    finished: int,
    *,
    limit_s: float | None = None,
    finished_limit_s: float | None = None,
    finished_limited: int | None = None,
) -> None:
    """``finished`` block jobs of team vision that ran 2 h each, a pending one and one that
    started 30 minutes ago; with ``limit_s``, those two have that time limit and one more,
    started 2 h ago, has it too; with ``finished_limit_s``, the finished jobs had that one
    (the first ``finished_limited`` of them, default all)."""
    client.post(
        "/api/v1/clusters", headers=auth["admin"], json={"name": "alpha", "scheduler": "sim"}
    )
    clock.advance(3 * 24 * 3600)
    now = clock.now()
    done = [
        job(
            f"done{i}",
            state="finished",
            start_time=(now - timedelta(hours=2 + i)).isoformat(),
            end_time=(now - timedelta(hours=i)).isoformat(),
            **(
                {"time_limit_s": finished_limit_s}
                if finished_limit_s is not None
                and (finished_limited is None or i < finished_limited)
                else {}
            ),
        )
        for i in range(finished)
    ]
    limited = {} if limit_s is None else {"time_limit_s": limit_s}

    def running_for(name: str, ran: timedelta, gpus: list[int]) -> dict:
        started = (now - ran).isoformat()
        allocations = [{"node": "n1", "gpu_indices": gpus}]
        return job(
            name,
            state="running",
            start_time=started,
            submit_time=started,
            allocations=allocations,
            **limited,
        )

    jobs = [*done, job("waiting", **limited), running_for("busy", timedelta(minutes=30), [0, 1])]
    if limit_s is not None:
        jobs.append(running_for("late", timedelta(hours=2), [2, 3]))
    response = client.post(
        TELEMETRY,
        headers=auth["connector_alpha"],
        json=snapshot(1, nodes=[node("n1")], jobs=jobs),
    )
    assert response.status_code == 200, response.text


def test_block_jobs_get_the_run_time_their_finished_peers_took(
    client: TestClient, auth: dict, session: Session, clock: FrozenClock
) -> None:
    _post_finished(client, auth, clock, MIN_DURATION_HISTORY + 5)
    taken = take_snapshot(session=session, cluster_name="alpha", now=clock.now())
    assert len(taken.finished) == MIN_DURATION_HISTORY + 5
    jobs = to_instance(taken).job_by_id
    assert jobs["alpha/waiting"].expected_runtime_s == pytest.approx(7200.0)
    # Walltime from its start: the prediction, not what is left of it.
    assert jobs["alpha/busy"].expected_runtime_s == pytest.approx(7200.0)


def test_too_few_finished_jobs_give_no_run_time(
    client: TestClient, auth: dict, session: Session, clock: FrozenClock
) -> None:
    _post_finished(client, auth, clock, MIN_DURATION_HISTORY - 1)
    jobs = to_instance(take_snapshot(session=session, cluster_name="alpha", now=clock.now()))
    assert jobs.job_by_id["alpha/waiting"].expected_runtime_s is None


@pytest.mark.parametrize("history", [MIN_DURATION_HISTORY + 5, MIN_DURATION_HISTORY - 1])
def test_a_time_limit_caps_the_run_time_and_stands_in_for_it_without_history(
    client: TestClient, auth: dict, session: Session, clock: FrozenClock, history: int
) -> None:
    """Predicted 2 h from the finished jobs (or nothing to predict from), limited to 1 h:
    1 h either way — the scheduler ends them then; one running 2 h already, past its
    limit, is expected to end now."""
    _post_finished(client, auth, clock, history, limit_s=3600.0)
    jobs = to_instance(take_snapshot(session=session, cluster_name="alpha", now=clock.now()))
    assert jobs.job_by_id["alpha/waiting"].expected_runtime_s == pytest.approx(3600.0)
    assert jobs.job_by_id["alpha/busy"].expected_runtime_s == pytest.approx(3600.0)
    assert jobs.job_by_id["alpha/late"].expected_runtime_s == pytest.approx(7200.0)


@pytest.mark.parametrize("history", [MIN_DURATION_HISTORY + 5, MIN_DURATION_HISTORY - 1])
def test_a_limit_of_weeks_tells_nothing_of_the_run_time(
    client: TestClient, auth: dict, session: Session, clock: FrozenClock, history: int
) -> None:
    """A 30-day limit (a site's padding): not the run time before history, and no
    estimate to learn from; the prediction from finished peers (2 h) stands."""
    _post_finished(client, auth, clock, history, limit_s=30 * 86_400.0)
    jobs = to_instance(take_snapshot(session=session, cluster_name="alpha", now=clock.now()))
    expected = 7200.0 if history >= MIN_DURATION_HISTORY else None
    assert jobs.job_by_id["alpha/waiting"].expected_runtime_s == (
        pytest.approx(expected) if expected else None
    )


@pytest.mark.parametrize(
    ("limited", "expected_h"),
    [
        # Finished jobs ran 2 h of the 4 h they asked for: a job asking 3 h is expected to
        # take half of it (forecast.duration's actual / estimate), not the group's 2 h.
        (None, 1.5),
        # Too few of them had a limit to learn actual / limit from (the first after an
        # upgrade: 5): the group's 2 h, which the 3 h limit does not cap.
        (5, 2.0),
    ],
)
def test_limits_are_learnt_as_estimates_once_enough_finished_jobs_had_one(
    client: TestClient,
    auth: dict,
    session: Session,
    clock: FrozenClock,
    limited: int | None,
    expected_h: float,
) -> None:
    _post_finished(
        client,
        auth,
        clock,
        MIN_DURATION_HISTORY + 5,
        limit_s=3 * 3600.0,
        finished_limit_s=4 * 3600.0,
        finished_limited=limited,
    )
    jobs = to_instance(take_snapshot(session=session, cluster_name="alpha", now=clock.now()))
    waiting = jobs.job_by_id["alpha/waiting"].expected_runtime_s
    assert waiting == pytest.approx(expected_h * 3600, rel=0.01)
