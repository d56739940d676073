"""Client-side packing of a task's code: a directory as a tar.gz snapshot, honouring
`.gitignore` files (and skipping `.git`), bounded by a size limit; and the state of a
git checkout (remote, commit, uncommitted diff) for `--code .` inside a repository.

Packing streams to a temporary file while hashing, so a large tree is never held in
memory; the limit is checked on the packed bytes as they are written.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pathspec

from autoscaler.errors import InvalidInput


@dataclass(frozen=True)
class PackedSnapshot:
    path: Path  # a tar.gz temporary file; the caller deletes it
    digest: str  # "sha256:<hex>"
    size: int


@dataclass(frozen=True)
class GitState:
    url: str
    commit: str
    diff: bytes  # `git diff HEAD --binary`: empty when the tree is clean


class _Bounded:
    """A file wrapper that hashes what is written and refuses past the limit."""

    def __init__(self, fh: IO[bytes], limit: int, root: Path) -> None:
        self.fh, self.limit, self.root = fh, limit, root
        self.size = 0
        self.hash = hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.size += len(data)
        if self.size > self.limit:
            raise InvalidInput(
                f"{self.root} packs to more than {self.limit} bytes: add large files to .gitignore, "
                "or raise the limit (--code-limit)"
            )
        self.hash.update(data)
        return self.fh.write(data)

    def flush(self) -> None:
        self.fh.flush()


def _ignored(root: Path) -> pathspec.GitIgnoreSpec:
    lines: list[str] = [".git/"]
    for dirpath, _dirs, files in os.walk(root):
        if ".gitignore" in files:
            rel = Path(dirpath).relative_to(root).as_posix()
            prefix = "" if rel == "." else rel + "/"
            for line in (Path(dirpath) / ".gitignore").read_text(errors="replace").splitlines():
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                neg = line.startswith("!")
                pat = line[1:] if neg else line
                # A pattern with a slash (not only at the end) is anchored to its file's dir.
                if "/" in pat.rstrip("/"):
                    pat = prefix + pat.lstrip("/")
                elif prefix:
                    pat = prefix + "**/" + pat
                lines.append(("!" if neg else "") + pat)
    return pathspec.GitIgnoreSpec.from_lines(lines)


def files_to_pack(root: Path, *, honour_gitignore: bool = True) -> list[Path]:
    """Relative paths of what a snapshot of `root` holds, sorted (stable digests)."""
    spec = _ignored(root) if honour_gitignore else None
    out: list[Path] = []
    for dirpath, dirs, files in os.walk(root):
        here = Path(dirpath)
        rel_dir = here.relative_to(root)
        keep = []
        for d in sorted(dirs):
            rel = (rel_dir / d).as_posix() + "/"
            if d == ".git" or (spec is not None and spec.match_file(rel)):
                continue
            if (here / d).is_symlink():
                out.append(rel_dir / d)  # packed as the link, not followed
                continue
            keep.append(d)
        dirs[:] = keep
        for f in sorted(files):
            rel_path = rel_dir / f
            if spec is None or not spec.match_file(rel_path.as_posix()):
                out.append(rel_path)
    return sorted(out)


def pack_directory(root: Path, *, limit_bytes: int, honour_gitignore: bool = True) -> PackedSnapshot:
    """`root` as a tar.gz temporary file; InvalidInput past `limit_bytes` (packed)."""
    root = root.resolve()
    if not root.is_dir():
        raise InvalidInput(f"{root} is not a directory: --code takes the directory holding the task's code")
    fd, name = tempfile.mkstemp(prefix="autoscaler-snapshot-", suffix=".tar.gz")
    path = Path(name)
    try:
        with os.fdopen(fd, "wb") as raw:
            sink = _Bounded(raw, limit_bytes, root)
            # mtime 0 in the gzip header and sorted members: the same tree, the same digest.
            gz = gzip.GzipFile(filename="", fileobj=sink, mode="wb", mtime=0)
            with gz, tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
                for rel in files_to_pack(root, honour_gitignore=honour_gitignore):
                    info = tar.gettarinfo(str(root / rel), arcname=rel.as_posix())
                    info.uid = info.gid = 0
                    info.uname = info.gname = ""
                    if info.isfile():
                        with (root / rel).open("rb") as fh:
                            tar.addfile(info, fh)
                    else:
                        tar.addfile(info)
        return PackedSnapshot(path=path, digest=f"sha256:{sink.hash.hexdigest()}", size=sink.size)
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def _git(root: Path, *args: str) -> bytes | None:
    try:
        r = subprocess.run(["git", "-C", str(root), *args], capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout if r.returncode == 0 else None


def git_state(root: Path) -> GitState | None:
    """The checkout `root` is in: its remote (origin), HEAD commit and uncommitted diff;
    None outside a git checkout or without a remote a worker could clone."""
    if _git(root, "rev-parse", "--is-inside-work-tree") is None:
        return None
    url = _git(root, "remote", "get-url", "origin")
    commit = _git(root, "rev-parse", "HEAD")
    if not url or not commit:
        return None
    diff = _git(root, "diff", "HEAD", "--binary") or b""
    return GitState(url=url.decode().strip(), commit=commit.decode().strip(), diff=diff)


def git_prefix(root: Path) -> str:
    """Where `root` is inside its checkout, as a relative path ending in "/" ("" at the
    top): a clone on a worker has the top at its root, so paths must be made relative to it."""
    out = _git(root, "rev-parse", "--show-prefix")
    return out.decode().strip() if out else ""
