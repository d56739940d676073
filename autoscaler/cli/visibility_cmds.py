"""CLI views for people: `autoscaler spend` (a month's spend as a table, JSON, or a
FOCUS 1.0 export in CSV or Parquet) and `autoscaler top` (a live terminal view of queues
and the fleet)."""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from rich.console import Group
from rich.live import Live
from rich.table import Table

from autoscaler.cli import app
from autoscaler.cli.common import HomeOpt, ServerOpt, TokenOpt, client, out, print_json
from autoscaler.ledger.period import parse_month
from autoscaler.reports.focus import ParquetUnavailable, to_csv, to_parquet
from autoscaler.sdk.transport import Transport

Format = Literal["table", "json", "csv", "focus"]


def _spend_table(report: dict[str, Any]) -> Table:
    """Rows grouped by team, pool, instance type and capacity type, with a total."""
    groups: dict[tuple[str, str, str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for row in report["rows"]:
        key = (row["x_Team"], row["x_Pool"], row["SkuId"], row["x_CapacityType"])
        groups[key][0] += float(row["ConsumedQuantity"])
        groups[key][1] += float(row["BilledCost"])
    table = Table(title=f"Spend {report['month']}" + (f" · team {report['team']}" if report.get("team") else ""))
    for col, justify in (
        ("team", "left"),
        ("pool", "left"),
        ("instance type", "left"),
        ("capacity", "left"),
        ("hours", "right"),
        ("cost (USD)", "right"),
    ):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for (team, pool, sku, capacity), (hours, cost) in sorted(groups.items()):
        table.add_row(team, pool, sku, capacity, f"{hours:,.2f}", f"{cost:,.2f}")
    table.add_section()
    table.add_row("total", "", "", "", "", f"{float(report['total_usd']):,.2f}")
    return table


@app.command()
def spend(
    month: Annotated[str | None, typer.Option("--month", help="YYYY-MM (default: this month, UTC).")] = None,
    format: Annotated[
        Format,
        typer.Option(
            "--format",
            "-f",
            help="table, json, or focus: the FOCUS 1.0 export (CSV; Parquet when --output ends in "
            ".parquet and pyarrow is installed). csv is the same CSV as focus.",
        ),
    ] = "table",
    team: Annotated[str | None, typer.Option("--team", help="Admins: one team only.")] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write to this file.")] = None,
    strict: Annotated[
        bool,
        typer.Option("--strict", help="focus/csv: only FOCUS 1.0 and x_ columns (drop the legacy aliases)."),
    ] = False,
    server: ServerOpt = None,
    token: TokenOpt = None,
    home: HomeOpt = None,
) -> None:
    """A month's spend per instance segment: table, JSON, or a FOCUS 1.0 export."""
    if month is not None:
        parse_month(month)  # a malformed month fails here, before any request
    parquet = output is not None and output.suffix.lower() == ".parquet"
    if parquet and format not in ("focus", "csv"):
        raise typer.BadParameter("a .parquet output needs --format focus", param_hint="--output")
    report = client(server, token, home).get("/api/v1/reports/spend", month=month, team=team)
    if format == "table":
        out.print(_spend_table(report))
        return
    summary = f"{len(report['rows'])} rows ({report['total_usd']:.2f} USD)"
    if parquet:
        assert output is not None
        try:
            to_parquet(report["rows"], output, strict=strict)
        except ParquetUnavailable as exc:
            raise typer.BadParameter(str(exc), param_hint="--output") from None
        out.print(f"wrote {summary} to {output} (FOCUS {report.get('focus_version', '1.0')}, Parquet)")
        return
    text = json.dumps(report, indent=2) + "\n" if format == "json" else to_csv(report["rows"], strict=strict)
    if output is not None:
        output.write_text(text)
        out.print(f"wrote {summary} to {output}")
    elif format == "json":
        print_json(report)
    else:
        typer.echo(text, nl=False)


def top_view(api: Transport) -> Group:
    """One frame of `top`: queues, then the fleet by provider/pool/capacity type/state."""
    queues = api.get("/api/v1/queues")
    instances = api.get("/api/v1/instances")
    qt = Table(title="Queues")
    for col in ("queue", "waiting", "oldest wait", "running"):
        qt.add_column(col, justify="left" if col == "queue" else "right")
    for q in queues:
        wait = q.get("oldest_wait_s")
        qt.add_row(q["name"], str(q["depth"]), "-" if wait is None else f"{wait:,.0f}s", str(q["running"]))
    counts: dict[tuple[str, str, str, str], int] = defaultdict(int)
    price: dict[tuple[str, str, str, str], float] = defaultdict(float)
    for i in instances:
        key = (i["provider"], i["pool"], i["capacity_type"], i["state"])
        counts[key] += 1
        price[key] += float(i.get("hourly_price") or 0.0)
    ft = Table(title="Fleet")
    for col in ("provider", "pool", "capacity", "state", "instances", "USD/h"):
        ft.add_column(col, justify="right" if col in ("instances", "USD/h") else "left")
    for key in sorted(counts):
        ft.add_row(*key, str(counts[key]), f"{price[key]:,.2f}")
    if not counts:
        ft.add_row("-", "-", "-", "-", "0", "0.00")
    return Group(qt, ft)


@app.command()
def top(
    interval: Annotated[float, typer.Option("--interval", min=0.5, help="Seconds between refreshes.")] = 2.0,
    once: Annotated[bool, typer.Option("--once", help="Print one frame and exit.")] = False,
    server: ServerOpt = None,
    token: TokenOpt = None,
    home: HomeOpt = None,
) -> None:
    """A live view of queues and the fleet (Ctrl-C to quit)."""
    api = client(server, token, home)
    if once:
        out.print(top_view(api))
        return
    with Live(top_view(api), console=out, refresh_per_second=4, screen=False) as live:
        while True:
            time.sleep(interval)
            live.update(top_view(api))
