"""Test databases: a real PostgreSQL (the default) and SQLite, both built by the Alembic
migrations, never by ``create_all``. Each test runs inside a transaction that is rolled
back, with the application's commits turned into SAVEPOINT releases.

PostgreSQL is required: ``make test`` starts it. Without it the suite fails loudly.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine
from sqlmodel import Session

from app.api.deps import get_clock
from app.core import migrate
from app.core.clock import FrozenClock
from app.core.config import Settings
from app.core.db import get_session, make_engine
from app.main import create_app
from app.tokens import service as token_service
from app.tokens.models import ApiTokenCreate
from tests.support.clock import T0
from tests.support.database import session_in_rollback
from tests.support.parallel import (
    ModuleOrServiceScheduling,
    refuse_unsafe_runs,
    service_groups,
)

POSTGRES_ADMIN_DSN = os.environ.get(
    "SHAPER_TEST_POSTGRES_DSN", "host=127.0.0.1 port=5432 user=postgres dbname=postgres"
)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the modules that use a shared real service (tests/support/parallel.py)."""

    def module(item: pytest.Item) -> str:
        return item.nodeid.split("::", 1)[0]

    groups = service_groups((module(item), item.fixturenames) for item in items)
    for item in items:
        if module(item) in groups:
            item.add_marker(pytest.mark.xdist_group(groups[module(item)]))


def pytest_configure(config: pytest.Config) -> None:
    refuse_unsafe_runs(config)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> ModuleOrServiceScheduling:
    return ModuleOrServiceScheduling(config, log)


def _admin_connection() -> psycopg.Connection[Any]:
    try:
        return psycopg.connect(POSTGRES_ADMIN_DSN, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        raise RuntimeError(
            f"PostgreSQL is required for the test suite and is not reachable at "
            f"{POSTGRES_ADMIN_DSN!r}: {exc}. Run `make test` (it starts PostgreSQL) or set "
            "SHAPER_TEST_POSTGRES_DSN."
        ) from exc


def _url_for(dbname: str) -> str:
    params = dict(part.split("=", 1) for part in POSTGRES_ADMIN_DSN.split())
    user = params.get("user", "postgres")
    host, port = params.get("host", "127.0.0.1"), params.get("port", "5432")
    return f"postgresql+psycopg://{user}@{host}:{port}/{dbname}"


@pytest.fixture(scope="session")
def make_postgres_database() -> Iterator[Any]:
    """Factory of empty PostgreSQL databases, each dropped at the end of the session."""
    created: list[str] = []

    def make(suffix: str) -> str:
        name = f"shaper_test_{os.getpid()}_{suffix}"
        with _admin_connection() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
        created.append(name)
        return _url_for(name)

    yield make
    with _admin_connection() as conn:
        for name in created:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def postgres_engine(make_postgres_database: Any) -> Iterator[Engine]:
    url = make_postgres_database("main")
    migrate.upgrade(url)
    engine = make_engine(url)
    yield engine
    engine.dispose()


@pytest.fixture(scope="session")
def sqlite_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    url = f"sqlite:///{tmp_path_factory.mktemp('sqlite') / 'shaper.db'}"
    migrate.upgrade(url)
    engine = make_engine(url)
    yield engine
    engine.dispose()


@pytest.fixture(params=["postgres", "sqlite"])
def engine(request: pytest.FixtureRequest) -> Engine:
    """Every test that uses the database runs on both backends."""
    return request.getfixturevalue(f"{request.param}_engine")  # type: ignore[no-any-return]


@pytest.fixture
def postgres_only_engine(postgres_engine: Engine) -> Engine:
    return postgres_engine


@pytest.fixture
def session(engine: Engine) -> Iterator[Session]:
    yield from session_in_rollback(engine)


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(T0)


@pytest.fixture
def settings() -> Settings:
    return Settings(environment="test", max_body_bytes=256 * 1024)


@pytest.fixture
def client(session: Session, clock: FrozenClock, settings: Settings) -> Iterator[TestClient]:
    app = create_app(settings)
    app.dependency_overrides[get_session] = lambda: session
    app.dependency_overrides[get_clock] = lambda: clock
    with TestClient(app) as test_client:
        yield test_client


SCOPES = {
    "viewer": ["viewer"],
    "operator": ["operator"],
    "admin": ["admin"],
    "connector_alpha": ["connector:alpha"],
    "connector_beta": ["connector:beta"],
    "agent_alpha_n1": ["agent:alpha/n1"],
}


@pytest.fixture
def tokens(session: Session, clock: FrozenClock) -> dict[str, str]:
    """Plaintext tokens by role name (see SCOPES)."""
    return {
        role: token_service.create_token(
            session=session, now=clock.now(), token_in=ApiTokenCreate(name=role, scopes=scopes)
        ).token
        for role, scopes in SCOPES.items()
    }


@pytest.fixture
def auth(tokens: dict[str, str]) -> dict[str, dict[str, str]]:
    """Authorization headers by role name."""
    return {role: {"Authorization": f"Bearer {token}"} for role, token in tokens.items()}


@pytest.fixture
def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent
