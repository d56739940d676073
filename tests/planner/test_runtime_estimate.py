"""The run-time estimator (autoscaler.planner.runtime_estimate): prior, history and
the band it reports."""

from __future__ import annotations

import math
import random

import pytest

from autoscaler.planner.runtime_estimate import RuntimePrior, declared, estimate

PRIOR = RuntimePrior(median_h=1.0, sigma=1.0, weight=2.0)


def test_without_history_it_is_the_prior_and_says_so() -> None:
    e = estimate([], PRIOR)
    # mu = 0, sigma^2 = 1: mean e^0.5; band exp(-/+ 1.2816 x sqrt(1.5)).
    assert e.mean_h == pytest.approx(math.exp(0.5))
    assert e.p90_h == pytest.approx(math.exp(1.2815516 * math.sqrt(1.5)), rel=1e-6)
    assert e.p10_h == pytest.approx(1 / e.p90_h, rel=1e-6)
    assert e.source == "prior" and e.runs == 0
    assert "no earlier run" in e.words()


def test_the_posterior_by_hand() -> None:
    # Two runs of e^2 h each: mu = (2 x 0 + 4) / 4 = 1; sigma^2 = (2 x 1 + 2 x 1) / 4 = 1.
    e = estimate([math.e**2, math.e**2], PRIOR)
    assert e.mean_h == pytest.approx(math.exp(1.5))
    assert e.runs == 2 and e.source == "history"


def test_many_consistent_runs_pull_it_to_their_length_and_narrow_the_band() -> None:
    rng = random.Random(3)
    runs = [6.0 * math.exp(rng.gauss(0, 0.1)) for _ in range(200)]
    e = estimate(runs, PRIOR)
    assert e.mean_h == pytest.approx(6.0, rel=0.1)
    few = estimate(runs[:3], PRIOR)
    assert (e.p90_h - e.p10_h) < (few.p90_h - few.p10_h)
    assert e.p10_h < 6.0 < e.p90_h


def test_runs_of_no_length_are_left_out() -> None:
    assert estimate([0.0, -1.0, float("nan")], PRIOR).source == "prior"


def test_a_declared_run_time_is_taken_as_said() -> None:
    d = declared(30.0)
    assert d.mean_h == 30.0 and d.source == "declared"
    assert d.words() == "30.0 h (declared)"


def test_no_prior_and_no_runs_is_refused() -> None:
    with pytest.raises(ValueError, match="prior weight"):
        estimate([], RuntimePrior(weight=0.0))
