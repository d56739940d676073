"""Spend segments and the arithmetic on them.

A segment is one instance's billed time within one calendar month (UTC): hourly price
x hours from the launch to the termination (or to now while it lives), boot and idle
time included, because the cloud bills them too. Segments are split at month
boundaries so that "spend in March" is a plain sum. An instance is charged to
`Instance.team`, the team whose demand the planner launched it for; capacity kept for a
pool's minimum belongs to no team and is charged to "shared".
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from autoscaler.errors import InvalidInput
from autoscaler.state.models import Instance, SpendRecord

SHARED_TEAM = "shared"
# Instance states in which the provider may still bill us.
BILLED_STATES = ("launching", "booting", "ready", "draining", "terminating", "boot_timeout", "lost")
_MONTH_RE = re.compile(r"^(\d{4})-(\d{2})$")


def month_bounds(at: datetime) -> tuple[datetime, datetime]:
    """First instant of `at`'s month and of the next month (UTC)."""
    at = at.astimezone(UTC)
    start = datetime(at.year, at.month, 1, tzinfo=UTC)
    end = datetime(at.year + (at.month == 12), at.month % 12 + 1, 1, tzinfo=UTC)
    return start, end


def parse_month(text: str) -> tuple[datetime, datetime]:
    """`YYYY-MM` -> that month's bounds, or a one-line InvalidInput."""
    m = _MONTH_RE.match(text.strip())
    if not m or not 1 <= int(m.group(2)) <= 12 or int(m.group(1)) < 1970:
        raise InvalidInput(f"month {text!r} is not in the form YYYY-MM (for example 2026-03)")
    return month_bounds(datetime(int(m.group(1)), int(m.group(2)), 1, tzinfo=UTC))


def _months(start: datetime, end: datetime) -> Iterator[tuple[datetime, datetime]]:
    """[start, end) cut at month boundaries."""
    cur = start
    while cur < end:
        _, nxt = month_bounds(cur)
        yield cur, min(nxt, end)
        cur = nxt


def cost(hourly_price: float, start: datetime, end: datetime) -> float:
    return max((end - start).total_seconds(), 0.0) / 3600.0 * hourly_price


def accrue(session: Session, *, now: datetime, since: datetime | None = None) -> int:
    """Bring the segments of every billed instance up to `now` (or its termination).

    Looks at instances still alive and those terminated since `since`, in two queries.
    The caller passes its previous accrual time; without one (first cycle after a start)
    the cutoff is the start of the previous month, so an instance that ended just before
    a month boundary while nothing accrued is still charged. Returns segments written.
    """
    cutoff = since or month_bounds(month_bounds(now)[0] - timedelta(seconds=1))[0]
    instances = list(
        session.scalars(
            select(Instance).where(
                Instance.launched_at.is_not(None),
                or_(Instance.terminated_at.is_(None), Instance.terminated_at >= cutoff),
            )
        )
    )
    if not instances:
        return 0
    existing: dict[tuple[str, datetime], SpendRecord] = {}
    for i in range(0, len(instances), 500):
        ids = [inst.id for inst in instances[i : i + 500]]
        for seg in session.scalars(select(SpendRecord).where(SpendRecord.instance_id.in_(ids))):
            existing[(seg.instance_id, month_bounds(seg.start)[0])] = seg
    written = 0
    for inst in instances:
        assert inst.launched_at is not None
        end = min(inst.terminated_at or now, now)
        for seg_start, seg_end in _months(inst.launched_at, end):
            key = (inst.id, month_bounds(seg_start)[0])
            rec = existing.get(key)
            amount = cost(inst.hourly_price, seg_start, seg_end)
            if rec is None:
                session.add(
                    SpendRecord(
                        instance_id=inst.id,
                        team=inst.team or SHARED_TEAM,
                        pool=inst.pool,
                        provider=inst.provider,
                        region=inst.region,
                        instance_type=inst.instance_type,
                        capacity_type=inst.capacity_type,
                        start=seg_start,
                        end=seg_end,
                        hourly_price=inst.hourly_price,
                        cost_usd=amount,
                    )
                )
                written += 1
            elif rec.end != seg_end:
                rec.end, rec.cost_usd = seg_end, amount
                written += 1
    return written


def month_to_date(session: Session, month: datetime, team: str | None = None) -> dict[str, float]:
    """USD charged per team in the month containing `month` (as accrued so far)."""
    start, end = month_bounds(month)
    stmt = (
        select(SpendRecord.team, func.sum(SpendRecord.cost_usd))
        .where(SpendRecord.start >= start, SpendRecord.start < end)
        .group_by(SpendRecord.team)
    )
    if team:
        stmt = stmt.where(SpendRecord.team == team)
    return {t: float(v or 0.0) for t, v in session.execute(stmt)}


def burn_rate(session: Session, team: str | None = None) -> dict[str, float]:
    """USD/h of capacity billed right now, per team."""
    stmt = (
        select(Instance.team, func.sum(Instance.hourly_price))
        .where(Instance.state.in_(BILLED_STATES), Instance.launched_at.is_not(None))
        .group_by(Instance.team)
    )
    out: dict[str, float] = defaultdict(float)
    for t, v in session.execute(stmt):
        out[t or SHARED_TEAM] += float(v or 0.0)
    if team:
        return {team: out.get(team, 0.0)}
    return dict(out)


def forecast(month_to_date_usd: float, burn_usd_per_hour: float, now: datetime, period_end: datetime) -> float:
    """Month-end projection: what is spent plus the current burn until the month ends."""
    hours_left = max((period_end - now).total_seconds(), 0.0) / 3600.0
    return month_to_date_usd + burn_usd_per_hour * hours_left


@dataclass(frozen=True)
class TeamSpend:
    team: str
    month: str
    month_to_date_usd: float
    burn_rate_usd_per_hour: float
    forecast_usd: float


def spend_report(
    session: Session, *, now: datetime, month: str | None = None, team: str | None = None
) -> list[TeamSpend]:
    """Per team: month-to-date, burn rate and forecast. A past month's forecast is its total."""
    start, end = parse_month(month) if month else month_bounds(now)
    mtd = month_to_date(session, start, team)
    current = start <= now < end
    burn = burn_rate(session, team) if current else {}
    teams = sorted(set(mtd) | {t for t, v in burn.items() if v > 0} | ({team} if team else set()))
    return [
        TeamSpend(
            team=t,
            month=f"{start:%Y-%m}",
            month_to_date_usd=round(mtd.get(t, 0.0), 4),
            burn_rate_usd_per_hour=round(burn.get(t, 0.0), 4),
            forecast_usd=round(
                forecast(mtd.get(t, 0.0), burn.get(t, 0.0), now, end) if current else mtd.get(t, 0.0), 4
            ),
        )
        for t in teams
    ]


def segments(session: Session, month: str | datetime, team: str | None = None) -> list[SpendRecord]:
    """Every segment of a month (FOCUS-like rows for exports), oldest first."""
    start, end = parse_month(month) if isinstance(month, str) else month_bounds(month)
    stmt = select(SpendRecord).where(SpendRecord.start >= start, SpendRecord.start < end)
    if team:
        stmt = stmt.where(SpendRecord.team == team)
    return list(session.scalars(stmt.order_by(SpendRecord.start, SpendRecord.id)))
