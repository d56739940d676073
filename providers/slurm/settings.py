"""A Slurm pool's settings, read from the pool's `options` mapping in the config file."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from providers.base import InvalidRequest, Scope

_KNOWN = {
    "partition",
    "account",
    "qos",
    "time_limit",
    "slurm_conf",
    "state_dir",
    "log_dir",
    "work_dir",
    "agent_command",
    "extra_sbatch_args",
    "name_prefix",
}


@dataclass(frozen=True)
class SlurmSettings:
    # Bootstrap files and job records (must be on a filesystem the compute nodes share,
    # because the job reads its bootstrap file there).
    state_dir: Path
    # `--output` of every job: the agent's log.
    log_dir: Path
    # `--chdir` of every job; without it Slurm runs the job where sbatch was called.
    work_dir: Path
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    # `--time`, e.g. "7-00:00:00"; None = the partition's default.
    time_limit: str | None = None
    # SLURM_CONF for the client commands; None = the machine's default configuration.
    slurm_conf: str | None = None
    agent_command: tuple[str, ...] = ("python3", "-m", "autoscaler", "agent")
    extra_sbatch_args: tuple[str, ...] = ()
    name_prefix: str = "as"
    # A job still pending (queued in Slurm) this long after submission is cancelled.
    boot_timeout_s: float = 900.0

    @classmethod
    def from_options(cls, options: Mapping[str, Any], *, home: Path, pool: str, boot_timeout_s: float) -> SlurmSettings:
        unknown = sorted(set(options) - _KNOWN)
        if unknown:
            raise _bad(f"unknown Slurm pool option(s) {unknown}; known: {sorted(_KNOWN)}")
        command = options.get("agent_command", cls.agent_command)
        if isinstance(command, str):
            command = command.split()
        extra = options.get("extra_sbatch_args", ())
        if not isinstance(extra, list | tuple) or not all(isinstance(a, str) for a in extra):
            raise _bad("options.extra_sbatch_args must be a list of strings")
        if not command or not all(isinstance(a, str) for a in command):
            raise _bad("options.agent_command must be a command line (a list of strings)")
        state_dir = Path(options.get("state_dir") or home / "slurm" / pool)
        return cls(
            state_dir=state_dir,
            log_dir=Path(options.get("log_dir") or state_dir / "logs"),
            work_dir=Path(options.get("work_dir") or state_dir),
            partition=options.get("partition"),
            account=options.get("account"),
            qos=options.get("qos"),
            time_limit=options.get("time_limit"),
            slurm_conf=options.get("slurm_conf"),
            agent_command=tuple(command),
            extra_sbatch_args=tuple(extra),
            name_prefix=str(options.get("name_prefix", "as")),
            boot_timeout_s=boot_timeout_s,
        )


def _bad(message: str) -> InvalidRequest:
    return InvalidRequest(message, scope=Scope.PROVIDER, code="InvalidConfig")
