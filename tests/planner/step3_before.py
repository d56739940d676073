"""Step 3 of the planner as it was before it took runs of tasks in one step (the
differential oracle of `test_step3_differential.py`; not product code).

The packer below places one task per iteration of its loop: each task is checked
against its team's quota, put in its team's last bin or searched for or bought, and
its team's fair-share turn is checked after it. `plan_before` is `plan()` with this
packer in step 3 and every other step the product's own, so only step 3 is compared.
Launch answers are folded to the product's (queue, gpus, tasks) counts.
"""

from __future__ import annotations

import heapq
from collections import Counter, defaultdict, deque
from dataclasses import dataclass, field

from autoscaler.planner.model import Hold, Launch, OfferingView, Plan, PlanInput
from autoscaler.planner.plan import (
    _Bounds,
    _bounds,
    _capacity,
    _cleanup,
    _fail_safe_notes,
    _fit_existing,
    _FreeIndex,
    _GangPlan,
    _live_counts,
    _OfferingChooser,
    _ordered_runs,
    _plan_gangs,
    _pool_minimums,
    _Run,
    _scale_down,
    _Scope,
    _scope,
    _TeamBook,
    _TypeMatch,
    _Unit,
)
from autoscaler.policy.schema import Decision, TeamDecision


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


_Shape = tuple[str, str, int, str | None, float, int]


@dataclass(frozen=True, slots=True)
class _Packed:
    bins: list[_Bin]
    held: Counter[tuple[str, str, str]]
    held_gpus: Counter[tuple[str, str, str]]
    count: Counter[str]


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
        self.held: Counter[tuple[str, str, str]] = Counter()
        self.held_gpus: Counter[tuple[str, str, str]] = Counter()
        self.want: Counter[tuple[str, str]] = Counter()
        # A shape that could not get a new machine will not get one later in this plan:
        # counts only grow and headroom only shrinks, so the refusal is remembered.
        self.refused: dict[_Shape, str] = {}
        self._searched_none = False  # set by each _place

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
                    at[0].take(at[1], u).answers.append((u.queue, u.gpus))
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

    def _place(self, u: _Unit, td: TeamDecision, *, search_bins: bool = True) -> tuple[_FreeIndex[_Bin], int] | None:
        """Place one task in a bin of its team (new or not): where, or None if held.
        `search_bins=False`: the caller knows no bin of the team fits it. Afterwards
        `_searched_none` says whether no existing bin fitted (the task was held, or a
        new bin was bought for it)."""
        sc, inp = self.sc, self.sc.inp
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
                        index.take(pos, u).answers.append((u.queue, u.gpus))
                        return index, pos
        self._searched_none = True
        shape = (u.team, u.queue, u.gpus, u.gpu_type, u.cpus, u.memory_mb)
        if shape in self.refused:
            self._hold(u, self.refused[shape])
            return None
        reasons: list[str] = []
        max_eff = self.bounds.max_eff
        for pool in sc.ranked.get(u.queue, ()):
            if pool.static:
                reasons.append(f"static pool {pool.name} is full")
                continue
            if td.allowed_pools is not None and pool.name not in td.allowed_pools:
                reasons.append(f"policy keeps team {u.team} out of pool {pool.name}")
                continue
            if pool.backoff_until is not None and pool.backoff_until > inp.now:
                reasons.append(f"pool {pool.name} backing off after launch errors until {pool.backoff_until:%H:%M:%S}")
                continue
            if self.count[pool.name] >= max_eff[pool.name]:
                reasons.append(f"pool {pool.name} at its max of {max_eff[pool.name]} instances")
                continue
            offering, why = self.chooser.choose(pool, u, td, self.want[u.team_queue], self.book.headroom[u.team])
            if offering is None:
                reasons.append(why)
                continue
            b = _Bin(
                u.team,
                pool.name,
                offering,
                (offering.gpus or 1) - u.need,
                [(u.queue, u.gpus)],
                offering.cpus - u.cpus if u.cpus > 0 else offering.cpus,
                offering.memory_mb - u.memory_mb if u.memory_mb > 0 else offering.memory_mb,
                why,
            )
            index = team_bins.get(pool.name)
            if index is None:
                index = team_bins[pool.name] = _FreeIndex()
            pos = index.add(b, offering.gpus > 0, offering.gpu_type)
            self.bins.append(b)
            self.count[pool.name] += 1
            self.book.headroom[u.team] -= offering.hourly_price
            return index, pos
        self.refused[shape] = "; ".join(reasons) or f"queue {u.queue} has no pool"
        self._hold(u, self.refused[shape])
        return None


def _team_launches(dec: Decision, bins: list[_Bin]) -> list[Launch]:
    if dec.fail_safe:
        # Fail-safe means hold. Every team is frozen then, so nothing above launched;
        # this keeps it so whatever a failed decision carries.
        return []
    return [Launch(b.pool, b.offering, b.team, _folded(b.answers), _launch_reason(b)) for b in bins]


def _folded(answers: list[tuple[str, int]]) -> tuple[tuple[str, int, int], ...]:
    """One (queue, gpus) answer per task as (queue, gpus, tasks), first seen first."""
    return tuple((q, g, n) for (q, g), n in Counter(answers).items())


def _launch_reason(b: _Bin) -> str:
    gpus = sum(g for _, g in b.answers)
    queues = ", ".join(sorted({q for q, _ in b.answers}))
    what = f"{gpus} GPU(s)" if gpus else "CPU work"
    return (
        f"team {b.team}: {len(b.answers)} queued task(s) in {queues} need {what}; "
        f"{b.offering.key} at {b.offering.hourly_price:.2f} USD/h"
    ) + (f"; capacity: {b.choice}" if b.choice else "")


_Ranked = list[tuple[tuple[float | int | str, ...], int, OfferingView]]


def plan_before(inp: PlanInput) -> Plan:
    """`plan()` with the one-task-per-iteration step 3 above; every other step is the
    product's (the same sequence as `autoscaler.planner.plan.plan`)."""
    sc = _scope(inp)
    bounds = _bounds(inp)
    terminations = _cleanup(inp, set(sc.drained_teams))
    gone = {t.instance_id for t in terminations}
    count = _live_counts(inp, gone)
    type_ok = _TypeMatch()
    cap = _capacity(sc, gone)
    book = _TeamBook(sc)
    packer = _Packer(sc, bounds, count, book, type_ok)
    gangs = _GangPlan([], [], 0, count)
    if any(g.gang is not None for g in inp.demand):
        gangs = _plan_gangs(sc, bounds, count, cap, book, packer.chooser)
        packer.count = Counter(gangs.count)
    remaining, placed_existing = _fit_existing(sc, _ordered_runs(sc), cap, book, type_ok)
    packed = packer.pack(remaining)
    minimums, min_notes, count = _pool_minimums(sc, bounds, packed.count)
    launches = gangs.launches + _team_launches(inp.decision, packed.bins) + minimums
    drains = _scale_down(sc, bounds, cap, count)
    notes = _fail_safe_notes(inp.decision) + min_notes
    holds = tuple(
        Hold(team, queue, n, packed.held_gpus[(team, queue, reason)], reason)
        for (team, queue, reason), n in sorted(packed.held.items())
    )
    if gangs.holds:
        holds = tuple(sorted((*gangs.holds, *holds), key=lambda h: (h.team, h.queue, h.reason)))
    return Plan(
        tuple(launches), tuple(drains), tuple(terminations), holds, placed_existing + gangs.placed, tuple(notes)
    )
