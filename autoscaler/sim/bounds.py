"""The reclaim-aware bound: the least expected cost of each task on the offerings the
config declares, given the zones' spot reclaim rates, summed over the workload.

Per task of d hours on g GPUs, at each fitting offering's per-GPU price p (the task
pays for its share of the machine, as in `baselines.lower_bound`):

- on-demand: p x d;
- spot, task restarts from zero at a reclaim rate r per hour: p x (e^(r d) - 1) / r,
  the expected paid time until an uninterrupted run of d hours (each reclaim after t
  hours wastes t; no boot counted, so it stays a bound);
- spot, task checkpoints on the notice: p x (d + r d x b), one boot of b hours (the
  mean of `SimSettings.boot_delay_s`) per expected reclaim in d hours of run.

The bound is the cheapest of those per task, times g. No system can do better in
expectation with these offerings and rates; `baselines.lower_bound` (spot with no
reclaim) is below it.

A gang of n ranks is one job of n x g GPUs on n machines that each fit a rank: a
reclaim of any of them stops all, so on spot its rate is n x r (n machines, each
reclaimed at r), and it pays all n machines' share the whole time.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from autoscaler.config import AutoscalerConfig
from autoscaler.provisioning import catalog_offerings
from autoscaler.sim.engine import SimSettings
from autoscaler.sim.whatif import checkpoint_every_s, checkpointing_keys
from autoscaler.sim.workload import TraceTask, Workload
from providers.base import Offering

# Beyond this r x d the restart-from-zero cost is astronomically above on-demand;
# stopping here keeps math.exp from overflowing on a 500 h task at a high rate.
_MAX_RD = 50.0


def zone_rate(settings: SimSettings, zone: str | None) -> float:
    """Reclaims per spot instance-hour in a zone (the engine's rule)."""
    return settings.preemption_by_zone.get(zone or "", settings.preemption_per_hour)


def spot_restart_cost(price: float, rate: float, hours: float) -> float:
    """Expected cost of `hours` of work that restarts from zero at each reclaim."""
    if rate <= 0:
        return price * hours
    if rate * hours > _MAX_RD:
        return math.inf
    return price * math.expm1(rate * hours) / rate


def spot_checkpoint_cost(price: float, rate: float, hours: float, boot_h: float) -> float:
    """Expected cost of `hours` of work that resumes after each reclaim, paying one boot."""
    return price * (hours + max(rate, 0.0) * hours * boot_h)


def task_bound(
    task: TraceTask, offers: Iterable[Offering], settings: SimSettings, *, checkpoints: bool
) -> tuple[float, str]:
    """(least expected USD, how: 'on_demand' | 'spot_restart' | 'spot_checkpoint')."""
    usd, how, _, _ = task_bound_parts(task, offers, settings, checkpoints=checkpoints)
    return usd, how


def task_bound_parts(
    task: TraceTask, offers: Iterable[Offering], settings: SimSettings, *, checkpoints: bool
) -> tuple[float, str, float, float]:
    """`task_bound`, and its USD split into the run time at the chosen price (useful
    work) and the rest (expected restarts on spot, or boots for a checkpointing task)."""
    hours = task.duration_s / 3600.0
    nodes = max(task.nodes, 1)
    boot_h = sum(settings.boot_delay_s) / 2.0 / 3600.0
    best, how, best_price = math.inf, "none", 0.0
    for o in offers:
        if o.gpus < task.gpus:
            continue
        per_gpu = o.hourly_price / o.gpus
        if o.capacity_type != "spot":
            cost, kind = per_gpu * hours, "on_demand"
        elif checkpoints:
            rate = nodes * zone_rate(settings, o.zone)
            cost, kind = spot_checkpoint_cost(per_gpu, rate, hours, boot_h), "spot_checkpoint"
        else:
            cost, kind = spot_restart_cost(per_gpu, nodes * zone_rate(settings, o.zone), hours), "spot_restart"
        if cost < best:
            best, how, best_price = cost, kind, per_gpu
    g = task.total_gpus
    useful = best_price * hours * g
    return best * g, how, useful, best * g - useful


def reclaim_aware_bound(workload: Workload, config: AutoscalerConfig, settings: SimSettings) -> dict[str, Any]:
    """The bound over the workload, with how many tasks each choice priced."""
    offers = [o for p in config.pools for o in catalog_offerings(p)]
    keys = checkpointing_keys(workload, settings.checkpoints_share, settings.seed)
    total = 0.0
    by: dict[str, int] = {"on_demand": 0, "spot_restart": 0, "spot_checkpoint": 0}
    for t in workload.tasks:
        # A periodic checkpoint (N > 0) loses up to N minutes per reclaim: priced as a
        # checkpoint on the notice, the bound stays below what such a task can reach.
        ckpt = checkpoint_every_s(t.key, settings.checkpoint_every_s, keys) is not None
        usd, how = task_bound(t, offers, settings, checkpoints=ckpt)
        if how in by:
            total += usd
            by[how] += 1
    return {"usd": round(total, 2), "tasks_by_choice": by, "checkpointing_tasks": len(keys)}
