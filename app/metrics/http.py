"""Request latency per route, measured by this process (one histogram per app).

The route label is the route's template (``/api/v1/jobs/{job_id}``), never the path, so
ids do not become labels; requests no route matched share ``unmatched``.
"""

from __future__ import annotations

import time

from prometheus_client import Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
# From a cached read (milliseconds) to a shaping cycle's worth of telemetry (seconds).
_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def request_histogram() -> Histogram:
    # Not in the global registry: each app (tests build many) has its own.
    return Histogram(
        "shaper_http_request_duration_seconds",
        "API request latency by route template, method and status class",
        ["method", "route", "status"],
        buckets=_BUCKETS,
        registry=None,
    )


def route_template(scope: Scope) -> str:
    """The matched route's template with the prefixes of the routers it was included
    through: the route knows only its own part (``/jobs/{job_id}``), the request's path
    has the rest (``/api/v1/jobs/42`` → ``/api/v1/jobs/{job_id}``)."""
    template = getattr(scope.get("route"), "path", None)
    if not template:
        return "unmatched"
    tail = template.strip("/").split("/")
    actual = str(scope.get("path", "")).strip("/").split("/")
    if template == "/" or len(actual) < len(tail):
        return str(template)
    return "/" + "/".join(actual[: len(actual) - len(tail)] + tail)


class RequestTimingMiddleware:
    def __init__(self, app: ASGIApp, histogram: Histogram) -> None:
        self.app = app
        self.histogram = histogram

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # what the client sees if nothing answers

        async def timed_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, timed_send)
        finally:
            route = route_template(scope)
            method = scope.get("method", "")
            self.histogram.labels(
                method if method in _METHODS else "other", route, f"{status // 100}xx"
            ).observe(time.perf_counter() - started)
