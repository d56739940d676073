"""Right-sizing: a GPU task does not take a whole idle machine when a smaller machine
of its pool would fit it. Pure; the lease and the planner's step 2 ask it the same way.

Why: a machine is paid for whole while anything runs on it. An 8-GPU on-demand
machine freed by its 8-GPU task, or booted for one, would otherwise take whatever is
queued; a 1-GPU task of hundreds of hours then holds all eight GPUs with seven idle
(the 14-day Philly replay lost 28,577 USD that way, docs/benchmarks.md). Waiting one
boot for a right-sized machine costs minutes; holding the large one costs its other
GPUs for the task's whole run.

The smaller machines are fixed when the machine is launched (`smaller_than`): the
offerings of its pool with its capacity type and GPU type and fewer GPUs, that could be
launched then, less those its own first task (the bin's largest) fits, so a machine
always takes the work it was bought for. A machine we do not pay by the hour (static,
an offering priced 0 such as a Slurm partition's) or did not buy for a task (a pool
minimum) has none, and neither has one in a pool at its max (the planner
lifts the rule there: no smaller machine can be bought, so waiting would only idle it).
CPU-only work is never held back: no GPU machine is ever bought for it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from autoscaler.admission.fit import Need


@dataclass(frozen=True, slots=True, order=True)
class Size:
    """What a smaller machine of the pool has: a task within all three fits it."""

    gpus: int
    cpus: float
    memory_mb: int

    def fits(self, need: Need) -> bool:
        return need.gpus <= self.gpus and need.cpus <= self.cpus + 1e-9 and need.memory_mb <= self.memory_mb


class _Offering(Protocol):
    @property
    def gpus(self) -> int: ...
    @property
    def cpus(self) -> int: ...
    @property
    def memory_mb(self) -> int: ...
    @property
    def capacity_type(self) -> str: ...
    @property
    def gpu_type(self) -> str | None: ...
    @property
    def hourly_price(self) -> float: ...


def held_back(need: Need, smaller: Sequence[Size]) -> bool:
    """True when `need` may not take the whole (all GPUs free) machine whose smaller
    machines are `smaller`: it is GPU work and one of them fits it."""
    return need.gpus > 0 and any(s.fits(need) for s in smaller)


def smaller_than(machine: _Offering, offerings: Iterable[_Offering], opener: Need) -> tuple[Size, ...]:
    """The smaller machines to record for a new `machine` launched for `opener` (its
    largest task), from the pool's launchable `offerings`. Sorted and deduplicated."""
    if machine.gpus <= 0 or opener.gpus <= 0 or machine.hourly_price <= 0:
        return ()  # a GPU-less machine, CPU-only work, or one we do not pay by the hour
    sizes = {
        Size(o.gpus, float(o.cpus), o.memory_mb)
        for o in offerings
        if 0 < o.gpus < machine.gpus and o.capacity_type == machine.capacity_type and o.gpu_type == machine.gpu_type
    }
    return tuple(sorted(s for s in sizes if not s.fits(opener)))


def to_json(smaller: Sequence[Size]) -> list[list[float]] | None:
    """The column's form: None when there is no rule (most machines)."""
    return [[s.gpus, s.cpus, s.memory_mb] for s in smaller] or None


def from_json(value: Any) -> tuple[Size, ...]:
    if not value:
        return ()
    return tuple(Size(int(g), float(c), int(m)) for g, c, m in value)
