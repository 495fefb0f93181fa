"""One headless Chromium per module of the dashboard's tests, a fresh context for each test,
and no uncaught error in the page.

Per module, not per session: Playwright's sync API keeps an asyncio loop running in the
test's thread while it is open, and on a pytest-xdist worker the next module may be one
that runs its own loop there (``anyio.run``), which then fails with "Already running
asyncio in this thread"."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect, sync_playwright

from tests.web.browser import BUNDLE, CHROMIUM

# How long an expectation waits for the page to get there: Playwright's 5 s default was
# once too short for a first paint in CI (2 cores, the Slurm and Kubernetes tests running
# beside it: the overview's three cards not drawn in 5 s). A wait, not a timing: a page
# that is right passes as soon as it is; only a failure takes longer to report.
expect.set_options(timeout=20_000)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    assert Path(CHROMIUM).exists(), "Chromium is missing: run scripts/browser.sh (make test does)"
    assert BUNDLE.exists(), "the dashboard is not built: run `make web` (make test does)"
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--no-first-run",
            ],
        )
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    yield page
    context.close()
    assert errors == []
