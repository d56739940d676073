"""`GET /api/v1/spend`: month-to-date, burn rate and forecast per team.

Admins see every team; a team token sees its own team only (asking for another team
is refused rather than silently filtered, so a typo is noticed).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import BaseModel

from autoscaler.api.deps import Auth, Ctx, tx
from autoscaler.errors import Forbidden
from autoscaler.ledger.spend import shared_pools, spend_report

router = APIRouter(prefix="/api/v1", tags=["spend"])


class TeamSpendOut(BaseModel):
    team: str
    month: str
    month_to_date_usd: float
    burn_rate_usd_per_hour: float
    forecast_usd: float


class SpendOut(BaseModel):
    month: str
    teams: list[TeamSpendOut]
    total_usd: float


@router.get("/spend", response_model=SpendOut)
def spend(
    auth: Auth,
    ctx: Ctx,
    month: Annotated[str | None, Query(max_length=16, description="YYYY-MM; default: now (UTC)")] = None,
    team: Annotated[str | None, Query(max_length=64)] = None,
) -> SpendOut:
    with tx(ctx) as s:
        principal = auth.user(s)
        if not principal.is_admin:
            if team is not None and team != principal.team:
                raise Forbidden(f"a token of team {principal.team!r} cannot read team {team!r}'s spend")
            team = principal.team
        elif team is not None:
            ctx.config.check_team(team)
        now = ctx.clock.now()
        rows = spend_report(s, now=now, month=month, team=team, shared=shared_pools(ctx.config))
    label = rows[0].month if rows else (month or f"{now:%Y-%m}")
    return SpendOut(
        month=label,
        teams=[TeamSpendOut(**r.__dict__) for r in rows],
        total_usd=round(sum(r.month_to_date_usd for r in rows), 4),
    )
