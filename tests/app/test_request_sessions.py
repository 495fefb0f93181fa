"""A worker with more requests in flight than pooled connections and threads keeps serving.

Issue 13's mixed-load bench (``python -m bench.api --mixed``) found a worker stalled with
40 requests in flight: the request's session dependency took its connection in a trip
through the thread pool of its own, so every thread could be a dependency waiting for a
connection while every connection was held by a request waiting for a thread to run its
route (a sync route's answer is validated in a second trip, its connection held between
the two), until the pool's timeout answered 503. Reproduced here small: 2 pooled
connections, 3 threads, 12 requests at once on async and sync routes, on a real SQLite
file as the embedded default runs it; the process admits one request that may use the
database at a time (``SHAPER_MAX_REQUESTS_IN_FLIGHT``, below the pool's 2).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import anyio.to_thread
import httpx
from sqlmodel import Session

from app.api.deps import get_clock
from app.core import migrate
from app.core.clock import FrozenClock
from app.core.config import Settings
from app.core.db import get_session, make_engine
from app.main import create_app
from app.tokens import service as token_service
from app.tokens.models import ApiTokenCreate

# Async routes that do their work in one trip, and sync ones validated in a second.
PATHS = ("/api/v1/clusters", "/api/v1/jobs", "/api/v1/overview", "/api/v1/utilization")


def test_more_requests_than_connections_and_threads_are_all_answered(
    tmp_path: Path, clock: FrozenClock
) -> None:
    url = f"sqlite:///{tmp_path / 'shaper.db'}"
    migrate.upgrade(url)
    engine = make_engine(url, pool_size=2, max_overflow=0, pool_timeout=3)
    with Session(engine) as session:
        viewer = ApiTokenCreate(name="viewer", scopes=["viewer"])
        token = token_service.create_token(session=session, now=clock.now(), token_in=viewer)
    settings = Settings(
        environment="test", data_dir=tmp_path, auth_cache_s=0, max_requests_in_flight=1
    )
    app = create_app(settings)

    def session_per_request() -> Iterator[Session]:
        with Session(engine, expire_on_commit=False) as session:
            yield session

    app.dependency_overrides[get_session] = session_per_request
    app.dependency_overrides[get_clock] = lambda: clock
    headers = {"Authorization": f"Bearer {token.token}"}

    async def at_once() -> list[httpx.Response]:
        anyio.to_thread.current_default_thread_limiter().total_tokens = 3
        answers: list[httpx.Response] = []
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://shaper") as client:

            async def read(path: str) -> None:
                answers.append(await client.get(path, headers=headers))

            async with anyio.create_task_group() as requests:
                for i in range(12):
                    requests.start_soon(read, PATHS[i % len(PATHS)])
        return answers

    try:
        answers = anyio.run(at_once)
    finally:
        engine.dispose()
    assert [a.status_code for a in answers] == [200] * 12, [a.text for a in answers]
