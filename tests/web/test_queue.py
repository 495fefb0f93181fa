"""The queue page (Queue & jobs) in a real Chromium, against a live server whose clusters
were pushed as connectors push them and planned by the shaping cycle.

``alpha`` is full (one job runs on all eight GPUs) and four jobs wait: vision's SLA policy
(the policy named ``alpha``) bounds their wait at three hours, so ``old`` (five hours) is
past it, ``near`` (two and a half hours, 83 %) close to it and ``fresh`` (ten minutes)
well within; ``nlp-1`` has no bound. Two jobs there have ended. ``beta`` has 48 waiting
jobs and 5 running ones: more than a page, so its first page holds both kinds and its
second only running jobs. The browser's clock is fixed at the server's.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from playwright.sync_api import Page, Route, expect
from sqlmodel import Session

from app.api.deps import get_clock
from app.core import migrate
from app.core.clock import FrozenClock
from app.core.config import Settings
from app.core.db import make_engine
from app.gpu_models import service as gpu_model_service
from app.policies import service as policy_service
from app.policies.models import SlaPolicyCreate, SlaPolicySpec, TeamPolicy
from app.shaping.cycle import run_cycle
from tests.app.builders import job, node, registered_with, snapshot
from tests.support.live_server import app_on, serve, tokens_for
from tests.web.browser import release, screenshot

NOW = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)
SERVER_NOW = NOW + timedelta(minutes=1)
PAGE_SIZE = 50  # web/frontend/src/queue.ts
MAX_WAIT_S = 3 * 3600  # vision's max_queue_wait_s in alpha's policy


def _waiting(name: str, waited: timedelta, **fields: Any) -> dict[str, Any]:
    return job(name, **{"gpus_requested": 4, "submit_time": (NOW - waited).isoformat(), **fields})


def _running(
    name: str, node_name: str, indices: list[int], ran: timedelta, **fields: Any
) -> dict[str, Any]:
    return job(
        name,
        state="running",
        gpus_requested=len(indices),
        submit_time=(NOW - ran - timedelta(minutes=5)).isoformat(),
        start_time=(NOW - ran).isoformat(),
        allocations=[{"node": node_name, "gpu_indices": indices}],
        **fields,
    )


def _ended(name: str, state: str, ago: timedelta) -> dict[str, Any]:
    return job(
        name,
        state=state,
        submit_time=(NOW - ago - timedelta(hours=2)).isoformat(),
        start_time=(NOW - ago - timedelta(hours=1)).isoformat(),
        end_time=(NOW - ago).isoformat(),
    )


JOBS = {
    "alpha": [
        _running("big", "alpha1", list(range(8)), timedelta(hours=6), team="nlp"),
        _waiting("fresh", timedelta(minutes=10), reason="Resources"),
        _waiting("near", timedelta(hours=2, minutes=30), reason="Priority"),
        _waiting("old", timedelta(hours=5), reason="Resources"),
        _waiting("nlp-1", timedelta(hours=4), team="nlp"),
        _ended("done", "finished", timedelta(hours=1)),
        _ended("broke", "failed", timedelta(hours=3)),
    ],
    "beta": [
        *(
            _waiting(f"bulk-{i:02d}", timedelta(hours=1, minutes=i), team="bulk", gpus_requested=8)
            for i in range(48)
        ),
        *(
            _running(f"svc-{i}", "beta1", [i], timedelta(hours=i + 1), team="bulk")
            for i in range(5)
        ),
    ],
}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    data = tmp_path_factory.mktemp("web-queue")
    url = f"sqlite:///{data / 'shaper.db'}"
    migrate.upgrade(url)
    engine = make_engine(url)
    with Session(engine) as session:
        gpu_model_service.ensure_default_catalogue(session=session)
        policy_service.create_policy(
            session=session,
            policy_in=SlaPolicyCreate(
                name="alpha",
                spec=SlaPolicySpec(teams=[TeamPolicy(team="vision", max_queue_wait_s=MAX_WAIT_S)]),
            ),
            by="test",
            now=NOW,
        )
        for name, jobs in JOBS.items():
            registered_with(
                session, name, snapshot(1, nodes=[node(f"{name}1")], jobs=jobs), now=NOW
            )
            run_cycle(session=session, cluster_name=name, now=NOW)
        tokens = tokens_for(session, NOW, ("viewer",))
    app = app_on(engine, Settings(environment="test", data_dir=data))
    app.dependency_overrides[get_clock] = lambda: FrozenClock(SERVER_NOW)
    with serve(app) as base:
        yield {"base": base, "tokens": tokens}
    engine.dispose()


def _get(site: dict[str, Any], path: str, params: dict[str, str] | None = None) -> Any:
    response = httpx.get(
        f"{site['base']}/api/v1{path}",
        params=params,
        headers={"Authorization": f"Bearer {site['tokens']['viewer']}"},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    return response.json()


def _jobs(site: dict[str, Any], state: str, sort: str, **where: str) -> list[dict[str, Any]]:
    return _get(site, "/jobs", {"state": state, "sort": sort, "limit": "1000", **where})["items"]


def _open(page: Page, site: dict[str, Any], fragment: str = "jobs") -> None:
    page.clock.set_fixed_time(SERVER_NOW)
    page.goto(f"{site['base']}/#token={site['tokens']['viewer']}")
    expect(page.locator(".card")).to_have_count(len(JOBS))
    page.goto(f"{site['base']}/#{fragment}")
    expect(page.locator("#jobs")).to_be_visible()


def _shown(page: Page, **selection: str) -> None:
    """Waits until the reply for that selection is drawn."""
    view = page.locator("#jobs")
    for key in ("cluster", "team", "state", "ended", "offset"):
        expect(view).to_have_attribute(
            f"data-{key}", selection.get(key, "0" if key == "offset" else "")
        )


def _rows(page: Page) -> list[tuple[str, str, str]]:
    rows = page.locator("#job-table tbody tr[data-job]")
    return [
        (
            rows.nth(i).get_attribute("data-cluster") or "",
            rows.nth(i).get_attribute("data-job") or "",
            rows.nth(i).get_attribute("data-state") or "",
        )
        for i in range(rows.count())
    ]


def test_waiting_jobs_come_first_the_longest_waiting_first_and_ended_ones_on_request(
    page: Page, site: dict[str, Any], tmp_path: Path
) -> None:
    _open(page, site, "jobs&cluster=alpha")
    _shown(page, cluster="alpha")
    pending = _jobs(site, "pending", "submit_time", cluster="alpha")
    assert [j["external_id"] for j in pending] == ["old", "nlp-1", "near", "fresh"]
    assert _rows(page) == [("alpha", j, "pending") for j in ("old", "nlp-1", "near", "fresh")] + [
        ("alpha", "big", "running")
    ]
    expect(page.locator("#job-totals")).to_have_text(
        "pending 4 · suspended 0 · running 1 — on this page: 1 past max wait, 1 near it"
    )
    expect(page.locator("#job-ended")).not_to_be_checked()

    page.check("#job-ended")
    _shown(page, cluster="alpha", ended="1")
    assert [r[1:] for r in _rows(page)][-2:] == [("done", "finished"), ("broke", "failed")]
    assert [r[2] for r in _rows(page)][:5] == ["pending"] * 4 + ["running"]

    # Every cluster: the first page is beta's and alpha's waiting jobs (oldest first), then
    # running ones; a page holds 50 and the pager moves through the rest.
    page.select_option("#job-cluster", "")
    _shown(page, ended="1")
    expected = [
        (j["cluster"], j["external_id"], j["state"])
        for state, sort in (
            ("pending", "submit_time"),
            ("suspended", "submit_time"),
            ("running", "start_time"),
        )
        + tuple((s, "-end_time") for s in ("finished", "failed", "cancelled"))
        for j in _jobs(site, state, sort)
    ]
    assert len(expected) == 4 + 48 + 6 + 2
    assert _rows(page) == expected[:PAGE_SIZE]
    expect(page.locator("#job-page")).to_have_text(f"1–{PAGE_SIZE} of {len(expected)}")
    page.click("#job-next")
    _shown(page, ended="1", offset=str(PAGE_SIZE))
    assert _rows(page) == expected[PAGE_SIZE:]
    expect(page.locator("#job-next")).to_be_disabled()
    screenshot(page, "queue-all", tmp_path)


def test_a_waiting_jobs_reasons_are_the_apis_and_its_wait_is_set_against_the_sla(
    page: Page, site: dict[str, Any], tmp_path: Path
) -> None:
    _open(page, site, "jobs&cluster=alpha&state=pending")
    _shown(page, cluster="alpha", state="pending")
    (plan,) = _get(site, "/plans", {"cluster": "alpha", "limit": "1"})["items"]
    decisions = {d["job"]: d for d in plan["decisions"]}
    jobs = _jobs(site, "pending", "submit_time", cluster="alpha")
    for j in jobs:
        row = page.locator(f'#job-table tr[data-job="{j["external_id"]}"]')
        reason = row.locator('[data-figure="reason"]')
        expect(reason).to_have_text(j["reason"] or "no reason from the scheduler")
        decision = decisions[j["external_id"]]
        shown = row.locator(".decision")
        expect(shown).to_have_attribute("data-plan", str(plan["id"]))
        expect(shown).to_have_attribute("data-decision", decision["action"])
        expect(shown).to_have_attribute("data-reason", decision["reason"])
        expect(shown.locator('[data-figure="plan-reason"]')).to_have_text(
            decision["reason"].replace("_", " ")
        )
        if decision.get("message"):
            expect(shown.locator('[data-figure="plan-message"]')).to_have_text(decision["message"])
        expect(row.locator('[data-figure="team"]')).to_have_text(j["team"])
        expect(row.locator('[data-figure="gpus"]')).to_have_text(str(j["gpus_requested"]))
        expect(row.locator('[data-figure="priority"]')).to_have_text(str(j["priority"]))
        submitted = datetime.fromisoformat(j["submit_time"])
        waited = int((SERVER_NOW - submitted).total_seconds())
        expect(row.locator("td.wait")).to_have_attribute("data-waited-s", str(waited))

    marks = {"old": "overdue", "near": "near", "fresh": "within", "nlp-1": "unbounded"}
    for name, mark in marks.items():
        expect(page.locator(f'#job-table tr[data-job="{name}"]')).to_have_attribute(
            "data-sla", mark
        )
    old = page.locator('#job-table tr[data-job="old"] td.wait')
    expect(old).to_have_attribute("data-max-wait-s", str(MAX_WAIT_S))
    expect(old).to_have_text("5 h 01 min of 3 h 00 min max (167 %) ⚠ past max wait")
    expect(page.locator('#job-table tr[data-job="near"] .sla-badge')).to_have_text(
        "▲ near max wait"
    )
    expect(page.locator('#job-table tr[data-job="fresh"] .sla-badge')).to_have_count(0)
    expect(page.locator('#job-table tr[data-job="nlp-1"] td.wait')).to_have_text("4 h 01 min")
    screenshot(page, "queue", tmp_path)


def test_filters_and_the_page_live_in_the_address_and_survive_a_reload(
    page: Page, site: dict[str, Any]
) -> None:
    _open(page, site)
    _shown(page)
    page.select_option("#job-cluster", "alpha")
    page.fill("#job-team", "vision")
    page.press("#job-team", "Enter")
    page.select_option("#job-state", "pending")
    _shown(page, cluster="alpha", team="vision", state="pending")
    assert urlsplit(page.url).fragment == "jobs&cluster=alpha&team=vision&state=pending"
    page.reload()
    _shown(page, cluster="alpha", team="vision", state="pending")
    expect(page.locator("#job-cluster")).to_have_value("alpha")
    expect(page.locator("#job-team")).to_have_value("vision")
    expect(page.locator("#job-state")).to_have_value("pending")
    assert _rows(page) == [("alpha", j, "pending") for j in ("old", "near", "fresh")]

    # A page of beta's: its second page holds only running jobs, the longest running first.
    page.goto(f"{page.url.split('#')[0]}#jobs&cluster=beta&offset=50")
    page.reload()
    _shown(page, cluster="beta", offset="50")
    running = _jobs(site, "running", "start_time", cluster="beta")
    assert _rows(page) == [("beta", j["external_id"], "running") for j in running[2:]]
    expect(page.locator("#job-page")).to_have_text("51–53 of 53")
    # An offset past the end shows the last page; values the page does not offer are dropped.
    page.goto(f"{page.url.split('#')[0]}#jobs&cluster=nope&state=lost&offset=9999&cluster=beta")
    page.reload()
    _shown(page, offset="50")
    expect(page.locator("#job-cluster")).to_have_value("")
    expect(page.locator("#job-state")).to_have_value("")


def test_a_stale_reply_never_overwrites_a_newer_selection(page: Page, site: dict[str, Any]) -> None:
    _open(page, site)
    _shown(page)
    held: list[Route] = []
    page.route(
        lambda url: "/api/v1/jobs?" in url and "cluster=alpha" in url,
        lambda route: held.append(route),
    )
    with page.expect_request(lambda request: "cluster=alpha" in request.url):
        page.select_option("#job-cluster", "alpha")
    page.select_option("#job-cluster", "beta")
    _shown(page, cluster="beta")
    release(held)
    page.wait_for_timeout(500)
    _shown(page, cluster="beta")
    expect(page.locator("#job-cluster")).to_have_value("beta")
    clusters = {cluster for cluster, _, _ in _rows(page)}
    assert clusters == {"beta"}


def test_a_refusal_is_shown_and_goes_with_the_next_answer(page: Page, site: dict[str, Any]) -> None:
    _open(page, site)
    _shown(page)
    message = "the database is not reachable"
    page.route(
        "**/api/v1/jobs?*",
        lambda route: route.fulfill(
            status=503, json={"error": {"code": "unavailable", "message": message}}
        ),
    )
    page.select_option("#job-state", "running")
    error = page.locator("#job-error")
    expect(error).to_have_text(f"Could not load the queue: {message}")
    expect(page.locator("#job-table tbody tr")).to_have_count(0)
    page.unroute("**/api/v1/jobs?*")
    page.select_option("#job-state", "pending")
    _shown(page, state="pending")
    expect(error).to_be_hidden()
