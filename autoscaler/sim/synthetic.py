"""A small seeded workload generator for tests and quick what-ifs.

Poisson arrivals per team, log-normal run times, GPU counts drawn from a Philly-like
mix (mostly 1 GPU). The same seed always gives the same tasks.
"""

from __future__ import annotations

import math
import random

from autoscaler.errors import InvalidInput
from autoscaler.sim.workload import TraceTask, Workload

GPU_MIX = ((1, 0.70), (2, 0.05), (4, 0.15), (8, 0.10))


def generate(
    seed: int,
    *,
    tasks: int = 100,
    teams: tuple[str, ...] = ("team-a", "team-b", "team-c"),
    span_s: float = 86400.0,
    median_duration_s: float = 1800.0,
) -> Workload:
    rng = random.Random(seed)
    gpus_choices = [g for g, _ in GPU_MIX]
    weights = [w for _, w in GPU_MIX]
    out: list[TraceTask] = []
    for n in range(tasks):
        team = teams[n % len(teams)]
        arrival = rng.uniform(0.0, span_s)
        # lognormvariate's mu is the log of the median.
        duration = max(60.0, rng.lognormvariate(math.log(median_duration_s), 1.0))
        gpus = rng.choices(gpus_choices, weights)[0]
        out.append(TraceTask(f"syn-{n:05d}", team, round(arrival, 3), round(duration, 3), gpus))
    out.sort(key=lambda t: (t.arrival_s, t.key))
    return Workload(f"synthetic(seed={seed}, tasks={tasks})", tuple(out))


def from_spec(arg: str, seed: int) -> Workload:
    """`synthetic:SEED[:TASKS]` (an empty SEED uses --seed)."""
    parts = arg.split(":") if arg else []
    try:
        wl_seed = int(parts[0]) if parts and parts[0] else seed
        n = int(parts[1]) if len(parts) > 1 else 100
    except ValueError:
        raise InvalidInput(
            f"--workload synthetic:{arg}: expected synthetic:SEED or synthetic:SEED:TASKS with integers"
        ) from None
    if n < 1 or len(parts) > 2:
        raise InvalidInput(f"--workload synthetic:{arg}: expected synthetic:SEED[:TASKS] with TASKS >= 1")
    return generate(wl_seed, tasks=n)
