from __future__ import annotations

import logging
from pathlib import Path

import pytest
from pydantic import ValidationError

from app.core.config import Settings
from app.core.logging import RedactSecrets
from app.core.ratelimit import AuthFailureLimiter
from app.core.security import Principal, generate_token, secret_matches, split_token


def test_embedded_default(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SHAPER_DATABASE_URL", "SHAPER_BROKER_URL", "SHAPER_HOST"):
        monkeypatch.delenv(name, raising=False)
    settings = Settings()
    assert settings.resolved_database_url == f"sqlite:///{Path('shaper-data') / 'shaper.db'}"
    assert settings.tasks_in_process and settings.host == "127.0.0.1"
    assert settings.max_body_bytes == 16 * 1024 * 1024


def test_environment_switches_to_postgres_and_celery(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHAPER_DATABASE_URL", "postgresql+psycopg://u@db/shaper")
    monkeypatch.setenv("SHAPER_BROKER_URL", "redis://127.0.0.1:6379/0")
    settings = Settings()
    assert settings.resolved_database_url.startswith("postgresql+psycopg")
    assert not settings.tasks_in_process


def test_unsafe_values_are_refused() -> None:
    with pytest.raises(ValidationError, match="production needs SHAPER_DATABASE_URL"):
        Settings(environment="production")
    with pytest.raises(ValidationError, match="refusing to bind to 0.0.0.0"):
        Settings(host="0.0.0.0")
    assert Settings(host="0.0.0.0", allow_public_bind=True).host == "0.0.0.0"


def test_tokens_and_scopes() -> None:
    new = generate_token()
    key_id, secret = split_token(new.plaintext) or ("", "")
    assert key_id == new.key_id and secret_matches(secret, new.secret_digest)
    assert not secret_matches(secret + "x", new.secret_digest)
    assert not secret_matches(secret, None)
    assert split_token("shp_short_x") is None
    admin = Principal(1, "a", frozenset({"admin"}))
    connector = Principal(2, "c", frozenset({"connector:alpha"}))
    assert admin.allows("viewer") and admin.allows("connector:beta")
    assert connector.allows("connector:alpha") and not connector.allows("connector:beta")
    assert not connector.allows("viewer")
    assert Principal(3, "o", frozenset({"operator"})).allows("viewer")


def test_secrets_never_reach_the_log(caplog: pytest.LogCaptureFixture) -> None:
    token = generate_token().plaintext
    record = logging.LogRecord(
        "x", logging.INFO, __file__, 1, "got %s and Bearer abc.def", (token,), None
    )
    assert RedactSecrets().filter(record)
    assert token not in record.getMessage() and "abc.def" not in record.getMessage()
    assert record.getMessage().startswith(f"got shp_{token.split('_')[1]}_***")


def test_auth_failure_limiter_slides_and_stays_bounded() -> None:
    limiter = AuthFailureLimiter(limit=3, window_s=60, max_addresses=2)
    for at in (0.0, 10.0, 20.0):
        assert limiter.retry_after("10.0.0.1", at) is None
        limiter.record_failure("10.0.0.1", at)
    assert limiter.retry_after("10.0.0.1", 30.0) == 30  # until the failure at 0 s is old
    assert limiter.retry_after("10.0.0.2", 30.0) is None  # per address
    assert limiter.retry_after("10.0.0.1", 60.0) is None  # one failure left the window
    limiter.record_failure("10.0.0.2", 61.0)
    limiter.record_failure("10.0.0.3", 62.0)  # a third address: the oldest is forgotten
    assert limiter.retry_after("10.0.0.1", 62.0) is None
    assert len(limiter._failures) == 2
