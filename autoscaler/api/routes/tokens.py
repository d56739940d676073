"""Tokens (admin): create team, join and admin tokens; who am I."""

from __future__ import annotations

from datetime import timedelta

from fastapi import APIRouter

from autoscaler.api.deps import Auth, Ctx, tx
from autoscaler.api.schemas import TokenIn, TokenOut, WhoAmI
from autoscaler.auth.tokens import create_token
from autoscaler.errors import InvalidInput

router = APIRouter(prefix="/api/v1", tags=["auth"])
DEFAULT_JOIN_TTL = timedelta(hours=1)


@router.post("/tokens", response_model=TokenOut, status_code=201)
def create(body: TokenIn, auth: Auth, ctx: Ctx) -> TokenOut:
    with tx(ctx) as s:
        auth.admin(s)
        if body.kind == "team" and (not body.team or all(t.name != body.team for t in ctx.config.teams)):
            known = ", ".join(t.name for t in ctx.config.teams) or "none configured"
            raise InvalidInput(f"a team token needs a known team (known: {known})")
        if body.kind == "join" and (not body.pool or ctx.config.pool(body.pool) is None):
            known = ", ".join(p.name for p in ctx.config.pools) or "none configured"
            raise InvalidInput(f"a join token needs a known pool (known: {known})")
        ttl = timedelta(seconds=body.ttl_s) if body.ttl_s else (DEFAULT_JOIN_TTL if body.kind == "join" else None)
        plaintext, row = create_token(
            s,
            kind=body.kind,
            now=ctx.clock.now(),
            team=body.team if body.kind == "team" else None,
            pool=body.pool if body.kind == "join" else None,
            ttl=ttl,
            name=body.name,
        )
        return TokenOut(
            id=row.id, kind=row.kind, token=plaintext, team=row.team, pool=row.pool, expires_at=row.expires_at
        )


@router.get("/whoami", response_model=WhoAmI)
def whoami(auth: Auth, ctx: Ctx) -> WhoAmI:
    with tx(ctx) as s:
        p = auth.principal(s)
        return WhoAmI(kind=p.kind, team=p.team, pool=p.pool, worker_id=p.worker_id)
