"""Log lines: JSON or text, with the ids they are about, secrets redacted; every request
gets an id that is answered in X-Request-ID and stamped on what is logged for it."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from app.core.logging import (
    REQUEST_ID,
    JsonFormatter,
    RedactSecrets,
    RequestContext,
    TextFormatter,
)


@pytest.fixture
def captured() -> Iterator[tuple[logging.Logger, io.StringIO, logging.StreamHandler[io.StringIO]]]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RedactSecrets())
    handler.addFilter(RequestContext())
    logger = logging.getLogger("shaper.test.logging")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    yield logger, stream, handler
    logger.removeHandler(handler)


def test_json_lines_carry_the_ids_and_never_a_token(captured) -> None:  # type: ignore[no-untyped-def]
    logger, stream, handler = captured
    handler.setFormatter(JsonFormatter())
    token = REQUEST_ID.set("req-42")
    try:
        logger.info(
            "approved with Bearer shp_abc123_SECRETSECRET", extra={"plan_id": 7, "cluster": "a"}
        )
    finally:
        REQUEST_ID.reset(token)
    try:
        raise ValueError("shp_abc123_SECRETSECRET")
    except ValueError:
        logger.exception("it failed")
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["level"] == "INFO" and first["logger"] == "shaper.test.logging"
    assert first["message"] == "approved with Bearer ***"
    assert (first["request_id"], first["plan_id"], first["cluster"]) == ("req-42", 7, "a")
    assert "action_id" not in first and re.match(r"\d{4}-\d\d-\d\dT", first["ts"])
    assert "request_id" not in second  # written outside any request
    assert "ValueError" in second["exception"] and "SECRET" not in second["exception"]


def test_text_lines_end_with_their_ids(captured) -> None:  # type: ignore[no-untyped-def]
    logger, stream, handler = captured
    handler.setFormatter(TextFormatter())
    logger.info("action %s succeeded", 3, extra={"action_id": 3, "plan_id": 1})
    logger.info("nothing to tie it to")
    with_ids, without = stream.getvalue().splitlines()
    assert with_ids.endswith("action 3 succeeded [plan_id=1 action_id=3]")
    assert without.endswith("nothing to tie it to")


def test_every_request_gets_an_id_in_its_answer(client: TestClient) -> None:
    given = client.get("/healthz", headers={"X-Request-ID": "trace-abc.1"})
    assert given.headers["x-request-id"] == "trace-abc.1"
    made = client.get("/healthz")
    assert re.fullmatch(r"[0-9a-f]{32}", made.headers["x-request-id"])
    refused = client.get("/healthz", headers={"X-Request-ID": 'no spaces; or quotes"'})
    assert re.fullmatch(r"[0-9a-f]{32}", refused.headers["x-request-id"])
    unauthorized = client.get("/api/v1/jobs", headers={"X-Request-ID": "r-401"})
    assert unauthorized.status_code == 401 and unauthorized.headers["x-request-id"] == "r-401"


def test_the_audit_record_keeps_the_id_the_answer_gave(client: TestClient, auth: dict) -> None:
    created = client.post(
        "/api/v1/clusters", headers=auth["admin"], json={"name": "alpha", "scheduler": "slurm"}
    )
    assert created.status_code in (200, 201), created.text
    records = client.get("/api/v1/audit", headers=auth["admin"]).json()["items"]
    assert records[0]["request_id"] == created.headers["x-request-id"]


def test_a_url_with_a_port_and_an_at_sign_in_its_path_is_left_as_it_is(captured) -> None:  # type: ignore[no-untyped-def]
    logger, stream, handler = captured
    handler.setFormatter(TextFormatter())
    logger.warning("GET http://127.0.0.1:8000/api/v1/teams/ml@lab failed")
    assert "http://127.0.0.1:8000/api/v1/teams/ml@lab" in stream.getvalue()


@pytest.mark.parametrize(
    ("line", "secret", "kept"),
    [
        (
            "connect to postgresql://shaper:db-pass@db:5432/shaper",
            "db-pass",
            "postgresql://shaper:***@db",
        ),
        (
            "broker redis://:broker-pass@redis:6379/0 unreachable",
            "broker-pass",
            "redis://:***@redis",
        ),
        ("header authorization: bearer abc.def-ghi", "abc.def-ghi", "bearer ***"),
        (
            "slurmrestd refused X-SLURM-USER-TOKEN "
            "eyJhbGciOiJIUzI1NiJ9.eyJzdW4iOiJzbHVybSJ9.c2lnbmF0dXJl",
            "c2lnbmF0dXJl",
            "X-SLURM-USER-TOKEN ***",
        ),
    ],
)
def test_urls_passwords_lowercase_bearers_and_jwts_are_redacted(
    captured, line: str, secret: str, kept: str
) -> None:  # type: ignore[no-untyped-def]
    logger, stream, handler = captured
    handler.setFormatter(TextFormatter())
    logger.warning("%s", line)
    written = stream.getvalue()
    assert secret not in written and kept in written
