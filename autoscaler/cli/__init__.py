"""The `autoscaler` command line (typer + rich).

Every read command has `--json`. User mistakes (bad config, unknown task, server
unreachable) print one line and exit 1, never a traceback.
"""

from __future__ import annotations

import sys

import typer
from rich.console import Console

from autoscaler.errors import AutoscalerError

app = typer.Typer(
    name="autoscaler",
    help="GPU autoscaler and policy service: elastic queues, budgets, spot and on-demand fleets.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
err = Console(stderr=True)


def _register() -> None:
    # Each command group lives in its own `*_cmds.py` module; importing it adds its
    # commands, so a new area adds a module without touching this file.
    import importlib
    import pkgutil

    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.endswith("_cmds"):
            importlib.import_module(f"{__name__}.{info.name}")


def main() -> None:
    _register()
    try:
        app()
    except AutoscalerError as exc:
        err.print(f"[red]error:[/red] {exc.message}", highlight=False, soft_wrap=True)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
