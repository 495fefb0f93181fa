"""The cycle's forecasts recorded, scored and shown (GET /api/v1/forecast-accuracy,
/metrics, ``shaper forecast-accuracy``), on both databases, with the figures worked out
by hand."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from sqlmodel import Session, col, select

from app.core.clock import FrozenClock
from app.core.errors import Invalid
from app.forecasts import service as forecast_service
from app.forecasts.models import (
    ForecastAccuracy,
    RuntimePrediction,
    ServiceForecast,
    ServiceForecastCreate,
)
from app.forecasts.report import print_accuracy
from app.jobs.models import Job
from app.shaping.cycle import run_cycle
from app.shaping.snapshot import MIN_DURATION_HISTORY
from forecast.demand import Method
from tests.app.builders import job, node, snapshot
from tests.support.clock import T0

URL = "/api/v1/forecast-accuracy"
TELEMETRY = "/api/v1/clusters/alpha/telemetry"
HOUR = timedelta(hours=1)


def _service(**fields: Any) -> dict[str, Any]:
    return job(
        "s",
        team="inference",
        shape="elastic",
        state="running",
        gpus_requested=1,
        min_replicas=1,
        max_replicas=10,
        replicas=2,
        allocations=[{"node": "n1", "gpu_indices": [0, 1]}],
        **fields,
    )


class Site:
    """Cluster alpha (one 8-GPU node), pushed to as its connector would: every push a full
    snapshot of ``jobs``, with the demand samples given."""

    def __init__(self, client: TestClient, auth: dict, clock: FrozenClock) -> None:
        self.client, self.auth, self.clock = client, auth, clock
        self.seq = 0
        self.jobs: list[dict[str, Any]] = [_service()]
        created = client.post(
            "/api/v1/clusters", headers=auth["admin"], json={"name": "alpha", "scheduler": "sim"}
        )
        assert created.status_code == 201, created.text

    def push(self, demand: dict[datetime, float] | None = None) -> None:
        self.seq += 1
        samples = [
            {"at": at.isoformat(), "metric": "demand_replicas", "job": "s", "value": value}
            for at, value in sorted((demand or {}).items())
        ]
        response = self.client.post(
            TELEMETRY,
            headers=self.auth["connector_alpha"],
            json=snapshot(self.seq, nodes=[node("n1")], jobs=self.jobs, samples=samples),
        )
        assert response.status_code == 200, response.text

    def at(self, moment: datetime) -> None:
        self.clock.advance((moment - self.clock.now()).total_seconds())

    def accuracy(self, **params: Any) -> dict[str, Any]:
        response = self.client.get(URL, headers=self.auth["viewer"], params=params)
        assert response.status_code == 200, response.text
        return response.json()  # type: ignore[no-any-return]


def _hourly(hours: range, value: Any) -> dict[datetime, float]:
    """Two samples an hour (at :10 and :40) whose mean is ``value(hour)``, the first
    half a replica under it."""
    samples = {}
    for h in hours:
        samples[T0 + h * HOUR + timedelta(minutes=10)] = value(h) - 0.5
        samples[T0 + h * HOUR + timedelta(minutes=40)] = value(h) + 0.5
    return samples


def _forecasts(session: Session) -> list[ServiceForecast]:
    """The next-hour forecasts (lead 1 h; every lead: test_forecast_accuracy_leads.py)."""
    query = select(ServiceForecast).where(ServiceForecast.lead_h == 1)
    return list(session.exec(query.order_by(col(ServiceForecast.target_hour))))


def _cycle(session: Session, clock: FrozenClock) -> None:
    run_cycle(session=session, cluster_name="alpha", now=clock.now())


def test_one_row_per_service_and_hour_however_many_cycles(
    client: TestClient, auth: dict, session: Session, clock: FrozenClock
) -> None:
    """Five hours of demand (hour h: 2 + h replicas): under a day of history, the forecast
    is the latest hour's mean (the naive one too), recorded once for the next hour by the
    first cycle ``RECORD_DELAY`` into the hour."""
    site = Site(client, auth, clock)
    site.at(T0 + 5 * HOUR)
    site.push(_hourly(range(5), lambda h: 2.0 + h))
    site.at(T0 + 5 * HOUR + timedelta(minutes=2))  # before the delay: nothing yet
    _cycle(session, clock)
    assert _forecasts(session) == []
    site.at(T0 + 5 * HOUR + forecast_service.RECORD_DELAY)
    for _ in range(6):  # three minutes of 30-second cycles
        _cycle(session, clock)
        clock.advance(30)
    (row,) = _forecasts(session)
    assert row.target_hour == T0 + 6 * HOUR  # the hour after the cycles' (the solver's step 1)
    assert (row.mean, row.upper, row.naive) == (6.0, 6.0, 6.0)  # hour 4's mean: 2 + 4
    assert (row.method, row.quantile) == (Method.latest, 0.9)
    assert row.made_at == T0 + 5 * HOUR + forecast_service.RECORD_DELAY
    assert row.actual is None and row.scored_at is None
    site.at(T0 + 5 * HOUR + timedelta(minutes=50))
    site.push(_hourly(range(5, 6), lambda h: 9.0))
    site.at(T0 + 6 * HOUR + timedelta(minutes=10))
    for _ in range(3):
        _cycle(session, clock)
        clock.advance(30)
    assert [r.target_hour for r in _forecasts(session)] == [T0 + 6 * HOUR, T0 + 7 * HOUR]


def test_an_ended_hour_is_scored_against_its_mean_demand(
    client: TestClient, auth: dict, session: Session, clock: FrozenClock
) -> None:
    """The forecast for hour 6 (6 replicas) is scored when hour 7 begins, against the mean
    of hour 6's samples (7.5 and 8.5: 8): off by 2, and over the upper value."""
    site = Site(client, auth, clock)
    site.at(T0 + 5 * HOUR + timedelta(minutes=10))
    site.push(_hourly(range(5), lambda h: 2.0 + h))
    _cycle(session, clock)
    site.at(T0 + 6 * HOUR + timedelta(minutes=50))
    site.push(_hourly(range(6, 7), lambda h: 8.0))
    site.at(T0 + 7 * HOUR + timedelta(minutes=10))
    _cycle(session, clock)
    first, later = _forecasts(session)  # no cycle ran in hour 6: none forecast hour 7
    assert first.target_hour == T0 + 6 * HOUR and first.actual == pytest.approx(8.0)
    assert first.scored_at == clock.now()
    assert later.target_hour == T0 + 8 * HOUR and later.scored_at is None
    (service,) = site.accuracy(window_h=6)["services"]
    assert service["hours_scored"] == 1
    assert service["mae_replicas"] == pytest.approx(2.0)
    assert service["bias_replicas"] == pytest.approx(-2.0)
    assert service["coverage"] == 0.0 and service["target_quantile"] == 0.9
    assert service["methods"] == {"latest": 1}


@pytest.fixture
def scored(client: TestClient, auth: dict, session: Session, clock: FrozenClock) -> Site:
    """Forecasts for hours 1-4 (and hour 0, when the service reported nothing) against
    demand whose hourly means are known:

    ======  ====  =====  =====  ======  =========  ==========  =======
    hour    mean  upper  naive  actual  |error|    |naive|     covered
    ======  ====  =====  =====  ======  =========  ==========  =======
    1       4     5      3      5       1          2           yes
    2       6     7      6      5       1          1           yes
    3       5     6      7      7       2          0           no
    4       8     9      4      6       2          2           yes
    ======  ====  =====  =====  ======  =========  ==========  =======

    MAE 1.5, naive MAE 1.25 (skill 1 − 1.5/1.25 = −0.2: naive wins), bias 0, coverage 3/4.
    """
    site = Site(client, auth, clock)
    actual = {1: 5.0, 2: 5.0, 3: 7.0, 4: 6.0}
    site.at(T0 + 5 * HOUR + timedelta(minutes=10))
    site.push(_hourly(range(1, 5), actual.__getitem__))
    job_id = session.exec(select(Job.id).where(Job.external_id == "s")).one()
    assert job_id is not None
    cluster_id = session.exec(select(Job.cluster_id).where(Job.id == job_id)).one()
    rows = {0: (1, 1, 1), 1: (4, 5, 3), 2: (6, 7, 6), 3: (5, 6, 7), 4: (8, 9, 4)}
    forecast_service.record(
        session=session,
        cluster_id=cluster_id,
        now=clock.now(),
        forecasts=[
            ServiceForecastCreate(
                job_id=job_id,
                target_hour=T0 + hour * HOUR,
                mean=mean,
                upper=upper,
                quantile=0.9,
                method=Method.ets,
                naive=naive,
            )
            for hour, (mean, upper, naive) in rows.items()
        ],
        predictions=[],
    )
    return site


def test_scores_worked_out_by_hand(scored: Site, session: Session) -> None:
    by_hour = {r.target_hour: r for r in _forecasts(session)}
    assert by_hour[T0].actual is None and by_hour[T0].scored_at is not None  # no demand then
    assert [by_hour[T0 + h * HOUR].actual for h in range(1, 5)] == pytest.approx([5, 5, 7, 6])
    body = scored.accuracy(cluster="alpha", window_h=24)
    (service,) = body["services"]
    assert service == {
        "cluster": "alpha",
        "service": "s",
        "hours_scored": 4,
        "mae_replicas": 1.5,
        "naive_mae_replicas": 1.25,
        "skill": pytest.approx(-0.2),
        "bias_replicas": 0.0,
        "coverage": 0.75,
        "target_quantile": 0.9,
        "methods": {"ets": 4},
    }
    assert body["durations"] == [] and body["window_h"] == 24
    # The window holds the hours that ended within it: 2 h back from 05:10 is hour 4 only.
    (recent,) = scored.accuracy(window_h=2)["services"]
    assert (recent["hours_scored"], recent["mae_replicas"], recent["coverage"]) == (1, 2.0, 1.0)


def test_recording_again_changes_nothing_scored(scored: Site, session: Session) -> None:
    """A second writer's rows for the same hours (a replica that raced) are dropped: the
    first forecast stands, with its score."""
    before = [(r.id, r.mean, r.actual) for r in _forecasts(session)]
    (row, *_) = _forecasts(session)
    forecast_service.record(
        session=session,
        cluster_id=row.cluster_id,
        now=scored.clock.now(),
        forecasts=[
            ServiceForecastCreate(
                job_id=row.job_id,
                target_hour=r.target_hour,
                mean=99.0,
                upper=99.0,
                quantile=0.5,
                method=Method.latest,
                naive=99.0,
            )
            for r in _forecasts(session)
        ],
        predictions=[],
    )
    session.expire_all()
    assert [(r.id, r.mean, r.actual) for r in _forecasts(session)] == before


def test_what_is_older_than_the_retention_goes(scored: Site, session: Session) -> None:
    (row, *_) = _forecasts(session)
    scored.at(T0 + forecast_service.RETENTION + HOUR + forecast_service.RECORD_DELAY)
    forecast_service.record(
        session=session,
        cluster_id=row.cluster_id,
        now=scored.clock.now(),
        forecasts=[
            ServiceForecastCreate(
                job_id=row.job_id,
                target_hour=T0 + forecast_service.RETENTION + 2 * HOUR,
                mean=1.0,
                upper=1.0,
                quantile=0.9,
                method=Method.ets,
                naive=1.0,
            )
        ],
        predictions=[],
    )
    session.expire_all()
    # Hours 0 and 1 are more than 30 days old; 2, 3, 4 and the new one stay.
    assert [r.target_hour for r in _forecasts(session)] == [
        T0 + 2 * HOUR,
        T0 + 3 * HOUR,
        T0 + 4 * HOUR,
        T0 + forecast_service.RETENTION + 2 * HOUR,
    ]


def test_a_scrape_shows_each_services_errors(scored: Site) -> None:
    response = scored.client.get("/metrics", headers=scored.auth["viewer"])
    assert response.status_code == 200
    found = {
        sample.name: (sample.labels, sample.value)
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
        if sample.name.startswith("shaper_forecast_")
    }
    labels = {"cluster": "alpha", "service": "s"}
    assert found["shaper_forecast_abs_error_replicas"] == (labels, 1.5)
    assert found["shaper_forecast_naive_abs_error_replicas"] == (labels, 1.25)
    assert found["shaper_forecast_coverage_ratio"] == (labels, 0.75)
    assert found["shaper_forecast_target_quantile"] == (labels, 0.9)
    assert found["shaper_forecast_hours_scored"] == (labels, 4)


def test_the_report_prints_model_beside_naive(scored: Site) -> None:
    summary = ForecastAccuracy.model_validate(scored.accuracy())
    console = Console(record=True, width=200)
    print_accuracy(summary, console)
    text = console.export_text()
    next_hour = text.split("by lead time")[0]  # the table of leads follows
    (line,) = [row for row in next_hour.splitlines() if "│ s " in row]
    cells = [cell.strip() for cell in line.strip("│").split("│")]
    assert cells == [
        "alpha",
        "s",
        "4",
        "1.50",
        "1.25",
        "-20.0 %",
        "+0.00",
        "75.0 %",
        "90.0 %",
        "ets 4",
    ]
    assert "no run-time prediction scored in the window" in text


def _daily(hour: int) -> float:
    """A daily cycle between 2 and 8 replicas."""
    return 5.0 + 3.0 * math.sin(2 * math.pi * hour / 24)


def test_the_model_is_compared_with_seasonal_naive_live(
    client: TestClient, auth: dict, session: Session, clock: FrozenClock
) -> None:
    """Three days of an exactly daily demand: ETS forecasts the next hour; the naive
    forecast recorded beside it is the same hour a day before, which is exact here."""
    site = Site(client, auth, clock)
    days = 3 * 24
    site.at(T0 + days * HOUR + timedelta(minutes=10))
    site.push(_hourly(range(days), _daily))
    _cycle(session, clock)
    (row,) = _forecasts(session)
    target = days + 1
    assert row.method == Method.ets and row.target_hour == T0 + target * HOUR
    assert row.naive == pytest.approx(_daily(target - 24))
    assert row.mean == pytest.approx(_daily(target), abs=0.5)
    assert row.upper >= row.mean
    site.at(T0 + target * HOUR + timedelta(minutes=50))
    site.push(_hourly(range(target, target + 1), _daily))
    site.at(T0 + (target + 1) * HOUR + timedelta(minutes=10))
    _cycle(session, clock)
    (service,) = site.accuracy(window_h=24)["services"]
    assert service["hours_scored"] == 1 and service["methods"] == {"ets": 1}
    assert service["naive_mae_replicas"] == pytest.approx(0.0, abs=1e-9)
    assert service["skill"] is None  # naive was exact: no ratio to speak of
    assert service["mae_replicas"] == pytest.approx(abs(row.mean - _daily(target)), abs=1e-6)


def _finished(name: str, team: str, hours: float, end: datetime) -> dict[str, Any]:
    return job(
        name,
        team=team,
        state="finished",
        start_time=(end - timedelta(hours=hours)).isoformat(),
        end_time=end.isoformat(),
    )


def test_run_time_predictions_are_scored_when_their_jobs_finish(
    client: TestClient, auth: dict, session: Session, clock: FrozenClock
) -> None:
    """History: 15 jobs of team vision ran 2 h, 10 of team nlp 6 h. A pending nlp job is
    predicted the nlp median shrunk toward the cluster's (``forecast.duration``: four
    levels, each ``(n · median + 5 · parent) / (n + 5)`` in log space), the naive
    prediction is nlp's median, 6 h. It runs 6 h: naive is exact, the model short."""
    site = Site(client, auth, clock)
    site.at(T0 + 24 * HOUR)
    history = [_finished(f"v{i}", "vision", 2, T0 + (i + 2) * HOUR) for i in range(15)] + [
        _finished(f"n{i}", "nlp", 6, T0 + (i + 6) * HOUR) for i in range(10)
    ]
    assert len(history) >= MIN_DURATION_HISTORY
    site.jobs = [_service(), *history, job("p", team="nlp")]
    site.push()
    for _ in range(3):  # recorded the first time only
        _cycle(session, clock)
        clock.advance(30)
    (prediction,) = session.exec(select(RuntimePrediction)).all()
    level = math.log(2 * 3600)  # all jobs: 13th of 25 sorted is a 2-h one
    for _ in range(3):  # team, team and kind, team-kind-GPUs: 10 nlp jobs each
        level = (10 * math.log(6 * 3600) + 5 * level) / 15
    predicted = math.exp(level)
    assert prediction.predicted_s == pytest.approx(predicted)
    assert prediction.naive_s == 6 * 3600
    assert prediction.predicted_at == T0 + 24 * HOUR
    started = clock.now()
    site.at(started + 6 * HOUR)
    site.jobs[-1] = _finished("p", "nlp", 6, clock.now())
    site.push()
    _cycle(session, clock)
    assert len(session.exec(select(RuntimePrediction)).all()) == 1
    (durations,) = site.accuracy(cluster="alpha", window_h=12)["durations"]
    error_h = (6 * 3600 - predicted) / 3600
    assert durations == {
        "cluster": "alpha",
        "jobs_scored": 1,
        "mae_hours": pytest.approx(error_h, abs=1e-6),
        "naive_mae_hours": 0.0,
        "bias_hours": pytest.approx(-error_h, abs=1e-6),
        "median_abs_pct_error": pytest.approx(error_h / 6, abs=1e-6),
        "naive_median_abs_pct_error": 0.0,
        "median_ratio": pytest.approx(predicted / (6 * 3600), abs=1e-6),
    }
    # The history's jobs were never predicted: nothing of theirs is scored.
    found = {
        sample.name: sample.value
        for family in text_string_to_metric_families(
            client.get("/metrics", headers=auth["viewer"]).text
        )
        for sample in family.samples
        if sample.name.startswith("shaper_duration_")
    }
    assert found["shaper_duration_jobs_scored"] == 1
    assert found["shaper_duration_naive_abs_error_hours"] == 0.0
    assert found["shaper_duration_abs_error_hours"] == pytest.approx(error_h, abs=1e-6)


def test_a_failure_to_record_does_not_stop_the_cycle(
    client: TestClient,
    auth: dict,
    session: Session,
    clock: FrozenClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def fail(**_: Any) -> None:
        raise RuntimeError("disk full")

    monkeypatch.setattr(forecast_service, "record", fail)
    site = Site(client, auth, clock)
    site.at(T0 + 5 * HOUR + timedelta(minutes=10))
    site.push(_hourly(range(5), lambda h: 3.0))
    result = run_cycle(session=session, cluster_name="alpha", now=clock.now())
    assert result.plan_id > 0 and _forecasts(session) == []


def test_the_window_is_checked(client: TestClient, auth: dict) -> None:
    for window in (0, forecast_service.MAX_WINDOW_H + 1, "day"):
        response = client.get(URL, headers=auth["viewer"], params={"window_h": window})
        assert response.status_code == 422, window
        assert response.json()["error"]["field"] == "window_h"
    response = client.get(URL, headers=auth["viewer"], params={"cluster": "nope"})
    assert response.status_code == 404
    empty = client.get(URL, headers=auth["viewer"], params={"window_h": 720})
    assert empty.status_code == 200 and empty.json()["services"] == []


def test_needs_a_viewer_token(client: TestClient, auth: dict) -> None:
    assert client.get(URL).status_code == 401
    refused = client.get(URL, headers=auth["connector_alpha"])
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden"
    assert client.get(URL, headers=auth["viewer"]).status_code == 200


def test_the_service_refuses_a_window_out_of_range(session: Session) -> None:
    with pytest.raises(Invalid) as refused:
        forecast_service.accuracy(session=session, now=T0, window_h=0)
    assert refused.value.field == "window_h"


def test_the_cli_reports_and_names_an_unknown_cluster(tmp_path: Path) -> None:
    env = {**os.environ, "SHAPER_DATA_DIR": str(tmp_path)}
    env.pop("SHAPER_DATABASE_URL", None)

    def shaper(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "app", "forecast-accuracy", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    done = shaper("--hours", "48")
    assert done.returncode == 0, done.stderr
    assert "no service forecast scored in the window" in done.stdout
    unknown = shaper("--cluster", "nope")
    assert unknown.returncode == 2 and "'nope' is not registered" in unknown.stderr
