"""The `autoscaler` command line (typer + rich).

Every read command has `--json`. User mistakes (bad config, unknown task, server
unreachable) print one line and exit 1, never a traceback.
"""

from __future__ import annotations

import sys
from typing import Any

import typer
from rich.console import Console
from rich.text import Text

from autoscaler.errors import AutoscalerError

app = typer.Typer(
    name="autoscaler",
    help="GPU autoscaler and policy service: elastic queues, budgets, spot and on-demand fleets.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
err = Console(stderr=True)


def _hide_flag_types() -> None:
    """typer 0.29 labels every on/off flag `<bool>` in help (even `--help`): a flag
    takes no value, so its row shows none."""
    from typer.core import TyperOption

    shown = getattr(TyperOption, "display_type_rich", None)
    if shown is None:
        return

    def display_type_rich(self: TyperOption, ctx: Any) -> str | None:
        return None if self.is_flag else shown(self, ctx)

    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


_hide_flag_types()


def _register(only: str | None = None) -> None:
    # Each command group lives in its own `*_cmds.py` module; importing it adds its
    # commands, so a new area adds a module without touching this file.
    import importlib
    import pkgutil

    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.endswith("_cmds") and only in (None, info.name):
            importlib.import_module(f"{__name__}.{info.name}")


def _group() -> None:
    """GPU autoscaler and policy service."""


def main() -> None:
    # `autoscaler agent` runs on GPU machines: load only its module so the agent never
    # imports the server (SQLAlchemy, FastAPI) and starts fast.
    if sys.argv[1:2] == ["agent"]:
        _register("agent_cmds")
        app.callback()(_group)  # with a single command loaded, typer would drop the name `agent`
    else:
        _register()
    try:
        app()
    except AutoscalerError as exc:
        # The message may quote what the user typed: printed literally, never as markup.
        err.print(Text.assemble(("error:", "red"), " ", exc.message), highlight=False, soft_wrap=True)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
