"""Spend accounting: priced segments of every instance's life, charged to the team whose
demand caused the launch; month-to-date, burn rate and month-end forecast per team.

`accrue` is called by the reconcile cycle; the read functions (`month_to_date`,
`burn_rate`, `forecast`, `spend_report`, `segments`) serve the policy input, the API
(`GET /api/v1/spend`) and the `autoscaler spend` command.
"""

from autoscaler.ledger.spend import (
    TeamSpend,
    accrue,
    burn_rate,
    forecast,
    month_bounds,
    month_to_date,
    parse_month,
    segments,
    spend_report,
)

__all__ = [
    "TeamSpend",
    "accrue",
    "burn_rate",
    "forecast",
    "month_bounds",
    "month_to_date",
    "parse_month",
    "segments",
    "spend_report",
]
