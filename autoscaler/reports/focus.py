"""FOCUS-shaped cost rows: the column names of the FinOps Open Cost and Usage
Specification where they apply, plus `x_`-prefixed extensions for our own dimensions.

Pure (no database): the server builds the rows, the CLI renders them as a table,
JSON or CSV, and the tests read the CSV back.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

# Column order of the CSV export. The FOCUS names come first, extensions after.
COLUMNS = [
    "BilledCost",
    "EffectiveCost",
    "BillingCurrency",
    "ChargePeriodStart",
    "ChargePeriodEnd",
    "ChargeCategory",
    "ProviderName",
    "ResourceId",
    "ResourceType",
    "RegionId",
    "SkuId",
    "PricingCategory",
    "ConsumedQuantity",
    "ConsumedUnit",
    "ListUnitPrice",
    "Tags",
    "x_Team",
    "x_Pool",
    "x_CapacityType",
    "x_CostKind",
    "x_GpuHours",
]


@dataclass(frozen=True)
class SpendLine:
    """One priced segment: an instance's cost in one month charged to one team, for
    the GPUs its tasks held (`kind="usage"`) or for free capacity (`kind="unused"`).
    `hours` is the machine-hours charged (the segment's cost at the hourly price)."""

    instance_id: str
    team: str
    pool: str
    provider: str
    region: str | None
    instance_type: str
    capacity_type: str
    kind: str
    start: datetime
    end: datetime
    hourly_price: float
    cost_usd: float
    hours: float
    gpu_hours: float


def focus_row(line: SpendLine) -> dict[str, Any]:
    # We bill at the price we recorded, with no discounts applied afterwards, so
    # BilledCost and EffectiveCost are the same figure.
    cost = round(line.cost_usd, 6)
    return {
        "BilledCost": cost,
        "EffectiveCost": cost,
        "BillingCurrency": "USD",
        "ChargePeriodStart": line.start.isoformat(),
        "ChargePeriodEnd": line.end.isoformat(),
        "ChargeCategory": "Usage",
        "ProviderName": line.provider,
        "ResourceId": line.instance_id,
        "ResourceType": "Virtual Machine",
        "RegionId": line.region or "",
        "SkuId": line.instance_type,
        # FOCUS: spot capacity is "Dynamic" pricing, on-demand is "Standard".
        "PricingCategory": "Dynamic" if line.capacity_type == "spot" else "Standard",
        "ConsumedQuantity": round(line.hours, 6),
        "ConsumedUnit": "Hours",
        "ListUnitPrice": line.hourly_price,
        "Tags": json.dumps({"team": line.team, "pool": line.pool, "cost_kind": line.kind}, sort_keys=True),
        "x_Team": line.team,
        "x_Pool": line.pool,
        "x_CapacityType": line.capacity_type,
        "x_CostKind": line.kind,
        "x_GpuHours": round(line.gpu_hours, 6),
    }


def to_csv(rows: Iterable[dict[str, Any]]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: row.get(k, "") for k in COLUMNS})
    return buffer.getvalue()


def from_csv(text: str) -> list[dict[str, Any]]:
    """Read an export back, with the numeric columns as floats."""
    rows = list(csv.DictReader(io.StringIO(text)))
    numeric = ("BilledCost", "EffectiveCost", "ConsumedQuantity", "ListUnitPrice", "x_GpuHours")
    return [{k: float(v) if k in numeric else v for k, v in row.items()} for row in rows]


def total(rows: Iterable[dict[str, Any]]) -> float:
    return sum(float(r["BilledCost"]) for r in rows)
