"""Dependencies as ``Annotated`` aliases, and the one way routes declare their scope.

``SessionDep`` is the request's session. A GET, HEAD or OPTIONS only reads, so its
transaction begins DEFERRED and never waits for, nor holds, SQLite's write lock; any other
method begins IMMEDIATE, taking the lock before its first read (why: ``app.core.db``).
``WriteSessionDep`` is for a GET that writes all the same (a readiness probe of writes).
Both come from ``app.core.db.get_session``, the one dependency tests override.

Authentication and scopes are checked here and only here: ``scoped`` on a route, and
``authorize`` for ``app.main``, which must refuse an anonymous caller before it reports a
bad body.
"""

from __future__ import annotations

from collections.abc import Generator
from datetime import datetime
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlmodel import Session
from starlette.concurrency import run_in_threadpool

from app.audit.models import Actor
from app.core.clock import Clock, SystemClock
from app.core.config import Settings
from app.core.db import begin_lazily, get_session
from app.core.errors import Forbidden, TooManyRequests, Unauthorized
from app.core.logging import REQUEST_ID
from app.core.ratelimit import AuthFailureLimiter
from app.core.security import Principal
from app.tokens import service as token_service
from app.tokens.cache import PrincipalCache

READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


# Async, and the connection taken at the first statement (``begin_lazily``): taken here,
# in a trip through the thread pool of its own, a worker with more requests in flight than
# pooled connections stalled until the pool's timeout (issue 13).
async def get_request_session(
    request: Request, session: Annotated[Session, Depends(get_session)]
) -> Session:
    begin_lazily(session, writes=request.method not in READ_METHODS)
    return session


async def get_write_session(session: Annotated[Session, Depends(get_session)]) -> Session:
    begin_lazily(session, writes=True)
    return session


SessionDep = Annotated[Session, Depends(get_request_session)]
WriteSessionDep = Annotated[Session, Depends(get_write_session)]
_system_clock = SystemClock()


# Async, as every dependency that does no I/O: a sync one costs a trip through the thread
# pool, a measurable share of a cheap request (issue 13).
async def get_clock() -> Clock:
    return _system_clock


ClockDep = Annotated[Clock, Depends(get_clock)]


def get_app_settings(request: Request) -> Settings:
    """The settings ``create_app`` was built with."""
    settings: Settings = request.app.state.settings
    return settings


SettingsDep = Annotated[Settings, Depends(get_app_settings)]
_bearer = HTTPBearer(auto_error=False, description="A Shaper API token: `shp_<id>_<secret>`")


def authenticate_request(
    request: Request, *, session: Session, plaintext: str, now: datetime
) -> Principal:
    """The token's principal, counting a refused token against the caller's address and
    refusing (429) an address over its limit (``app.core.ratelimit``). A token that
    authenticated in the last few seconds is remembered (``app.tokens.cache``)."""
    cache: PrincipalCache = request.app.state.principal_cache
    remembered = cache.get(plaintext, now)
    if remembered is not None:
        return remembered
    limiter: AuthFailureLimiter = request.app.state.auth_limiter
    address = request.client.host if request.client else "unknown"
    wait_s = limiter.retry_after(address, now.timestamp())
    if wait_s is not None:
        raise TooManyRequests(
            f"too many failed authentications from {address}; retry in {wait_s} s",
            retry_after_s=wait_s,
        )
    try:
        principal = token_service.authenticate(session=session, plaintext=plaintext, now=now)
    except Unauthorized:
        limiter.record_failure(address, now.timestamp())
        raise
    cache.put(plaintext, principal, principal.expires_at, now)
    return principal


def _principal(
    request: Request,
    *,
    session: Session,
    credentials: HTTPAuthorizationCredentials | None,
    now: datetime,
) -> Principal:
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise Unauthorized("missing bearer token (Authorization: Bearer shp_…)")
    return authenticate_request(
        request, session=session, plaintext=credentials.credentials, now=now
    )


async def get_principal(
    request: Request,
    session: SessionDep,
    clock: ClockDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    now = clock.now()
    # A token remembered (``app.tokens.cache``) costs no query, so no trip through the
    # thread pool either; the rest as ``authenticate_request`` does it.
    if credentials is not None and credentials.scheme.lower() == "bearer":
        cache: PrincipalCache = request.app.state.principal_cache
        remembered = cache.get(credentials.credentials, now)
        if remembered is not None:
            return remembered
    return await run_in_threadpool(
        _principal_then_release, request, session=session, credentials=credentials, now=now
    )


def _principal_then_release(
    request: Request,
    *,
    session: Session,
    credentials: HTTPAuthorizationCredentials | None,
    now: datetime,
) -> Principal:
    """``_principal``, then the connection its read took given back when this began the
    session's transaction: the route runs in another trip through the thread pool, and a
    connection held while waiting for a thread is how a busy worker stalled (issue 13)."""
    fresh = not session.in_transaction()
    try:
        return _principal(request, session=session, credentials=credentials, now=now)
    finally:
        if fresh and session.in_transaction():
            session.commit()  # it only read; the route's transaction begins anew


CurrentPrincipal = Annotated[Principal, Depends(get_principal)]


def get_actor(principal: CurrentPrincipal) -> Actor:
    """Who a change is recorded against (``app.audit``): the token, never its secret, and
    the request's id (the client's X-Request-ID or one made up: ``app.core.request_id``),
    the same id the request's log lines and its answer carry."""
    return Actor(
        token_id=principal.token_id,
        name=principal.name,
        scopes=tuple(sorted(principal.scopes)),
        request_id=REQUEST_ID.get(),
    )


ActorDep = Annotated[Actor, Depends(get_actor)]
AUTHENTICATED = "authenticated"


def _require_scope(request: Request, principal: Principal, scope: str) -> Principal:
    if scope == AUTHENTICATED:
        return principal
    required = scope.format(**request.path_params)
    if not principal.allows(required):
        raise Forbidden(
            f"this token lacks the scope {required!r}", details={"required_scope": required}
        )
    return principal


def scoped(scope: str) -> dict[str, Any]:
    """Route keyword arguments that enforce ``scope`` and publish it in the OpenAPI schema.

    ``scope`` may name path parameters (``connector:{cluster}``); ``authenticated`` accepts
    any valid token.
    """

    # Async because it only compares strings: a sync dependency costs a trip through the
    # thread pool, a measurable share of a cheap request (issue 13).
    async def require_scope(request: Request, principal: CurrentPrincipal) -> Principal:
        return _require_scope(request, principal, scope)

    return {"dependencies": [Depends(require_scope)], "openapi_extra": {"x-required-scope": scope}}


async def authorize(request: Request, scope: str) -> Principal:
    """What ``scoped(scope)`` checks, outside dependency injection: FastAPI parses the body
    before it runs a route's dependencies, so ``app.main`` asks this first to answer an
    anonymous caller 401 rather than report its bad body. The token is read, the session
    and the clock are had, as a route gets them (overrides included)."""
    credentials = await _bearer(request)

    def check() -> Principal:
        overrides = request.app.dependency_overrides
        produced = overrides.get(get_session, get_session)()
        session = next(produced) if isinstance(produced, Generator) else produced
        try:
            clock = overrides[get_clock]() if get_clock in overrides else _system_clock
            now = clock.now()
            principal = _principal(request, session=session, credentials=credentials, now=now)
            return _require_scope(request, principal, scope)
        finally:
            if isinstance(produced, Generator):
                produced.close()

    return await run_in_threadpool(check)
