"""The plan page in a real Chromium, against a live server over a simulated cluster whose
saga steps the in-process executors answer (as in ``shaper demo``): a plan as a unit — its
figures for people, its placement before and after, its actions by stage with the saga's
steps — approved whole by an operator, and not by a viewer.

The cluster is ``tests/app/test_plans_embedded``'s: two 8-GPU nodes, each holding one
4-GPU checkpointable job, and an 8-GPU job waiting. In advise mode the plan proposes to
move one half-job next to the other and start the big job on the node it frees.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from playwright.sync_api import Locator, Page, Route, expect
from sqlalchemy import Engine
from sqlmodel import Session

from app.actions import local, saga, tasks
from app.actions.router import get_dispatcher
from app.clusters.models import ShapingMode
from app.core import migrate
from app.core.config import Settings
from app.core.db import make_engine
from app.gpu_models import service as gpu_model_service
from app.plans import service as plan_service
from tests.app.test_plans_embedded import T0, Site, _fragment, _report, _spec
from tests.support.live_server import app_on, serve, tokens_for
from tests.web.browser import release, screenshot

REFRESH_S = 3  # web/frontend/src/plan.ts REFRESH_MS


@pytest.fixture
def engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Engine]:
    url = f"sqlite:///{tmp_path / 'shaper.db'}"
    migrate.upgrade(url)
    engine = make_engine(url)
    with Session(engine) as session:
        gpu_model_service.ensure_default_catalogue(session=session)
        session.commit()
    # The saga tasks the test runs (what the in-process beat does) use this database, and
    # poll the simulated scheduler, which answers at once, quickly.
    monkeypatch.setattr(tasks, "get_engine", lambda: engine)
    monkeypatch.setattr(saga, "CONFIRM_POLL_S", 0.05)
    monkeypatch.setattr(saga, "RETRY_BACKOFF_S", (0.05,))
    yield engine
    engine.dispose()


@contextmanager
def _site(engine: Engine, tmp_path: Path, **spec: Any) -> Iterator[Site]:
    site = Site(engine, tmp_path, _spec(**spec), ShapingMode.advise)
    prefixes = site.executors.queues()
    for prefix in prefixes:
        local.register(prefix, site.handle)
    try:
        _fragment(site)
        yield site
    finally:
        for prefix in prefixes:
            local.unregister(prefix)


@pytest.fixture
def site(engine: Engine, tmp_path: Path) -> Iterator[Site]:
    with _site(engine, tmp_path) as made:
        yield made


@pytest.fixture
def server(engine: Engine) -> Iterator[dict[str, Any]]:
    with Session(engine) as session:
        tokens = tokens_for(session, T0, ("viewer", "operator"))
    app = app_on(engine, Settings(environment="test"))
    # Approved actions are dispatched by the sweeps the test runs.
    app.dependency_overrides[get_dispatcher] = lambda: lambda action_id: None
    with serve(app) as base:
        yield {"base": base, "tokens": tokens}


def _get(server: dict[str, Any], path: str, params: dict[str, Any] | None = None) -> Any:
    response = httpx.get(
        f"{server['base']}/api/v1{path}",
        params=params,
        headers={"Authorization": f"Bearer {server['tokens']['viewer']}"},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    return response.json()


def _open(page: Page, server: dict[str, Any], fragment: str, scope: str = "operator") -> None:
    page.goto(f"{server['base']}/#token={server['tokens'][scope]}")
    expect(page.locator(".card")).to_have_count(1)
    page.goto(f"{server['base']}/#{fragment}")


def _shown(page: Page, plan_id: int) -> Locator:
    view = page.locator("#plan")
    expect(view).to_be_visible()
    expect(view).to_have_attribute("data-plan", str(plan_id))
    return view


# The page's formatting (web/frontend/src/format.ts), for the API's figures.
def _figure(value: float) -> str:
    digits = 1 if abs(value) >= 100 else 2
    text = f"{round(value, digits) + 0:,.{digits}f}"
    return text if digits == 1 else text.rstrip("0").rstrip(".")


def _when(iso: str) -> str:
    at = datetime.fromisoformat(iso).astimezone(UTC)
    return f"{at.day} {at:%b %Y}, {at:%H:%M:%S} UTC"


def _side(row: Locator, side: str) -> dict[str, int]:
    holders = row.locator(f'td[data-side="{side}"] .holders [data-job]')
    return {
        holders.nth(i).get_attribute("data-job") or "": int(
            holders.nth(i).get_attribute("data-gpus") or 0
        )
        for i in range(holders.count())
    }


def _expect_figures_and_placement(page: Page, server: dict[str, Any], plan_id: int) -> None:
    plan = _get(server, f"/plans/{plan_id}")
    fields = page.locator("#plan-fields")
    for field, value in (
        ("cluster", "lab"),
        ("mode", "advise"),
        ("status", plan["status"]),
        ("objective", _figure(plan["objective"])),
        ("gap", "–" if plan["gap"] is None else f"{max(0.0, plan['gap']) * 100:.1f} %"),
        ("solve-time", f"{plan['wall_time_s']:.2f} s"),
    ):
        expect(fields.locator(f'[data-field="{field}"]')).to_have_text(value)
    expect(fields.locator('[data-field="created"]')).to_contain_text(_when(plan["created_at"]))
    expect(fields.locator('[data-field="policy"]')).to_have_text(
        f"{plan['policy']} · {plan['engine']}"
    )
    placement = _get(server, f"/plans/{plan_id}/placement")
    rows = page.locator("#plan-placement tbody tr")
    expect(rows).to_have_count(len(placement["nodes"]))
    for node in placement["nodes"]:
        row = page.locator(f'#plan-placement tr[data-node="{node["node"]}"]')
        for side in ("before", "after"):
            expected = {j["job"]: j["gpus"] for j in node[side]}
            assert _side(row, side) == expected, (node["node"], side)
            cells = row.locator(f'td[data-side="{side}"] .gpu')
            expect(cells).to_have_count(node["gpus"])
            # Each job on the GPUs the API names (the plan's own assignment after).
            for job in node[side]:
                for index in job["gpu_indices"]:
                    expect(cells.nth(index)).to_have_attribute("data-job", job["job"])


def _expect_actions(page: Page, server: dict[str, Any], plan_id: int) -> list[dict[str, Any]]:
    actions = _get(server, "/actions", {"plan_id": plan_id})["items"]
    cards = page.locator("#plan-actions .plan-action")
    expect(cards).to_have_count(len(actions))
    stage = {}
    for action in actions:
        card = page.locator(f'#plan-actions .plan-action[data-action="{action["id"]}"]')
        expect(card).to_have_attribute("data-state", action["state"])
        expect(card).to_have_attribute(
            "data-depends-on", " ".join(str(d) for d in action["depends_on"])
        )
        stage[action["id"]] = int(card.get_attribute("data-stage") or 0)
    # Whatever an action waits on is in an earlier stage; the first stage waits on nothing.
    for action in actions:
        for prerequisite in action["depends_on"]:
            assert stage[prerequisite] < stage[action["id"]]
        assert (stage[action["id"]] == 1) == (not action["depends_on"])
    return actions


def test_operator_approves_the_plan_from_its_page_and_the_jobs_run_where_it_placed_them(
    page: Page, site: Site, server: dict[str, Any], tmp_path: Path
) -> None:
    result = site.cycle()
    _open(page, server, "actions")
    link = page.locator(f'#plan-table tr[data-plan="{result.plan_id}"] a[data-plan-link]')
    expect(link).to_have_text(f"#{result.plan_id}")
    link.click()
    view = _shown(page, result.plan_id)
    assert urlsplit(page.url).fragment == f"plan&id={result.plan_id}"
    expect(page.locator('#nav a[data-view="actions"]')).to_have_class("active")
    expect(view).to_have_attribute("data-state", "proposed")
    _expect_figures_and_placement(page, server, result.plan_id)
    actions = _expect_actions(page, server, result.plan_id)
    assert {a["state"] for a in actions} == {"proposed"}
    placement = _get(server, f"/plans/{result.plan_id}/placement")
    (planned,) = [n["node"] for n in placement["nodes"] if "big" in {j["job"] for j in n["after"]}]
    expect(view).to_have_attribute("data-live", "true")  # proposed actions have not ended

    page.locator('button[data-plan-verdict="approve"]').click()
    expect(view).to_have_attribute("data-state", "approved")
    expect(page.locator('button[data-plan-verdict="approve"]')).to_have_count(0)
    expect(page.locator('#plan-fields [data-field="decided"]')).to_contain_text("operator")
    assert {a["state"] for a in _get(server, "/actions", {"plan_id": result.plan_id})["items"]} == {
        "approved"
    }
    for action in actions:
        expect(page.locator(f'.plan-action[data-action="{action["id"]}"]')).to_have_attribute(
            "data-state", "approved"
        )

    site.run_sagas()
    assert site.states()["big"] == ("running", [planned])
    # The page reads the plan again by itself until every action has ended.
    expect(view).to_have_attribute("data-live", "false", timeout=(REFRESH_S + 10) * 1000)
    actions = _expect_actions(page, server, result.plan_id)
    assert {a["state"] for a in actions} == {"succeeded"}
    steps = _get(server, f"/plans/{result.plan_id}/steps")
    assert steps and {s["action_id"] for s in steps} == {a["id"] for a in actions}
    for step in steps:
        card = page.locator(f'.plan-action[data-action="{step["action_id"]}"]')
        row = card.locator(f'tr.step[data-step="{step["name"]}"][data-phase="{step["phase"]}"]')
        expect(row.locator('[data-figure="where"]')).to_have_text(step["queue"])
        expect(row.locator('[data-figure="step-state"]')).to_have_text("succeeded")
        expect(row.locator('[data-figure="attempts"]')).to_have_text(str(step["attempts"]))
    _expect_figures_and_placement(page, server, result.plan_id)
    # Once every action has ended the page stops reading.
    reads: list[str] = []
    page.on("request", lambda request: reads.append(request.url))
    page.wait_for_timeout((REFRESH_S + 1) * 1000)
    assert [url for url in reads if "/api/v1/" in url] == []
    screenshot(page, "plan", tmp_path)


def test_a_failed_step_shows_its_error_on_that_step(
    page: Page, engine: Engine, tmp_path: Path, server: dict[str, Any]
) -> None:
    """``test_plans_embedded``'s move that loses its target and its source: a scheduler
    that holds no GPUs gives the move's target to a rival once its checkpoint frees them."""
    rival = _report("rival", 4, submitted=T0 - timedelta(hours=1))
    with _site(engine, tmp_path, honours_reservations=False) as site:
        result = site.cycle()
        site.after_step["checkpoint"] = lambda: site.cluster.submit(rival, timedelta(hours=1))
        with Session(engine) as session:
            plan_service.decide_plan(
                session=session, plan_id=result.plan_id, approve=True, by="alice", now=T0
            )
        site.run_sagas()
    _open(page, server, f"plan&id={result.plan_id}", scope="viewer")
    view = _shown(page, result.plan_id)
    expect(view).to_have_attribute("data-live", "false")
    actions = _expect_actions(page, server, result.plan_id)
    (move,) = [a for a in actions if a["kind"] == "migrate"]
    assert move["state"] == "compensated"
    card = page.locator(f'.plan-action[data-action="{move["id"]}"]')
    expect(card.locator('[data-figure="error"]')).to_have_text(move["error"])
    failed = [s for s in _get(server, f"/plans/{result.plan_id}/steps") if s["state"] == "failed"]
    assert failed and all(s["action_id"] in {a["id"] for a in actions} for s in failed)
    for step in failed:
        card = page.locator(f'.plan-action[data-action="{step["action_id"]}"]')
        row = card.locator(f'tr.step[data-step="{step["name"]}"][data-phase="{step["phase"]}"]')
        expect(row).to_have_attribute("data-state", "failed")
        # The error is on the row right after its step's.
        error = row.locator("xpath=following-sibling::tr[1]")
        expect(error).to_have_class("step-error")
        expect(error.locator('[data-figure="step-error"]')).to_have_text(step["error"])
    # The start that waited on the move did not run, and says why.
    (start,) = [a for a in actions if a["kind"] == "start"]
    assert start["state"] == "cancelled" and move["id"] in start["depends_on"]
    waits = page.locator(f'.plan-action[data-action="{start["id"]}"] [data-figure="waits"]')
    expect(waits.locator(f'[data-on="{move["id"]}"]')).to_contain_text("(compensated)")
    screenshot(page, "plan-failed", tmp_path)


def test_a_viewer_cannot_approve_a_plan(page: Page, site: Site, server: dict[str, Any]) -> None:
    result = site.cycle()
    _open(page, server, f"plan&id={result.plan_id}", scope="viewer")
    view = _shown(page, result.plan_id)
    expect(view).to_have_attribute("data-state", "proposed")
    for verdict in ("approve", "reject"):
        expect(page.locator(f'button[data-plan-verdict="{verdict}"]')).to_be_disabled()
    expect(page.locator("#plan-decide")).to_contain_text("needs an operator token")
    refused = httpx.post(
        f"{server['base']}/api/v1/plans/{result.plan_id}/approve",
        headers={"Authorization": f"Bearer {server['tokens']['viewer']}"},
        timeout=30,
    )
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden"
    assert _get(server, f"/plans/{result.plan_id}")["state"] == "proposed"
    assert {a["state"] for a in _get(server, "/actions", {"plan_id": result.plan_id})["items"]} == {
        "proposed"
    }


def test_a_stale_reply_never_overwrites_a_newer_plan(
    page: Page, site: Site, server: dict[str, Any]
) -> None:
    first = site.cycle()
    site.clock.now += timedelta(minutes=1)
    with Session(site.engine) as session:
        plan_service.decide_plan(
            session=session, plan_id=first.plan_id, approve=False, by="alice", now=T0
        )
    second = site.cycle()
    assert second.plan_id != first.plan_id
    _open(page, server, f"plan&id={second.plan_id}")
    _shown(page, second.plan_id)
    held: list[Route] = []
    page.route(f"**/api/v1/plans/{first.plan_id}", lambda route: held.append(route))
    with page.expect_request(f"**/api/v1/plans/{first.plan_id}"):
        page.goto(f"{server['base']}/#plan&id={first.plan_id}")
    page.goto(f"{server['base']}/#plan&id={second.plan_id}")
    _shown(page, second.plan_id)
    release(held)
    page.wait_for_timeout(500)
    _shown(page, second.plan_id)
    expect(page.locator("#plan-title")).to_contain_text(f"Plan #{second.plan_id}")


def test_an_unknown_plan_says_so(page: Page, site: Site, server: dict[str, Any]) -> None:
    _open(page, server, "plan&id=999999")
    expect(page.locator("#plan-load-error")).to_have_text(
        "Could not load plan 999999: plan 999999 does not exist"
    )
