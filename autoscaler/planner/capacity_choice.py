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

The cheaper one wins, among the capacity types the policy allows only. A task that
would be cheaper on spot but would miss its wait target there goes on-demand: after a
reclaim it waits for a fresh boot (`b`), so if `b` is beyond the wait target and the
chance of at least one reclaim, `1 - e^(-r d)`, is beyond `WAIT_MISS_SHARE` (the 5 %
a p95 wait target tolerates), spot would miss it.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

SPOT, ON_DEMAND = "spot", "on_demand"
# The share of tasks a p95 wait target lets wait longer than it.
WAIT_MISS_SHARE = 0.05
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
    hours), how it checkpoints, and its wait target (hours; None: none)."""

    runtime_h: float
    checkpointing: Checkpointing = Checkpointing()
    wait_target_h: float | None = None


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

    def rate(self, key: str) -> float:
        return self.reclaim_rates.get(key, self.prior_rate)

    def profile(self, runtime_h: float | None, checkpoints: str | None) -> TaskProfile:
        spec = Checkpointing.parse(checkpoints) if checkpoints else Checkpointing()
        return TaskProfile(runtime_h if runtime_h else self.default_runtime_h, spec, self.wait_target_h)


@dataclass(frozen=True, slots=True)
class Option:
    """One offering the task could run on: its key, capacity type, hourly price per GPU
    the task uses, and the reclaim rate (per instance-hour; 0 for on-demand)."""

    key: str
    capacity_type: str
    hourly_price: float
    reclaim_rate: float = 0.0


@dataclass(frozen=True, slots=True)
class Costed:
    option: Option
    expected_cost: float  # USD for the whole task
    expected_reclaims: float
    misses_wait_target: bool


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
    """The task's expected cost on one option (formulas in the module docstring)."""
    d, p, b = max(profile.runtime_h, 0.0), option.hourly_price, max(boot_h, 0.0)
    r = option.reclaim_rate if option.capacity_type == SPOT else 0.0
    if r <= 1e-12:
        return Costed(option, p * (b + d), 0.0, False)
    if profile.checkpointing.restarts_from_zero:
        grow = math.expm1(min(r * d, 700.0))  # e^(r d) - 1, kept finite
        cost, reclaims = p * (b + grow / r), grow
    else:
        lost = b + profile.checkpointing.lost_h_per_reclaim
        if r * lost >= 1.0:
            cost, reclaims = math.inf, math.inf
        else:
            billed = d / (1.0 - r * lost)
            cost, reclaims = p * (b + billed), r * billed
    target = profile.wait_target_h
    misses = target is not None and b > target and -math.expm1(-r * d) > WAIT_MISS_SHARE
    return Costed(option, cost, reclaims, misses)


def choose(options: Iterable[Option], profile: TaskProfile, allowed: Collection[str], *, boot_h: float) -> Choice:
    """The capacity type with the least expected cost among `allowed`; spot on a tie
    (it is also the pool's default order). Options of other types are never picked."""
    costed = [expected_cost(o, profile, boot_h=boot_h) for o in options if o.capacity_type in allowed]
    spot = min((c for c in costed if c.option.capacity_type == SPOT), key=_cost_key, default=None)
    od = min((c for c in costed if c.option.capacity_type == ON_DEMAND), key=_cost_key, default=None)
    what = f"~{profile.runtime_h:.2g} h, checkpoints {profile.checkpointing}"
    if spot is None and od is None:
        return Choice(None, None, None, f"no offering of an allowed capacity type ({', '.join(sorted(allowed))})")
    if spot is None:
        assert od is not None
        return Choice(ON_DEMAND, None, od, f"on-demand: the only allowed capacity type ({what})")
    spot_words = (
        f"spot {spot.expected_cost:.2f} USD at reclaim rate {spot.option.reclaim_rate:.3g}/h "
        f"({spot.expected_reclaims:.2g} reclaims expected)"
    )
    if od is None:
        return Choice(SPOT, spot, None, f"spot: the only allowed capacity type ({what}; {spot_words})")
    od_words = f"on-demand {od.expected_cost:.2f} USD"
    if spot.misses_wait_target and spot.expected_cost < od.expected_cost:
        assert profile.wait_target_h is not None
        return Choice(
            ON_DEMAND,
            spot,
            od,
            f"on-demand: spot is cheaper ({spot_words} vs {od_words}) but a reclaim would wait "
            f"{boot_h * 60:.0f} min for a fresh boot, past the wait target of {profile.wait_target_h * 60:.0f} min "
            f"({what})",
        )
    if spot.expected_cost <= od.expected_cost:
        return Choice(SPOT, spot, od, f"spot: expected {spot_words} vs {od_words} ({what})")
    return Choice(ON_DEMAND, spot, od, f"on-demand: expected {od_words} vs {spot_words} ({what})")


def _cost_key(c: Costed) -> tuple[float, float, str]:
    return (c.expected_cost, c.option.hourly_price, c.option.key)
