"""CLI for what tasks carry: the `enqueue` flags that pack and upload code
(`carry_fields`), and `autoscaler artifacts ID [--download DIR]`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

import typer

from autoscaler.cli import app
from autoscaler.cli.common import HomeOpt, JsonOpt, ServerOpt, TokenOpt, print_json, print_table, sdk_client
from autoscaler.errors import InvalidInput
from autoscaler.sdk import Client
from autoscaler.sdk.remote import git_code, snapshot_code
from autoscaler.workload.snapshot import git_prefix

DEFAULT_CODE_LIMIT = 512 * 1024 * 1024


def carry_fields(
    sdk: Client,
    *,
    code: str | None,
    git: str | None,
    ref: str | None,
    no_git: bool,
    limit_bytes: int,
    team: str | None = None,
) -> dict[str, Any]:
    """The task's `code`: a directory packed and uploaded, or a git repository (from
    `--git`, or from the checkout `--code` is in: its origin, HEAD and uncommitted diff)."""
    for option, value in (("--code", code), ("--git", git)):
        if value is not None and not value.strip():  # an unset shell variable, most likely
            raise InvalidInput(f"{option} is empty: give a {'directory' if option == '--code' else 'repository URL'}")
    if code and git:
        raise InvalidInput("give --code DIR or --git URL, not both")
    if ref and not git:
        raise InvalidInput("--ref goes with --git (with --code inside a checkout, HEAD is used)")
    if git:
        return {"code": {"git": git, "ref": ref, "diff_snapshot": None}}
    if not code:
        return {}
    root = Path(code)
    if not root.is_dir():
        raise InvalidInput(f"--code {code}: not a directory")
    checkout = None if no_git else git_code(sdk, root, limit_bytes, team)
    if checkout is None:
        snapshot = snapshot_code(sdk, root, limit_bytes, team)
        typer.echo(f"code: {root.resolve()} uploaded as {snapshot.digest}", err=True)
        return {"code": snapshot.to_json()}
    typer.echo(
        f"code: {checkout.url} at {checkout.ref[:12]}"
        + (" with the uncommitted diff" if checkout.diff_snapshot else "")
        + " (untracked files are not sent; --no-git packs the directory instead)",
        err=True,
    )
    prefix = git_prefix(root)
    if prefix:
        # The clone's top is the task directory: a command written for DIR would not find its files.
        typer.echo(
            f"code: the task runs at the top of the clone, where {root} is {prefix.rstrip('/')}/: "
            "name paths from the top in the command (or --no-git to send only this directory)",
            err=True,
        )
    return {"code": checkout.to_json()}


@app.command()
def artifacts(
    task_id: Annotated[str, typer.Argument(help="The task.")],
    download: Annotated[
        Path | None, typer.Option("--download", help="Save every artifact (latest attempt of each) into DIR.")
    ] = None,
    server: ServerOpt = None,
    token: TokenOpt = None,
    home: HomeOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """A task's outputs and checkpoints, with sizes and digests; --download saves them."""
    sdk = sdk_client(server, token, home)
    rows: list[dict[str, Any]] = sdk.api.get(f"/api/v1/tasks/{quote(task_id, safe='')}/artifacts")
    if download is None:
        if json_out:
            print_json(rows)
        else:
            gang = any(r.get("rank") is not None for r in rows)
            columns = ["name", "kind", "attempt", *(["rank", "generation"] if gang else []), "size", "digest"]
            print_table(rows, [*columns, "created_at"], title=f"task {task_id}")
        return
    latest: dict[str, dict[str, Any]] = {}
    for row in rows:
        if row["name"] not in latest or row["attempt"] > latest[row["name"]]["attempt"]:
            latest[row["name"]] = row
    target = download.resolve()
    for name, row in sorted(latest.items()):
        dest = (target / name).resolve()
        if not dest.is_relative_to(target):
            typer.echo(f"skipped {name!r}: it would land outside {target}", err=True)
            continue
        saved = sdk.task(task_id).download(name, target)  # the latest attempt's, as listed
        typer.echo(f"{saved} ({saved.stat().st_size} bytes, attempt {row['attempt']})")
