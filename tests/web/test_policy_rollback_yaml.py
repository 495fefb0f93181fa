"""Rolling an SLA policy back and moving it through YAML on the SLA policies page, in a
real Chromium against a live server: an operator rolls back from the history (after a
confirmation) and the editor's heading names the version written; exports a version as a
YAML file; imports one, seeing its diff against the current version before saving, or
the API's refusal naming the field once. A viewer is offered neither.

``alpha``: version 1 (research guaranteed 8 GPUs), version 2 (16). ``beta``: version 1.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from playwright.sync_api import Dialog, Page, expect
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


def _spec(gpus: int) -> SlaPolicySpec:
    return SlaPolicySpec(teams=[TeamPolicy(team="research", guaranteed_gpus=gpus)])


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    data = tmp_path_factory.mktemp("web-policy-rollback")
    url = f"sqlite:///{data / 'shaper.db'}"
    migrate.upgrade(url)
    engine = make_engine(url)
    with Session(engine) as session:
        gpu_model_service.ensure_default_catalogue(session=session)
        for name in ("alpha", "beta"):
            policy_service.create_policy(
                session=session,
                policy_in=SlaPolicyCreate(name=name, spec=_spec(8), comment="first terms"),
                by="alice",
                now=NOW - timedelta(days=2),
            )
        policy_service.new_version(
            session=session,
            name="alpha",
            policy_in=SlaPolicyUpdate(spec=_spec(16), comment="more for research"),
            by="bob",
            now=NOW - timedelta(days=1),
        )
        tokens = tokens_for(session, NOW, ("viewer", "operator"))
    app = app_on(engine, Settings(environment="test", data_dir=data))
    app.dependency_overrides[get_clock] = lambda: FrozenClock(NOW)
    with serve(app) as base:
        yield {"base": base, "tokens": tokens}
    engine.dispose()


def _open(page: Page, site: dict[str, Any], scope: str, name: str, latest: int) -> None:
    page.goto(f"{site['base']}/#token={site['tokens'][scope]}")
    expect(page.locator("#whoami")).to_contain_text(scope)
    page.goto(f"{site['base']}/#policies")
    expect(page.locator("#policy-list tbody tr")).to_have_count(2)
    page.click(f'button[data-policy-history="{name}"]')
    panel = page.locator("#policy-history")
    expect(panel).to_have_attribute("data-policy", name)
    expect(panel).to_have_attribute("data-latest", str(latest))


def test_an_operator_rolls_back_from_the_history_and_exports_the_result(
    page: Page, site: dict[str, Any]
) -> None:
    _open(page, site, "operator", "alpha", 2)
    page.click('button[data-edit="alpha"]')
    expect(page.locator("#policy-editor-title")).to_have_text("Edit alpha (now version 2)")
    # The current version is no place to roll back to; the older one is.
    expect(page.locator('#policy-versions tr[data-version="2"] button')).to_have_count(0)

    asked: list[str] = []

    def answer(dialog: Dialog) -> None:
        asked.append(dialog.message)
        # Declined first: nothing is written.
        dialog.dismiss() if len(asked) == 1 else dialog.accept()

    page.on("dialog", answer)
    rollback = page.locator('#policy-versions tr[data-version="1"] button[data-rollback="1"]')
    expect(rollback).to_have_text("Roll back to this version")
    rollback.click()
    expect(page.locator("#policy-history")).to_have_attribute("data-latest", "2")
    assert asked and "Roll alpha back to version 1?" in asked[0]
    assert [v["version"] for v in policy_versions(site, "alpha")] == [1, 2]

    rollback.click()
    expect(page.locator("#policy-editor-title")).to_have_text("Edit alpha (now version 3)")
    expect(page.locator("#policy-history")).to_have_attribute("data-latest", "3")
    newest = page.locator("#policy-versions tbody tr").first
    expect(newest).to_have_attribute("data-version", "3")
    expect(newest.locator('[data-figure="comment"]')).to_have_text("rolled back to version 1")
    expect(newest.locator('[data-figure="by"]')).to_have_text("operator")
    assert [
        page.locator(f'#policy-diff tr[data-field="{f}"] td').all_inner_texts()[1:]
        for f in ("teams[research].guaranteed_gpus",)
    ] == [["16", "8"]]
    expect(page.locator('#policy-list tr:has(button[data-edit="alpha"]) td').nth(1)).to_have_text(
        "3"
    )
    versions = policy_versions(site, "alpha")
    assert [v["version"] for v in versions] == [1, 2, 3]
    assert versions[2]["spec"] == versions[0]["spec"]
    # The editor holds the terms now current, so its next save starts from them.
    assert '"guaranteed_gpus": 8' in page.locator("#policy-spec").input_value()

    with page.expect_download() as download:
        page.click("#policy-export")
    assert download.value.suggested_filename == "alpha-v3.yaml"
    text = Path(download.value.path()).read_text()
    assert text.startswith("# SLA policy alpha, version 3\n")
    assert yaml.safe_load(text) == versions[2]["spec"]


def test_an_import_shows_its_diff_before_saving_and_a_bad_file_names_its_field(
    page: Page, site: dict[str, Any], tmp_path: Path
) -> None:
    _open(page, site, "operator", "beta", 1)
    bad = tmp_path / "bad.yaml"
    bad.write_text("teams:\n  - team: research\n    guaranteed_gpus: -4\n")
    page.set_input_files("#policy-import-file", str(bad))
    error = page.locator("#policy-history-error")
    expect(error).to_contain_text("(line 3)")
    message = error.inner_text()
    assert message.startswith("bad.yaml: spec.teams[0].guaranteed_gpus: ")
    assert message.count("guaranteed_gpus") == 1
    expect(page.locator("#policy-import")).to_be_hidden()

    broken = tmp_path / "broken.yaml"
    broken.write_text("teams:\n  - team: [research\n")
    page.set_input_files("#policy-import-file", str(broken))
    expect(error).to_contain_text("broken.yaml: body: not YAML at line 3")

    good = tmp_path / "beta.yaml"
    good.write_text(
        "# from git\nteams:\n  - team: research\n    guaranteed_gpus: 12\n"
        "services:\n  - service: chat\n"
    )
    page.set_input_files("#policy-import-file", str(good))
    # research's guarantee, and chat's fields besides its name (all added).
    added = len(ServicePolicy.model_fields) - 1
    expect(page.locator("#policy-import-summary")).to_have_text(
        f"{1 + added} fields differ between version 1 and beta.yaml."
    )
    expect(error).to_have_text("")
    changed = page.locator('#policy-import-diff tr[data-field="teams[research].guaranteed_gpus"]')
    expect(changed).to_have_attribute("data-change", "changed")
    expect(changed.locator("td")).to_have_text(["teams[research].guaranteed_gpus", "8", "12"])
    expect(page.locator('#policy-import-diff tr[data-change="added"]')).to_have_count(added)
    assert [v["version"] for v in policy_versions(site, "beta")] == [1]  # a preview writes nothing
    screenshot(page, "policy-import", tmp_path)

    page.fill("#policy-import-comment", "research gets twelve")
    page.click("#policy-import-save")
    expect(page.locator("#policy-history")).to_have_attribute("data-latest", "2")
    newest = page.locator("#policy-versions tbody tr").first
    expect(newest.locator('[data-figure="comment"]')).to_have_text("research gets twelve")
    versions = policy_versions(site, "beta")
    assert [v["version"] for v in versions] == [1, 2]
    assert versions[1]["spec"]["teams"][0]["guaranteed_gpus"] == 12

    # The same file again: the preview says there is nothing to save.
    page.set_input_files("#policy-import-file", str(good))
    expect(page.locator("#policy-import-summary")).to_have_text(
        "beta.yaml has the terms of version 2 already; nothing to save."
    )
    expect(page.locator("#policy-import-save")).to_have_count(0)


def test_a_viewer_may_export_but_neither_roll_back_nor_import(
    page: Page, site: dict[str, Any]
) -> None:
    _open(page, site, "viewer", "alpha", int(policy_versions(site, "alpha")[-1]["version"]))
    expect(page.locator("#policy-versions tbody tr").first).to_be_visible()
    expect(page.locator("button[data-rollback]")).to_have_count(0)
    expect(page.locator("#policy-import-file")).to_have_count(0)
    with page.expect_download() as download:
        page.click("#policy-export")
    assert download.value.suggested_filename.startswith("alpha-v")
