"""A process remembers a token that authenticated for ``auth_cache_s`` seconds
(``app.tokens.cache``): a revocation through another process reaches it within that time,
one through itself at once, and an expiry to the second."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlmodel import Session

from app.api.deps import get_clock
from app.core.clock import FrozenClock
from app.core.config import Settings
from app.core.db import get_session
from app.core.security import Principal
from app.main import create_app
from app.tokens import service as token_service
from app.tokens.cache import PrincipalCache
from app.tokens.models import ApiToken, ApiTokenCreate

TTL_S = 5.0


@pytest.fixture
def second_process(session: Session, clock: FrozenClock) -> Iterator[TestClient]:
    """Another API process on the same database (another uvicorn worker)."""
    app = create_app(Settings(environment="test", auth_cache_s=TTL_S))
    app.dependency_overrides[get_session] = lambda: session
    app.dependency_overrides[get_clock] = lambda: clock
    with TestClient(app) as test_client:
        yield test_client


def test_a_revocation_elsewhere_is_honoured_within_the_ttl(
    client: TestClient,
    second_process: TestClient,
    auth: dict[str, dict[str, str]],
    clock: FrozenClock,
) -> None:
    viewer = auth["viewer"]
    assert second_process.get("/api/v1/clusters", headers=viewer).status_code == 200
    listed = client.get("/api/v1/tokens", headers=auth["admin"]).json()
    viewer_id = next(t["id"] for t in listed if t["name"] == "viewer")
    assert client.delete(f"/api/v1/tokens/{viewer_id}", headers=auth["admin"]).status_code == 200

    # The process that revoked it refuses it at once …
    refused = client.get("/api/v1/clusters", headers=viewer)
    assert refused.status_code == 401 and refused.json()["error"]["message"] == "token revoked"
    # … the other one remembers it until its entry is TTL_S old, and not a second longer.
    clock.advance(TTL_S - 1)
    assert second_process.get("/api/v1/clusters", headers=viewer).status_code == 200
    clock.advance(1)
    late = second_process.get("/api/v1/clusters", headers=viewer)
    assert late.status_code == 401 and late.json()["error"]["message"] == "token revoked"


def test_a_remembered_token_expires_on_time(
    client: TestClient, session: Session, clock: FrozenClock
) -> None:
    short = token_service.create_token(
        session=session,
        now=clock.now(),
        token_in=ApiTokenCreate(
            name="short", scopes=["viewer"], expires_at=clock.now() + timedelta(seconds=2)
        ),
    )
    headers = {"Authorization": f"Bearer {short.token}"}
    assert client.get("/api/v1/clusters", headers=headers).status_code == 200
    clock.advance(2)  # within the TTL, but the token's own time is up
    gone = client.get("/api/v1/clusters", headers=headers)
    assert gone.status_code == 401 and gone.json()["error"]["message"] == "token expired"


def test_a_refused_token_is_not_remembered(
    client: TestClient, session: Session, tokens: dict[str, str]
) -> None:
    """Revoked in the database before its first use: every request asks the database."""
    session.execute(sa.update(ApiToken).values(revoked_at=sa.func.now()))
    for _ in range(2):
        refused = client.get(
            "/api/v1/clusters", headers={"Authorization": f"Bearer {tokens['viewer']}"}
        )
        assert refused.status_code == 401


def test_the_cache_keeps_no_token_and_can_be_turned_off(clock: FrozenClock) -> None:
    principal = Principal(token_id=1, name="v", scopes=frozenset({"viewer"}))
    plaintext = "shp_0123456789ab_" + "s" * 43
    cache = PrincipalCache(ttl_s=TTL_S)
    cache.put(plaintext, principal, None, clock.now())
    assert cache.get(plaintext, clock.now()) == principal
    assert all(plaintext.encode() not in key for key in cache._entries)
    clock.advance(-1)  # a clock that went back: too old, never fresh
    assert cache.get(plaintext, clock.now()) is None
    off = PrincipalCache(ttl_s=0)
    off.put(plaintext, principal, None, clock.now())
    assert off.get(plaintext, clock.now()) is None
