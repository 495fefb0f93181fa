"""create_app(): routers, exception handlers, the dashboard, health."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from sqlalchemy import text
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.api.deps import AUTHENTICATED, SessionDep, get_clock
from app.api.router import api_router
from app.core.body_limit import BodyLimitMiddleware
from app.core.config import Settings, get_settings
from app.core.db import get_session
from app.core.errors import Forbidden, ShaperError, Unauthorized
from app.tokens import service as token_service

WEB_DIR = Path(__file__).resolve().parent.parent / "web"
_UNION_TAGS = {"snapshot", "delta"}  # pydantic puts the discriminator value in error paths


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    app = FastAPI(
        title="Shaper",
        version="0.1.0",
        summary="Compute-shaping control plane for GPU and HPC clusters",
        docs_url="/docs",
        redoc_url=None,
    )
    app.state.settings = settings
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    app.add_exception_handler(ShaperError, _shaper_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http_error)  # type: ignore[arg-type]
    app.include_router(api_router)

    @app.get("/healthz", tags=["health"])
    def healthz() -> dict[str, str]:
        """Liveness: the process answers. No token needed."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"], responses={503: {"description": "database unreachable"}})
    def readyz(session: SessionDep) -> JSONResponse:
        """Readiness: the database answers. No token needed."""
        try:
            session.execute(text("SELECT 1"))
        except Exception as exc:  # any driver error means not ready
            return JSONResponse({"status": "unavailable", "reason": type(exc).__name__}, 503)
        return JSONResponse({"status": "ok"})

    # The dashboard shell and its assets hold no data: every figure on it comes from the
    # API with the viewer's token. So they are served without one.
    app.mount("/static", StaticFiles(directory=WEB_DIR / "static"), name="static")

    @app.get("/", include_in_schema=False)
    def dashboard() -> FileResponse:
        return FileResponse(WEB_DIR / "templates" / "index.html")

    return app


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
    headers = {"WWW-Authenticate": "Bearer"} if exc.status_code == 401 else None
    return _error_json(exc.status_code, exc.body(), headers)


def _refuse_before_validation(request: Request) -> JSONResponse | None:
    """FastAPI parses the body before it runs dependencies, so a bad body would otherwise
    be reported to a caller without a token. Check the token first, the same way the
    route would (``scoped``), so the answer to an anonymous caller is always 401."""
    route = request.scope.get("route")
    scope = (getattr(route, "openapi_extra", None) or {}).get("x-required-scope")
    if scope is None:
        return None
    header = request.headers.get("authorization", "")
    kind, _, credentials = header.partition(" ")
    provider = request.app.dependency_overrides.get(get_session, get_session)
    produced = provider()
    session = next(produced) if isinstance(produced, Iterator) else produced
    try:
        if kind.lower() != "bearer" or not credentials:
            raise Unauthorized("missing bearer token (Authorization: Bearer shp_…)")
        clock = request.app.dependency_overrides.get(get_clock, get_clock)()
        principal = token_service.authenticate(
            session=session, plaintext=credentials.strip(), now=clock.now()
        )
        required = scope.format(**request.path_params)
        if scope != AUTHENTICATED and not principal.allows(required):
            raise Forbidden(
                f"this token lacks the scope {required!r}", details={"required_scope": required}
            )
    except (Unauthorized, Forbidden) as exc:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status_code == 401 else None
        return _error_json(exc.status_code, exc.body(), headers)
    finally:
        if isinstance(produced, Iterator):
            produced.close()
    return None


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    refused = await run_in_threadpool(_refuse_before_validation, request)
    if refused is not None:
        return refused
    errors = [
        {"field": _field_path(_with_discriminator(e)), "message": e["msg"], "type": e["type"]}
        for e in exc.errors()
    ]
    if any(e["type"] == "json_invalid" for e in errors):
        detail = next(e for e in exc.errors() if e["type"] == "json_invalid")
        reason = detail.get("ctx", {}).get("error", "")
        return _error_json(
            400,
            {
                "error": {
                    "code": "malformed_json",
                    "message": f"request body is not valid JSON: {reason}",
                    "field": "body",
                    "retryable": False,
                }
            },
        )
    first = errors[0] if errors else {"field": "body", "message": "invalid request"}
    return _error_json(
        422,
        {
            "error": {
                "code": "invalid",
                "message": f"{first['field']}: {first['message']}",
                "field": first["field"],
                "details": {"errors": errors},
                "retryable": False,
            }
        },
    )


async def _http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    return _error_json(
        exc.status_code,
        {
            "error": {
                "code": code,
                "message": str(exc.detail),
                "retryable": False,
            }
        },
        dict(exc.headers) if exc.headers else None,
    )
