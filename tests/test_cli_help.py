"""Every command's help at 80 columns (a default terminal) shows every option name
whole: rich cut long ones to fit (`--secret-env-from-fi…`, `--expected-runtime-k…`)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import typer
from typer.core import TyperGroup, TyperOption
from typer.testing import CliRunner

import autoscaler.cli as cli


def _commands() -> Iterator[tuple[list[str], Any]]:
    """(the words that name it, the command) for every command and subcommand."""
    cli._register()
    root = typer.main.get_command(cli.app)
    assert isinstance(root, TyperGroup)
    stack: list[tuple[list[str], Any]] = [([name], cmd) for name, cmd in root.commands.items()]
    while stack:
        path, command = stack.pop()
        yield path, command
        if isinstance(command, TyperGroup):
            stack += [([*path, name], sub) for name, sub in command.commands.items()]


COMMANDS = sorted(_commands(), key=lambda c: c[0])


def _option_names(command: Any) -> list[str]:
    return [
        name
        for param in command.params
        if isinstance(param, TyperOption) and not param.hidden
        for name in (*param.opts, *param.secondary_opts)
        if name.startswith("--")
    ]


def test_the_walk_finds_the_commands_that_were_cut() -> None:
    named = {" ".join(path): command for path, command in COMMANDS}
    assert "--secret-env-from-file" in _option_names(named["enqueue"])
    assert "--expected-runtime-known" in _option_names(named["simulate"])
    assert "policy check" in named and "secret-key rotate" in named


@pytest.mark.parametrize("path,command", COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_every_option_name_is_whole_at_80_columns(path: list[str], command: Any) -> None:
    r = CliRunner().invoke(cli.app, [*path, "--help"], prog_name="autoscaler", env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    assert max(len(line) for line in r.output.splitlines()) <= 80, r.output
    for name in _option_names(command):
        # Whole: followed by a space, a comma or the table's edge, not by "…" or more of a name.
        assert re.search(rf"(?<![\w-]){re.escape(name)}(?=[ ,│])", r.output), f"{name} is cut:\n{r.output}"
    assert not re.search(r"--[\w-]*…", r.output), r.output
    # Nor any word of the help text (`(capacity.wait_targ…`, a key too long to wrap).
    assert "…" not in r.output, r.output
