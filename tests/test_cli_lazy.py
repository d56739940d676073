"""The CLI imports only the typed command's module; `--help` imports none and still
lists every command with the help its module gives it."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

import autoscaler.cli as cli

PY = sys.executable
WIDE = {**os.environ, "COLUMNS": "120"}


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "autoscaler", *args], capture_output=True, text=True, env=WIDE, timeout=60)


def _loaded_after(*argv: str) -> list[str]:
    """The command modules (and heavy libraries) a run of `autoscaler ARGV` imported."""
    code = (
        f"import sys; sys.argv = ['autoscaler', *{list(argv)!r}]\n"
        "import autoscaler.cli as cli\n"
        "try:\n    cli.main()\nexcept SystemExit:\n    pass\n"
        "heavy = ('sqlalchemy', 'fastapi', 'autoscaler.policy')\n"
        "names = [m for m in sys.modules if m.startswith('autoscaler.cli.') or m in heavy]\n"
        "print(' '.join(sorted(names)), file=sys.stderr)"
    )
    r = subprocess.run([PY, "-c", code], capture_output=True, text=True, env=WIDE, timeout=60)
    return r.stderr.split()


def _real_commands() -> dict[str, tuple[str, str]]:
    """name -> (module, first help paragraph) as the command modules define them."""
    cli._register()
    found: dict[str, tuple[str, str]] = {}
    for info in cli.app.registered_commands:
        assert info.callback is not None
        name = info.name or info.callback.__name__.replace("_", "-")
        found[name] = (info.callback.__module__, inspect.getdoc(info.callback) or "")
    for group in cli.app.registered_groups:
        sub = group.typer_instance
        assert group.name is not None and sub is not None and sub.registered_commands
        first = sub.registered_commands[0].callback
        assert first is not None
        found[group.name] = (first.__module__, str(sub.info.help))
    return {n: (m.rsplit(".", 1)[1], doc.split("\n\n")[0].replace("\n", " ")) for n, (m, doc) in found.items()}


def test_the_command_table_matches_the_command_modules() -> None:
    real = _real_commands()
    assert set(cli.COMMANDS) == set(real), "add (or drop) the command's row in autoscaler/cli/__init__.py COMMANDS"
    for name, row in cli.COMMANDS.items():
        assert row == real[name], f"COMMANDS[{name!r}] is {row}, its module says {real[name]}"


def test_help_lists_every_command_as_with_all_modules_loaded() -> None:
    cli._register()
    # The root help rendered in-process with every module imported, as the CLI did before.
    runner = CliRunner()
    full = runner.invoke(cli.app, ["--help"], prog_name="autoscaler", env={"COLUMNS": "120"})
    lazy = subprocess.run(
        [PY, "-c", "import sys; sys.argv = ['autoscaler', '--help']; import autoscaler.cli as c; c.main()"],
        capture_output=True,
        text=True,
        env=WIDE,
        timeout=60,
    )
    assert lazy.returncode == 0 and full.exit_code == 0
    assert lazy.stdout == full.stdout
    assert all(f" {name} " in lazy.stdout for name in cli.COMMANDS)


def test_help_and_a_command_import_only_what_they_need() -> None:
    assert _loaded_after("--help") == []
    assert _loaded_after() == []  # no arguments: the help
    explain = _loaded_after("explain", "--help")
    assert explain == ["autoscaler.cli.common", "autoscaler.cli.reconcile_cmds"]
    assert "sqlalchemy" not in _loaded_after("tasks", "--help")


def test_a_named_command_runs_the_real_command_not_its_listing_row() -> None:
    r = _run("explain", "--help")
    assert r.returncode == 0 and "Usage: autoscaler explain [OPTIONS]" in r.stdout.replace("python -m ", "")
    assert "--cycle" in r.stdout  # the real command's options, not a bare row
    group = _run("policy")
    assert "check" in group.stdout  # a group with no subcommand shows its subcommands


def test_an_unknown_command_says_so_and_suggests_the_near_one() -> None:
    r = _run("queus")
    assert r.returncode == 2 and "No such command 'queus'" in r.stderr and "Did you mean 'queues'" in r.stderr
    assert "Traceback" not in r.stderr
    r = _run("--server", "http://x", "tasks")  # the root takes no options: said, not run half-way
    assert r.returncode == 2 and "No such option: --server" in r.stderr


def test_in_process_runs_leave_the_app_with_only_real_commands(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The fuzz tests and the SDK call main() in this process, then use `app` with every
    # module loaded: a listing row left on `app` would shadow the real command.
    for argv in (["--help"], ["queus"], []):
        with pytest.raises(SystemExit):
            monkeypatch.setattr(sys, "argv", ["autoscaler", *argv])
            cli.main()
    capsys.readouterr()
    cli._register()
    callbacks = [c.callback for c in cli.app.registered_commands]
    assert all(f is not None and f.__module__.endswith("_cmds") for f in callbacks), callbacks
