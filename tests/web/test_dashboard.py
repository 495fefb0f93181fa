"""The dashboard in a real headless Chromium, against a real server on the demo site.

The page is the bundle that ``make web`` builds (web/static/dist). Each test leaves a
screenshot of the page it ends on: under pytest's temporary folder, or where
``SHAPER_SCREENSHOTS`` says (``make screenshots`` refreshes web/screenshots for the README).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx
import pytest
from playwright.sync_api import Locator, Page, Request, Route, expect
from sqlmodel import Session

from app.api.deps import get_clock
from app.clusters import service as cluster_service
from app.clusters.models import ClusterCreate, ShapingMode
from app.core import migrate
from app.core.clock import FrozenClock
from app.core.config import Settings
from app.core.db import make_engine
from app.demo import SITES, seed_demo_site
from app.federation import service as federation_service
from app.federation.models import FederationGroupCreate
from app.gpu_models import service as gpu_model_service
from app.shaping.cycle import run_cycle
from app.telemetry import service as telemetry_service
from sim.run import compare, write_results
from sim.scenario import load_scenario
from tests.app.builders import job, node, running, snapshot
from tests.support.live_server import app_on, serve, tokens_for
from tests.web.browser import release, screenshot
from wire.telemetry import SchedulerKind, TelemetrySnapshot

NOW = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)
FIGURES = (
    "gpus",
    "allocated",
    "free",
    "idle_allocated",
    "pending_jobs",
    "pending_gpus",
    "awaiting_approval_actions",
    "awaiting_approval_plans",
)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    data = tmp_path_factory.mktemp("web")
    url = f"sqlite:///{data / 'shaper.db'}"
    # A real `shaper sim compare` result where the server reads them.
    results = compare(load_scenario("training-heavy"), ["fifo", "shaper"])
    write_results(results, data / "sim-results" / "training-heavy.json")
    migrate.upgrade(url)
    engine = make_engine(url)
    with Session(engine) as session:
        gpu_model_service.ensure_default_catalogue(session=session)
        seed_demo_site(session=session, now=NOW)
        for site_ in SITES:
            run_cycle(session=session, cluster_name=site_.name, now=NOW)
        tokens = tokens_for(session, NOW, ("viewer", "operator"))

    app = app_on(engine, Settings(environment="test", data_dir=data))
    app.dependency_overrides[get_clock] = lambda: FrozenClock(NOW + timedelta(minutes=1))
    with serve(app) as base:
        yield {"base": base, "tokens": tokens, "sim": results}
    engine.dispose()


def test_overview_shows_every_cluster_and_the_utilization_chart(
    page: Page, site: dict[str, Any], tmp_path: Path
) -> None:
    page.goto(f"{site['base']}/#token={site['tokens']['viewer']}")
    expect(page.locator(".card")).to_have_count(len(SITES))
    expect(page.locator('.card[data-cluster="hpc-a"] .big')).to_have_text("128 GPUs")
    expect(page.locator("#whoami")).to_contain_text("viewer")
    assert "token=" not in page.url  # the token is taken out of the address bar
    chart = page.locator("#util-chart")
    expect(chart).to_have_attribute("data-keys", ",".join(sorted(s.name for s in SITES)))
    expect(chart).to_have_attribute("data-points", "48")  # 24 h in 30-min buckets
    expect(chart.locator("canvas")).to_have_count(1)
    # Every series is in the legend, inside the page (none cut off).
    for site_ in SITES:
        label = chart.locator(".u-legend .u-series .u-label", has_text=f"{site_.name} · ")
        expect(label.first).to_be_visible()
        box = label.first.bounding_box()
        assert box and box["x"] >= 0 and box["x"] + box["width"] <= 1280
    page.select_option("#group-by", "gpu_model")
    expect(chart).to_have_attribute("data-group-by", "gpu_model")
    assert "H100" in (chart.get_attribute("data-keys") or "").split(",")
    # Teams share capacity: the legend names the team, not the same GPU count for each.
    page.select_option("#group-by", "team")
    expect(chart).to_have_attribute("data-group-by", "team")
    teams = (chart.get_attribute("data-keys") or "").split(",")
    assert len(teams) > 1
    labels = chart.locator(".u-legend .u-series .u-label").all_inner_texts()
    assert set(teams) <= set(labels) and not any("GPUs" in label for label in labels)
    page.select_option("#group-by", "cluster")
    expect(chart).to_have_attribute("data-group-by", "cluster")
    # The FIFO counterfactual from the latest replay, beside the chart.
    for policy in ("fifo", "shaper"):
        util = 100 * site["sim"][policy].metrics["utilization"]
        row = page.locator(f"#replay tr[data-policy={policy}]")
        expect(row.locator("td").nth(1)).to_have_text(f"{util:.1f} %")
    gain = 100 * (
        site["sim"]["shaper"].metrics["utilization"] - site["sim"]["fifo"].metrics["utilization"]
    )
    expect(page.locator("#replay tr[data-policy=shaper] td").nth(2)).to_have_text(f"{gain:+.1f} pt")
    screenshot(page, "overview", tmp_path)


def test_overview_figures_equal_the_api(page: Page, site: dict[str, Any]) -> None:
    page.goto(f"{site['base']}/#token={site['tokens']['viewer']}")
    expect(page.locator(".card")).to_have_count(len(SITES))
    expect(page.locator('#fleet-figures [data-figure="allocated"]')).to_be_visible()
    overview = _get(site, "/overview")
    assert overview["fleet"]["allocated"] > 0 and overview["fleet"]["pending_jobs"] > 0
    assert overview["fleet"]["awaiting_approval_actions"] > 0  # k8s-inference advises
    for cluster in overview["clusters"]:
        card = page.locator(f'.card[data-cluster="{cluster["cluster"]}"]')
        for name in FIGURES:
            if name == "gpus":
                continue  # the card's big figure is the cluster's capacity
            expect(card.locator(f'[data-figure="{name}"]')).to_have_text(f"{cluster[name]:,}")
        # And the API's figures agree with the listings they summarize.
        where = {"cluster": cluster["cluster"]}
        nodes = _get(site, "/nodes", {**where, "limit": "1000"})["items"]
        up = [n for n in nodes if n["state"] != "down"]
        assert cluster["allocated"] == sum(n["gpus_allocated"] for n in up)
        assert cluster["gpus"] == sum(n["gpu_count"] for n in up)
        pending = _get(site, "/jobs", {**where, "state": "pending", "limit": "1"})
        assert cluster["pending_jobs"] == pending["total"]
        proposed = _get(site, "/actions", {**where, "state": "proposed", "limit": "1"})
        assert cluster["awaiting_approval_actions"] == proposed["total"]
    fleet = page.locator("#fleet-figures")
    for name in FIGURES:
        shown = fleet.locator(f'[data-figure="{name}"]') if name != "gpus" else None
        if shown is not None:
            expect(shown).to_have_text(f"{overview['fleet'][name]:,}")


def _wait_until(page: Page, condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Poll ``condition`` from here, not with ``page.wait_for_function``: Playwright
    evaluates that predicate with ``eval`` in the page, which the dashboard's
    Content-Security-Policy (``script-src 'self'``) rightly refuses."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the page never reached the awaited state"
        page.wait_for_timeout(100)


def _x_range(chart: Locator) -> float:
    return float(chart.get_attribute("data-x-max") or 0) - float(
        chart.get_attribute("data-x-min") or 0
    )


def test_a_fresh_load_reads_the_overview_beside_sign_in(page: Page, site: dict[str, Any]) -> None:
    """The overview's figures are asked for while the page asks who the token is and which
    clusters there are, not after their answers (a fresh load's cards wait for one round
    trip fewer), and once."""
    held: list[Route] = []
    signing_in = re.compile(r"/api/v1/(whoami|clusters)$")
    asked: list[str] = []
    page.on("request", lambda request: asked.append(urlparse(request.url).path))

    def hold(route: Route) -> None:
        held.append(route)

    page.route(signing_in, hold)
    with page.expect_request(lambda request: request.url.endswith("/api/v1/overview")):
        page.goto(f"{site['base']}/#token={site['tokens']['viewer']}")
    # Both sign-in reads were asked for too, and neither is answered yet.
    for _ in range(100):
        if len(held) == 2:
            break
        page.wait_for_timeout(20)
    assert sorted(urlparse(route.request.url).path for route in held) == [
        "/api/v1/clusters",
        "/api/v1/whoami",
    ]
    page.unroute(signing_in, hold)
    release(held)
    expect(page.locator(".card")).to_have_count(len(SITES))
    expect(page.locator('#fleet-figures [data-figure="allocated"]')).to_have_text(
        f"{_get(site, '/overview')['fleet']['allocated']:,}"
    )
    assert asked.count("/api/v1/overview") == 1


def test_a_fresh_load_reads_before_the_dashboard_code_and_draws_cards_before_the_chart(
    page: Page, site: dict[str, Any]
) -> None:
    """The first script (app.js) asks for the overview, who the token is and the clusters
    before the rest of the dashboard (main.js) has even arrived; the cards are drawn while
    the chart's code (uPlot) is still on its way, and the chart once it comes."""
    held: list[Route] = []
    asked: list[str] = []
    page.on("request", lambda request: asked.append(urlparse(request.url).path))

    def hold(route: Route) -> None:
        held.append(route)

    dashboard = re.compile(r"/static/dist/main\.js$")
    page.route(dashboard, hold)
    page.goto(f"{site['base']}/#token={site['tokens']['viewer']}", wait_until="commit")
    for _ in range(250):
        if {"/api/v1/overview", "/api/v1/whoami", "/api/v1/clusters"} <= set(asked):
            break
        page.wait_for_timeout(20)
    assert {"/api/v1/overview", "/api/v1/whoami", "/api/v1/clusters"} <= set(asked)
    assert len(held) == 1  # main.js: not answered yet
    chart_code = re.compile(r"/static/dist/chart-[^/]*\.js$")
    page.route(chart_code, hold)
    page.unroute(dashboard, hold)
    release(held)
    expect(page.locator(".card")).to_have_count(len(SITES))
    expect(page.locator('#fleet-figures [data-figure="allocated"]')).to_have_text(
        f"{_get(site, '/overview')['fleet']['allocated']:,}"
    )
    for _ in range(250):
        if held:
            break
        page.wait_for_timeout(20)
    assert len(held) == 1, "the chart's code was not asked for"
    chart = page.locator("#util-chart")
    expect(chart.locator("canvas")).to_have_count(0)
    page.unroute(chart_code, hold)
    release(held)
    expect(chart.locator("canvas")).to_have_count(1)
    # Each read once: the begun reads were taken, not made again.
    for path in ("/api/v1/overview", "/api/v1/whoami", "/api/v1/clusters"):
        assert asked.count(path) == 1, path


def test_a_fresh_load_of_the_overview_runs_no_other_page_s_code(
    page: Page, site: dict[str, Any]
) -> None:
    """Until the cards are drawn the page fetches two scripts, app.js and main.js, and
    main.js holds no other page's code: each page's file (what-if, policies, ...) comes when
    the page is first shown, and the page works then."""
    scripts: list[str] = []

    def note(request: Request) -> None:
        if urlparse(request.url).path.endswith(".js"):
            scripts.append(urlparse(request.url).path)

    page.on("request", note)
    held: list[Route] = []

    def hold(route: Route) -> None:
        held.append(route)

    chart_code = re.compile(r"/static/dist/chart-[^/]*\.js$")
    page.route(chart_code, hold)
    page.goto(f"{site['base']}/#token={site['tokens']['operator']}")
    expect(page.locator(".card")).to_have_count(len(SITES))
    assert [s for s in scripts if not chart_code.search(s)] == [
        "/static/dist/app.js",
        "/static/dist/main.js",
    ]
    main = httpx.get(f"{site['base']}/static/dist/main.js").text
    for elsewhere in ("#whatif-form", "#policy-list", "#gpu-map", "#job-state", "#forecast-window"):
        assert elsewhere not in main, elsewhere
    page.unroute(chart_code, hold)
    release(held)
    expect(page.locator("#util-chart canvas")).to_have_count(1)

    page.goto(f"{site['base']}/#simulations")
    expect(page.locator("#whatif-form")).to_be_visible()
    expect(page.locator("#sim-table tbody tr")).to_have_count(len(site["sim"]))
    assert "/static/dist/whatif.js" in scripts
    assert "/static/dist/policy_history.js" not in scripts
    page.goto(f"{site['base']}/#policies")
    expect(page.locator("#policy-list")).to_be_visible()
    expect(page.locator("#policies")).to_be_visible()
    assert "/static/dist/pages.js" in scripts
    # The scripts asked for: each once, none twice.
    assert len(scripts) == len(set(scripts)), scripts


def test_the_chart_follows_the_page_width_zooms_and_shows_values(
    page: Page, site: dict[str, Any]
) -> None:
    page.goto(f"{site['base']}/#token={site['tokens']['viewer']}")
    chart = page.locator("#util-chart")
    expect(chart.locator("canvas")).to_have_count(1)
    holder = chart.bounding_box()
    canvas = chart.locator("canvas").bounding_box()
    assert holder and canvas and canvas["width"] >= holder["width"] - 2
    assert holder["width"] > 800  # at 1,280 px, beside the replay panel
    page.set_viewport_size({"width": 1600, "height": 900})
    wider = canvas["width"] + 300
    _wait_until(
        page, lambda: (chart.locator("canvas").bounding_box() or {"width": 0})["width"] > wider
    )
    # A drag across the plot zooms into that time range.
    over = chart.locator(".u-over").bounding_box()
    assert over
    full = _x_range(chart)
    y = over["y"] + over["height"] / 2
    page.mouse.move(over["x"] + 0.3 * over["width"], y)
    page.mouse.down()
    page.mouse.move(over["x"] + 0.6 * over["width"], y, steps=5)
    page.mouse.up()
    _wait_until(page, lambda: _x_range(chart) < full * 0.5)
    # The values under the cursor, beside it.
    page.mouse.move(over["x"] + 0.45 * over["width"], y)
    tip = chart.locator(".chart-tooltip")
    expect(tip).to_be_visible()
    expect(tip).to_contain_text("hpc-a")
    expect(tip).to_contain_text("%")
    page.mouse.dblclick(over["x"] + 0.45 * over["width"], y)
    _wait_until(page, lambda: _x_range(chart) >= full)


def test_a_stale_reply_never_overwrites_a_newer_selection(page: Page, site: dict[str, Any]) -> None:
    page.goto(f"{site['base']}/#token={site['tokens']['viewer']}")
    chart = page.locator("#util-chart")
    expect(chart).to_have_attribute("data-group-by", "cluster")

    # The GPU-model chart is asked for first and answers last, after the team chart.
    held: list[Route] = []
    stale = "group_by=gpu_model"
    page.route(lambda url: stale in url, lambda route: held.append(route))
    with page.expect_request(lambda request: stale in request.url):
        page.select_option("#group-by", "gpu_model")
    page.select_option("#group-by", "team")
    expect(chart).to_have_attribute("data-group-by", "team")
    release(held)
    page.wait_for_timeout(500)
    expect(chart).to_have_attribute("data-group-by", "team")

    # The GPU map: the first cluster's nodes answer after the second cluster was chosen.
    first, second = SITES[0].name, SITES[1].name
    slow = f"/api/v1/nodes/map?cluster={first}"
    page.route(lambda url: slow in url, lambda route: held.append(route))
    with page.expect_request(lambda request: slow in request.url):
        page.click('a[data-view="nodes"]')
    page.select_option("#node-cluster", second)
    rows = _get(site, "/nodes", {"cluster": second, "limit": "1"})["total"]
    expect(page.locator(".gpu-row")).to_have_count(rows)
    release(held)
    page.wait_for_timeout(500)
    expect(page.locator("#gpu-map")).to_have_attribute("data-cluster", second)
    expect(page.locator(".gpu-row")).to_have_count(rows)
    expect(page.locator("#node-cluster")).to_have_value(second)


def test_favicon_is_served(page: Page, site: dict[str, Any]) -> None:
    failed: list[str] = []
    page.on("response", lambda r: failed.append(f"{r.status} {r.url}") if r.status >= 400 else None)
    page.goto(f"{site['base']}/#token={site['tokens']['viewer']}")
    expect(page.locator(".card")).to_have_count(len(SITES))
    favicon = httpx.get(f"{site['base']}/favicon.ico", timeout=30)
    assert favicon.status_code == 200
    assert favicon.headers["content-type"].startswith("image/svg+xml")
    assert page.locator('link[rel="icon"]').get_attribute("href") == "/static/favicon.svg"
    assert failed == []


def _get(site: dict[str, Any], path: str, params: dict[str, str] | None = None) -> Any:
    response = httpx.get(
        f"{site['base']}/api/v1{path}",
        params=params,
        headers={"Authorization": f"Bearer {site['tokens']['viewer']}"},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    return response.json()


def test_gpu_map_and_queue(page: Page, site: dict[str, Any], tmp_path: Path) -> None:
    page.goto(f"{site['base']}/#token={site['tokens']['viewer']}")
    expect(page.locator(".card")).to_have_count(len(SITES))
    page.click('a[data-view="nodes"]')
    expect(page.locator(".gpu-row")).to_have_count(16)  # hpc-a: 16 nodes
    expect(page.locator(".gpu-row .gpu")).to_have_count(128)
    assert page.locator(".gpu.busy").count() > 0
    screenshot(page, "nodes", tmp_path)
    page.click('a[data-view="jobs"]')
    expect(page.locator("#job-table tbody tr").first).to_be_visible()
    everything = page.locator("#job-page").inner_text()
    page.select_option("#job-state", "running")
    expect(page.locator("#job-page")).not_to_have_text(everything)
    states = page.locator('#job-table tbody tr[data-job] td[data-figure="state"]').all_inner_texts()
    assert states and set(states) == {"running"}
    screenshot(page, "queue-demo", tmp_path)


def test_policy_editing_needs_operator_and_keeps_versions(
    page: Page, site: dict[str, Any], tmp_path: Path
) -> None:
    page.goto(f"{site['base']}/#token={site['tokens']['viewer']}")
    page.click('a[data-view="policies"]')
    page.fill("#policy-name", "viewer-try")
    page.click("#policy-form button")
    expect(page.locator("#policy-error")).to_contain_text("lacks the scope 'operator'")

    page.evaluate("sessionStorage.clear()")
    page.goto("about:blank")  # a new load, not a hash change on the same page
    page.goto(f"{site['base']}/#token={site['tokens']['operator']}")
    page.click('a[data-view="policies"]')
    page.fill("#policy-name", "research")
    page.click("#policy-form button")
    expect(page.locator("#policy-list")).to_contain_text("research")
    page.click('button[data-edit="research"]')
    page.fill("#policy-spec", '{"teams": [{"team": "research", "guaranteed_gpus": 4}]}')
    page.click("#policy-form button")
    expect(page.locator("#policy-list tbody tr td:nth-child(2)")).to_have_text("2")
    page.fill("#policy-spec", '{"teams": [{"team": "research", "guaranteed_gpus": -4}]}')
    page.click("#policy-form button")
    expect(page.locator("#policy-error")).to_contain_text("spec.teams[0].guaranteed_gpus")
    screenshot(page, "policies", tmp_path)


def test_a_bad_token_asks_to_sign_in(page: Page, site: dict[str, Any]) -> None:
    page.goto(f"{site['base']}/#token=shp_000000000000_{'A' * 43}")
    expect(page.locator("#login")).to_be_visible()
    expect(page.locator("#login-error")).to_contain_text("refused")
    page.fill("#token-input", site["tokens"]["viewer"])
    page.click("#login-form button")
    expect(page.locator(".card")).to_have_count(len(SITES))


def test_operator_approves_a_proposed_action(page: Page, site: dict[str, Any]) -> None:
    page.goto(f"{site['base']}/#token={site['tokens']['operator']}")
    expect(page.locator(".card")).to_have_count(len(SITES))
    page.click('a[data-view="actions"]')
    expect(page.locator("#plan-table tbody tr")).to_have_count(len(SITES))
    approve = page.locator('button[data-decide="approve"]').first
    expect(approve).to_be_visible()
    action_id = approve.get_attribute("data-id")
    approve.click()
    row = page.locator("#action-table tbody tr", has=page.locator(f'td:text-is("{action_id}")'))
    expect(row.locator("td:nth-child(6)")).to_have_text("approved")


def test_operator_approves_a_whole_plan(page: Page, site: dict[str, Any], tmp_path: Path) -> None:
    page.goto(f"{site['base']}/#token={site['tokens']['operator']}")
    expect(page.locator(".card")).to_have_count(len(SITES))
    page.click('a[data-view="actions"]')
    approve = page.locator('button[data-plan-decide="approve"]').first
    expect(approve).to_be_visible()
    plan_id = approve.get_attribute("data-id")
    approve.click()
    row = page.locator(f'#plan-table tr[data-plan="{plan_id}"]')
    expect(row.locator("td:nth-child(7)")).to_contain_text("approved")
    expect(row.locator("button")).to_have_count(0)
    # Every action of the plan is approved (none is left proposed), with its plan shown.
    for_plan = page.locator(
        "#action-table tbody tr", has=page.locator(f'td:nth-child(7):text-is("{plan_id}")')
    )
    expect(for_plan.first).to_be_visible()
    expect(for_plan.locator('td:nth-child(6):text-is("proposed")')).to_have_count(0)
    screenshot(page, "plans-and-actions", tmp_path)


def test_simulation_results_table_and_chart(
    page: Page, site: dict[str, Any], tmp_path: Path
) -> None:
    page.goto(f"{site['base']}/#token={site['tokens']['viewer']}")
    page.click("#nav a[data-view=simulations]")
    expect(page.locator("#sim-result option")).to_have_count(1)
    expect(page.locator("#sim-result option")).to_contain_text("training-heavy (seed 11)")
    rows = page.locator("#sim-table tbody tr")
    expect(rows).to_have_count(2)
    for policy in ("fifo", "shaper"):
        metrics = site["sim"][policy].metrics
        util = 100 * metrics["utilization"]
        row = page.locator(f"#sim-table tr[data-policy={policy}]")
        expect(row.locator("td").nth(1)).to_have_text(f"{util:.1f}")
        # The tail and the end beside the mean (issue 20), from the same run.
        expect(row.locator("td").nth(5)).to_have_text(f"{metrics['jct_mean_h']:.1f}")
        expect(row.locator("td").nth(6)).to_have_text(f"{metrics['jct_p99_h']:.1f}")
        expect(row.locator("td").nth(7)).to_have_text(f"{metrics['makespan_h']:.1f}")
    gain = 100 * (
        site["sim"]["shaper"].metrics["utilization"] - site["sim"]["fifo"].metrics["utilization"]
    )
    expect(page.locator("#sim-table tr[data-policy=shaper] td").nth(2)).to_have_text(f"+{gain:.1f}")
    expect(page.locator("#sim-chart polyline.sim-line")).to_have_count(2)
    expect(page.locator("#sim-none")).to_be_hidden()
    screenshot(page, "simulations", tmp_path)


def test_why_idle_panel_matches_the_diagnosis_api(
    page: Page, site: dict[str, Any], tmp_path: Path
) -> None:
    page.goto(f"{site['base']}/#token={site['tokens']['viewer']}")
    expect(page.locator(".card")).to_have_count(len(SITES))
    page.click("#nav a[data-view=idle]")
    cluster = page.locator("#idle-cluster").input_value()
    assert cluster == SITES[0].name
    diagnosis = _diagnosis(site, cluster)
    assert diagnosis["idle_gpu_hours"] > 0  # the demo site has idle GPUs to explain
    rows = page.locator("#idle-table tbody tr[data-cause]")
    expect(rows).to_have_count(len(diagnosis["causes"]))
    # Every cause, in the API's order; their GPU-hours add up to the idle GPU-hours.
    causes = [rows.nth(i).get_attribute("data-cause") for i in range(rows.count())]
    assert causes == [c["cause"] for c in diagnosis["causes"]]
    hours = [
        float(rows.nth(i).get_attribute("data-gpu-hours") or "nan") for i in range(len(causes))
    ]
    assert sum(hours) == pytest.approx(diagnosis["idle_gpu_hours"], abs=1e-3)
    shown = [
        float(t)
        for t in page.locator("#idle-table tbody tr[data-cause] td:nth-child(2)").all_inner_texts()
    ]
    assert sum(shown) == pytest.approx(diagnosis["idle_gpu_hours"], abs=0.05 * len(shown))
    capacity = diagnosis["capacity_gpu_hours"]
    top = max(diagnosis["causes"], key=lambda c: c["gpu_hours"])
    expect(
        page.locator(f'#idle-table tr[data-cause="{top["cause"]}"] td:nth-child(3)')
    ).to_have_text(f"{100 * top['gpu_hours'] / capacity:.1f}")
    expect(page.locator("#idle-table tr.total td:nth-child(2)")).to_have_text(
        f"{diagnosis['idle_gpu_hours']:.1f}"
    )
    # By GPU model: one row per model the API names, each row's idle its cells' sum.
    models = {g["key"] or "" for g in diagnosis["by_gpu_model"]}
    expect(page.locator("#idle-model-table tbody tr[data-gpu-model]")).to_have_count(len(models))
    for model in models:
        idle = sum(g["gpu_hours"] for g in diagnosis["by_gpu_model"] if (g["key"] or "") == model)
        row = page.locator(f'#idle-model-table tr[data-gpu-model="{model}"] td:last-child')
        expect(row).to_have_text(f"{idle:.1f}")
    # Another cluster: the panel follows the selection.
    other = _diagnosis(site, SITES[1].name)
    page.select_option("#idle-cluster", SITES[1].name)
    expect(page.locator("#idle-table tr.total td:nth-child(2)")).to_have_text(
        f"{other['idle_gpu_hours']:.1f}"
    )
    screenshot(page, "why-idle", tmp_path)


def _diagnosis(site: dict[str, Any], cluster: str) -> dict[str, Any]:
    response = httpx.get(
        f"{site['base']}/api/v1/diagnosis",
        params={"cluster": cluster},
        headers={"Authorization": f"Bearer {site['tokens']['viewer']}"},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


# A federation group of two simulated clusters: east is full and has a job waiting that
# its connector said how to submit elsewhere; west is idle (tests/app/test_federation.py).
GROUP = "site"
GROUP_DESCRIPTION = "Amsterdam & Stockholm <b>pool</b>"
LABELS = {"east": {"region": "eu-west", "site": "ams1"}, "west": {"region": "eu-north"}}
# Both clusters of a move must act (an observe cluster only plans), and a move is approved
# by shaper only when both enforce: east advises, so the move waits for an operator.
MODES = {"east": ShapingMode.advise, "west": ShapingMode.enforce}
SPEC = {"scheduler": "sim", "native": {"gpus": 8, "runtime_s": 3600}}


# The admin tests' server also has a cluster in no group, that may join one.
ALONE = {"north": {"region": "eu-north", "site": "osl1"}}


def _federation_site(
    tmp_path_factory: pytest.TempPathFactory, folder: str, alone: dict[str, dict[str, str]]
) -> Iterator[dict[str, Any]]:
    data = tmp_path_factory.mktemp(folder)
    url = f"sqlite:///{data / 'shaper.db'}"
    migrate.upgrade(url)
    engine = make_engine(url)
    jobs = {
        "east": [
            running("big", "east1", list(range(8))),
            job("waiting", gpus_requested=8, submit=SPEC),
        ],
    }
    with Session(engine) as session:
        gpu_model_service.ensure_default_catalogue(session=session)
        for name, labels in {**LABELS, **alone}.items():
            cluster_service.register_cluster(
                session=session,
                now=NOW,
                cluster_in=ClusterCreate(
                    name=name,
                    scheduler=SchedulerKind.sim,
                    mode=MODES.get(name, ShapingMode.observe),
                    labels=labels,
                ),
            )
            push = snapshot(1, nodes=[node(f"{name}1")], jobs=jobs.get(name, []))
            telemetry_service.ingest(
                session=session,
                cluster_name=name,
                push=TelemetrySnapshot.model_validate(push),
                now=NOW,
            )
        federation_service.create_group(
            session=session,
            group_in=FederationGroupCreate(name=GROUP, description=GROUP_DESCRIPTION),
            now=NOW,
            actor=None,
        )
        for name in LABELS:
            federation_service.add_cluster(
                session=session, name=GROUP, cluster=name, now=NOW, actor=None
            )
        tokens = tokens_for(session, NOW, ("viewer", "operator", "admin"))

    app = app_on(engine, Settings(environment="test", data_dir=data))
    app.dependency_overrides[get_clock] = lambda: FrozenClock(NOW + timedelta(minutes=1))
    with serve(app) as base:
        yield {"base": base, "tokens": tokens}
    engine.dispose()


@pytest.fixture(scope="module")
def federated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Its own server: a group's clusters would change what the demo site's pages show."""
    yield from _federation_site(tmp_path_factory, "web-federation", alone={})


@pytest.fixture(scope="module")
def managed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Another one for the tests that change groups, so that `federated`'s stay as made."""
    yield from _federation_site(tmp_path_factory, "web-federation-admin", alone=ALONE)


def _call(
    site: dict[str, Any], method: str, path: str, scope: str = "viewer", status: int = 200
) -> Any:
    response = httpx.request(
        method,
        f"{site['base']}/api/v1{path}",
        headers={"Authorization": f"Bearer {site['tokens'][scope]}"},
        timeout=60,
    )
    assert response.status_code == status, response.text
    return response.json() if response.content else None


def _groups(site: dict[str, Any]) -> dict[str, list[str]]:
    return {g["name"]: g["clusters"] for g in _call(site, "GET", "/federation-groups")}


def _post(site: dict[str, Any], path: str, scope: str = "viewer") -> Any:
    response = httpx.post(
        f"{site['base']}/api/v1{path}",
        headers={"Authorization": f"Bearer {site['tokens'][scope]}"},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    return response.json()


def _one_decimal(value: float) -> str:
    """As the page writes a float with one decimal (Intl.NumberFormat): its shortest decimal
    form rounded half away from zero (48.05 → 48.1, where f"{48.05:.1f}" says 48.0)."""
    return f"{Decimal(repr(value)).quantize(Decimal('0.1'), rounding=ROUND_HALF_UP):,}"


def test_federation_page_without_groups_says_how_to_make_one(
    page: Page, site: dict[str, Any]
) -> None:
    page.goto(f"{site['base']}/#token={site['tokens']['viewer']}")
    expect(page.locator(".card")).to_have_count(len(SITES))
    page.click("#nav a[data-view=federation]")
    expect(page.locator("#nav a[data-view=federation]")).to_have_class("active")
    none = page.locator("#federation-none")
    expect(none).to_be_visible()
    expect(none).to_contain_text("No federation groups yet")
    expect(none).to_contain_text("/api/v1/federation-groups")
    expect(page.locator(".group-card")).to_have_count(0)


def test_federation_page_shows_members_and_the_what_if_of_the_api(
    page: Page, federated: dict[str, Any], tmp_path: Path
) -> None:
    page.goto(f"{federated['base']}/#token={federated['tokens']['viewer']}")
    expect(page.locator(".card")).to_have_count(len(LABELS))
    page.click("#nav a[data-view=federation]")
    card = page.locator(f'.group-card[data-group="{GROUP}"]')
    expect(card).to_be_visible()
    expect(page.locator("#federation-none")).to_be_hidden()
    # What the API says comes through as text: markup in a description is not markup.
    expect(card.locator(".description")).to_have_text(GROUP_DESCRIPTION)
    expect(card.locator(".description b")).to_have_count(0)
    expect(card.locator('[data-link="bandwidth"]')).to_have_text("100 MiB/s")
    expect(card.locator('[data-link="overhead"]')).to_have_text("120 s")
    expect(card.locator("tr[data-member]")).to_have_count(len(LABELS))
    for name, labels in LABELS.items():
        member = card.locator(f'tr[data-member="{name}"]')
        expect(member.locator("td.mode")).to_have_text(MODES[name].value)
        expect(member.locator(".label")).to_have_text([f"{k}={v}" for k, v in labels.items()])
    # A viewer may ask what-if but not plan.
    expect(card.locator("button[data-plan-group]")).to_be_disabled()
    expect(card.locator(".group-buttons")).to_contain_text("needs the operator scope")

    card.locator("button[data-what-if]").click()
    moves = card.locator("table.moves tbody tr")
    expect(moves).to_have_count(1)
    answer = _post(federated, f"/federation-groups/{GROUP}/what-if")
    assert answer["moves"] == [
        {
            "job": "waiting",
            "from_cluster": "east",
            "to_cluster": "west",
            "gpus": 8,
            "nodes": ["west1"],
            "running": False,
            "source_node": None,
        }
    ]
    move = answer["moves"][0]
    row = card.locator(f'table.moves tr[data-job="{move["job"]}"] td')
    expect(row).to_have_text(
        [move["job"], f"{move['from_cluster']} → {move['to_cluster']}", str(move["gpus"]), "west1"]
    )
    assert answer["alone"]["pending_started"] == 0 and answer["federated"]["pending_started"] == 1
    for which in ("alone", "federated"):
        figures = answer[which]
        expect(card.locator(f'[data-figure="{which}-pending-started"]')).to_have_text(
            str(figures["pending_started"])
        )
        objective = card.locator(f'[data-figure="{which}-objective"]')
        expect(objective).to_have_text(_one_decimal(figures["objective"]))
        assert float(objective.get_attribute("data-value") or "nan") == pytest.approx(
            figures["objective"]
        )
    expect(card.locator(".dispatch")).to_have_text(answer["dispatch"])
    screenshot(page, "federation", tmp_path)


def test_operator_plans_a_group_and_the_move_waits_on_the_actions_page(
    page: Page, federated: dict[str, Any], tmp_path: Path
) -> None:
    page.goto(f"{federated['base']}/#token={federated['tokens']['operator']}")
    expect(page.locator(".card")).to_have_count(len(LABELS))
    page.click("#nav a[data-view=federation]")
    card = page.locator(f'.group-card[data-group="{GROUP}"]')
    plan = card.locator("button[data-plan-group]")
    expect(plan).to_be_enabled()
    plan.click()
    proposed = card.locator('[data-outcome="proposed"] a[data-action-link]')
    expect(proposed).to_have_count(1)
    action_id = proposed.get_attribute("data-action-link")
    expect(card.locator('[data-outcome="approved"]')).to_have_text("none")
    expect(card.locator('[data-outcome="superseded"]')).to_have_text("0")
    # The API agrees: the move is proposed in east (advise), for west.
    actions = httpx.get(
        f"{federated['base']}/api/v1/actions",
        params={"state": "proposed"},
        headers={"Authorization": f"Bearer {federated['tokens']['viewer']}"},
        timeout=30,
    ).json()["items"]
    assert [(a["id"], a["kind"], a["cluster"], a["target_cluster"]) for a in actions] == [
        (int(action_id or 0), "move", "east", "west")
    ]

    proposed.click()
    expect(page.locator("#actions")).to_be_visible()
    row = page.locator(f'#action-table tr[data-action="{action_id}"]')
    expect(row).to_have_class("marked")
    cells = row.locator("td")
    expect(cells.nth(1)).to_have_text("east → west")
    expect(cells.nth(2)).to_have_text("move")
    expect(cells.nth(3)).to_have_text("waiting")
    expect(cells.nth(5)).to_have_text("proposed")
    expect(row.locator('button[data-decide="approve"]')).to_be_visible()

    # Planned again, the proposal is kept, not made twice.
    page.click("#nav a[data-view=federation]")
    card.locator("button[data-plan-group]").click()
    expect(card.locator('[data-outcome="kept"]')).to_have_text("1")
    expect(card.locator('[data-outcome="proposed"]')).to_have_text("none")
    screenshot(page, "federation-planned", tmp_path)


def _federation_page(page: Page, site: dict[str, Any], scope: str, clusters: int) -> None:
    page.goto(f"{site['base']}/#token={site['tokens'][scope]}")
    expect(page.locator(".card")).to_have_count(clusters)
    page.click("#nav a[data-view=federation]")
    expect(page.locator(f'.group-card[data-group="{GROUP}"]')).to_be_visible()


def test_an_admin_makes_a_group_a_cluster_joins_and_leaves_it_and_the_group_goes(
    page: Page, managed: dict[str, Any], tmp_path: Path
) -> None:
    _federation_page(page, managed, "admin", len(LABELS) + len(ALONE))
    form = page.locator("#group-form")
    expect(form).to_be_visible()
    form.locator("input[name=name]").fill("lab")
    form.locator("input[name=description]").fill("Oslo <i>lab</i>")
    bandwidth = form.locator("input[name=inter_cluster_bandwidth_mib_per_s]")
    bandwidth.fill("0")
    form.locator("input[name=inter_cluster_overhead_s]").fill("30")
    # Refused (422): the API's message by the field it names, and nothing typed is lost.
    form.locator("button").click()
    expect(form.locator('[data-error-for="inter_cluster_bandwidth_mib_per_s"]')).to_contain_text(
        "greater than 0"
    )
    expect(form.locator("input[name=name]")).to_have_value("lab")
    expect(form.locator("input[name=inter_cluster_overhead_s]")).to_have_value("30")
    assert "lab" not in _groups(managed)
    bandwidth.fill("250")
    form.locator("button").click()
    lab = page.locator('.group-card[data-group="lab"]')
    expect(lab.locator(".description")).to_have_text("Oslo <i>lab</i>")
    expect(lab.locator('[data-link="bandwidth"]')).to_have_text("250 MiB/s")
    expect(lab.locator('[data-link="overhead"]')).to_have_text("30 s")
    expect(lab.locator('[data-link="egress"]')).to_have_text("free")
    expect(form.locator("input[name=name]")).to_have_value("")  # made: the form is empty again
    expect(form.locator('[data-error-for="inter_cluster_bandwidth_mib_per_s"]')).to_have_text("")
    created = _call(managed, "GET", "/federation-groups/lab")
    assert (created["description"], created["clusters"]) == ("Oslo <i>lab</i>", [])
    assert created["inter_cluster_bandwidth_mib_per_s"] == 250
    assert created["inter_cluster_overhead_s"] == 30

    # The link figures edited in place: a negative egress price is refused by its field,
    # what was typed stays; a good one is stored and shown.
    link = lab.locator("form[data-link-form]")
    expect(link.locator("input[name=inter_cluster_bandwidth_mib_per_s]")).to_have_value("250")
    egress = link.locator("input[name=inter_cluster_egress_gpu_s_per_gib]")
    egress.fill("-5")
    link.locator("button", has_text="Save link").click()
    expect(link.locator('[data-error-for="inter_cluster_egress_gpu_s_per_gib"]')).to_contain_text(
        "greater than or equal to 0"
    )
    expect(egress).to_have_value("-5")
    unchanged = _call(managed, "GET", "/federation-groups/lab")
    assert unchanged["inter_cluster_egress_gpu_s_per_gib"] == 0
    egress.fill("130")
    link.locator("input[name=inter_cluster_overhead_s]").fill("45")
    link.locator("button", has_text="Save link").click()
    expect(lab.locator('[data-link="egress"]')).to_have_text("130 GPU-s a GiB")
    expect(lab.locator('[data-link="overhead"]')).to_have_text("45 s")
    patched = _call(managed, "GET", "/federation-groups/lab")
    assert patched["inter_cluster_egress_gpu_s_per_gib"] == 130
    assert patched["inter_cluster_overhead_s"] == 45
    assert patched["inter_cluster_bandwidth_mib_per_s"] == 250

    # A name in use: the API's 409 by the name, and what was typed stays.
    form.locator("input[name=name]").fill(GROUP)
    form.locator("input[name=description]").fill("a second one")
    form.locator("button").click()
    expect(form.locator('[data-error-for="name"]')).to_contain_text(
        f"federation group '{GROUP}' exists"
    )
    expect(form.locator("input[name=name]")).to_have_value(GROUP)
    expect(form.locator("input[name=description]")).to_have_value("a second one")
    assert _call(managed, "GET", f"/federation-groups/{GROUP}")["description"] == (
        GROUP_DESCRIPTION
    )

    # Only a cluster in no group is offered. One that joined another group after the page
    # was drawn is refused (409, naming that group) next to the select.
    add = lab.locator("form[data-add-cluster]")
    expect(add.locator("select option")).to_have_text(list(ALONE))
    _call(managed, "PUT", f"/federation-groups/{GROUP}/clusters/north", scope="admin")
    add.locator("button").click()
    expect(add.locator('[data-error-for="cluster"]')).to_contain_text(
        f"is in federation group '{GROUP}'"
    )
    _call(managed, "DELETE", f"/federation-groups/{GROUP}/clusters/north", scope="admin")
    add.locator("button").click()
    member = lab.locator('tr[data-member="north"]')
    expect(member.locator(".label")).to_have_text([f"{k}={v}" for k, v in ALONE["north"].items()])
    assert _groups(managed) == {"lab": ["north"], GROUP: list(LABELS)}
    assert _call(managed, "GET", "/clusters/north")["federation_group"] == "lab"
    expect(lab.locator("form[data-add-cluster]")).to_have_count(0)
    expect(lab.locator(".group-admin")).to_contain_text("Every cluster is in a group")

    # A bad label: the API's 422 by the field, the text kept, nothing stored.
    member.locator("button[data-edit-labels]").click()
    labels = lab.locator('form[data-labels-form="north"]')
    text = "region=eu-north\nBad Key=x"
    labels.locator("textarea").fill(text)
    labels.locator("button", has_text="Save labels").click()
    error = labels.locator('[data-error-for="labels"]')
    expect(error).to_contain_text("labels: ")
    expect(error).to_contain_text("key 'Bad Key'")
    expect(labels.locator("textarea")).to_have_value(text)
    assert _call(managed, "GET", "/clusters/north")["labels"] == ALONE["north"]
    labels.locator("textarea").fill("region=eu-north\n\nrack=r7\n")
    labels.locator("button", has_text="Save labels").click()
    expect(member.locator(".label", has_text="rack=r7")).to_have_count(1)
    assert sorted(member.locator(".label").all_inner_texts()) == ["rack=r7", "region=eu-north"]
    assert _call(managed, "GET", "/clusters/north")["labels"] == {
        "region": "eu-north",
        "rack": "r7",
    }

    member.locator("button[data-remove-member]").click()
    expect(lab.locator("tr[data-member]")).to_have_count(0)
    expect(lab.locator("form[data-add-cluster] select option")).to_have_text(list(ALONE))
    assert _groups(managed) == {"lab": [], GROUP: list(LABELS)}

    # Deleting asks first; cancelled, nothing happens.
    lab.locator("button[data-delete-group]").click()
    confirm = lab.locator(".delete-confirm")
    expect(confirm).to_be_visible()
    confirm.locator("button[data-cancel-delete]").click()
    expect(confirm).to_be_hidden()
    assert "lab" in _groups(managed)
    lab.locator("button[data-delete-group]").click()
    confirm.locator("button[data-confirm-delete]").click()
    expect(lab).to_have_count(0)
    assert _groups(managed) == {GROUP: list(LABELS)}
    screenshot(page, "federation-admin", tmp_path)


def test_a_viewer_sees_no_edit_controls_and_an_operator_only_labels(
    page: Page, managed: dict[str, Any]
) -> None:
    controls = (
        "[data-edit-labels]",
        "[data-remove-member]",
        "[data-delete-group]",
        "form[data-add-cluster]",
        "form[data-labels-form]",
    )
    _federation_page(page, managed, "viewer", len(LABELS) + len(ALONE))
    expect(page.locator("#group-form")).to_be_hidden()
    for control in controls:
        expect(page.locator(f"#federation {control}")).to_have_count(0)

    page.evaluate("sessionStorage.clear()")
    page.goto("about:blank")
    _federation_page(page, managed, "operator", len(LABELS) + len(ALONE))
    expect(page.locator("#group-form")).to_be_hidden()
    card = page.locator(f'.group-card[data-group="{GROUP}"]')
    expect(card.locator("button[data-edit-labels]")).to_have_count(len(LABELS))
    for control in controls[1:4]:
        expect(page.locator(f"#federation {control}")).to_have_count(0)
    # An operator may change a member's labels.
    west = card.locator('tr[data-member="west"]')
    west.locator("button[data-edit-labels]").click()
    card.locator('form[data-labels-form="west"] textarea').fill("region=eu-north\ntier=spot")
    card.locator('form[data-labels-form="west"] button', has_text="Save labels").click()
    expect(west.locator(".label", has_text="tier=spot")).to_have_count(1)
    assert _call(managed, "GET", "/clusters/west")["labels"] == {
        "region": "eu-north",
        "tier": "spot",
    }
