"""Spend read models for people: a month's segments as export lines, and per-team
month-to-date, burn rate and forecast next to the budget and the policy's alert.

Every figure comes from the ledger (`autoscaler.ledger`), which alone attributes and
sums money; this module only shapes it for the dashboard, `/metrics` and the FOCUS
export.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import select
from sqlalchemy.orm import Session

from autoscaler.config import AutoscalerConfig
from autoscaler.ledger import figures, segments
from autoscaler.reports.focus import SpendLine
from autoscaler.state.models import DecisionRecord

Level = Literal["ok", "info", "warning", "critical"]
# Budget thresholds (share of the monthly budget) matching the policy's default alerts.
THRESHOLDS: tuple[tuple[float, Level], ...] = ((1.0, "critical"), (0.8, "warning"), (0.5, "info"))


def list_prices(config: AutoscalerConfig) -> dict[tuple[str, str], float]:
    """(pool, instance type) -> on-demand price per hour, where the pool names one: the
    list price of the FOCUS export (a spot segment's list cost is its on-demand cost)."""
    return {
        (pool.name, itype.name): itype.on_demand_price
        for pool in config.pools
        for itype in pool.instance_types
        if itype.on_demand_price is not None
    }


def spend_lines(
    session: Session,
    month: str,
    team: str | None = None,
    *,
    prices: Mapping[tuple[str, str], float] | None = None,
) -> list[SpendLine]:
    """The ledger's segments of `month` (YYYY-MM), as export lines; `prices` (from
    `list_prices`) gives each line its list price."""
    prices = prices or {}
    return [
        SpendLine(
            instance_id=r.instance_id,
            team=r.team,
            pool=r.pool,
            provider=r.provider,
            region=r.region,
            instance_type=r.instance_type,
            capacity_type=r.capacity_type,
            kind=r.kind,
            start=r.start,
            end=r.end,
            hourly_price=r.hourly_price,
            cost_usd=r.cost_usd,
            hours=r.hours,
            gpu_hours=r.gpu_hours,
            list_price=prices.get((r.pool, r.instance_type)),
        )
        for r in segments(session, month, team)
    ]


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
    shared: Collection[str] = (),
) -> list[TeamSpend]:
    """Month-to-date, burn, forecast and budget use for each team (or just `only_team`)."""
    fig = figures(session, now=now, team=only_team, shared=shared)
    alerts = latest_alerts(session)
    names = [only_team] if only_team is not None else sorted({*teams, *budgets, *fig.teams()})
    out = []
    for team in names:
        spent = fig.month_to_date.get(team, 0.0)
        budget = budgets.get(team)
        alert = alerts.get(team)
        # The policy's own alert wins; without one (no cycle yet) use its default thresholds.
        level: Level = alert["level"] if alert else level_for(spent / budget if budget else None)
        out.append(
            TeamSpend(
                team=team,
                month_to_date_usd=spent,
                burn_usd_per_hour=fig.burn.get(team, 0.0),
                forecast_usd=fig.forecast(team, now),
                budget_usd=budget,
                level=level,
                alert=str(alert["message"]) if alert and alert.get("message") else None,
            )
        )
    return out
