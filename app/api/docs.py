"""The API docs pages, /docs (Swagger UI) and /redoc (ReDoc), served without internet.

FastAPI's own pages load their JavaScript and CSS from a public CDN, so a site without
internet gets a blank page. Here the same files come from the pinned ``fastapi-offline``
package (a dependency in ``pyproject.toml``, installed by ``make venv``; it ships
Swagger UI and ReDoc's standalone build), mounted at ``/docs-assets``; FastAPI's "self-
hosting JavaScript and CSS for docs" pattern. Swagger UI is started by
``web/static/docs/swagger-init.js``, not an inline script; ReDoc starts itself from its
``<redoc spec-url>`` element. Like ``/openapi.json`` the pages hold no data and need no
token (calls made from Swagger UI need one, given with "Authorize").

Their Content-Security-Policy differs from the dashboard's (``app.core.headers``) only
where these libraries need it: inline styles (both set them from JavaScript), ``data:``
images (Swagger UI's icons) and ``blob:`` workers (ReDoc's search). Scripts still come
from this origin only.
"""

from __future__ import annotations

from html import escape
from pathlib import Path

import fastapi_offline
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS_DIR = Path(fastapi_offline.__file__).resolve().parent / "static"
ASSETS_URL = "/docs-assets"
DOCS_CSP = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data:",
        "font-src 'self'",
        "connect-src 'self'",
        "worker-src blob:",
        "form-action 'self'",
        "base-uri 'none'",
        "frame-ancestors 'none'",
    )
)


def _page(title: str, assets: str, head: str, body: str) -> HTMLResponse:
    html = (
        '<!doctype html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{escape(title)}</title>\n"
        f'<link rel="icon" type="image/png" href="{assets}/favicon.png">\n{head}'
        f"</head>\n<body>\n{body}\n</body>\n</html>\n"
    )
    return HTMLResponse(html, headers={"Content-Security-Policy": DOCS_CSP})


def add_docs(app: FastAPI) -> None:
    """Mounts the assets and the two pages; ``app`` must be built with ``docs_url=None``
    and ``redoc_url=None`` so FastAPI's CDN pages stay off."""
    app.mount(ASSETS_URL, StaticFiles(directory=ASSETS_DIR), name="docs-assets")
    openapi_url = app.openapi_url or "/openapi.json"

    @app.get("/docs", include_in_schema=False)
    def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        assets = f"{root}{ASSETS_URL}"
        return _page(
            f"{app.title} - Swagger UI",
            assets,
            f'<link rel="stylesheet" href="{assets}/swagger-ui.css">\n',
            '<div id="swagger-ui"></div>\n'
            f'<script src="{assets}/swagger-ui-bundle.js"></script>\n'
            f'<script src="{root}/static/docs/swagger-init.js" '
            f'data-openapi-url="{escape(root + openapi_url)}"></script>',
        )

    @app.get("/redoc", include_in_schema=False)
    def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        assets = f"{root}{ASSETS_URL}"
        return _page(
            f"{app.title} - ReDoc",
            assets,
            "",
            f'<redoc spec-url="{escape(root + openapi_url)}"></redoc>\n'
            f'<script src="{assets}/redoc.standalone.js"></script>',
        )
