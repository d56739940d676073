"""`GET /api/v1/reports/spend`: one month's priced segments as FOCUS 1.0 rows (JSON, or
CSV with `format=focus`; `format=csv` is the same CSV, kept for older clients).

Team members get their own team's rows only; an admin gets every team's, or one
team's with `team=`.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse

from autoscaler.api.deps import Auth, Ctx, tx
from autoscaler.errors import Forbidden
from autoscaler.ledger.period import month_of, parse_month
from autoscaler.reports.focus import FOCUS_VERSION, focus_row, to_csv, total
from autoscaler.reports.spend import list_prices, spend_lines

router = APIRouter(prefix="/api/v1/reports", tags=["reports"])


# Both media types are documented so clients (and the schemathesis suite) accept the CSV form.
@router.get(
    "/spend",
    response_model=None,
    responses={
        200: {
            "content": {
                "application/json": {"schema": {"type": "object"}},
                "text/csv": {"schema": {"type": "string"}},
            }
        }
    },
)
def spend_report(
    auth: Auth,
    ctx: Ctx,
    month: str | None = None,
    team: str | None = None,
    format: Literal["json", "csv", "focus"] = "json",
) -> dict[str, Any] | PlainTextResponse:
    month = month or month_of(ctx.clock.now())
    parse_month(month)  # a malformed month is refused before any query
    with tx(ctx) as s:
        principal = auth.user(s)
        if not principal.is_admin and not principal.team:
            raise Forbidden("this team token names no team")
        if principal.is_admin and team is not None:
            ctx.config.check_team(team)
        scope = team if principal.is_admin else principal.team
        lines = spend_lines(s, month, team=scope, prices=list_prices(ctx.config))
        rows = [focus_row(line, deployment=ctx.config.deployment) for line in lines]
    if format in ("csv", "focus"):
        return PlainTextResponse(
            to_csv(rows),
            media_type="text/csv",
            headers={"Content-Disposition": f'attachment; filename="spend-{month}.csv"'},
        )
    return {
        "month": month,
        "team": scope,
        "focus_version": FOCUS_VERSION,
        "total_usd": round(total(rows), 6),
        "rows": rows,
    }
