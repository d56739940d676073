"""Client-side packing: .gitignore honoured, the limit enforced with a clear error,
the same tree packs to the same digest, and a checkout's git state."""

from __future__ import annotations

import hashlib
import os
import subprocess
import tarfile
import tempfile
from pathlib import Path

import pytest

from autoscaler.errors import InvalidInput
from autoscaler.workload.snapshot import git_state, pack_directory


def names(path: Path) -> set[str]:
    with tarfile.open(path) as tar:
        return {m.name for m in tar.getmembers() if not m.isdir()}


def tree(root: Path) -> None:
    (root / "src" / "deep").mkdir(parents=True)
    (root / "src" / "a.py").write_text("a")
    (root / "src" / "deep" / "b.py").write_text("b")
    (root / "src" / "deep" / "w.ckpt").write_text("ignored by src/.gitignore")
    (root / "src" / ".gitignore").write_text("*.ckpt\n")
    (root / "build").mkdir()
    (root / "build" / "x.o").write_text("ignored dir")
    (root / "keep.log").write_text("re-included")
    (root / "other.log").write_text("ignored")
    (root / ".gitignore").write_text("build/\n*.log\n!keep.log\n")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("never packed")


def test_gitignore_rules_are_honoured(tmp_path: Path) -> None:
    tree(tmp_path / "t")
    packed = pack_directory(tmp_path / "t", limit_bytes=10**6)
    try:
        assert names(packed.path) == {".gitignore", "keep.log", "src/.gitignore", "src/a.py", "src/deep/b.py"}
        assert packed.size == packed.path.stat().st_size
        assert packed.digest == "sha256:" + hashlib.sha256(packed.path.read_bytes()).hexdigest()
    finally:
        packed.path.unlink()


def test_same_tree_same_digest(tmp_path: Path) -> None:
    # Packed twice (seconds apart on a loaded machine): no timestamp of the packing itself
    # (gzip header) gets in, so an unchanged tree is not uploaded again.
    tree(tmp_path / "one")
    p1 = pack_directory(tmp_path / "one", limit_bytes=10**6)
    p2 = pack_directory(tmp_path / "one", limit_bytes=10**6)
    try:
        assert p1.digest == p2.digest
    finally:
        p1.path.unlink()
        p2.path.unlink()


def test_over_the_limit_is_a_clear_error_and_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A temp dir of its own: tests beside this one (other xdist workers, their CLI
    # processes) pack into the machine's temp dir meanwhile.
    own = tmp_path / "tmp"
    own.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(own))
    (tmp_path / "small").mkdir()
    (tmp_path / "small" / "a").write_text("a")
    fits = pack_directory(tmp_path / "small", limit_bytes=1000)
    assert fits.path.parent == own  # packing does write here, so an empty dir below means something
    fits.path.unlink()
    (tmp_path / "big").mkdir()
    (tmp_path / "big" / "blob").write_bytes(os.urandom(100_000))
    with pytest.raises(InvalidInput, match=r"more than 1000 bytes.*gitignore"):
        pack_directory(tmp_path / "big", limit_bytes=1000)
    assert list(own.iterdir()) == []


def test_not_a_directory(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="not a directory"):
        pack_directory(tmp_path / "missing", limit_bytes=10)


def test_symlinks_are_packed_as_links_not_followed(tmp_path: Path) -> None:
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "leak").symlink_to("/etc/hostname")
    packed = pack_directory(tmp_path / "t", limit_bytes=10**6)
    try:
        with tarfile.open(packed.path) as tar:
            assert tar.getmember("leak").issym()
    finally:
        packed.path.unlink()


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def test_git_state_records_remote_commit_and_uncommitted_diff(tmp_path: Path) -> None:
    assert git_state(tmp_path) is None  # not a checkout
    repo = tmp_path / "r"
    repo.mkdir()
    git(repo, "init", "-q")
    git(repo, "config", "user.email", "t@example.com")
    git(repo, "config", "user.name", "t")
    (repo / "f").write_text("1\n")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "c")
    assert git_state(repo) is None  # no remote a worker could clone
    git(repo, "remote", "add", "origin", "https://example.invalid/r.git")
    clean = git_state(repo)
    assert clean is not None and clean.diff == b"" and clean.commit == git(repo, "rev-parse", "HEAD")
    (repo / "f").write_text("2\n")
    dirty = git_state(repo)
    assert dirty is not None and dirty.url == "https://example.invalid/r.git"
    assert b"-1\n+2\n" in dirty.diff
