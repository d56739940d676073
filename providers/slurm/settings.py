"""A Slurm pool's settings: `SlurmOptions` is the pool's `options:` block in the config
file, `SlurmSettings` resolves its directories against the control plane's home and adds
the pool's boot timeout.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from providers.base import DriverOptions, parse_options


class SlurmOptions(DriverOptions):
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    # `--time`, e.g. "7-00:00:00"; None = the partition's default.
    time_limit: str | None = None
    # SLURM_CONF for the client commands; None = the machine's default configuration.
    slurm_conf: str | None = None
    # Bootstrap files and job records (must be on a filesystem the compute nodes share,
    # because the job reads its bootstrap file there); default HOME/slurm/<pool>.
    state_dir: Path | None = None
    # `--output` of every job: the agent's log; default <state_dir>/logs.
    log_dir: Path | None = None
    # `--chdir` of every job (without it Slurm runs the job where sbatch was called);
    # default <state_dir>.
    work_dir: Path | None = None
    # A command line, as a list or one string split on whitespace.
    agent_command: tuple[str, ...] = Field(("python3", "-m", "autoscaler", "agent"), min_length=1)
    extra_sbatch_args: tuple[str, ...] = ()
    # The most nodes one gang job may ask for (`sbatch --nodes`), told to the planner
    # so it never sends a gang the partition cannot hold; None = no stated limit (a
    # launch still asks `sinfo` and refuses a gang wider than the partition).
    max_gang_nodes: int | None = Field(None, ge=1)
    name_prefix: str = "as"

    @field_validator("agent_command", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        return value.split() if isinstance(value, str) else value


class SlurmSettings(SlurmOptions):
    state_dir: Path
    log_dir: Path
    work_dir: Path
    # A job still pending (queued in Slurm) this long after submission is cancelled.
    boot_timeout_s: float = 900.0

    @classmethod
    def from_options(cls, options: Mapping[str, Any], *, home: Path, pool: str, boot_timeout_s: float) -> SlurmSettings:
        checked = parse_options(SlurmOptions, "Slurm", options)
        values = checked.model_dump()
        state_dir = checked.state_dir or home / "slurm" / pool
        values.update(
            state_dir=state_dir,
            log_dir=checked.log_dir or state_dir / "logs",
            work_dir=checked.work_dir or state_dir,
            boot_timeout_s=boot_timeout_s,
        )
        return cls(**values)
