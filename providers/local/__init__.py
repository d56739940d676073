"""Agents as local processes: the embedded default backend, no cloud needed.

Each instance is a real agent process started through the same bootstrap path as a
cloud VM: the launch's cloud-init user-data is parsed with `parse_user_data` and the
agent file it carries is written (mode 0600) where the agent is told to read it.

Everything about an instance lives under `home/local-instances/<instance_id>/`
(`instance.json` with the request, pid and process group; `agent.json`, the
bootstrap; `agent.log`), so a restarted control plane finds its instances again.
A recorded pid counts as ours only while `/proc/PID/cmdline` still names that
instance's bootstrap file, so a recycled pid is never mistaken for an agent.

Tasks: an agent started by a control plane running as root runs its tasks as the
unprivileged `autoscaler-task` user, which the provider creates (`useradd --system`)
when it is missing, as the agent image's install script does; `run_as`,
`run_as_range` and `allow_root_tasks` go into the bootstrap file. Its worker token is
kept in the instance directory (`state/worker.json`, 0600; the directory is 0700).
Run as an ordinary user, the agent and its tasks share that user (see docs/agent.md).

Instance ids derive from the request id, and the record is written before the process
starts: a launch retried after a crash finds the record and starts (or returns) the
same instance instead of a second one.

A gang launch (`nodes` = k) starts k instances (`<request digest>-0` .. `-(k-1)`), all
tagged with the gang, from the one user-data (its join token registers each of them
once); if one cannot start, the others are stopped and the launch raises
`CapacityError`: all or nothing, as the cloud drivers.
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import json
import logging
import os
import pwd
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from providers.base import (
    Capabilities,
    CapacityError,
    DriverOptions,
    InstanceStatus,
    InvalidRequest,
    LaunchRequest,
    Offering,
    ProviderInstance,
    Scope,
    TransientError,
)
from providers.bootstrap import BootstrapError, parse_user_data

INSTANCES_DIR = "local-instances"
AgentCommand = Callable[[Path], Sequence[str]]
TASK_USER = "autoscaler-task"  # autoscaler.agent.task_user.DEFAULT_TASK_USER
log = logging.getLogger("autoscaler.providers.local")


def ensure_task_user(name: str = TASK_USER) -> str | None:
    """Create the unprivileged task user when running as root and it is missing.
    None when it exists (or was created); otherwise why not (the agent's tasks then
    fail to start with the agent's own explanation)."""
    try:
        pwd.getpwnam(name)
        return None
    except KeyError:
        pass
    if os.geteuid() != 0:
        return f"not root: cannot create the task user {name!r}; tasks run as the agent's user"
    useradd = shutil.which("useradd") or next(
        (p for p in ("/usr/sbin/useradd", "/sbin/useradd") if os.access(p, os.X_OK)), None
    )
    if useradd is None:
        return f"useradd not found: cannot create the task user {name!r}"
    cmd = [useradd, "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
           "--shell", "/usr/sbin/nologin", name]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode not in (0, 9):  # 9: created meanwhile by someone else
        return f"useradd {name} failed ({done.returncode}): {done.stderr.strip()[:200]}"
    log.info("created the unprivileged task user %s", name)
    return None


def agent_command(bootstrap: Path) -> list[str]:
    """The command a local instance runs: the real agent, as a VM's systemd unit does."""
    return [sys.executable, "-m", "autoscaler", "agent", "--bootstrap", str(bootstrap)]


@dataclass(frozen=True)
class LocalRecord:
    """What `instance.json` holds."""

    instance_id: str
    request_id: str
    pool: str
    owner: str
    instance_type: str
    capacity_type: str
    tags: dict[str, str]
    launched_at: str
    pid: int | None = None
    pgid: int | None = None
    terminated_at: str | None = None

    @classmethod
    def load(cls, path: Path) -> LocalRecord:
        data = json.loads(path.read_text())
        return cls(**data)

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.__dict__, indent=2, sort_keys=True))
        tmp.replace(path)  # atomic: a crash leaves the old record or the new, never half


def default_offering(simulated_gpus: Mapping[str, Any] | None) -> Offering:
    gpus = int(simulated_gpus.get("count", 0)) if simulated_gpus else 0
    model = str(simulated_gpus.get("model", "Simulated GPU")) if simulated_gpus else None
    return Offering(
        instance_type="local",
        capacity_type="on_demand",
        zone=None,
        gpus=gpus,
        gpu_type=model if gpus else None,
        cpus=os.cpu_count() or 1,
        memory_mb=0,
        hourly_price=0.0,
        region="local",
    )


class LocalOptions(DriverOptions):
    """A local pool takes no `options:` (its GPUs and labels are pool fields); any key is a typo."""


class LocalProvider:
    """See the module docstring."""

    capabilities = Capabilities()

    def __init__(
        self,
        catalog: Sequence[Offering],
        *,
        pool: str,
        home: Path,
        simulated_gpus: Mapping[str, Any] | None = None,
        labels: Mapping[str, str] | None = None,
        command: AgentCommand = agent_command,
        env: Mapping[str, str] | None = None,
        stop_grace_s: float = 10.0,
        name: str = "local",
        run_as: str | None = None,
        run_as_range: str | None = None,
        allow_root_tasks: bool = False,
    ) -> None:
        self.name = name
        self.pool = pool
        self.root = Path(home) / INSTANCES_DIR
        self.simulated_gpus = dict(simulated_gpus) if simulated_gpus else None
        self.labels = dict(labels or {})
        self._catalog = list(catalog) or [default_offering(simulated_gpus)]
        self._command = command
        self._env = dict(env) if env is not None else None
        self.stop_grace_s = stop_grace_s
        self.run_as = run_as
        self.run_as_range = run_as_range
        self.allow_root_tasks = allow_root_tasks
        self._task_user_checked = False
        # Children started by this process, kept so their exit is reaped (no zombies).
        self._children: dict[str, subprocess.Popen[bytes]] = {}

    # ---- the Provider protocol -----------------------------------------------------

    def offerings(self) -> list[Offering]:
        return list(self._catalog)

    def launch(self, request: LaunchRequest) -> list[ProviderInstance]:
        if not request.user_data:
            raise InvalidRequest(
                "a local instance needs user-data with a join token: render it with "
                "providers.bootstrap.render_user_data"
            )
        try:
            bootstrap = parse_user_data(request.user_data)
        except BootstrapError as exc:
            raise InvalidRequest(str(exc)) from None
        self.root.mkdir(parents=True, exist_ok=True)
        if not self._task_user_checked and (self.run_as in (None, TASK_USER)):
            self._task_user_checked = True
            problem = ensure_task_user(TASK_USER)
            if problem and os.geteuid() == 0:
                log.warning("%s", problem)
        nodes = max(request.nodes, 1)
        out: builtins.list[ProviderInstance] = []
        for n in range(nodes):
            try:
                out.append(self._ensure_started(self._instance_id(request.request_id, n), request, bootstrap))
            except TransientError as exc:
                if nodes == 1:
                    raise
                # All or nothing: stop the machines this gang launch started (and mark
                # the one that failed), so no half gang is left running.
                self.terminate([self._instance_id(request.request_id, m) for m in range(n + 1)])
                raise CapacityError(
                    f"cannot start all {nodes} local machines of gang {request.gang}: {exc.message}; "
                    "none is left running",
                    scope=Scope.OFFERING,
                ) from None
        return out

    def list(self, owner: str) -> builtins.list[ProviderInstance]:
        self._reap()
        out = []
        for rec in self._records():
            if rec.owner != owner or rec.terminated_at is not None:
                continue
            # A process that is gone (drained and exited, or crashed) is a VM that
            # powered off: terminated, so not listed. Its log stays for diagnosis.
            if rec.pid is not None and self._is_ours(rec):
                out.append(self._view(rec, InstanceStatus.RUNNING))
        return out

    def terminate(self, instance_ids: Sequence[str]) -> None:
        for iid in instance_ids:
            path = self.root / iid / "instance.json"
            try:
                rec = LocalRecord.load(path)
            except (OSError, ValueError, TypeError):
                continue  # never ours or already removed: success, per the contract
            if rec.pid is not None and rec.pgid is not None and self._is_ours(rec):
                self._stop_group(iid, rec.pgid, rec.pid)
            if rec.terminated_at is None:
                LocalRecord(**{**rec.__dict__, "terminated_at": _now_iso()}).save(path)
        self._reap()

    # ---- when the control plane stops ------------------------------------------------

    def live_agents(self) -> builtins.list[LocalRecord]:
        """This pool's agent processes that are still running (any owner)."""
        self._reap()
        return [r for r in self._records() if r.terminated_at is None and r.pid is not None and self._is_ours(r)]

    def mark_stopped(self, rec: LocalRecord) -> None:
        """SIGKILL what is left of the instance's process group and record it terminated."""
        if rec.pgid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(rec.pgid, signal.SIGKILL)
        child = self._children.pop(rec.instance_id, None)
        if child is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=5)
        path = self.root / rec.instance_id / "instance.json"
        with contextlib.suppress(OSError):
            LocalRecord(**{**LocalRecord.load(path).__dict__, "terminated_at": _now_iso()}).save(path)

    # ---- helpers -------------------------------------------------------------------

    def instance_dir(self, instance_id: str) -> Path:
        return self.root / instance_id

    def _instance_id(self, request_id: str, n: int) -> str:
        digest = hashlib.sha256(request_id.encode()).hexdigest()[:12]
        return f"local-{digest}-{n}"

    def _ensure_started(self, iid: str, request: LaunchRequest, bootstrap: dict[str, Any]) -> ProviderInstance:
        d = self.root / iid
        rec_path = d / "instance.json"
        if rec_path.exists():
            rec = LocalRecord.load(rec_path)
            if rec.terminated_at is not None:
                return self._view(rec, InstanceStatus.TERMINATED)
            if rec.pid is not None:
                # Seen before: same request id, same instance, nothing new started.
                alive = self._is_ours(rec)
                return self._view(rec, InstanceStatus.RUNNING if alive else InstanceStatus.TERMINATED)
        else:
            d.mkdir(mode=0o700, parents=True, exist_ok=True)
            rec = LocalRecord(
                instance_id=iid,
                request_id=request.request_id,
                pool=request.pool,
                owner=request.owner,
                instance_type=request.offering.instance_type,
                capacity_type=request.offering.capacity_type,
                tags=request.all_tags(),
                launched_at=_now_iso(),
            )
            rec.save(rec_path)  # the intent, before the process: a retry finds it
        boot = {**bootstrap, "instance_id": iid, "provider": "local"}
        if boot.get("simulated_gpus") is None and self.simulated_gpus is not None:
            boot["simulated_gpus"] = self.simulated_gpus
        boot["labels"] = {**self.labels, **(boot.get("labels") or {})}
        # The worker token file: inside the instance directory (0700), never in a task's reach.
        boot["state_dir"] = str(d / "state")
        if self.run_as is not None:
            boot["run_as"] = self.run_as
        if self.run_as_range is not None:
            boot["run_as_range"] = self.run_as_range
        if self.allow_root_tasks:
            boot["allow_root_tasks"] = True
        boot_path = d / "agent.json"
        fd = os.open(boot_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(boot, f, indent=2, sort_keys=True)
        try:
            with open(d / "agent.log", "ab") as log:
                proc = subprocess.Popen(
                    list(self._command(boot_path)),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=d,
                    env=self._env,
                    # Its own session and process group: terminate stops the agent and
                    # every task it started, and a Ctrl-C in the control plane does not.
                    start_new_session=True,
                )
        except OSError as exc:
            raise TransientError(f"cannot start the local agent for {iid}: {exc.strerror}") from None
        self._children[iid] = proc
        rec = LocalRecord(**{**rec.__dict__, "pid": proc.pid, "pgid": proc.pid})
        rec.save(rec_path)
        return self._view(rec, InstanceStatus.RUNNING)

    def _records(self) -> builtins.list[LocalRecord]:
        if not self.root.is_dir():
            return []
        out = []
        for path in sorted(self.root.glob("*/instance.json")):
            try:
                out.append(LocalRecord.load(path))
            except (OSError, ValueError, TypeError):
                continue  # a half-written or foreign directory is not an instance
        return [r for r in out if r.pool == self.pool]

    def _is_ours(self, rec: LocalRecord) -> bool:
        """Alive, not a zombie, and still running this instance's bootstrap."""
        assert rec.pid is not None
        marker = str(self.root / rec.instance_id / "agent.json")
        proc = Path(f"/proc/{rec.pid}")
        if proc.is_dir():
            child = self._children.get(rec.instance_id)
            if child is not None and child.pid == rec.pid:
                return child.poll() is None
            # A process in the middle of execve shows an empty cmdline for a moment
            # (Popen returns before the kernel has set up the new arguments): look again.
            for _ in range(40):
                try:
                    cmdline = (proc / "cmdline").read_bytes()
                    state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
                except (OSError, IndexError):
                    return False
                if state == "Z" or cmdline:
                    break
                time.sleep(0.005)
            return state != "Z" and marker.encode() in cmdline.split(b"\0")
        if Path("/proc/self").is_dir():
            return False  # Linux: no /proc entry means no process
        try:  # elsewhere (macOS): best effort, the pid exists
            os.kill(rec.pid, 0)
        except OSError:
            return False
        return True

    def _stop_group(self, iid: str, pgid: int, pid: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_grace_s
        child = self._children.get(iid)
        while time.monotonic() < deadline:
            if child is not None:
                if child.poll() is not None:
                    break
            elif not _pid_alive(pid):
                break
            time.sleep(0.05)
        # SIGKILL the whole group even when the leader left: tasks it started may remain.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        if child is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=5)

    def _reap(self) -> None:
        for iid, child in builtins.list(self._children.items()):
            if child.poll() is not None:
                del self._children[iid]

    def _view(self, rec: LocalRecord, status: InstanceStatus) -> ProviderInstance:
        return ProviderInstance(
            instance_id=rec.instance_id,
            request_id=rec.request_id,
            pool=rec.pool,
            instance_type=rec.instance_type,
            capacity_type="spot" if rec.capacity_type == "spot" else "on_demand",
            zone=None,
            status=status,
            launched_at=datetime.fromisoformat(rec.launched_at),
            tags=dict(rec.tags),
            private_ip="127.0.0.1",
        )


def stop_agents(
    providers: Sequence[LocalProvider],
    hurry: threading.Event,
    *,
    drain_s: float = 5.0,
    stop_s: float = 15.0,
    say: Callable[[str], None] = print,
) -> tuple[int, int]:
    """Stop every agent these providers run, within `drain_s + stop_s` seconds (less if
    `hurry` is set): what `autoscaler up` does on Ctrl-C, while its API still answers.

    A SIGTERM to each agent starts its drain (no new task; running ones go on); after
    `drain_s` a second SIGTERM makes it interrupt its tasks (they are requeued, not
    failed) and leave; whatever still runs after `stop_s` more is SIGKILLed with its
    process group. Returns (agents that exited, agents that had to be killed).
    """
    live = [(p, r) for p in providers for r in p.live_agents()]
    if not live:
        return 0, 0
    say(
        f"stopping {len(live)} local agent(s): running tasks get {drain_s:g}s, then are interrupted and "
        f"requeued; at most {drain_s + stop_s:g}s (Ctrl-C again to kill them now)"
    )

    def alive() -> builtins.list[tuple[LocalProvider, LocalRecord]]:
        return [(p, r) for p, r in live if r.pid is not None and p._is_ours(r)]

    def wait(seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end and not hurry.is_set() and alive():
            hurry.wait(0.1)

    for seconds in (drain_s, stop_s):  # the first SIGTERM drains, the second interrupts
        for _, r in alive():
            assert r.pid is not None
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(r.pid, signal.SIGTERM)
        wait(seconds)
    killed = alive()
    for p, r in live:
        p.mark_stopped(r)
    stopped = len(live) - len(killed)
    if killed:
        names = ", ".join(r.instance_id for _, r in killed)
        say(f"stopped {stopped} local agent(s); killed {len(killed)} that did not stop in time: {names}")
    else:
        say(f"stopped {stopped} local agent(s)")
    return stopped, len(killed)


def _pid_alive(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    if stat.exists():
        try:
            return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except (OSError, IndexError):
            return False
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def _now_iso() -> str:
    return datetime.now(UTC).isoformat()


__all__ = ["LocalProvider", "LocalRecord", "agent_command", "default_offering", "stop_agents"]
