"""The common shape every system's result is reported in (ours, the ClearML-style
baseline, the static fleet): tasks with their waits, instance spans with their prices,
summarised into cost, GPU-hours (used, idle, booting), waits and per-team figures.

Pure arithmetic on plain records, so the three systems are measured the same way.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TaskResult:
    team: str
    wait_s: float  # total time queued (censored at the end for a task that never ran)
    done: bool  # succeeded
    started: bool
    work_gpu_s: float = 0.0  # the trace's GPU-seconds for this task (run time x GPUs)


@dataclass(frozen=True)
class Span:
    """One instance's billed life, charged to `team` (or per-team `charges` when given)."""

    team: str
    gpus: int
    price: float  # USD/h
    start_s: float
    end_s: float
    ready_s: float | None  # None: never registered

    @property
    def cost(self) -> float:
        return self.price * max(self.end_s - self.start_s, 0.0) / 3600.0


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    k = max(math.ceil(q / 100.0 * len(ordered)) - 1, 0)
    return ordered[min(k, len(ordered) - 1)]


def waits(values: Sequence[float]) -> dict[str, float]:
    return {f"p{q}": round(percentile(values, q), 1) for q in (50, 95, 99)}


def summarize(
    tasks: Iterable[TaskResult],
    spans: Iterable[Span],
    *,
    used_gpu_s: float,
    lost_usd: float,
    counts: dict[str, int],
    team_costs: dict[str, float] | None = None,
) -> dict[str, Any]:
    task_list = list(tasks)
    span_list = list(spans)
    total = sum(s.cost for s in span_list)
    gpu_s = sum(s.gpus * max(s.end_s - s.start_s, 0.0) for s in span_list)
    boot_s = sum(
        s.gpus * max(min(s.ready_s if s.ready_s is not None else s.end_s, s.end_s) - s.start_s, 0.0) for s in span_list
    )
    by_team_cost: dict[str, float] = defaultdict(float)
    if team_costs is not None:
        by_team_cost.update(team_costs)
    else:
        for s in span_list:
            by_team_cost[s.team] += s.cost
    by_team_waits: dict[str, list[float]] = defaultdict(list)
    for t in task_list:
        by_team_waits[t.team].append(t.wait_s)
    teams = sorted(set(by_team_waits) | {t for t, v in by_team_cost.items() if v > 0})
    # Cost per GPU-hour of work that was finished: comparable between systems that
    # finish different shares of the trace (one that gives up looks cheap in total).
    completed_h = sum(t.work_gpu_s for t in task_list if t.done) / 3600
    return {
        "total_cost_usd": round(total, 2),
        "completed_work_gpu_hours": round(completed_h, 1),
        "usd_per_completed_gpu_hour": round(total / completed_h, 3) if completed_h else None,
        "gpu_hours": {
            "total": round(gpu_s / 3600, 1),
            "used": round(used_gpu_s / 3600, 1),
            "booting": round(boot_s / 3600, 1),
            "idle": round(max(gpu_s - boot_s - used_gpu_s, 0.0) / 3600, 1),
        },
        "lost_to_preemption_usd": round(lost_usd, 2),
        "waits_s": waits([t.wait_s for t in task_list]),
        "tasks": {
            "total": len(task_list),
            "succeeded": sum(t.done for t in task_list),
            "never_started": sum(not t.started for t in task_list),
        },
        "counts": dict(counts),
        "teams": {
            team: {
                "cost_usd": round(by_team_cost.get(team, 0.0), 2),
                "waits_s": waits(by_team_waits.get(team, [])),
                "tasks": len(by_team_waits.get(team, [])),
            }
            for team in teams
        },
    }
