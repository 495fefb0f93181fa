"""How many requests that may use the database a process serves at once
(``SHAPER_MAX_REQUESTS_IN_FLIGHT``); the rest wait their turn here, holding nothing.

Why: a route's database work and the validation of its answer are separate trips through
the thread pool (40 threads a process), and its session keeps its pooled connection
between them (5 + 10 a process). With more requests in flight than connections, every
thread could be a request waiting for a connection while every connection belonged to a
request waiting for a thread: nothing moved until the pool's 30 s timeout answered 503
(found by issue 13's mixed-load bench, ``python -m bench.api --mixed``: 200 dashboard
clients stalled both workers). Admitting fewer requests than there are connections
leaves one free for whoever waits for it, whatever the others wait for.

Only what may touch the database waits: ``/api/``, ``/readyz`` and ``/metrics``.
Liveness, the dashboard's files and the API's documentation pass straight through.
"""

from __future__ import annotations

import anyio
from starlette.types import ASGIApp, Receive, Scope, Send

_ADMITTED_PREFIXES = ("/api/", "/readyz", "/metrics")


class AdmissionMiddleware:
    def __init__(self, app: ASGIApp, *, limit: int) -> None:
        self.app = app
        self.limit = limit
        self._slots: anyio.Semaphore | None = None  # made in the event loop, on first use

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(_ADMITTED_PREFIXES):
            await self.app(scope, receive, send)
            return
        if self._slots is None:
            self._slots = anyio.Semaphore(self.limit)
        async with self._slots:
            await self.app(scope, receive, send)
