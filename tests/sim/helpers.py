"""Small worlds with known answers: one pool, one 1-GPU instance type at round prices."""

from __future__ import annotations

import shutil
from datetime import datetime
from pathlib import Path

from autoscaler.config import AutoscalerConfig, InstanceTypeConfig, PoolConfig, QueueConfig, TeamConfig
from autoscaler.policy.bundle import shipped_policy_dir
from autoscaler.sim.engine import SIM_START, SimOutcome, SimSettings
from autoscaler.sim.runner import run_simulation
from autoscaler.sim.workload import TraceTask, Workload


def one_pool(
    teams: tuple[str, ...],
    *,
    spot: float = 1.0,
    on_demand: float = 2.0,
    gpus: int = 1,
    tenancy: str = "team",
    warm_pool: str = "adaptive",
) -> AutoscalerConfig:
    pool = PoolConfig(
        name="p",
        provider="fake",
        region="us-east-1",
        zones=["us-east-1a"],
        instance_types=[
            InstanceTypeConfig(name="g1", gpus=gpus, gpu_type="V100", on_demand_price=on_demand, spot_price=spot)
        ],
        max_instances=50,
        idle_timeout_s=300,
        tenancy=tenancy,  # type: ignore[arg-type]
        warm_pool=warm_pool,  # type: ignore[arg-type]
    )
    return AutoscalerConfig(
        deployment="sim",
        teams=[TeamConfig(name=t) for t in teams],
        queues=[QueueConfig(name="gpu", pools=["p"])],
        pools=[pool],
    )


def tasks(*specs: tuple[str, float, float, int]) -> Workload:
    """(team, arrival_s, duration_s, gpus) each."""
    return Workload("test", tuple(TraceTask(f"t{i}", *s) for i, s in enumerate(specs)))


def settings(start: datetime = SIM_START, **kw: object) -> SimSettings:
    base: dict[str, object] = {"boot_delay_s": (120.0, 120.0), "preemption_per_hour": 0.0, "start": start}
    base.update(kw)
    return SimSettings(**base)  # type: ignore[arg-type]


def policy_with_budgets(tmp: Path, budgets_yaml: str) -> Path:
    target = tmp / "policies"
    shutil.copytree(shipped_policy_dir(), target)
    (target / "data" / "budgets.yaml").write_text(budgets_yaml)
    # The shipped policy cases test the shipped budgets; these budgets are the test's own.
    shutil.rmtree(target / "tests", ignore_errors=True)
    return target


def run(
    workload: Workload, config: AutoscalerConfig, tmp: Path, sim: SimSettings, policy: Path | None = None
) -> SimOutcome:
    return run_simulation(workload, config, policy_dir=policy, settings=sim, workdir=tmp)
