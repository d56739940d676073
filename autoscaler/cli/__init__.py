"""The `autoscaler` command line (typer + rich).

Every read command has `--json`. User mistakes (bad config, unknown task, server
unreachable) print one line and exit 1, never a traceback.

Start-up imports only the module of the command that was typed: the command modules
between them import the server, the policy engine and the SDK (about 2 s of CPU),
and a CLI run needs one of them. `COMMANDS` names each command's module and the
one-line help `autoscaler --help` lists, so the listing imports none of them
(tests/test_cli_lazy.py checks the table against the modules).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import typer
from rich.console import Console
from rich.text import Text

from autoscaler.errors import AutoscalerError


def _root() -> typer.Typer:
    return typer.Typer(
        name="autoscaler",
        help="GPU autoscaler and policy service: elastic queues, budgets, spot and on-demand fleets.",
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        add_completion=False,
    )


app = _root()  # the command modules add their commands to it when imported
err = Console(stderr=True)

# name -> (module under autoscaler.cli, its one-line help), in the order `--help` lists
# them. A command added to a `*_cmds` module needs its row here; the test says which.
COMMANDS: dict[str, tuple[str, str]] = {
    "agent": ("agent_cmds", "Run the agent: register, lease and run tasks, drain on SIGTERM or a spot notice."),
    "artifacts": ("artifact_cmds", "A task's outputs and checkpoints, with sizes and digests; --download saves them."),
    "enqueue": ("client_cmds", "Enqueue a task: `autoscaler enqueue --queue gpu --gpus 1 -- python train.py`."),
    "tasks": ("client_cmds", "List tasks, newest first."),
    "logs": ("client_cmds", "Print a task's output."),
    "cancel": ("client_cmds", "Cancel a task: removed if queued, stopped by its worker if running."),
    "queues": ("client_cmds", "List queues with depth, running tasks and oldest wait."),
    "workers": ("client_cmds", "List workers (admin)."),
    "instances": ("client_cmds", "List instances this deployment launched."),
    "explain": (
        "reconcile_cmds",
        "Why the last reconcile cycle launched, held or terminated (a team token: its team's part only).",
    ),
    "server": ("server_cmds", "Run the API server only (housekeeping included, no reconciler)."),
    "up": ("server_cmds", "Run the whole control plane on this machine (what `make run` starts)."),
    "simulate": ("sim_cmds", "Replay a GPU cluster trace through the real planner, policy and reconciler."),
    "spend": ("visibility_cmds", "A month's spend per instance segment: table, JSON, or a FOCUS 1.0 export."),
    "top": ("visibility_cmds", "A live view of queues and the fleet (Ctrl-C to quit)."),
    "alerts": (
        "alerts_cmds",
        "Alerts (budget thresholds, hard-budget freezes and drains, pools in backoff, machines that never "
        "registered, policy fail-safe) and their delivery to each channel.",
    ),
    "task": ("client_cmds", "Inspect one task."),
    "token": ("client_cmds", "Create tokens (admin)."),
    "policy": ("policy_cmds", "Check, test and evaluate Rego policies."),
    "db": ("server_cmds", "Database schema."),
    "secret-key": ("server_cmds", "The key file sealing task secret_env (server side)."),
}


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


def _keep_option_names_whole() -> None:
    """Option names are never cut in help. typer's options table gives rich no column
    settings, so on a narrow screen (80 columns) rich shrinks every column to fit and
    cuts a long name with an ellipsis (`--secret-env-from-fi…`) when the type or help
    column is wide. Here the name columns (all but the last two of a row: the type and
    the help) never wrap, so the type and help columns give up the room. typer imports
    its rich help module only to print help, so the change is made then: start-up
    imports nothing more (tests/test_cli_help.py renders every command at 80 columns)."""
    from typer.core import TyperCommand, TyperGroup

    def install() -> None:
        from rich.table import Table
        from typer import rich_utils

        base = getattr(rich_utils, "Table", None)
        if base is not Table:  # already installed, or a typer whose help is laid out otherwise
            return

        from rich.columns import Columns
        from rich.text import Text

        class OptionsTable(Table):
            def add_row(self, *renderables: Any, **kwargs: Any) -> None:
                # Only typer's options table arrives with no columns (its commands
                # table declares its own): [required,] long, short, --no-long, -no-short, type, help.
                if not self.columns and len(renderables) > 2:
                    for _ in renderables[:-2]:
                        self.add_column(no_wrap=True)
                    self.add_column()
                    self.add_column(overflow="fold")
                cell = renderables[-1] if renderables else None
                items = list(cell.renderables) if isinstance(cell, Columns) else []
                parts = [r for r in items if isinstance(r, Text)]
                if parts and len(parts) == len(items):
                    # typer lays the help's parts out as rich Columns, whose own grid
                    # cuts a word too long for the cell (an env var's name, a default
                    # path) with "…"; as one text it folds onto the next line instead.
                    joined = Text(" ").join(parts)
                    joined.overflow = "fold"
                    renderables = (*renderables[:-1], joined)
                super().add_row(*renderables, **kwargs)

        rich_utils.Table = OptionsTable  # type: ignore[attr-defined]

    for command_class in (TyperCommand, TyperGroup):
        formatted = command_class.format_help

        def format_help(self: Any, ctx: Any, formatter: Any, formatted: Any = formatted) -> None:
            install()
            formatted(self, ctx, formatter)

        command_class.format_help = format_help  # type: ignore[method-assign]


_keep_option_names_whole()


def _register(only: str | None = None) -> None:
    """Import the command modules (all of them, or `only`): importing one adds its commands."""
    import importlib

    for module in sorted({m for m, _ in COMMANDS.values()}):
        if only in (None, module):
            importlib.import_module(f"{__name__}.{module}")


def _group() -> None:
    """GPU autoscaler and policy service."""


def _listing_only() -> None:
    """A row of the command listing; main() runs the real command whenever it is named."""


def _listing() -> typer.Typer:
    """The root that `autoscaler`, `autoscaler --help` and a typo get: each command a row
    with its help, so the listing and click's "did you mean" need no command module. A
    root of its own: `app` (which in-process callers and tests also use) never gets
    these rows."""
    listing = _root()
    for name, (_, help_line) in COMMANDS.items():
        listing.command(name=name, help=help_line)(_listing_only)
    return listing


def _load(argv: Sequence[str]) -> typer.Typer:
    """The root to run for `argv`: `app` with the named command's module loaded, or the listing."""
    # The root has no options but --help, so a command, when there is one, comes first.
    named = COMMANDS.get(argv[0]) if argv else None
    if named is None:
        return _listing()
    _register(named[0])
    app.callback()(_group)  # with a single command loaded, typer would drop its name
    return app


def main() -> None:
    # `autoscaler agent` runs on GPU machines: its module alone is loaded, so the agent
    # never imports the server (SQLAlchemy, FastAPI) and starts fast.
    root = _load(sys.argv[1:])
    try:
        root()
    except AutoscalerError as exc:
        # The message may quote what the user typed: printed literally, never as markup.
        err.print(Text.assemble(("error:", "red"), " ", exc.message), highlight=False, soft_wrap=True)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
