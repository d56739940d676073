"""`GET /api/v1/alerts` (alerts and their delivery status per channel) and
`POST /api/v1/alerts/test` (admins: one test message to a channel, sent now).

A team token sees its own team's alerts only; fleet alerts (no team) are for admins.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from autoscaler.api.deps import Auth, Ctx, tx
from autoscaler.errors import Forbidden, NotFound
from autoscaler.notify.channels import DeliveryError
from autoscaler.notify.deliver import delivery_rows, send_test

router = APIRouter(prefix="/api/v1/alerts", tags=["alerts"])


class TestIn(BaseModel):
    channel: str = Field(max_length=64)


class TestOut(BaseModel):
    channel: str
    type: str
    delivered: bool
    error: str | None = None


@router.get("", response_model=None)
def alerts(
    auth: Auth,
    ctx: Ctx,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    team: Annotated[str | None, Query(max_length=64)] = None,
) -> dict[str, Any]:
    with tx(ctx) as s:
        principal = auth.user(s)
        if not principal.is_admin:
            if not principal.team:
                raise Forbidden("this team token names no team")
            if team is not None and team != principal.team:
                raise Forbidden(f"a token of team {principal.team} cannot see team {team}'s alerts")
            team = principal.team
        elif team is not None:
            ctx.config.check_team(team)
        rows = delivery_rows(s, limit=limit, team=team)
    channels = [{"name": c.name, "type": c.type} for c in ctx.config.notifications.channels]
    return {"channels": channels, "alerts": rows}


@router.post("/test", response_model=TestOut)
def test_channel(body: TestIn, auth: Auth, ctx: Ctx) -> TestOut:
    with tx(ctx) as s:
        auth.admin(s)
    channel = ctx.config.notifications.channel(body.channel)
    if channel is None:
        known = [c.name for c in ctx.config.notifications.channels]
        raise NotFound(f"no channel named {body.channel!r} in notifications.channels (known: {known})")
    # Sent outside any transaction: the receiver may take its time.
    try:
        send_test(ctx.config, body.channel, ctx.clock.now())
    except DeliveryError as exc:
        return TestOut(channel=channel.name, type=channel.type, delivered=False, error=str(exc))
    return TestOut(channel=channel.name, type=channel.type, delivered=True)
