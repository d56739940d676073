"""Plain data the planner reads and writes (frozen dataclasses, no ORM objects).

The snapshot side (`PlanInput` and its views) is what one reconcile cycle observed;
the plan side (`Launch`, `Drain`, `Terminate`, `Hold`) is what it should do and why.
Everything carries the reasons `autoscaler explain` shows to people.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from autoscaler.admission.model import SHARED_TEAM as SHARED_TEAM  # re-exported: launches name it
from autoscaler.admission.right_size import Size
from autoscaler.lifecycle import INSTANCE_BOOTING, INSTANCE_DEAD, INSTANCE_LIVE
from autoscaler.planner.capacity_choice import CapacityModel
from autoscaler.planner.standby import Standby
from autoscaler.planner.warm_pool import WarmPool
from autoscaler.policy.schema import Decision

# Every record here is slotted: a 10x snapshot holds ~100,000 of them, and without a
# per-object __dict__ they take half the memory and half the garbage collector's work.

# The instance states the planner reads (see `autoscaler.lifecycle` for each meaning).
LIVE_STATES = INSTANCE_LIVE
BOOTING_STATES = INSTANCE_BOOTING
DEAD_STATES = INSTANCE_DEAD


@dataclass(frozen=True, slots=True)
class DemandGroup:
    """`count` queued tasks sharing one shape (the snapshot aggregates, so 10,000 tasks
    with a handful of shapes cost a handful of rows)."""

    queue: str
    team: str
    gpus: int
    gpu_type: str | None
    priority: int
    count: int
    oldest: datetime | None = None
    # The last attempt of these tasks was ended by a spot reclaim: launch on-demand for
    # them where the team may use it, so a long task is not reclaimed again and again
    # until its attempts run out (what the simulator showed on the Philly traces).
    after_reclaim: bool = False
    # CPUs and memory each task asks for (0: no request).
    cpus: float = 0.0
    memory_mb: int = 0
    # Expected run time (hours; its quarter-octave class) and what the tasks survive
    # (none | on-signal | every:MIN; None: none): the capacity choice's input.
    runtime_h: float | None = None
    checkpoints: str | None = None
    # Machine-caused ends these tasks already waited through (counted for tasks a spot
    # reclaim requeued; 0 otherwise): each cost one boot of their wait target.
    reclaims_so_far: int = 0
    # A multi-node task (a gang) is a group of its own (`count` 1): `gang` is its task
    # id, `nodes` its ranks (one per machine) and `reserved` the ranks it already holds,
    # so it wants `nodes - reserved` more machines, all in one pool. None: single-node.
    gang: str | None = None
    nodes: int = 1
    reserved: int = 0

    @property
    def machines(self) -> int:
        """Machines this group still wants: its tasks, or a gang's ranks not yet reserved."""
        return self.count if self.gang is None else max(self.nodes - self.reserved, 0)


@dataclass(frozen=True, slots=True)
class OfferingView:
    instance_type: str
    capacity_type: str
    zone: str | None
    gpus: int
    gpu_type: str | None
    hourly_price: float
    cpus: int = 1
    memory_mb: int = 1024

    @property
    def key(self) -> str:
        """Same as `providers.base.Offering.key`: the unit a capacity error blocks."""
        return f"{self.capacity_type}/{self.instance_type}/{self.zone or '-'}"


@dataclass(frozen=True, slots=True)
class PoolView:
    name: str
    provider: str
    static: bool
    capacity_types: tuple[str, ...]
    min_instances: int
    max_instances: int
    idle_timeout_s: float
    boot_timeout_s: float
    offerings: tuple[OfferingView, ...] = ()
    region: str | None = None
    # Offering keys, zones or "*" (the whole pool) marked unavailable after errors.
    blocked: frozenset[str] = frozenset()
    backoff_until: datetime | None = None
    tenancy: str = "team"  # team | shared: may teams share a machine
    unused_cost: str = "launcher"  # launcher | shared: who pays for free GPUs (the ledger's rule)
    # The most machines one gang launch may ask the driver for (`Capabilities.max_gang_nodes`);
    # None: no driver limit. Past it a gang's machines are launched one by one.
    max_gang_nodes: int | None = None
    # adaptive: idle machines beyond what recent starts justify drain early (planner.warm_pool);
    # fixed: every idle machine is kept for idle_timeout_s.
    warm_pool: str = "adaptive"

    def is_blocked(self, offering: OfferingView) -> bool:
        b = self.blocked
        return bool(b) and ("*" in b or offering.key in b or f"zone:{offering.zone}" in b)


@dataclass(frozen=True, slots=True)
class QueueView:
    name: str
    pools: tuple[str, ...]
    priority: int = 0


@dataclass(frozen=True, slots=True)
class WorkerView:
    id: str
    pool: str
    state: str  # idle | busy | draining
    gpu_count: int
    used_gpus: int
    running_tasks: int
    gpu_type: str | None = None
    idle_since: datetime | None = None
    instance_id: str | None = None  # our Instance.id, when the worker runs on one of ours
    # CPUs and memory its running tasks leave free; None: the agent did not report them.
    cpus_free: float | None = None
    memory_free_mb: int | None = None
    # The team whose work it runs now (one team; None when idle or shared by several).
    tenant: str | None = None


@dataclass(frozen=True, slots=True)
class InstanceView:
    id: str
    pool: str
    state: str
    gpus: int
    gpu_type: str | None
    instance_type: str
    capacity_type: str
    hourly_price: float
    created_at: datetime
    team: str | None = None
    launched_at: datetime | None = None
    worker_id: str | None = None
    worker_state: str | None = None  # None: no worker registered yet
    reason: str = ""  # why it is preempted (the spot notice's words); "" otherwise
    smaller: tuple[Size, ...] = ()  # `admission.right_size`: recorded at launch


@dataclass(frozen=True, slots=True)
class PlanInput:
    now: datetime
    queues: tuple[QueueView, ...]
    pools: tuple[PoolView, ...]
    demand: tuple[DemandGroup, ...]
    workers: tuple[WorkerView, ...]
    instances: tuple[InstanceView, ...]
    decision: Decision = field(default_factory=Decision)
    # GPUs each team holds now (running tasks): the starting point of fair share.
    running_gpus: Mapping[str, int] = field(default_factory=dict)
    # How long a drained worker may finish its tasks before the agent interrupts them.
    drain_deadline_s: float = 300.0
    # Spot versus on-demand per task by expected cost (planner.capacity_choice); None:
    # the pool's capacity-type order alone (spot first).
    capacity: CapacityModel | None = None
    # Recent task starts by machine kind, for the adaptive warm pool (planner.warm_pool);
    # None: every pool keeps its idle machines for idle_timeout_s.
    warm: WarmPool | None = None
    # Running checkpointing work on spot by shape, for standby machines
    # (planner.standby); None: no standby (no wait target, or turned off).
    standby: Standby | None = None


# ---------------------------------------------------------------- the plan


@dataclass(frozen=True, slots=True)
class Launch:
    """One new instance, answering `answers` (queue, gpus) units of `team`'s demand; or,
    with `gang` set, the `nodes` machines of the offering a gang still lacks, launched
    as one unit (one `LaunchRequest(nodes=..., gang=...)`, one zone)."""

    pool: str
    offering: OfferingView
    team: str
    answers: tuple[tuple[str, int], ...]
    reason: str
    nodes: int = 1
    gang: str | None = None
    # The smaller machines a GPU task waits for rather than take this one whole
    # (`admission.right_size`), recorded on the instance.
    smaller: tuple[Size, ...] = ()

    @property
    def gpus(self) -> int:
        """GPUs of one machine of this launch."""
        return self.offering.gpus

    @property
    def hourly_price(self) -> float:
        """What the whole launch costs per hour (every machine of a gang)."""
        return self.offering.hourly_price * self.nodes


@dataclass(frozen=True, slots=True)
class Drain:
    worker_id: str
    pool: str
    reason: str
    only_if_idle: bool
    instance_id: str | None = None
    deadline_s: float = 300.0


@dataclass(frozen=True, slots=True)
class Terminate:
    instance_id: str
    pool: str
    reason: str
    # The side-exit state recorded before terminating (boot_timeout...), or None.
    mark: str | None = None


@dataclass(frozen=True, slots=True)
class Hold:
    """Demand left waiting, and why (pool full, budget, policy...)."""

    team: str
    queue: str
    tasks: int
    gpus: int
    reason: str


@dataclass(frozen=True, slots=True)
class Plan:
    launches: tuple[Launch, ...] = ()
    drains: tuple[Drain, ...] = ()
    terminations: tuple[Terminate, ...] = ()
    holds: tuple[Hold, ...] = ()
    placed_on_existing: int = 0
    notes: tuple[str, ...] = ()
    # Instances whose right-size rule is lifted (their pool is at its max, so no
    # smaller machine can be bought for the work they hold back).
    right_size_lifted: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """A compact JSON-able form for the decision record."""
        return {
            "launches": [
                {
                    "pool": x.pool,
                    "offering": x.offering.key,
                    "team": x.team,
                    "gpus": x.gpus,
                    "price": x.offering.hourly_price,
                    "tasks": len(x.answers),
                    "reason": x.reason,
                    **({"nodes": x.nodes, "gang": x.gang} if x.gang is not None else {}),
                }
                for x in self.launches
            ],
            "drains": [
                {"worker": d.worker_id, "pool": d.pool, "reason": d.reason, "only_if_idle": d.only_if_idle}
                for d in self.drains
            ],
            "terminations": [
                {"instance": t.instance_id, "pool": t.pool, "reason": t.reason, "mark": t.mark}
                for t in self.terminations
            ],
            "holds": [
                {"team": h.team, "queue": h.queue, "tasks": h.tasks, "gpus": h.gpus, "reason": h.reason}
                for h in self.holds
            ],
            "placed_on_existing": self.placed_on_existing,
            "notes": list(self.notes),
        }
