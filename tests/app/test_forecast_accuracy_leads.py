"""Every step of the solver's look-ahead recorded with its lead time, scored, and shown
by lead (GET /api/v1/forecast-accuracy's ``by_lead``, /metrics, ``shaper
forecast-accuracy``), on both databases, with the figures worked out by hand."""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from sqlmodel import Session, col, select

from app.core import migrate
from app.core.clock import FrozenClock
from app.core.db import make_engine
from app.core.errors import Invalid
from app.core.lookup import row_id
from app.forecasts import service as forecast_service
from app.forecasts.models import ForecastAccuracy, ServiceForecast, ServiceForecastCreate
from app.forecasts.report import print_accuracy
from app.gpu_models import service as gpu_model_service
from app.jobs.models import Job
from app.shaping.cycle import run_cycle
from app.shaping.snapshot import FORECAST_STEPS
from forecast.demand import Method
from tests.app.builders import job, node, registered_with, snapshot
from tests.support.clock import T0

URL = "/api/v1/forecast-accuracy"
TELEMETRY = "/api/v1/clusters/alpha/telemetry"
HOUR = timedelta(hours=1)
LEADS = list(range(1, FORECAST_STEPS))  # the solver's steps 1 … 5


def _service(name: str, indices: list[int]) -> dict[str, Any]:
    return job(
        name,
        team="inference",
        shape="elastic",
        state="running",
        gpus_requested=1,
        min_replicas=1,
        max_replicas=10,
        replicas=2,
        allocations=[{"node": "n1", "gpu_indices": indices}],
    )


class Site:
    """Cluster alpha (one 8-GPU node) running services s and t, pushed to as its
    connector would, with the demand samples given."""

    def __init__(self, client: TestClient, auth: dict, clock: FrozenClock) -> None:
        self.client, self.auth, self.clock = client, auth, clock
        self.seq = 0
        created = client.post(
            "/api/v1/clusters", headers=auth["admin"], json={"name": "alpha", "scheduler": "sim"}
        )
        assert created.status_code == 201, created.text

    def push(self, demand: dict[tuple[str, datetime], float]) -> None:
        self.seq += 1
        samples = [
            {"at": at.isoformat(), "metric": "demand_replicas", "job": name, "value": value}
            for (name, at), value in sorted(demand.items())
        ]
        jobs = [_service("s", [0, 1]), _service("t", [2, 3])]
        response = self.client.post(
            TELEMETRY,
            headers=self.auth["connector_alpha"],
            json=snapshot(self.seq, nodes=[node("n1")], jobs=jobs, samples=samples),
        )
        assert response.status_code == 200, response.text

    def at(self, moment: datetime) -> None:
        self.clock.advance((moment - self.clock.now()).total_seconds())

    def accuracy(self, **params: Any) -> dict[str, Any]:
        response = self.client.get(URL, headers=self.auth["viewer"], params=params)
        assert response.status_code == 200, response.text
        return response.json()  # type: ignore[no-any-return]


def _hourly(name: str, hours: range, value: Any) -> dict[tuple[str, datetime], float]:
    """Two samples an hour (at :10 and :40) whose mean is ``value(hour)``."""
    samples = {}
    for h in hours:
        samples[(name, T0 + h * HOUR + timedelta(minutes=10))] = value(h) - 0.5
        samples[(name, T0 + h * HOUR + timedelta(minutes=40))] = value(h) + 0.5
    return samples


def _rows(session: Session, name: str = "s") -> list[ServiceForecast]:
    query = (
        select(ServiceForecast)
        .join(Job, col(Job.id) == col(ServiceForecast.job_id))
        .where(Job.external_id == name)
        .order_by(col(ServiceForecast.made_at), col(ServiceForecast.lead_h))
    )
    return list(session.exec(query))


def _cycle(session: Session, clock: FrozenClock) -> None:
    run_cycle(session=session, cluster_name="alpha", now=clock.now())


def test_every_step_of_the_look_ahead_is_recorded_once_an_hour(
    client: TestClient, auth: dict, session: Session, clock: FrozenClock
) -> None:
    """Five hours of demand (hour h: 2 + h replicas): under a day of history each step
    is the latest hour's mean, 6 (the naive one too). The cycles of hour 5 record hours
    6 … 10 at leads 1 … 5, once; hour 6's record 7 … 11, so hour 7 is forecast twice,
    two hours and one hour ahead."""
    site = Site(client, auth, clock)
    site.at(T0 + 5 * HOUR)
    site.push(_hourly("s", range(5), lambda h: 2.0 + h))
    site.at(T0 + 5 * HOUR + forecast_service.RECORD_DELAY)
    for _ in range(4):
        _cycle(session, clock)
        clock.advance(30)
    rows = _rows(session)
    assert [(r.lead_h, r.target_hour) for r in rows] == [
        (lead, T0 + (5 + lead) * HOUR) for lead in LEADS
    ]
    assert {(r.mean, r.upper, r.naive, r.method) for r in rows} == {(6.0, 6.0, 6.0, Method.latest)}
    assert {r.made_at for r in rows} == {T0 + 5 * HOUR + forecast_service.RECORD_DELAY}
    assert _rows(session, "t") == []  # t reported no demand: nothing to forecast from
    site.at(T0 + 6 * HOUR + timedelta(minutes=10))
    _cycle(session, clock)
    hour_7 = [r.lead_h for r in _rows(session) if r.target_hour == T0 + 7 * HOUR]
    assert sorted(hour_7) == [1, 2]
    assert len(_rows(session)) == 2 * len(LEADS)


def _daily(hour: int) -> float:
    return 5.0 + 3.0 * math.sin(2 * math.pi * hour / 24)


def test_each_step_has_the_seasonal_naive_forecast_of_its_own_hour(
    client: TestClient, auth: dict, session: Session, clock: FrozenClock
) -> None:
    """Three days of an exactly daily demand: step k forecasts hour 72 + k, whose naive
    forecast is the same hour a day before, hour 48 + k; ETS is close to the curve."""
    site = Site(client, auth, clock)
    days = 3 * 24
    site.at(T0 + days * HOUR + timedelta(minutes=10))
    site.push(_hourly("s", range(days), _daily))
    _cycle(session, clock)
    rows = _rows(session)
    assert [r.lead_h for r in rows] == LEADS
    for row in rows:
        target = days + row.lead_h
        assert row.target_hour == T0 + target * HOUR and row.method == Method.ets
        assert row.naive == pytest.approx(_daily(target - 24))
        assert row.mean == pytest.approx(_daily(target), abs=0.5)
        assert row.upper >= row.mean


# (service, hour, lead) → (mean, upper, naive); the hours' actual means: s 5, 5, 7, 6 in
# hours 1-4, t 3 in hour 4.
RECORDED = {
    # s at lead 1 (the figures of test_forecast_accuracy.py): MAE 1.5, naive 1.25,
    # bias 0, coverage 3/4.
    ("s", 1, 1): (4, 5, 3),
    ("s", 2, 1): (6, 7, 6),
    ("s", 3, 1): (5, 6, 7),
    ("s", 4, 1): (8, 9, 4),
    # s at lead 2: |errors| 2, 2, 0 (MAE 4/3), naive 1, 0, 1 (2/3), bias (−2 + 2 + 0)/3 =
    # 0, covered: 5 ≤ 4 no, 7 ≤ 10, 6 ≤ 8 (2/3); skill 1 − (4/3)/(2/3) = −1.
    ("s", 2, 2): (3, 4, 6),
    ("s", 3, 2): (9, 10, 7),
    ("s", 4, 2): (6, 8, 5),
    # s at lead 3: error 3, naive exact (skill none), bias −3, 6 ≤ 4 no.
    ("s", 4, 3): (3, 4, 6),
    # t at lead 1: error 1, naive 1, bias −1, 3 ≤ 3.
    ("t", 4, 1): (2, 3, 2),
}


@pytest.fixture
def scored(client: TestClient, auth: dict, session: Session, clock: FrozenClock) -> Site:
    site = Site(client, auth, clock)
    actual = {1: 5.0, 2: 5.0, 3: 7.0, 4: 6.0}
    site.at(T0 + 5 * HOUR + timedelta(minutes=10))
    site.push(
        {
            **_hourly("s", range(1, 5), actual.__getitem__),
            **_hourly("t", range(4, 5), lambda h: 3.0),
        }
    )
    services = {j.external_id: j for j in session.exec(select(Job))}
    cluster_id = services["s"].cluster_id
    forecast_service.record(
        session=session,
        cluster_id=cluster_id,
        now=clock.now(),
        forecasts=[
            ServiceForecastCreate(
                job_id=row_id(services[name]),
                target_hour=T0 + hour * HOUR,
                mean=mean,
                upper=upper,
                quantile=0.9,
                method=Method.ets,
                naive=naive,
                lead_h=lead,
            )
            for (name, hour, lead), (mean, upper, naive) in RECORDED.items()
        ],
        predictions=[],
    )
    return site


def test_scores_by_lead_worked_out_by_hand(scored: Site) -> None:
    body = scored.accuracy(cluster="alpha", window_h=24)
    by_lead = {(a["service"], a["lead_h"]): a for a in body["by_lead"]}
    assert list(by_lead) == [("s", 1), ("s", 2), ("s", 3), ("t", 1)]
    common = {"cluster": "alpha", "target_quantile": 0.9}
    assert by_lead[("s", 2)] == {
        **common,
        "service": "s",
        "lead_h": 2,
        "hours_scored": 3,
        "mae_replicas": pytest.approx(4 / 3, abs=1e-6),
        "naive_mae_replicas": pytest.approx(2 / 3, abs=1e-6),
        "skill": pytest.approx(-1.0, abs=1e-5),
        "bias_replicas": 0.0,
        "coverage": pytest.approx(2 / 3, abs=1e-6),
    }
    assert by_lead[("s", 3)] == {
        **common,
        "service": "s",
        "lead_h": 3,
        "hours_scored": 1,
        "mae_replicas": 3.0,
        "naive_mae_replicas": 0.0,
        "skill": None,
        "bias_replicas": -3.0,
        "coverage": 0.0,
    }
    lead_1 = by_lead[("s", 1)]
    assert (lead_1["hours_scored"], lead_1["mae_replicas"], lead_1["coverage"]) == (4, 1.5, 0.75)
    # The per-service figures are the next hour's (lead 1) alone, as before leads existed.
    services = {s["service"]: s for s in body["services"]}
    assert services["s"]["hours_scored"] == 4 and services["s"]["mae_replicas"] == 1.5
    assert services["s"]["naive_mae_replicas"] == 1.25 and services["s"]["coverage"] == 0.75
    assert services["t"]["hours_scored"] == 1 and services["t"]["bias_replicas"] == -1.0


def test_a_scrape_shows_errors_by_cluster_and_lead(scored: Site, session: Session) -> None:
    """Pooled over the cluster's services: lead 1 is s's four hours and t's one —
    MAE (1 + 1 + 2 + 2 + 1)/5 = 1.4, naive (2 + 1 + 0 + 2 + 1)/5 = 1.2, coverage 4/5."""
    response = scored.client.get("/metrics", headers=scored.auth["viewer"])
    assert response.status_code == 200
    found: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            if sample.name.startswith("shaper_forecast_lead_"):
                assert set(sample.labels) == {"cluster", "lead_h"}  # no service, no job id
                assert sample.labels["cluster"] == "alpha"
                found.setdefault(sample.name, {})[sample.labels["lead_h"]] = sample.value
    assert found["shaper_forecast_lead_hours_scored"] == {"1": 5, "2": 3, "3": 1}
    errors = found["shaper_forecast_lead_abs_error_replicas"]
    assert errors == pytest.approx({"1": 1.4, "2": 4 / 3, "3": 3.0}, abs=1e-6)
    naive = found["shaper_forecast_lead_naive_abs_error_replicas"]
    assert naive == pytest.approx({"1": 1.2, "2": 2 / 3, "3": 0.0}, abs=1e-6)
    coverage = found["shaper_forecast_lead_coverage_ratio"]
    assert coverage == pytest.approx({"1": 0.8, "2": 2 / 3, "3": 0.0}, abs=1e-6)
    pooled = forecast_service.accuracy_by_lead(session=session, now=scored.clock.now(), window_h=24)
    assert [(a.service, a.lead_h) for a in pooled] == [(None, 1), (None, 2), (None, 3)]
    assert pooled[0].bias_replicas == pytest.approx(-0.2)  # s's 0 × 4 and t's −1


def test_the_report_prints_each_lead(scored: Site) -> None:
    summary = ForecastAccuracy.model_validate(scored.accuracy())
    console = Console(record=True, width=200)
    print_accuracy(summary, console)
    leads = console.export_text().split("by lead time")[1]
    rows = [
        [cell.strip() for cell in line.strip("│").split("│")]
        for line in leads.splitlines()
        if line.startswith("│ alpha")
    ]
    assert rows == [
        ["alpha", "s", "1", "4", "1.50", "1.25", "-20.0 %", "75.0 %"],
        ["alpha", "s", "2", "3", "1.33", "0.67", "-100.0 %", "66.7 %"],
        ["alpha", "s", "3", "1", "3.00", "0.00", "–", "0.0 %"],
        ["alpha", "t", "1", "1", "1.00", "1.00", "0.0 %", "100.0 %"],
    ]


def test_the_window_is_checked_for_the_pooled_summary(session: Session) -> None:
    with pytest.raises(Invalid) as refused:
        forecast_service.accuracy_by_lead(
            session=session, now=T0, window_h=forecast_service.MAX_WINDOW_H + 1
        )
    assert refused.value.field == "window_h"


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
def test_the_migration_keeps_next_hour_rows(
    backend: str, make_postgres_database: Any, tmp_path: Path
) -> None:
    """Down, the rows of later leads go (they would clash on the old constraint) and the
    next hour's stay; up again, those are lead 1."""
    url = (
        make_postgres_database("leads")
        if backend == "postgres"
        else f"sqlite:///{tmp_path / 'leads.db'}"
    )
    migrate.upgrade(url)
    engine = make_engine(url)
    try:
        with Session(engine) as session:
            gpu_model_service.ensure_default_catalogue(session=session)
            registered_with(session, "alpha", snapshot(1, jobs=[_service("s", [0])]), now=T0)
            job_id = session.exec(select(Job.id)).one()
            cluster_id = session.exec(select(Job.cluster_id)).one()
            assert job_id is not None
            forecast_service.record(
                session=session,
                cluster_id=cluster_id,
                now=T0,
                forecasts=[
                    ServiceForecastCreate(
                        job_id=job_id,
                        target_hour=T0 + 2 * HOUR,
                        mean=1.0,
                        upper=2.0,
                        quantile=0.9,
                        method=Method.latest,
                        naive=1.0,
                        lead_h=lead,
                    )
                    for lead in (1, 2)
                ],
                predictions=[],
            )
        migrate.downgrade(url, "ef0a1b2c3d9a")
        migrate.upgrade(url)
        with engine.connect() as connection:
            rows = connection.execute(sa.text("SELECT lead_h, mean FROM service_forecasts")).all()
        assert [tuple(row) for row in rows] == [(1, 1.0)]
    finally:
        engine.dispose()
