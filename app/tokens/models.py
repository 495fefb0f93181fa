from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import Field as PydanticField
from pydantic import field_validator
from sqlmodel import Field, SQLModel

from app.core.security import SCOPE_RE, is_valid_scope
from app.core.types import AwareDatetime, NoNulStr, json_column, required_utc_column, utc_column

# The pattern is published in the OpenAPI document so clients (and schemathesis) know which
# scopes exist; the validator below gives the readable refusal.
Scope = Annotated[NoNulStr, PydanticField(json_schema_extra={"pattern": SCOPE_RE.pattern})]


class ApiTokenCreate(SQLModel):
    name: NoNulStr = Field(min_length=1, max_length=128)
    scopes: list[Scope] = Field(min_length=1, max_length=32)
    expires_at: AwareDatetime | None = None  # a naive time would be stored as if UTC

    @field_validator("scopes")
    @classmethod
    def _known_scopes(cls, scopes: list[str]) -> list[str]:
        for index, scope in enumerate(scopes):
            if not is_valid_scope(scope):
                raise ValueError(
                    f"scopes[{index}]: {scope!r} is not one of viewer, operator, admin, "
                    "connector:<cluster>, agent:<cluster>/<node>"
                )
        return sorted(set(scopes))


class ApiTokenPublic(SQLModel):
    id: int
    key_id: str
    name: str
    scopes: list[str]
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None


class ApiTokenCreated(ApiTokenPublic):
    token: str  # shown once


class ApiToken(SQLModel, table=True):
    __tablename__ = "api_tokens"

    id: int | None = Field(default=None, primary_key=True)
    key_id: str = Field(max_length=12, unique=True)
    name: str = Field(max_length=128)
    secret_digest: str = Field(max_length=64)
    scopes: list[str] = json_column(list)
    created_at: datetime = required_utc_column()
    expires_at: datetime | None = utc_column()
    revoked_at: datetime | None = utc_column()
