"""What the dashboard's browser tests share besides their fixtures (``conftest.py``)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import Page, Route

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
BUNDLE = Path(__file__).resolve().parents[2] / "web" / "static" / "dist" / "app.js"


def screenshot(page: Page, name: str, tmp_path: Path) -> None:
    """Under pytest's temporary folder, or where ``SHAPER_SCREENSHOTS`` says (``make
    screenshots`` refreshes web/screenshots for the README)."""
    folder = Path(os.environ.get("SHAPER_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(folder / f"{name}.png"), full_page=True)


def release(held: list[Route]) -> None:
    """Lets held requests answer now; one the page has since cancelled has nowhere to go."""
    while held:
        route = held.pop()
        try:
            route.continue_()
        except PlaywrightError:
            pass
