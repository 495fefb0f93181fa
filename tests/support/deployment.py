"""A control plane deployed as separate processes, for the end-to-end tests: a private
Redis, the API on PostgreSQL (served over HTTP from this process) and a control-plane
Celery worker. Each test module adds what its scheduler needs (connectors, node agents:
``Pipeline.start_connector``, ``Pipeline.start_agent``) and talks to the API with
:func:`api`."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from sqlmodel import Session

from app.actions.router import get_dispatcher
from app.clusters import service as cluster_service
from app.clusters.models import ClusterCreate, ShapingMode
from app.core import migrate
from app.core.db import make_engine
from app.gpu_models import service as gpu_model_service
from tests.support.live_server import app_on, serve, tokens_for
from tests.support.pipeline import Pipeline, RedisServer
from wire.telemetry import SchedulerKind


@contextmanager
def deployment(
    *,
    root: Path,
    database_url: str,
    clusters: Sequence[tuple[str, str]],
    scopes: Sequence[str],
    env: Mapping[str, str] = {},
    setup: Callable[[Session, datetime], None] | None = None,
) -> Iterator[dict[str, Any]]:
    """Redis, the API (its database migrated, the GPU catalogue, ``clusters`` as
    ``(name, scheduler)`` registered in advise mode, then ``setup``, one token per scope)
    and a control worker with ``env``; all stopped after. Yields ``pipeline``, ``base``
    (the API's URL), ``tokens`` by scope and ``root``."""
    redis_server = RedisServer(root)
    redis_server.start()
    migrate.upgrade(database_url)
    engine = make_engine(database_url)
    now = datetime.now(UTC)
    with Session(engine) as session:
        gpu_model_service.ensure_default_catalogue(session=session)
        for name, scheduler in clusters:
            cluster_service.register_cluster(
                session=session,
                now=now,
                cluster_in=ClusterCreate(
                    name=name, scheduler=SchedulerKind(scheduler), mode=ShapingMode.advise
                ),
            )
        if setup is not None:
            setup(session, now)
        tokens = tokens_for(session, now, scopes)
    pipeline = Pipeline(
        root=root,
        database_url=database_url,
        engine=engine,
        broker=redis_server.url,
        env={
            "SHAPER_DATABASE_URL": database_url,
            "SHAPER_BROKER_URL": redis_server.url,
            "PYTHONUNBUFFERED": "1",
            **env,
        },
        redis=redis_server,
        tokens=tokens,
    )
    app = app_on(engine)
    app.dependency_overrides[get_dispatcher] = lambda: pipeline.advance
    try:
        with serve(app) as base:
            pipeline.start_control()
            yield {"pipeline": pipeline, "base": base, "tokens": tokens, "root": root}
    finally:
        pipeline.stop_all()
        redis_server.stop()
        engine.dispose()


def api(deployment: dict[str, Any], method: str, path: str, role: str) -> Any:
    """``method /api/v1<path>`` with the token of ``role``; the answer's JSON (200 only)."""
    response = httpx.request(
        method,
        f"{deployment['base']}/api/v1{path}",
        headers={"Authorization": f"Bearer {deployment['tokens'][role]}"},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    return response.json()
