"""What the agent does with its secrets once it has joined, so tasks cannot take them.

- The join token is removed from the bootstrap file right after the first successful
  registration (`drop_join_token`): the file is rewritten atomically, with the same
  owner and mode, keeping every other key.
- The worker token is kept in memory and in `<state_dir>/worker.json` (mode 0600 in a
  0700 directory, owned by the agent's user), so an agent restarted by its service
  manager can re-register with it instead of a join token it no longer has. The
  record names the server, pool and instance it belongs to and is used only by an
  agent with the same three.

See docs/agent.md, "Who can read what on a machine".
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

WORKER_FILE = "worker.json"
ROOT_STATE_DIR = Path("/var/lib/autoscaler-agent")


def default_state_dir(env: Mapping[str, str], euid: int) -> Path:
    """systemd's StateDirectory= when set, /var/lib/autoscaler-agent for root, else the
    user's XDG state directory."""
    if env.get("STATE_DIRECTORY"):
        # systemd may pass several, colon-separated; the first is the unit's own.
        return Path(env["STATE_DIRECTORY"].split(":")[0])
    if euid == 0:
        return ROOT_STATE_DIR
    base = env.get("XDG_STATE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".local" / "state")
    return Path(base) / "autoscaler-agent"


def _write_private(path: Path, text: str, mode: int, owner: tuple[int, int] | None) -> None:
    """Write `text` to `path` atomically: a temp file in the same directory, fsynced,
    then renamed over the old one. A crash leaves the old file or the new, never half."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        os.fchmod(fd, mode)  # the umask must not widen or narrow it
        if owner is not None and os.geteuid() == 0:
            os.fchown(fd, *owner)
        with os.fdopen(fd, "w") as f:
            fd = -1
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    with contextlib.suppress(OSError):  # make the rename itself durable
        dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def drop_join_token(path: Path) -> bool:
    """Remove `join_token` from the bootstrap file, keeping everything else (and its
    owner and mode). True when a token was removed; OSError when the file cannot be
    rewritten (read-only mount, not the agent's to write)."""
    raw = path.read_text()
    data = json.loads(raw)
    if not isinstance(data, dict) or data.get("join_token") is None:
        return False
    del data["join_token"]
    st = path.stat()
    _write_private(path, json.dumps(data, indent=2, sort_keys=True) + "\n", st.st_mode & 0o7777, (st.st_uid, st.st_gid))
    return True


@dataclass(frozen=True)
class WorkerState:
    """The record an agent keeps of its registration: enough to come back as the same worker."""

    server_url: str
    pool: str
    instance_id: str
    worker_id: str
    worker_token: str

    def matches(self, server_url: str, pool: str, instance_id: str) -> bool:
        return (self.server_url, self.pool, self.instance_id) == (server_url, pool, instance_id)


def prepare_state_dir(state_dir: Path) -> None:
    """Create the state directory (0700, the agent's own) or check that it is private."""
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = state_dir.lstat()
    if st.st_uid != os.geteuid():
        raise PermissionError(f"state dir {state_dir} belongs to uid {st.st_uid}, not the agent's ({os.geteuid()})")
    if st.st_mode & 0o077:
        state_dir.chmod(0o700)


def save_worker(state_dir: Path, state: WorkerState) -> Path:
    prepare_state_dir(state_dir)
    path = state_dir / WORKER_FILE
    _write_private(path, json.dumps(asdict(state), indent=2, sort_keys=True) + "\n", 0o600, None)
    return path


def load_worker(state_dir: Path) -> WorkerState | None:
    """The saved registration, or None when there is none (or it is unreadable)."""
    try:
        data = json.loads((state_dir / WORKER_FILE).read_text())
        return WorkerState(**{k: str(data[k]) for k in WorkerState.__dataclass_fields__})
    except (OSError, ValueError, KeyError, TypeError):
        return None


def forget_worker(state_dir: Path) -> None:
    with contextlib.suppress(OSError):
        (state_dir / WORKER_FILE).unlink()
