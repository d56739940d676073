"""What machine shapes a queue can ever offer, from the config alone. Pure.

A task that fits none of the shapes of its queue's pools would wait forever, so
enqueue refuses it (`Catalog.refusal`) and a task already queued when a new config
takes its shape away is marked unschedulable (`autoscaler.queueing.unschedulable`).

Where a pool's shapes come from:

- its `instance_types` (every provider: the planner launches only those);
- a static pool's declared `options.machines` as well (their GPUs and GPU type);
- a local pool without instance types: its `simulated_gpus`.

A field the config does not declare is never a reason to refuse: an instance type
without `cpus`/`memory_mb` (the defaults are placeholders) or a machine without a
`gpu_type` is not checked on that account. A pool whose shapes cannot be known from
the config (no instance types, a static machine given by name only, a pool the config
does not have) makes its whole queue unknown: nothing is refused there, since a
machine that joins with the pool's join token may be any size.

Matching is `admission.fit.misfit`, the rule the planner and `lease` apply.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from autoscaler.admission.fit import Need, Room, misfit
from autoscaler.config import AutoscalerConfig, InstanceTypeConfig, PoolConfig


@dataclass(frozen=True, slots=True)
class Shape:
    """One machine shape a pool may offer."""

    pool: str
    room: Room

    def describe(self) -> str:
        r = self.room
        parts = []
        if r.gpus:
            parts.append(f"{r.gpus}x {r.gpu_type}" if r.gpu_type else _n(r.gpus, "GPU"))
        if r.cpus is not None:
            parts.append(_n(r.cpus, "CPU"))
        if r.memory_mb is not None:
            parts.append(f"{r.memory_mb} MB")
        if not parts:
            parts.append("no GPUs")
        return f"{', '.join(parts)} in pool {self.pool}"


def _n(value: float, unit: str) -> str:
    return f"{value:g} {unit}{'' if value == 1 else 's'}"


def _from_instance_type(pool: str, it: InstanceTypeConfig) -> Shape:
    declared = it.model_fields_set
    return Shape(
        pool,
        Room(
            gpus=it.gpus,
            gpu_type=it.gpu_type,
            cpus=float(it.cpus) if "cpus" in declared else None,
            memory_mb=it.memory_mb if "memory_mb" in declared else None,
        ),
    )


def _static_machine(pool: str, raw: Any) -> Shape | None:
    """A declared on-prem machine, or None when its GPU count is not declared."""
    if not isinstance(raw, Mapping) or not isinstance(raw.get("gpus"), int) or isinstance(raw.get("gpus"), bool):
        return None
    gpu_type = raw.get("gpu_type")
    return Shape(pool, Room(gpus=int(raw["gpus"]), gpu_type=gpu_type if isinstance(gpu_type, str) else None))


def pool_shapes(pool: PoolConfig) -> tuple[Shape, ...] | None:
    """Every shape the pool may offer, or None when the config cannot tell."""
    shapes = [_from_instance_type(pool.name, it) for it in pool.instance_types]
    if pool.provider == "static":
        machines = pool.options.get("machines") or []
        if not isinstance(machines, list):
            return None
        for raw in machines:
            shape = _static_machine(pool.name, raw)
            if shape is None:
                return None
            shapes.append(shape)
    if not shapes and pool.provider == "local" and pool.simulated_gpus is not None:
        sim = pool.simulated_gpus
        shapes.append(Shape(pool.name, Room(gpus=sim.count, gpu_type=sim.model if sim.count else None)))
    return tuple(shapes) or None


def _max_machines(pool: PoolConfig) -> int:
    if pool.provider == "static":
        machines = pool.options.get("machines") or []
        return len(machines) if isinstance(machines, list) else 0
    return pool.max_instances


def _checkable(need: Need, room: Room) -> Need:
    # A GPU type the config does not declare is not checked (see the module docstring).
    return replace(need, gpu_type=None) if room.gpus and room.gpu_type is None else need


def _fits(need: Need, shape: Shape) -> bool:
    return misfit(_checkable(need, shape.room), shape.room) is None


@dataclass(frozen=True)
class Catalog:
    """The shapes of every pool of one config (None: that pool's shapes are unknown)."""

    pools: Mapping[str, tuple[Shape, ...] | None]
    # The most machines each pool may have at once (a gang needs `nodes` of them).
    max_machines: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def from_config(cls, config: AutoscalerConfig) -> Catalog:
        return cls({p.name: pool_shapes(p) for p in config.pools}, {p.name: _max_machines(p) for p in config.pools})

    def gang_refusal(self, queue: str, pools: Sequence[str], need: Need, nodes: int) -> str | None:
        """Why no pool of `queue` could ever hold `nodes` machines that each fit `need`
        (one line), or None when one could or the config cannot tell. All ranks of a
        gang run in one pool."""
        if nodes <= 1:
            return self.refusal(queue, pools, need)
        refused = self.refusal(queue, pools, need)
        if refused:
            return refused
        if self.shapes(pools) is None:
            return None
        fitting = [p for p in pools if any(_fits(need, s) for s in self.pools.get(p) or ())]
        most = max((self.max_machines.get(p, 0) for p in fitting), default=0)
        if nodes > most:
            where = ", ".join(f"{p} ({self.max_machines.get(p, 0)})" for p in fitting)
            return (
                f"this task needs {nodes} machines at once, and no pool of queue {queue} that fits one rank may "
                f"have more than {most} (max machines: {where}); ask for at most {most} nodes, or raise the "
                "pool's max_instances"
            )
        return None

    def shapes(self, pools: Iterable[str]) -> list[Shape] | None:
        """The shapes of these pools together, or None when any of them is unknown."""
        out: list[Shape] = []
        for name in pools:
            shapes = self.pools.get(name)
            if shapes is None:
                return None
            out.extend(shapes)
        return out or None

    def refusal(self, queue: str, pools: Sequence[str], need: Need) -> str | None:
        """Why no pool of `queue` could ever run `need` (one line), or None when one could
        or when the config cannot tell."""
        shapes = self.shapes(pools)
        if shapes is None or any(_fits(need, s) for s in shapes):
            return None
        return _explain(queue, shapes, need)


def _largest(shapes: Sequence[Shape]) -> Shape:
    return max(shapes, key=lambda s: (s.room.gpus, s.room.cpus or 0.0, s.room.memory_mb or 0))


def _explain(queue: str, shapes: Sequence[Shape], need: Need) -> str:
    head = f"no pool of queue {queue} has a machine with"
    most_gpus = max(s.room.gpus for s in shapes)
    if need.gpus > most_gpus:
        largest = _largest(shapes).describe()
        if most_gpus == 0:
            return f"{head} {_n(need.gpus, 'GPU')} (largest: {largest}); its machines have no GPUs: use a GPU queue"
        return (
            f"{head} {_n(need.gpus, 'GPU')} (largest: {largest}); "
            f"ask for at most {_n(most_gpus, 'GPU')} or use a queue with bigger machines"
        )
    enough = [s for s in shapes if s.room.gpus >= need.gpus]
    typed = [s for s in enough if misfit(replace(_checkable(need, s.room), cpus=0, memory_mb=0), s.room) is None]
    if not typed:
        offered = sorted({s.room.gpu_type for s in enough if s.room.gpu_type})
        kinds = ", ".join(offered) if offered else "none"
        return (
            f"{head} {_n(need.gpus, str(need.gpu_type) + ' GPU')} "
            f"(GPU types offered: {kinds}; largest: {_largest(enough).describe()}); "
            "ask for a GPU type this queue offers or use another queue"
        )
    asked = []
    if need.gpus:
        asked.append(_n(need.gpus, f"{need.gpu_type} GPU") if need.gpu_type else _n(need.gpus, "GPU"))
    if need.cpus > 0:
        asked.append(_n(need.cpus, "CPU"))
    if need.memory_mb > 0:
        asked.append(f"{need.memory_mb} MB of memory")
    what = asked[0] if len(asked) == 1 else f"{', '.join(asked[:-1])} and {asked[-1]}"
    cpus = [s.room.cpus for s in typed if s.room.cpus is not None]
    mems = [s.room.memory_mb for s in typed if s.room.memory_mb is not None]
    limits = []
    if cpus and need.cpus > max(cpus) + 1e-9:
        limits.append(_n(max(cpus), "CPU"))
    if mems and need.memory_mb > max(mems):
        limits.append(f"{max(mems)} MB")
    hint = f"ask for at most {' and '.join(limits)}" if limits else "ask for no more than one machine has"
    biggest = max(typed, key=lambda s: (s.room.cpus or 0.0, s.room.memory_mb or 0, s.room.gpus))
    return f"{head} {what} (largest: {biggest.describe()}); {hint} or use a queue with bigger machines"


__all__ = ["Catalog", "Shape", "pool_shapes"]
