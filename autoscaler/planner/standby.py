"""Standby machines: booted spot machines kept free for checkpointing tasks a reclaim is
about to requeue, so such a task moves at its notice instead of waiting a fresh boot.

Why: a task that checkpoints on the notice loses no work to a reclaim, but with a wait
target every reclaim costs it one boot of waiting, and a task of hundreds of hours sees
a reclaim every few hours. Without standby the only way to keep its wait target is
on-demand, at about three times the price (docs/capacity.md, "Standby machines").

The rule, per shape of running work (team, queue, GPUs, GPU type, CPUs, memory): the
checkpointing tasks of that shape on spot machines are reclaimed at `rate` per hour in
all (each task's machine's estimated reclaim rate, summed); each reclaim takes a standby
machine, and a replacement standby boots in `boot_h`. Replacements still booting are
then Poisson of mean `rate x boot_h` (an M/G/infinity queue), and a reclaimed task finds
no standby free exactly when `S` or more are booting. So `S` is the smallest count with
`P(N >= S) <= STANDBY_MISS` (1 %), at least one. The capacity choice counts a reclaim of a
covered task as a boot of wait with chance `STANDBY_MISS`, not always
(`capacity_choice.CapacityModel.standby_miss`). A shape whose tasks keep their
targets with a higher miss chance (a few, or not so long) is sized for the highest
that keeps every one of them, up to `MAX_MISS`: one machine for a lone 1,000 h task at
0.24/h, not two.

Tasks on one machine are reclaimed together; the rate counts each task, so the mean is
right, but bursts are larger than Poisson. Standby machines are launched through the
same admission as a task's machine (the team's placement, quota, spend headroom, the
pool's max): the planner's step 3b (`planner.plan`).

Shared (`capacity.standby_scope: shared`, the default): the shapes of teams with the
same placement are one shape (`Standby.pooled`), so a few machines stand by for every
team's tasks of that shape instead of one or more per team. The rate is the teams'
summed rate and the count is sized for the strictest of them. Such a machine is
launched for no team: the shared line pays its idle time, and the team whose reclaimed
task takes it pays from then on, within its own admission (the lease gate).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from autoscaler.admission.model import SHARED_TEAM

# The chance a reclaimed covered task finds no standby free and waits a boot. Not the
# 5 % a p95 target tolerates per task: a task of 1,000 h at 0.24/h lives through 240
# reclaims, and at 5 % each it would wait 12 boots (past a 30 min target at 3 min
# boots); at 1 % it waits 2.4. One machine per shape already gets there wherever the
# shape is reclaimed less than 0.2 times an hour (3 min boots).
STANDBY_MISS = 0.01
# The most a shape's standby is sized to miss, however little its tasks need: the 5 %
# a p95 target tolerates.
MAX_MISS = 0.05
# Never more standby machines than this per shape, however high the rate: past it the
# reclaims come faster than machines boot, and on-demand is the answer.
MAX_STANDBY = 8


@dataclass(frozen=True, slots=True)
class Shape:
    """What a replacement machine must fit: one running task's shape."""

    team: str  # SHARED_TEAM: the shapes of several teams (`Standby.pooled`)
    queue: str
    gpus: int
    gpu_type: str | None = None
    cpus: float = 0.0
    memory_mb: int = 0
    # A shared shape's teams' placement: the pools they may all use (None: any).
    pools: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class Exposure:
    """Running checkpointing tasks of one shape on spot machines."""

    tasks: int
    reclaims_per_hour: float  # summed over the tasks (each its machine's rate)
    # The longest expected run time left among them (hours; None: not known): a standby
    # is placed as for such a task (the calmest zone where that pays).
    runtime_h: float | None = None
    # The largest chance per reclaim of finding no standby free with which every one of
    # them keeps its wait target (`CapacityModel.standby_miss_needed`).
    miss: float = STANDBY_MISS
    # A shared shape's teams, by name.
    teams: tuple[str, ...] = ()


def standby_count(reclaims_per_hour: float, boot_h: float, miss: float = STANDBY_MISS) -> int:
    """The fewest standby machines with which a reclaim finds none free with chance at
    most `miss`: the smallest `S >= 1` with `P(Poisson(rate x boot) >= S) <= miss`."""
    if reclaims_per_hour <= 0.0:
        return 0
    s = 1
    while miss_chance(reclaims_per_hour, boot_h, s) > miss and s < MAX_STANDBY:
        s += 1
    return s


def miss_chance(reclaims_per_hour: float, boot_h: float, count: int) -> float:
    """`P(Poisson(rate x boot) >= count)`: the chance a reclaim finds no standby free."""
    mean = max(reclaims_per_hour, 0.0) * max(boot_h, 0.0)
    if count <= 0:
        return 1.0
    term = below = math.exp(-mean)
    for i in range(1, count):
        term *= mean / i
        below += term
    return max(1.0 - below, 0.0)


@dataclass(frozen=True, slots=True)
class Standby:
    """The running checkpointing work on spot, by shape, and the boot it is weighed against."""

    exposure: Mapping[Shape, Exposure] = field(default_factory=dict)
    boot_h: float = 0.05
    miss: float = STANDBY_MISS
    # Shared across teams (`capacity.standby_scope: shared`): the planner pools the
    # shapes before it sizes them.
    shared: bool = False

    def pooled(self, placement: Mapping[str, tuple[str, ...] | None]) -> Standby:
        """One shape per queue, GPUs, GPU type, CPUs, memory and placement, across the
        teams in `placement` (team -> the pools it may use, None: any); the shapes of
        other teams are left out. Rates and task counts add up; the miss chance is the
        strictest team's, the run time left the longest."""
        merged: defaultdict[Shape, list[tuple[str, Exposure]]] = defaultdict(list)
        for shape, e in self.exposure.items():
            if shape.team not in placement:
                continue
            pools = placement[shape.team]
            key = Shape(SHARED_TEAM, shape.queue, shape.gpus, shape.gpu_type, shape.cpus, shape.memory_mb, pools)
            merged[key].append((shape.team, e))
        out: dict[Shape, Exposure] = {}
        for key, parts in merged.items():
            known = [e.runtime_h for _, e in parts if e.runtime_h is not None]
            out[key] = Exposure(
                sum(e.tasks for _, e in parts),
                sum(e.reclaims_per_hour for _, e in parts),
                max(known) if known else None,
                min(e.miss for _, e in parts),
                tuple(sorted({team for team, _ in parts})),
            )
        return replace(self, exposure=out)

    def miss_for(self, shape: Shape) -> float:
        """The miss chance the shape's standby is sized for: what its tasks need, between
        `miss` (what the capacity choice assumes) and `MAX_MISS`."""
        return min(max(self.exposure[shape].miss, self.miss), MAX_MISS)

    def count(self, shape: Shape) -> int:
        return standby_count(self.exposure[shape].reclaims_per_hour, self.boot_h, self.miss_for(shape))

    def wanted(self) -> list[tuple[Shape, int]]:
        """Standby machines wanted per shape, largest need first (then by name: stable)."""
        out = [(shape, self.count(shape)) for shape in self.exposure]
        out = [(s, n) for s, n in out if n > 0]
        out.sort(
            key=lambda sn: (-sn[0].gpus, sn[0].team, sn[0].queue, sn[0].gpu_type or "", sn[0].cpus, sn[0].memory_mb)
        )
        return out

    def reason(self, shape: Shape, count: int) -> str:
        """Why `count` machines stand by for the shape, with the numbers."""
        e = self.exposure[shape]
        every = 60.0 / e.reclaims_per_hour if e.reclaims_per_hour > 0 else math.inf
        whose = f"teams {', '.join(e.teams)} (shared)" if shape.team == SHARED_TEAM else f"team {shape.team}"
        return (
            f"standby for {whose}: {e.tasks} checkpointing task(s) of {shape.gpus} GPU(s) in "
            f"{shape.queue} run on spot, reclaimed about once every {every:.0f} min in all; with "
            f"{count} machine(s) standing by against a {self.boot_h * 60:.0f} min boot, a reclaimed task "
            f"waits for a boot with chance {miss_chance(e.reclaims_per_hour, self.boot_h, count):.1%}"
        )
