"""A short-lived, per-process memory of tokens that authenticated, so a burst of requests
with one token does not look it up in the database each time (issue 13: the lookup was a
sixth of GET /clusters' CPU).

Entries are keyed by SHA-256 of the whole presented token (only a hash, and only in this
process's memory: never logged, never sent) and kept ``ttl_s`` seconds. What that costs:
a revoked token is still accepted for up to ``ttl_s`` seconds by a process that
authenticated it just before (another uvicorn worker, another replica). The process that
answers the revocation (DELETE /api/v1/tokens/{id}) forgets every entry at once (a
request of that token already past its lookup may remember it again, for ``ttl_s`` at
most). An expiry is honoured to the second (the entry keeps the token's ``expires_at``).
Only successes are kept: a refused token goes to the database, and the failure limiter,
every time. ``ttl_s`` 0 turns it off.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime

from app.core.security import Principal

MAX_ENTRIES = 10_000  # past it the memory starts over: bounded whatever callers send


@dataclass(frozen=True)
class _Entry:
    principal: Principal
    expires_at: datetime | None
    cached_at: datetime


class PrincipalCache:
    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._entries: dict[bytes, _Entry] = {}

    @staticmethod
    def _key(plaintext: str) -> bytes:
        return hashlib.sha256(plaintext.encode()).digest()

    def get(self, plaintext: str, now: datetime) -> Principal | None:
        """The principal of a token that authenticated less than ``ttl_s`` ago and has not
        expired since, else None (the caller asks the database)."""
        if self.ttl_s <= 0:
            return None
        entry = self._entries.get(self._key(plaintext))
        if entry is None:
            return None
        age_s = (now - entry.cached_at).total_seconds()
        # A clock that went back (an injected one) counts as too old, never as fresh.
        fresh = 0 <= age_s < self.ttl_s
        if not fresh or (entry.expires_at is not None and entry.expires_at <= now):
            self._entries.pop(self._key(plaintext), None)
            return None
        return entry.principal

    def put(
        self, plaintext: str, principal: Principal, expires_at: datetime | None, now: datetime
    ) -> None:
        if self.ttl_s <= 0:
            return
        if len(self._entries) >= MAX_ENTRIES:
            self._entries.clear()
        self._entries[self._key(plaintext)] = _Entry(principal, expires_at, now)

    def forget_all(self) -> None:
        """After a revocation: every token is looked up again."""
        self._entries.clear()
