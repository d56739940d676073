"""Container tasks: a task with an `image` runs in an OCI container through the
machine's engine (podman or docker, whichever is installed).

The pieces here are pure where they can be: `run_argv` builds the engine's command
line from the task, its GPU indices, its user and the engine found, and the tests
check it table by table; `pull_failure` turns an engine's pull error into the reason
the attempt ends with. `ContainerControl` runs the side commands (pull, kill, rm)
as child processes the agent's loop polls, so a slow registry never stops the loop
from heartbeating.

Why the run looks the way it does (see docs/agent.md, "Container tasks"):
- `--init`: PID 1 in the container is the engine's init, which forwards SIGTERM to
  the task and reaps what it leaves, so a shell or Python as the command still sees
  the signal.
- `--sig-proxy=false` and a name from the task id and attempt: the agent signals the
  container by name (`engine kill`), which works even if the engine CLI it started
  has died, and delivers each signal once.
- `--rm`, `--pull never`: the pull is a step of its own, with its own timeout and
  reasons; the run never pulls behind the agent's back.
- GPUs: CDI devices (`--device nvidia.com/gpu=N`) where an NVIDIA CDI spec is
  installed, else docker's `--gpus "device=N,M"`. Inside, the task's GPUs are
  numbered from 0, so CUDA_VISIBLE_DEVICES is 0..k-1 there.
"""

from __future__ import annotations

import base64
import codecs
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from autoscaler.agent.task_user import TaskUser
from autoscaler.agent.wire import LeasedTask

EngineKind = Literal["podman", "docker"]
# Where the task's directory (its scratch dir or working_dir) is mounted, and the
# container's working directory, HOME and TMPDIR.
TASK_DIR = "/workspace"
CDI_DIRS = (Path("/etc/cdi"), Path("/var/run/cdi"))
NVIDIA_CDI_KIND = "nvidia.com/gpu"
# What the engine process itself reads: a task secret of that name cannot be handed
# to the container through the engine's environment without changing the engine.
ENGINE_ENV = frozenset(
    {"PATH", "HOME", "TMPDIR", "USER", "XDG_RUNTIME_DIR", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "LD_LIBRARY_PATH"}
)
ENGINE_ENV_PREFIXES = ("CONTAINERS_", "DOCKER_", "REGISTRY_AUTH", "BUILDAH_", "PODMAN_")
PULL_TAIL_CHARS = 8 * 1024
# A task with a setup runs it inside its container before the command, through this
# wrapper (`sh -c WRAPPER autoscaler-setup SETUP CMD...`): one container, so what the
# setup installs is there for the command. A failing setup leaves its exit code in
# SETUP_FAILED_FILE in the task directory, so the agent can tell it from the command's.
SETUP_FAILED_FILE = ".autoscaler-setup-failed"
SETUP_WRAPPER = (
    'setup=$1; shift; printf "[autoscaler agent: setup: %s]\\n" "$setup" >&2; '
    '/bin/sh -c "$setup"; status=$?; '
    f'if [ "$status" -ne 0 ]; then echo "$status" > {TASK_DIR}/{SETUP_FAILED_FILE}; exit "$status"; fi; '
    'exec "$@"'
)
OWNER_LABEL = "autoscaler.work_dir"
_NAME_SAFE = re.compile(r"[^A-Za-z0-9_.-]")
_HTTP_AUTH = re.compile(r"\b(401|403)\b")
_CDI_KIND = re.compile(r"""["']?kind["']?\s*:\s*["']?nvidia\.com/gpu["']?""")


class ContainerError(Exception):
    """A container task that cannot start here; the message is for its history."""


@dataclass(frozen=True)
class Engine:
    kind: EngineKind
    path: str
    cdi: bool = False  # an NVIDIA CDI spec is installed (podman and docker 25+ read it)


@dataclass(frozen=True)
class Identity:
    """Who the task is inside the container: a numeric uid/gid (the image need not know it)."""

    uid: int
    gid: int
    groups: tuple[int, ...] = ()


@dataclass(frozen=True)
class RunSpec:
    task_id: str
    attempt: int
    image: str
    command: Sequence[str]
    host_dir: Path  # mounted at TASK_DIR
    env: Mapping[str, str] = field(default_factory=dict)  # plain values: on the engine's command line
    secret_names: Sequence[str] = ()  # values reach the engine through its environment only
    gpu_indices: Sequence[int] = ()
    gpu_devices: bool = True  # False: simulated GPUs, there is no device to hand in
    cpus: float = 0
    memory_mb: int = 0
    user: Identity | None = None  # None: the image's own user
    owner: str = ""  # the agent's work dir: a restarted agent removes what its predecessor left


def nvidia_cdi_present(dirs: Iterable[Path] = CDI_DIRS) -> bool:
    """Is a CDI spec for NVIDIA GPUs installed (what `nvidia-ctk cdi generate` writes)?"""
    for d in dirs:
        try:
            files = sorted(d.iterdir())
        except OSError:
            continue
        for f in files:
            if f.suffix not in (".yaml", ".yml", ".json"):
                continue
            try:
                if _CDI_KIND.search(f.read_text(errors="replace")[:65536]):
                    return True
            except OSError:
                continue
    return False


def detect_engine(
    which: Callable[[str], str | None] = shutil.which, cdi_dirs: Iterable[Path] = CDI_DIRS
) -> Engine | None:
    """podman if installed (the agent image ships it), else docker, else None."""
    for kind in ("podman", "docker"):
        path = which(kind)
        if path:
            return Engine(kind=kind, path=path, cdi=nvidia_cdi_present(cdi_dirs))
    return None


def with_setup(setup: str, command: Sequence[str]) -> list[str]:
    """The container's command line: the setup in the image's /bin/sh, then `exec` of the
    command (so the command, not a shell, is what the engine's init signals)."""
    return ["/bin/sh", "-c", SETUP_WRAPPER, "autoscaler-setup", setup, *command]


def container_name(task_id: str, attempt: int) -> str:
    """Unique per attempt, so a late `rm` of attempt 1 never hits attempt 2."""
    return f"autoscaler-{_NAME_SAFE.sub('_', task_id)}-{attempt}"


def container_gpu_env(gpu_indices: Sequence[int]) -> dict[str, str]:
    """The GPU environment inside the container. The engine hands in only the task's
    devices and CUDA numbers what it sees from 0, so CUDA_VISIBLE_DEVICES is 0..k-1;
    NVIDIA_VISIBLE_DEVICES names the host's indices (what an NVIDIA runtime reads, and
    "void" for none), overriding an image's `all`."""
    return {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(len(gpu_indices))),
        "NVIDIA_VISIBLE_DEVICES": ",".join(str(i) for i in gpu_indices) or "void",
    }


def gpu_args(engine: Engine, gpu_indices: Sequence[int]) -> list[str]:
    """The engine flags that hand exactly these host GPUs to the container."""
    if not gpu_indices:
        return []
    if engine.cdi:
        args: list[str] = []
        for i in gpu_indices:
            args += ["--device", f"{NVIDIA_CDI_KIND}={i}"]
        return args
    if engine.kind == "docker":
        # Quoted: docker splits --gpus on commas, so a list of devices needs the quotes.
        return ["--gpus", '"device=' + ",".join(str(i) for i in gpu_indices) + '"']
    raise ContainerError(
        "this machine's podman has no NVIDIA CDI spec, so it cannot hand GPUs to a container: "
        "install the NVIDIA container toolkit and run `nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`"
    )


def engine_env_clash(names: Iterable[str]) -> list[str]:
    return sorted(n for n in names if n in ENGINE_ENV or n.startswith(ENGINE_ENV_PREFIXES))


def run_argv(engine: Engine, spec: RunSpec) -> list[str]:
    """The engine command line that runs one attempt of a container task."""
    argv = [engine.path]
    argv += ["run", "--rm", "--init", "--sig-proxy=false", "--pull", "never"]
    argv += ["--name", container_name(spec.task_id, spec.attempt)]
    argv += ["--label", f"autoscaler.task={spec.task_id}", "--label", f"autoscaler.attempt={spec.attempt}"]
    if spec.owner:
        argv += ["--label", f"{OWNER_LABEL}={spec.owner}"]
    argv += ["--volume", f"{spec.host_dir}:{TASK_DIR}", "--workdir", TASK_DIR]
    if spec.user is not None:
        argv += ["--user", f"{spec.user.uid}:{spec.user.gid}"]
        for g in spec.user.groups:
            if g != spec.user.gid:
                argv += ["--group-add", str(g)]
    if spec.cpus > 0:
        argv += ["--cpus", f"{spec.cpus:g}"]
    if spec.memory_mb > 0:
        argv += ["--memory", f"{spec.memory_mb}m"]
    if spec.gpu_devices:
        argv += gpu_args(engine, spec.gpu_indices)
    env = {
        **spec.env,
        **container_gpu_env(spec.gpu_indices),
        "HOME": TASK_DIR,
        "TMPDIR": TASK_DIR,
        "AUTOSCALER_TASK_ID": spec.task_id,
        "AUTOSCALER_TASK_ATTEMPT": str(spec.attempt),
    }
    for k, v in env.items():
        if k not in spec.secret_names:
            argv += ["--env", f"{k}={v}"]
    for k in spec.secret_names:
        argv += ["--env", k]  # NAME alone: the engine copies the value from its own environment
    # `--` is not needed by either engine here: everything after the image is the command.
    argv += [spec.image, *spec.command]
    return argv


def remove_leftovers(engine: Engine, work_root: Path, env: Mapping[str, str], timeout_s: float = 60.0) -> list[str]:
    """Remove the containers an earlier agent with this work dir left running.

    The engine CLI dies with the agent (parent-death signal) but the container it
    started does not: after a `kill -9` or a crash, the restarted agent ends them, so
    a task the server has requeued elsewhere does not keep this machine's GPU busy."""
    try:
        found = subprocess.run(
            [engine.path, "ps", "-a", "--filter", f"label={OWNER_LABEL}={work_root}", "--format", "{{.Names}}"],
            env=dict(env),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    names = [n for n in found.stdout.split() if n.startswith("autoscaler-")]
    for name in names:
        ContainerControl(engine, name, env).remove(timeout_s)
    return names


def pull_argv(engine: Engine, image: str, authfile: Path | None) -> list[str]:
    argv = [engine.path, "pull"]
    if authfile is not None and engine.kind == "podman":
        argv += ["--authfile", str(authfile)]
    return [*argv, image]


def pull_env(engine: Engine, base: Mapping[str, str], authfile: Path | None) -> dict[str, str]:
    """docker reads logins from $DOCKER_CONFIG/config.json, podman from --authfile."""
    env = dict(base)
    if authfile is not None and engine.kind == "docker":
        env["DOCKER_CONFIG"] = str(authfile.parent)
    return env


def registry_host(image: str) -> str:
    """The registry an image reference names (Docker Hub when the first part is no host)."""
    first, sep, _rest = image.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return first
    return "docker.io"


def auth_json(image: str, secret: str) -> str:
    """The registry login file for `image`: the secret as given when it is an auth JSON
    (`{"auths": {...}}`), else `user:password` for the image's registry."""
    text = secret.strip()
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            raise ContainerError("image_pull_secret holds neither user:password nor valid JSON") from None
        if not isinstance(data, dict) or not isinstance(data.get("auths"), dict):
            raise ContainerError('image_pull_secret JSON must look like {"auths": {"REGISTRY": {"auth": ...}}}')
        return json.dumps(data)
    user, sep, password = text.partition(":")
    if not sep or not user:
        raise ContainerError("image_pull_secret must hold user:password (or a registry auth JSON)")
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return json.dumps({"auths": {registry_host(image): {"auth": token}}})


def write_authfile(directory: Path, content: str) -> Path:
    """A 0600 login file in a fresh 0700 directory of the agent's; removed after the pull."""
    directory.mkdir(mode=0o700)
    path = directory / "config.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(content)
    return path


def pull_failure(image: str, output: str, returncode: int) -> str:
    """Why a pull failed, in words, from what the engine printed."""
    low = output.lower()
    last = next((ln.strip() for ln in reversed(output.splitlines()) if ln.strip()), f"exit code {returncode}")
    last = last.removeprefix("Error: ").removeprefix("error: ")
    if any(s in low for s in ("unauthorized", "authentication required", "denied")) or _HTTP_AUTH.search(low):
        why = "the registry refused the login (check image_pull_secret): "
    elif any(s in low for s in ("manifest unknown", "not found", "name unknown", "does not exist")):
        why = "image not found (check the name and tag): "
    elif any(s in low for s in ("connection refused", "no such host", "i/o timeout", "network is unreachable")):
        why = "registry unreachable: "
    else:
        why = ""
    return f"image pull failed: {image}: {why}{last}"[:2000]


def _pump_into(pipe: int, sink: Callable[[str], None], tail: list[str]) -> None:
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    while True:
        block = os.read(pipe, 65536)
        if not block:
            break
        text = decoder.decode(block)
        if text:
            sink(text)
            tail.append(text)
            while sum(len(t) for t in tail) > PULL_TAIL_CHARS and len(tail) > 1:
                tail.pop(0)
    os.close(pipe)


class Pull:
    """The image pull: a child process whose output goes to the task's log (so a user
    sees progress) and whose last lines explain a failure."""

    def __init__(self, argv: list[str], env: Mapping[str, str], sink: Callable[[str], None]) -> None:
        read, write = os.pipe()
        try:
            self.proc = subprocess.Popen(
                argv, env=dict(env), stdin=subprocess.DEVNULL, stdout=write, stderr=write, start_new_session=True
            )
        finally:
            os.close(write)
        self.tail: list[str] = []
        self._reader = threading.Thread(target=_pump_into, args=(read, sink, self.tail), daemon=True, name="pull")
        self._reader.start()

    def poll(self) -> int | None:
        return self.proc.poll()

    def output(self) -> str:
        self._reader.join(timeout=2)
        return "".join(self.tail)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)


class ContainerControl:
    """Signals and removal of one attempt's container, by name, through the engine.

    A signal is retried each tick until the engine accepts it: asked before the
    container exists (the engine still creating it), it would otherwise be lost."""

    def __init__(self, engine: Engine, name: str, env: Mapping[str, str]) -> None:
        self.engine = engine
        self.name = name
        self.env = dict(env)
        self.pending: signal.Signals | None = None
        self._inflight: subprocess.Popen[bytes] | None = None
        self._inflight_sig: signal.Signals | None = None

    def send(self, sig: signal.Signals) -> None:
        # SIGKILL overrides a TERM not yet delivered; a TERM never downgrades a KILL.
        if self.pending != signal.SIGKILL:
            self.pending = sig
        self.tick()

    def tick(self) -> None:
        if self._inflight is not None:
            code = self._inflight.poll()
            if code is None:
                return
            if code == 0 and self._inflight_sig == self.pending:
                self.pending = None
            self._inflight = None
        if self.pending is not None:
            self._inflight_sig = self.pending
            self._inflight = subprocess.Popen(
                [self.engine.path, "kill", "--signal", self.pending.name, self.name],
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )

    def remove(self, timeout_s: float = 30.0) -> None:
        """Kill and remove the container whatever state it is in (gone already: fine)."""
        if self._inflight is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._inflight.wait(timeout=5)
        argv = [self.engine.path, "rm", "--force"]
        if self.engine.kind == "podman":
            argv += ["--ignore", "--time", "0"]
        with contextlib.suppress(subprocess.TimeoutExpired, OSError):
            subprocess.run(
                [*argv, self.name],
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=timeout_s,
                check=False,
            )


@dataclass(frozen=True)
class ContainerSettings:
    """The agent's settings for container tasks."""

    pull_timeout_s: float = 900.0
    gpu_devices: bool = True  # False when the agent's GPUs are simulated: no device to hand in
    engine: Engine | None = None  # None: detect podman/docker at each container task's start
    # After SIGKILL to the container, how long the engine CLI may take to exit with the
    # container's code before it is killed as well (a wedged engine must not hold the task).
    cli_kill_wait_s: float = 10.0


Popener = Callable[[list[str], dict[str, str]], "subprocess.Popen[bytes]"]


class ContainerAttempt:
    """One attempt of a container task: the pull, then the container, then removal."""

    def __init__(
        self,
        engine: Engine,
        spec: RunSpec,
        engine_env: dict[str, str],
        settings: ContainerSettings,
        pull: Pull,
        pull_deadline: float,
        auth_dir: Path | None,
    ) -> None:
        self.engine = engine
        self.spec = spec
        self.engine_env = engine_env
        self.settings = settings
        self.pull = pull
        self.pull_deadline = pull_deadline
        self.auth_dir = auth_dir
        self.control = ContainerControl(engine, container_name(spec.task_id, spec.attempt), engine_env)
        self.running = False

    @classmethod
    def begin(
        cls,
        task: LeasedTask,
        base_env: Mapping[str, str],
        work_root: Path,
        host_dir: Path,
        user: TaskUser | None,
        settings: ContainerSettings,
        now: float,
        sink: Callable[[str], None],
        setup: str | None = None,
    ) -> ContainerAttempt:
        """Check what can be checked before pulling, then start the pull. With `setup`,
        the container runs it before the command (`with_setup`)."""
        assert task.image
        engine = settings.engine or detect_engine()
        if engine is None:
            raise ContainerError(
                f"task asks for image {task.image} but this machine has no container engine: install podman "
                "(the agent image ships it) or docker"
            )
        pull_secret = task.image_pull_secret
        if pull_secret and pull_secret not in task.secret_env:
            raise ContainerError(f"image_pull_secret {pull_secret!r} is not one of the task's secret_env names")
        secrets = {k: v for k, v in task.secret_env.items() if k != pull_secret}
        clash = engine_env_clash(secrets)
        if clash:
            raise ContainerError(
                f"secret_env {', '.join(clash)}: the container engine itself reads these names, so they cannot "
                "reach a container task as secrets; rename them (or pass them in env)"
            )
        identity = Identity(user.uid, user.gid, tuple(user.groups)) if user is not None and user.switch else None
        spec = RunSpec(
            task_id=task.id,
            attempt=task.attempts,
            image=task.image,
            command=with_setup(setup, task.command) if setup else list(task.command),
            host_dir=host_dir,
            env=dict(task.env),
            secret_names=sorted(secrets),
            gpu_indices=list(task.gpu_indices),
            gpu_devices=settings.gpu_devices,
            cpus=task.cpus,
            memory_mb=task.memory_mb,
            user=identity,
            owner=str(work_root),
        )
        run_argv(engine, spec)  # a refusal (GPUs without CDI) ends the attempt before pulling
        auth_dir: Path | None = None
        authfile: Path | None = None
        if pull_secret:
            content = auth_json(task.image, task.secret_env[pull_secret])
            auth_dir = work_root / f".pull-{container_name(task.id, task.attempts)}"
            shutil.rmtree(auth_dir, ignore_errors=True)
            try:
                authfile = write_authfile(auth_dir, content)
            except OSError as exc:
                raise ContainerError(f"cannot write the registry login file: {exc.strerror or exc}") from None
        sink(f"[autoscaler agent: pulling {task.image} with {engine.kind}]\n")
        try:
            pull = Pull(pull_argv(engine, task.image, authfile), pull_env(engine, base_env, authfile), sink)
        except OSError as exc:
            if auth_dir is not None:
                shutil.rmtree(auth_dir, ignore_errors=True)
            raise ContainerError(f"cannot run {engine.path}: {exc.strerror or exc}") from None
        engine_env = {**base_env, **secrets}
        return cls(engine, spec, engine_env, settings, pull, now + settings.pull_timeout_s, auth_dir)

    def pull_outcome(self, now: float) -> str | None:
        """None while pulling; "" once the image is here; else why the pull failed."""
        code = self.pull.poll()
        if code is None:
            if now < self.pull_deadline:
                return None
            self.pull.kill()
            self._drop_auth()
            return (
                f"image pull failed: {self.spec.image}: no image after {self.settings.pull_timeout_s:g}s "
                "(the agent's --image-pull-timeout)"
            )
        self._drop_auth()
        if code != 0:
            return pull_failure(self.spec.image, self.pull.output(), code)
        self.pull.output()  # the reader has passed on the whole progress log
        return ""

    def run(self, popen: Popener) -> subprocess.Popen[bytes]:
        argv = run_argv(self.engine, self.spec)
        try:
            proc = popen(argv, self.engine_env)
        except (OSError, subprocess.SubprocessError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise ContainerError(f"cannot start {self.engine.path}: {why}") from None
        self.running = True
        return proc

    def tick(self) -> None:
        if self.running:
            self.control.tick()

    def signal(self, sig: signal.Signals) -> None:
        if self.running:  # during the pull there is no container yet: `abort` ends the pull
            self.control.send(sig)

    def abort(self) -> None:
        self.pull.kill()
        self._drop_auth()

    def close(self) -> None:
        if self.pull.poll() is None:
            self.abort()
        self._drop_auth()
        if self.running:
            self.control.remove()

    def _drop_auth(self) -> None:
        if self.auth_dir is not None:
            shutil.rmtree(self.auth_dir, ignore_errors=True)
            self.auth_dir = None
