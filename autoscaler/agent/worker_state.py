"""The agent's worker identity, kept across restarts of the agent on one machine.

After registering, the agent writes its worker id and worker token to a file only its
user can read (directory 0700, file 0600, written atomically). A restarted agent
re-registers with that worker token instead of the join token, which registers
once and is spent by then. A drained (deregistered) agent removes the file; an agent
the server declared gone (exit 2) keeps it, so the restart can come back.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger("autoscaler.agent")


@dataclass(frozen=True)
class WorkerState:
    server_url: str
    pool: str
    instance_id: str
    worker_id: str
    worker_token: str


def load(path: Path) -> WorkerState | None:
    """The saved state, or None when there is none or it cannot be used (logged)."""
    try:
        data = json.loads(path.read_text())
        return WorkerState(**{k: str(data[k]) for k in WorkerState.__dataclass_fields__})
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("ignoring unreadable worker state %s (%s)", path, exc.__class__.__name__)
        return None


def save(path: Path, state: WorkerState) -> None:
    """Write atomically, 0600, in a 0700 directory of this user's. A directory that is a
    symlink or someone else's (a shared /tmp) is refused: the token stays in memory and a
    restart will need a fresh join token (logged)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    info = os.lstat(path.parent)
    if stat.S_ISLNK(info.st_mode) or info.st_uid != os.getuid():
        log.warning("not saving the worker token: %s is a symlink or not this user's", path.parent)
        return
    with contextlib.suppress(OSError):
        os.chmod(path.parent, 0o700)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".worker-", suffix=".json")
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(asdict(state), fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def forget(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
