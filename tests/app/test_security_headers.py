"""Security headers on every kind of answer, docs that work without internet, and a
Content-Security-Policy that lets the dashboard and the docs do all they do."""

from __future__ import annotations

import re
import shutil
from datetime import UTC, datetime
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session

from app.api.docs import DOCS_CSP
from app.core import migrate
from app.core.config import Settings
from app.core.db import make_engine
from app.core.headers import DASHBOARD_CSP
from app.demo import seed_demo_site
from app.gpu_models import service as gpu_model_service
from tests.support.live_server import app_on, serve, tokens_for

COMMON = {
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
}
WEB = Path(__file__).resolve().parents[2] / "web"


def _assert_secure(response: Any, csp: str = DASHBOARD_CSP) -> None:
    for name, value in COMMON.items():
        assert response.headers.get(name) == value, (response.url, name)
    assert response.headers.get("content-security-policy") == csp, response.url
    assert "frame-ancestors 'none'" in csp


def test_every_kind_of_answer_carries_the_headers(
    client: TestClient, auth: dict, settings: Settings
) -> None:
    answers = {
        "api json": client.get("/api/v1/clusters", headers=auth["viewer"]),
        "api error": client.get("/api/v1/clusters/nope", headers=auth["viewer"]),
        "api 401": client.get("/api/v1/clusters"),
        "api 413": client.post(
            "/api/v1/clusters",
            headers=auth["admin"],
            content=b"x" * (settings.max_body_bytes + 1),
        ),
        "unknown route": client.get("/nowhere"),
        "dashboard": client.get("/"),
        "static file": client.get("/static/favicon.svg"),
        "favicon": client.get("/favicon.ico"),
        "openapi": client.get("/openapi.json"),
        "health": client.get("/healthz"),
        "docs asset": client.get("/docs-assets/swagger-ui-bundle.js"),
    }
    expected = {"api 401": 401, "api error": 404, "api 413": 413, "unknown route": 404}
    for kind, response in answers.items():
        assert response.status_code == expected.get(kind, 200), (kind, response.text[:200])
        _assert_secure(response)
    for kind in ("api json", "api error", "api 401", "api 413"):
        assert answers[kind].headers["cache-control"] == "no-store", kind
    for page in ("/docs", "/redoc"):
        _assert_secure(client.get(page), DOCS_CSP)


def test_token_creation_is_never_cached(client: TestClient, auth: dict) -> None:
    created = client.post(
        "/api/v1/tokens", headers=auth["admin"], json={"name": "ci", "scopes": ["viewer"]}
    )
    assert created.status_code == 201 and created.json()["token"].startswith("shp_")
    assert created.headers["cache-control"] == "no-store"


class _Resources(HTMLParser):
    """What a page loads, and whether it has inline scripts, styles or handlers."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self.inline: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        for name in ("src", "href", "spec-url"):
            if values.get(name) and not str(values[name]).startswith("#"):
                self.urls.append(str(values[name]))
        if tag == "script" and "src" not in values:
            self.inline.append("script")
        if tag == "style" or "style" in values:
            self.inline.append(f"style on <{tag}>")
        self.inline += [f"{name} on <{tag}>" for name in values if name.startswith("on")]


@pytest.mark.parametrize("path", ["/", "/docs", "/redoc"])
def test_pages_load_only_local_files_and_no_inline_script(client: TestClient, path: str) -> None:
    page = client.get(path)
    resources = _Resources()
    resources.feed(page.text)
    assert resources.inline == []
    assert resources.urls, path
    for url in resources.urls:
        assert url.startswith("/"), f"{path} loads {url} from elsewhere"
        if url != "/openapi.json":
            assert client.get(url).status_code == 200, url


def test_the_dashboard_script_needs_no_more_than_the_policy_allows() -> None:
    """The policy's one allowance, style attributes, is there because the dashboard writes
    them into its SVG charts and bars; nothing in it loads from elsewhere or evaluates
    strings. The bundle is what `make web` builds (make test does): app.js and the modules
    it loads (main.js, the chart's)."""
    bundle = WEB / "static" / "dist" / "app.js"
    assert bundle.exists(), "the dashboard is not built: run `make web`"
    script = "\n".join(p.read_text() for p in sorted(bundle.parent.glob("*.js")))
    assert not re.search(r"\beval\(|new Function\(|https?://", script)
    assert "style=" in script and "style-src-attr 'unsafe-inline'" in DASHBOARD_CSP


CHROMIUM = shutil.which("chromium")


def test_dashboard_and_docs_work_offline_without_policy_violations(
    tmp_path: Path,
) -> None:
    """A real browser that may reach nothing but this server: the docs render every
    operation and the dashboard every view, with no script error and no CSP report
    except for the one image ReDoc would fetch from its vendor's CDN (blocked, as it
    should be)."""
    # `make test` installs Chromium (scripts/browser.sh): without it this must fail, not skip.
    assert CHROMIUM is not None, "needs Chromium: run scripts/browser.sh"
    from playwright.sync_api import sync_playwright

    now = datetime.now(UTC)
    url = f"sqlite:///{tmp_path / 'shaper.db'}"
    migrate.upgrade(url)
    engine = make_engine(url)
    with Session(engine) as session:
        gpu_model_service.ensure_default_catalogue(session=session)
        seed_demo_site(session=session, now=now)
        token = tokens_for(session, now, ("viewer",))["viewer"]
    app = app_on(engine, Settings(environment="test", data_dir=tmp_path))
    with serve(app) as base, sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"]
        )
        context = browser.new_context()
        elsewhere: list[str] = []

        def only_local(route: Any) -> None:
            if route.request.url.startswith(base):
                route.continue_()
            else:
                elsewhere.append(route.request.url)
                route.abort()

        context.route("**/*", only_local)
        problems: list[str] = []
        page = context.new_page()
        page.on("pageerror", lambda error: problems.append(str(error)))
        page.on(
            "console",
            lambda message: (
                problems.append(message.text)
                if "Content Security Policy" in message.text and "cdn.redoc.ly" not in message.text
                else None
            ),
        )
        page.goto(f"{base}/docs")
        page.locator(".opblock").first.wait_for()
        assert page.locator(".opblock").count() > 25
        page.goto(f"{base}/redoc")
        page.locator("[data-section-id^='tag/clusters']").first.wait_for()
        page.goto(f"{base}/#token={token}")
        page.locator(".card").first.wait_for()
        for view in ("nodes", "jobs", "actions", "policies", "simulations", "overview"):
            page.click(f'a[data-view="{view}"]')
            page.wait_for_load_state("networkidle")
        page.locator("#util-chart canvas").first.wait_for()
        browser.close()
    engine.dispose()
    assert problems == []
    assert elsewhere == []  # the CSP stopped ReDoc's logo before any request left
