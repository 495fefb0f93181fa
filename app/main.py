"""create_app(): routers, exception handlers, middleware, the dashboard, docs, health.

Middleware, outermost first: the request id (``app.core.request_id``), request timing
for ``/metrics`` (``app.metrics.http``), gzip (inside the timing, so that a read's
latency counts its compression),
security headers on every answer (``app.core.headers``), then the catch-all that turns
any exception into the documented JSON body without dropping the connection
(``app.core.unhandled``), then the body limit.

While it serves, each process keeps its own house (``_lifespan``): what-if uploads left
behind on its host are swept every ``UPLOAD_SWEEP_EVERY``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.gzip import GZipMiddleware
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from sqlalchemy import text
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from app.api.deps import SessionDep, authorize
from app.api.docs import add_docs
from app.api.responses import declare_error_responses
from app.api.router import api_router
from app.core.admission import AdmissionMiddleware
from app.core.body_limit import BodyLimitMiddleware
from app.core.config import Settings, get_settings
from app.core.db_errors import classify
from app.core.errors import (
    Forbidden,
    Invalid,
    ShaperError,
    TooManyRequests,
    Unauthorized,
    error_body,
)
from app.core.headers import SecurityHeadersMiddleware
from app.core.ratelimit import AuthFailureLimiter
from app.core.request_id import RequestIdMiddleware
from app.core.static import DashboardStaticFiles
from app.core.unhandled import UnhandledErrorMiddleware
from app.metrics.http import RequestTimingMiddleware, request_histogram
from app.metrics.router import router as metrics_router
from app.simulations import runs as whatif_runs
from app.tokens.cache import PrincipalCache

log = logging.getLogger(__name__)
WEB_DIR = Path(__file__).resolve().parent.parent / "web"
_UNION_TAGS = {"snapshot", "delta"}  # pydantic puts the discriminator value in error paths
# Response compression (bench/compression.py): the 10,000-GPU map's 532 KiB of JSON is
# 101 KiB at level 1 in 2 ms, 85 KiB at level 5 in 5 ms, 83 KiB at level 6 in 10 ms: level
# 1 takes most of the saving for a fifth of the CPU. Below 1 KiB the gzip frame costs
# about what it saves.
GZIP_LEVEL = 1
GZIP_MIN_BYTES = 1024


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    app = FastAPI(
        title="Shaper",
        version="0.1.0",
        summary="Compute-shaping control plane for GPU and HPC clusters",
        docs_url=None,  # add_docs serves both pages without a CDN
        redoc_url=None,
        lifespan=_lifespan,
    )
    app.state.settings = settings
    app.state.auth_limiter = AuthFailureLimiter(
        limit=settings.auth_failure_limit, window_s=settings.auth_failure_window_s
    )
    app.state.principal_cache = PrincipalCache(ttl_s=settings.auth_cache_s)
    # What-if runs whose process a restart took along would otherwise say running for ever.
    whatif_runs.fail_interrupted(directory=settings.resolved_sim_results_dir, now=datetime.now(UTC))
    # A trace upload streams to disk under its own limit (SHAPER_SIM_UPLOAD_MAX_MB).
    app.add_middleware(
        BodyLimitMiddleware,
        max_bytes=settings.max_body_bytes,
        uploads=[("POST", "/api/v1/simulations")],
    )
    # Inside the error, timing and id middleware: a request that waits for its turn is
    # timed, and its answer has its headers like any other.
    app.add_middleware(AdmissionMiddleware, limit=settings.max_requests_in_flight)
    app.add_middleware(UnhandledErrorMiddleware)
    app.add_middleware(SecurityHeadersMiddleware)
    # Server-sent events (text/event-stream) and already compressed types pass through
    # unbuffered: Starlette's default exclusions.
    app.add_middleware(GZipMiddleware, minimum_size=GZIP_MIN_BYTES, compresslevel=GZIP_LEVEL)
    app.state.request_histogram = request_histogram()
    app.add_middleware(RequestTimingMiddleware, histogram=app.state.request_histogram)
    app.add_middleware(RequestIdMiddleware)
    app.add_exception_handler(ShaperError, _shaper_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http_error)  # type: ignore[arg-type]
    app.include_router(api_router)
    app.include_router(metrics_router)
    add_docs(app)
    _document_errors(app)

    @app.get("/healthz", tags=["health"])
    def healthz() -> dict[str, str]:
        """Liveness: the process answers. No token needed."""
        return {"status": "ok"}

    @app.get(
        "/readyz",
        tags=["health"],
        responses={503: {"description": "database unreachable or unable to write"}},
    )
    def readyz(session: SessionDep) -> JSONResponse:
        """Readiness: the database answers and takes writes. No token needed.

        The write probe is a no-op ``UPDATE`` of the one ``alembic_version`` row in a
        savepoint that is rolled back: it takes the path every real write takes, so a
        read-only PostgreSQL (``default_transaction_read_only``, a hot standby), a
        read-only SQLite file or a role without write grants refuse it, and it leaves
        nothing behind. A temporary table would prove the same but writes PostgreSQL's
        catalogue on every probe. A full disk shows only at commit; writes that meet it
        answer 503 themselves (``app.core.db_errors``)."""
        try:
            session.execute(text("SELECT 1"))
        except Exception as exc:  # any driver error means not ready
            return _not_ready("unreachable", exc)
        probe = session.begin_nested()
        try:
            session.execute(text("UPDATE alembic_version SET version_num = version_num"))
        except Exception as exc:
            return _not_ready("cannot_write", exc)
        finally:
            probe.rollback()
        return JSONResponse({"status": "ok"})

    # The dashboard shell and its assets hold no data: every figure on it comes from the
    # API with the viewer's token. So they are served without one.
    static = DashboardStaticFiles if settings.web_precompressed else StaticFiles
    app.mount("/static", static(directory=WEB_DIR / "static"), name="static")

    @app.get("/", include_in_schema=False)
    def dashboard() -> FileResponse:
        return FileResponse(WEB_DIR / "templates" / "index.html")

    @app.get("/favicon.ico", include_in_schema=False)
    def favicon() -> FileResponse:
        # Browsers ask for it on every page; the dashboard's own <link rel="icon"> is the
        # same picture.
        return FileResponse(WEB_DIR / "static" / "favicon.svg", media_type="image/svg+xml")

    return app


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    """The process's own housekeeping, from its start to its end."""
    directory = app.state.settings.resolved_sim_results_dir
    async with anyio.create_task_group() as housekeeping:
        housekeeping.start_soon(_sweep_uploads, directory)
        yield
        housekeeping.cancel_scope.cancel()


async def _sweep_uploads(directory: Path) -> None:
    """What-if uploads left behind (``app.simulations.runs.sweep_uploads``), swept by the
    process that took them: they are on its host, which the workers need not share."""
    while True:
        await anyio.sleep(whatif_runs.UPLOAD_SWEEP_EVERY.total_seconds())
        try:
            await anyio.to_thread.run_sync(_sweep_uploads_now, directory)
        except Exception:  # the next sweep tries again; the process serves on
            log.exception("sweeping what-if uploads in %s failed", directory)


def _sweep_uploads_now(directory: Path) -> None:
    whatif_runs.sweep_uploads(directory=directory, now=datetime.now(UTC))


def _not_ready(reason: str, exc: Exception) -> JSONResponse:
    """``reason``: read_only, out_of_space, cannot_write or unreachable; ``cause``: the
    driver's code (SQLSTATE, SQLite error name) or the exception's type."""
    classified = classify(exc)
    cause = str(classified.details.get("reason", "")) if classified else ""
    if cause == "25006" or cause.startswith("SQLITE_READONLY"):
        reason = "read_only"
    elif cause in ("53100", "SQLITE_FULL"):
        reason = "out_of_space"
    return JSONResponse(
        {"status": "unavailable", "reason": reason, "cause": cause or type(exc).__name__},
        503,
        headers={"Retry-After": "5"},
    )


def _document_errors(app: FastAPI) -> None:
    """The OpenAPI document with every operation's error answers declared."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = declare_error_responses(FastAPI.openapi(app))
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _field_path(loc: Sequence[int | str]) -> str:
    parts = list(loc)
    if parts and parts[0] == "body":
        parts = parts[1:]
        if parts and parts[0] in _UNION_TAGS:
            parts = parts[1:]
    elif parts and parts[0] in ("query", "path", "header"):
        parts = parts[1:]
    path = ""
    for part in parts:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or "body"


def _with_discriminator(error: dict[str, Any]) -> list[int | str]:
    """A bad or missing union tag is the tag field's fault (``kind``), not the body's."""
    loc = list(error["loc"])
    if error["type"] in ("union_tag_invalid", "union_tag_not_found"):
        loc.append(str(error.get("ctx", {}).get("discriminator", "kind")).strip("'"))
    return loc


def _error_json(
    status: int, body: dict[str, Any], headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(body, status_code=status, headers=headers)


async def _shaper_error(_request: Request, exc: ShaperError) -> JSONResponse:
    return _error_json(exc.status_code, exc.body(), exc.headers())


async def _refuse_before_validation(request: Request) -> JSONResponse | None:
    """FastAPI parses the body before it runs dependencies, so a bad body would otherwise
    be reported to a caller without a token. Check the token first, as the route would
    (``app.api.deps.authorize``), so the answer to an anonymous caller is always 401."""
    route = request.scope.get("route")
    scope = (getattr(route, "openapi_extra", None) or {}).get("x-required-scope")
    if scope is None:
        return None
    try:
        await authorize(request, scope)
    except (Unauthorized, Forbidden, TooManyRequests) as exc:
        return await _shaper_error(request, exc)
    return None


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    refused = await _refuse_before_validation(request)
    if refused is not None:
        return refused
    errors = [
        {"field": _field_path(_with_discriminator(e)), "message": e["msg"], "type": e["type"]}
        for e in exc.errors()
    ]
    if any(e["type"] == "json_invalid" for e in errors):
        detail = next(e for e in exc.errors() if e["type"] == "json_invalid")
        reason = detail.get("ctx", {}).get("error", "")
        message = f"request body is not valid JSON: {reason}"
        return _error_json(400, error_body("malformed_json", message, field="body"))
    first = errors[0] if errors else {"field": "body", "message": "invalid request"}
    invalid = Invalid(
        f"{first['field']}: {first['message']}",
        field=first["field"],
        details={"errors": errors},
    )
    return await _shaper_error(request, invalid)


_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def _allowed_methods(request: Request) -> str:
    """Every method some route serves at this path. Starlette answers 405 naming only the
    methods of the first route whose path matched, so ``POST /clusters`` was missing
    from the ``Allow`` of ``OPTIONS /clusters`` (RFC 9110 §15.5.6: list them all). Asked
    of the routes themselves, method by method: included routers nest their routes."""
    allowed = [
        method
        for method in _METHODS
        if any(
            route.matches({**request.scope, "method": method})[0] is Match.FULL
            for route in request.app.router.routes
        )
    ]
    return ", ".join(allowed)


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    headers = dict(exc.headers) if exc.headers else {}
    if exc.status_code == 405:
        headers["Allow"] = _allowed_methods(request) or headers.get("Allow", "")
    return _error_json(exc.status_code, error_body(code, str(exc.detail)), headers or None)
