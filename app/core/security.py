"""Bearer tokens and scopes.

A token reads ``shp_<key_id>_<secret>``. Only ``key_id`` and SHA-256 of the secret are
stored; the secret is shown once at creation. Lookup is by ``key_id``; the digest is
compared with ``hmac.compare_digest`` (constant time), and an unknown ``key_id`` costs the
same comparison so timing does not reveal which ids exist.

Scopes: ``viewer`` ⊂ ``operator`` ⊂ ``admin`` (each includes the ones before it), and the
per-resource scopes ``connector:<cluster>`` and ``agent:<cluster>/<node>``, which grant
nothing outside their own cluster (or node).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from datetime import datetime

TOKEN_PREFIX = "shp"
_TOKEN_RE = re.compile(r"^shp_([0-9a-f]{12})_([A-Za-z0-9_-]{43})$")
_ROLE_RANK = {"viewer": 1, "operator": 2, "admin": 3}
_CLUSTER = r"[a-z0-9][a-z0-9-]{0,62}"
_NODE = r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}"
SCOPE_RE = re.compile(rf"^(viewer|operator|admin|connector:{_CLUSTER}|agent:{_CLUSTER}/{_NODE})$")
_DUMMY_DIGEST = hashlib.sha256(b"no such token").hexdigest()


@dataclass(frozen=True)
class NewToken:
    key_id: str
    secret_digest: str
    plaintext: str


def generate_token() -> NewToken:
    key_id = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)
    return NewToken(key_id, digest(secret), f"{TOKEN_PREFIX}_{key_id}_{secret}")


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def split_token(plaintext: str) -> tuple[str, str] | None:
    """(key_id, secret) of a well-formed token, else None."""
    match = _TOKEN_RE.match(plaintext)
    return (match.group(1), match.group(2)) if match else None


def secret_matches(secret: str, stored_digest: str | None) -> bool:
    return hmac.compare_digest(digest(secret), stored_digest or _DUMMY_DIGEST) and (
        stored_digest is not None
    )


def is_valid_scope(scope: str) -> bool:
    return SCOPE_RE.match(scope) is not None


@dataclass(frozen=True)
class Principal:
    token_id: int
    name: str
    scopes: frozenset[str]
    # When the token stops being valid (None: never); kept so that a remembered
    # principal (app.tokens.cache) is refused from that second on.
    expires_at: datetime | None = None

    def allows(self, required: str) -> bool:
        """Whether any held scope grants ``required`` (a role or a concrete resource scope)."""
        if required in _ROLE_RANK:
            held = max((_ROLE_RANK.get(s, 0) for s in self.scopes), default=0)
            return held >= _ROLE_RANK[required]
        # Resource scopes: the exact scope, or admin (operators of the control plane).
        return required in self.scopes or "admin" in self.scopes
