"""What the agent needs to know to start, and where each piece comes from.

Precedence, highest first: command-line flags, `AUTOSCALER_*` environment variables,
then the bootstrap file that cloud-init (or the local provider) writes. The bootstrap
file format is a contract with the providers: see `BootstrapFile` and docs/agent.md.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from autoscaler.agent.credentials import default_state_dir, load_worker
from autoscaler.agent.errors import AgentError
from autoscaler.agent.task_user import TaskUserError, parse_range

DEFAULT_BOOTSTRAP = Path("/etc/autoscaler/agent.json")
PROVIDERS = ("aws", "gcp", "azure", "local", "slurm", "static")
CLOUD_PROVIDERS = ("aws", "gcp", "azure")


class TokenRef(BaseModel):
    """Where to fetch the join token, so no secret sits in the VM's user-data."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["aws-ssm", "gcp-secret", "azure-keyvault"]
    name: str = Field(min_length=1, max_length=2048)


class SimulatedGpuSpec(BaseModel):
    """A pretend GPU inventory for local runs on machines without GPUs."""

    model_config = ConfigDict(extra="forbid")
    count: int = Field(ge=0, le=64)
    model: str = Field("Simulated GPU", max_length=128)
    memory_mb: int = Field(16384, ge=0)


class BootstrapFile(BaseModel):
    # Unknown keys are ignored (and logged by the caller), so a provider that adds a
    # field does not stop older agents from booting.
    model_config = ConfigDict(extra="ignore")
    server_url: str | None = None
    pool: str | None = None
    provider: Literal["aws", "gcp", "azure", "local", "slurm", "static"] | None = None
    join_token: str | None = None
    join_token_ref: TokenRef | None = None
    instance_id: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    simulated_gpus: SimulatedGpuSpec | None = None
    metadata_url: str | None = None
    # Who tasks run as (see autoscaler.agent.task_user): a user name or uid, default
    # autoscaler-task when the agent is root; a uid range "A-B" for a uid per task;
    # root tasks only with allow_root_tasks. state_dir holds the worker token file.
    run_as: str | None = Field(None, max_length=64)
    run_as_range: str | None = Field(None, max_length=32)
    allow_root_tasks: bool | None = None
    state_dir: str | None = Field(None, max_length=4096)


@dataclass(frozen=True)
class Timing:
    """Intervals, in seconds. Defaults suit production; tests shrink them."""

    heartbeat_s: float | None = None  # None: use the interval the server announces (10 s)
    lease_s: float = 2.0  # how often an agent with free GPUs asks for work
    # An idle agent's lease waits in the server up to this long for work (long-poll;
    # answered the moment a task fits), never past its next heartbeat or notice check.
    # 0: poll every lease_s. A server without long-poll answers at once, and the agent
    # then polls with its back-off as before.
    lease_wait_s: float = 20.0
    drain_deadline_s: float = 90.0  # on SIGTERM: how long running tasks may go on
    kill_grace_s: float = 10.0  # SIGTERM -> SIGKILL on cancel, timeout, drain deadline
    # On a spot notice tasks get SIGTERM at once and SIGKILL at the notice's deadline
    # minus the margin (None: the cloud's default, see decisions.PREEMPT_MARGIN_S);
    # preempt_grace_s is the grace of a notice that carries no usable time.
    preempt_grace_s: float = 25.0
    preempt_margin_s: float | None = None
    notice_poll_s: float = 5.0  # how often the metadata service is asked about preemption
    log_flush_s: float = 1.0  # how often task output is sent to the server
    request_timeout_s: float = 10.0  # one HTTP call to the server
    backoff_max_s: float = 30.0  # longest wait between retries while the server is away
    register_timeout_s: float = 600.0  # give up registering after this long (server never came)
    exit_flush_timeout_s: float = 60.0  # after a drain: how long to try delivering reports
    image_pull_timeout_s: float = 900.0  # a container task's image pull, before the attempt fails


@dataclass(frozen=True)
class AgentSettings:
    server_url: str
    pool: str
    provider: str
    join_token: str | None
    join_token_ref: TokenRef | None
    instance_id: str | None
    labels: dict[str, str] = field(default_factory=dict)
    simulated_gpus: SimulatedGpuSpec | None = None
    metadata_url: str | None = None
    work_dir: Path | None = None
    timing: Timing = field(default_factory=Timing)
    ignored_keys: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    run_as: str | None = None
    run_as_range: tuple[int, int] | None = None
    allow_root_tasks: bool = False
    state_dir: Path | None = None  # None: credentials.default_state_dir
    bootstrap_path: Path | None = None  # the file the join token is removed from after joining


def read_bootstrap(path: Path) -> tuple[BootstrapFile, tuple[str, ...], tuple[str, ...]]:
    """Parse the bootstrap file; returns it, its unknown keys, and warnings."""
    try:
        raw = path.read_text()
    except FileNotFoundError:
        raise AgentError(
            f"bootstrap file {path} does not exist: pass --server/--pool/--join-token or write the file"
        ) from None
    except OSError as exc:
        raise AgentError(f"cannot read bootstrap file {path}: {exc.strerror}") from None
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise AgentError(f"bootstrap file {path} is not valid JSON (line {exc.lineno}: {exc.msg})") from None
    if not isinstance(data, dict):
        raise AgentError(f"bootstrap file {path} must hold a JSON object")
    try:
        parsed = BootstrapFile.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise AgentError(f"bootstrap file {path}: {where}: {first['msg']}") from None
    unknown = tuple(sorted(set(data) - set(BootstrapFile.model_fields)))
    warnings: list[str] = []
    mode = path.stat().st_mode
    if parsed.join_token and mode & (stat.S_IRWXG | stat.S_IRWXO):
        warnings.append(f"bootstrap file {path} holds a join token and is readable by others; chmod 600 it")
    return parsed, unknown, tuple(warnings)


def resolve(
    flags: Mapping[str, Any],
    env: Mapping[str, str],
    bootstrap: Path | None,
    timing: Timing,
    work_dir: Path | None = None,
) -> AgentSettings:
    """Merge flags, environment and bootstrap file into settings, or explain what is missing."""
    path = bootstrap or (Path(env["AUTOSCALER_BOOTSTRAP"]) if env.get("AUTOSCALER_BOOTSTRAP") else None)
    if path is None and DEFAULT_BOOTSTRAP.exists():
        path = DEFAULT_BOOTSTRAP
    boot, unknown, warnings = read_bootstrap(path) if path is not None else (BootstrapFile(), (), ())

    def pick(name: str, env_name: str) -> Any:
        value = flags.get(name)
        if value is None or value == "":
            value = env.get(env_name) or None
        if value is None:
            value = getattr(boot, name)
        return value

    server_url = pick("server_url", "AUTOSCALER_SERVER")
    pool = pick("pool", "AUTOSCALER_POOL")
    provider = pick("provider", "AUTOSCALER_PROVIDER") or "static"
    join_token = pick("join_token", "AUTOSCALER_JOIN_TOKEN")
    if flags.get("join_token"):
        warnings = (
            *warnings,
            "the join token was given with --join-token, so every process on this machine can read it in "
            "/proc/PID/cmdline; use AUTOSCALER_JOIN_TOKEN or the bootstrap file",
        )
    try:
        run_as_range = parse_range(pick("run_as_range", "AUTOSCALER_RUN_AS_RANGE"))
    except TaskUserError as exc:
        raise AgentError(str(exc)) from None
    allow_root = flags.get("allow_root_tasks")
    if not allow_root:
        env_allow = env.get("AUTOSCALER_ALLOW_ROOT_TASKS", "").strip().lower()
        allow_root = env_allow in ("1", "true", "yes") or bool(boot.allow_root_tasks)
    state = pick("state_dir", "AUTOSCALER_STATE_DIR")
    state_dir = Path(state) if state else default_state_dir(env, os.geteuid())
    missing = [n for n, v in (("--server", server_url), ("--pool", pool)) if not v]
    if missing:
        raise AgentError(
            f"missing {' and '.join(missing)}: pass the flag, set AUTOSCALER_SERVER/AUTOSCALER_POOL, "
            "or give a bootstrap file with --bootstrap"
        )
    if provider not in PROVIDERS:
        raise AgentError(f"unknown provider {provider!r}; expected one of {', '.join(PROVIDERS)}")
    if not join_token and boot.join_token_ref is None and load_worker(state_dir) is None:
        # After its first registration an agent has no join token any more (it removed
        # it from the bootstrap file) but its worker record in the state dir.
        raise AgentError(
            "no join token: pass --join-token, set AUTOSCALER_JOIN_TOKEN, or put join_token / "
            "join_token_ref in the bootstrap file (create one with `autoscaler token create --join --pool POOL`)"
        )
    if not str(server_url).startswith(("http://", "https://")):
        raise AgentError(f"server URL {server_url!r} must start with http:// or https://")
    return AgentSettings(
        server_url=str(server_url).rstrip("/"),
        pool=str(pool),
        provider=str(provider),
        join_token=join_token,
        join_token_ref=boot.join_token_ref,
        instance_id=pick("instance_id", "AUTOSCALER_INSTANCE_ID"),
        labels=dict(boot.labels),
        simulated_gpus=boot.simulated_gpus,
        metadata_url=pick("metadata_url", "AUTOSCALER_METADATA_URL"),
        work_dir=work_dir,
        timing=timing,
        ignored_keys=unknown,
        warnings=warnings,
        run_as=pick("run_as", "AUTOSCALER_RUN_AS"),
        run_as_range=run_as_range,
        allow_root_tasks=bool(allow_root),
        state_dir=state_dir,
        bootstrap_path=path,
    )


def agent_env_names() -> frozenset[str]:
    """Variables that configure the agent; tasks never see them (the join token is one)."""
    return frozenset(
        {
            "AUTOSCALER_SERVER",
            "AUTOSCALER_POOL",
            "AUTOSCALER_PROVIDER",
            "AUTOSCALER_JOIN_TOKEN",
            "AUTOSCALER_INSTANCE_ID",
            "AUTOSCALER_METADATA_URL",
            "AUTOSCALER_BOOTSTRAP",
            "AUTOSCALER_TOKEN",
            "AUTOSCALER_RUN_AS",
            "AUTOSCALER_RUN_AS_RANGE",
            "AUTOSCALER_ALLOW_ROOT_TASKS",
            "AUTOSCALER_STATE_DIR",
            "AUTOSCALER_ADDRESS",
        }
    )


def task_base_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    environ = os.environ if environ is None else environ
    hidden = agent_env_names()
    return {k: v for k, v in environ.items() if k not in hidden}
