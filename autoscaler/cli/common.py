"""Options and output helpers shared by the CLI command modules."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from autoscaler.client import ApiClient, resolve_server, resolve_token

out = Console(highlight=False, soft_wrap=True)

ServerOpt = Annotated[str | None, typer.Option("--server", help="API URL (env AUTOSCALER_SERVER).")]
TokenOpt = Annotated[str | None, typer.Option("--token", help="Bearer token (env AUTOSCALER_TOKEN).")]
HomeOpt = Annotated[Path | None, typer.Option("--home", help="Home dir (SQLite file, logs, admin token).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def client(server: str | None, token: str | None, home: Path | None = None) -> ApiClient:
    return ApiClient(resolve_server(server, home), resolve_token(token, home))


def print_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, default=str))


def print_table(rows: list[dict[str, Any]], columns: list[str], title: str | None = None) -> None:
    table = Table(title=title)
    for col in columns:
        table.add_column(col)
    for row in rows:
        table.add_row(*["" if row.get(c) is None else str(row.get(c)) for c in columns])
    out.print(table)
