"""The ledger: exact attribution of every machine's cost to the teams whose tasks held
its GPUs (the rest to the launching team or "shared"), month-to-date, burn rate and
month-end forecast per team, and each task's own cost.

`accrue` is called by the reconcile cycle; the read functions (`month_to_date`,
`burn_rate`, `figures`, `spend_report`, `segments`, `by_month`) serve the policy input,
the dashboard, `/metrics`, the API (`GET /api/v1/spend`, `GET /api/v1/reports/spend`),
the `autoscaler spend` command and the simulator's report. Billing periods (calendar
months, UTC) come from `autoscaler.ledger.period`.
"""

from autoscaler.ledger.period import month_bounds, month_of, parse_month
from autoscaler.ledger.spend import (
    BILLED_STATES,
    SHARED_TEAM,
    Figures,
    TeamSpend,
    accrue,
    burn_rate,
    by_month,
    figures,
    forecast,
    month_to_date,
    segments,
    shared_pools,
    spend_report,
    split,
)

__all__ = [
    "BILLED_STATES",
    "SHARED_TEAM",
    "Figures",
    "TeamSpend",
    "accrue",
    "burn_rate",
    "by_month",
    "figures",
    "forecast",
    "month_bounds",
    "month_of",
    "month_to_date",
    "parse_month",
    "segments",
    "shared_pools",
    "spend_report",
    "split",
]
