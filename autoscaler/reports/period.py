"""Billing periods: calendar months in UTC, parsed from `YYYY-MM` with a clear error."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from autoscaler.errors import InvalidInput

_MONTH = re.compile(r"^(\d{4})-(\d{2})$")


def month_bounds(month: str) -> tuple[datetime, datetime]:
    """`"2026-03"` -> (2026-03-01T00:00Z, 2026-04-01T00:00Z)."""
    match = _MONTH.match(month.strip())
    if not match or not 1 <= int(match.group(2)) <= 12 or int(match.group(1)) < 1970:
        raise InvalidInput(f"invalid month {month!r}: expected YYYY-MM, e.g. 2026-03")
    year, mon = int(match.group(1)), int(match.group(2))
    start = datetime(year, mon, 1, tzinfo=UTC)
    end = datetime(year + 1, 1, 1, tzinfo=UTC) if mon == 12 else datetime(year, mon + 1, 1, tzinfo=UTC)
    return start, end


def month_of(at: datetime) -> str:
    return f"{at.astimezone(UTC):%Y-%m}"


def hours_between(start: datetime, end: datetime) -> float:
    return max(0.0, (end - start).total_seconds() / 3600.0)
