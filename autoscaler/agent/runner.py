"""One attempt of a task as a subprocess: its own process group, its environment and
working directory, output captured for upload, timeout and stop with escalation.

The process runs as the task user the agent decided on (`task_user.TaskUser`): with
a scratch dir of its own (mode 0700, owned by that user, also its HOME and TMPDIR)
when the task names no working dir. A task with a dedicated uid (run_as_range) has
every process of that uid killed when it ends, daemons that left its group included.

The process is started from the agent's main thread with the parent-death signal
set to SIGKILL (Linux), so a task does not outlive an agent killed with -9: the
server requeues the task elsewhere and the orphan must not keep the GPU busy.

A task with an `image` runs in a container (autoscaler.agent.container): its image
is pulled first, then the engine CLI is the process watched here, and signals go to
the container by name instead of to the CLI's process group. A task that carries
code, a setup, outputs or a checkpoint (autoscaler.agent.carry) runs in phases:
prepare, setup, run, save. Both at once: the files are prepared on the host while
the image is pulled, the setup runs inside the container before the command (one
container, so what the setup installs is there for the command), and the files are
saved from the host after the container exits.
"""

from __future__ import annotations

import codecs
import contextlib
import ctypes
import ctypes.util
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Literal

from autoscaler.agent import carry
from autoscaler.agent.container import SETUP_FAILED_FILE, ContainerAttempt, ContainerError, ContainerSettings
from autoscaler.agent.decisions import StopRequest, gpu_env
from autoscaler.agent.task_user import TaskUser, kill_uid
from autoscaler.agent.wire import LeasedTask, LogChunk

READ_SIZE = 64 * 1024
# Output held while the server is away; past this the oldest output is dropped with a
# marker, so a chatty task cannot exhaust the agent's memory.
MAX_BUFFERED_CHARS = 8 * 1024 * 1024

PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True) if sys.platform == "linux" else None


def _child_setup() -> None:
    # Runs in the child between fork and exec: keep it to one syscall.
    if _libc is not None:
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def make_scratch(path: Path, user: TaskUser | None) -> None:
    """A fresh directory only the task's user can enter (0700, owned by it)."""
    if path.is_symlink() or path.exists():
        shutil.rmtree(path, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    path.mkdir(mode=0o700)
    if user is not None and user.switch:
        os.chown(path, user.uid, user.gid)
    path.chmod(0o700)


class StartFailed(Exception):
    """The task's process could not be started; the message is for its history."""


@dataclass
class OutputBuffer:
    """Output not yet uploaded, in arrival order, shared by the reader threads."""

    chunks: list[LogChunk] = field(default_factory=list)
    chars: int = 0
    dropped: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, stream: Literal["stdout", "stderr"], data: str) -> None:
        with self._lock:
            self.chunks.append(LogChunk(stream=stream, data=data))
            self.chars += len(data)
            while self.chars > MAX_BUFFERED_CHARS and len(self.chunks) > 1:
                old = self.chunks.pop(0)
                self.chars -= len(old.data)
                self.dropped += len(old.data)

    def add_stderr(self, data: str) -> None:
        self.add("stderr", data)

    def take(self) -> list[LogChunk]:
        with self._lock:
            chunks, self.chunks, self.chars = self.chunks, [], 0
            if self.dropped:
                note = f"[autoscaler agent: {self.dropped} characters of output dropped: server away]\n"
                chunks.insert(0, LogChunk(stream="stderr", data=note))
                self.dropped = 0
            return chunks


def _pump(pipe: IO[bytes], stream: Literal["stdout", "stderr"], out: OutputBuffer) -> None:
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    fd = pipe.fileno()
    while True:
        block = os.read(fd, READ_SIZE)
        if not block:
            break
        text = decoder.decode(block)
        if text:
            out.add(stream, text)
    tail = decoder.decode(b"", final=True)
    if tail:
        out.add(stream, tail)
    pipe.close()


Phase = Literal["prepare", "setup", "run", "save", "done"]


class TaskProcess:
    """One attempt: for a task that carries files or a setup, the phases prepare (fetch
    code and checkpoint, in a thread), setup (its own process), run, save (outputs and
    checkpoint, in a thread); otherwise only run. The agent's loop only polls."""

    def __init__(
        self,
        task: LeasedTask,
        proc: subprocess.Popen[bytes] | None,
        started: float,
        scratch: Path | None,
        user: TaskUser | None = None,
        launch: _Launch | None = None,
        box: ContainerAttempt | None = None,
        server_url: str = "",
    ) -> None:
        self.task = task
        self.user = user
        self.proc = proc
        self.started = started
        # The attempt's start as handed over (the lease), never moved: a gang's ranks
        # number their checkpoints from it (`_generation`).
        self._handed = started
        self.scratch = scratch
        self.box = box  # a container task: its pull, then its container
        self.output = OutputBuffer()
        self.stop: StopRequest | None = None
        self.term_at: float | None = None
        self.kill_after: float | None = None
        self.killed = False
        self.phase: Phase = "run" if proc is not None else "prepare"
        # Why the attempt failed before its command ran (code, setup, an image pull): a
        # start failure, reported as `start_failed`.
        self.failure: str | None = None
        self._launch = launch
        # Where carried files move to and from (the lease reply's URLs are relative to it).
        self.server_url = launch.server_url if launch is not None else server_url
        self._exit: int | None = None
        self._bg: threading.Thread | None = None
        self._next_checkpoint: float | None = None
        self._readers: list[threading.Thread] = []
        if proc is not None:
            self._read(proc)

    def _read(self, proc: subprocess.Popen[bytes]) -> None:
        readers = [
            threading.Thread(target=_pump, args=(pipe, name, self.output), daemon=True, name=f"{name}-{self.task.id}")
            for pipe, name in ((proc.stdout, "stdout"), (proc.stderr, "stderr"))
            if pipe is not None
        ]
        for t in readers:
            t.start()
        self._readers += readers

    @classmethod
    def start(
        cls,
        task: LeasedTask,
        base_env: dict[str, str],
        work_root: Path,
        now: float,
        user: TaskUser | None = None,
        server_url: str = "",
        containers: ContainerSettings | None = None,
    ) -> TaskProcess:
        if task.image:
            return cls._start_container(
                task, base_env, work_root, now, user, containers or ContainerSettings(), server_url
            )
        env = {**base_env, **task.env, **task.secret_env, **gpu_env(task.gpu_indices)}
        env["AUTOSCALER_TASK_ID"] = task.id
        env["AUTOSCALER_TASK_ATTEMPT"] = str(task.attempts)
        cwd, scratch = _task_dir(task, work_root, user)
        uid: int | None = None
        gid: int | None = None
        groups: list[int] | None = None
        if user is not None:
            if user.switch:
                env.update(USER=user.name, LOGNAME=user.name)
                env["HOME"] = str(scratch) if scratch is not None else user.home
                uid, gid, groups = user.uid, user.gid, list(user.groups)
            if scratch is not None:
                env["TMPDIR"] = str(scratch)
        launch = _Launch(cwd=cwd, env=env, uid=uid, gid=gid, groups=groups, user=user, server_url=server_url)
        if scratch is not None and carries_files(task):
            tp = cls(task, None, now, scratch, user, launch)
            tp._background(tp._prepare)
            return tp
        try:
            proc = launch.spawn(task.command)
        except StartFailed:
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)
            raise
        return cls(task, proc, now, scratch, user)

    @classmethod
    def _start_container(
        cls,
        task: LeasedTask,
        base_env: dict[str, str],
        work_root: Path,
        now: float,
        user: TaskUser | None,
        settings: ContainerSettings,
        server_url: str = "",
    ) -> TaskProcess:
        """A container task starts with its image pull; `poll` starts the container after it.

        Carried files are fetched into the task directory on the host while the image is
        pulled (the directory is what the container mounts), the setup runs inside the
        container before the command, and outputs and checkpoints are stored from the
        host once the container has exited."""
        cwd, scratch = _task_dir(task, work_root, user)
        tp = cls(task, None, now, scratch, user, server_url=server_url)
        carrying = scratch is not None and carries_files(task)
        try:
            tp.box = ContainerAttempt.begin(
                task,
                base_env,
                work_root,
                cwd,
                user,
                settings,
                now,
                tp.output.add_stderr,
                setup=task.setup if carrying else None,
            )
        except ContainerError as exc:
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)
            raise StartFailed(str(exc)) from None
        tp.phase = "prepare" if carrying else "run"
        if carrying:
            tp._background(tp._prepare)
        return tp

    @property
    def task_id(self) -> str:
        return self.task.id

    def timed_out(self, now: float) -> bool:
        if self.box is not None and self.proc is None:
            return False  # the pull has a timeout of its own; timeout_s bounds the run
        return self.task.timeout_s is not None and now - self.started >= self.task.timeout_s

    def request_stop(self, stop: StopRequest, now: float, grace_s: float) -> None:
        """SIGTERM the process group now and SIGKILL it after `grace_s`; the first reason wins."""
        if self.stop is None:
            self.stop = stop
        if self.term_at is None:
            self.term_at = now
            self.kill_after = now + grace_s
            self._signal(signal.SIGTERM)
        elif self.kill_after is not None:
            # A later, more urgent stop (e.g. spot after a drain) may shorten the grace.
            self.kill_after = min(self.kill_after, now + grace_s)

    def poll(self, now: float) -> int | None:
        """The return code once the attempt has ended (its files saved); escalates to
        SIGKILL when due and moves a carrying task through its phases."""
        if self.box is not None:
            return self._poll_container(now)
        if self.phase == "run" and self._launch is None:
            assert self.proc is not None
            return self._poll_proc(now)  # a task that carries nothing: the plain path
        if self.phase in ("prepare", "save"):
            if self._bg is not None and self._bg.is_alive():
                return None
            if self.phase == "save":
                self.phase = "done"
            elif self.failure is not None or self.stop is not None:
                self.phase, self._exit = "done", -signal.SIGTERM if self.stop is not None else 1
            else:
                self._begin("setup" if self.task.setup else "run", now)
            return self._exit if self.phase == "done" else None
        if self.phase == "done":
            return self._exit
        code = self._poll_proc(now)
        if code is None:
            self._checkpoint_if_due(now)
            return None
        self._end_group()
        if self.phase == "setup":
            if code != 0 and self.stop is None:
                self.failure = f"setup {_short(self.task.setup)} failed ({_how(code)}); the command did not run"
            if code != 0 or self.stop is not None:
                self.phase, self._exit = "done", code
                return code
            self._begin("run", now)
            return None
        self._exit = code
        self.phase = "save"
        if self._bg is not None:
            self._bg.join()  # a periodic checkpoint still uploading: the final one follows it
        generation = self._generation(now, final=True)
        self._background(lambda: self._save(generation))
        return None

    def _poll_container(self, now: float) -> int | None:
        """A container task: its files fetched while its image is pulled, then its
        container (signalled through the engine), then its files stored."""
        assert self.box is not None
        if self.phase == "save":
            if self._bg is not None and self._bg.is_alive():
                return None
            self.phase = "done"
        if self.phase == "done":
            return self._exit
        if self.phase == "prepare":
            if self._bg is not None and self._bg.is_alive():
                if self.stop is not None:
                    self.box.abort()  # the pull goes now; the download ends on its own
                return None
            if self.failure is not None or self.stop is not None:
                self.box.abort()
                self.phase, self._exit = "done", -signal.SIGTERM if self.stop is not None else 1
                return self._exit
            self.phase = "run"
        if self.proc is None:
            code = self._poll_pull(now)
            if self.proc is not None and self.task.checkpoint_every_s and self.scratch is not None:
                self._next_checkpoint = now + self.task.checkpoint_every_s
            return code
        code = self._poll_running_container(now)
        if code is None:
            if self.scratch is not None and carries_files(self.task):
                self._checkpoint_if_due(now)
            return None
        if self.scratch is None or not carries_files(self.task):
            return code
        for t in self._readers:
            t.join(timeout=2)  # the container's last output comes before the agent's notes
        if self.task.setup and self.stop is None:
            failed = self._setup_failed()
            if failed is not None:
                # The command never ran: like a failing setup on the host, nothing to store.
                self.failure = f"setup {_short(self.task.setup)} failed ({_how(failed)}); the command did not run"
                self.phase, self._exit = "done", code
                return code
        self._exit = code
        self.phase = "save"
        if self._bg is not None:
            self._bg.join()  # a periodic checkpoint still uploading: the final one follows it
        generation = self._generation(now, final=True)
        self._background(lambda: self._save(generation))
        return None

    def _setup_failed(self) -> int | None:
        """The setup's exit code, if it failed inside the container (the wrapper wrote it)."""
        assert self.scratch is not None
        marker = self.scratch / SETUP_FAILED_FILE
        try:
            # Written by the task's own user: it can only claim its own setup failed.
            text = marker.read_text()[:16]
        except OSError:
            return None
        with contextlib.suppress(OSError):
            marker.unlink()
        try:
            return int(text.strip())
        except ValueError:
            return 1

    def _poll_running_container(self, now: float) -> int | None:
        assert self.box is not None and self.proc is not None
        self.box.tick()
        code = self.proc.poll()
        if code is None and self.kill_after is not None and now >= self.kill_after and not self.killed:
            self.killed = True
            self._signal(signal.SIGKILL)
        if (
            code is None
            and self.killed
            and self.kill_after is not None
            and now >= self.kill_after + self.box.settings.cli_kill_wait_s
        ):
            self._signal_group(signal.SIGKILL)  # a wedged engine CLI; reap removes the container
        return code

    def _poll_pull(self, now: float) -> int | None:
        """While a container task's image is pulled: start the container once it is there."""
        assert self.box is not None
        if self.stop is not None:
            self.box.abort()  # nothing of the task runs yet: no grace to give
            return -signal.SIGKILL
        outcome = self.box.pull_outcome(now)
        if outcome is None:
            return None
        if outcome:
            self.failure = outcome
            return 1
        try:
            self.proc = self.box.run(lambda argv, env: _popen(argv, None, env))
        except ContainerError as exc:
            self.failure = str(exc)
            return 1
        self.started = now  # timeout_s bounds the task's run, not the pull
        self._read(self.proc)
        return None

    def _poll_proc(self, now: float) -> int | None:
        if self.proc is None:
            return None
        code = self.proc.poll()
        if code is None and self.kill_after is not None and now >= self.kill_after and not self.killed:
            self.killed = True
            self._signal(signal.SIGKILL)
        return code

    def _begin(self, phase: Phase, now: float) -> None:
        assert self._launch is not None
        argv = ["/bin/sh", "-c", self.task.setup or ""] if phase == "setup" else self.task.command
        if phase == "setup":
            self.output.add("stderr", f"[autoscaler agent: setup: {self.task.setup}]\n")
        try:
            self.proc = self._launch.spawn(argv)
        except StartFailed as exc:
            self.failure, self.phase, self._exit = str(exc), "done", 1
            return
        self.phase = phase
        self._read(self.proc)
        if phase == "run" and self.task.checkpoint_every_s:
            self._next_checkpoint = now + self.task.checkpoint_every_s

    def _background(self, work: Callable[[], None]) -> None:
        self._bg = threading.Thread(target=work, daemon=True, name=f"carry-{self.task.id}")
        self._bg.start()

    def _note(self, line: str) -> None:
        self.output.add("stderr", f"[autoscaler agent: {line}]\n")

    def _prepare(self) -> None:
        assert self.scratch is not None
        try:
            carry.fetch_code(self.server_url, self.task, self.scratch, self.user, self._note)
            carry.restore_checkpoint(self.server_url, self.task, self.scratch, self.user, self._note)
            # Only a setup failing in this attempt's container may leave this file.
            (self.scratch / SETUP_FAILED_FILE).unlink(missing_ok=True)
        except (carry.CarryFailed, OSError, ValueError) as exc:
            self.failure = f"cannot prepare the task's files: {exc}"
            self._note(self.failure)

    def _generation(self, now: float, *, final: bool) -> int:
        """Which checkpoint point of the attempt this is: the k-th period since the
        attempt was handed over (the periodic ones), one past the last period (the one
        at the end). Every rank of a gang was handed its start within a fraction of a
        second, so the k-th of each is taken at about the same time; the server keeps
        a gang's checkpoints per generation and restores one all ranks completed."""
        every = self.task.checkpoint_every_s
        if not every:
            return 1
        k = int((now - self._handed) // every)
        return k + 1 if final else max(k, 1)

    def _save(self, generation: int) -> None:
        assert self.scratch is not None
        try:
            carry.save_outputs(self.server_url, self.task, self.scratch, self._note)
            carry.save_checkpoint(self.server_url, self.task, self.scratch, self._note, generation=generation)
        except (carry.CarryFailed, OSError, ValueError) as exc:
            self._note(f"files not saved: {exc}")

    def _checkpoint_if_due(self, now: float) -> None:
        if self._next_checkpoint is None or now < self._next_checkpoint or self.stop is not None:
            return
        if self._bg is not None and self._bg.is_alive():
            return  # the last one is still uploading
        self._next_checkpoint = now + (self.task.checkpoint_every_s or 0)
        generation = self._generation(now, final=False)

        def periodic() -> None:
            assert self.scratch is not None
            try:
                carry.save_checkpoint(self.server_url, self.task, self.scratch, self._note, generation=generation)
            except (carry.CarryFailed, OSError, ValueError) as exc:
                # A file changing under the packer, a store away: the next period tries again.
                self._note(f"periodic checkpoint not saved: {exc}")

        self._background(periodic)

    def _end_group(self) -> None:
        """A phase's leader exited: what is left of its group goes too."""
        self._signal(signal.SIGKILL)
        for t in self._readers:
            t.join(timeout=2)

    def reap(self) -> None:
        """After the leader exits: kill what is left of its group, collect output, clean up."""
        self._signal_group(signal.SIGKILL)
        if self.box is not None:
            self.box.close()  # the container goes too, even if the engine CLI died first
        if self.user is not None and self.user.dedicated:
            kill_uid(self.user.uid)  # what escaped the group (setsid, double fork) ends too
        for t in self._readers:
            t.join(timeout=2)
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)

    def _signal(self, sig: signal.Signals) -> None:
        if self.box is not None:
            # The container is signalled by name: the engine CLI does not forward signals
            # (--sig-proxy=false) and may even be gone; its init hands it to the task.
            self.box.signal(sig)
            return
        self._signal_group(sig)

    def _signal_group(self, sig: signal.Signals) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)


def _rank_suffix(task: LeasedTask) -> str:
    """A gang's rank gets a directory of its own: several agents of one host (a local
    pool's machines) share a work dir, and two ranks must not share a checkpoint dir."""
    rank = task.env.get("NODE_RANK", "")
    return f"-rank{rank}" if task.env.get("AUTOSCALER_GANG_ID") == task.id and rank.isdigit() else ""


def _task_dir(task: LeasedTask, work_root: Path, user: TaskUser | None) -> tuple[Path, Path | None]:
    """The task's directory: its working_dir, or a fresh scratch dir (returned twice)."""
    if task.working_dir:
        cwd = Path(task.working_dir)
        if not cwd.is_dir():
            raise StartFailed(f"working dir {task.working_dir} does not exist on this worker")
        return cwd, None
    scratch = work_root / f"{task.id}-{task.attempts}{_rank_suffix(task)}"
    try:
        make_scratch(scratch, user)
    except OSError as exc:
        raise StartFailed(f"cannot create scratch dir {scratch}: {exc.strerror or exc}") from None
    return scratch, scratch


def _popen(
    argv: list[str],
    cwd: Path | None,
    env: dict[str, str],
    uid: int | None = None,
    gid: int | None = None,
    groups: list[int] | None = None,
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group: signals reach its children too
        # The credentials change before preexec_fn runs, so the parent-death
        # signal set there survives it (a uid change clears it).
        preexec_fn=_child_setup,
        user=uid,
        group=gid,
        extra_groups=groups,
    )


def carries_files(task: LeasedTask) -> bool:
    return bool(task.code or task.setup or task.outputs or task.checkpoint_dir)


def _short(cmd: str | None) -> str:
    text = (cmd or "").strip()
    return repr(text if len(text) <= 80 else text[:77] + "...")


def _how(code: int) -> str:
    return f"killed by signal {-code}" if code < 0 else f"exit code {code}"


@dataclass
class _Launch:
    """How this attempt's processes start: directory, environment and credentials."""

    cwd: Path
    env: dict[str, str]
    uid: int | None
    gid: int | None
    groups: list[int] | None
    user: TaskUser | None
    server_url: str

    def spawn(self, argv: list[str]) -> subprocess.Popen[bytes]:
        try:
            return _popen(argv, self.cwd, self.env, self.uid, self.gid, self.groups)
        except (OSError, subprocess.SubprocessError) as exc:
            user = self.user
            who = f" as {user.name} (uid {user.uid})" if user is not None and user.switch else ""
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise StartFailed(f"cannot start {argv[0]!r}{who}: {why}{_on_path(argv[0], self.env, user)}") from None


def _on_path(program: str, env: dict[str, str], user: TaskUser | None) -> str:
    """For a bare program name: where the task's PATH has it, as the agent sees it. A
    name found only where the task user cannot reach (a pyenv under /root) reads
    'Permission denied', which alone does not say where to look."""
    if "/" in program:
        return ""
    found = [str(Path(d) / program) for d in os.get_exec_path(env) if (Path(d) / program).is_file()]
    if not found:
        return f"; no {program!r} on the task's PATH"
    as_whom = f" {user.name} must be able to reach and run one" if user is not None and user.switch else ""
    return f"; on the task's PATH: {', '.join(found[:3])}{';' + as_whom if as_whom else ''}"
