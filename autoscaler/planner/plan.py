"""`plan()`: decide launches, drains and terminations from one snapshot. Pure.

The order of the steps is the design:

1. **Clean up** what is certainly dead or stuck (lost, preempted, past boot timeout,
   drained): terminating it is never wrong and frees pool slots for step 3.
2. **Fit** pending tasks onto capacity that exists or is already booting, before
   buying anything. Pools are tried in cost order, so static (on-prem) capacity
   absorbs demand first and cloud pools only take the overflow.
3. **Launch** for what is left: a team at a time, chosen by priority tier and then
   by weighted dominant share, so when a pool max or a budget makes capacity short
   the shortage lands where the policy says it should. Each team's demand is packed
   first-fit-decreasing into instance shapes picked by the pool's capacity-type order
   (spot first) and then by lowest cost per *useful* GPU. A new machine comes from
   the first pool in rank order, unless that pool's best machine is larger than the
   task and a later pool's machine of the same capacity type costs the task less per
   GPU it uses, or as little on a smaller machine (right-sizing).
4. **Scale down**: idle workers that step 2 did not need, past their pool's idle
   timeout or beyond the warm pool its recent task starts justify
   (`planner.warm_pool`), are drained (idle-only, so a worker that just leased a task
   is spared);
   a team over its hard budget has all its capacity drained.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Generic, NamedTuple, Protocol, TypeVar

from autoscaler.admission import right_size
from autoscaler.admission.fit import Need, gpu_type_matches
from autoscaler.admission.gate import Machine, added_spend, gang_limits, placement_refusal
from autoscaler.admission.model import TeamAdmission, from_decision, launched_for
from autoscaler.admission.quota import Quota
from autoscaler.admission.quota import room as quota_room
from autoscaler.lifecycle import WORKER_LEASABLE, InstanceState, WorkerState
from autoscaler.planner.capacity_choice import SPOT, CapacityModel, Option, choose_costed, expected_cost, ranks
from autoscaler.planner.model import (
    BOOTING_STATES,
    DEAD_STATES,
    LIVE_STATES,
    SHARED_TEAM,
    DemandGroup,
    Drain,
    Hold,
    InstanceView,
    Launch,
    OfferingView,
    Plan,
    PlanInput,
    PoolView,
    QueueView,
    Terminate,
)
from autoscaler.planner.warm_pool import WARM_FLOOR_S
from autoscaler.policy.schema import Decision, TeamDecision

INF = math.inf
# An instance whose agent registered (it may have left since).
_REGISTERED = frozenset({InstanceState.READY, InstanceState.DRAINING})


@dataclass(frozen=True, slots=True)
class _Unit:
    """The shape of one queued task. One `_Unit` stands for every task of a demand
    group: they are identical, so the planner carries `(unit, count)` runs instead of
    one object per task (10,000 tasks of 3,000 shapes are 3,000 objects). CPU-only
    tasks (gpus == 0) need one slot of a GPU-less machine."""

    team: str
    queue: str
    gpus: int
    gpu_type: str | None
    queue_priority: int
    priority: int
    order: float  # oldest first within equal priorities (seconds since epoch)
    need: int  # planner units: GPUs, or one task slot for CPU work
    # Built once per shape and shared, not per task: at 10x a plan appends ~100,000
    # answers, and each fresh tuple would live until the plan is returned, feeding
    # the garbage collector's full passes over the whole process.
    answer: tuple[str, int]  # (queue, gpus), as recorded in a launch's answers
    team_queue: tuple[str, str]
    on_demand_first: bool = False  # retried after a spot reclaim: on-demand before spot
    cpus: float = 0.0
    memory_mb: int = 0
    runtime_h: float | None = None  # expected run time (capacity choice)
    checkpoints: str | None = None
    reclaims_so_far: int = 0  # spent of the wait target (capacity choice)

    @property
    def sized(self) -> bool:
        """Asks for CPUs or memory: first fit must look at those too."""
        return self.cpus > 0 or self.memory_mb > 0

    @property
    def ask(self) -> Need:
        """What one task of this shape asks for, as admission reads it."""
        return Need(self.gpus, self.gpu_type, self.cpus, self.memory_mb)


@dataclass(slots=True)
class _Run:
    """Tasks of one shape still to place, in a team's launch queue."""

    unit: _Unit
    left: int


@dataclass(slots=True)
class _Slot:
    """Free capacity on a worker or a booting instance, in planner units: GPUs on a GPU
    machine, one task slot on a GPU-less one."""

    pool: str
    gpu_machine: bool
    gpu_type: str | None
    free: int
    worker_id: str | None = None
    used: bool = False
    cpus_free: float | None = None  # None: not known, so not limiting
    mem_free: int | None = None
    # Nothing runs or is held there (an idle worker, a booting instance): one rank of a
    # gang may count on it.
    whole: bool = False


@dataclass(slots=True)
class _Bin:
    """A planned new instance being filled with one team's units."""

    team: str
    pool: str
    offering: OfferingView
    free: int
    answers: list[tuple[str, int]] = field(default_factory=list)
    cpus_free: float | None = None
    mem_free: int | None = None
    choice: str = ""  # why this capacity type, with the numbers (capacity choice)
    smaller: tuple[right_size.Size, ...] = ()  # `admission.right_size`, for the instance


class _HasFree(Protocol):
    free: int
    cpus_free: float | None
    mem_free: int | None


def _room_for(item: _HasFree, unit: _Unit) -> bool:
    if unit.cpus > 0 and item.cpus_free is not None and item.cpus_free + 1e-9 < unit.cpus:
        return False
    return not (unit.memory_mb > 0 and item.mem_free is not None and item.mem_free < unit.memory_mb)


_Item = TypeVar("_Item", bound=_HasFree)


def _held_back(unit: _Unit, machine: Machine | None) -> bool:
    """`admission.right_size.held_back` for this unit on this machine while it is whole."""
    return machine is not None and bool(machine.smaller) and right_size.held_back(unit.ask, machine.smaller)


class _TypeMatch:
    """`gpu_type_matches` memoised for one plan: the same few (wish, offered) pairs are
    asked about once per task otherwise, and the check normalises strings each time."""

    def __init__(self) -> None:
        self._memo: dict[tuple[str | None, str | None], bool] = {}

    def __call__(self, wanted: str | None, offered: str | None) -> bool:
        key = (wanted, offered)
        hit = self._memo.get(key)
        if hit is None:
            hit = self._memo[key] = gpu_type_matches(wanted, offered)
        return hit


class _FreeIndex(Generic[_Item]):
    """First fit over items (slots, bins) kept in insertion order, indexed by free size.

    The rule it must reproduce is the plain scan "the first item, in insertion order,
    whose kind fits the unit and whose free >= need". Scanning cost O(items) per task,
    and items that are full were never dropped from a team's bins, so a plan grew
    quadratically. Here items are bucketed by kind (GPU machine or not, GPU type) and
    then by their current free size, each bucket a min-heap of insertion positions:
    the answer is the smallest head among the buckets with size >= need, so a lookup
    costs O(kinds x distinct free sizes), a handful, whatever the fleet size.

    Free sizes only ever shrink, so a taken item's old bucket entry is simply left
    behind and skipped when it reaches a head (lazy deletion): an entry is live iff
    the item's free still equals the bucket's size. Full items (free 0) are never
    indexed, since every unit needs at least 1.
    """

    __slots__ = ("_items", "_kind_key", "_kind_of", "_kinds", "_members", "_open")

    def __init__(self) -> None:
        self._items: list[_Item] = []
        # (gpu_machine, gpu_type, machine) -> free size -> heap of positions in `_items`.
        # The machine (None for planned bins) is what admission looks at: a team may
        # be allowed on some machines of a pool and not on others.
        self._kinds: dict[tuple[bool, str | None, Machine | None], dict[int, list[int]]] = {}
        self._members: dict[tuple[bool, str | None, Machine | None], list[int]] = {}
        self._kind_of: list[dict[int, list[int]]] = []
        self._kind_key: list[Machine | None] = []
        # Items with anything free: a busy fleet's index is often all full, and then
        # every lookup (one per run and pool in step 2) answers at once.
        self._open = 0

    def add(self, item: _Item, gpu_machine: bool, gpu_type: str | None, machine: Machine | None = None) -> int:
        kind = (gpu_machine, gpu_type, machine)
        buckets = self._kinds.setdefault(kind, {})
        pos = len(self._items)
        self._items.append(item)
        self._kind_of.append(buckets)
        self._kind_key.append(machine)
        self._members.setdefault(kind, []).append(pos)
        if item.free > 0:
            heapq.heappush(buckets.setdefault(item.free, []), pos)
            self._open += 1
        return pos

    def free_at(self, pos: int) -> int:
        return self._items[pos].free

    def first_fit(
        self,
        unit: _Unit,
        type_ok: _TypeMatch,
        admit: Callable[[Machine], bool] | None = None,
        *,
        right_sized: bool = True,
    ) -> int | None:
        """Position of the first item `unit` fits on, or None. `admit` says whether the
        unit's team may use a machine (items without one, planned bins, always may).
        `right_sized`: a machine with every GPU free is no fit for a unit that one of its
        pool's smaller machines fits (`admission.right_size`, the lease's rule)."""
        if not self._open:
            return None
        best: int | None = None
        need = unit.need
        items = self._items
        sized = unit.sized
        for (gpu_machine, offered, machine), buckets in self._kinds.items():
            # A kind with nothing free (busy workers, filled slots) is passed over
            # before anything else is asked: with one kind per distinct machine, most
            # kinds of a busy fleet are full.
            if not buckets:
                continue
            # Keep GPU machines for GPU work: a CPU task never counts on a GPU machine.
            if unit.gpus == 0:
                if gpu_machine:
                    continue
            elif not gpu_machine or not type_ok(unit.gpu_type, offered):
                continue
            # Items with all of the machine's GPUs free are the whole ones.
            whole_free = -1
            if right_sized and machine is not None and machine.smaller and _held_back(unit, machine):
                whole_free = machine.gpus
            found: int | None = None
            if sized:
                # CPUs and memory are not indexed (few tasks ask for them): scan this
                # kind's items in insertion order for the first with room for all three.
                for pos in self._members[(gpu_machine, offered, machine)]:
                    if best is not None and pos >= best:
                        break
                    item = items[pos]
                    if item.free >= need and item.free != whole_free and _room_for(item, unit):
                        found = pos
                        break
            else:
                for free in [f for f in buckets if f >= need and f != whole_free]:
                    heap = buckets[free]
                    while heap and items[heap[0]].free != free:
                        heapq.heappop(heap)  # stale: that item has been taken from since
                    if not heap:
                        del buckets[free]
                    elif found is None or heap[0] < found:
                        found = heap[0]
            # Admission is asked last, and only of a kind that would win: it is pure, so
            # asking it of fewer kinds changes no answer, and it is the dearest check.
            if found is None or (best is not None and found >= best):
                continue
            if admit is not None and machine is not None and not admit(machine):
                continue
            best = found
        return best

    def machine_at(self, pos: int) -> Machine | None:
        return self._kind_key[pos]

    def whole_fits(
        self,
        unit: _Unit,
        type_ok: _TypeMatch,
        admit: Callable[[Machine], bool],
        limit: int,
        *,
        right_sized: bool = True,
    ) -> list[int]:
        """Up to `limit` positions, in insertion order, of whole items (nothing running
        or held there) that fit `unit` and admit it: the machines a gang's ranks may
        count on, one rank each (`right_sized`: as `first_fit`). A plain scan: gangs
        are few."""
        out: list[int] = []
        if not self._open:
            return out
        for pos, item in enumerate(self._items):
            if len(out) >= limit:
                break
            if not getattr(item, "whole", False) or item.free < unit.need or not _room_for(item, unit):
                continue
            machine = self._kind_key[pos]
            gpu_machine = machine is not None and machine.gpus > 0
            if unit.gpus > 0 and (machine is None or not gpu_machine):
                continue
            if unit.gpus == 0 and gpu_machine:
                continue
            if unit.gpus > 0 and not type_ok(unit.gpu_type, getattr(item, "gpu_type", None)):
                continue
            if right_sized and _held_back(unit, machine):
                continue
            if machine is not None and not admit(machine):
                continue
            out.append(pos)
        return out

    def can_take(self, pos: int, unit: _Unit) -> bool:
        item = self._items[pos]
        return item.free >= unit.need and _room_for(item, unit)

    def take(self, pos: int, unit: _Unit) -> _Item:
        item = self._items[pos]
        was_open = item.free > 0
        item.free -= unit.need
        if was_open and item.free <= 0:
            self._open -= 1
        if unit.cpus > 0 and item.cpus_free is not None:
            item.cpus_free -= unit.cpus
        if unit.memory_mb > 0 and item.mem_free is not None:
            item.mem_free -= unit.memory_mb
        if item.free > 0:
            heapq.heappush(self._kind_of[pos].setdefault(item.free, []), pos)
        return item


def _pool_cost(pool: PoolView) -> float:
    """USD/h per GPU (or per machine for CPU pools) of the cheapest usable offering.
    Static pools are already paid for: they cost nothing to use."""
    if pool.static:
        return 0.0
    prices = [o.hourly_price / max(o.gpus, 1) for o in pool.offerings if not pool.is_blocked(o)]
    return min(prices) if prices else INF


def _ranked_pools(
    queue: QueueView, pools: dict[str, PoolView], cost: dict[str, float], dec: Decision
) -> list[PoolView]:
    # The policy's pool order wins when it gives one; otherwise static first, then
    # cheapest, the queue's own order breaking ties. A queue the policy restricts
    # (placement: regions, pools) only ever sees its allowed pools.
    qd = dec.queues.get(queue.name)
    allowed = set(qd.allowed_pools) if qd is not None and qd.allowed_pools is not None else None
    order = {name: i for i, name in enumerate(dec.pool_order)}
    known = [(i, pools[n]) for i, n in enumerate(queue.pools) if n in pools and (allowed is None or n in allowed)]
    known.sort(key=lambda ip: (order.get(ip[1].name, len(order)), not ip[1].static, cost[ip[1].name], ip[0]))
    return [p for _, p in known]


def _runs(demand: Iterable[DemandGroup], queues: dict[str, QueueView], inp: PlanInput) -> list[tuple[_Unit, int]]:
    """Demand as (unit, count) runs, one per group, in the input's order."""
    epoch = inp.now.timestamp()
    runs: list[tuple[_Unit, int]] = []
    for g in demand:
        if g.count <= 0 or g.gang is not None:
            continue  # gangs are planned as units (`_plan_gangs`)
        q = queues.get(g.queue)
        order = g.oldest.timestamp() if g.oldest else epoch
        qp = q.priority if q else 0
        need = g.gpus if g.gpus > 0 else 1
        unit = _Unit(
            g.team,
            g.queue,
            g.gpus,
            g.gpu_type,
            qp,
            g.priority,
            order,
            need,
            (g.queue, g.gpus),
            (g.team, g.queue),
            g.after_reclaim,
            g.cpus,
            g.memory_mb,
            g.runtime_h,
            g.checkpoints,
            g.reclaims_so_far,
        )
        runs.append((unit, g.count))
    return runs


def _cleanup(inp: PlanInput, drained_teams: set[str]) -> list[Terminate]:
    pools = {p.name: p for p in inp.pools}
    out: list[Terminate] = []
    for inst in inp.instances:
        pool = pools.get(inst.pool)
        if inst.state in DEAD_STATES:
            why = f"instance {inst.state}: {inst.reason}" if inst.reason else f"instance {inst.state}"
            out.append(Terminate(inst.id, inst.pool, why))
        elif inst.state in BOOTING_STATES and inst.worker_id is None:
            if inst.team in drained_teams:
                out.append(Terminate(inst.id, inst.pool, f"team {inst.team} over its hard budget"))
                continue
            if pool is None:
                continue
            started = inst.launched_at or inst.created_at
            if inp.now - started >= timedelta(seconds=pool.boot_timeout_s):
                out.append(
                    Terminate(
                        inst.id,
                        inst.pool,
                        f"no agent registered within the boot timeout ({pool.boot_timeout_s:g} s)",
                        mark="boot_timeout",
                    )
                )
        elif inst.state in _REGISTERED and inst.worker_state in (None, WorkerState.GONE):
            if inst.state == "draining":
                out.append(Terminate(inst.id, inst.pool, "worker drained"))
            else:
                why = "worker gone (missed heartbeats or exited)"
                out.append(Terminate(inst.id, inst.pool, why, mark="lost"))
    return out


@dataclass(frozen=True, slots=True)
class _Candidates:
    """The offerings of one pool that may answer one shape for one team, best first,
    before the spend headroom is applied; and how many were turned away and why, for
    the hold reason when none is left."""

    ranked: tuple[OfferingView, ...]
    shape_ok: int
    blocked: int
    type_denied: int
    choice: str = ""  # the capacity choice's words, when it ranked them
    # Per ranked offering: the task's expected cost there (the capacity choice's), or
    # its price per useful GPU without a capacity model; comparable across pools.
    scores: tuple[float, ...] = ()


class _OfferingChooser:
    """Picks the offering of a new instance. Everything but the team's spend headroom
    is fixed for the whole plan, so the filtered, ranked candidate list is computed
    once per (pool, team, shape, useful GPUs) and each launch only walks it to the
    first offering the headroom still affords: the best under headroom is the first
    affordable one of the list ranked without it."""

    def __init__(self, type_ok: _TypeMatch, capacity: CapacityModel | None = None) -> None:
        self._type_ok = type_ok
        self._capacity = capacity
        # Keyed by what the list depends on: the pool, the shape, the useful-GPU cap
        # and the two team answers that filter offerings (most teams share them).
        self._memo: dict[
            tuple[
                str,
                int,
                str | None,
                int,
                tuple[str, ...],
                float | None,
                bool,
                float,
                int,
                float | None,
                str | None,
                int,
            ],
            _Candidates,
        ] = {}
        self._biggest: dict[str, int] = {}

    def _candidates(self, pool: PoolView, unit: _Unit, td: TeamDecision, useful_cap: int) -> _Candidates:
        ranked: list[tuple[tuple[float | int | str, ...], int, OfferingView]] = []
        shape_ok = blocked = type_denied = 0
        for i, o in enumerate(pool.offerings):
            if o.capacity_type not in pool.capacity_types:
                continue
            if unit.gpus > 0:
                if o.gpus < unit.gpus or not self._type_ok(unit.gpu_type, o.gpu_type):
                    continue
            elif o.gpus > 0:
                continue
            if o.cpus < unit.cpus or o.memory_mb < unit.memory_mb:
                continue
            shape_ok += 1
            if o.capacity_type not in td.allowed_capacity_types:
                type_denied += 1
                continue
            if pool.is_blocked(o):
                blocked += 1
                continue
            if o.capacity_type == "spot" and td.max_spot_price is not None and o.hourly_price > td.max_spot_price:
                type_denied += 1
                continue
            # Capacity type order is the pool's (spot first: on-demand is the fallback),
            # then cost per GPU the demand will actually use: an 8-GPU machine for 2 GPUs
            # of work is judged by its price / 2, not / 8.
            useful = min(o.gpus, useful_cap) if o.gpus else 1
            # After a reclaim, on-demand goes first and spot becomes the fallback.
            escalated = unit.on_demand_first and o.capacity_type != "on_demand"
            key = (
                int(escalated),
                pool.capacity_types.index(o.capacity_type),
                o.hourly_price / useful,
                o.hourly_price,
                o.instance_type,
                o.zone or "",
            )
            # The position breaks exact ties the way a scan keeping the first best does.
            ranked.append((key, i, o))
        choice = ""
        if self._capacity is not None and ranked:
            ranked, choice = _by_expected_cost(ranked, unit, useful_cap, self._capacity, td, pool)
        ranked.sort(key=lambda r: (r[0], r[1]))
        # Both orderings put the comparable cost at a fixed place of the key: the
        # capacity choice's expected cost (4th), or the price per useful GPU (3rd).
        at = 3 if self._capacity is not None else 2
        scores = tuple(float(k[at]) for k, _, _ in ranked)
        return _Candidates(tuple(o for _, _, o in ranked), shape_ok, blocked, type_denied, choice, scores)

    def choose(
        self, pool: PoolView, unit: _Unit, td: TeamDecision, want_gpus: int, headroom: float
    ) -> tuple[OfferingView | None, str]:
        """The offering to launch for `unit`, or None and why not."""
        offering, why, _, _ = self.choose_scored(pool, unit, td, want_gpus, headroom)
        return offering, why

    def choose_scored(
        self, pool: PoolView, unit: _Unit, td: TeamDecision, want_gpus: int, headroom: float
    ) -> tuple[OfferingView | None, str, float, int]:
        """`choose`, with the pick's cost score (`_Candidates.scores`; inf for none) and
        its spare GPUs: those beyond what the team's queued work would fill."""
        # Useful GPUs are min(offering GPUs, the team's queued GPUs in this queue, at
        # least this task's). Past the pool's largest machine the wish changes nothing,
        # so it is capped there to keep the memo small; CPU work ignores it.
        useful_cap = 0
        if unit.gpus > 0:
            biggest = self._biggest.get(pool.name)
            if biggest is None:
                biggest = self._biggest[pool.name] = max([o.gpus for o in pool.offerings], default=0)
            useful_cap = min(max(want_gpus, unit.gpus), max(biggest, 1))
        memo_key = (
            pool.name,
            unit.gpus,
            unit.gpu_type,
            useful_cap,
            tuple(td.allowed_capacity_types),
            td.max_spot_price,
            unit.on_demand_first,
            unit.cpus,
            unit.memory_mb,
            unit.runtime_h,
            unit.checkpoints,
            unit.reclaims_so_far,
        )
        cands = self._memo.get(memo_key)
        if cands is None:
            cands = self._memo[memo_key] = self._candidates(pool, unit, td, useful_cap)
        for o, score in zip(cands.ranked, cands.scores, strict=True):
            if o.hourly_price <= headroom + 1e-9:
                return o, cands.choice, score, max(o.gpus - useful_cap, 0) if unit.gpus > 0 else 0
        shape = "a CPU-only machine"
        if unit.gpus:
            shape = f"{unit.gpus} GPU(s)" + (f" of type {unit.gpu_type}" if unit.gpu_type else "")
        if unit.cpus:
            shape += f", {unit.cpus:g} CPU(s)"
        if unit.memory_mb:
            shape += f", {unit.memory_mb} MB of memory"
        if cands.shape_ok == 0:
            return None, f"pool {pool.name} has no instance type with {shape}", INF, 0
        if cands.ranked:
            left = "no" if headroom <= 0 else f"{headroom:.2f} USD/h"
            cheapest_over = min(o.hourly_price for o in cands.ranked)
            return (
                None,
                f"spend headroom: {left} left for team {unit.team}, cheapest fit in {pool.name} "
                f"costs {cheapest_over:.2f} USD/h",
                INF,
                0,
            )
        if cands.blocked and not cands.type_denied:
            return None, f"pool {pool.name}: every offering with {shape} is unavailable after capacity errors", INF, 0
        return None, f"pool {pool.name}: the policy allows no offering with {shape} (capacity type, spot cap)", INF, 0


@dataclass(frozen=True, slots=True)
class _Scope:
    """What every step reads and none changes: the snapshot indexed, and who is drained."""

    inp: PlanInput
    pools: dict[str, PoolView]
    queues: dict[str, QueueView]
    cost: dict[str, float]  # USD/h per useful GPU of each pool's cheapest offering
    ranked: dict[str, list[PoolView]]  # per queue, its pools in the order to try them
    by_id: dict[str, InstanceView]
    teams_in_demand: frozenset[str]
    drained_teams: frozenset[str]
    tds: dict[str, TeamDecision]  # the decision for each team with demand

    def team_drained_worker(self, instance_id: str | None) -> bool:
        inst = self.by_id.get(instance_id) if instance_id else None
        return inst is not None and inst.team in self.drained_teams

    def tier(self, team: str) -> int:
        return self.tds[team].priority_tier


@dataclass(frozen=True, slots=True)
class _Bounds:
    """Each pool's instance bounds for this plan: the config's, tightened by the policy."""

    max_eff: dict[str, int]
    min_eff: dict[str, int]


class _Idle(NamedTuple):
    """An idle worker of a cloud pool: its slot, instance, seconds idle and GPUs."""

    slot: _Slot
    inst: InstanceView | None
    idle_s: float
    gpus: int


@dataclass(slots=True)
class _Capacity:
    """Existing and booting capacity by pool, and the idle workers of cloud pools (with
    their seconds idle and GPUs). Step 2 marks the slots it uses; step 4 drains only
    idle ones it did not."""

    slots: dict[str, _FreeIndex[_Slot]]
    idle: list[_Idle]


def _scope(inp: PlanInput) -> _Scope:
    dec = inp.decision
    pools = {p.name: p for p in inp.pools}
    queues = {q.name: q for q in inp.queues}
    cost = {name: _pool_cost(p) for name, p in pools.items()}
    teams_in_demand = frozenset(g.team for g in inp.demand)
    # Teams wanting standby machines are admitted like teams with demand (step 3b).
    standby_teams = frozenset(s.team for s in inp.standby.exposure) if inp.standby is not None else frozenset()
    drained = {t for t, td in dec.teams.items() if td.drain}
    if dec.default_team.drain:
        drained |= teams_in_demand | {i.team for i in inp.instances if i.team}
    return _Scope(
        inp,
        pools,
        queues,
        cost,
        {q.name: _ranked_pools(q, pools, cost, dec) for q in inp.queues},
        {i.id: i for i in inp.instances},
        teams_in_demand,
        frozenset(drained),
        {t: dec.team(t) for t in teams_in_demand | standby_teams},
    )


def _fail_safe_notes(dec: Decision) -> list[str]:
    if not dec.fail_safe:
        return []
    return [
        f"policy could not be evaluated ({dec.error}): holding, nothing is launched (not even for pool "
        "minimums), running work is kept, idle machines still drain"
    ]


def _bounds(inp: PlanInput) -> _Bounds:
    max_eff: dict[str, int] = {}
    min_eff: dict[str, int] = {}
    for p in inp.pools:
        pd = inp.decision.pools.get(p.name)
        # The policy may only tighten the config's bounds, never widen them.
        hi, lo = p.max_instances, p.min_instances
        if pd is not None and pd.max_instances is not None:
            hi = min(hi, pd.max_instances)
        if pd is not None and pd.min_instances is not None:
            lo = max(lo, pd.min_instances)
        max_eff[p.name] = max(hi, 0)
        min_eff[p.name] = min(lo, max_eff[p.name])
    return _Bounds(max_eff, min_eff)


def _live_counts(inp: PlanInput, gone: set[str]) -> Counter[str]:
    """Instances per pool that count against its max, once the clean-up is done."""
    return Counter(i.pool for i in inp.instances if i.state in LIVE_STATES and i.id not in gone)


def _capacity(sc: _Scope, gone: set[str]) -> _Capacity:
    """Slots on the workers that may lease (not draining, not a drained team's), then
    on booting instances, which come after the workers of their pool."""
    inp, pools = sc.inp, sc.pools
    slots: dict[str, _FreeIndex[_Slot]] = defaultdict(_FreeIndex)
    idle: list[_Idle] = []
    for w in inp.workers:
        if w.state not in WORKER_LEASABLE or sc.team_drained_worker(w.instance_id) or w.pool not in pools:
            continue
        free = w.gpu_count - w.used_gpus if w.gpu_count > 0 else 1 - w.running_tasks
        slot = _Slot(
            w.pool,
            w.gpu_count > 0,
            w.gpu_type,
            max(free, 0),
            worker_id=w.id,
            cpus_free=w.cpus_free,
            mem_free=w.memory_free_mb,
            whole=w.running_tasks == 0 and w.used_gpus == 0 and w.state == WorkerState.IDLE,
        )
        w_inst = sc.by_id.get(w.instance_id) if w.instance_id else None
        slots[w.pool].add(slot, slot.gpu_machine, slot.gpu_type, _machine(pools[w.pool], w.gpu_count, w_inst, w.tenant))
        pool = pools[w.pool]
        if w.state == WorkerState.IDLE and w.running_tasks == 0 and w.idle_since is not None and not pool.static:
            idle.append(_Idle(slot, w_inst, (inp.now - w.idle_since).total_seconds(), w.gpu_count))
    for inst in inp.instances:
        if inst.state in BOOTING_STATES and inst.worker_id is None and inst.id not in gone:
            slot = _Slot(inst.pool, inst.gpus > 0, inst.gpu_type, inst.gpus or 1, whole=True)
            boot_pool = pools.get(inst.pool)
            machine = _machine(boot_pool, inst.gpus, inst, None) if boot_pool else Machine(inst.pool, inst.gpus)
            slots[inst.pool].add(slot, slot.gpu_machine, slot.gpu_type, machine)
    return _Capacity(slots, idle)


class _TeamBook:
    """Each team's admission for this plan and what the plan has given it so far: GPUs
    allocated (quota, fair share) and spend headroom left. Admission is the same rule
    the lease applies (autoscaler.admission): work goes onto a machine only where its
    team may be, within its GPU quota, and where it adds spend (another team's or the
    shared line's machine) within its headroom. Steps 2 and 3 share one book, in turn."""

    def __init__(self, sc: _Scope) -> None:
        dec = sc.inp.decision
        self.running = sc.inp.running_gpus
        self.adms: dict[str, TeamAdmission] = {
            t: from_decision(t, td, fail_safe=dec.fail_safe) for t, td in sc.tds.items()
        }
        self.headroom: dict[str, float] = {
            t: INF if a.headroom_usd_per_hour is None else a.headroom_usd_per_hour for t, a in self.adms.items()
        }
        self.quotas: dict[str, Quota] = {t: a.quota for t, a in self.adms.items() if a.quota is not None}
        # Teams without demand still lend their unused quota (or hold borrowed GPUs).
        for name in {*dec.teams} - set(self.adms):
            other = dec.teams[name]
            if other.nominal_gpus is not None:
                self.quotas[name] = Quota(other.nominal_gpus, other.borrowing_limit_gpus, other.lending_limit_gpus)
        self.allocated: Counter[str] = Counter()
        self.weight = {t: td.priority_weight if td.priority_weight > 0 else 1e-9 for t, td in sc.tds.items()}

    def quota_left(self, team: str) -> int | None:
        """GPUs the team may still be given in this plan (None: no quota)."""
        if team not in self.quotas:
            return None
        held = {t: self.running.get(t, 0) + self.allocated[t] for t in self.quotas}
        return quota_room(team, self.quotas, held)

    def quota_reason(self, u: _Unit, left: int) -> str:
        q = self.quotas[u.team]
        return (
            f"quota: team {u.team} holds or is planned {self.running.get(u.team, 0) + self.allocated[u.team]} "
            f"GPU(s) of nominal {q.nominal_gpus}"
            + (f" + borrowing limit {q.borrowing_limit_gpus}" if q.borrowing_limit_gpus is not None else "")
            + f"; {left} more may start now, a task needs {u.gpus}"
        )

    def admitter(self, u: _Unit) -> Callable[[Machine], bool]:
        adm = self.adms[u.team]
        headroom = self.headroom

        def admit(machine: Machine) -> bool:
            if placement_refusal(adm, machine) is not None:
                return False
            cost = added_spend(adm, machine, u.gpus)
            if cost <= 1e-12:
                return True
            return adm.may_scale_up and not adm.fail_safe and cost <= headroom[u.team] + 1e-9

        return admit

    def charge(self, u: _Unit, machine: Machine | None) -> None:
        if machine is not None:
            self.headroom[u.team] -= added_spend(self.adms[u.team], machine, u.gpus)

    def share(self, team: str) -> float:
        # Weighted dominant share on GPUs: running GPUs plus GPUs given by this plan,
        # per unit of weight.
        return (self.running.get(team, 0) + self.allocated[team]) / self.weight[team]


def _ordered_runs(sc: _Scope) -> list[tuple[_Unit, int]]:
    # Tasks are placed one by one in this order, but the tasks of a group are equal and
    # stay adjacent under a stable sort, so the order is kept as runs of one shape.
    runs = _runs(sc.inp.demand, sc.queues, sc.inp)
    runs.sort(key=lambda r: (-sc.tier(r[0].team), -r[0].queue_priority, -r[0].priority, -r[0].gpus, r[0].order))
    return runs


def _fit_existing(
    sc: _Scope,
    runs: list[tuple[_Unit, int]],
    cap: _Capacity,
    book: _TeamBook,
    type_ok: _TypeMatch,
    full: frozenset[str] = frozenset(),
) -> tuple[list[tuple[_Unit, int]], int]:
    """Step 2: each task onto the first pool (rank order) with a slot that fits and
    admits it. Returns what is left, as runs, and how many tasks were placed. In the
    `full` pools (at their max) right-sizing is lifted: no smaller machine can be bought."""
    remaining: list[tuple[_Unit, int]] = []
    placed_existing = 0
    # Free capacity only shrinks during this step, so once a task of some shape finds no
    # slot in its queue's pools, no later task of that shape will: the rest of its run,
    # and every later run of that shape, go straight to step 3.
    no_fit: set[tuple[str, str, int, str | None, float, int]] = set()
    for u, n in runs:
        placed = 0
        shape = (u.team, u.queue, u.gpus, u.gpu_type, u.cpus, u.memory_mb)
        if shape not in no_fit:
            candidates = [
                (cap.slots[p.name], p.name not in full) for p in sc.ranked.get(u.queue, ()) if p.name in cap.slots
            ]
            admit = book.admitter(u)
            while placed < n:
                left = book.quota_left(u.team)
                if left is not None and u.gpus > left:
                    break  # step 3 holds the rest with the quota reason
                for index, right_sized in candidates:
                    pos = index.first_fit(u, type_ok, admit, right_sized=right_sized)
                    if pos is not None:
                        machine = index.machine_at(pos)
                        while True:
                            index.take(pos, u).used = True
                            book.charge(u, machine)
                            book.allocated[u.team] += u.gpus
                            placed += 1
                            # The next task of the run is the same shape: the slots and
                            # pools ahead of this one did not fit or admit it and have
                            # not changed (free capacity and headroom only shrink), so
                            # this slot is its first fit too while it still has room and
                            # admits it. Filling it here spares the search per task.
                            if placed >= n or not index.can_take(pos, u):
                                break
                            if machine is not None and not admit(machine):
                                break
                            left = book.quota_left(u.team)
                            if left is not None and u.gpus > left:
                                break
                        break
                else:
                    no_fit.add(shape)
                    break
        placed_existing += placed
        if placed < n:
            remaining.append((u, n - placed))
    return remaining, placed_existing


_Shape = tuple[str, str, int, str | None, float, int]


@dataclass(frozen=True, slots=True)
class _Packed:
    bins: list[_Bin]
    held: Counter[tuple[str, str, str]]
    held_gpus: Counter[tuple[str, str, str]]
    count: Counter[str]


def _priority_key(sc: _Scope, u: _Unit) -> tuple[int, int, int]:
    """Where a unit stands in the plan's order, size and age aside (lower first)."""
    return (-sc.tier(u.team), -u.queue_priority, -u.priority)


def _plan_gangs_in_order(
    sc: _Scope,
    bounds: _Bounds,
    cap: _Capacity,
    book: _TeamBook,
    type_ok: _TypeMatch,
    packer: _Packer,
    runs: list[tuple[_Unit, int]],
) -> tuple[list[tuple[_Unit, int]], int]:
    """Each gang after the single tasks that outrank it (a higher tier, queue priority
    or priority): those are fitted onto existing capacity and packed into new machines
    first, so a high-priority task never waits behind a low-priority gang for the
    same capacity. Returns the single tasks left for after every gang and how many
    were placed on existing capacity; the gangs' plan is left in `packer.gangs`."""
    i, placed_existing = 0, 0
    plan = _GangPlan([], [], 0, packer.count)
    for u, g in _gang_units(sc):
        j = i
        while j < len(runs) and _priority_key(sc, runs[j][0]) < _priority_key(sc, u):
            j += 1
        if j > i:
            remaining, placed = _fit_existing(sc, runs[i:j], cap, book, type_ok)
            placed_existing += placed
            packer.pack(remaining)
            i = j
        one = _plan_gangs(sc, bounds, packer.count, cap, book, packer.chooser, [(u, g)])
        packer.count = Counter(one.count)
        plan = _GangPlan(plan.launches + one.launches, plan.holds + one.holds, plan.placed + one.placed, one.count)
    packer.gangs = plan
    return runs[i:], placed_existing


class _Packer:
    """Step 3: packs what step 2 left into new machines, a team at a time.

    Teams go by priority tier, then by weighted dominant share, so when a pool max or a
    budget makes capacity short the shortage lands where the policy says it should.
    Each team's tasks are packed first-fit-decreasing into its own planned bins, and a
    new bin is bought from the first pool (rank order) that may take it, in the shape
    the `_OfferingChooser` picks. Everything it changes is its own; `pack` hands it back."""

    def __init__(self, sc: _Scope, bounds: _Bounds, count: Counter[str], book: _TeamBook, type_ok: _TypeMatch) -> None:
        self.sc, self.bounds, self.book, self.type_ok = sc, bounds, book, type_ok
        self.count = Counter(count)
        self.bins: list[_Bin] = []
        # Each team's new instances per pool, indexed by free size for first fit.
        self.bins_by: dict[str, dict[str, _FreeIndex[_Bin]]] = defaultdict(dict)
        self.chooser = _OfferingChooser(type_ok, sc.inp.capacity)
        self._smaller: dict[tuple[str, str, int, float, int], tuple[right_size.Size, ...]] = {}
        self.held: Counter[tuple[str, str, str]] = Counter()
        self.held_gpus: Counter[tuple[str, str, str]] = Counter()
        self.want: Counter[tuple[str, str]] = Counter()
        # A shape that could not get a new machine will not get one later in this plan:
        # counts only grow and headroom only shrinks, so the refusal is remembered.
        self.refused: dict[_Shape, str] = {}
        self._searched_none = False  # set by each _place
        # The gangs' plan, when they were planned between its packs (`_plan_gangs_in_order`).
        self.gangs = _GangPlan([], [], 0, self.count)

    def pack(self, remaining: list[tuple[_Unit, int]]) -> _Packed:
        for u, n in remaining:
            self.want[u.team_queue] += u.gpus * n
        by_tier: dict[int, dict[str, list[tuple[_Unit, int]]]] = defaultdict(lambda: defaultdict(list))
        for u, n in remaining:
            by_tier[self.sc.tier(u.team)][u.team].append((u, n))
        for t in sorted(by_tier, reverse=True):
            self._pack_tier(by_tier[t])
        return _Packed(self.bins, self.held, self.held_gpus, self.count)

    def _hold(self, u: _Unit, reason: str, n: int = 1) -> None:
        self.held[(u.team, u.queue, reason)] += n
        self.held_gpus[(u.team, u.queue, reason)] += u.gpus * n

    def _pack_tier(self, teams: dict[str, list[tuple[_Unit, int]]]) -> None:
        sc, book = self.sc, self.book
        heap: list[tuple[float, int, str]] = []
        pending: dict[str, deque[_Run]] = {}
        for team, team_runs in teams.items():
            td = sc.tds[team]
            if team in sc.drained_teams or not td.may_scale_up:
                why = "; ".join(td.reasons) or ("policy: scale-up frozen" if not td.may_scale_up else "")
                why = f"team {team} may not scale up" + (f": {why}" if why else "")
                if team in sc.drained_teams:
                    why = f"team {team} is over its hard budget: its capacity is being drained"
                for u, n in team_runs:
                    self._hold(u, why, n)
                continue
            # Within a team: larger tasks first (first-fit decreasing) after priorities.
            team_runs.sort(key=lambda r: (-r[0].queue_priority, -r[0].priority, -r[0].gpus, r[0].order))
            pending[team] = deque(_Run(u, n) for u, n in team_runs)
            heapq.heappush(heap, (book.share(team), 0, team))
        served: Counter[str] = Counter()
        # Each team's last placement (its run and bin), kept across turns: only the team
        # fills its own bins, so when its turn comes back nothing ahead of that bin has
        # changed, and the same shape's first fit is still that bin while it has room.
        last: dict[str, tuple[_Run | None, tuple[_FreeIndex[_Bin], int] | None, bool]] = {}
        while heap:
            _, _, team = heapq.heappop(heap)
            td = sc.tds[team]
            queue_of_team = pending[team]
            prev, at, searched = last.get(team, (None, None, False))
            while True:
                run = queue_of_team[0]
                u = run.unit
                run.left -= 1
                if run.left == 0:
                    queue_of_team.popleft()
                left = book.quota_left(team)
                if left is not None and u.gpus > left:
                    self._hold(u, book.quota_reason(u, left))
                    at, searched = None, False
                elif at is not None and run is prev and at[0].can_take(at[1], u):
                    # The task before this one was the same shape, for the same team,
                    # and went into a bin that still has room: that bin is this task's
                    # first fit too. Bins ahead of it did not fit that shape and have
                    # not changed since (only this team fills its bins), so the search
                    # in _place would end there: skip it.
                    at[0].take(at[1], u).answers.append(u.answer)
                elif run is prev and searched:
                    # The last search of this team's bins for this shape found none, and
                    # the only bin added since (the one bought for it) has no room left:
                    # the search would find none again, so go straight to buying.
                    at = self._place(u, td, search_bins=False)
                else:
                    at = self._place(u, td)
                    searched = self._searched_none
                if at is not None:
                    book.allocated[team] += u.gpus
                    self.want[u.team_queue] -= u.gpus
                served[team] += 1
                prev = run
                if not queue_of_team:
                    break
                # The team holding the least per unit of weight goes next; the count
                # breaks ties so CPU work interleaves. Keys are unique (the team name
                # ends them), so "push, then pop the smallest" gives this team back
                # exactly when its key is below the heap's head: skip the round trip.
                key = (book.share(team), served[team], team)
                if heap and heap[0] < key:
                    heapq.heappush(heap, key)
                    last[team] = (prev, at, searched)
                    break

    def smaller(self, pool: PoolView, offering: OfferingView, u: _Unit) -> tuple[right_size.Size, ...]:
        """`_smaller`, once per (pool, offering, shape) in a plan."""
        key = (pool.name, offering.key, u.gpus, u.cpus, u.memory_mb)
        hit = self._smaller.get(key)
        if hit is None:
            hit = self._smaller[key] = _smaller(pool, offering, u)
        return hit

    def _pick(
        self, u: _Unit, td: TeamDecision, reasons: list[str] | None
    ) -> tuple[PoolView, OfferingView, str, float, int] | None:
        """The pool and offering to buy a machine in for `u`, or None. Each pool passed
        over says why in `reasons` when one is given: `_place` asks again with a list
        only for a task it holds, so the words are not built for the thousands placed."""
        max_eff = self.bounds.max_eff
        picked: tuple[PoolView, OfferingView, str, float, int] | None = None
        for pool in self.sc.ranked.get(u.queue, ()):
            if pool.static:
                if reasons is not None:
                    reasons.append(f"static pool {pool.name} is full")
                continue
            if td.allowed_pools is not None and pool.name not in td.allowed_pools:
                if reasons is not None:
                    reasons.append(f"policy keeps team {u.team} out of pool {pool.name}")
                continue
            if pool.backoff_until is not None and pool.backoff_until > self.sc.inp.now:
                if reasons is not None:
                    reasons.append(
                        f"pool {pool.name} backing off after launch errors until {pool.backoff_until:%H:%M:%S}"
                    )
                continue
            if self.count[pool.name] >= max_eff[pool.name]:
                if reasons is not None:
                    reasons.append(f"pool {pool.name} at its max of {max_eff[pool.name]} instances")
                continue
            offering, why, score, spare = self.chooser.choose_scored(
                pool, u, td, self.want[u.team_queue], self.book.headroom[u.team]
            )
            if offering is None:
                if reasons is not None:
                    reasons.append(why)
                continue
            if picked is None:
                picked = (pool, offering, why, score, spare)
                if offering.gpus <= u.gpus:
                    break  # the task's own size: the pool order decides
            elif offering.capacity_type == picked[1].capacity_type and (
                score < picked[3] - 1e-9 or (score <= picked[3] + 1e-9 and offering.gpus < picked[1].gpus)
            ):
                # Right-sizing: the first pool's machine is larger than the task. A later
                # pool's machine of the same capacity type goes instead when it costs the
                # task less per GPU it uses (the first would leave GPUs the team's queued
                # work cannot fill: a 4-GPU machine for one 2-GPU task), or as little on
                # a smaller machine: a machine shared by several tasks is held until the
                # longest of them ends, and run times are not known in advance.
                picked = (pool, offering, why, score, spare)
        return picked

    def _place(self, u: _Unit, td: TeamDecision, *, search_bins: bool = True) -> tuple[_FreeIndex[_Bin], int] | None:
        """Place one task in a bin of its team (new or not): where, or None if held.
        `search_bins=False`: the caller knows no bin of the team fits it. Afterwards
        `_searched_none` says whether no existing bin fitted (the task was held, or a
        new bin was bought for it)."""
        sc = self.sc
        # A bin already planned for this team is free: first fit over them, pools in
        # the queue's rank order, before buying another machine.
        team_bins = self.bins_by[u.team]
        self._searched_none = False
        if search_bins:
            for pool in sc.ranked.get(u.queue, ()):
                index = team_bins.get(pool.name)
                if index is not None:
                    pos = index.first_fit(u, self.type_ok)
                    if pos is not None:
                        index.take(pos, u).answers.append(u.answer)
                        return index, pos
        self._searched_none = True
        shape = (u.team, u.queue, u.gpus, u.gpu_type, u.cpus, u.memory_mb)
        if shape in self.refused:
            self._hold(u, self.refused[shape])
            return None
        picked = self._pick(u, td, None)
        if picked is not None:
            pool, offering, why = picked[0], picked[1], picked[2]
            b = _Bin(
                u.team,
                pool.name,
                offering,
                (offering.gpus or 1) - u.need,
                [u.answer],
                offering.cpus - u.cpus if u.cpus > 0 else offering.cpus,
                offering.memory_mb - u.memory_mb if u.memory_mb > 0 else offering.memory_mb,
                why,
                self.smaller(pool, offering, u),
            )
            index = team_bins.get(pool.name)
            if index is None:
                index = team_bins[pool.name] = _FreeIndex()
            pos = index.add(b, offering.gpus > 0, offering.gpu_type)
            self.bins.append(b)
            self.count[pool.name] += 1
            self.book.headroom[u.team] -= offering.hourly_price
            return index, pos
        reasons: list[str] = []
        self._pick(u, td, reasons)  # the same look (it changes nothing), now saying why
        self.refused[shape] = "; ".join(reasons) or f"queue {u.queue} has no pool"
        self._hold(u, self.refused[shape])
        return None


def _standby(
    sc: _Scope, cap: _Capacity, book: _TeamBook, type_ok: _TypeMatch, packer: _Packer
) -> tuple[list[Launch], list[str]]:
    """Step 3b: standby machines (planner.standby) for running checkpointing work on
    spot, after every queued task had its turn, so a standby never takes capacity,
    quota or headroom a queued task could use. Free capacity that would take a task of
    the shape now (an idle machine, a booting one, free GPUs) counts first and is kept
    from step 4; the rest is launched as spot through the admission a task's machine
    goes through: the team's placement, quota and spend headroom, the pool's max. A
    shared shape (`Standby.pooled`) counts only capacity every one of its teams may
    use, and its machines are launched for no team (no team's quota or headroom is
    spent until a task takes one: the lease gate asks then)."""
    rule = sc.inp.standby
    if rule is None or sc.inp.decision.fail_safe:
        return [], []
    # A team that may not grow holds no spare machines, and shares none either; nor
    # does one that could not take a shared one (no spend headroom left, or no spot).
    growing = {
        team: td
        for team in {s.team for s in rule.exposure}
        if team not in sc.drained_teams and (td := sc.tds[team]).may_scale_up
    }
    if rule.shared:
        rule = rule.pooled(
            {
                team: _placement(td)
                for team, td in growing.items()
                if book.headroom[team] > 1e-9 and SPOT in td.allowed_capacity_types
            }
        )
    launches: list[Launch] = []
    notes: list[str] = []
    for shape, want in rule.wanted():
        exposure = rule.exposure[shape]
        teams = exposure.teams or (shape.team,)
        if any(team not in growing for team in teams):
            continue
        queue = sc.queues.get(shape.queue)
        need = shape.gpus if shape.gpus > 0 else 1
        unit = _Unit(
            shape.team,
            shape.queue,
            shape.gpus,
            shape.gpu_type,
            queue.priority if queue else 0,
            0,
            sc.inp.now.timestamp(),
            need,
            (shape.queue, shape.gpus),
            (shape.team, shape.queue),
            cpus=shape.cpus,
            memory_mb=shape.memory_mb,
            runtime_h=exposure.runtime_h,
            checkpoints="on-signal",
        )
        admitters = [book.admitter(replace(unit, team=team)) for team in teams]

        def admit(machine: Machine, admitters: list[Callable[[Machine], bool]] = admitters) -> bool:
            return all(a(machine) for a in admitters)

        have = 0
        for pool in sc.ranked.get(shape.queue, ()):
            index = cap.slots.get(pool.name)
            while index is not None and have < want:
                pos = index.first_fit(unit, type_ok, admit)
                if pos is None:
                    break
                index.take(pos, unit).used = True
                have += 1
        why = ""
        reason = rule.reason(shape, want)
        while have < want:
            launch, why = _standby_launch(sc, book, packer, unit, teams, reason)
            if launch is None:
                break
            launches.append(launch)
            have += 1
        if have < want:
            notes.append(f"{reason}; only {have} stand by: {why}")
    return launches, notes


def _placement(td: TeamDecision) -> tuple[str, ...] | None:
    """The pools a team may use, in one order (None: any): teams with the same share
    standby machines."""
    return None if td.allowed_pools is None else tuple(sorted(td.allowed_pools))


def _standby_launch(
    sc: _Scope, book: _TeamBook, packer: _Packer, unit: _Unit, teams: tuple[str, ...], reason: str
) -> tuple[Launch | None, str]:
    """One standby machine for `unit`'s shape: the spot offering of least expected cost
    over the queue's pools that admit it, or None and why not. A shared shape's
    machine (unit team SHARED_TEAM) must be one each of its `teams` could hold (they
    share a placement and may all use spot): the first team's offering choice within
    the smallest headroom among them."""
    shared = unit.team == SHARED_TEAM
    if not shared:
        left = book.quota_left(unit.team)
        if left is not None and unit.gpus > left:
            return None, book.quota_reason(unit, left)
    td = sc.tds[teams[0]]
    headroom = min(book.headroom[t] for t in teams)
    best: tuple[PoolView, OfferingView, float] | None = None
    reasons: list[str] = []
    for pool in sc.ranked.get(unit.queue, ()):
        if pool.static or (td.allowed_pools is not None and pool.name not in td.allowed_pools):
            continue
        if pool.backoff_until is not None and pool.backoff_until > sc.inp.now:
            continue
        if packer.count[pool.name] >= packer.bounds.max_eff[pool.name]:
            reasons.append(f"pool {pool.name} at its max of {packer.bounds.max_eff[pool.name]} instances")
            continue
        offering, why, score, _ = packer.chooser.choose_scored(pool, unit, td, unit.gpus, headroom)
        if offering is None or offering.capacity_type != SPOT:
            reasons.append(why or f"pool {pool.name}: spot is not the choice for this shape")
            continue
        if best is None or score < best[2] - 1e-9:
            best = (pool, offering, score)
    if best is None:
        return None, "; ".join(reasons) or f"queue {unit.queue} has no cloud pool"
    pool, offering, _ = best
    packer.count[pool.name] += 1
    if not shared:
        book.headroom[unit.team] -= offering.hourly_price
        book.allocated[unit.team] += unit.gpus
    why = f"{reason}; {offering.key} at {offering.hourly_price:.2f} USD/h"
    return Launch(pool.name, offering, unit.team, (), why, smaller=packer.smaller(pool, offering, unit)), ""


def _team_launches(dec: Decision, bins: list[_Bin]) -> list[Launch]:
    if dec.fail_safe:
        # Fail-safe means hold. Every team is frozen then, so nothing above launched;
        # this keeps it so whatever a failed decision carries.
        return []
    return [Launch(b.pool, b.offering, b.team, tuple(b.answers), _launch_reason(b), smaller=b.smaller) for b in bins]


def _pool_minimums(sc: _Scope, bounds: _Bounds, count: Counter[str]) -> tuple[list[Launch], list[str], Counter[str]]:
    """min_instances for cloud pools, charged to no team, cheapest pools first."""
    dec, min_eff = sc.inp.decision, bounds.min_eff
    count = Counter(count)
    launches: list[Launch] = []
    notes: list[str] = []
    for p in sorted(sc.inp.pools, key=lambda p: sc.cost[p.name]):
        while not dec.fail_safe and not p.static and count[p.name] < min_eff[p.name]:
            cheapest = _cheapest(p)
            if cheapest is None:
                notes.append(f"pool {p.name} is below its min of {min_eff[p.name]}; no offering is free")
                break
            launches.append(
                Launch(p.name, cheapest, SHARED_TEAM, (), f"pool {p.name} keeps at least {min_eff[p.name]} instance(s)")
            )
            count[p.name] += 1
    return launches, notes, count


def _idle_past(sc: _Scope, idle: list[_Idle]) -> list[tuple[_Idle, str]]:
    """The idle workers to drain, longest idle first, each with why: past the pool's
    idle timeout, or (an adaptive pool, with recent starts known) past the warm floor
    and not among the newest idle machines of its kind that the warm pool keeps."""
    warm = sc.inp.warm
    kinds: dict[tuple[str, int], list[_Idle]] = defaultdict(list)
    for x in idle:
        kinds[(x.slot.pool, x.gpus)].append(x)
    out: list[tuple[_Idle, str]] = []
    for (pool_name, gpus), members in kinds.items():
        pool = sc.pools[pool_name]
        rule = warm if pool.warm_pool == "adaptive" else None
        keep = rule.keep(pool_name, gpus) if rule is not None else len(members)
        floor = min(WARM_FLOOR_S, pool.idle_timeout_s)
        # The newest idle machines of the kind are the ones kept warm.
        for rank, x in enumerate(sorted(members, key=lambda x: x.idle_s)):
            if x.idle_s >= pool.idle_timeout_s:
                out.append((x, f"idle timeout {pool.idle_timeout_s:g} s"))
            elif rule is not None and rank >= keep and x.idle_s >= floor:
                out.append((x, rule.reason(pool_name, gpus)))
    return sorted(out, key=lambda o: -o[0].idle_s)


def _scale_down(sc: _Scope, bounds: _Bounds, cap: _Capacity, count: Counter[str]) -> list[Drain]:
    """Step 4: the longest-idle workers step 2 did not use, past their pool's idle
    timeout or beyond the warm pool recent starts justify (planner.warm_pool), down to
    the pool's min; then every worker of a team over its hard budget."""
    inp, min_eff = sc.inp, bounds.min_eff
    count = Counter(count)
    drains: list[Drain] = []
    unused = [x for x in cap.idle if not x.slot.used and x.slot.worker_id is not None]
    for x, why in _idle_past(sc, unused):
        pool = sc.pools[x.slot.pool]
        if count[pool.name] <= min_eff[pool.name]:
            continue
        count[pool.name] -= 1
        assert x.slot.worker_id is not None
        drains.append(
            Drain(
                x.slot.worker_id,
                pool.name,
                f"idle for {x.idle_s:.0f} s ({why})",
                only_if_idle=True,
                instance_id=x.inst.id if x.inst else None,
                deadline_s=inp.drain_deadline_s,
            )
        )
    if sc.drained_teams:
        for w in inp.workers:
            w_inst = sc.by_id.get(w.instance_id) if w.instance_id else None
            if w_inst is not None and w_inst.team in sc.drained_teams and w.state in WORKER_LEASABLE:
                drains.append(
                    Drain(
                        w.id,
                        w.pool,
                        f"team {w_inst.team} is over its hard budget",
                        only_if_idle=False,
                        instance_id=w_inst.id,
                        deadline_s=inp.drain_deadline_s,
                    )
                )
    return drains


def _holds(packed: _Packed) -> tuple[Hold, ...]:
    return tuple(
        Hold(team, queue, n, packed.held_gpus[(team, queue, reason)], reason)
        for (team, queue, reason), n in sorted(packed.held.items())
    )


@dataclass(frozen=True, slots=True)
class _GangPlan:
    launches: list[Launch]
    holds: list[Hold]
    placed: int  # ranks counted on existing or booting machines
    count: Counter[str]


def _gang_units(sc: _Scope) -> list[tuple[_Unit, DemandGroup]]:
    """Each queued gang as (the shape of one rank, its group), in the order single
    tasks are placed (tier, queue priority, priority, size, age)."""
    epoch = sc.inp.now.timestamp()
    out: list[tuple[_Unit, DemandGroup]] = []
    for g in sc.inp.demand:
        if g.gang is None or g.nodes - g.reserved <= 0:
            continue
        q = sc.queues.get(g.queue)
        unit = _Unit(
            g.team,
            g.queue,
            g.gpus,
            g.gpu_type,
            q.priority if q else 0,
            g.priority,
            g.oldest.timestamp() if g.oldest else epoch,
            g.gpus if g.gpus > 0 else 1,
            (g.queue, g.gpus),
            (g.team, g.queue),
            g.after_reclaim,
            g.cpus,
            g.memory_mb,
            g.runtime_h,
            g.checkpoints,
        )
        out.append((unit, g))
    out.sort(key=lambda r: (-sc.tier(r[0].team), -r[0].queue_priority, -r[0].priority, -r[0].gpus, r[0].order))
    return out


def _plan_gangs(
    sc: _Scope,
    bounds: _Bounds,
    count: Counter[str],
    cap: _Capacity,
    book: _TeamBook,
    chooser: _OfferingChooser,
    units: list[tuple[_Unit, DemandGroup]] | None = None,
) -> _GangPlan:
    """Step 2 and 3 for gangs, before single tasks: each gang is one unit of
    `nodes - reserved` machines in ONE pool, one rank per machine. Idle machines (and
    booting ones) of that pool that fit a rank count toward it; only the missing ones
    are launched, as one gang launch of one offering. The whole gang's GPUs (nodes x
    gpus) are asked of the admission gate at once (`gang_limits`), and its launch's
    whole price of the team's headroom. A gang no pool can take whole is held."""
    inp, type_ok = sc.inp, chooser._type_ok
    count = Counter(count)
    launches: list[Launch] = []
    holds: list[Hold] = []
    placed = 0
    for u, g in _gang_units(sc) if units is None else units:
        want = g.nodes - g.reserved
        td = sc.tds[u.team]
        adm = book.adms[u.team]
        total_gpus = u.gpus * g.nodes
        left = book.quota_left(u.team)
        if left is not None and total_gpus > left:
            holds.append(Hold(u.team, u.queue, 1, u.gpus * want, _gang_quota_reason(book, u, g, left)))
            continue

        def gang_admits(
            machine: Machine,
            u: _Unit = u,
            left: int | None = left,
            adm: TeamAdmission = adm,
            total_gpus: int = total_gpus,
        ) -> bool:
            limits = gang_limits(adm, machine, left)
            if limits is None:
                return False
            per_rank, whole = limits
            return (u.gpus == 0 or per_rank >= u.gpus) and (whole is None or whole >= total_gpus)

        reasons: list[str] = []
        chosen: tuple[PoolView, list[int], OfferingView | None, int] | None = None
        for pool in sc.ranked.get(u.queue, ()):
            index = cap.slots.get(pool.name)
            room = count[pool.name] < bounds.max_eff.get(pool.name, 0)
            fits = index.whole_fits(u, type_ok, gang_admits, want, right_sized=room) if index is not None else []
            missing = want - len(fits)
            if missing == 0:
                chosen = (pool, fits, None, 0)
                break
            why = _gang_launch_refusal(sc, bounds, count, pool, u, td, missing)
            if why:
                reasons.append(why)
                continue
            offering, why = chooser.choose(pool, u, td, u.gpus, book.headroom[u.team] / missing)
            if offering is None:
                reasons.append(why)
                continue
            # A machine launched for the team is charged to it (no added spend at the
            # gate); its price comes out of the team's headroom below, for all of them.
            limits = gang_admits(
                Machine(pool.name, offering.gpus, offering.hourly_price, u.team, offering.capacity_type)
            )
            if not limits:
                reasons.append(f"admission: team {u.team} may not hold {total_gpus} GPU(s) in pool {pool.name}")
                continue
            chosen = (pool, fits, offering, missing)
            break
        if chosen is None:
            reason = "; ".join(reasons) or f"queue {u.queue} has no pool"
            holds.append(Hold(u.team, u.queue, 1, u.gpus * want, f"gang of {g.nodes}: {reason}"))
            continue
        pool, fits, offering, missing = chosen
        index = cap.slots.get(pool.name)
        for pos in fits:
            assert index is not None
            slot = index.take(pos, u)
            slot.used, slot.whole = True, False  # one rank per machine
            book.charge(u, index.machine_at(pos))
        placed += len(fits)
        book.allocated[u.team] += u.gpus * want
        if offering is None or inp.decision.fail_safe:
            continue
        book.headroom[u.team] -= offering.hourly_price * missing
        count[pool.name] += missing
        reason = (
            f"team {u.team}: gang {g.gang} needs {g.nodes} machine(s) of {u.gpus} GPU(s) in one pool; "
            f"{g.reserved} rank(s) reserved, {len(fits)} counted on idle or booting machines, {missing} launched "
            f"as {offering.key} at {offering.hourly_price:.2f} USD/h each"
        )
        if pool.max_gang_nodes is not None and missing > pool.max_gang_nodes:
            # The driver cannot launch them as one unit: one machine per launch.
            launches.extend(
                Launch(pool.name, offering, u.team, (u.answer,), reason, smaller=_smaller(pool, offering, u))
                for _ in range(missing)
            )
        else:
            launches.append(
                Launch(
                    pool.name,
                    offering,
                    u.team,
                    (u.answer,),
                    reason,
                    nodes=missing,
                    gang=g.gang,
                    smaller=_smaller(pool, offering, u),
                )
            )
    return _GangPlan(launches, holds, placed, count)


def _gang_quota_reason(book: _TeamBook, u: _Unit, g: DemandGroup, left: int) -> str:
    q = book.quotas[u.team]
    return (
        f"quota: team {u.team} holds or is planned {book.running.get(u.team, 0) + book.allocated[u.team]} "
        f"GPU(s) of nominal {q.nominal_gpus}"
        + (f" + borrowing limit {q.borrowing_limit_gpus}" if q.borrowing_limit_gpus is not None else "")
        + f"; {left} more may start now, gang {g.gang} needs {g.nodes} x {u.gpus}"
    )


def _gang_launch_refusal(
    sc: _Scope, bounds: _Bounds, count: Counter[str], pool: PoolView, u: _Unit, td: TeamDecision, missing: int
) -> str:
    """Why `missing` machines for a gang may not be launched in `pool` ("" if they may)."""
    if pool.static:
        return f"static pool {pool.name} has too few idle machines that fit a rank"
    if u.team in sc.drained_teams:
        return f"team {u.team} is over its hard budget: its capacity is being drained"
    if not td.may_scale_up:
        why = "; ".join(td.reasons) or "policy: scale-up frozen"
        return f"team {u.team} may not scale up: {why}"
    if td.allowed_pools is not None and pool.name not in td.allowed_pools:
        return f"policy keeps team {u.team} out of pool {pool.name}"
    if pool.backoff_until is not None and pool.backoff_until > sc.inp.now:
        return f"pool {pool.name} backing off after launch errors until {pool.backoff_until:%H:%M:%S}"
    if count[pool.name] + missing > bounds.max_eff[pool.name]:
        return (
            f"pool {pool.name} has room for {max(bounds.max_eff[pool.name] - count[pool.name], 0)} more "
            f"instance(s) of its max {bounds.max_eff[pool.name]}, the gang needs {missing}"
        )
    return ""


def plan(inp: PlanInput) -> Plan:
    """The steps of the module docstring, in order; each takes what the ones before
    it produced and returns what the ones after it need."""
    sc = _scope(inp)
    bounds = _bounds(inp)
    # 1. clean up
    terminations = _cleanup(inp, set(sc.drained_teams))
    gone = {t.instance_id for t in terminations}
    count = _live_counts(inp, gone)
    # 2. fit onto existing and booting capacity
    type_ok = _TypeMatch()  # a cache of GPU-type matches, shared by steps 2 and 3
    cap = _capacity(sc, gone)
    book = _TeamBook(sc)
    # Gangs, each as one unit (reuse and launch), in the order of single tasks: the
    # single tasks of a higher tier or priority than a gang are fitted and packed
    # before it (existing capacity, then new machines), those of the same or lower
    # after it (a gang is the harder to place of the two at one priority).
    packer = _Packer(sc, bounds, count, book, type_ok)
    gangs = _GangPlan([], [], 0, count)
    runs = _ordered_runs(sc)
    placed_existing = 0
    if any(g.gang is not None for g in inp.demand):
        runs, placed_existing = _plan_gangs_in_order(sc, bounds, cap, book, type_ok, packer, runs)
        gangs = packer.gangs
    full = frozenset(p for p in sc.pools if count[p] >= bounds.max_eff.get(p, 0))
    remaining, placed = _fit_existing(sc, runs, cap, book, type_ok, full)
    placed_existing += placed
    # 3. launch for the rest, then standby machines, then pool minimums
    packed = packer.pack(remaining)
    standby, standby_notes = _standby(sc, cap, book, type_ok, packer)
    minimums, min_notes, count = _pool_minimums(sc, bounds, packed.count)
    launches = gangs.launches + _team_launches(inp.decision, packed.bins) + standby + minimums
    # 4. scale down
    drains = _scale_down(sc, bounds, cap, count)
    notes = _fail_safe_notes(inp.decision) + standby_notes + min_notes
    holds = _holds(packed)
    if gangs.holds:
        holds = tuple(sorted((*gangs.holds, *holds), key=lambda h: (h.team, h.queue, h.reason)))
    lifted = tuple(i.id for i in inp.instances if i.smaller and i.pool in full and i.state in LIVE_STATES)
    return Plan(
        tuple(launches),
        tuple(drains),
        tuple(terminations),
        holds,
        placed_existing + gangs.placed,
        tuple(notes),
        lifted,
    )


def _machine(pool: PoolView, gpus: int, inst: InstanceView | None, tenant: str | None) -> Machine:
    """A worker's or booting instance's machine as admission sees it (no instance
    record: an on-prem or Slurm machine we do not pay for by the hour)."""
    exclusive = pool.tenancy == "team"
    if inst is None:
        return Machine(pool.name, gpus, exclusive=exclusive, tenant=tenant)
    return Machine(
        pool.name,
        inst.gpus or gpus,
        inst.hourly_price,
        launched_for(inst.team) if pool.unused_cost != "shared" else None,
        inst.capacity_type,
        exclusive=exclusive,
        tenant=launched_for(inst.team) or tenant,
        smaller=inst.smaller,
    )


def _smaller(pool: PoolView, offering: OfferingView, opener: _Unit) -> tuple[right_size.Size, ...]:
    """The smaller machines a new `offering` of `pool` holds GPU work back for
    (`admission.right_size`): those that can be launched now."""
    launchable = (o for o in pool.offerings if o.capacity_type in pool.capacity_types and not pool.is_blocked(o))
    return right_size.smaller_than(offering, launchable, opener.ask)


def _cheapest(pool: PoolView) -> OfferingView | None:
    usable = [o for o in pool.offerings if o.capacity_type in pool.capacity_types and not pool.is_blocked(o)]
    if not usable:
        return None
    order = pool.capacity_types.index
    return min(usable, key=lambda o: (order(o.capacity_type), o.hourly_price, o.instance_type))


def _launch_reason(b: _Bin) -> str:
    gpus = sum(g for _, g in b.answers)
    queues = ", ".join(sorted({q for q, _ in b.answers}))
    what = f"{gpus} GPU(s)" if gpus else "CPU work"
    return (
        f"team {b.team}: {len(b.answers)} queued task(s) in {queues} need {what}; "
        f"{b.offering.key} at {b.offering.hourly_price:.2f} USD/h"
    ) + (f"; capacity: {b.choice}" if b.choice else "")


_Ranked = list[tuple[tuple[float | int | str, ...], int, OfferingView]]


def _by_expected_cost(
    ranked: _Ranked, unit: _Unit, useful_cap: int, capacity: CapacityModel, td: TeamDecision, pool: PoolView
) -> tuple[_Ranked, str]:
    """The one place the capacity choice (planner.capacity_choice) enters the plan: the
    capacity type with the task's least expected cost, among those the policy and the
    pool allow, goes first, and within a type the offering of least expected cost (a
    zone with a lower observed reclaim rate before a cheaper, stormier one, and one that
    keeps the task's wait target before one that misses it). The rule
    "on-demand first after a reclaim" still goes before it for a task that restarts
    from zero."""
    profile = capacity.profile(unit.runtime_h, unit.checkpoints, unit.reclaims_so_far)
    options: dict[str, Option] = {}
    for _, _, o in ranked:
        useful = min(o.gpus, useful_cap) if o.gpus else 1
        options[o.key] = capacity.option(o.key, o.capacity_type, o.hourly_price / max(useful, 1))
    allowed = set(td.allowed_capacity_types) & set(pool.capacity_types)
    costed = [expected_cost(opt, profile, boot_h=capacity.boot_h) for opt in options.values()]
    choice = choose_costed(
        [c for c in costed if c.option.capacity_type in allowed], profile, allowed, boot_h=capacity.boot_h
    )
    order = ranks(costed)
    out: _Ranked = []
    for key, i, o in ranked:
        escalated = key[0] if profile.checkpointing.restarts_from_zero else 0
        # Within the chosen type, as `choose` ranks it: an offering that keeps the wait
        # target first, then the least expected cost (or a zone being tried).
        first = int(o.capacity_type != choice.capacity_type)
        out.append(((escalated, first, *order[o.key], *key[1:]), i, o))
    return out, choice.reason
