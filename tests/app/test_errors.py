"""Every error is the documented JSON body: 500s without dropping the connection, 503
with Retry-After from a database that cannot write, 429 for a guessing address; and the
OpenAPI document says which operation can answer which."""

from __future__ import annotations

import http.client
import json
import logging
import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine, event, text
from sqlmodel import Session

from app.api.deps import get_clock
from app.core import migrate
from app.core.clock import FrozenClock
from app.core.config import Settings
from app.core.db import make_engine
from app.core.db_errors import classify
from app.core.errors import Invalid, Unavailable
from app.core.logging import RedactSecrets
from app.main import create_app
from app.tokens import service as token_service
from app.tokens.models import ApiTokenCreate
from tests.support.clock import T0
from tests.support.live_server import app_on, serve, tokens_for

ERROR_KEYS = {"code", "message", "retryable"}


def _boom() -> None:
    raise RuntimeError("a bug the handlers do not know")


def test_a_500_is_json_and_the_connection_stays_open(sqlite_engine: Engine) -> None:
    app = app_on(sqlite_engine, Settings(environment="test"))
    app.add_api_route("/boom", _boom)  # a route with a bug, as any could have
    with serve(app) as base:
        connection = http.client.HTTPConnection(base.removeprefix("http://"), timeout=10)
        connection.request("GET", "/boom")
        socket_before = connection.sock
        response = connection.getresponse()
        body = json.loads(response.read())
        assert response.status == 500
        assert body == {
            "error": {
                "code": "internal",
                "message": "internal error; the server log has the details",
                "retryable": False,
            }
        }
        assert response.getheader("connection") != "close"
        assert response.getheader("x-content-type-options") == "nosniff"
        connection.request("GET", "/healthz")
        again = connection.getresponse()
        assert again.status == 200 and json.loads(again.read()) == {"status": "ok"}
        assert connection.sock is socket_before  # the same connection, not a new one
        connection.close()


def test_unknown_routes_and_methods_are_json(client: TestClient) -> None:
    for response, code in (
        (client.get("/api/v1/nothing-here"), "not_found"),
        (client.put("/healthz"), "method_not_allowed"),
    ):
        assert set(response.json()["error"]) >= ERROR_KEYS
        assert response.json()["error"]["code"] == code


@pytest.fixture(params=["postgres", "sqlite"])
def read_only_app(
    request: pytest.FixtureRequest, make_postgres_database: Any, tmp_path: Path
) -> Iterator[tuple[FastAPI, str]]:
    """A migrated database with an admin token in it, served read-only afterwards:
    PostgreSQL with ``default_transaction_read_only`` (as a standby or an operator's
    switch would), SQLite with ``query_only`` (as a read-only file would)."""
    if request.param == "postgres":
        url = make_postgres_database("readonly")
    else:
        url = f"sqlite:///{tmp_path / 'shaper.db'}"
    migrate.upgrade(url)
    writable = make_engine(url)
    with Session(writable) as session:
        token = tokens_for(session, T0, ("admin",))["admin"]
    writable.dispose()
    if request.param == "postgres":
        engine = make_engine(url, connect_args={"options": "-c default_transaction_read_only=on"})
    else:
        engine = make_engine(url)
        event.listen(engine, "connect", lambda conn, _: conn.execute("PRAGMA query_only=ON"))
    app = app_on(engine, Settings(environment="test"))
    app.dependency_overrides[get_clock] = lambda: FrozenClock(T0)
    yield app, token
    engine.dispose()


def test_a_read_only_database_answers_503_retryable(read_only_app: tuple[FastAPI, str]) -> None:
    app, token = read_only_app
    with TestClient(app) as client:
        created = client.post(
            "/api/v1/clusters",
            headers={"Authorization": f"Bearer {token}"},
            json={"name": "alpha", "scheduler": "slurm"},
        )
        assert created.status_code == 503, created.text
        assert created.headers["retry-after"] == "5"
        error = created.json()["error"]
        assert error["code"] == "unavailable" and error["retryable"] is True
        assert "read-only" in error["message"]

        ready = client.get("/readyz")
        assert ready.status_code == 503 and ready.headers["retry-after"] == "5"
        assert ready.json()["status"] == "unavailable"
        assert ready.json()["reason"] == "read_only"
        assert client.get("/healthz").status_code == 200  # alive, just not ready


def test_readyz_proves_a_write_and_leaves_nothing(client: TestClient, session: Session) -> None:
    before = session.execute(text("SELECT version_num FROM alembic_version")).all()
    assert client.get("/readyz").json() == {"status": "ok"}
    assert session.execute(text("SELECT version_num FROM alembic_version")).all() == before


def test_driver_errors_are_classified_by_code(engine: Engine) -> None:
    """Real driver errors: a number or a NUL the database cannot take is the request's
    fault (422); anything else is not classified (a 500 and a bug to fix)."""
    with engine.connect() as connection:
        problems: list[BaseException] = []
        for statement, value in (
            ("SELECT CAST(:value AS INTEGER) + 0", 2**63),
            ("SELECT CAST(:value AS TEXT)", "a\x00b"),
            ("SELECT no_such_column FROM alembic_version", None),
        ):
            try:
                with connection.begin():
                    connection.execute(text(statement), {"value": value})
            except Exception as exc:
                problems.append(exc)
    kinds = [type(classify(p)) if classify(p) else None for p in problems]
    if engine.dialect.name == "postgresql":
        assert kinds == [Invalid, Invalid, None]
    else:  # SQLite stores NUL; only the overflow and the bad column fail
        assert kinds == [Invalid, None]


def test_pool_exhaustion_is_503(postgres_engine: Engine) -> None:
    starved = make_engine(
        postgres_engine.url.render_as_string(hide_password=False),
        pool_size=1,
        max_overflow=0,
        pool_timeout=0.1,
    )
    with starved.connect():
        with pytest.raises(Exception) as caught:
            starved.connect()
    starved.dispose()
    assert isinstance(classify(caught.value), Unavailable)


def test_sql_parameters_never_reach_the_log(session: Session, clock: FrozenClock) -> None:
    """A naive expiry slipping past the API (here through the service, unvalidated)
    fails in the flush with the row's parameters, the secret's digest among them."""
    token_in = ApiTokenCreate.model_construct(
        name="ci", scopes=["viewer"], expires_at=T0.replace(tzinfo=None)
    )
    with pytest.raises(Exception) as caught:
        token_service.create_token(session=session, token_in=token_in, now=clock.now())
    session.rollback()
    record = logging.LogRecord(
        "app.errors",
        logging.ERROR,
        __file__,
        1,
        "failed",
        None,
        (type(caught.value), caught.value, caught.value.__traceback__),
    )
    assert RedactSecrets().filter(record)
    logged = logging.Formatter().format(record)
    assert "naive datetime" in logged
    assert "parameters hidden" in logged or "[parameters:" not in logged
    assert not re.search(r"[0-9a-f]{64}", logged)  # no SHA-256 digest, whoever's
    # An engine made without hide_parameters still has them scrubbed from the log.
    raw = "boom\n[SQL: INSERT …]\n[parameters: ('shp', 'deadbeef' * 8)]\n(Background …)"
    record = logging.LogRecord("x", logging.ERROR, __file__, 1, raw, None, None)
    assert RedactSecrets().filter(record)
    assert "deadbeef" not in record.getMessage()


def test_failed_authentications_are_rate_limited_per_address(
    client: TestClient, auth: dict, clock: FrozenClock, settings: Settings
) -> None:
    bad = {"Authorization": f"Bearer shp_000000000000_{'A' * 43}"}
    for _ in range(settings.auth_failure_limit):
        assert client.get("/api/v1/clusters", headers=bad).status_code == 401
    for _ in range(3):  # a request without a token is no guess: not counted, still 401
        assert client.get("/api/v1/clusters").status_code == 401
    limited = client.get("/api/v1/clusters", headers=bad)
    assert limited.status_code == 429
    assert limited.json()["error"]["code"] == "rate_limited"
    assert limited.json()["error"]["retryable"] is True
    assert limited.headers["retry-after"] == str(int(settings.auth_failure_window_s))
    # Good tokens too: a guess that succeeds must not stand out.
    assert client.get("/api/v1/clusters", headers=auth["viewer"]).status_code == 429
    # Also where the body is refused before the route runs.
    assert client.post("/api/v1/clusters", headers=auth["admin"], json={}).status_code == 429
    clock.advance(timedelta(seconds=settings.auth_failure_window_s).total_seconds())
    assert client.get("/api/v1/clusters", headers=auth["viewer"]).status_code == 200


def test_openapi_declares_the_errors_each_operation_can_answer() -> None:
    schema = create_app().openapi()
    assert "ErrorBody" in schema["components"]["schemas"]
    assert "HTTPValidationError" not in schema["components"]["schemas"]
    operations = [
        (path, operation)
        for path, item in schema["paths"].items()
        if path.startswith("/api/")
        for operation in item.values()
    ]
    for path, operation in operations:
        responses = operation["responses"]
        assert {"401", "429", "500", "503"} <= set(responses), path
        if "{" in path:
            assert "404" in responses and "422" in responses, path
        if "requestBody" in operation:
            assert {"413", "422"} <= set(responses), path
        for status, response in responses.items():
            if status.startswith(("4", "5")):
                ref = response["content"]["application/json"]["schema"]["$ref"]
                assert ref == "#/components/schemas/ErrorBody", (path, status)
        if operation.get("x-required-scope") == "authenticated":
            assert "403" not in responses
    telemetry = schema["paths"]["/api/v1/clusters/{cluster}/telemetry"]["post"]
    assert "snapshot" in telemetry["responses"]["409"]["description"]
