"""The planner as it was before the grouped/indexed rewrite (commit b74040e), kept only
as a test oracle: one item per queued task and linear scans, obviously faithful to the
rules in `docs/reconciler.md`. `test_equivalence.py` checks that `planner.plan` gives
exactly the same `Plan` on random inputs. If the planner's behaviour changes on
purpose, change this copy the same way (it is small and slow on purpose).

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
   (spot first) and then by lowest cost per *useful* GPU.
4. **Scale down**: idle workers that step 2 did not need, past their pool's idle
   timeout, are drained (idle-only, so a worker that just leased a task is spared);
   a team over its hard budget has all its capacity drained.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter, defaultdict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta

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
from autoscaler.policy.schema import Decision, TeamDecision

INF = math.inf


def gpu_type_matches(wanted: str | None, offered: str | None) -> bool:
    """`A100` matches `NVIDIA A100-SXM4-80GB`; no wish matches anything (same rule as leasing)."""
    if not wanted:
        return True
    if not offered:
        return False

    def norm(s: str) -> str:
        return s.lower().replace("nvidia", "").replace("-", " ").strip()

    return norm(wanted) in norm(offered)


@dataclass
class _Unit:
    """One queued task. CPU-only tasks (gpus == 0) need one slot of a GPU-less machine."""

    team: str
    queue: str
    gpus: int
    gpu_type: str | None
    queue_priority: int
    priority: int
    order: float  # oldest first within equal priorities (seconds since epoch)

    @property
    def need(self) -> int:
        return self.gpus if self.gpus > 0 else 1


@dataclass
class _Slot:
    """Free capacity on a worker or a booting instance, in planner units: GPUs on a GPU
    machine, one task slot on a GPU-less one."""

    pool: str
    gpu_machine: bool
    gpu_type: str | None
    free: int
    worker_id: str | None = None
    used: bool = False


@dataclass
class _Bin:
    """A planned new instance being filled with one team's units."""

    team: str
    pool: str
    offering: OfferingView
    free: int
    answers: list[tuple[str, int]] = field(default_factory=list)


def _fits(unit: _Unit, gpu_machine: bool, gpu_type: str | None, free: int) -> bool:
    # Keep GPU machines for GPU work: a CPU task never counts on a GPU machine.
    if unit.gpus == 0:
        return not gpu_machine and free >= 1
    return gpu_machine and free >= unit.gpus and gpu_type_matches(unit.gpu_type, gpu_type)


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


def _expand(demand: Iterable[DemandGroup], queues: dict[str, QueueView], inp: PlanInput) -> list[_Unit]:
    epoch = inp.now.timestamp()
    units: list[_Unit] = []
    for g in demand:
        q = queues.get(g.queue)
        order = g.oldest.timestamp() if g.oldest else epoch
        qp = q.priority if q else 0
        unit = (g.team, g.queue, g.gpus, g.gpu_type, qp, g.priority, order)
        units.extend(_Unit(*unit) for _ in range(g.count))
    return units


def _cleanup(inp: PlanInput, drained_teams: set[str]) -> list[Terminate]:
    pools = {p.name: p for p in inp.pools}
    out: list[Terminate] = []
    for inst in inp.instances:
        pool = pools.get(inst.pool)
        if inst.state in DEAD_STATES:
            out.append(Terminate(inst.id, inst.pool, f"instance {inst.state}"))
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
        elif inst.state in ("ready", "draining") and inst.worker_state in (None, "gone"):
            if inst.state == "draining":
                out.append(Terminate(inst.id, inst.pool, "worker drained"))
            else:
                why = "worker gone (missed heartbeats or exited)"
                out.append(Terminate(inst.id, inst.pool, why, mark="lost"))
    return out


def _choose_offering(
    pool: PoolView, unit: _Unit, td: TeamDecision, want_gpus: int, headroom: float
) -> tuple[OfferingView | None, str]:
    """The offering to launch for `unit`, or None and why not."""
    best: tuple[tuple[float | int | str, ...], OfferingView] | None = None
    shape_ok = blocked = type_denied = too_dear = 0
    cheapest_over = INF
    for o in pool.offerings:
        if o.capacity_type not in pool.capacity_types:
            continue
        if unit.gpus > 0:
            if o.gpus < unit.gpus or not gpu_type_matches(unit.gpu_type, o.gpu_type):
                continue
        elif o.gpus > 0:
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
        if o.hourly_price > headroom + 1e-9:
            too_dear += 1
            cheapest_over = min(cheapest_over, o.hourly_price)
            continue
        # Capacity type order is the pool's (spot first: on-demand is the fallback),
        # then cost per GPU the demand will actually use: an 8-GPU machine for 2 GPUs
        # of work is judged by its price / 2, not / 8.
        useful = min(o.gpus, max(want_gpus, unit.gpus)) if o.gpus else 1
        key = (
            pool.capacity_types.index(o.capacity_type),
            o.hourly_price / useful,
            o.hourly_price,
            o.instance_type,
            o.zone or "",
        )
        if best is None or key < best[0]:
            best = (key, o)
    if best is not None:
        return best[1], ""
    shape = "a CPU-only machine"
    if unit.gpus:
        shape = f"{unit.gpus} GPU(s)" + (f" of type {unit.gpu_type}" if unit.gpu_type else "")
    if shape_ok == 0:
        return None, f"pool {pool.name} has no instance type with {shape}"
    if too_dear:
        left = "no" if headroom <= 0 else f"{headroom:.2f} USD/h"
        return None, (
            f"spend headroom: {left} left for team {unit.team}, cheapest fit in {pool.name} "
            f"costs {cheapest_over:.2f} USD/h"
        )
    if blocked and not type_denied:
        return None, f"pool {pool.name}: every offering with {shape} is unavailable after capacity errors"
    return None, f"pool {pool.name}: the policy allows no offering with {shape} (capacity type, spot cap)"


def plan(inp: PlanInput) -> Plan:
    dec = inp.decision
    pools = {p.name: p for p in inp.pools}
    queues = {q.name: q for q in inp.queues}
    cost = {name: _pool_cost(p) for name, p in pools.items()}
    teams_in_demand = {g.team for g in inp.demand}
    drained_teams = {t for t, td in dec.teams.items() if td.drain}
    if dec.default_team.drain:
        drained_teams |= teams_in_demand | {i.team for i in inp.instances if i.team}
    notes: list[str] = []
    if dec.fail_safe:
        notes.append(f"policy could not be evaluated ({dec.error}); growth is frozen, running work is kept")

    # 1. clean up --------------------------------------------------------------------
    terminations = _cleanup(inp, drained_teams)
    gone = {t.instance_id for t in terminations}
    by_id = {i.id: i for i in inp.instances}

    def team_drained_worker(instance_id: str | None) -> bool:
        inst = by_id.get(instance_id) if instance_id else None
        return inst is not None and inst.team in drained_teams

    count: Counter[str] = Counter(i.pool for i in inp.instances if i.state in LIVE_STATES and i.id not in gone)
    max_eff: dict[str, int] = {}
    min_eff: dict[str, int] = {}
    for p in inp.pools:
        pd = dec.pools.get(p.name)
        # The policy may only tighten the config's bounds, never widen them.
        hi, lo = p.max_instances, p.min_instances
        if pd is not None and pd.max_instances is not None:
            hi = min(hi, pd.max_instances)
        if pd is not None and pd.min_instances is not None:
            lo = max(lo, pd.min_instances)
        max_eff[p.name] = max(hi, 0)
        min_eff[p.name] = min(lo, max_eff[p.name])

    # 2. fit onto existing and booting capacity --------------------------------------
    slots: dict[str, list[_Slot]] = defaultdict(list)
    idle_slots: list[tuple[_Slot, InstanceView | None, float]] = []
    for w in inp.workers:
        if w.state not in ("idle", "busy") or team_drained_worker(w.instance_id) or w.pool not in pools:
            continue
        free = w.gpu_count - w.used_gpus if w.gpu_count > 0 else 1 - w.running_tasks
        slot = _Slot(w.pool, w.gpu_count > 0, w.gpu_type, max(free, 0), worker_id=w.id)
        slots[w.pool].append(slot)
        pool = pools[w.pool]
        if (
            w.state == "idle"
            and w.running_tasks == 0
            and w.idle_since is not None
            and not pool.static
            and inp.now - w.idle_since >= timedelta(seconds=pool.idle_timeout_s)
        ):
            idle_slots.append(
                (
                    slot,
                    by_id.get(w.instance_id) if w.instance_id else None,
                    (inp.now - w.idle_since).total_seconds(),
                )
            )
    for inst in inp.instances:
        if inst.state in BOOTING_STATES and inst.worker_id is None and inst.id not in gone:
            slots[inst.pool].append(_Slot(inst.pool, inst.gpus > 0, inst.gpu_type, inst.gpus or 1))

    units = _expand(inp.demand, queues, inp)

    def tier(team: str) -> int:
        return dec.team(team).priority_tier

    units.sort(key=lambda u: (-tier(u.team), -u.queue_priority, -u.priority, -u.gpus, u.order))
    ranked = {q.name: _ranked_pools(q, pools, cost, dec) for q in inp.queues}
    allocated: Counter[str] = Counter()
    remaining: list[_Unit] = []
    placed_existing = 0
    for u in units:
        placed = False
        for pool in ranked.get(u.queue, ()):
            open_slots = slots.get(pool.name)
            if not open_slots:
                continue
            for s in open_slots:
                if _fits(u, s.gpu_machine, s.gpu_type, s.free):
                    s.free -= u.need
                    s.used = True
                    placed = True
                    break
            if placed:
                if open_slots and open_slots[0].free == 0:
                    slots[pool.name] = [s for s in open_slots if s.free > 0]
                break
        if placed:
            placed_existing += 1
            allocated[u.team] += u.gpus
        else:
            remaining.append(u)

    # 3. launch for the rest -----------------------------------------------------------
    launches_bins: list[_Bin] = []
    bins_by: dict[tuple[str, str], list[_Bin]] = defaultdict(list)
    headroom: dict[str, float] = {}
    held: Counter[tuple[str, str, str]] = Counter()
    held_gpus: Counter[tuple[str, str, str]] = Counter()
    want: Counter[tuple[str, str]] = Counter()
    for u in remaining:
        want[(u.team, u.queue)] += u.gpus
    # A shape that could not get a new machine will not get one later in this plan:
    # counts only grow and headroom only shrinks, so the refusal is remembered.
    refused: dict[tuple[str, str, int, str | None], str] = {}

    def hold(u: _Unit, reason: str) -> None:
        held[(u.team, u.queue, reason)] += 1
        held_gpus[(u.team, u.queue, reason)] += u.gpus

    def try_place(u: _Unit, td: TeamDecision) -> bool:
        for pool in ranked.get(u.queue, ()):
            for b in bins_by.get((u.team, pool.name), ()):
                if _fits(u, b.offering.gpus > 0, b.offering.gpu_type, b.free):
                    b.free -= u.need
                    b.answers.append((u.queue, u.gpus))
                    return True
        shape = (u.team, u.queue, u.gpus, u.gpu_type)
        if shape in refused:
            hold(u, refused[shape])
            return False
        reasons: list[str] = []
        for pool in ranked.get(u.queue, ()):
            if pool.static:
                reasons.append(f"static pool {pool.name} is full")
                continue
            if td.allowed_pools is not None and pool.name not in td.allowed_pools:
                reasons.append(f"policy keeps team {u.team} out of pool {pool.name}")
                continue
            if pool.backoff_until is not None and pool.backoff_until > inp.now:
                reasons.append(f"pool {pool.name} backing off after launch errors until {pool.backoff_until:%H:%M:%S}")
                continue
            if count[pool.name] >= max_eff[pool.name]:
                reasons.append(f"pool {pool.name} at its max of {max_eff[pool.name]} instances")
                continue
            offering, why = _choose_offering(pool, u, td, want[(u.team, u.queue)], headroom[u.team])
            if offering is None:
                reasons.append(why)
                continue
            b = _Bin(u.team, pool.name, offering, (offering.gpus or 1) - u.need, [(u.queue, u.gpus)])
            bins_by[(u.team, pool.name)].append(b)
            launches_bins.append(b)
            count[pool.name] += 1
            headroom[u.team] -= offering.hourly_price
            return True
        refused[shape] = "; ".join(reasons) or f"queue {u.queue} has no pool"
        hold(u, refused[shape])
        return False

    by_tier: dict[int, dict[str, list[_Unit]]] = defaultdict(lambda: defaultdict(list))
    for u in remaining:
        by_tier[tier(u.team)][u.team].append(u)
    for t in sorted(by_tier, reverse=True):
        heap: list[tuple[float, int, str]] = []
        pending: dict[str, deque[_Unit]] = {}
        for team, team_units in by_tier[t].items():
            td = dec.team(team)
            headroom[team] = INF if td.spend_headroom_per_hour is None else td.spend_headroom_per_hour
            if team in drained_teams or not td.may_scale_up:
                why = "; ".join(td.reasons) or ("policy: scale-up frozen" if not td.may_scale_up else "")
                why = f"team {team} may not scale up" + (f": {why}" if why else "")
                if team in drained_teams:
                    why = f"team {team} is over its hard budget: its capacity is being drained"
                for u in team_units:
                    hold(u, why)
                continue
            # Within a team: larger tasks first (first-fit decreasing) after priorities.
            team_units.sort(key=lambda u: (-u.queue_priority, -u.priority, -u.gpus, u.order))
            pending[team] = deque(team_units)
            heapq.heappush(heap, (_share(team, inp, allocated, td), 0, team))
        served: Counter[str] = Counter()
        while heap:
            _, _, team = heapq.heappop(heap)
            td = dec.team(team)
            u = pending[team].popleft()
            if try_place(u, td):
                allocated[team] += u.gpus
                want[(team, u.queue)] -= u.gpus
            served[team] += 1
            if pending[team]:
                # Weighted dominant share on GPUs: the team holding the least per unit
                # of weight goes next; the count breaks ties so CPU work interleaves.
                heapq.heappush(heap, (_share(team, inp, allocated, td), served[team], team))

    launches = [Launch(b.pool, b.offering, b.team, tuple(b.answers), _launch_reason(b)) for b in launches_bins]

    # min_instances for cloud pools, charged to no team ---------------------------------
    for p in sorted(inp.pools, key=lambda p: cost[p.name]):
        while not p.static and count[p.name] < min_eff[p.name]:
            cheapest = _cheapest(p)
            if cheapest is None:
                notes.append(f"pool {p.name} is below its min of {min_eff[p.name]}; no offering is free")
                break
            launches.append(
                Launch(
                    p.name,
                    cheapest,
                    SHARED_TEAM,
                    (),
                    f"pool {p.name} keeps at least {min_eff[p.name]} instance(s)",
                )
            )
            count[p.name] += 1

    # 4. scale down ------------------------------------------------------------------------
    drains: list[Drain] = []
    idle_slots.sort(key=lambda x: -x[2])
    for slot, idle_inst, idle_s in idle_slots:
        if slot.used or slot.worker_id is None:
            continue
        pool = pools[slot.pool]
        if count[pool.name] <= min_eff[pool.name]:
            continue
        count[pool.name] -= 1
        drains.append(
            Drain(
                slot.worker_id,
                pool.name,
                f"idle for {idle_s:.0f} s (idle timeout {pool.idle_timeout_s:g} s)",
                only_if_idle=True,
                instance_id=idle_inst.id if idle_inst else None,
                deadline_s=inp.drain_deadline_s,
            )
        )
    if drained_teams:
        for w in inp.workers:
            w_inst = by_id.get(w.instance_id) if w.instance_id else None
            if w_inst is not None and w_inst.team in drained_teams and w.state in ("idle", "busy"):
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

    holds = tuple(
        Hold(team, queue, n, held_gpus[(team, queue, reason)], reason)
        for (team, queue, reason), n in sorted(held.items())
    )
    return Plan(tuple(launches), tuple(drains), tuple(terminations), holds, placed_existing, tuple(notes))


def _share(team: str, inp: PlanInput, allocated: Counter[str], td: TeamDecision) -> float:
    weight = td.priority_weight if td.priority_weight > 0 else 1e-9
    return (inp.running_gpus.get(team, 0) + allocated[team]) / weight


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
    )
