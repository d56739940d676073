"""Which user a task runs as, decided once at start and applied to every task.

An agent running as root runs tasks as `run_as` (default `autoscaler-task`, the user
the agent image's install script and the local provider create), never as root unless
`allow_root_tasks` says so. With `run_as_range` ("61000-61063") each running task
gets a uid of its own from that range (with `run_as`'s group): tasks of one machine
then cannot read each other's `/proc/PID/environ` or signal each other, and what a
task leaves running is killed by uid when it ends, before the uid is handed out again.

An agent that is not root cannot switch users: tasks run as the agent's own user and
can read whatever the agent can (its worker token file included). The agent says so
in its log at start. See docs/agent.md, "Who can read what on a machine".
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import re
import signal
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

DEFAULT_TASK_USER = "autoscaler-task"
_RANGE = re.compile(r"^\s*(\d+)\s*-\s*(\d+)\s*$")
MAX_RANGE = 65536


class TaskUserError(ValueError):
    """A run_as / run_as_range setting the agent cannot use; the message says why."""


def parse_range(text: str | None) -> tuple[int, int] | None:
    if text is None or str(text).strip() == "":
        return None
    m = _RANGE.match(str(text))
    if not m:
        raise TaskUserError(f"run_as_range {text!r} must look like 61000-61063")
    lo, hi = int(m.group(1)), int(m.group(2))
    if lo < 1 or hi < lo or hi - lo + 1 > MAX_RANGE or hi >= 2**31:
        raise TaskUserError(f"run_as_range {text!r}: need 1 <= first <= last, at most {MAX_RANGE} uids")
    return lo, hi


@dataclass(frozen=True)
class TaskUser:
    """The identity one task runs with. `switch` False: run as the agent itself."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str
    switch: bool
    dedicated: bool = False  # a uid from run_as_range, held by this task alone


@dataclass(frozen=True)
class TaskUsers:
    """The agent's decision about task identities; `refusal` set: no task may start."""

    base: TaskUser | None
    uid_range: tuple[int, int] | None
    refusal: str | None
    notes: tuple[str, ...]

    def describe(self) -> str:
        if self.refusal is not None or self.base is None:
            return f"tasks cannot start: {self.refusal}"
        b = self.base
        if not b.switch:
            return f"tasks run as the agent's own user {b.name} (uid {b.uid})"
        if self.uid_range is not None:
            lo, hi = self.uid_range
            return f"tasks run as uids {lo}-{hi}, one per task, group {b.gid} (run_as {b.name})"
        return f"tasks run as {b.name} (uid {b.uid}, gid {b.gid})"

    def allocate(self, in_use: Collection[int]) -> TaskUser:
        """The identity for a new task; raises TaskUserError when there is none to give."""
        if self.refusal is not None or self.base is None:
            raise TaskUserError(self.refusal or "no task user")
        if self.uid_range is None or not self.base.switch:
            return self.base
        lo, hi = self.uid_range
        busy = set(in_use) | uids_with_processes()
        for uid in range(lo, hi + 1):
            if uid not in busy:
                return TaskUser(
                    name=f"{self.base.name}-{uid}",
                    uid=uid,
                    gid=self.base.gid,
                    groups=self.base.groups,
                    home=self.base.home,
                    switch=True,
                    dedicated=True,
                )
        raise TaskUserError(f"every uid of run_as_range {lo}-{hi} is in use; widen the range")


def _lookup(spec: str) -> pwd.struct_passwd | None:
    try:
        return pwd.getpwuid(int(spec)) if spec.isdigit() else pwd.getpwnam(spec)
    except KeyError:
        return None


def _groups(entry: pwd.struct_passwd) -> tuple[int, ...]:
    try:
        return tuple(sorted(set(os.getgrouplist(entry.pw_name, entry.pw_gid))))
    except (OSError, KeyError):
        return (entry.pw_gid,)


def decide(
    run_as: str | None,
    run_as_range: tuple[int, int] | None,
    allow_root_tasks: bool,
    *,
    euid: int | None = None,
) -> TaskUsers:
    """Work out who tasks run as; never raises (a refusal is reported per task)."""
    euid = os.geteuid() if euid is None else euid
    notes: list[str] = []
    if euid != 0:
        try:
            me = pwd.getpwuid(euid)
            name, gid, home = me.pw_name, me.pw_gid, me.pw_dir
        except KeyError:
            name, gid, home = str(euid), os.getegid(), str(Path.home())
        notes.append(
            f"the agent is not root (uid {euid}): tasks run as the agent's own user {name} and can read what "
            "the agent can, its worker token file included; run the agent as root with run_as for isolation"
        )
        if run_as not in (None, "", name, str(euid)):
            notes.append(f"run_as {run_as!r} ignored: only an agent running as root can switch users")
        if run_as_range is not None:
            notes.append("run_as_range ignored: only an agent running as root can give tasks uids of their own")
        me_user = TaskUser(name=name, uid=euid, gid=gid, groups=tuple(os.getgroups()), home=home, switch=False)
        return TaskUsers(base=me_user, uid_range=None, refusal=None, notes=tuple(notes))
    wanted = run_as or DEFAULT_TASK_USER
    entry = _lookup(wanted)
    if entry is None:
        refusal = (
            f"run_as user {wanted!r} does not exist on this machine: create it (the agent image's install "
            f"script does: useradd --system {DEFAULT_TASK_USER}) or set run_as"
        )
        return TaskUsers(base=None, uid_range=None, refusal=refusal, notes=(f"tasks cannot start: {refusal}",))
    if entry.pw_uid == 0 or (run_as_range is not None and run_as_range[0] <= 0 <= run_as_range[1]):
        if not allow_root_tasks:
            refusal = (
                f"refusing to run tasks as root (run_as {wanted!r}): a root task can read the agent's worker "
                "token and the machine's credentials; set allow_root_tasks to allow it"
            )
            return TaskUsers(base=None, uid_range=None, refusal=refusal, notes=(f"tasks cannot start: {refusal}",))
        notes.append(
            "tasks run as root (allow_root_tasks): a task can read the worker token, the bootstrap file "
            "and every other task's environment"
        )
        root = TaskUser(name="root", uid=0, gid=0, groups=(0,), home=entry.pw_dir, switch=False)
        return TaskUsers(base=root, uid_range=None, refusal=None, notes=tuple(notes))
    if run_as_range is not None and run_as_range[0] <= entry.pw_uid <= run_as_range[1]:
        notes.append(f"run_as_range includes {wanted}'s own uid {entry.pw_uid}; it is skipped only while in use")
    base = TaskUser(
        name=entry.pw_name,
        uid=entry.pw_uid,
        gid=entry.pw_gid,
        groups=_groups(entry),
        home=entry.pw_dir,
        switch=True,
    )
    if run_as_range is None:
        notes.append(
            f"co-located tasks share uid {entry.pw_uid} ({entry.pw_name}) and can read each other's environment; "
            "set run_as_range for a uid per task, or keep tenancy: team so only one team's tasks share a machine"
        )
    return TaskUsers(base=base, uid_range=run_as_range, refusal=None, notes=tuple(notes))


def group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def _process_uids() -> list[tuple[int, set[int]]]:
    """(pid, {real, effective, saved, fs uid}) of every process (Linux /proc; none elsewhere).
    Read from `status`, not the owner of /proc/PID, which a non-dumpable process hides."""
    out: list[tuple[int, set[int]]] = []
    proc = Path("/proc")
    if not proc.is_dir():
        return out
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            for line in (entry / "status").read_text().splitlines():
                if line.startswith("Uid:"):
                    out.append((int(entry.name), {int(x) for x in line.split()[1:]}))
                    break
        except (OSError, ValueError):
            continue
    return out


def uids_with_processes() -> set[int]:
    """Every uid some process on this machine runs as."""
    return {uid for _, uids in _process_uids() for uid in uids}


def kill_uid(uid: int) -> int:
    """SIGKILL every process running as `uid`; how many were signalled. Used only for a
    dedicated uid (run_as_range), which nothing else on the machine runs as."""
    if uid == 0:
        raise ValueError("never kill by uid 0")
    n = 0
    for pid, uids in _process_uids():
        if uid in uids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                n += 1
    return n
