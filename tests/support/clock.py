"""The instant the tests' frozen clock stands at (the ``clock`` fixture, tests/conftest.py)."""

from __future__ import annotations

from datetime import UTC, datetime

T0 = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)
