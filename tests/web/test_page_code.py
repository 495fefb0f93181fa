"""A page whose code does not load (its file refused by the network, so ``import()``
rejects) says so in the page, as an alert naming the page and its file, with a button that
tries again; in a real Chromium against a live server (``main.ts``: ``Code``, ``route``).

One cluster, ``alpha``: two nodes of 8 GPUs, one job running on four of them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from playwright.sync_api import Page, Route, expect
from sqlmodel import Session

from app.api.deps import get_clock
from app.core import migrate
from app.core.clock import FrozenClock
from app.core.config import Settings
from app.core.db import make_engine
from app.gpu_models import service as gpu_model_service
from tests.app.builders import job, node, registered_with, snapshot
from tests.support.live_server import app_on, serve, tokens_for

NOW = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)
GPUS = 16


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    data = tmp_path_factory.mktemp("web-page-code")
    url = f"sqlite:///{data / 'shaper.db'}"
    migrate.upgrade(url)
    engine = make_engine(url)
    push = snapshot(
        1,
        nodes=[node("a1"), node("a2")],
        jobs=[
            job(
                "train",
                state="running",
                gpus_requested=4,
                submit_time=(NOW - timedelta(hours=2)).isoformat(),
                start_time=(NOW - timedelta(hours=1)).isoformat(),
                allocations=[{"node": "a1", "gpu_indices": [0, 1, 2, 3]}],
            ),
            job("waiting", gpus_requested=2, submit_time=(NOW - timedelta(minutes=5)).isoformat()),
        ],
    )
    with Session(engine) as session:
        gpu_model_service.ensure_default_catalogue(session=session)
        registered_with(session, "alpha", push, now=NOW)
        tokens = tokens_for(session, NOW, ("viewer",))
    app = app_on(engine, Settings(environment="test", data_dir=data))
    app.dependency_overrides[get_clock] = lambda: FrozenClock(NOW + timedelta(minutes=1))
    with serve(app) as base:
        yield {"base": base, "tokens": tokens}
    engine.dispose()


def _refused(route: Route) -> None:
    route.abort("connectionrefused")


def test_a_page_whose_code_does_not_load_says_so_and_retry_shows_it(
    page: Page, site: dict[str, Any]
) -> None:
    """Navigated to from the overview: the overview goes, the alert names the page and its
    file; once the file can be fetched, Retry shows the map. (Refused from the start: the
    overview, once drawn, asks for the map's code in idle time.)"""
    map_code = re.compile(r"/static/dist/map\.js$")
    page.route(map_code, _refused)
    page.goto(f"{site['base']}/#token={site['tokens']['viewer']}")
    expect(page.locator(".card")).to_have_count(1)
    alert = page.get_by_role("alert")
    expect(alert).to_be_hidden()
    asked: list[str] = []
    page.on("request", lambda request: asked.append(request.url))

    page.get_by_role("link", name="Nodes & GPUs").click()
    expect(alert).to_be_visible()
    expect(alert).to_contain_text("The Nodes & GPUs page could not be loaded")
    expect(alert).to_contain_text("map.js")
    # The page asked for is not there, and the one before it is not shown as if it were.
    expect(page.locator("#overview")).to_be_hidden()
    expect(page.locator("#nodes")).to_be_hidden()
    assert any(map_code.search(url) for url in asked)

    # Still refused: Retry asks again and says so again.
    asked.clear()
    alert.get_by_role("button", name="Retry").click()
    expect(alert).to_contain_text("The Nodes & GPUs page could not be loaded")
    assert any(map_code.search(url) for url in asked)

    page.unroute(map_code, _refused)
    alert.get_by_role("button", name="Retry").click()
    expect(page.locator("#nodes")).to_be_visible()
    expect(page.locator("#gpu-map .gpu")).to_have_count(GPUS)
    expect(alert).to_be_hidden()
    expect(page.locator("#overview")).to_be_hidden()


def test_a_fresh_load_of_a_page_whose_code_does_not_load_says_so(
    page: Page, site: dict[str, Any]
) -> None:
    """The queue asked for on a fresh load, its file refused: the alert; going to another
    page takes it away; the queue's page once its file comes."""
    queue_code = re.compile(r"/static/dist/queue\.js$")
    page.route(queue_code, _refused)
    # Signed in already (this tab's storage), the address naming the queue.
    page.add_init_script(f"sessionStorage.setItem('shaper-token', '{site['tokens']['viewer']}')")
    page.goto(f"{site['base']}/#jobs")
    alert = page.get_by_role("alert")
    expect(alert).to_contain_text("The Queue & jobs page could not be loaded")
    expect(alert).to_contain_text("queue.js")
    expect(page.locator("#jobs")).to_be_hidden()

    page.get_by_role("link", name="Overview").click()
    expect(page.locator(".card")).to_have_count(1)
    expect(alert).to_be_hidden()

    page.unroute(queue_code, _refused)
    page.get_by_role("link", name="Queue & jobs").click()
    expect(page.locator("#jobs")).to_be_visible()
    expect(page.locator("#job-table tbody tr[data-job]")).to_have_count(2)
    expect(alert).to_be_hidden()
