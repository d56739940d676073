"""A managed-spot baseline in the style SkyPilot documents for managed jobs: each task
gets its own spot machine (the cheapest spot offering that fits), launched when it
arrives and terminated when it ends; on a reclaim the job is relaunched at once in the
next zone of the list (wrapping round); a task that checkpoints resumes from its
checkpoint, one that does not restarts from zero. Never on-demand, unless no spot
offering fits the task at all (counted as a fallback).

Same world as ours: boot delays and per-zone reclaim rates from `SimSettings`, the same
checkpoint what-if (`autoscaler.sim.whatif`), the same stop horizon after the last
arrival. Tasks are independent (no shared machines, no capacity limits), so each one's
timeline is played on its own, in trace order, from one seeded stream.

A gang (`nodes` > 1) is one managed job on `nodes` spot machines of its zone, as
SkyPilot's `num_nodes` launches them: it starts when the last of them has booted,
and a reclaim of any of them relaunches all of them in the next zone.
"""

from __future__ import annotations

import random
from typing import Any

from autoscaler.config import AutoscalerConfig
from autoscaler.provisioning import catalog_offerings
from autoscaler.sim.bounds import zone_rate
from autoscaler.sim.engine import SimSettings, kept_s
from autoscaler.sim.summary import Span, TaskResult, summarize
from autoscaler.sim.whatif import checkpoint_every_s, checkpointing_keys
from autoscaler.sim.workload import Workload
from providers.base import Offering

# Offset from the run's seed, so this baseline's draws are its own stream.
_STREAM = 3


def candidates(offers: list[Offering], gpus: int) -> tuple[list[Offering], bool]:
    """The zones to cycle through for a `gpus`-GPU task: every zone of the cheapest
    fitting spot instance type, in config order; (on-demand ones, True) if no spot fits."""
    fits = [o for o in offers if o.gpus >= gpus]
    spot = [o for o in fits if o.capacity_type == "spot"]
    pool = spot or fits
    if not pool:
        return [], False
    cheapest = min(o.hourly_price for o in pool)
    return [o for o in pool if o.hourly_price == cheapest], not spot


def managed_spot(workload: Workload, config: AutoscalerConfig, settings: SimSettings) -> dict[str, Any]:
    rng = random.Random(settings.seed + _STREAM)
    offers = [o for p in config.pools for o in catalog_offerings(p)]
    keys = checkpointing_keys(workload, settings.checkpoints_share, settings.seed)
    lo, hi = settings.boot_delay_s
    forced = settings.reclaim_first_spot_after_s
    stop_at = max((t.arrival_s for t in workload.tasks), default=0.0) + settings.horizon_after_last_arrival_s
    spans: list[Span] = []
    results: list[TaskResult] = []
    used_gpu_s = lost_usd = 0.0
    counts = {"launches": 0, "spot_launches": 0, "on_demand_launches": 0, "fallbacks": 0, "preemptions": 0}
    for task in workload.tasks:
        zones, fallback = candidates(offers, task.gpus)
        every = checkpoint_every_s(task.key, settings.checkpoint_every_s, keys)
        t, kept, wait, done, started, attempt = task.arrival_s, 0.0, 0.0, False, False, 0
        while zones and t <= stop_at:
            o = zones[attempt % len(zones)]
            attempt += 1
            n = task.nodes
            counts["launches"] += n
            counts["on_demand_launches" if fallback else "spot_launches"] += n
            counts["fallbacks"] += int(fallback) * n
            # Each machine boots and is reclaimed on its own; the job starts on the last
            # boot and stops on the first reclaim (a single task: one of each).
            ready = max(t + rng.uniform(lo, hi) for _ in range(n))
            rate = zone_rate(settings, o.zone)
            reclaim = float("inf")
            if o.capacity_type == "spot" and forced is not None:
                reclaim, forced = t + forced, None  # tests: the first spot machine, as in the engine
            elif o.capacity_type == "spot" and rate > 0:
                reclaim = min(t + rng.expovariate(rate) * 3600.0 for _ in range(n))
            if reclaim <= ready:  # reclaimed while booting: relaunch in the next zone
                spans += [Span(task.team, o.gpus, o.hourly_price, t, min(reclaim, stop_at), None)] * n
                counts["preemptions"] += 1
                wait += reclaim - t
                t = reclaim
                continue
            wait += ready - t
            started = True
            need = max(task.duration_s - kept, 0.0)
            end = min(ready + need, reclaim, stop_at)
            ran = max(end - ready, 0.0)
            used_gpu_s += task.total_gpus * ran
            spans += [Span(task.team, o.gpus, o.hourly_price, t, end, ready)] * n
            if ready + need <= min(reclaim, stop_at):
                done = True
                break
            if reclaim > stop_at:
                break  # still running at the horizon: unfinished
            counts["preemptions"] += 1
            # The task checkpoints on the notice when it checkpoints at all (SkyPilot
            # resumes from the task's own checkpoint, wherever the job relaunches).
            saved = kept_s(ran, every, told_to_stop=True)
            kept += saved
            lost_usd += task.total_gpus * (ran - saved) / 3600.0 * o.hourly_price / o.gpus
            t = reclaim
        if not done and t > stop_at:
            wait -= t - stop_at  # a wait is counted up to the horizon only
        results.append(TaskResult(task.team, max(wait, 0.0), done, started, task.work_gpu_s))
    return summarize(results, spans, used_gpu_s=used_gpu_s, lost_usd=lost_usd, counts=counts)
