"""The FOCUS 1.0 cost and usage export: one row per priced ledger segment, in the
FinOps Open Cost and Usage Specification's columns, plus `x_`-prefixed extensions for
our own dimensions (team, pool, capacity type, cost kind, GPU-hours).

How our model maps onto FOCUS (docs/operations.md has the column-by-column table):

- billing account = this deployment (`deployment:` in autoscaler.yaml);
- sub-account = the team the segment is charged to (`shared` for a pool's free
  capacity charged to no team);
- billing period = the calendar month (UTC) the segment lies in (the ledger splits
  segments at month ends, so a charge period never straddles two billing periods);
- service = the provider's compute service (Amazon EC2, Compute Engine, Virtual
  Machines; "GPU autoscaler compute" for local, Slurm, static and fake pools);
- list cost = the instance type's on-demand price in the pool's configuration times
  the hours (falling back to the price recorded when the pool names none); contracted
  and effective cost = the price the ledger recorded (the spot or on-demand price) times
  the hours: no negotiated discounts nor commitments exist in our model, so the
  CommitmentDiscount* columns are null and BilledCost = EffectiveCost = ContractedCost.

Pure (no database): the server builds the rows, the CLI renders them as a table, JSON,
CSV or Parquet (when pyarrow is installed), and the tests read the CSV back.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from autoscaler.ledger.period import month_bounds

FOCUS_VERSION = "1.0"

# Column order of the export: the FOCUS 1.0 columns (alphabetical, as the specification
# lists them), then our extensions.
FOCUS_COLUMNS = [
    "AvailabilityZone",
    "BilledCost",
    "BillingAccountId",
    "BillingAccountName",
    "BillingCurrency",
    "BillingPeriodEnd",
    "BillingPeriodStart",
    "ChargeCategory",
    "ChargeClass",
    "ChargeDescription",
    "ChargeFrequency",
    "ChargePeriodEnd",
    "ChargePeriodStart",
    "CommitmentDiscountCategory",
    "CommitmentDiscountId",
    "CommitmentDiscountName",
    "CommitmentDiscountStatus",
    "CommitmentDiscountType",
    "ConsumedQuantity",
    "ConsumedUnit",
    "ContractedCost",
    "ContractedUnitPrice",
    "EffectiveCost",
    "InvoiceIssuerName",
    "ListCost",
    "ListUnitPrice",
    "PricingCategory",
    "PricingQuantity",
    "PricingUnit",
    "ProviderName",
    "PublisherName",
    "RegionId",
    "RegionName",
    "ResourceId",
    "ResourceName",
    "ResourceType",
    "ServiceCategory",
    "ServiceName",
    "SkuId",
    "SkuPriceId",
    "SubAccountId",
    "SubAccountName",
    "Tags",
]
EXTENSION_COLUMNS = [
    "x_Team",
    "x_Pool",
    "x_CapacityType",
    "x_CostKind",
    "x_GpuHours",
    "x_InstanceType",
]
# focus-validator 1.0.0, the FinOps Foundation's validator for FOCUS 1.0, still checks
# five names from the specification's drafts: `ChargeType` (1.0: ChargeCategory),
# `InvoiceIssuer` (InvoiceIssuerName), `Provider` (ProviderName), `Publisher`
# (PublisherName) and `ResourceID` (ResourceId). The export carries them too, with the
# same values as their 1.0 columns, so the official validator passes and FOCUS tools
# that read the 1.0 names find them; a tool that wants strictly the 1.0 set drops them
# (`spend --format focus --strict`).
LEGACY_ALIASES = {
    "ChargeType": "ChargeCategory",
    "InvoiceIssuer": "InvoiceIssuerName",
    "Provider": "ProviderName",
    "Publisher": "PublisherName",
    "ResourceID": "ResourceId",
}
COLUMNS = [*FOCUS_COLUMNS, *LEGACY_ALIASES, *EXTENSION_COLUMNS]
STRICT_COLUMNS = [*FOCUS_COLUMNS, *EXTENSION_COLUMNS]

# Decimal columns (floats in JSON and Parquet, plain decimals in the CSV).
DECIMAL_COLUMNS = (
    "BilledCost",
    "ConsumedQuantity",
    "ContractedCost",
    "ContractedUnitPrice",
    "EffectiveCost",
    "ListCost",
    "ListUnitPrice",
    "PricingQuantity",
    "x_GpuHours",
)
DATETIME_COLUMNS = ("BillingPeriodEnd", "BillingPeriodStart", "ChargePeriodEnd", "ChargePeriodStart")

# provider kind -> (ProviderName, ServiceName). Clouds by their FOCUS names; the pools
# that run on our own machines (or none) are served by the autoscaler itself.
_SELF_SERVICE = "GPU autoscaler compute"
PROVIDERS: dict[str, tuple[str, str]] = {
    "aws": ("AWS", "Amazon Elastic Compute Cloud"),
    "gcp": ("Google Cloud", "Compute Engine"),
    "azure": ("Microsoft", "Virtual Machines"),
    "slurm": ("Slurm", _SELF_SERVICE),
    "static": ("On-premises", _SELF_SERVICE),
    "local": ("Local", _SELF_SERVICE),
    "fake": ("Fake cloud", _SELF_SERVICE),
}


@dataclass(frozen=True)
class SpendLine:
    """One priced segment: an instance's cost in one month charged to one team, for
    the GPUs its tasks held (`kind="usage"`) or for free capacity (`kind="unused"`).
    `hours` is the machine-hours charged (the segment's cost at the hourly price).
    `list_price` is the on-demand price per hour of the instance type (None: unknown,
    the recorded price is used)."""

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
    list_price: float | None = None


def focus_datetime(at: datetime) -> str:
    """FOCUS date/time format: ISO 8601 in UTC with a `Z` (2026-03-01T00:00:00Z)."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _provider(kind: str) -> tuple[str, str]:
    return PROVIDERS.get(kind, (kind, _SELF_SERVICE))


def focus_row(line: SpendLine, *, deployment: str = "autoscaler") -> dict[str, Any]:
    """The FOCUS 1.0 row of one segment; `deployment` names the billing account."""
    period_start, period_end = month_bounds(line.start)
    provider_name, service_name = _provider(line.provider)
    cost = round(float(line.cost_usd), 6)
    price = float(line.hourly_price)
    list_price = price if line.list_price is None else float(line.list_price)
    quantity = round(float(line.hours), 6)
    capacity = "spot" if line.capacity_type == "spot" else "on-demand"
    what = (
        f"GPU time held by team {line.team}'s tasks"
        if line.kind == "usage"
        else f"free capacity charged to {line.team}"
    )
    region = line.region or None
    row: dict[str, Any] = {
        "AvailabilityZone": None,
        # We bill at the price we recorded, with no discounts applied afterwards, so
        # billed, effective and contracted cost are the same figure.
        "BilledCost": cost,
        "BillingAccountId": deployment,
        "BillingAccountName": deployment,
        "BillingCurrency": "USD",
        "BillingPeriodEnd": focus_datetime(period_end),
        "BillingPeriodStart": focus_datetime(period_start),
        "ChargeCategory": "Usage",
        "ChargeClass": None,  # null: a regular charge, not a correction
        "ChargeDescription": f"{line.instance_type} {capacity} in pool {line.pool}: {what}",
        "ChargeFrequency": "Usage-Based",
        "ChargePeriodEnd": focus_datetime(line.end),
        "ChargePeriodStart": focus_datetime(line.start),
        "CommitmentDiscountCategory": None,
        "CommitmentDiscountId": None,
        "CommitmentDiscountName": None,
        "CommitmentDiscountStatus": None,
        "CommitmentDiscountType": None,
        "ConsumedQuantity": quantity,
        "ConsumedUnit": "Hours",
        "ContractedCost": cost,
        "ContractedUnitPrice": price,
        "EffectiveCost": cost,
        "InvoiceIssuerName": provider_name,
        "ListCost": round(list_price * float(line.hours), 6),
        "ListUnitPrice": list_price,
        # FOCUS: spot capacity is "Dynamic" pricing, on-demand is "Standard".
        "PricingCategory": "Dynamic" if line.capacity_type == "spot" else "Standard",
        "PricingQuantity": quantity,
        "PricingUnit": "Hours",
        "ProviderName": provider_name,
        "PublisherName": provider_name,
        "RegionId": region,
        "RegionName": region,
        "ResourceId": line.instance_id,
        "ResourceName": line.instance_id,
        "ResourceType": "Virtual Machine",
        "ServiceCategory": "Compute",
        "ServiceName": service_name,
        "SkuId": line.instance_type,
        "SkuPriceId": f"{line.instance_type}/{line.capacity_type}/{line.region or '-'}",
        "SubAccountId": line.team,
        "SubAccountName": line.team,
        "Tags": json.dumps({"team": line.team, "pool": line.pool, "cost_kind": line.kind}, sort_keys=True),
        "x_Team": line.team,
        "x_Pool": line.pool,
        "x_CapacityType": line.capacity_type,
        "x_CostKind": line.kind,
        "x_GpuHours": round(line.gpu_hours, 6),
        "x_InstanceType": line.instance_type,
    }
    for alias, column in LEGACY_ALIASES.items():
        row[alias] = row[column]
    return {k: row[k] for k in COLUMNS}


def _cell(value: Any) -> Any:
    return "" if value is None else value


def columns(strict: bool = False) -> list[str]:
    """The export's columns: all of them, or (`strict`) without the legacy aliases."""
    return STRICT_COLUMNS if strict else COLUMNS


def to_csv(rows: Iterable[Mapping[str, Any]], *, strict: bool = False) -> str:
    """The export as CSV: a header of the columns, null as an empty field."""
    names = columns(strict)
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=names, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: _cell(row.get(k)) for k in names})
    return buffer.getvalue()


def from_csv(text: str) -> list[dict[str, Any]]:
    """Read an export back: decimal columns as floats, empty fields as None."""
    out = []
    for row in csv.DictReader(io.StringIO(text)):
        out.append({k: None if v == "" else float(v) if k in DECIMAL_COLUMNS else v for k, v in row.items()})
    return out


class ParquetUnavailable(RuntimeError):
    """Parquet needs pyarrow, which is not installed."""


def to_parquet(rows: Iterable[Mapping[str, Any]], path: Path, *, strict: bool = False) -> None:
    """The export as Parquet: decimals as float64, date/times as UTC timestamps, the
    rest as strings (nullable). Needs pyarrow (`pip install pyarrow`)."""
    try:
        import pyarrow as pa  # type: ignore[import-not-found, unused-ignore]
        import pyarrow.parquet as pq  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        raise ParquetUnavailable(
            "Parquet output needs pyarrow: pip install pyarrow (or write CSV: --output FILE.csv)"
        ) from None
    rows = list(rows)
    names = columns(strict)
    fields = []
    for name in names:
        if name in DECIMAL_COLUMNS:
            fields.append(pa.field(name, pa.float64()))
        elif name in DATETIME_COLUMNS:
            fields.append(pa.field(name, pa.timestamp("ms", tz="UTC")))
        else:
            fields.append(pa.field(name, pa.string()))
    schema = pa.schema(fields)

    def value(name: str, v: Any) -> Any:
        if v is None or name not in DATETIME_COLUMNS:
            return v
        return datetime.strptime(str(v), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)

    data = {name: [value(name, r.get(name)) for r in rows] for name in names}
    pq.write_table(pa.table(data, schema=schema), str(path))


def total(rows: Iterable[Mapping[str, Any]]) -> float:
    return sum(float(r["BilledCost"]) for r in rows)
