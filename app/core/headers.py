"""Security headers on every response, set in one place.

- ``Content-Security-Policy``: the dashboard (``web/``) loads only its own script and
  stylesheet from this origin and calls only this origin's API; its charts put
  ``style="fill:…"`` attributes into inline SVG, hence ``style-src-attr 'unsafe-inline'``
  (attributes only: no inline ``<style>`` or ``<script>`` anywhere). ``frame-ancestors
  'none'`` and ``X-Frame-Options: DENY`` (for older browsers) forbid framing.
  A response that sets its own policy keeps it (the API docs pages, ``app.api.docs``).
- ``X-Content-Type-Options: nosniff``, ``Referrer-Policy: no-referrer``.
- ``Cache-Control: no-store`` on ``/api/`` answers that set none: they are live state
  read with a token (and token creation returns a secret), never to be kept in a cache.
"""

from __future__ import annotations

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

DASHBOARD_CSP = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "style-src-attr 'unsafe-inline'",
        "img-src 'self'",
        "connect-src 'self'",
        "form-action 'self'",
        "base-uri 'none'",
        "frame-ancestors 'none'",
    )
)
BASE_HEADERS = {
    "Content-Security-Policy": DASHBOARD_CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}


class SecurityHeadersMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        is_api = str(scope.get("path", "")).startswith("/api/")

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in BASE_HEADERS.items():
                    headers.setdefault(name, value)
                if is_api:
                    headers.setdefault("Cache-Control", "no-store")
            await send(message)

        await self.app(scope, receive, send_with_headers)
