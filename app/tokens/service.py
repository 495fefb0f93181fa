from __future__ import annotations

from datetime import datetime

from sqlmodel import Session, col, select

from app.audit import service as audit
from app.audit.models import Actor
from app.audit.service import AuditObject
from app.core.errors import Unauthorized
from app.core.lookup import found, row_id
from app.core.security import Principal, generate_token, secret_matches, split_token
from app.tokens.models import ApiToken, ApiTokenCreate, ApiTokenCreated, ApiTokenPublic


def create_token(
    *, session: Session, token_in: ApiTokenCreate, now: datetime, actor: Actor | None = None
) -> ApiTokenCreated:
    new = generate_token()
    token = ApiToken(
        key_id=new.key_id,
        name=token_in.name,
        secret_digest=new.secret_digest,
        scopes=token_in.scopes,
        created_at=now,
        expires_at=token_in.expires_at,
    )
    session.add(token)
    session.flush()
    audit.record(
        session=session,
        actor=actor,
        verb="create",
        object_type=AuditObject.token,
        object_id=token.id,
        now=now,
        # The key id is the token's public half; the secret and its digest never go here.
        changes={
            "key_id": token.key_id,
            "name": token.name,
            "scopes": token.scopes,
            "expires_at": token.expires_at,
        },
    )
    session.commit()
    session.refresh(token)
    return ApiTokenCreated.model_validate(token, update={"token": new.plaintext})


def authenticate(*, session: Session, plaintext: str, now: datetime) -> Principal:
    parts = split_token(plaintext)
    key_id, secret = parts if parts else ("", "")
    token = (
        session.exec(select(ApiToken).where(ApiToken.key_id == key_id)).first() if parts else None
    )
    # Compare even when the key is unknown, so timing does not tell which keys exist.
    if not secret_matches(secret, token.secret_digest if token else None) or token is None:
        raise Unauthorized("invalid token")
    if token.revoked_at is not None:
        raise Unauthorized("token revoked")
    if token.expires_at is not None and token.expires_at <= now:
        raise Unauthorized("token expired")
    return Principal(
        token_id=row_id(token),
        name=token.name,
        scopes=frozenset(token.scopes),
        expires_at=token.expires_at,
    )


def list_tokens(*, session: Session) -> list[ApiTokenPublic]:
    return [
        ApiTokenPublic.model_validate(t)
        for t in session.exec(select(ApiToken).order_by(col(ApiToken.id)))
    ]


def revoke_token(
    *, session: Session, token_id: int, now: datetime, actor: Actor | None = None
) -> ApiTokenPublic:
    """Revoke a token; revoking it again changes nothing (and records nothing)."""
    token = found(
        session.get(ApiToken, token_id),
        f"token {token_id} does not exist",
        resource="token",
        resource_id=token_id,
    )
    if token.revoked_at is None:
        token.revoked_at = now
        session.add(token)
        audit.record(
            session=session,
            actor=actor,
            verb="revoke",
            object_type=AuditObject.token,
            object_id=token_id,
            now=now,
            changes={"name": token.name, "revoked_at": [None, now]},
        )
        session.commit()
        session.refresh(token)
    return ApiTokenPublic.model_validate(token)
