"""CLI for what tasks carry: the `enqueue` flags that pack and upload code
(`carry_fields`), and `autoscaler artifacts ID [--download DIR]`."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer

from autoscaler.cli import app
from autoscaler.cli.common import HomeOpt, JsonOpt, ServerOpt, TokenOpt, print_json, print_table, sdk_client
from autoscaler.errors import InvalidInput
from autoscaler.sdk import Client
from autoscaler.sdk.errors import SdkError
from autoscaler.workload.snapshot import PackedSnapshot, git_state, pack_directory

DEFAULT_CODE_LIMIT = 512 * 1024 * 1024


def _upload(sdk: Client, packed: PackedSnapshot) -> str:
    try:
        answer = sdk.upload_snapshot(packed.path)
    finally:
        packed.path.unlink(missing_ok=True)
    if answer.digest != packed.digest:
        raise SdkError(
            f"the server stored {answer.digest} but {packed.digest} was sent: the upload was "
            "damaged on the way; enqueue again"
        )
    return packed.digest


def carry_fields(
    sdk: Client,
    *,
    code: str | None,
    git: str | None,
    ref: str | None,
    no_git: bool,
    limit_bytes: int,
) -> dict[str, Any]:
    """The task's `code`: a directory packed and uploaded, or a git repository (from
    `--git`, or from the checkout `--code` is in: its origin, HEAD and uncommitted diff)."""
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
    state = None if no_git else git_state(root)
    if state is None:
        digest = _upload(sdk, pack_directory(root, limit_bytes=limit_bytes))
        typer.echo(f"code: {root.resolve()} uploaded as {digest}", err=True)
        return {"code": {"snapshot": digest}}
    diff_digest = None
    if state.diff:
        with tempfile.TemporaryDirectory(prefix="autoscaler-diff-") as tmp:
            (Path(tmp) / "diff.patch").write_bytes(state.diff)
            diff_digest = _upload(sdk, pack_directory(Path(tmp), limit_bytes=limit_bytes, honour_gitignore=False))
    typer.echo(
        f"code: {state.url} at {state.commit[:12]}"
        + (" with the uncommitted diff" if diff_digest else "")
        + " (untracked files are not sent; --no-git packs the directory instead)",
        err=True,
    )
    return {"code": {"git": state.url, "ref": state.commit, "diff_snapshot": diff_digest}}


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
    rows: list[dict[str, Any]] = sdk.api.get(f"/api/v1/tasks/{task_id}/artifacts")
    if download is None:
        if json_out:
            print_json(rows)
        else:
            print_table(rows, ["name", "kind", "attempt", "size", "digest", "created_at"], title=f"task {task_id}")
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
