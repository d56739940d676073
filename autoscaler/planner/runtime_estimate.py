"""A task's expected run time when it does not declare one, from history. Pure.

Run times of the same work (same team, queue and command) are taken as log-normal:
`ln(run time)` is normal with mean `mu` and spread `sigma`. The prior (from config) is
a median run time `prior_median_h` with spread `prior_sigma`, worth `prior_weight`
runs; `n` observed runs `x_i` update it as pseudo-observations would:

    mu      = (prior_weight x ln(prior_median_h) + sum ln x_i) / (prior_weight + n)
    sigma^2 = (prior_weight x prior_sigma^2 + sum (ln x_i - mu)^2) / (prior_weight + n)

The expected run time is the log-normal mean `exp(mu + sigma^2 / 2)`; the band shown
to people (p10-p90) is `exp(mu -/+ 1.2816 s)` with `s^2 = sigma^2 (1 + 1/(prior_weight
+ n))`, the predictive spread of one more run. With no history the answer is the
prior, and says so; with a handful of consistent runs it is close to them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

_Z90 = 1.2815515655446004  # the standard normal's 90th percentile


@dataclass(frozen=True, slots=True)
class RuntimePrior:
    median_h: float = 1.0
    sigma: float = 1.0
    weight: float = 2.0


@dataclass(frozen=True, slots=True)
class RuntimeEstimate:
    """Expected run time (hours), its p10-p90 band, the runs it rests on, and where it
    comes from: `declared` (the task said), `history` or `prior` (no history yet)."""

    mean_h: float
    p10_h: float
    p90_h: float
    runs: int
    source: str

    def as_dict(self) -> dict[str, float | int | str]:
        return {
            "mean_h": round(self.mean_h, 4),
            "p10_h": round(self.p10_h, 4),
            "p90_h": round(self.p90_h, 4),
            "runs": self.runs,
            "source": self.source,
        }

    def words(self) -> str:
        if self.source == "declared":
            return f"{_h(self.mean_h)} (declared)"
        basis = f"from {self.runs} earlier run(s)" if self.runs else "the prior: no earlier run of this command"
        return f"~{_h(self.mean_h)} (p10-p90 {_h(self.p10_h)}-{_h(self.p90_h)}, {basis})"


def declared(hours: float) -> RuntimeEstimate:
    return RuntimeEstimate(hours, hours, hours, 0, "declared")


def estimate(runs_h: Sequence[float], prior: RuntimePrior) -> RuntimeEstimate:
    """The posterior of the module docstring over the runs' durations (hours); runs
    of no measurable length are left out (a log-normal has none)."""
    logs = [math.log(x) for x in runs_h if x > 1e-6 and math.isfinite(x)]
    w = max(prior.weight, 0.0)
    n = len(logs)
    if w + n <= 0:
        raise ValueError("a run-time estimate needs a prior weight above 0 or at least one run")
    mu0 = math.log(max(prior.median_h, 1e-6))
    mu = (w * mu0 + sum(logs)) / (w + n)
    var = (w * prior.sigma**2 + sum((x - mu) ** 2 for x in logs)) / (w + n)
    spread = math.sqrt(var * (1.0 + 1.0 / (w + n)))
    return RuntimeEstimate(
        math.exp(mu + var / 2.0),
        math.exp(mu - _Z90 * spread),
        math.exp(mu + _Z90 * spread),
        n,
        "history" if n else "prior",
    )


def _h(hours: float) -> str:
    if hours < 1.0:
        return f"{hours * 60:.0f} min"
    return f"{hours:.1f} h"


def runtime_class_h(hours: float) -> float:
    """`hours` rounded to the nearest quarter-octave (2^(k/4), steps of 19 %): tasks of
    nearly the same length share one demand group, so the planner sees a few dozen
    run-time classes, not one per task; the expected cost moves little within one."""
    if hours <= 0 or not math.isfinite(hours):
        return 0.0
    return float(2.0 ** (round(4.0 * math.log2(hours)) / 4.0))
