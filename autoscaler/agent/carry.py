"""What a task carries, moved by the agent: its code and last checkpoint fetched into
the task's directory before it starts, its outputs and checkpoint stored when the
attempt ends (and the checkpoint every `checkpoint_every_s` while it runs).

Every transfer goes to a URL from the lease reply (task-scoped and short-lived, see
autoscaler.artifacts.tickets), never with the worker's token or a store credential.
Bodies stream from and to files; a download's SHA-256 must match the digest the
server named, an upload's must match the digest the server answers. Failed calls
are retried a few times with backoff.

The agent may run as root while tasks run as their own user, so: unpacked files are
given to the task user; the git clone runs as the task user; files the task left are
read without following symlinks (an output that is a link to /etc/shadow uploads
nothing), and archives unpack with tarfile's "data" filter (no absolute paths, no
links out of the directory, no devices).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

import httpx

from autoscaler.agent.task_user import TaskUser
from autoscaler.agent.wire import LeasedTask
from autoscaler.workload.snapshot import pack_directory

BLOCK = 1024 * 1024
RETRIES = 4
# Largest checkpoint or output directory the agent packs (the server has its own limit).
PACK_LIMIT = 50 * 1024**3
Note = Callable[[str], None]  # a line for the task's log (stderr)


class CarryFailed(Exception):
    """A file could not be fetched or stored; the message is for the task's history."""


def _url(base: str, url: str) -> str:
    return base.rstrip("/") + url if url.startswith("/") else url


def _retrying(what: str, call: Callable[[], str]) -> str:
    delay = 0.5
    for attempt in range(1, RETRIES + 1):
        try:
            return call()
        except (httpx.HTTPError, _Retry) as exc:
            if attempt == RETRIES:
                raise CarryFailed(f"{what}: {exc}") from None
            time.sleep(delay)
            delay *= 2
    raise AssertionError("unreachable")


class _Retry(Exception):
    """A 5xx or a cut-off transfer: worth another try."""


def download(base: str, url: str, dest: Path, digest: str, *, timeout_s: float = 60) -> None:
    """Stream `url` into `dest`; CarryFailed unless its SHA-256 is `digest`."""

    def once() -> str:
        h = hashlib.sha256()
        with httpx.stream("GET", _url(base, url), timeout=timeout_s) as r:
            if r.status_code >= 500:
                raise _Retry(f"the server answered {r.status_code}")
            if r.status_code >= 400:
                r.read()
                raise CarryFailed(f"refused ({r.status_code}): {_detail(r)}")
            with dest.open("wb") as fh:
                for block in r.iter_bytes(BLOCK):
                    h.update(block)
                    fh.write(block)
        return f"sha256:{h.hexdigest()}"

    got = _retrying("download failed", once)
    if got != digest:
        dest.unlink(missing_ok=True)
        raise CarryFailed(f"integrity check failed: expected {digest}, got {got}")


def upload(
    base: str, url: str, src: Path, *, fmt: str = "file", generation: int = 0, timeout_s: float = 60
) -> tuple[int, str]:
    """Stream `src` to `url`; the size and digest stored, checked against our own."""

    def opened() -> BinaryIO:
        # Never through a link: a task may swap one in for a file it left.
        return os.fdopen(os.open(src, os.O_RDONLY | os.O_NOFOLLOW), "rb")

    h = hashlib.sha256()
    size = 0
    try:
        with opened() as fh:
            for block in iter(lambda: fh.read(BLOCK), b""):
                h.update(block)
                size += len(block)
    except OSError as exc:
        raise CarryFailed(f"cannot read {src.name}: {exc.strerror or exc}") from None
    mine = f"sha256:{h.hexdigest()}"

    def blocks() -> Iterator[bytes]:
        with opened() as fh:
            yield from iter(lambda: fh.read(BLOCK), b"")

    tries = 0

    def once() -> str:
        nonlocal tries
        tries += 1
        params: dict[str, str | int] = {"format": fmt}
        if generation:
            params["generation"] = generation
        r = httpx.put(_url(base, url), content=blocks(), params=params, timeout=timeout_s)
        if r.status_code >= 500:
            raise _Retry(f"the server answered {r.status_code}")
        if r.status_code == 409 and generation and tries > 1:
            # A write-once generation refused on a retry: an earlier try of this upload
            # was stored and its answer lost (only this rank of this attempt may store
            # this name, and the agent numbers each generation once), so these bytes.
            return mine
        if r.status_code >= 400:
            raise CarryFailed(f"refused ({r.status_code}): {_detail(r)}")
        return str(r.json().get("digest", ""))

    got = _retrying(f"upload of {src.name} failed", once)
    if got != mine:
        raise CarryFailed(f"integrity check failed: sent {mine}, the store has {got}")
    return size, mine


def _detail(r: httpx.Response) -> str:
    try:
        return str(r.json().get("detail", r.text))[:300]
    except ValueError:
        return r.text[:300]


def give_to(path: Path, user: TaskUser | None) -> None:
    """Make `path` and all below it the task user's (links themselves, never their targets)."""
    if user is None or not user.switch:
        return
    os.lchown(path, user.uid, user.gid)
    for dirpath, dirs, files in os.walk(path):
        for name in dirs + files:
            os.lchown(os.path.join(dirpath, name), user.uid, user.gid)


def unpack(archive: Path, dest: Path, user: TaskUser | None) -> None:
    try:
        with tarfile.open(archive, "r:*") as tar:
            tar.extractall(dest, filter="data")
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise CarryFailed(f"cannot unpack {archive.name}: {exc}") from None
    give_to(dest, user)


def _as_user(user: TaskUser | None, home: Path) -> dict[str, object]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "GIT_TERMINAL_PROMPT": "0"}
    if user is None or not user.switch:
        return {"env": env}
    return {"env": env, "user": user.uid, "group": user.gid, "extra_groups": list(user.groups)}


def _git(args: list[str], cwd: Path, user: TaskUser | None, note: Note) -> None:
    r = subprocess.run(  # type: ignore[call-overload]
        ["git", *args], cwd=cwd, capture_output=True, timeout=1800, check=False, **_as_user(user, cwd)
    )
    out = (r.stdout + r.stderr).decode(errors="replace").strip()
    if out:
        note(out)
    if r.returncode != 0:
        raise CarryFailed(f"git {args[0]} failed (exit {r.returncode}): {out.splitlines()[-1] if out else ''}")


def fetch_code(base: str, task: LeasedTask, workdir: Path, user: TaskUser | None, note: Note) -> None:
    """The task's code into `workdir` (its scratch dir, owned by the task user)."""
    code = task.code or {}
    tr = task.transfers
    with tempfile.TemporaryDirectory(prefix="autoscaler-carry-") as tmp:
        archive = Path(tmp) / "code.tar.gz"
        if code.get("snapshot"):
            if tr is None or not tr.code_url or not tr.code_digest:
                raise CarryFailed("the server sent no URL for the task's code snapshot")
            download(base, tr.code_url, archive, tr.code_digest)
            unpack(archive, workdir, user)
            note(f"code: snapshot {tr.code_digest} unpacked ({archive.stat().st_size} bytes)")
            return
        url = code.get("git")
        if not url:
            return
        _git(["clone", "--quiet", "--", url, "."], workdir, user, note)
        if code.get("ref"):
            _git(["-c", "advice.detachedHead=false", "checkout", "--quiet", str(code["ref"])], workdir, user, note)
        if code.get("diff_snapshot"):
            if tr is None or not tr.code_url or not tr.code_digest:
                raise CarryFailed("the server sent no URL for the task's uncommitted diff")
            download(base, tr.code_url, archive, tr.code_digest)
            patch_dir = workdir / ".autoscaler-diff"
            patch_dir.mkdir()
            unpack(archive, patch_dir, user)
            try:
                _git(["apply", "--whitespace=nowarn", str(patch_dir / "diff.patch")], workdir, user, note)
            finally:
                shutil.rmtree(patch_dir, ignore_errors=True)
        note(
            f"code: {url} at {code.get('ref') or 'HEAD'}{' with the uncommitted diff' if code.get('diff_snapshot') else ''}"
        )


def restore_checkpoint(base: str, task: LeasedTask, workdir: Path, user: TaskUser | None, note: Note) -> None:
    """The last attempt's checkpoint into the checkpoint dir, before the task starts."""
    if not task.checkpoint_dir:
        return
    target = workdir / task.checkpoint_dir
    target.mkdir(parents=True, exist_ok=True)
    give_to(workdir, user)  # the dirs made on the way are the task's too
    tr = task.transfers
    if tr is None or not tr.checkpoint_url or not tr.checkpoint_digest:
        return  # the first attempt, or none before it saved one
    with tempfile.TemporaryDirectory(prefix="autoscaler-carry-") as tmp:
        archive = Path(tmp) / "checkpoint.tar.gz"
        download(base, tr.checkpoint_url, archive, tr.checkpoint_digest)
        unpack(archive, target, user)
    note(f"checkpoint: restored {tr.checkpoint_digest} into {task.checkpoint_dir}")


def _inside(workdir: Path, rel: str) -> Path | None:
    """`rel` under `workdir` if no part of it is a symlink (else None: not followed)."""
    path = workdir
    for part in Path(rel).parts:
        path = path / part
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISLNK(path.lstat().st_mode):
                return None
    return path


def save_checkpoint(base: str, task: LeasedTask, workdir: Path, note: Note, *, generation: int = 0) -> None:
    """The checkpoint dir, packed; `generation` numbers it within the attempt (a gang's
    server keeps each generation; a single task's keeps the last)."""
    tr = task.transfers
    if not task.checkpoint_dir or tr is None or not tr.checkpoint_upload_url:
        return
    src = _inside(workdir, task.checkpoint_dir)
    if src is None or not src.is_dir():
        return
    # A single task with nothing written yet keeps its previous checkpoint. A gang's rank
    # stores even an empty dir: a program that saves only from rank 0 still completes
    # each generation (the others restore an empty dir), see docs/gangs.md.
    in_gang = task.env.get("AUTOSCALER_GANG_ID") == task.id
    if not in_gang and not any(src.iterdir()):
        return
    packed = pack_directory(src, limit_bytes=PACK_LIMIT, honour_gitignore=False)
    try:
        size, digest = upload(base, tr.checkpoint_upload_url, packed.path, fmt="tar.gz", generation=generation)
    finally:
        packed.path.unlink(missing_ok=True)
    note(f"checkpoint: saved {task.checkpoint_dir} ({size} bytes, {digest})")


def save_outputs(base: str, task: LeasedTask, workdir: Path, note: Note) -> None:
    """Every output path that exists; a missing one is noted, not an error."""
    tr = task.transfers
    for rel in task.outputs or []:
        url = tr.output_urls.get(rel) if tr else None
        if url is None:
            note(f"output {rel}: no upload URL from the server; not saved")
            continue
        src = _inside(workdir, rel)
        try:
            if src is None:
                note(f"output {rel}: a symlink; not followed, not saved")
            elif src.is_dir():
                packed = pack_directory(src, limit_bytes=PACK_LIMIT, honour_gitignore=False)
                try:
                    size, digest = upload(base, url, packed.path, fmt="tar.gz")
                finally:
                    packed.path.unlink(missing_ok=True)
                note(f"output {rel}: saved as {rel}.tar.gz ({size} bytes, {digest})")
            elif src.is_file():
                size, digest = upload(base, url, src, fmt="file")
                note(f"output {rel}: saved ({size} bytes, {digest})")
            else:
                note(f"output {rel}: not found in the task's directory; not saved")
        except CarryFailed as exc:
            note(f"output {rel}: not saved: {exc}")
