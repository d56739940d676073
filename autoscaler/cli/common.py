"""Options and output helpers shared by the CLI command modules.

What users typed (commands, env values, queue names, error messages) is printed
literally: `out` has rich markup off, so `[red]` or `[/]` in a command is text, not
a style tag (or a crash). Styling is asked for explicitly with `style=` or `Text`.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from autoscaler.sdk import Client
from autoscaler.sdk.transport import Transport

# Not a terminal (a pipe, a file, a test): rich would assume 80 columns and cut ids and
# timestamps in tables; with no terminal to fit, nothing is cut. COLUMNS still wins.
UNLIMITED_WIDTH = 10_000


def _width() -> int | None:
    if sys.stdout.isatty() or os.environ.get("COLUMNS"):
        return None
    return UNLIMITED_WIDTH


out = Console(highlight=False, soft_wrap=True, markup=False, emoji=False, width=_width())

ServerOpt = Annotated[str | None, typer.Option("--server", help="API URL (env AUTOSCALER_SERVER).")]
TokenOpt = Annotated[str | None, typer.Option("--token", help="Bearer token (env AUTOSCALER_TOKEN).")]
HomeOpt = Annotated[Path | None, typer.Option("--home", help="Home dir (SQLite file, logs, admin token).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def finite(value: float | None) -> float | None:
    """A typer callback for a number option: `nan` and `inf` parse as floats but no
    option means them (an infinite rate or target would hang or crash the run)."""
    if value is not None and not math.isfinite(value):
        raise typer.BadParameter(f"{value} is not a finite number")
    return value


def sdk_client(server: str | None, token: str | None, home: Path | None = None) -> Client:
    """The SDK's client, with server and token resolved as documented in autoscaler.sdk.settings."""
    return Client(server, token, home=home)


def client(server: str | None, token: str | None, home: Path | None = None) -> Transport:
    """The SDK's JSON layer, for the commands that print a reply as the server sent it."""
    return sdk_client(server, token, home).api


def print_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, default=str))


def shell_command(argv: Sequence[str]) -> str:
    """A task's command as a shell line that can be pasted back (`shlex.join`)."""
    return shlex.join(argv)


def _is_id(column: str) -> bool:
    return column == "id" or column.endswith("_id")


MIN_CELL = 8  # the narrowest a wrapped (non-id) column gets before it is dropped


def _fit(columns: list[str], widths: dict[str, int], room: int) -> list[str]:
    """The columns that fit `room` characters with every id whole: the rightmost
    non-id columns are dropped first (each column costs its cell plus 3 for borders)."""
    kept = list(columns)

    def need(cols: list[str]) -> int:
        return 1 + sum(3 + (widths[c] if _is_id(c) else min(widths[c], MIN_CELL)) for c in cols)

    while need(kept) > room and any(not _is_id(c) for c in kept[1:]):
        kept.remove(next(c for c in reversed(kept) if not _is_id(c)))
    return kept


def print_table(rows: list[dict[str, Any]], columns: list[str], title: str | None = None) -> None:
    """A table whose cells are never cut with an ellipsis. Off a terminal it takes the
    width it needs. On a narrow terminal ids stay whole, other cells wrap, and
    columns that do not fit at all are dropped with a note saying which."""
    cells = [["" if row.get(c) is None else str(row.get(c)) for c in columns] for row in rows]
    widths = {c: max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)}
    kept = _fit(columns, widths, out.width)
    table = Table(title=title)
    for col in kept:
        if _is_id(col):
            table.add_column(col, overflow="fold", no_wrap=True, min_width=widths[col])
        else:
            table.add_column(col, overflow="fold")
    for r in cells:
        table.add_row(*[r[columns.index(c)] for c in kept])
    out.print(table)
    if dropped := [c for c in columns if c not in kept]:
        out.print(
            f"({len(dropped)} column(s) left out to fit {out.width} columns: {', '.join(dropped)}; --json has all)"
        )
