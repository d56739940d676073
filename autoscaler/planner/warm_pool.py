"""How many idle machines of a kind are worth keeping warm for the next task.

An idle machine kept warm costs its price for every minute it waits; when a task comes
that fits it, it saves that task a boot (the machine a fresh launch would bill while it
boots, and the task's wait for it). This is the ski-rental choice. With tasks that land
on machines of a kind (a pool and a GPU count) at `rate` per hour, the r-th machine of
that kind to go idle most recently expects its next task after about `r / rate` hours.
Keeping it pays when that is shorter than a boot: so `floor(rate x boot)` machines of
the kind are kept, the newest idle first, and the others drain after `WARM_FLOOR_S`.

The rate is what the pool has seen, not a setting: task attempts that started on
machines of the kind in the last `WINDOW_S` (the snapshot's one GROUP BY over
`task_attempts`). Each pool's `idle_timeout_s` stays the longest any machine is kept;
`warm_pool: fixed` keeps every idle machine that long (the behaviour before this rule).

What it saves and what it costs in wait, on the traces: docs/benchmarks.md, "Warm
machines sized by recent starts".
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

# The shortest an idle machine is kept, whatever the rate: a pipeline's next step or a
# retry usually comes within seconds of the last one's end, and the agent's long-poll
# lease takes it without a cycle.
WARM_FLOOR_S = 30.0
# How far back task starts are counted: long enough to hold a few starts of a kind
# used every few minutes, short enough that a busy morning does not keep machines warm
# all afternoon.
WINDOW_S = 3600.0


@dataclass(frozen=True, slots=True)
class WarmPool:
    """Recent task starts by machine kind, and the boot they are weighed against."""

    # (pool, the machine's GPUs) -> task attempts started on such machines in the window.
    starts: Mapping[tuple[str, int], int] = field(default_factory=dict)
    boot_s: float = 180.0
    window_s: float = WINDOW_S

    def rate_per_hour(self, pool: str, gpus: int) -> float:
        return self.starts.get((pool, gpus), 0) * 3600.0 / self.window_s

    def keep(self, pool: str, gpus: int) -> int:
        """Idle machines of the kind worth keeping warm: floor(rate x boot)."""
        return math.floor(self.rate_per_hour(pool, gpus) * self.boot_s / 3600.0 + 1e-9)

    def reason(self, pool: str, gpus: int) -> str:
        """Why an idle machine of the kind beyond what is kept is drained, with the numbers."""
        n, keep = self.starts.get((pool, gpus), 0), self.keep(pool, gpus)
        window = f"{self.window_s / 60:.0f} min"
        if n == 0:
            seen = f"no task started on a {gpus}-GPU machine of pool {pool} in the last {window}"
        else:
            every = 60.0 / self.rate_per_hour(pool, gpus)
            seen = (
                f"{n} task start(s) on {gpus}-GPU machines of pool {pool} in the last {window}, "
                f"one every {every:.1f} min"
            )
        return f"{seen} against a {self.boot_s / 60:.0f} min boot: {keep} kept warm"
