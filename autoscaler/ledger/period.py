"""Billing periods: calendar months in UTC. The one place month bounds are computed
(ledger, reports, policy input, dashboard, `/metrics`, CLI and simulator use it)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime

from autoscaler.errors import InvalidInput

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


def month_of(at: datetime) -> str:
    """`YYYY-MM` of the month containing `at` (UTC)."""
    return f"{at.astimezone(UTC):%Y-%m}"


def months(start: datetime, end: datetime) -> Iterator[tuple[datetime, datetime]]:
    """[start, end) cut at month boundaries."""
    cur = start
    while cur < end:
        _, nxt = month_bounds(cur)
        yield cur, min(nxt, end)
        cur = nxt


def hours_between(start: datetime, end: datetime) -> float:
    return max(0.0, (end - start).total_seconds() / 3600.0)
