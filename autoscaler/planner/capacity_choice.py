"""Per-task capacity choice: on-demand or spot, by the task's expected cost. Pure.

A task's expected cost on an offering of hourly price `p` (per GPU it uses), for an
expected run time of `d` hours, a reclaim rate of `r` per instance-hour and a boot of
`b` hours (every formula is in docs/capacity.md, with worked numbers):

- on-demand: never reclaimed, `p (b + d)`.
- spot, restart from zero (`checkpoints: none`): each reclaim loses all the work done.
  With reclaims a Poisson process of rate `r`, the expected time to get `d` hours done
  in one go is `(e^(r d) - 1) / r`, so the cost is `p (b + (e^(r d) - 1) / r)` with
  `e^(r d) - 1` reclaims expected. Beyond a few hours this grows faster than
  on-demand's straight line: at `r = 0.24` a 30 h task costs `p` x about 5,577 hours.
- spot with checkpoints: each reclaim costs one fresh boot and the work since the last
  checkpoint (nothing for `on-signal`, half the interval on average for `every:MIN`):
  `L = b + lost`. Billed time `T` satisfies `T = d + r T L`, so the cost is
  `p (b + d / (1 - r L))` (infinite when `r L >= 1`: it would never finish).

The cheaper one wins, among the capacity types the policy allows only.

The wait target: a task's wait is all the time it spends queued over its attempts:
the first boot, then one fresh boot per reclaim (the task stops at the notice and
waits for the replacement). With `N` reclaims its wait is about `b (1 + k + N)`, `k`
the reclaims it has already lived through. `N` is Poisson of mean `r T` for a task
that checkpoints (`T` the billed time above) and geometric for one that restarts
from zero (each attempt is reclaimed with chance `q = 1 - e^(-r d)`). Spot misses a
target `W` when the chance that the wait passes `W` is above `WAIT_MISS_SHARE` (the
5 % a p95 target tolerates): with `n = floor(W / b) - 1 - k` more reclaims allowed,
`P(N > n) > 5 %`. A task cheaper on spot that would miss the target there goes
on-demand (one boot, never reclaimed), unless on-demand misses it too (`b > W`); a
calmer spot zone that keeps the target goes before a cheaper one that misses it.

Trying a zone: within a capacity type the offering is ranked by its expected cost at the
*optimistic* reclaim rate (one standard deviation below the estimate,
`ReclaimEstimate.optimistic`), among the offerings whose expected cost at the estimate
is within `EXPLORE_PREMIUM` of the least. A zone with little evidence is tried by the
tasks for which a wrong guess costs little (short tasks, tasks that checkpoint), never
by a long task that restarts from zero. Whether spot or on-demand wins is decided on the
estimates alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

SPOT, ON_DEMAND = "spot", "on_demand"
# The share of tasks a p95 wait target lets wait longer than it.
WAIT_MISS_SHARE = 0.05
# How much more than the least expected cost a task may be placed at to try a zone.
EXPLORE_PREMIUM = 0.05
CheckpointMode = Literal["none", "on-signal", "every"]


@dataclass(frozen=True, slots=True)
class Checkpointing:
    """What a task survives: `none` (restart from zero), `on-signal` (checkpoints on
    the reclaim notice, loses nothing) or `every` `every_min` minutes (loses half an
    interval on average)."""

    mode: CheckpointMode = "none"
    every_min: float = 0.0

    @classmethod
    def parse(cls, text: str | None) -> Checkpointing:
        """`none`, `on-signal` or `every:MIN`; a ValueError saying what is accepted."""
        spec = (text or "none").strip().lower()
        if spec == "none":
            return cls("none")
        if spec == "on-signal":
            return cls("on-signal")
        if spec.startswith("every:"):
            try:
                minutes = float(spec.removeprefix("every:"))
            except ValueError:
                minutes = -1.0
            if 0 < minutes <= 7 * 24 * 60 and math.isfinite(minutes):
                return cls("every", minutes)
        raise ValueError(
            f"checkpoints {text!r} is not one of none, on-signal or every:MIN (MIN minutes between "
            "checkpoints, e.g. every:30)"
        )

    def __str__(self) -> str:
        return f"every:{self.every_min:g}" if self.mode == "every" else self.mode

    @property
    def restarts_from_zero(self) -> bool:
        return self.mode == "none"

    @property
    def lost_h_per_reclaim(self) -> float:
        """Work lost per reclaim when the task checkpoints (hours)."""
        return self.every_min / 120.0 if self.mode == "every" else 0.0


@dataclass(frozen=True, slots=True)
class TaskProfile:
    """What the choice knows of a task: its expected run time (declared or estimated,
    hours), how it checkpoints, its wait target (hours of accumulated wait; None: none)
    and the reclaims it has already waited through."""

    runtime_h: float
    checkpointing: Checkpointing = Checkpointing()
    wait_target_h: float | None = None
    # Boots of wait the task has already spent on reclaims (one per reclaim without
    # standby machines; about `standby_miss` per reclaim with them).
    reclaims_so_far: int = 0
    # With standby machines (planner.standby): the chance a reclaim of this task finds
    # none free and waits a boot; None: every reclaim waits a boot.
    standby_miss: float | None = None


@dataclass(frozen=True, slots=True)
class CapacityModel:
    """What the planner needs to weigh spot against on-demand for every task: each spot
    offering's estimated reclaim rate (by offering key; the prior for one never seen),
    the boot a reclaim waits for, the wait target, and the run time of a task that has
    no estimate (enqueued before there were any)."""

    reclaim_rates: Mapping[str, float] = field(default_factory=dict)
    prior_rate: float = 0.24
    boot_h: float = 0.05
    wait_target_h: float | None = None
    default_runtime_h: float = 1.0
    # The rates offerings are ranked by (module docstring, "Trying a zone"); without
    # them an offering is ranked by its estimate.
    optimistic_rates: Mapping[str, float] = field(default_factory=dict)
    prior_optimistic_rate: float | None = None
    # Standby machines cover checkpointing tasks on spot (planner.standby): a reclaim
    # of one waits a boot only with this chance. None: no standby.
    standby_miss: float | None = None

    def rate(self, key: str) -> float:
        return self.reclaim_rates.get(key, self.prior_rate)

    def optimistic_rate(self, key: str) -> float:
        if key in self.optimistic_rates:
            return self.optimistic_rates[key]
        if key in self.reclaim_rates or self.prior_optimistic_rate is None:
            return self.rate(key)
        return self.prior_optimistic_rate

    def option(self, key: str, capacity_type: str, hourly_price: float) -> Option:
        """One offering as the choice weighs it (on-demand is never reclaimed)."""
        if capacity_type != SPOT:
            return Option(key, capacity_type, hourly_price)
        return Option(key, capacity_type, hourly_price, self.rate(key), self.optimistic_rate(key))

    def profile(self, runtime_h: float | None, checkpoints: str | None, reclaims_so_far: int = 0) -> TaskProfile:
        spec = Checkpointing.parse(checkpoints) if checkpoints else Checkpointing()
        runtime = runtime_h if runtime_h else self.default_runtime_h
        spent = max(reclaims_so_far, 0)
        miss = self.standby_miss if not spec.restarts_from_zero else None
        if miss is not None:
            # Covered reclaims cost a boot of wait only when no standby was free.
            spent = math.floor(spent * miss + 0.5)
        return TaskProfile(runtime, spec, self.wait_target_h, spent, miss)

    def standby_miss_needed(
        self, key: str, remaining_h: float, checkpoints: str | None, reclaims_so_far: int
    ) -> float | None:
        """For a checkpointing task running on spot offering `key` with about
        `remaining_h` hours left: None when it keeps its wait target even if every
        reclaim from now on waits a boot (or restarts from zero, or no target, or no
        standby); otherwise the largest chance per reclaim of finding no standby machine
        free with which it still keeps the target, never below `standby_miss` (the
        choice's own assumption). What standby machines are sized by (planner.standby)."""
        profile = self.profile(max(remaining_h, 1e-6), checkpoints, reclaims_so_far)
        floor = profile.standby_miss
        if profile.wait_target_h is None or floor is None:
            return None
        bare = _expected_cost(
            Option(key, SPOT, 1.0, self.rate(key)), replace(profile, standby_miss=None), boot_h=self.boot_h
        )
        if not bare.misses_wait_target:
            return None
        n = wait_allowance(profile, self.boot_h)
        if n is None or n < 0 or not 0.0 < bare.expected_reclaims < math.inf:
            return floor
        return max(poisson_mean_within(n) / bare.expected_reclaims, floor)


def poisson_mean_within(n: int, share: float = WAIT_MISS_SHARE) -> float:
    """The largest Poisson mean whose chance of more than `n` is at most `share`
    (bisection; 0 for n < 0). For n = 9 and 5 %: 5.43."""
    if n < 0:
        return 0.0
    lo, hi = 0.0, float(n) + 10.0 * math.sqrt(n + 1.0) + 10.0
    for _ in range(60):
        mid = (lo + hi) / 2.0
        if _poisson_tail(mid)(n) <= share:
            lo = mid
        else:
            hi = mid
    return lo


@dataclass(frozen=True, slots=True)
class Option:
    """One offering the task could run on: its key, capacity type, hourly price per GPU
    the task uses, and the reclaim rate (per instance-hour; 0 for on-demand)."""

    key: str
    capacity_type: str
    hourly_price: float
    reclaim_rate: float = 0.0
    optimistic_rate: float | None = None  # None: ranked by `reclaim_rate`


@dataclass(frozen=True, slots=True)
class Costed:
    option: Option
    expected_cost: float  # USD for the whole task
    expected_reclaims: float
    misses_wait_target: bool
    # The chance the task's accumulated wait passes its target here (0 without one).
    wait_miss_chance: float = 0.0
    # The expected cost at the option's optimistic rate (None: the same as expected_cost).
    optimistic_cost: float | None = None


@dataclass(frozen=True, slots=True)
class Choice:
    """The capacity type picked, the best option of each type, and why, in words."""

    capacity_type: str | None
    best_spot: Costed | None
    best_on_demand: Costed | None
    reason: str

    @property
    def chosen(self) -> Costed | None:
        return self.best_spot if self.capacity_type == SPOT else self.best_on_demand


def expected_cost(option: Option, profile: TaskProfile, *, boot_h: float) -> Costed:
    """The task's expected cost on one option (formulas in the module docstring), and
    at its optimistic rate when it has one below its estimate."""
    costed = _expected_cost(option, profile, boot_h=boot_h)
    opt = option.optimistic_rate
    if option.capacity_type != SPOT or opt is None or opt >= option.reclaim_rate:
        return costed
    # Built field by field, not with `dataclasses.replace`: the planner costs every
    # offering of every pool it considers, and `replace` was a tenth of that.
    at_opt = Option(option.key, option.capacity_type, option.hourly_price, opt, option.optimistic_rate)
    hopeful = _expected_cost(at_opt, profile, boot_h=boot_h)
    c = costed
    return Costed(
        c.option, c.expected_cost, c.expected_reclaims, c.misses_wait_target, c.wait_miss_chance, hopeful.expected_cost
    )


def _expected_cost(option: Option, profile: TaskProfile, *, boot_h: float) -> Costed:
    d, p, b = max(profile.runtime_h, 0.0), option.hourly_price, max(boot_h, 0.0)
    r = option.reclaim_rate if option.capacity_type == SPOT else 0.0
    if r <= 1e-12:
        return _with_wait(Costed(option, p * (b + d), 0.0, False), profile, b, lambda n: 0.0)
    if profile.checkpointing.restarts_from_zero:
        grow = math.expm1(min(r * d, 700.0))  # e^(r d) - 1, kept finite
        q = -math.expm1(-r * d)  # the chance one attempt is reclaimed
        return _with_wait(Costed(option, p * (b + grow / r), grow, False), profile, b, lambda n: q ** (n + 1))
    lost = b + profile.checkpointing.lost_h_per_reclaim
    if r * lost >= 1.0:
        return Costed(option, math.inf, math.inf, profile.wait_target_h is not None, 1.0)
    billed = d / (1.0 - r * lost)
    # With standby machines only the reclaims that find none free wait a boot: a
    # thinned Poisson count.
    waits = r * billed * (profile.standby_miss if profile.standby_miss is not None else 1.0)
    return _with_wait(Costed(option, p * (b + billed), r * billed, False), profile, b, _poisson_tail(waits))


def wait_allowance(profile: TaskProfile, boot_h: float) -> int | None:
    """More reclaims the task's wait target allows: `floor(W / b) - 1 - k` (the first
    boot and the `k` reclaims so far are spent); None without a target or a boot; -1
    when even the first boot passes it."""
    target, b = profile.wait_target_h, max(boot_h, 0.0)
    if target is None or b <= 1e-12:
        return None
    if b > target:
        return -1
    # The small epsilon keeps W / b = 10.0 at 10 when floats make it 9.999...
    return max(math.floor(target / b + 1e-9) - 1 - profile.reclaims_so_far, -1)


def _with_wait(c: Costed, profile: TaskProfile, boot_h: float, tail: Callable[[int], float]) -> Costed:
    """`c` with its chance of passing the wait target: `tail(n)` is `P(N > n)`."""
    n = wait_allowance(profile, boot_h)
    if n is None:
        return c
    chance = 1.0 if n < 0 else min(max(tail(n), 0.0), 1.0)
    return Costed(c.option, c.expected_cost, c.expected_reclaims, chance > WAIT_MISS_SHARE, chance, c.optimistic_cost)


def _poisson_tail(mean: float) -> Callable[[int], float]:
    """`n -> P(N > n)` for N Poisson of `mean` (summed pmf; exact enough for n < 10^5)."""

    def tail(n: int) -> float:
        if mean <= 0.0:
            return 0.0
        if n > 100_000:
            return 0.0 if mean < n / 2 else 1.0
        term = cdf = math.exp(-mean) if mean < 700 else 0.0
        if term == 0.0:
            return 1.0 if n < mean else 0.0  # underflow: the mass is far above n
        for i in range(1, n + 1):
            term *= mean / i
            cdf += term
        return max(1.0 - cdf, 0.0)

    return tail


def choose(options: Iterable[Option], profile: TaskProfile, allowed: Collection[str], *, boot_h: float) -> Choice:
    """The capacity type with the least expected cost among `allowed`; spot on a tie
    (it is also the pool's default order). Options of other types are never picked.
    Within a type an option that keeps the wait target goes before one that misses it;
    spot cheaper than on-demand but missing the target loses to an on-demand that keeps it.
    Where spot wins, `best_spot` is the offering `ranks` puts first (it may be one being
    tried; the reason says so)."""
    costed = [expected_cost(o, profile, boot_h=boot_h) for o in options if o.capacity_type in allowed]
    return choose_costed(costed, profile, allowed, boot_h=boot_h)


def choose_costed(costed: Sequence[Costed], profile: TaskProfile, allowed: Collection[str], *, boot_h: float) -> Choice:
    """`choose` over options already costed for `profile` (each of an `allowed` type):
    the planner costs a pool's offerings once for both the choice and their order."""
    order = ranks(costed)
    spot = min((c for c in costed if c.option.capacity_type == SPOT), key=_value_key, default=None)
    od = min((c for c in costed if c.option.capacity_type == ON_DEMAND), key=_value_key, default=None)
    tried = min((c for c in costed if c.option.capacity_type == SPOT), key=lambda c: order[c.option.key], default=None)
    choice = _choose(spot, od, profile, allowed, boot_h)
    if choice.capacity_type != SPOT or tried is None or spot is None or tried.option.key == spot.option.key:
        return choice
    # Spot won on the best estimate; the offering tried (`ranks`) is where it goes.
    words = (
        f"; trying {tried.option.key} (reclaim rate {tried.option.reclaim_rate:.3g}/h on its evidence, "
        f"{tried.option.optimistic_rate or 0.0:.3g}/h optimistic; expected {tried.expected_cost:.2f} USD, within "
        f"{EXPLORE_PREMIUM:.0%} of {spot.option.key})"
    )
    return replace(choice, best_spot=tried, reason=choice.reason + words)


def ranks(costed: Iterable[Costed]) -> dict[str, tuple[bool, bool, float, float, float, str]]:
    """The order of offerings within each capacity type, by key (smaller first): those
    that keep the wait target first; among them, those within `EXPLORE_PREMIUM` of the
    least expected cost by their optimistic cost, then the rest by expected cost."""
    by_type: dict[str, list[Costed]] = {}
    for c in costed:
        by_type.setdefault(c.option.capacity_type, []).append(c)
    out: dict[str, tuple[bool, bool, float, float, float, str]] = {}
    for group in by_type.values():
        best = min(group, key=_value_key)
        ceiling = best.expected_cost * (1.0 + EXPLORE_PREMIUM) + 1e-12
        for c in group:
            near = c.misses_wait_target == best.misses_wait_target and c.expected_cost <= ceiling
            cost = c.optimistic_cost if near and c.optimistic_cost is not None else c.expected_cost
            out[c.option.key] = (c.misses_wait_target, not near, cost, *_value_key(c)[1:])
    return out


def _choose(
    spot: Costed | None, od: Costed | None, profile: TaskProfile, allowed: Collection[str], boot_h: float
) -> Choice:
    what = f"~{profile.runtime_h:.2g} h, checkpoints {profile.checkpointing}"
    if spot is None and od is None:
        if not allowed:  # the policy's types and the pools' have none in common
            return Choice(None, None, None, "no offering: the policy allows none of the capacity types the pools offer")
        return Choice(None, None, None, f"no offering of an allowed capacity type ({', '.join(sorted(allowed))})")
    if spot is None:
        assert od is not None
        return Choice(ON_DEMAND, None, od, f"on-demand: the only allowed capacity type ({what})")
    spot_words = (
        f"spot {spot.expected_cost:.2f} USD at reclaim rate {spot.option.reclaim_rate:.3g}/h "
        f"({spot.expected_reclaims:.2g} reclaims expected)"
    )
    wait_core = _wait_words(spot, profile, boot_h)
    wait = f"; {wait_core}" if wait_core else ""
    if od is None:
        return Choice(SPOT, spot, None, f"spot: the only allowed capacity type ({what}; {spot_words}{wait})")
    od_words = f"on-demand {od.expected_cost:.2f} USD"
    if spot.misses_wait_target and not od.misses_wait_target and spot.expected_cost < od.expected_cost:
        return Choice(
            ON_DEMAND, spot, od, f"on-demand: spot is cheaper ({spot_words} vs {od_words}) but {wait_core} ({what})"
        )
    if spot.expected_cost <= od.expected_cost:
        return Choice(SPOT, spot, od, f"spot: expected {spot_words} vs {od_words}{wait} ({what})")
    return Choice(ON_DEMAND, spot, od, f"on-demand: expected {od_words} vs {spot_words} ({what})")


def _wait_words(spot: Costed, profile: TaskProfile, boot_h: float) -> str:
    """The wait target's numbers for a reason: '' without a target."""
    n, target = wait_allowance(profile, boot_h), profile.wait_target_h
    if n is None or target is None:
        return ""
    verdict = "would pass" if spot.misses_wait_target else "keeps"
    per = "each reclaim waits"
    if profile.standby_miss is not None:
        per = f"with standby machines a reclaim waits (chance {profile.standby_miss:.0%})"
    return (
        f"on spot its wait {verdict} the wait target of {target * 60:.0f} min: {per} a "
        f"{boot_h * 60:.0f} min boot, {max(n, 0)} more allowed after {profile.reclaims_so_far} so far, "
        f"chance of more {spot.wait_miss_chance:.1%} (a p95 target tolerates {WAIT_MISS_SHARE:.0%})"
    )


def _value_key(c: Costed) -> tuple[bool, float, float, str]:
    return (c.misses_wait_target, c.expected_cost, c.option.hourly_price, c.option.key)
