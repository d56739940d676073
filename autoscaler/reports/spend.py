"""Spend read models: segments clipped to a period, and per-team month-to-date,
burn rate, forecast and budget use.

Segments come from the ledger's `spend_records`. A segment that straddles a period
boundary is pro-rated by time, so months add up to the whole and an export of a
month sums to that month's ledger total.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from autoscaler.reports.focus import SpendLine
from autoscaler.reports.period import hours_between, month_bounds, month_of
from autoscaler.state.models import DecisionRecord, Instance, SpendRecord

# Instances that are costing money now (the burn rate), as the ledger charges them.
BILLED_STATES = ("requested", "launching", "booting", "ready", "draining", "terminating")
Level = Literal["ok", "info", "warning", "critical"]
# Budget thresholds (share of the monthly budget) matching the policy's default alerts.
THRESHOLDS: tuple[tuple[float, Level], ...] = ((1.0, "critical"), (0.8, "warning"), (0.5, "info"))


def spend_lines(session: Session, start: datetime, end: datetime, team: str | None = None) -> list[SpendLine]:
    stmt = (
        select(SpendRecord)
        .where(SpendRecord.start < end, SpendRecord.end > start)
        .order_by(SpendRecord.start, SpendRecord.id)
    )
    if team is not None:
        stmt = stmt.where(SpendRecord.team == team)
    lines = []
    for r in session.scalars(stmt):
        lo, hi = max(r.start, start), min(r.end, end)
        whole = (r.end - r.start).total_seconds()
        share = (hi - lo).total_seconds() / whole if whole > 0 else 1.0
        lines.append(
            SpendLine(
                instance_id=r.instance_id,
                team=r.team,
                pool=r.pool,
                provider=r.provider,
                region=r.region,
                instance_type=r.instance_type,
                capacity_type=r.capacity_type,
                start=lo,
                end=hi,
                hourly_price=r.hourly_price,
                cost_usd=r.cost_usd * share,
            )
        )
    return lines


@dataclass(frozen=True)
class TeamSpend:
    team: str
    month_to_date_usd: float
    burn_usd_per_hour: float
    forecast_usd: float
    budget_usd: float | None
    level: Level
    alert: str | None

    @property
    def ratio(self) -> float | None:
        """Month-to-date over budget (1.0 = the whole budget spent)."""
        return self.month_to_date_usd / self.budget_usd if self.budget_usd else None

    @property
    def forecast_ratio(self) -> float | None:
        return self.forecast_usd / self.budget_usd if self.budget_usd else None

    @property
    def bar(self) -> Literal["ok", "warn", "over"]:
        """The budget bar's colour class: amber past 80 % of the budget, red past 100 %."""
        ratio = self.ratio or 0.0
        return "over" if ratio >= 1.0 else "warn" if ratio >= 0.8 else "ok"


def level_for(ratio: float | None) -> Level:
    for threshold, level in THRESHOLDS:
        if ratio is not None and ratio >= threshold:
            return level
    return "ok"


def latest_alerts(session: Session) -> dict[str, dict[str, Any]]:
    """The policy's alerts of the last reconcile cycle, most severe per team."""
    row = session.scalar(select(DecisionRecord).order_by(DecisionRecord.id.desc()).limit(1))
    alerts = (row.result or {}).get("alerts", []) if row is not None else []
    rank = {"info": 1, "warning": 2, "critical": 3}
    worst: dict[str, dict[str, Any]] = {}
    for alert in alerts if isinstance(alerts, list) else []:
        if not isinstance(alert, dict) or not alert.get("team") or alert.get("level") not in rank:
            continue
        team = str(alert["team"])
        if team not in worst or rank[alert["level"]] > rank[worst[team]["level"]]:
            worst[team] = alert
    return worst


def team_spend(
    session: Session,
    *,
    now: datetime,
    budgets: dict[str, float],
    teams: list[str],
    only_team: str | None = None,
) -> list[TeamSpend]:
    """Month-to-date, burn, forecast and budget use for each team (or just `only_team`)."""
    start, end = month_bounds(month_of(now))
    mtd: dict[str, float] = {}
    for line in spend_lines(session, start, min(end, now), team=only_team):
        mtd[line.team] = mtd.get(line.team, 0.0) + line.cost_usd
    burn_stmt = (
        select(Instance.team, func.sum(Instance.hourly_price))
        .where(Instance.state.in_(BILLED_STATES), Instance.team.is_not(None))
        .group_by(Instance.team)
    )
    if only_team is not None:
        burn_stmt = burn_stmt.where(Instance.team == only_team)
    burn = {str(t): float(v or 0.0) for t, v in session.execute(burn_stmt)}
    alerts = latest_alerts(session)
    hours_left = hours_between(now, end)
    names = [only_team] if only_team is not None else sorted({*teams, *budgets, *mtd, *burn})
    out = []
    for team in names:
        spent = mtd.get(team, 0.0)
        forecast = spent + burn.get(team, 0.0) * hours_left
        budget = budgets.get(team)
        alert = alerts.get(team)
        # The policy's own alert wins; without one (no cycle yet) use its default thresholds.
        level: Level = alert["level"] if alert else level_for(spent / budget if budget else None)
        out.append(
            TeamSpend(
                team=team,
                month_to_date_usd=spent,
                burn_usd_per_hour=burn.get(team, 0.0),
                forecast_usd=forecast,
                budget_usd=budget,
                level=level,
                alert=str(alert["message"]) if alert and alert.get("message") else None,
            )
        )
    return out
