"""Schemathesis against the app's own OpenAPI document, in process, with an admin token:
no answer is a 5xx, and every answer (status, content type, headers, body, the ``Allow``
of a 405, 401 without the token) is one the document declares for that operation. On
both backends, on a small seeded site (a cluster with nodes, jobs and samples, a policy,
a proposed plan) so that list and detail answers have rows to validate.

Bounded: ``MAX_EXAMPLES`` per operation and backend, the examples and fuzzing phases
(about 40 s in all on two cores). To dig deeper locally:
``SHAPER_FUZZ_EXAMPLES=200 SHAPER_FUZZ_PHASES=examples,coverage,fuzzing`` (the coverage
phase alone takes about a minute per backend).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import negative_data_rejection, positive_data_acceptance
from sqlalchemy import Engine
from sqlmodel import Session, select

from app.actions.router import get_dispatcher
from app.api.deps import get_clock
from app.clusters.models import Cluster
from app.core.clock import FrozenClock
from app.core.config import Settings
from app.core.db import get_session
from app.core.ratelimit import AuthFailureLimiter
from app.main import create_app
from app.tokens import service as token_service
from app.tokens.models import ApiTokenCreate
from tests.app.builders import job, migration_plan, node, running, snapshot, util_sample
from tests.app.test_policies import SPEC
from tests.support.clock import T0
from tests.support.database import session_in_rollback

MAX_EXAMPLES = int(os.environ.get("SHAPER_FUZZ_EXAMPLES", "12"))
PHASES = os.environ.get("SHAPER_FUZZ_PHASES", "examples,fuzzing").split(",")


def _seed(app: FastAPI, session: Session, clock: FrozenClock) -> dict[str, str]:
    """A little of everything the API lists; returns the admin's Authorization header."""
    from fastapi.testclient import TestClient

    token = token_service.create_token(
        session=session, now=clock.now(), token_in=ApiTokenCreate(name="fuzz", scopes=["admin"])
    ).token
    headers = {"Authorization": f"Bearer {token}"}
    with TestClient(app) as client:
        for response in (
            client.post(
                "/api/v1/clusters", headers=headers, json={"name": "alpha", "scheduler": "slurm"}
            ),
            client.post(
                "/api/v1/clusters/alpha/telemetry",
                headers=headers,
                json=snapshot(
                    1,
                    nodes=[node("n1"), node("n2")],
                    jobs=[running("j1", "n1", [0, 1]), job("j2", gpus_requested=4)],
                    samples=[util_sample("n1", T0, 0.5)],
                ),
            ),
            client.post("/api/v1/policies", headers=headers, json={"name": "p", "spec": SPEC}),
        ):
            assert response.status_code < 300, response.text
    cluster = session.exec(select(Cluster).where(Cluster.name == "alpha")).one()
    migration_plan(
        session,
        cluster_id=cluster.id,  # type: ignore[arg-type]
        now=clock.now(),
        state="proposed",
    )
    return headers


# One app per backend, built at import so schemathesis can read its document; each test
# points it at that backend's rolled-back session (``_attach``).
APPS = {
    backend: create_app(Settings(environment="test", max_body_bytes=256 * 1024))
    for backend in ("postgres", "sqlite")
}


def _attach(app: FastAPI, engine: Engine) -> Iterator[dict[str, str]]:
    for session in session_in_rollback(engine):
        clock = FrozenClock(T0)
        app.dependency_overrides[get_session] = lambda: session  # noqa: B023
        app.dependency_overrides[get_clock] = lambda: clock  # noqa: B023
        # Schemathesis also sends requests without the token, on purpose (they must get
        # 401); counted as failed authentications, they would soon get 429 instead.
        app.state.auth_limiter = AuthFailureLimiter(limit=10**9, window_s=60)
        # Approvals would hand actions to Celery; the saga is not what is fuzzed here.
        app.dependency_overrides[get_dispatcher] = lambda: lambda _action_id: None
        try:
            yield _seed(app, session, clock)
        finally:
            app.dependency_overrides.clear()


@pytest.fixture
def postgres_admin(postgres_engine: Engine) -> Iterator[dict[str, str]]:
    yield from _attach(APPS["postgres"], postgres_engine)


@pytest.fixture
def sqlite_admin(sqlite_engine: Engine) -> Iterator[dict[str, str]]:
    yield from _attach(APPS["sqlite"], sqlite_engine)


FUZZ = settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    derandomize=True,  # the same cases every run: a failure here reproduces
    database=None,
    suppress_health_check=list(HealthCheck),
)
postgres = schemathesis.openapi.from_asgi("/openapi.json", APPS["postgres"])
sqlite = schemathesis.openapi.from_asgi("/openapi.json", APPS["sqlite"])
for _schema in (postgres, sqlite):
    _schema.config.phases.update(phases=PHASES)


# Every check but two, which judge how strictly requests are validated rather than what
# the server answers: ``positive_data_acceptance`` wants 2xx for any schema-valid input
# (a random cluster name is 404, a policy name the planner lacks 422 naming the field),
# and ``negative_data_rejection`` wants 4xx for inputs pydantic's lax mode coerces on
# purpose (``"0.5"`` as a timestamp, ``false`` as ``0``).
LENIENT = [positive_data_acceptance, negative_data_rejection]


@postgres.parametrize()
@FUZZ
def test_api_on_postgres(case: Any, postgres_admin: dict[str, str]) -> None:
    case.call_and_validate(headers=postgres_admin, excluded_checks=LENIENT)


@sqlite.parametrize()
@FUZZ
def test_api_on_sqlite(case: Any, sqlite_admin: dict[str, str]) -> None:
    case.call_and_validate(headers=sqlite_admin, excluded_checks=LENIENT)
