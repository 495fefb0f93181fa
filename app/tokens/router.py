from __future__ import annotations

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel

from app.api.deps import AUTHENTICATED, ActorDep, ClockDep, CurrentPrincipal, SessionDep, scoped
from app.core.types import DbId
from app.tokens import service
from app.tokens.cache import PrincipalCache
from app.tokens.models import ApiTokenCreate, ApiTokenCreated, ApiTokenPublic

router = APIRouter(tags=["tokens"])


class WhoAmI(BaseModel):
    name: str
    scopes: list[str]


@router.get("/whoami", **scoped(AUTHENTICATED))
def whoami(principal: CurrentPrincipal) -> WhoAmI:
    return WhoAmI(name=principal.name, scopes=sorted(principal.scopes))


@router.get("/tokens", **scoped("admin"))
def list_tokens(session: SessionDep) -> list[ApiTokenPublic]:
    return service.list_tokens(session=session)


@router.post("/tokens", status_code=201, **scoped("admin"))
def create_token(
    session: SessionDep,
    clock: ClockDep,
    actor: ActorDep,
    response: Response,
    token_in: ApiTokenCreate,
) -> ApiTokenCreated:
    """The token is in this response only; Shaper keeps just its hash."""
    response.headers["Cache-Control"] = "no-store"  # a secret: never into any cache
    return service.create_token(session=session, token_in=token_in, now=clock.now(), actor=actor)


@router.delete("/tokens/{token_id}", **scoped("admin"))
def revoke_token(
    request: Request, session: SessionDep, clock: ClockDep, actor: ActorDep, token_id: DbId
) -> ApiTokenPublic:
    """The token is refused at once by the API process that answers, and by every other
    within `SHAPER_AUTH_CACHE_S` seconds (default 5): how long a process remembers a
    token that authenticated."""
    revoked = service.revoke_token(session=session, token_id=token_id, now=clock.now(), actor=actor)
    cache: PrincipalCache = request.app.state.principal_cache
    cache.forget_all()
    return revoked
