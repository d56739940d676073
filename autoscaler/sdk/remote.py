"""`run_remotely(...)`: one call at the top of a script sends the script to a GPU worker.

On the submitting side it enqueues the same script with the same arguments, prints
the task id and exits; on a worker (the agent sets AUTOSCALER_TASK_ID for every task)
it returns and the script carries on. How the worker gets the code is `code=`:

- "path": the worker reaches the script's directory at the same path (the local
  provider of `make run`, a shared filesystem, an NFS home); nothing is copied and the
  same interpreter (`sys.executable`) runs it.
- "snapshot": the directory is packed (honouring .gitignore) and uploaded to the
  server's snapshot store; the worker unpacks it.
- "git": the worker checks out the directory's git remote at its current commit.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NoReturn, Unpack

from autoscaler.errors import AutoscalerError
from autoscaler.sdk.client import Client
from autoscaler.sdk.errors import NotAScript, SdkError
from autoscaler.sdk.models import CodeSource, GitCode, SnapshotCode, TaskInfo
from autoscaler.sdk.options import TaskOptions, check_known
from autoscaler.workload.snapshot import PackedSnapshot, git_prefix, git_state, pack_directory

# Set by the agent in every task's environment (agent/runner.py).
TASK_ID_ENV = "AUTOSCALER_TASK_ID"
DEFAULT_SNAPSHOT_LIMIT = 256 * 1024 * 1024

CodeMode = Literal["path", "snapshot", "git"]


def on_worker() -> bool:
    """True inside a task an agent started."""
    return bool(os.environ.get(TASK_ID_ENV))


@dataclass(frozen=True)
class Entry:
    """How this process was started, as a command a worker can run again."""

    args: list[str]  # after the interpreter: ["train.py", ...] or ["-m", "pkg.train", ...]
    root: Path  # the directory the command runs in (and the one shipped)


def entry_point(argv: Sequence[str] | None = None) -> Entry:
    """The running script (or `-m` module) and its arguments, relative to its directory."""
    argv = list(sys.argv if argv is None else argv)
    main = sys.modules.get("__main__")
    main_file = getattr(main, "__file__", None)
    spec = getattr(main, "__spec__", None)
    if main_file is None or not argv or argv[0] in ("", "-c"):
        raise NotAScript(
            "run_remotely() needs a script file to send: call it at the top of a script run as "
            "`python train.py` (not from a REPL, a notebook or `python -c`)"
        )
    if spec is not None and spec.name not in ("__main__", ""):
        # `python -m pkg.train`: run the module again from the directory it was found from.
        return Entry(["-m", spec.name.removesuffix(".__main__"), *argv[1:]], Path.cwd())
    script = Path(main_file).resolve()
    return Entry([script.name, *argv[1:]], script.parent)


# -- How the code reaches the worker -------------------------------------------------
# "path" needs nothing from the server; "snapshot" and "git" (with an uncommitted diff)
# upload through POST /api/v1/snapshots, and a server without a snapshot store answers
# with a FeatureMissing saying so. The CLI's `enqueue --code/--git` uses these too.


def _upload(client: Client, packed: PackedSnapshot, team: str | None) -> str:
    try:
        snapshot = client.upload_snapshot(packed.path, team=team)
    finally:
        packed.path.unlink(missing_ok=True)
    if snapshot.digest != packed.digest:
        raise SdkError(
            f"the server stored {snapshot.digest} but {packed.digest} was sent: the upload was damaged on the "
            "way; submit again"
        )
    return snapshot.digest


def snapshot_code(client: Client, root: Path, limit_bytes: int, team: str | None = None) -> SnapshotCode:
    """Pack `root` (honouring .gitignore) and upload it for `team` (admins; a team token
    uploads for its own): the one place code leaves this machine."""
    return SnapshotCode(_upload(client, pack_directory(root, limit_bytes=limit_bytes), team))


def git_code(client: Client, root: Path, limit_bytes: int, team: str | None = None) -> GitCode | None:
    """The checkout `root` is in: its origin, HEAD and the uncommitted diff (uploaded as
    a snapshot of one `diff.patch`), as ClearML records it. None: not a git checkout."""
    state = git_state(root)
    if state is None:
        return None
    diff_digest = None
    if state.diff:
        with tempfile.TemporaryDirectory(prefix="autoscaler-diff-") as tmp:
            (Path(tmp) / "diff.patch").write_bytes(state.diff)
            packed = pack_directory(Path(tmp), limit_bytes=limit_bytes, honour_gitignore=False)
            diff_digest = _upload(client, packed, team)
    return GitCode(url=str(state.url), ref=str(state.commit), diff_snapshot=diff_digest)


def code_source(
    mode: CodeMode, client: Client, root: Path, limit_bytes: int, team: str | None
) -> tuple[str | None, CodeSource | None]:
    """(working_dir, code) for the task."""
    if mode == "path":
        return str(root), None
    if mode == "snapshot":
        return None, snapshot_code(client, root, limit_bytes, team)
    if mode == "git":
        code = git_code(client, root, limit_bytes, team)
        if code is None:
            raise SdkError(f"{root} is not in a git checkout with a remote: use code='snapshot' or code='path'")
        return None, code
    raise SdkError(f"code={mode!r}: give 'path', 'snapshot' or 'git'")


def in_clone(entry: Entry, prefix: str) -> list[str]:
    """The command's arguments for a worker that runs in a clone of the checkout: the
    clone's top is its directory, so a script in a subdirectory is named by its path
    from the top (`python jobs/train.py`; the script's own directory is still first on
    sys.path, but relative file names resolve from the top)."""
    if not prefix:
        return list(entry.args)
    if entry.args[0] == "-m":
        raise SdkError(
            f"code='git' with `python -m` runs the module from the checkout's top directory, and this one was "
            f"started in {prefix.rstrip('/')} inside it: start it from the top, or use code='snapshot'"
        )
    return [prefix + entry.args[0], *entry.args[1:]]


def ended_how(info: TaskInfo) -> str:
    """One line on how a task that did not succeed ended, from its last history entry."""
    last = info.events[-1] if info.events else None
    why = "" if last is None else f" ({last.reason})" + (f": {last.detail}" if last.detail else "")
    return f"task {info.id} {info.state}{why}; `autoscaler task show {info.id}` has its history"


def _fail(message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(1)


def run_remotely(
    *,
    queue: str,
    code: CodeMode = "path",
    python: str | None = None,
    follow: bool = False,
    snapshot_limit_bytes: int = DEFAULT_SNAPSHOT_LIMIT,
    client: Client | None = None,
    server: str | None = None,
    token: str | None = None,
    **options: Unpack[TaskOptions],
) -> None:
    """On a worker: return at once. Elsewhere: enqueue this script with this process's
    arguments, print the task id and exit 0 (with `follow=True`: print the task's
    output as it comes, then exit with the task's exit code). Errors print one line
    and exit 1. `python`: the interpreter on the worker (default: this one for
    code='path', `python3` otherwise). `options` are `Client.submit`'s (`TaskOptions`:
    gpus, checkpoints, expected_runtime, ...), but the working directory, which it sets."""
    if on_worker():
        return
    own = client is None
    try:
        check_known(options)
        api = client or Client(server, token)
    except AutoscalerError as exc:
        _fail(exc.message)
    try:
        entry = entry_point()
        working_dir, source = code_source(code, api, entry.root, snapshot_limit_bytes, options.get("team"))
        args = entry.args if code != "git" else in_clone(entry, git_prefix(entry.root))
        interpreter = python or (sys.executable if code == "path" else "python3")
        task = api.submit([interpreter, *args], queue=queue, working_dir=working_dir, code=source, **options)
        print(task.id, flush=True)
        if not follow:
            raise SystemExit(0)
        for chunk in task.logs(follow=True):
            print(chunk.data, end="", file=sys.stderr if chunk.stream == "stderr" else sys.stdout, flush=True)
        info = task.wait()
        if info.state != "succeeded":
            # Output alone may not say it (a task that never started printed nothing).
            print(f"error: {ended_how(info)}", file=sys.stderr, flush=True)
        raise SystemExit(info.exit_code if info.exit_code is not None else (0 if info.state == "succeeded" else 1))
    except AutoscalerError as exc:
        _fail(exc.message)
    finally:
        if own:
            api.close()
