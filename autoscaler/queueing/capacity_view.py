"""Spot or on-demand for one task, as the planner would choose it now: for `task why`.

The planner makes the choice for demand groups inside `plan()`
(autoscaler.planner.capacity_choice); this answers the same question for one task a
person asks about, from the config's offerings of its queue's pools (zones from the
pool, prices from its instance types), the ledger's observed reclaim rates and the
capacity types the team's last admission allows.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from autoscaler.admission import store as admission_store
from autoscaler.config import AutoscalerConfig, CapacityConfig
from autoscaler.ledger.reclaims import offering_key, reclaim_prior, reclaim_rates
from autoscaler.planner.capacity_choice import CapacityModel, Option, choose
from autoscaler.planner.reclaim_rate import ReclaimEstimate, posterior
from autoscaler.planner.runtime_estimate import estimate
from autoscaler.planner.standby import STANDBY_MISS
from autoscaler.queueing.runtime_history import runtime_prior
from autoscaler.state.models import QueueRow, Task


def capacity_model(cap: CapacityConfig, found: Mapping[str, ReclaimEstimate]) -> CapacityModel:
    """The planner's capacity model from the config and the offerings' reclaim estimates
    (the reconcile loop's and `task why`'s, one construction)."""
    return CapacityModel(
        {k: e.rate for k, e in found.items()},
        cap.reclaim_prior_per_hour,
        cap.boot_s / 3600.0,
        cap.wait_target_s / 3600.0 if cap.wait_target_s else None,
        estimate([], runtime_prior(cap)).mean_h,
        {k: e.optimistic for k, e in found.items()},
        posterior(0.0, 0.0, reclaim_prior(cap)).optimistic,
        STANDBY_MISS if standby_on(cap) else None,
    )


def standby_on(cap: CapacityConfig) -> bool:
    """Standby machines are kept only for a wait target: without one a reclaimed task's
    wait is not worth an idle machine (the warm pool's ski-rental rule already holds)."""
    return cap.enabled and cap.standby and cap.wait_target_s is not None


def capacity_for(session: Session, task: Task, config: AutoscalerConfig, *, now: datetime) -> dict[str, Any] | None:
    """The choice and its numbers, or None when the model is off or no pool of the
    task's queue offers a machine it fits."""
    cap = config.capacity
    if not cap.enabled:
        return None
    queue = session.get(QueueRow, task.queue)
    pools = {p.name: p for p in config.pools}
    model = capacity_model(cap, reclaim_rates(session, cap, now=now))
    options: list[Option] = []
    allowed_by_pools: set[str] = set()
    for name in (queue.pools or []) if queue is not None else []:
        pool = pools.get(str(name))
        if pool is None or pool.provider == "static":
            continue
        allowed_by_pools |= set(pool.capacity_types)
        for it in pool.instance_types:
            if it.gpus < task.gpus or (task.gpus == 0 and it.gpus > 0):
                continue
            per = max(task.gpus, 1) / max(it.gpus, 1) if it.gpus else 1.0  # the task's share of the machine
            for ct, price in (("on_demand", it.on_demand_price), ("spot", it.spot_price)):
                if price is None or ct not in pool.capacity_types:
                    continue
                zones: list[str | None] = list(pool.zones) or [None]
                for zone in zones:
                    key = offering_key(ct, it.name, zone)
                    options.append(model.option(key, ct, price * per))
    if not options:
        return None
    table = admission_store.load(session)
    team_allows = set(table.of(task.team).allowed_capacity_types) if table is not None else {"spot", "on_demand"}
    runtime_h = (task.runtime_estimate or {}).get("mean_h")
    # Every machine-caused end so far (a reclaim mostly) cost the task one boot of wait,
    # or, covered by standby machines, one with the standby miss chance.
    profile = model.profile(float(runtime_h) if runtime_h else None, task.checkpoints, task.interruptions or 0)
    choice = choose(options, profile, team_allows & allowed_by_pools, boot_h=model.boot_h)
    chosen = choice.chosen
    return {
        "capacity_type": choice.capacity_type,
        "offering": chosen.option.key if chosen else None,
        "expected_cost_usd": round(chosen.expected_cost, 4) if chosen else None,
        "spot_expected_cost_usd": round(choice.best_spot.expected_cost, 4) if choice.best_spot else None,
        "on_demand_expected_cost_usd": round(choice.best_on_demand.expected_cost, 4) if choice.best_on_demand else None,
        "wait_target_s": round(profile.wait_target_h * 3600.0, 1) if profile.wait_target_h else None,
        "reclaims_so_far": task.interruptions or 0,
        "boots_waited_so_far": profile.reclaims_so_far,
        "standby_miss_chance": profile.standby_miss,
        "spot_wait_miss_chance": round(choice.best_spot.wait_miss_chance, 6) if choice.best_spot else None,
        "reason": choice.reason,
    }
