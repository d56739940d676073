"""The reclaim rate of a spot offering, estimated from what the fleet lived through. Pure.

Evidence is spot instance-hours and the reclaims among them, per offering (capacity
type x instance type x zone). Reclaims are taken as a Poisson process of an unknown
rate `lambda`; with a gamma prior worth `prior_hours` instance-hours at `prior_rate`
(from config), the posterior mean after `k` reclaims in `h` hours is

    lambda = (prior_rate x prior_hours + k) / (prior_hours + h)

and its standard deviation `sqrt(prior_rate x prior_hours + k) / (prior_hours + h)`.
Old evidence decays: an observation that ended `a` hours ago counts with weight
`0.5 ** (a / half_life_h)` in both `k` and `h`, so a zone that got worse shows it
within a few half-lives while one bad hour never swamps a month of history.

The planner ranks offerings of one capacity type by the *optimistic* rate, one standard
deviation below the mean: a zone never tried (the prior alone, a wide deviation) goes
before one whose evidence shows it is only somewhat better than the prior, so the fleet
learns which zone is calm instead of staying in the first one it tried.

How much evidence it takes (docs/capacity.md): the relative error of the estimate is
about `1 / sqrt(k)`, so within 20 % once an offering has seen ~250 reclaims (three
standard deviations of 1/sqrt(250) = 6.3 %). At 0.24 reclaims per hour that is ~1,040
instance-hours; tests/planner/test_reclaim_rate.py checks it on a simulated world of
three zones (0.05, 0.24 and 0.6 per hour) over ten seeds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SpotLife:
    """One spot instance's billed life: hours it ran, whether a reclaim ended it, and
    how long ago it ended (hours; 0 for one still running)."""

    hours: float
    reclaimed: bool
    age_h: float = 0.0


@dataclass(frozen=True, slots=True)
class ReclaimPrior:
    """The config's prior: the rate believed before any evidence (per instance-hour),
    how many instance-hours that belief is worth, and the half-life of evidence."""

    rate: float = 0.24
    hours: float = 20.0
    half_life_h: float = 14 * 24.0


@dataclass(frozen=True, slots=True)
class ReclaimEstimate:
    rate: float  # reclaims per instance-hour, posterior mean
    sd: float  # its standard deviation
    hours: float  # instance-hours of evidence, after decay
    reclaims: float  # reclaims, after decay

    @property
    def optimistic(self) -> float:
        """One standard deviation below the mean (never below 0): the rate an offering
        is ranked by among offerings of one capacity type, so one with little evidence
        gets tried (docs/capacity.md, "Trying a zone")."""
        return max(self.rate - self.sd, 0.0) if math.isfinite(self.sd) else 0.0

    def as_dict(self) -> dict[str, float]:
        return {
            "rate_per_hour": round(self.rate, 6),
            "sd": round(self.sd, 6),
            "instance_hours": round(self.hours, 3),
            "reclaims": round(self.reclaims, 3),
        }


def estimate(lives: Iterable[SpotLife], prior: ReclaimPrior) -> ReclaimEstimate:
    """The posterior reclaim rate of one offering (formula in the module docstring)."""
    hours = reclaims = 0.0
    for life in lives:
        w = 0.5 ** (max(life.age_h, 0.0) / prior.half_life_h) if prior.half_life_h > 0 else 1.0
        hours += w * max(life.hours, 0.0)
        reclaims += w * (1.0 if life.reclaimed else 0.0)
    return posterior(hours, reclaims, prior)


def posterior(hours: float, reclaims: float, prior: ReclaimPrior) -> ReclaimEstimate:
    """The posterior after `reclaims` in `hours` of (already decayed) evidence."""
    shape = max(prior.rate, 0.0) * max(prior.hours, 0.0) + reclaims
    scale = max(prior.hours, 0.0) + hours
    if scale <= 0.0:
        return ReclaimEstimate(max(prior.rate, 0.0), math.inf, 0.0, 0.0)
    return ReclaimEstimate(shape / scale, math.sqrt(shape) / scale, hours, reclaims)
