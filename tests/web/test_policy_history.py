"""An SLA policy's history on the SLA policies page, in a real Chromium against a live
server: its versions with who wrote each, when and why, a field-by-field diff between any
two (the latest against the one before by default), and a save that says which version
is now current.

``alpha`` has two versions: alice's first terms, then bob's (research guaranteed 8 → 16
GPUs, team vision added, team nlp removed, service chat's demand target lowered).
``beta`` has one; the operator's test edits it.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Page, expect
from sqlmodel import Session

from app.api.deps import get_clock
from app.core import migrate
from app.core.clock import FrozenClock
from app.core.config import Settings
from app.core.db import make_engine
from app.gpu_models import service as gpu_model_service
from app.policies import service as policy_service
from app.policies.models import (
    ServicePolicy,
    SlaPolicyCreate,
    SlaPolicySpec,
    SlaPolicyUpdate,
    TeamPolicy,
)
from tests.support.live_server import app_on, policy_versions, serve, tokens_for
from tests.web.browser import screenshot

NOW = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)
# A team's fields besides its name: what a team added or removed shows, one row each.
TEAM_FIELDS = len(TeamPolicy.model_fields) - 1


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    data = tmp_path_factory.mktemp("web-policy-history")
    url = f"sqlite:///{data / 'shaper.db'}"
    migrate.upgrade(url)
    engine = make_engine(url)
    with Session(engine) as session:
        gpu_model_service.ensure_default_catalogue(session=session)
        first = SlaPolicySpec(
            teams=[
                TeamPolicy(team="research", guaranteed_gpus=8, borrowing_limit_gpus=8),
                TeamPolicy(team="nlp", priority_weight=2),
            ],
            services=[ServicePolicy(service="chat", min_replicas=2)],
        )
        policy_service.create_policy(
            session=session,
            policy_in=SlaPolicyCreate(name="alpha", spec=first, comment="first terms"),
            by="alice",
            now=NOW - timedelta(days=2),
        )
        second = SlaPolicySpec(
            teams=[
                TeamPolicy(team="vision", max_queue_wait_s=3600),
                TeamPolicy(team="research", guaranteed_gpus=16, borrowing_limit_gpus=8),
            ],
            services=[ServicePolicy(service="chat", min_replicas=2, demand_target=0.9)],
        )
        policy_service.new_version(
            session=session,
            name="alpha",
            policy_in=SlaPolicyUpdate(spec=second, comment="vision joins; nlp leaves"),
            by="bob",
            now=NOW - timedelta(days=1),
        )
        policy_service.create_policy(
            session=session,
            policy_in=SlaPolicyCreate(
                name="beta", spec=SlaPolicySpec(teams=[TeamPolicy(team="research")])
            ),
            by="alice",
            now=NOW - timedelta(days=1),
        )
        tokens = tokens_for(session, NOW, ("viewer", "operator"))
    app = app_on(engine, Settings(environment="test", data_dir=data))
    app.dependency_overrides[get_clock] = lambda: FrozenClock(NOW)
    with serve(app) as base:
        yield {"base": base, "tokens": tokens}
    engine.dispose()


def _open(page: Page, site: dict[str, Any], scope: str) -> None:
    page.goto(f"{site['base']}/#token={site['tokens'][scope]}")
    expect(page.locator("#whoami")).to_contain_text(scope)
    page.goto(f"{site['base']}/#policies")
    expect(page.locator("#policy-list tbody tr")).to_have_count(2)


def _history(page: Page, name: str, latest: int) -> None:
    page.click(f'button[data-policy-history="{name}"]')
    panel = page.locator("#policy-history")
    expect(panel).to_have_attribute("data-policy", name)
    expect(panel).to_have_attribute("data-latest", str(latest))


def _row(page: Page, field: str) -> list[str]:
    row = page.locator(f'#policy-diff tr[data-field="{field}"]')
    return [row.get_attribute("data-change") or "", *row.locator("td").all_inner_texts()[1:]]


def test_a_policys_versions_and_the_latest_against_the_one_before(
    page: Page, site: dict[str, Any], tmp_path: Path
) -> None:
    _open(page, site, "viewer")
    _history(page, "alpha", 2)
    expect(page.locator("#policy-history-title")).to_have_text("History of alpha 2 versions")
    versions = policy_versions(site, "alpha")
    rows = page.locator("#policy-versions tbody tr")
    expect(rows).to_have_count(len(versions))
    for row, version in zip(rows.all(), reversed(versions), strict=True):
        expect(row).to_have_attribute("data-version", str(version["version"]))
        expect(row.locator('[data-figure="by"]')).to_have_text(version["created_by"])
        expect(row.locator('[data-figure="comment"]')).to_have_text(version["comment"])
        when = datetime.fromisoformat(version["created_at"]).astimezone(UTC)
        expect(row.locator("td").nth(1)).to_have_text(when.strftime("%Y-%m-%d %H:%M:%S"))

    expect(page.locator("#diff-from")).to_have_value("1")
    expect(page.locator("#diff-to")).to_have_value("2")
    changed = 2
    expect(page.locator("#policy-diff-summary")).to_have_text(
        f"{changed + 2 * TEAM_FIELDS} fields differ between version 1 and version 2."
    )
    assert _row(page, "teams[research].guaranteed_gpus") == ["changed", "8", "16"]
    assert _row(page, "services[chat].demand_target") == ["changed", "1", "0.9"]
    assert _row(page, "teams[vision].max_queue_wait_s") == ["added", "—", "3600"]
    assert _row(page, "teams[nlp].priority_weight") == ["removed", "2", "—"]
    for change in ("added", "removed"):
        expect(page.locator(f'#policy-diff tr[data-change="{change}"]')).to_have_count(TEAM_FIELDS)
    # Research moved in the list and kept its borrowing limit: no row for either.
    expect(
        page.locator('#policy-diff tr[data-field="teams[research].borrowing_limit_gpus"]')
    ).to_have_count(0)
    screenshot(page, "policy-history", tmp_path)

    # Any two versions, either way round.
    page.select_option("#diff-from", "2")
    page.select_option("#diff-to", "1")
    assert _row(page, "teams[research].guaranteed_gpus") == ["changed", "16", "8"]
    assert _row(page, "teams[nlp].priority_weight") == ["added", "—", "2"]
    page.select_option("#diff-to", "2")
    expect(page.locator("#policy-diff-summary")).to_have_text(
        "Version 2 against itself: choose two versions."
    )
    expect(page.locator("#policy-diff tbody tr")).to_have_count(0)


def test_after_a_save_the_heading_and_the_history_show_the_version_now_current(
    page: Page, site: dict[str, Any]
) -> None:
    _open(page, site, "operator")
    _history(page, "beta", 1)
    expect(page.locator("#policy-diff-summary")).to_have_text(
        "Version 1 against itself: choose two versions."
    )
    page.click('button[data-edit="beta"]')
    expect(page.locator("#policy-editor-title")).to_have_text("Edit beta (now version 1)")
    # Someone else writes version 2 meanwhile: this save is version 3, not "1 + 1".
    other = httpx.put(
        f"{site['base']}/api/v1/policies/beta",
        headers={"Authorization": f"Bearer {site['tokens']['operator']}"},
        json={"spec": {"teams": [{"team": "research", "guaranteed_gpus": 2}]}, "comment": "api"},
        timeout=30,
    )
    assert other.status_code == 200, other.text
    page.fill("#policy-spec", '{"teams": [{"team": "research", "guaranteed_gpus": 4}]}')
    page.fill("#policy-comment", "research needs four")
    page.click("#policy-form button")
    expect(page.locator("#policy-editor-title")).to_have_text("Edit beta (now version 3)")
    assert [v["version"] for v in policy_versions(site, "beta")] == [1, 2, 3]

    panel = page.locator("#policy-history")
    expect(panel).to_have_attribute("data-latest", "3")
    newest = page.locator("#policy-versions tbody tr").first
    expect(newest).to_have_attribute("data-version", "3")
    expect(newest.locator('[data-figure="by"]')).to_have_text("operator")
    expect(newest.locator('[data-figure="comment"]')).to_have_text("research needs four")
    expect(page.locator("#diff-from")).to_have_value("2")
    assert _row(page, "teams[research].guaranteed_gpus") == ["changed", "2", "4"]
    expect(page.locator("#policy-diff tbody tr")).to_have_count(1)
    expect(page.locator('#policy-list tr:has(button[data-edit="beta"]) td').nth(1)).to_have_text(
        "3"
    )
