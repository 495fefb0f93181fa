"""The Simulations page's what-if form, in a real Chromium against a live server: an
operator runs a built-in scenario under two policies, follows its progress, and sees its
result in the page's table; leaving the page stops the polling, coming back resumes it.
An operator uploads a trace and sees its replay's result; a trace the loader cannot read
is refused by the file field.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, Request, expect
from sqlmodel import Session

from app.core import migrate
from app.core.config import Settings
from app.core.db import make_engine
from app.gpu_models import service as gpu_model_service
from sim.run import compare
from sim.scenario import load_scenario
from sim.traces import TraceOptions, open_trace
from tests.support.live_server import app_on, serve, tokens_for
from tests.web.browser import screenshot

NOW = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)
SCENARIO, SEED, POLICIES = "mixed", 5, ("fifo", "priority")
# A small trace to upload (tests/app/data/README.md).
TRACE = Path(__file__).parents[1] / "app" / "data" / "pollux-workload-1.csv"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    data = tmp_path_factory.mktemp("web-whatif")
    url = f"sqlite:///{data / 'shaper.db'}"
    migrate.upgrade(url)
    engine = make_engine(url)
    with Session(engine) as session:
        gpu_model_service.ensure_default_catalogue(session=session)
        tokens = tokens_for(session, NOW, ("viewer", "operator"))
    with serve(app_on(engine, Settings(environment="test", data_dir=data))) as base:
        yield {"base": base, "tokens": tokens}
    engine.dispose()


def test_an_operator_runs_a_scenario_and_sees_its_result(
    page: Page, site: dict[str, Any], tmp_path: Path
) -> None:
    polls: list[float] = []

    def count(request: Request) -> None:
        if "/api/v1/simulations/runs/" in request.url:
            polls.append(time.monotonic())

    page.on("request", count)
    page.goto(f"{site['base']}/#token={site['tokens']['operator']}")
    page.click("#nav a[data-view=simulations]")
    expect(page.locator("#sim-none")).to_be_visible()
    expect(page.locator("#whatif-form")).to_be_visible()
    page.select_option("#whatif-scenario", SCENARIO)
    for box in page.locator("#whatif-policies input").all():
        box.set_checked((box.get_attribute("value") or "") in POLICIES)
    page.fill("#whatif-seed", str(SEED))
    with page.expect_request(lambda request: "/api/v1/simulations/runs/" in request.url):
        page.click("#whatif-run")
    expect(page.locator("#whatif-status")).to_contain_text(SCENARIO)

    # Away from the page nothing is polled; back on it the run is followed again.
    page.click("#nav a[data-view=overview]")
    expect(page.locator("#overview")).to_be_visible()
    left = len(polls)
    page.wait_for_timeout(2000)
    assert len(polls) == left
    page.click("#nav a[data-view=simulations]")

    status = page.locator("#whatif-status")
    expect(status).to_have_attribute("data-state", "done", timeout=120_000)
    expect(status).to_contain_text(f"fifo, priority (seed {SEED})")
    expect(page.locator("#whatif-progress")).to_be_hidden()
    expect(page.locator("#whatif-error")).to_have_text("")
    chosen = page.locator("#sim-result option:checked")
    expect(chosen).to_contain_text(f"{SCENARIO} (seed {SEED}) · fifo, priority")
    expected = compare(load_scenario(SCENARIO, seed=SEED), list(POLICIES))
    expect(page.locator("#sim-table tbody tr")).to_have_count(2)
    for policy in POLICIES:
        utilization = expected[policy].metrics["utilization"]
        assert utilization is not None
        util = 100 * utilization
        row = page.locator(f"#sim-table tr[data-policy={policy}]")
        expect(row.locator("td").nth(1)).to_have_text(f"{util:.1f}")
    expect(page.locator("#sim-chart polyline.sim-line")).to_have_count(2)
    screenshot(page, "whatif", tmp_path)


def test_a_viewer_is_not_offered_the_form(page: Page, site: dict[str, Any]) -> None:
    page.goto(f"{site['base']}/#token={site['tokens']['viewer']}")
    page.click("#nav a[data-view=simulations]")
    expect(page.locator("#sim-table")).to_be_attached()
    expect(page.locator("#whoami")).to_contain_text("viewer")
    expect(page.locator("#whatif-form")).to_be_hidden()


def test_an_operator_replays_an_uploaded_trace(
    page: Page, site: dict[str, Any], tmp_path: Path
) -> None:
    page.goto(f"{site['base']}/#token={site['tokens']['operator']}")
    page.click("#nav a[data-view=simulations]")
    expect(page.locator("#whatif-form")).to_be_visible()
    expect(page.locator("#whatif-replay")).to_be_hidden()
    # The policies are listed once the options have come (all ticked): then choose two.
    expect(page.locator("#whatif-policies input:checked")).to_have_count(4)
    for box in page.locator("#whatif-policies input").all():
        box.set_checked((box.get_attribute("value") or "") in ("fifo", "backfill"))

    # A file the loaders do not know: refused by the file field, with what they know.
    bad = tmp_path / "notes.csv"
    bad.write_text("job,gpus\n1,2\n")
    page.set_input_files("#whatif-trace", str(bad))
    expect(page.locator("#whatif-scenario")).to_be_disabled()
    expect(page.locator("#whatif-replay")).to_be_visible()
    page.click("#whatif-run")
    error = page.locator("#whatif-trace-error")
    # The loader reads it in a process of its own: a wait longer than expect's default.
    expect(error).to_contain_text(
        "trace: cannot tell the trace format of notes.csv", timeout=60_000
    )
    expect(error).to_contain_text("pollux")
    expect(page.locator("#whatif-trace")).to_have_attribute("aria-invalid", "true")
    expect(page.locator("#whatif-error")).to_have_text("")

    page.set_input_files("#whatif-trace", str(TRACE))
    expect(error).to_have_text("")
    page.fill("#whatif-gpus", "32")
    page.fill("#whatif-window-end", "6")
    page.click("#whatif-run")
    status = page.locator("#whatif-status")
    expect(status).to_have_attribute("data-state", "done", timeout=120_000)
    expect(status).to_have_text("pollux:pollux-workload-1: done, fifo, backfill (seed 0)")
    expect(page.locator("#whatif-error")).to_have_text("")
    expect(page.locator("#sim-result option:checked")).to_contain_text("pollux:pollux-workload-1")
    loaded = open_trace(TRACE, options=TraceOptions(gpus=32, window_end_h=6))
    expected = compare(
        loaded.workload, ["fifo", "backfill"], replan_on_events=False, validate_plans=False
    )
    expect(page.locator("#sim-table tbody tr")).to_have_count(2)
    for policy, result in expected.items():
        utilization = result.metrics["utilization"]
        assert utilization is not None
        row = page.locator(f"#sim-table tr[data-policy={policy}]")
        expect(row.locator("td").nth(1)).to_have_text(f"{100 * utilization:.1f}")
