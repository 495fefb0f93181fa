"""A real uvicorn server in a thread, for tests that need the API over a socket."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI
from sqlalchemy import Engine
from sqlmodel import Session

from app.core.config import Settings
from app.core.db import get_session
from app.main import create_app
from app.tokens import service as token_service
from app.tokens.models import ApiTokenCreate


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def serve(app: FastAPI, port: int | None = None) -> Iterator[str]:
    """Serve ``app`` on 127.0.0.1 until the block ends; yields the base URL."""
    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError(f"the API server did not start on port {port}")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def app_on(engine: Engine, settings: Settings | None = None) -> FastAPI:
    """The API with every request on its own session of ``engine`` (a committed database)."""

    def session_factory() -> Iterator[Session]:
        with Session(engine) as session:
            yield session

    app = create_app(settings or Settings(environment="test"))
    app.dependency_overrides[get_session] = session_factory
    return app


def tokens_for(session: Session, now: datetime, scopes: Iterable[str]) -> dict[str, str]:
    """One token per scope, named after it."""
    return {
        scope: token_service.create_token(
            session=session, now=now, token_in=ApiTokenCreate(name=scope, scopes=[scope])
        ).token
        for scope in scopes
    }


def policy_versions(site: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """GET /policies/{name}/versions as the site's viewer (``site``: ``base`` and
    ``tokens``, as the web tests' fixtures give them)."""
    response = httpx.get(
        f"{site['base']}/api/v1/policies/{name}/versions",
        headers={"Authorization": f"Bearer {site['tokens']['viewer']}"},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    versions: list[dict[str, Any]] = response.json()
    return versions
