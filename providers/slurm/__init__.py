"""Slurm pools: agents submitted as batch jobs into an existing cluster (sbatch/squeue/scancel)."""

from providers.slurm.driver import JOB_SCRIPT, SlurmProvider
from providers.slurm.settings import SlurmSettings

__all__ = ["JOB_SCRIPT", "SlurmProvider", "SlurmSettings"]
