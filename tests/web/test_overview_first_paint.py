"""What the overview's fresh load and the map's first visit wait for, in a real Chromium
against a live server: the cards' whole numbers grouped by hand exactly as Intl's "en"
format groups them (no Intl formatter is made before the cards are drawn), and the map's
code fetched in idle time once the overview is drawn, so that a first visit to the map asks
for its read alone.

One cluster, ``alpha``: two nodes of 8 GPUs, one job running on four of them.
"""

from __future__ import annotations

import re
from typing import Any

from playwright.sync_api import Page, expect

from tests.web import test_page_code

# The same site: one cluster, alpha (two nodes of 8 GPUs, four of them held).
site = test_page_code.site


def test_whole_numbers_are_grouped_as_intl_groups_them(page: Page, site: dict[str, Any]) -> None:
    """grouped() (dom.ts, the cards' figures) against Intl.NumberFormat("en") on the edges
    of every group, random safe integers of every length, negatives, and a fraction (which
    grouped() leaves to Intl)."""
    page.goto(f"{site['base']}/#token={site['tokens']['viewer']}")
    expect(page.locator(".card")).to_have_count(1)
    differing = page.evaluate(
        """async () => {
          const { grouped } = await import("/static/dist/main.js");
          const intl = new Intl.NumberFormat("en");
          const values = [0, 1.5, -2.25, 1e21, Number.MAX_SAFE_INTEGER, Number.MIN_SAFE_INTEGER];
          for (let p = 1; p <= 1e15; p *= 10) values.push(p - 1, p, p + 1, -p, -(p - 1));
          for (let i = 0; i < 20000; i++) {
            const digits = 1 + (i % 16);
            const v = Math.min(Math.floor(Math.random() * 10 ** digits), Number.MAX_SAFE_INTEGER);
            values.push(v, -v);
          }
          return values.filter((v) => grouped(v) !== intl.format(v)).slice(0, 5)
            .map((v) => [v, grouped(v), intl.format(v)]);
        }"""
    )
    assert differing == []


def test_the_maps_code_is_fetched_once_the_overview_is_drawn(
    page: Page, site: dict[str, Any]
) -> None:
    """No page's code but the overview's before its cards; the map's after them, unasked;
    then a first visit to the map fetches no code, only its read, and draws every GPU."""
    asked: list[str] = []
    page.on("request", lambda request: asked.append(request.url))
    map_code = re.compile(r"/static/dist/map\.js$")
    # When the first card is drawn, by the page's clock: the test's own view of it comes
    # later (it polls), and by then the idle-time fetch may have started.
    page.add_init_script(
        """new MutationObserver((_, observer) => {
             if (document.querySelector(".card")) {
               window.__cardsAt = performance.now();
               observer.disconnect();
             }
           }).observe(document, { childList: true, subtree: true });"""
    )
    with page.expect_request(map_code):
        page.goto(f"{site['base']}/#token={site['tokens']['viewer']}")
        expect(page.locator(".card")).to_have_count(1)
    page.wait_for_load_state("networkidle")
    cards_at, map_at = page.evaluate(
        """() => [window.__cardsAt, performance.getEntriesByType("resource")
                   .find((entry) => /\\/static\\/dist\\/map\\.js$/.test(entry.name))?.startTime]"""
    )
    assert cards_at is not None and map_at is not None
    assert map_at >= cards_at, (map_at, cards_at)

    asked.clear()
    page.get_by_role("link", name="Nodes & GPUs").click()
    expect(page.locator("#gpu-map .gpu")).to_have_count(16)
    assert not [url for url in asked if url.endswith(".js")]
    assert any("/api/v1/nodes/map?cluster=alpha" in url for url in asked)
