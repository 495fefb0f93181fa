"""The Forecasts page in a real Chromium, against a live server whose forecast records were
written as the cycle writes them (app/forecasts/models.py), already scored.

Three clusters: ``alpha`` runs two elastic services, ``chat`` (14 scored hours in the last
day, 10 more two days back, and the same hours forecast 3 h ahead, further off) and
``embed`` (3 scored hours: too few to judge), and had
block jobs with run-time predictions finish (six in the last day, one three days ago);
``beta`` runs a service whose forecasts are not scored yet; ``gamma`` runs no service.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from playwright.sync_api import Locator, Page, Response, Route, expect
from sqlmodel import Session, select

from app.api.deps import get_clock
from app.core import migrate
from app.core.clock import FrozenClock
from app.core.config import Settings
from app.core.db import make_engine
from app.core.lookup import row_id
from app.forecasts import service as forecast_service
from app.forecasts.models import RuntimePrediction, ServiceForecast
from app.gpu_models import service as gpu_model_service
from app.jobs.models import Job
from forecast.demand import Method
from tests.app.builders import job, node, registered_with, running, snapshot
from tests.support.live_server import app_on, serve, tokens_for
from tests.web.browser import release, screenshot

NOW = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)
SERVER_NOW = NOW + timedelta(minutes=10)
HOUR = timedelta(hours=1)
WINDOWS = {"24": "24 h", "168": "7 d", "720": "30 d"}
MIN_HOURS = 12  # web/frontend/src/forecasts.ts: judged from this many scored hours on
MIN_JOBS = 5
SERVICE_FIGURES = (
    "hours_scored",
    "mae_replicas",
    "naive_mae_replicas",
    "skill",
    "bias_replicas",
    "coverage",
    "target_quantile",
)
DURATION_FIGURES = (
    "jobs_scored",
    "mae_hours",
    "naive_mae_hours",
    "bias_hours",
    "median_abs_pct_error",
    "naive_median_abs_pct_error",
    "median_ratio",
)


def _service(name: str, node_name: str, indices: list[int]) -> dict[str, Any]:
    return job(
        name,
        team="inference",
        shape="elastic",
        state="running",
        gpus_requested=1,
        min_replicas=1,
        max_replicas=10,
        replicas=len(indices),
        submit_time=(NOW - 5 * 24 * HOUR).isoformat(),
        start_time=(NOW - 5 * 24 * HOUR).isoformat(),
        allocations=[{"node": node_name, "gpu_indices": indices}],
    )


def _finished(name: str, hours: float, end: datetime) -> dict[str, Any]:
    start = end - timedelta(hours=hours)
    return job(
        name,
        state="finished",
        submit_time=start.isoformat(),
        start_time=start.isoformat(),
        end_time=end.isoformat(),
    )


# alpha's block jobs: (name, hours it ran, hours before NOW that it ended).
FINISHED = [(f"train-{i}", 2.0 + i, i + 1.0) for i in range(6)] + [("train-old", 3.0, 72.0)]
JOBS = {
    "alpha": [
        _service("chat", "alpha1", [0, 1]),
        _service("embed", "alpha1", [2]),
        *(_finished(name, hours, NOW - ago * HOUR) for name, hours, ago in FINISHED),
    ],
    "beta": [_service("search", "beta1", [0])],
    "gamma": [running("solo", "gamma1", [0, 1])],
}


def _chat(ago: int) -> tuple[float, float, float, float]:
    """(mean, upper, naive, actual) of the hour ``ago`` hours back: the model is off by a
    quarter or a half, naive by one or more, and the reserve falls short every fifth hour."""
    actual = 5.0 + ago % 4
    mean = actual + (0.5 if ago % 2 == 0 else -0.25)
    naive = actual + (1.5 if ago % 3 == 0 else -1.0)
    upper = mean + (-1.0 if ago % 5 == 0 else 1.0)
    return mean, upper, naive, actual


def _forecast(
    job_row: Job,
    ago: int,
    figures: tuple[float, float, float, float | None],
    method: Method,
    lead_h: int = 1,
) -> ServiceForecast:
    mean, upper, naive, actual = figures
    hour = NOW - ago * HOUR
    return ServiceForecast(
        cluster_id=job_row.cluster_id,
        job_id=row_id(job_row),
        target_hour=hour,
        lead_h=lead_h,
        made_at=hour - lead_h * forecast_service.HOUR + forecast_service.RECORD_DELAY,
        method=method,
        quantile=0.9,
        mean=mean,
        upper=upper,
        naive=naive,
        actual=actual,
        scored_at=hour + forecast_service.HOUR + forecast_service.RECORD_DELAY
        if actual is not None
        else None,
    )


def _seed(session: Session) -> None:
    for name, jobs in JOBS.items():
        registered_with(session, name, snapshot(1, nodes=[node(f"{name}1")], jobs=jobs), now=NOW)
    rows = {j.external_id: j for j in session.exec(select(Job)).all()}
    for ago in [*range(1, 15), *range(30, 40)]:
        method = Method.ets if ago <= 10 else Method.latest
        session.add(_forecast(rows["chat"], ago, _chat(ago), method))
        # Three hours ahead the model is further off; naive is the same hour a day before.
        mean, upper, naive, actual = _chat(ago)
        further = (mean + 0.75, upper + 0.75, naive, actual)
        session.add(_forecast(rows["chat"], ago, further, method, lead_h=3))
    for ago in range(1, 4):
        session.add(_forecast(rows["embed"], ago, (4.0, 5.0, 3.5, 3.0), Method.ets))
        session.add(_forecast(rows["search"], ago, (2.0, 3.0, 2.0, None), Method.latest))
    for name, hours, _ in FINISHED:
        row = rows[name]
        assert row.start_time is not None
        session.add(
            RuntimePrediction(
                cluster_id=row.cluster_id,
                job_id=row_id(row),
                predicted_at=row.start_time,
                predicted_s=1.1 * hours * 3600,
                naive_s=4 * 3600,
            )
        )
    session.commit()


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    data = tmp_path_factory.mktemp("web-forecasts")
    url = f"sqlite:///{data / 'shaper.db'}"
    migrate.upgrade(url)
    engine = make_engine(url)
    with Session(engine) as session:
        gpu_model_service.ensure_default_catalogue(session=session)
        _seed(session)
        tokens = tokens_for(session, NOW, ("viewer",))
    app = app_on(engine, Settings(environment="test", data_dir=data))
    app.dependency_overrides[get_clock] = lambda: FrozenClock(SERVER_NOW)
    with serve(app) as base:
        yield {"base": base, "tokens": tokens}
    engine.dispose()


def _accuracy(site: dict[str, Any], window_h: str, cluster: str | None = None) -> Any:
    params = {"window_h": window_h, **({"cluster": cluster} if cluster else {})}
    response = httpx.get(
        f"{site['base']}/api/v1/forecast-accuracy",
        params=params,
        headers={"Authorization": f"Bearer {site['tokens']['viewer']}"},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    return response.json()


# The page's formats (web/frontend/src/forecasts.ts), for the API's figures: toFixed rounds
# the double's exact value half away from zero.
def _fixed(value: float, digits: int) -> str:
    return str(Decimal(value).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP))


def _signed(value: float, digits: int) -> str:
    magnitude = _fixed(abs(value), digits)
    if Decimal(magnitude) == 0:
        return magnitude
    return ("+" if value > 0 else "−") + magnitude


def _percent(value: float | None) -> str:
    return "–" if value is None else f"{_fixed(100 * value, 1)} %"


def _skill(value: float | None) -> str:
    return "–" if value is None else f"{_signed(100 * value, 1)} %"


def _verdict(skill: float | None, mae: float, scored: int, minimum: int) -> str:
    if scored < minimum:
        return "too-few"
    if skill is None:
        return "worse" if mae > 1e-9 else "even"
    shown = Decimal(_fixed(100 * skill, 1))
    return "better" if shown > 0 else "worse" if shown < 0 else "even"


def _expect_figures(row: Locator, figures: dict[str, Any], names: tuple[str, ...]) -> None:
    """Each figure's cell holds the API's value (data-value) and shows it formatted."""
    texts: dict[str, Callable[[Any], str]] = {
        "hours_scored": lambda v: f"{v:,}",
        "jobs_scored": lambda v: f"{v:,}",
        "skill": _skill,
        "bias_replicas": lambda v: _signed(v, 2),
        "bias_hours": lambda v: _signed(v, 2),
        "coverage": _percent,
        "target_quantile": _percent,
        "median_abs_pct_error": _percent,
        "naive_median_abs_pct_error": _percent,
    }
    for name in names:
        value = figures[name]
        cell = row.locator(f'[data-figure="{name}"]')
        expect(cell).to_have_text(texts.get(name, lambda v: _fixed(v, 2))(value))
        shown = cell.get_attribute("data-value")
        assert (float(shown) if shown else None) == value, name


def _expect_services(page: Page, services: list[dict[str, Any]]) -> None:
    rows = page.locator("#forecast-services tbody tr")
    expect(rows).to_have_count(len(services))
    for s in services:
        row = page.locator(
            f'#forecast-services tr[data-cluster="{s["cluster"]}"][data-service="{s["service"]}"]'
        )
        _expect_figures(row, s, SERVICE_FIGURES)
        verdict = _verdict(s["skill"], s["mae_replicas"], s["hours_scored"], MIN_HOURS)
        expect(row.locator("[data-verdict]")).to_have_attribute("data-verdict", verdict)
        covered = "met" if s["coverage"] >= s["target_quantile"] else "under"
        expect(row.locator("td[data-coverage]")).to_have_attribute("data-coverage", covered)
        methods = ", ".join(f"{m} {n:,}" for m, n in sorted(s["methods"].items()))
        expect(row.locator('[data-figure="methods"]')).to_have_text(methods)


def _expect_leads(page: Page, by_lead: list[dict[str, Any]]) -> None:
    """One row per service, one cell per lead time any service has, each with the API's
    MAE, naive MAE and skill for that service and lead (– where it has none)."""
    leads = [lead for lead in by_lead if lead["service"] is not None]
    hours = sorted({lead["lead_h"] for lead in leads})
    heads = page.locator("#forecast-leads thead th[data-lead]")
    expect(heads).to_have_text([f"{h} h ahead" for h in hours])
    services = sorted({(lead["cluster"], lead["service"]) for lead in leads})
    expect(page.locator("#forecast-leads tbody tr")).to_have_count(len(services))
    for cluster, service in services:
        row = page.locator(
            f'#forecast-leads tr[data-cluster="{cluster}"][data-service="{service}"]'
        )
        for h in hours:
            cell = row.locator(f'td[data-lead="{h}"]')
            found = [
                lead
                for lead in leads
                if (lead["cluster"], lead["service"], lead["lead_h"]) == (cluster, service, h)
            ]
            if not found:
                expect(cell).to_have_text("–")
                continue
            _expect_figures(cell, found[0], ("mae_replicas", "naive_mae_replicas", "skill"))
            judged = _verdict(
                found[0]["skill"], found[0]["mae_replicas"], found[0]["hours_scored"], MIN_HOURS
            )
            expect(cell.locator("[data-verdict]")).to_have_attribute("data-verdict", judged)


def _expect_durations(page: Page, durations: list[dict[str, Any]]) -> None:
    expect(page.locator("#forecast-durations tbody tr")).to_have_count(len(durations))
    for d in durations:
        row = page.locator(f'#forecast-durations tr[data-cluster="{d["cluster"]}"]')
        _expect_figures(row, d, DURATION_FIGURES)
        naive = d["naive_mae_hours"]
        skill = 1 - d["mae_hours"] / naive if naive > 1e-9 else None
        verdict = _verdict(skill, d["mae_hours"], d["jobs_scored"], MIN_JOBS)
        expect(row.locator("[data-verdict]")).to_have_attribute("data-verdict", verdict)


def _open(page: Page, site: dict[str, Any], fragment: str = "forecasts") -> None:
    page.goto(f"{site['base']}/#token={site['tokens']['viewer']}")
    expect(page.locator(".card")).to_have_count(len(JOBS))
    if fragment == "forecasts":
        page.click("#nav a[data-view=forecasts]")
    else:
        page.goto(f"{site['base']}/#{fragment}")
    expect(page.locator("#forecasts")).to_be_visible()


def _shown(page: Page, cluster: str, window_h: str) -> None:
    """Waits until the reply for that selection is drawn."""
    view = page.locator("#forecasts")
    expect(view).to_have_attribute("data-cluster", cluster)
    expect(view).to_have_attribute("data-window-h", window_h)


def test_the_page_shows_the_apis_figures_per_cluster_and_window(
    page: Page, site: dict[str, Any], tmp_path: Path
) -> None:
    _open(page, site)
    expect(page.locator("#nav a[data-view=forecasts]")).to_have_class("active")
    _shown(page, "", "24")
    # Every cluster: alpha's two services (beta's are not scored yet), with their cluster.
    every = _accuracy(site, "24")
    assert [(s["cluster"], s["service"]) for s in every["services"]] == [
        ("alpha", "chat"),
        ("alpha", "embed"),
    ]
    expect(page.locator("#forecast-services thead th").first).to_have_text("Cluster")
    _expect_services(page, every["services"])
    _expect_leads(page, every["by_lead"])
    # chat is forecast 1 and 3 h ahead, embed only 1 h: its 3 h cell is empty.
    assert {(lead["service"], lead["lead_h"]) for lead in every["by_lead"]} == {
        ("chat", 1),
        ("chat", 3),
        ("embed", 1),
    }
    _expect_durations(page, every["durations"])

    page.select_option("#forecast-cluster", "alpha")
    _shown(page, "alpha", "24")
    day = _accuracy(site, "24", "alpha")
    chat, embed = day["services"]
    # What was seeded: 14 hours of chat in the last day, the model ahead of naive but its
    # reserve short two hours in 14; embed has 3 hours, too few to judge.
    assert (chat["hours_scored"], chat["coverage"], chat["methods"]) == (
        14,
        pytest.approx(12 / 14, abs=1e-6),
        {"ets": 10, "latest": 4},
    )
    assert chat["skill"] > 0 and embed["hours_scored"] == 3 and embed["skill"] < 0
    expect(page.locator("#forecast-services thead th").first).to_have_text("Service")
    _expect_services(page, day["services"])
    chat_row = page.locator('#forecast-services tr[data-service="chat"]')
    expect(chat_row.locator("td.skill .verdict")).to_have_text("▲ better than naive")
    coverage = chat_row.locator("td[data-coverage]")
    expect(coverage).to_have_attribute("data-coverage", "under")
    expect(coverage).to_have_text("85.7 % of 90.0 % ▼ below target")
    embed_row = page.locator('#forecast-services tr[data-service="embed"]')
    expect(embed_row.locator("td.skill .verdict")).to_have_text("too few to judge")
    expect(page.locator('#forecast-services [data-note="too-few"]')).to_contain_text(
        f"fewer than {MIN_HOURS} hours scored yet"
    )
    (durations,) = day["durations"]
    assert durations["jobs_scored"] == 6
    _expect_durations(page, day["durations"])
    expect(page.locator("#forecast-span")).to_contain_text("(24 h)")

    # A week: chat's older hours and the older job come in.
    page.select_option("#forecast-window", "168")
    _shown(page, "alpha", "168")
    week = _accuracy(site, "168", "alpha")
    assert week["services"][0]["hours_scored"] == 24 and week["durations"][0]["jobs_scored"] == 7
    _expect_services(page, week["services"])
    _expect_durations(page, week["durations"])
    expect(page.locator("#forecast-span")).to_contain_text("(7 d)")
    # The selection is in the address: a reload opens the same view.
    assert urlsplit(page.url).fragment == "forecasts&cluster=alpha&window_h=168"
    page.reload()
    _shown(page, "alpha", "168")
    expect(page.locator("#forecast-window")).to_have_value("168")
    _expect_services(page, week["services"])
    screenshot(page, "forecasts", tmp_path)


def test_empty_states_say_why(page: Page, site: dict[str, Any], tmp_path: Path) -> None:
    _open(page, site, "forecasts&cluster=gamma")
    _shown(page, "gamma", "24")
    gamma = _accuracy(site, "24", "gamma")
    assert gamma["services"] == [] and gamma["durations"] == []
    none = page.locator("#forecast-services .empty")
    expect(none).to_have_attribute("data-empty", "no-services")
    expect(none).to_contain_text("No elastic services in gamma")
    expect(page.locator("#forecast-services table")).to_have_count(0)
    durations = page.locator("#forecast-durations .empty")
    expect(durations).to_contain_text("No block job with a run-time prediction finished")
    expect(durations).to_contain_text("in the last 24 h in gamma")

    # beta runs a service whose hours are not scored yet, in any window.
    page.select_option("#forecast-cluster", "beta")
    page.select_option("#forecast-window", "720")
    _shown(page, "beta", "720")
    assert _accuracy(site, "720", "beta")["services"] == []
    expect(none).to_have_attribute("data-empty", "none-scored")
    expect(none).to_contain_text("No service forecast scored in the last 30 d in beta yet")
    expect(none).to_contain_text(f"from {MIN_HOURS} scored hours on")
    screenshot(page, "forecasts-empty", tmp_path)


def test_the_page_only_ever_asks_for_a_window_the_api_accepts(
    page: Page, site: dict[str, Any]
) -> None:
    refused: list[str] = []
    asked: list[str] = []

    def seen(response: Response) -> None:
        if "/api/v1/" in response.url and response.status >= 400:
            refused.append(f"{response.status} {response.url}")
        if "/api/v1/forecast-accuracy" in response.url:
            asked.extend(parse_qs(urlsplit(response.url).query)["window_h"])

    page.on("response", seen)
    _open(page, site)
    _shown(page, "", "24")
    options = page.locator("#forecast-window option")
    expect(options).to_have_text(list(WINDOWS.values()))
    values = [options.nth(i).get_attribute("value") for i in range(options.count())]
    assert values == list(WINDOWS)
    for window_h in values:  # each one the API takes
        assert window_h is not None and _accuracy(site, window_h)["window_h"] == int(window_h)
    # Windows and clusters in the address that the page does not offer are ignored: it
    # asks for what its selects hold.
    for fragment in (
        "window_h=0",
        "window_h=721",
        "window_h=day",
        "window_h=-24",
        "window_h=24.5",
        "window_h=",
        "cluster=nope&window_h=99999",
    ):
        page.goto("about:blank")
        page.goto(f"{site['base']}/#forecasts&{fragment}")
        _shown(page, "", "24")
        expect(page.locator("#forecast-window")).to_have_value("24")
        expect(page.locator("#forecast-error")).to_be_hidden()
        expect(page.locator("#forecast-services table")).to_have_count(1)
    page.select_option("#forecast-window", "720")
    _shown(page, "", "720")
    assert refused == []
    assert asked and set(asked) <= set(WINDOWS)


def test_a_stale_reply_never_overwrites_a_newer_window(page: Page, site: dict[str, Any]) -> None:
    _open(page, site, "forecasts&cluster=alpha")
    _shown(page, "alpha", "24")
    held: list[Route] = []
    stale = "window_h=720"
    page.route(
        lambda url: "forecast-accuracy" in url and stale in url, lambda route: held.append(route)
    )
    with page.expect_request(lambda request: stale in request.url):
        page.select_option("#forecast-window", "720")
    page.select_option("#forecast-window", "168")
    _shown(page, "alpha", "168")
    release(held)
    page.wait_for_timeout(500)
    _shown(page, "alpha", "168")
    expect(page.locator("#forecast-window")).to_have_value("168")
    _expect_services(page, _accuracy(site, "168", "alpha")["services"])


def test_a_refusal_is_shown_and_goes_with_the_next_answer(page: Page, site: dict[str, Any]) -> None:
    _open(page, site, "forecasts&cluster=alpha")
    _shown(page, "alpha", "24")
    message = "the database is not reachable"
    page.route(
        "**/api/v1/forecast-accuracy?*",
        lambda route: route.fulfill(
            status=503,
            json={"error": {"code": "unavailable", "message": message}},
        ),
    )
    page.select_option("#forecast-window", "168")
    error = page.locator("#forecast-error")
    expect(error).to_be_visible()
    expect(error).to_have_text(f"Could not load forecast accuracy: {message}")
    expect(page.locator("#forecast-services table")).to_have_count(0)
    page.unroute("**/api/v1/forecast-accuracy?*")
    page.select_option("#forecast-window", "720")
    _shown(page, "alpha", "720")
    expect(error).to_be_hidden()
    _expect_services(page, _accuracy(site, "720", "alpha")["services"])
